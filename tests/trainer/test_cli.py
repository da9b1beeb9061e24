"""``ragen-trainer``: help, presets, config resolution, errors before any model loads, a real short run."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from ragen_trainer import cli
from ragen_trainer.config import PRESETS, StarPOConfig


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


