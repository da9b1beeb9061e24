"""The ``vllm`` engine for real, where there is a GPU and vLLM: rollouts through the same driver as ``hf``, with prefix
caching, stop strings and seeded replies. Skipped elsewhere (CI has no GPU); the CPU tests of the engine's protocol are
in ``test_engines.py`` (stand-ins for vLLM), ``test_engines_stop.py`` and ``test_engines_served.py`` (a real
OpenAI-compatible server)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
if not torch.cuda.is_available():
    pytest.skip("vLLM runs on a CUDA GPU; none here", allow_module_level=True)

from ragen_trainer.engines import SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.engines.vllm import VLLMEngine
from ragen_trainer.rollout import collect_rollouts
from tests.trainer.conftest import latest_rollout


@pytest.fixture(scope="module")
def vllm_engine(tiny_model_dir, tiny_tokenizer):
    engine = VLLMEngine(str(tiny_model_dir), tiny_tokenizer, mode="colocate", gpu_memory_utilization=0.2,
                        dtype="float32", max_model_len=4096)  # fmt: skip
    config = getattr(engine.llm.llm_engine, "vllm_config", engine.llm.llm_engine)  # V1 engine, or V0's own
    assert config.cache_config.enable_prefix_caching
    return engine


def test_vllm_rollouts_play_through_the_driver_with_stop_strings(vllm_engine, tiny_tokenizer):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, seed=3)
    settings = latest_rollout()
    batch = collect_rollouts(vllm_engine, tiny_tokenizer, "ragen/FrozenLake-v0", [0, 1], 3, settings=settings,
                             sampling=sampling)  # fmt: skip
    again = collect_rollouts(vllm_engine, tiny_tokenizer, "ragen/FrozenLake-v0", [0, 1], 3, settings=settings,
                             sampling=sampling)  # fmt: skip
    assert [t.input_ids for t in batch.trajectories] == [t.input_ids for t in again.trajectories]  # seeded
    for traj in batch.trajectories:
        assert traj.turn_spans and len(traj.old_logprobs) == len(traj.input_ids)
        for reply in traj.replies:
            assert "</answer>" not in reply or reply.rstrip().endswith("</answer>")  # stop_after_answer


def test_vllm_greedy_rollouts_match_the_hf_engine(vllm_engine, tiny_model, tiny_tokenizer):
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    hf = collect_rollouts(HFEngine(tiny_model, tiny_tokenizer), tiny_tokenizer, "ragen/Bandit-v0", [0, 1], 2,
                          settings=latest_rollout(), sampling=greedy)  # fmt: skip
    vllm = collect_rollouts(vllm_engine, tiny_tokenizer, "ragen/Bandit-v0", [0, 1], 2, settings=latest_rollout(),
                            sampling=greedy)  # fmt: skip
    assert [t.input_ids for t in vllm.trajectories] == [t.input_ids for t in hf.trajectories]
