"""``ragen-trainer train --engine vllm`` (no ``--engine_url``: vLLM in the trainer's process) and ``ragen-trainer eval
--engine vllm``, run as a user runs them, with the bundled SmolLM2 on this CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ragen_trainer.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_training_run_with_vllm_in_the_trainers_process(tmp_path):
    """A StarPO-S step on FrozenLake (two turns, so the prefix cache and seeded multi-turn prompts are exercised),
    then validation: the weights are pushed before the rollout and again, updated, before validation. The critic is a value head on the policy (the cheaper critic): its weights live in the
    policy module and must stay out of what vLLM is given."""
    out = tmp_path / "run"
    done = run_cli("train", "--config", "starpo-s-value-head", "--env", "ragen/FrozenLake-v0", "--engine", "vllm",
                   "--output_dir", str(out), "--total_steps", "1", "--env_groups", "2", "--group_size", "2",
                   "--max_turns", "2", "--max_new_tokens", "16", "--max_context_tokens", "1024", "--val_every", "1",
                   "--val_groups", "2", "--report_to", "jsonl")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: 1 steps" in done.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "policy/ratio_mean" in r]
    assert [r["step"] for r in steps] == [1]
    assert all(r["response/length_mean"] > 0 for r in steps if "response/length_mean" in r)
    assert any("val/success" in r for r in rows)
    assert (out / "final" / "model.safetensors").is_file()


def test_eval_through_vllm_on_a_small_suite(tmp_path):
    """The quick suite's first initial state of Bandit and FrozenLake (two turns), played through vLLM."""
    result = tmp_path / "result.json"
    done = run_cli("eval", "--engine", "vllm", "--suite", "quick-v2", "--envs", "Bandit,FrozenLake", "--max-states",
                   "1", "--protocol", "max_turns=2", "-o", str(result), "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(result.read_text())
    assert data["agent"]["engine"] == "vllm"
    episodes = data["episodes"]
    assert sorted(e["env_id"] for e in episodes) == ["ragen/Bandit-v0", "ragen/FrozenLake-v0"]
    assert all(e["error"] is None and e["turns"] for e in episodes)
    assert all(t["reply"].startswith("<think>") for e in episodes for t in e["turns"])  # the generation prefix
