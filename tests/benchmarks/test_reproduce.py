"""``benchmarks/reproduce.py`` without training: every run of every experiment is a valid config that builds its env
at both scales, the runs of one experiment differ in exactly the settings the experiment varies, the designs follow
``train_all.sh`` (action budget scaled with the per-turn cap, online-k with k times the groups and k updates), the
GPU-hour plan prints for the whole set, and the JSON and PNG hold the experiment's own curves (training replaced by
fixed metric rows)."""

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
from ragen_trainer.config import PRESETS, field_names

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "reproduce.py"

#: Fields that name or place a run rather than say what it trains.
_IDENTITY = {"output_dir", "preset"}


@pytest.fixture(scope="module")
def reproduce() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reproduce_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _flat(cfg: Any) -> dict[str, Any]:
    """The config as ``field`` / ``protocol.setting`` -> value, the protocol resolved."""
    data = cfg.to_dict()
    out = {k: v for k, v in data.items() if k != "protocol"}
    out.update({f"protocol.{k}": v for k, v in cfg.protocol_settings().to_dict().items()})
    return out


@pytest.mark.parametrize("scale", ["paper", "cpu"])
def test_every_run_is_a_valid_config_that_builds_its_env(reproduce, scale, tmp_path):
    for experiment in reproduce.EXPERIMENTS.values():
        runs = experiment.runs()
        assert runs and len({r.key for r in runs}) == len(runs), experiment.name
        for run in runs:
            assert run.preset in PRESETS and run.source, run.key
            cfg = reproduce.run_config(run, scale, tmp_path)
            key = reproduce.identity_key(reproduce.run_identity(cfg, scale))
            assert cfg.reference == "paper" and cfg.output_dir == str(tmp_path / scale / f"{run.key}-{key}")
            env = gym.make(cfg.env_id, **cfg.env_make_kwargs())
            env.reset(seed=0)
            env.close()
            for split in run.splits:
                assert split in reproduce.SPLITS


@pytest.mark.parametrize("name", sorted(["fig5-echo-trap", "fig7-filter", "fig8-kl-cliphigh", "fig9-starpo-s",
                                         "table2-diversity", "table3-actions", "fig10-online",
                                         "table4-generalization", "fig11-reasoning-length", "grounding"]))
def test_runs_of_an_experiment_differ_in_exactly_the_intended_settings(reproduce, name, tmp_path):
    experiment = reproduce.EXPERIMENTS[name]
    by_env: dict[str, list[dict[str, Any]]] = {}  # one panel: an env (and a preset, unless the preset varies)
    for run in experiment.runs():
        panel = run.env if "preset" in experiment.varies else f"{run.env} {run.preset}"
        by_env.setdefault(panel, []).append(_flat(reproduce.run_config(run, "paper", tmp_path)))
    allowed = set(experiment.varies) | _IDENTITY
    for env, configs in by_env.items():
        differing = {k for k in field_names() + [k for k in configs[0] if k.startswith("protocol.")]
                     if len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1}  # fmt: skip
        if len(configs) > 1:
            assert differing & set(experiment.varies), f"{name} on {env}: the runs do not differ"
        # a preset change brings the preset's own fields along: they must be the preset's
        if "preset" in experiment.varies:
            differing -= _preset_fields(configs)
        assert differing <= allowed, f"{name} on {env}: {sorted(differing - allowed)} differ too"


def _preset_fields(configs: list[dict[str, Any]]) -> set[str]:
    """Fields that differ between the presets the configs start from (their preset's doing, not the run's)."""
    from ragen_trainer.config import preset

    presets = [preset(c["preset"]) for c in configs]
    flat = [_flat(p) for p in presets]
    return {k for k in flat[0] if len({json.dumps(f.get(k), sort_keys=True) for f in flat}) > 1}


def test_the_action_budget_scales_with_the_per_turn_cap(reproduce, tmp_path):
    runs = reproduce.EXPERIMENTS["table3-actions"].runs()
    settings = [reproduce.run_config(r, "paper", tmp_path).protocol_settings() for r in runs]
    assert [(s.actions_per_turn, s.max_actions_per_episode) for s in settings] == [(k, 5 * k) for k in range(1, 9)]
    cpu = [reproduce.run_config(r, "cpu", tmp_path).protocol_settings() for r in runs]
    assert [(s.actions_per_turn, s.max_actions_per_episode) for s in cpu] == [(k, 5 * k) for k in range(1, 9)]


def test_online_k_rolls_out_k_times_the_groups_and_makes_k_updates(reproduce, tmp_path):
    configs = {r.name: reproduce.run_config(r, "paper", tmp_path) for r in reproduce.EXPERIMENTS["fig10-online"].runs()}
    for k in (1, 2, 5, 10):
        cfg = configs[f"online-{k}"]
        assert cfg.env_groups == 8 * k and cfg.group_size == 16 and cfg.filter_ratio == 0.25
        kept = cfg.kept_groups * cfg.group_size
        assert kept == 32 * k and kept // cfg.ppo_mini_batch_size == k  # k updates on distinct mini-batches
        assert cfg.ppo_epochs == 1
    assert [configs[f"online-{k}"].val_every for k in (1, 2, 5, 10)] == [10, 5, 2, 1]  # every 10 updates
    assert [configs[f"online-{k}"].total_steps for k in (1, 2, 5, 10)] == [200, 100, 40, 80]  # as train_all.sh


def test_task_diversity_keeps_128_rollouts_a_step(reproduce, tmp_path):
    configs = [reproduce.run_config(r, "paper", tmp_path) for r in reproduce.EXPERIMENTS["table2-diversity"].runs()]
    assert [(c.env_groups, c.group_size) for c in configs] == [(4, 32), (8, 16), (16, 8), (32, 4), (64, 2), (128, 1)]
    cpu = [reproduce.run_config(r, "cpu", tmp_path) for r in reproduce.EXPERIMENTS["table2-diversity"].runs()]
    # a fixed CPU budget too, as far as one rollout per state allows (64 x 2 and 128 x 1 become 32 x 1 and 64 x 1)
    assert len({c.env_groups * c.group_size for c in cpu[:4]}) == 1 and cpu[4].group_size == cpu[5].group_size == 1


def test_generalization_runs_use_the_reference_arm_names_and_splits(reproduce, tmp_path):
    runs = {r.key: r for r in reproduce.EXPERIMENTS["table4-generalization"].runs()}
    original = reproduce.run_config(runs["bandit/generalization"], "paper", tmp_path)
    # Table 4's "Bandit": the intuitive mapping (the ambitious profession risky), train_all.sh's -rev run (line 66)
    assert original.env_kwargs == {"low_risk_name": "Teacher", "high_risk_name": "Engineer"}
    assert [s["name"] for s in original.val_envs] == ["bandit-rev-test"]  # validated during training, as the paper
    assert original.max_new_tokens == 500  # config/_1_bandit.yaml
    assert runs["bandit/generalization"].splits == ("bandit-rev-test",)  # tested with Trader risky (line 66)
    assert reproduce.SPLITS["bandit-test"][1] == {"low_risk_name": "Trader", "high_risk_name": "Librarian"}
    assert runs["bandit/generalization-rev"].splits == ("bandit-test",)  # line 53: Teacher, then Librarian risky
    nothink = reproduce.run_config(runs["bandit/generalization-nothink"], "paper", tmp_path)
    assert nothink.protocol_settings().enable_think is False and original.protocol_settings().enable_think is True
    assert runs["sokoban/generalization"].splits == reproduce.SOKOBAN_SPLITS


def test_grounding_is_credited_to_ragen_and_the_rest_to_the_paper(reproduce):
    credits = {name: e.credit for name, e in reproduce.EXPERIMENTS.items()}
    assert credits.pop("grounding") == "ragen"
    assert set(credits.values()) == {"paper"}


def test_kl_and_clip_higher_ablations_change_one_setting_of_vanilla_ppo(reproduce, tmp_path):
    configs = {r.name: reproduce.run_config(r, "paper", tmp_path) for r in reproduce.EXPERIMENTS["fig8-kl-cliphigh"].runs()
               if r.env == "sokoban"}  # fmt: skip
    base = configs["ppo"]
    assert (base.kl_reward_coef, base.kl_coef, base.clip_high, base.filter_ratio) == (0.001, 0.0, 0.2, 1.0)
    assert configs["ppo-nokl"].kl_reward_coef == 0.0 and configs["ppo-cliphigh"].clip_high == 0.28


def test_paper_dry_run_prints_every_run_and_an_estimate(reproduce, tmp_path, capsys):
    assert reproduce.main(["paper", "--gpus", "4", "--dry-run", "--runs", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    keys = {r.key for _, r in reproduce.paper_runs()}
    assert all(f"- {key} " in printed for key in keys)
    assert "GPU-h" in printed and "total:" in printed and "prior: the paper's Figure 7" in printed
    assert not any(tmp_path.iterdir())  # a dry run trains and writes nothing


def test_measured_step_costs_replace_the_prior(reproduce, tmp_path):
    folder = tmp_path / "paper" / "sokoban" / "ppo"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("env_groups: 8\ngroup_size: 16\n")
    rows = [{"step": s, "time/rollout": 64.0, "time/scoring": 8.0, "time/update": 24.0,
             "filter/kept_trajectories": 32} for s in range(1, 5)]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    costs = reproduce.measured_costs(tmp_path)
    assert costs["sokoban"][:2] == (pytest.approx(0.5), pytest.approx(1.0))  # 64 s / 128 rollouts, 32 s / 32 kept
    run = next(r for r in reproduce.EXPERIMENTS["fig9-starpo-s"].runs() if r.key == "sokoban/starpo-s")
    cfg = reproduce.run_config(run, "paper", tmp_path)
    hours, source = reproduce.estimate_hours(cfg, "sokoban", costs)
    assert source.startswith("measured")
    # 200 steps x (128 x 0.5 + 32 x 1.0) s, plus 21 validations of 256 states x 0.5 s
    assert hours == pytest.approx((200 * (64 + 32) + 21 * 256 * 0.5) / 3600)
    prior, source = reproduce.estimate_hours(cfg, "sokoban", {})
    assert source.startswith("prior") and prior > 0


def test_ema_smoothing_skips_missing_values(reproduce):
    assert reproduce.ema([None, 1.0, None, 0.0], weight=0.5) == [None, 1.0, None, 0.5]


def test_validation_is_not_smoothed_and_sits_where_it_was_measured(reproduce):
    rows = [{"step": 1, "val/success": 0.5, "reward/mean": 1.0}, {"step": 2, "reward/mean": 0.0},
            {"step": 3, "val/success": 0.25, "reward/mean": 0.0}]  # fmt: skip
    data = reproduce.curves(rows, {"reward/mean": "r"}, {"val/success": 1.0})
    assert data["val_points"] == [[0, 0.5], [2, 0.25], [3, 1.0]]  # before steps 1 and 3, and after the last
    assert data["val/success:ema"] == [0.5, None, 0.25] and data["reward/mean:ema"] == pytest.approx([1.0, 0.6, 0.36])


def _rows(keys: list[str], steps: int) -> list[dict[str, Any]]:
    rows = [{"step": s, "time": 10.0 * s, **{k: 0.1 * s for k in keys}, "val/success": 0.5} for s in range(1, steps + 1)]
    rows[1]["warnings"] = ["a warning"]
    return rows


def test_main_writes_the_experiments_own_curves_and_splits(reproduce, tmp_path, monkeypatch, capsys):
    experiment = reproduce.EXPERIMENTS["table4-generalization"]
    monkeypatch.setattr(reproduce, "train", lambda run, cfg, **kw: _rows(list(experiment.curves), 3))
    monkeypatch.setattr(reproduce, "evaluate_splits", lambda run, cfg, states: {s: 0.25 for s in run.splits})
    argv = ["table4-generalization", "--scale", "cpu", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path)]
    assert reproduce.main(argv) == 0
    result = json.loads((tmp_path / "table4-generalization-cpu.json").read_text())
    assert (tmp_path / "table4-generalization-cpu.png").is_file()
    assert result["curves"] == experiment.curves and result["ema"] == reproduce.EMA
    data = result["runs"]["bandit/generalization"]
    assert data["step"] == [1, 2, 3] and data["splits"] == {"bandit-rev-test": 0.25}
    assert data["warnings"] == [{"step": 2, "messages": ["a warning"]}]
    assert data["seconds_per_step"] == [10.0, 10.0]
    assert "bandit-rev-test" in capsys.readouterr().out


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


def test_unknown_runs_and_bad_gpu_counts_are_refused(reproduce, capsys):
    with pytest.raises(SystemExit):
        reproduce.main(["fig9-starpo-s", "--only", "nope"])
    assert "unknown run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        reproduce.main(["paper", "--gpus", "0", "--dry-run"])
    assert "--gpus" in capsys.readouterr().err


def test_env_moves_an_experiments_design_and_keeps_the_update_shape(reproduce, tmp_path):
    runs = reproduce.experiment_runs(reproduce.EXPERIMENTS["fig10-online"], "bandit")
    assert [r.key for r in runs] == ["bandit/online-1", "bandit/online-2", "bandit/online-5", "bandit/online-10"]
    assert all(r.splits == () for r in runs)  # the Sokoban splits belong to the Sokoban design
    configs = [reproduce.run_config(r, "cpu", tmp_path) for r in runs]
    assert {c.env_id for c in configs} == {"ragen/Bandit-v0"}
    # k times the groups, the CPU mini-batch unchanged: k updates a step
    assert [c.kept_groups * c.group_size // c.ppo_mini_batch_size for c in configs] == [1, 2, 5, 10]
