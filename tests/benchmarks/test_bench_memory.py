"""``benchmarks/bench_memory.py``: a short training run measured phase by phase, and its state's arithmetic.

One StarPO-S step on Bandit with a tiny random Llama and a separate value model (the preset's critic), in this
process: the phases a step runs have their peaks, and weights, gradients and AdamW's state are what the parameters
make them (float32: 4 bytes each; AdamW two moments).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("psutil")

from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_memory


def test_one_step_is_measured_per_phase_with_its_state(tmp_path, capsys):
    model_dir = tmp_path / "tiny"
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer, hidden_size=32, num_layers=2).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    threads = torch.get_num_threads()
    try:
        report = bench_memory.run([
            "--config", "starpo-s", "--env", "ragen/Bandit-v0", "--model", str(model_dir),
            "--env_groups", "2", "--group_size", "2", "--max_new_tokens", "6", "--micro_batch_size", "2",
            "--filter_ratio", "1.0", "--total_steps", "1", "--val_every", "0", "--save_steps", "0",
            "--report_to", "jsonl", "--output_dir", str(tmp_path / "run"), "--json", str(tmp_path / "memory.json"),
        ])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    for phase in ("load", "init", "rollout", "fwd+bwd", "optimizer"):
        assert report["phases"][phase]["peak_bytes"] >= report["rss_before_load_bytes"] > 0, phase
    state = {row["part"]: row for row in report["state"]}
    assert set(state) == {"policy", "critic"}  # starpo-s: a separate value model
    for part, row in state.items():
        assert row["weights_bytes"] == 4 * row["parameters"], part  # float32 master weights
        assert row["grads_bytes"] == 4 * row["trainable"] > 0, part
        assert row["optimizer_bytes"] >= 2 * 4 * row["trainable"], part  # AdamW's two moments (+ its step counts)
    # the kernel's high-water mark (ru_maxrss) is updated lazily: it can trail a sampled RSS by a few pages
    assert report["peak_rss_bytes"] >= 0.99 * max(p["peak_bytes"] for p in report["phases"].values())
    assert json.loads((tmp_path / "memory.json").read_text())["state"] == report["state"]
    out = capsys.readouterr().out
    assert "fwd+bwd" in out and "AdamW GB" in out and "peak RSS" in out
