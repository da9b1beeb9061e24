"""``benchmarks/bench_step.py``: both trainers get the same work, and one step of each side runs and is measured.

The end-to-end test trains a tiny random Llama (the tests' tokenizer) one step on Bandit through ragen's trainer
and through TRL's ``GRPOTrainer`` with the StarPO-S filter, in this process, and checks what the rows hold.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
from accelerate.state import AcceleratorState

from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_step


def _work(name: str, **sizes) -> bench_step.Workload:
    parser = bench_step.build_parser()
    args = parser.parse_args(["--workloads", name, *[f"--{k.replace('_', '-')}={v}" for k, v in sizes.items()]])
    return bench_step.build_workloads(args)[0]


@pytest.mark.parametrize("name", bench_step.WORKLOADS)
def test_each_workload_is_the_algorithm_it_names(tmp_path, name):
    work = _work(name)
    cfg = bench_step.ragen_config(work, bench_step.Settings(), str(tmp_path))
    assert cfg.adv_estimator == "grpo" and not cfg.use_critic and cfg.kl_coef == 0 and cfg.kl_reward_coef == 0
    assert cfg.loss_mask == "replies" and cfg.loss_agg_mode == "token-mean"  # as TRL's env_mask and loss "dapo"
    assert cfg.ppo_mini_batch_size == work.completions and cfg.ppo_epochs == 1  # one optimizer step, as TRL's
    assert cfg.total_steps == 2 and not cfg.gradient_checkpointing
    if name.endswith("starpo-s"):
        assert (cfg.preset, cfg.filter_ratio, cfg.filter_mode, cfg.clip_low, cfg.clip_high) == (
            "starpo-s-grpo", 0.25, "std", 0.2, 0.28)
    else:
        assert (cfg.filter_ratio, cfg.clip_low, cfg.clip_high) == (1.0, 0.2, 0.2)
    if name.startswith("frozenlake"):
        assert cfg.protocol_settings().max_turns == 3 and (work.groups, work.group_size) == (2, 4)
    else:
        assert cfg.protocol_settings().max_turns == 1 and (work.groups, work.group_size) == (4, 8)


def test_a_micro_batch_must_divide_the_step(capsys):
    with pytest.raises(SystemExit):
        bench_step.main(["--workloads", "bandit-grpo", "--micro-batch", "5"])
    assert "expected a divisor of groups x group size = 32" in capsys.readouterr().err


def test_bfloat16_is_autocast_over_float32_weights(tmp_path):
    settings = bench_step.Settings(dtype="bfloat16")
    cfg = bench_step.ragen_config(_work("bandit-grpo"), settings, str(tmp_path))
    assert (cfg.dtype, cfg.master_dtype) == ("bfloat16", "float32")
    assert bench_step.build_parser().parse_args(["--dtype", "float32", "bfloat16"]).dtype == ["float32", "bfloat16"]


def _row(side: str, dtype: str, step_s: float, fwd_bwd_s: float) -> dict:
    return {"workload": "bandit-grpo", "side": side, "dtype": dtype, "step_s": step_s, "fwd_bwd_s": fwd_bwd_s}


def test_tables_compare_the_trainers_per_dtype_and_the_dtypes_per_trainer():
    rows = [_row("ragen", "float32", 50.0, 30.0), _row("trl", "float32", 100.0, 60.0),
            _row("ragen", "bfloat16", 25.0, 10.0), _row("trl", "bfloat16", 80.0, 40.0)]  # fmt: skip
    text = bench_step.format_tables(rows)
    assert "bandit-grpo (float32): ragen / TRL step time 0.50 (2.00x faster), fwd+bwd 0.50" in text
    assert "bandit-grpo (bfloat16): ragen / TRL step time 0.31" in text
    assert "bandit-grpo ragen: bfloat16 / float32 step time 0.50, fwd+bwd 0.33" in text
    assert "bandit-grpo trl: bfloat16 / float32 step time 0.80, fwd+bwd 0.67" in text


def test_sides_ragen_times_ragen_alone_in_every_dtype(monkeypatch, capsys):
    """``--sides ragen`` (a dtype comparison on one machine without TRL's slower steps): every dtype's ragen row, no
    TRL process started, and the dtype ratio printed."""
    started = []

    def fake_worker(side, work, settings):
        started.append((side, settings.dtype))
        return {**_row(side, settings.dtype, 10.0 if settings.dtype == "float32" else 60.0, 5.0), "generated_tokens": 1}

    monkeypatch.setattr(bench_step, "_run_worker", fake_worker)
    bench_step.main(["--workloads", "bandit-grpo", "--dtype", "float32", "bfloat16", "--sides", "ragen", "--threads",
                     "1", "--steps", "1"])
    out = capsys.readouterr().out
    assert started == [("ragen", "float32"), ("ragen", "bfloat16")]
    assert "One training step, ragen-trainer, same work" in out
    assert "bandit-grpo ragen: bfloat16 / float32 step time 6.00" in out and "TRL step time" not in out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_starpo_s_step_on_each_side(tiny_model_dir, dtype):
    work = bench_step.Workload("bandit-starpo-s", "ragen/Bandit-v0", "starpo-s", groups=4, group_size=2,
                               max_new_tokens=6, micro_batch_size=2)  # fmt: skip
    settings = bench_step.Settings(model=tiny_model_dir, steps=1, warmup=0, threads=1, dtype=dtype)
    threads = torch.get_num_threads()
    try:
        rows = {side: bench_step.run_side(side, work, settings) for side in bench_step.SIDES}
    finally:
        torch.set_num_threads(threads)
        # TRL's Accelerator(mixed_precision="bf16") lives on in accelerate's process-wide state, which a later
        # Accelerator in this process (ragen's, in other tests) would inherit; the benchmark runs each side in a
        # process of its own
        AcceleratorState._reset_state(reset_partial_state=True)
    for side, row in rows.items():
        assert row["steps"] == 1 and row["calls"] > 0 and row["flops"] > 0, side
        assert row["fwd_bwd_s"] > 0 and row["step_s"] >= row["rollout_s"] + row["fwd_bwd_s"], side
        assert 0 < row["optimizer_s"] < row["step_s"], side
        assert row["trained_completions"] == 2, side  # one group of 4 kept (floor(0.25 x 4)), both sides
        assert row["matmul_peak_gflops_per_s"] > 0 and row["peak_rss_gb"] > 0 and row["dtype"] == dtype, side
        assert 0 < row["generated_tokens"] <= work.completions * work.max_new_tokens, side
    ragen, trl = rows["ragen"], rows["trl"]
    # ragen trains the kept group only, its prompt once; TRL runs every completion with its prompt (masked out)
    assert ragen["tokens"] < trl["tokens"] / 4
    assert ragen["head_positions"] <= 2 * work.max_new_tokens < trl["head_positions"]
    table = bench_step.format_tables([ragen, trl])
    assert f"bandit-starpo-s ({dtype}): ragen / TRL step time" in table and "GFLOP/s" in table
