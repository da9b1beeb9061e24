"""``ragen-trainer``: help, presets, config resolution, errors before any model loads, a real short run."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from ragen_trainer import cli
from ragen_trainer.config import PRESETS, StarPOConfig
from ragen_trainer.engines.local_server import free_port


def test_help_lists_every_field_and_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for f in fields(StarPOConfig):
        assert f"--{f.name}" in text, f.name
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    top = capsys.readouterr().out
    for command in ("train", "presets", "eval", "leaderboard"):
        assert command in top


def test_presets_command(capsys):
    assert cli.main(["presets"]) == 0
    out = capsys.readouterr().out
    for name in PRESETS:
        assert name in out


def test_dry_run_resolves_preset_flags_and_set(capsys):
    rc = cli.main(["train", "--config", "grpo", "--env", "ragen/FrozenLake-v0", "--filter-ratio", "0.5",
                   "--group_size", "4", "--set", "kl_coef=0", "--set", "env_kwargs={size: 4}", "--dry-run"])
    assert rc == 0
    import yaml

    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["adv_estimator"] == "grpo" and cfg["env_id"] == "ragen/FrozenLake-v0"
    assert cfg["filter_ratio"] == 0.5 and cfg["group_size"] == 4 and cfg["kl_coef"] == 0.0
    assert cfg["env_kwargs"] == {"size": 4}


@pytest.mark.parametrize("argv,needle", [
    (["--filter_mode", "variance"], "filter_mode"),
    (["--config", "no-such-preset"], "preset name"),
    (["--set", "filter_ratoi=0.5"], "filter_ratio"),
    (["--critic", "none"], "critic"),
    (["--group_size", "many"], "group_size"),
])
def test_bad_config_fails_before_any_model_loads(monkeypatch, capsys, argv, needle):
    import ragen_trainer.models

    def boom(*args, **kwargs):
        raise AssertionError("a model was loaded for a bad config")

    monkeypatch.setattr(ragen_trainer.models, "load_model_and_tokenizer", boom)
    assert cli.main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "error" in err


def test_a_paper_scale_run_on_a_cpu_names_the_small_cpu_config():
    from pathlib import Path

    from ragen_trainer.config import load_config

    paper = load_config("starpo-s").replace(env_id="ragen/Bandit-v0", model="smollm2")
    note = cli.cpu_scale_note(paper)
    assert note and "10,240,000 tokens" in note and cli.QUICK_CPU_CONFIG in note
    quick = Path(__file__).resolve().parents[2] / cli.QUICK_CPU_CONFIG
    assert cli.cpu_scale_note(load_config(str(quick))) is None  # the quick config itself: no note


def test_eval_and_leaderboard_are_dispatched(capsys):
    if cli._evaluation_module() is None:
        pytest.skip("ragen_trainer.evaluation.cli is not present")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["eval", "--help"])
    assert exit_info.value.code == 0
    assert "--suite" in capsys.readouterr().out


def test_train_end_to_end_from_the_command_line(tmp_path, tiny_model_dir, capsys):
    pytest.importorskip("trl")
    out = tmp_path / "run"
    rc = cli.main([
        "train", "--config", "starpo-s-grpo", "--env", "ragen/Bandit-v0", "--model", str(tiny_model_dir),
        "--output_dir", str(out), "--total_steps", "1", "--env_groups", "2", "--group_size", "2",
        "--max_new_tokens", "4", "--max_context_tokens", "1024", "--max_turns", "1", "--val_every", "0",
        "--save_steps", "1", "--report_to", "jsonl", "--set", "actor_lr=1e-4",
    ])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["interrupted"] is False
    assert (out / "checkpoint-1" / "model.safetensors").is_file()
    assert (out / "final" / "config.json").is_file()
    assert "done: 1 steps" in capsys.readouterr().err


def test_train_a_lora_adapter_from_the_command_line(tmp_path, tiny_model_dir):
    pytest.importorskip("peft")
    from ragen_trainer.models import load_model_and_tokenizer

    out = tmp_path / "run"
    rc = cli.main([
        "train", "--config", "starpo-s", "--env", "ragen/Bandit-v0", "--model", str(tiny_model_dir),
        "--output_dir", str(out), "--total_steps", "1", "--env_groups", "2", "--group_size", "2",
        "--max_new_tokens", "4", "--max_context_tokens", "1024", "--max_turns", "1", "--val_every", "0",
        "--save_steps", "1", "--report_to", "jsonl", "--lora_rank", "4", "--lora_alpha", "8",
        "--lora_target_modules", "q_proj,v_proj",
    ])
    assert rc == 0
    for folder in (out / "checkpoint-1", out / "final"):
        assert (folder / "adapter_model.safetensors").is_file() and not (folder / "model.safetensors").exists()
    model, _ = load_model_and_tokenizer(str(out / "final"), device="cpu")  # the adapter loads on its base model
    names = [n for n, _ in model.named_parameters()]
    assert any("lora_A" in n and "q_proj" in n for n in names) and not any("lora_A" in n and "k_proj" in n for n in names)


def test_same_command_runs_under_accelerate_launch_with_two_processes(tmp_path, tiny_model_dir):
    """Nothing assumes one process: 2 CPU processes (gloo) roll out their share of the groups, gather, filter alike,
    train, and only the main process writes the output folder."""
    import os
    import shutil
    import subprocess
    import sys

    pytest.importorskip("trl")
    if shutil.which("accelerate") is None:
        pytest.skip("the accelerate launcher is not on PATH")
    out = tmp_path / "run"
    cmd = [
        "accelerate", "launch", "--cpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", "--main_process_port", str(free_port()), "-m", "ragen_trainer.cli", "train",
        "--config", "starpo-s", "--model", str(tiny_model_dir), "--output_dir", str(out), "--total_steps", "1",
        "--env_groups", "3", "--group_size", "2", "--max_new_tokens", "4", "--max_context_tokens", "1024",
        "--max_turns", "1", "--val_every", "1", "--val_groups", "3", "--save_steps", "1", "--micro_batch_size", "1",
        "--filter_ratio", "0.5", "--report_to", "jsonl",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1  # written once, by the main process
    assert rows[0]["batch/trajectories"] == 6 and rows[0]["batch/groups"] == 3  # both processes' groups
    assert rows[0]["filter/kept_trajectories"] == 2  # int(0.5 x 3) = 1 group of 2
    assert (out / "checkpoint-1" / "model.safetensors").is_file()
    assert json.loads((out / "summary.json").read_text())["steps"] == 1
