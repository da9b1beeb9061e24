"""The ``hf`` and ``hf_generate`` engines with the model on a CUDA GPU: the same checks as ``test_hf_engine_cache.py``
(whose tiny model stays on the CPU), run where the KV cache, the packed prefill's masks and the seeded sampling's RNG
live on the GPU. Skipped where there is no GPU (CI has none); ``scripts/gpu_check.sh`` runs them on one.

``RAGEN_TEST_DEVICE`` names the device (default ``cuda``); ``RAGEN_TEST_DEVICE=cpu`` runs the same checks on the CPU,
which is how their logic is checked on a machine without a GPU.
"""

from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")

DEVICE = os.environ.get("RAGEN_TEST_DEVICE", "cuda")
if DEVICE.startswith("cuda") and not torch.cuda.is_available():
    pytest.skip("no CUDA GPU here (RAGEN_TEST_DEVICE=cpu runs these checks on the CPU)", allow_module_level=True)

from ragen_trainer.engines.base import SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.engines.hf_generate import GenerateEngine
from ragen_trainer.rollout import collect_rollouts
from tests.trainer.conftest import build_tiny_model, latest_rollout
from tests.trainer.test_hf_engine_cache import multi_turn_episodes

GREEDY = SamplingParams(temperature=0, max_new_tokens=12)
#: The rollout settings of these engine comparisons (only the replies trained, cleaned replies).
LATEST = latest_rollout()


@pytest.fixture
def device_model(tiny_tokenizer):
    """The tiny model of ``conftest.py``, in eval mode, on ``DEVICE`` (float32)."""
    return build_tiny_model(tiny_tokenizer).eval().to(DEVICE)


def _prompt(tokenizer, text):
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)  # fmt: skip
    return list(tokenizer(chat, add_special_tokens=False)["input_ids"])


def _teacher_forced(model, ids):
    """Log-prob of every token of ``ids`` given the ones before it, from one full forward pass on the model's
    device (no cache)."""
    ids_t = torch.tensor([ids], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(ids_t).logits[0].float()
    picked = torch.log_softmax(logits[:-1], -1).gather(-1, ids_t[0, 1:, None]).squeeze(-1)
    return [0.0] + picked.cpu().tolist()


def _signature(batch):
    return [(t.input_ids, t.loss_mask, t.replies, t.turn_rewards, t.finish_reasons) for t in batch.trajectories]


def test_the_model_is_where_the_test_says(device_model):
    assert next(device_model.parameters()).device.type == torch.device(DEVICE).type


@pytest.mark.parametrize("env_id", ["ragen/Bandit-v0", "ragen/FrozenLake-v0"])
def test_greedy_rollouts_match_model_generate_on_the_device(device_model, tiny_tokenizer, env_id):
    # Token-identical on the CPU (test_hf_engine_cache.py); on a GPU the two engines' kernels differ (packed prefill
    # against a padded batch), so a near-tie in the random tiny model's logits could in principle flip one argmax.
    old = collect_rollouts(GenerateEngine(device_model, tiny_tokenizer), tiny_tokenizer, env_id, [0, 1], 3,
                           settings=LATEST, sampling=GREEDY)  # fmt: skip
    engine = HFEngine(device_model, tiny_tokenizer, batch_size=4)  # fewer rows than episodes: continuous batching
    new = collect_rollouts(engine, tiny_tokenizer, env_id, [0, 1], 3, settings=LATEST, sampling=GREEDY)
    assert _signature(new) == _signature(old)
    for a, b in zip(old.trajectories, new.trajectories):
        assert b.old_logprobs == pytest.approx(a.old_logprobs, abs=1e-3)
    assert engine.stats["reused_tokens"] > 0


def test_cache_reuse_across_turns_gives_the_log_probs_of_a_full_re_encode(device_model, tiny_tokenizer):
    engine, multi_turn = multi_turn_episodes(device_model, tiny_tokenizer)
    assert engine.stats["reused_tokens"] > 0
    for traj in multi_turn:
        full = _teacher_forced(device_model, traj.input_ids)
        for pos, trained in enumerate(traj.loss_mask):
            if trained:
                assert traj.old_logprobs[pos] == pytest.approx(full[pos], abs=1e-3)


@pytest.mark.parametrize("engine_class", [HFEngine, GenerateEngine])
def test_seeded_sampling_repeats_and_does_not_depend_on_the_batch(device_model, tiny_tokenizer, engine_class):
    prompts = [_prompt(tiny_tokenizer, text) for text in ("Turn 1:\nState:\n_ _ P O", "reward", "think answer")]
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=11)
    first = [r.token_ids for r in engine_class(device_model, tiny_tokenizer).generate(prompts, params)]
    again = [r.token_ids for r in engine_class(device_model, tiny_tokenizer).generate(prompts, params)]
    assert first == again
    if engine_class is HFEngine:
        one_row = HFEngine(device_model, tiny_tokenizer, batch_size=1).generate(prompts, params)
        assert [r.token_ids for r in one_row] == first


def test_a_bfloat16_model_generates_with_finite_log_probs(tiny_tokenizer):
    if DEVICE.startswith("cuda") and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    model = build_tiny_model(tiny_tokenizer).eval().to(DEVICE, dtype=torch.bfloat16)
    prompts = [_prompt(tiny_tokenizer, "Arms: Dragon, Phoenix. Choose one."), _prompt(tiny_tokenizer, "reward")]
    for engine in (HFEngine(model, tiny_tokenizer, batch_size=2), GenerateEngine(model, tiny_tokenizer)):
        results = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=8, seed=2))
        assert len(results) == 2
        for result in results:
            assert 0 < len(result.token_ids) <= 8
            assert len(result.logprobs) == len(result.token_ids)
            assert all(math.isfinite(x) and x <= 0 for x in result.logprobs)


def test_shared_attention_on_the_device_changes_no_reply(device_model, tiny_tokenizer):
    # Groups of 4 rollouts sharing their first prompt: off the CPU the shared part and its log-sum-exp are computed
    # in float32 (attention_with_lse_math), not by torch's CPU flash kernel.
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
    kwargs = {"env_kwargs": {"protocol": {"stop_after_answer": False, "max_turns": 4}},
              "settings": latest_rollout(reply_tokens="sampled"), "sampling": sampling}  # fmt: skip
    engines = [HFEngine(device_model, tiny_tokenizer, batch_size=8, share_attention=s) for s in (False, True)]
    plain, shared = (collect_rollouts(e, tiny_tokenizer, "ragen/FrozenLake-v0", [0, 1], 4, **kwargs) for e in engines)
    assert _signature(shared) == _signature(plain)
    for a, b in zip(plain.trajectories, shared.trajectories):
        assert b.old_logprobs == pytest.approx(a.old_logprobs, abs=1e-3)
    assert engines[1].stats["attended_columns"] < engines[0].stats["attended_columns"]
