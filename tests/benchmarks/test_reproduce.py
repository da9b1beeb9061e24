"""``benchmarks/reproduce.py`` without training: every run of every experiment is a valid trainer config that builds
its env, each run's own settings win over the command line's, each experiment has its own defaults, and the JSON and
PNG hold the experiment's own curves (the training itself is replaced by fixed metric rows)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import gymnasium as gym
import pytest

import ragen_envs  # noqa: F401  (registers the ragen/* ids)

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "reproduce.py"


@pytest.fixture(scope="module")
def reproduce() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reproduce_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _configs(reproduce: ModuleType, argv: list[str], tmp_path: Path) -> dict[str, Any]:
    """Run name -> validated config, for the experiment and flags of ``argv``."""
    args = reproduce.parse_args(argv)
    runs = reproduce.EXPERIMENTS[args.experiment].runs(args)
    return {run.name: reproduce.run_config(run, args, tmp_path / run.name) for run in runs}


def _wrapper(env: gym.Env, name: str) -> Any:
    """The reward wrapper whose part is ``name`` in ``env``'s chain, or ``None``."""
    while env is not None:
        if getattr(env, "name", None) == name and hasattr(env, "weight"):
            return env
        env = getattr(env, "env", None)
    return None


@pytest.mark.parametrize("experiment", ["echo-trap", "reasoning", "rollout-shape"])
def test_every_run_is_a_valid_config_that_builds_its_env(reproduce, experiment, tmp_path):
    args = reproduce.parse_args([experiment])
    runs = reproduce.EXPERIMENTS[experiment].runs(args)
    assert runs and len({r.name for r in runs}) == len(runs)
    for name, cfg in _configs(reproduce, [experiment], tmp_path).items():
        assert cfg.env_id == reproduce.EXPERIMENTS[experiment].env
        assert cfg.max_new_tokens == reproduce.EXPERIMENTS[experiment].max_new_tokens
        assert cfg.seed == 0 and cfg.output_dir == str(tmp_path / name)
        env = gym.make(cfg.env_id, **cfg.env_make_kwargs())  # reward_wrappers and protocol as the trainer passes them
        env.reset(seed=0)
        env.close()


def test_echo_trap_keeps_its_runs_defaults_and_curves(reproduce, tmp_path):
    configs = _configs(reproduce, ["echo-trap"], tmp_path)
    assert list(configs) == ["ppo", "grpo", "starpo-s", "ppo-keep-0.75", "ppo-keep-0.5", "ppo-keep-0.25"]
    assert reproduce.EXPERIMENTS["echo-trap"].env == "ragen/Bandit-v0"
    assert all(c.max_new_tokens == 8 and c.protocol_settings().enable_think is False for c in configs.values())
    assert list(reproduce.EXPERIMENTS["echo-trap"].curves) == [
        "success_rate",
        "reward/in_group_std",
        "policy/entropy",
        "optim/grad_norm",
        "diversity/unique_reply_share",
    ]


@pytest.mark.parametrize("flag", ["true", "false"])
def test_reasoning_runs_set_thinking_and_grounding_weight_themselves(reproduce, flag, tmp_path):
    configs = _configs(reproduce, ["reasoning", "--enable-think", flag], tmp_path)
    assert list(configs) == ["think-outcome", "think-grounding", "no-think-outcome"]
    thinking = {name: cfg.protocol_settings().enable_think for name, cfg in configs.items()}
    assert thinking == {"think-outcome": True, "think-grounding": True, "no-think-outcome": False}  # not the flag
    weights = {}
    for name, cfg in configs.items():
        assert (cfg.filter_ratio, cfg.clip_high, cfg.kl_coef) == (0.25, 0.28, 0.0)  # starpo-s
        wrapper = _wrapper(gym.make(cfg.env_id, **cfg.env_make_kwargs()), "grounding")
        assert wrapper is not None, name
        weights[name] = wrapper.weight
    assert weights == {"think-outcome": 0.0, "think-grounding": 1.0, "no-think-outcome": 0.0}


def test_rollout_shape_sweeps_actions_per_turn_and_reuses_rollouts_for_the_stale_run(reproduce, tmp_path):
    configs = _configs(reproduce, ["rollout-shape"], tmp_path)
    assert list(configs) == [f"actions-{k}" for k in range(1, 8)] + ["stale-3x"]
    settings = {name: cfg.protocol_settings() for name, cfg in configs.items()}
    assert [settings[f"actions-{k}"].actions_per_turn for k in range(1, 8)] == list(range(1, 8))
    assert {s.max_actions_per_episode for s in settings.values()} == {10}  # the episode budget is unchanged
    fresh, stale = configs["actions-5"], configs["stale-3x"]
    assert settings["stale-3x"] == settings["actions-5"]
    assert (fresh.ppo_epochs, stale.ppo_epochs) == (1, 3)
    # as many update passes, a third of the rollout batches
    assert stale.total_steps * stale.ppo_epochs == fresh.total_steps * fresh.ppo_epochs == 6  # the default 6 steps
    assert all(c.filter_ratio == 0.25 for c in configs.values())
    # thinking follows --enable-think here, and --env / --max-new-tokens override the experiment's defaults
    other = _configs(reproduce, ["rollout-shape", "--env", "ragen/Sokoban-v0", "--max-new-tokens", "48",
                                 "--enable-think", "true", "--steps", "2"], tmp_path)  # fmt: skip
    assert {(c.env_id, c.max_new_tokens, c.protocol_settings().enable_think) for c in other.values()} == {
        ("ragen/Sokoban-v0", 48, True)
    }
    assert other["stale-3x"].total_steps == 1  # never below one step


def test_run_changes_merge_into_the_scale_setting_by_setting(reproduce):
    scale = {"protocol": {"enable_think": False, "max_turns": 5}, "env_kwargs": {"size": 4}, "total_steps": 15}
    changes = {"protocol": {"enable_think": True}, "env_kwargs": {"reward_wrappers": ["grounding"]}, "ppo_epochs": 3}
    assert reproduce.merged_changes(scale, changes) == {
        "protocol": {"enable_think": True, "max_turns": 5},
        "env_kwargs": {"size": 4, "reward_wrappers": ["grounding"]},
        "total_steps": 15,
        "ppo_epochs": 3,
    }


def _rows(keys: list[str], steps: int) -> list[dict[str, Any]]:
    rows = [{"step": s, **{k: 0.1 * s for k in keys}, "val/success": 0.5} for s in range(1, steps + 1)]
    rows[1]["warnings"] = ["a warning"]
    return rows


@pytest.mark.parametrize("experiment", ["echo-trap", "reasoning", "rollout-shape"])
def test_main_writes_the_experiments_own_curves(reproduce, experiment, tmp_path, monkeypatch, capsys):
    curves = reproduce.EXPERIMENTS[experiment].curves
    monkeypatch.setattr(reproduce, "train", lambda run, args, folder: _rows(list(curves), args.steps))
    argv = [experiment, "--steps", "3", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]
    assert reproduce.main(argv) == 0
    env = reproduce.EXPERIMENTS[experiment].env.removeprefix("ragen/").removesuffix("-v0").lower()
    result = json.loads((tmp_path / "out" / f"{experiment}-{env}.json").read_text())
    assert (tmp_path / "out" / f"{experiment}-{env}.png").is_file()
    assert result["curves"] == curves and result["x"] == reproduce.EXPERIMENTS[experiment].x_key
    for name, data in result["runs"].items():
        assert set(curves) <= set(data) and data["step"] == [1, 2, 3]
        assert data["warnings"] == [{"step": 2, "messages": ["a warning"]}]
        passes = 3 if name == "stale-3x" else 1
        assert data["update_passes"] == [passes, 2 * passes, 3 * passes]
    printed = capsys.readouterr().out
    assert all(label in printed for label in curves.values())


def test_each_experiment_has_its_own_cpu_scale_and_the_command_line_wins(reproduce):
    scale = ("groups", "steps", "val_every", "val_groups")
    echo = reproduce.parse_args(["echo-trap"])
    assert [getattr(echo, k) for k in scale] == [8, 15, 5, 32]
    for name in ("reasoning", "rollout-shape"):
        args = reproduce.parse_args([name])
        assert [getattr(args, k) for k in scale] == [4, 6, 3, 8]
    given = reproduce.parse_args(["reasoning", "--groups", "8", "--steps", "15", "--val-every", "5"])
    assert [getattr(given, k) for k in scale] == [8, 15, 5, 8]


def test_an_interrupted_run_is_trained_again_and_a_finished_one_read_back(reproduce, tmp_path):
    # The trainer writes summary.json on Ctrl-C / SIGTERM too; only a run that ended by itself counts as done.
    folder = tmp_path / "run"
    assert not reproduce.finished(folder)
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"steps": 1, "interrupted": True}))
    assert not reproduce.finished(folder)
    (folder / "summary.json").write_text(json.dumps({"steps": 6, "interrupted": False}))
    assert reproduce.finished(folder)
    (folder / "summary.json").write_text("{not json")
    assert not reproduce.finished(folder)
