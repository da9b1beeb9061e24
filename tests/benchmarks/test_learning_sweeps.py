"""The learning sweeps' machinery: the Bandit sweep's plan and report, the resumable run queue, the multi-turn
report's intervals."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import pytest
from rich.console import Console

from benchmarks import learn_multiturn, sweep_bandit
from benchmarks.run_queue import Job, run_jobs


def test_the_sweep_varies_one_thing_at_a_time_and_trains_each_configuration_once():
    runs = sweep_bandit.plan(None, [0, 1, 2])
    labels = sorted({r.label for r in runs})
    assert labels == ["grpo-lr5e-05", "ppo-lr5e-05", "starpo-s-lr1e-05", "starpo-s-lr2e-05", "starpo-s-lr5e-05",
                      "starpo-s-lr5e-05-keep0.5", "starpo-s-lr5e-06"]
    assert len(runs) == len(labels) * 3 == len(set(runs))  # StarPO-S at 5e-5 is in every experiment, trained once
    command = next(r for r in runs if r.label == "ppo-lr5e-05").command(Path("root"))
    assert command[:4] == ["ragen-trainer", "train", "--config", "ppo"] and "--filter_ratio" not in command
    main_job = {"--max_new_tokens": "8", "--env_groups": "4", "--group_size": "8"}
    assert {flag: command[command.index(flag) + 1] for flag in main_job} == main_job
    keep1 = sweep_bandit.plan(["keep-1.0"], [0])[0].command(Path("r"))
    assert keep1[keep1.index("--filter_ratio") + 1] == "1" and keep1[-2:] == ["--dtype", "float32"]


def test_the_dtype_experiment_differs_from_the_learning_rate_that_learns_by_its_dtype_alone():
    (bf16,) = sweep_bandit.plan(["dtype"], [0])
    (fp32,) = [r for r in sweep_bandit.plan(["lr"], [0]) if r.lr == 5e-6]
    assert (bf16.label, fp32.label) == ("starpo-s-lr5e-06-bf16", "starpo-s-lr5e-06")
    assert bf16.folder(Path("r")) != fp32.folder(Path("r"))
    a, b = bf16.command(Path("r")), fp32.command(Path("r"))
    differ = [(x, y) for x, y in zip(a, b) if x != y]
    assert len(a) == len(b) and differ == [("r/starpo-s-lr5e-06-bf16/seed0", "r/starpo-s-lr5e-06/seed0"),
                                           ("bfloat16", "float32")]


def _fake_run(folder: Path, seed: int, val_end: float, steps: int = sweep_bandit.STEPS) -> None:
    folder.mkdir(parents=True)
    rows = [{"step": s, "success_rate": 0.5, "actions/format_error_rate": 0.0, "diversity/unique_reply_share": 0.1,
             "policy/reply_entropy": 1.0, **({"val/success": 0.03} if s == 1 else {})} for s in range(1, steps + 1)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (folder / "summary.json").write_text(json.dumps({"steps": steps, "interrupted": False, "wall_seconds": 60,
                                                     "final_validation": {"val/success": val_end}}))


def test_the_report_lists_every_run_and_each_configuration_over_its_seeds(tmp_path):
    runs = sweep_bandit.plan(["lr"], [0, 1])
    for run, end in zip(runs, (0.0, 0.5, 1.0, 1.0, 1.0, 0.5, 0.9, 0.95)):
        if run.label != "starpo-s-lr2e-05" or run.seed == 0:  # one run unfinished
            _fake_run(run.folder(tmp_path / "runs"), run.seed, end)
    md, js = tmp_path / "bandit.md", tmp_path / "bandit.json"
    sweep_bandit.report(runs, tmp_path / "runs", md, js, Console(quiet=True))
    text = md.read_text()
    assert "| starpo-s-lr5e-05 | 2 | 0.03 | 0.50 ± 0.71 | 0.00, 1.00 | 1 | 0.10 |" in text
    assert "Not finished: starpo-s-lr2e-05/seed1" in text
    assert len(json.loads(js.read_text())["runs"]) == 7


def test_a_sweep_report_keeps_the_runs_it_listed_whose_folders_are_gone(tmp_path):
    """A report written where the runs' folders are not (a fresh machine, a deleted ``runs/``) carries the earlier
    report's runs over, says so, and lets a run trained here replace its carried row."""
    runs = sweep_bandit.plan(["lr"], [0])
    for run, end in zip(runs, (0.0, 0.5, 1.0, 0.9)):
        _fake_run(run.folder(tmp_path / "runs"), run.seed, end)
    md, js = tmp_path / "bandit.md", tmp_path / "bandit.json"
    quiet = Console(quiet=True)
    sweep_bandit.report(runs, tmp_path / "runs", md, js, quiet)
    before = md.read_text()
    sweep_bandit.report(runs, tmp_path / "elsewhere", md, js, quiet)
    after = md.read_text()
    assert after.startswith(before.rstrip("\n")) and "Carried from the previous report" in after
    assert len(json.loads(js.read_text())["carried"]) == 4 and len(json.loads(js.read_text())["runs"]) == 4
    _fake_run(runs[0].folder(tmp_path / "elsewhere"), runs[0].seed, 1.0)  # trained again here: this run wins
    sweep_bandit.report(runs, tmp_path / "elsewhere", md, js, quiet)
    data = json.loads(js.read_text())
    assert data["runs"][0]["val_end"] == 1.0 and runs[0].label + "/seed0" not in data["carried"]


def test_a_report_for_one_experiment_keeps_every_other_experiments_rows(tmp_path):
    """``run --only dtype`` / ``report --only dtype`` rewrite the whole table: the rows of ``lr`` (folders here) and of
    ``algo`` (listed by the earlier report only) stay, in experiment order, with the new experiment's rows after them."""
    root, md, js = tmp_path / "runs", tmp_path / "bandit.md", tmp_path / "bandit.json"
    for run in sweep_bandit.plan(["algo"], [0]):
        _fake_run(run.folder(tmp_path / "gone"), run.seed, 0.0)
    sweep_bandit.main(["report", "--only", "algo", "--seeds", "0", "--out", str(tmp_path / "gone"),
                       "--md", str(md), "--json", str(js)])
    for run in sweep_bandit.plan(["lr", "dtype"], [0]):
        _fake_run(run.folder(root), run.seed, 0.9)
    sweep_bandit.main(["report", "--only", "dtype", "--seeds", "0", "--out", str(root), "--md", str(md),
                       "--json", str(js)])
    labels = [r["label"] for r in json.loads(js.read_text())["runs"]]
    assert labels == ["starpo-s-lr5e-05", "starpo-s-lr2e-05", "starpo-s-lr1e-05", "starpo-s-lr5e-06", "ppo-lr5e-05",
                      "grpo-lr5e-05", "starpo-s-lr5e-06-bf16"]
    assert "| starpo-s-lr5e-06-bf16 | 1 | 0.03 | 0.90 ± 0.00 |" in md.read_text()


def _job(tmp_path: Path, name: str, code: str) -> Job:
    folder = tmp_path / name
    marker = folder / "done"
    return Job(name, folder, [[sys.executable, "-c", code.format(marker=str(marker))]], done=marker.is_file)


def test_the_queue_runs_what_is_unfinished_and_counts_failures(tmp_path):
    ok = _job(tmp_path, "ok", "open({marker!r}, 'w').write('1')")
    bad = _job(tmp_path, "bad", "raise SystemExit(3)")
    console = Console(quiet=True)
    assert run_jobs([ok, bad], 2, console) == 1
    assert ok.done() and not bad.done() and (tmp_path / "bad" / "train.log").is_file()
    again = _job(tmp_path, "ok", "raise SystemExit('must not run: already done')")
    assert run_jobs([again], 1, console) == 0  # finished runs are not trained again


def test_a_job_runs_its_commands_in_order_and_stops_at_a_failure(tmp_path):
    folder = tmp_path / "two"
    log = folder / "order"
    first = [sys.executable, "-c", f"open({str(log)!r}, 'a').write('warm-up ')"]
    fail = [sys.executable, "-c", "raise SystemExit(1)"]
    train = [sys.executable, "-c", f"open({str(log)!r}, 'a').write('train')"]
    console = Console(quiet=True)
    assert run_jobs([Job("two", folder, [first, train], done=partial(log.is_file))], 1, console) == 0
    assert log.read_text() == "warm-up train"
    log.unlink()
    assert run_jobs([Job("two", folder, [fail, train], done=lambda: False)], 1, console) == 1
    assert not log.exists()


def test_multiturn_intervals():
    lo, hi = learn_multiturn.wilson(0, 128)
    assert lo == 0.0 and 0.02 < hi < 0.04
    lo, hi = learn_multiturn.wilson(64, 128)
    assert lo == pytest.approx(1 - hi) and 0.41 < lo < 0.42
    lo, hi = learn_multiturn.gain_interval(0.1, 0.3, 128)
    assert lo > 0 and hi < 0.35  # a gain of 0.2 on 128 states each is above 0
    jobs = learn_multiturn.jobs(Path("r"), ["sokoban"], [0])
    train = jobs[0].commands[1]
    assert train[train.index("--val_envs") + 1] == "[ragen/SokobanLarge-v0, ragen/SokobanNewVocab-v0, ragen/FrozenLake-v0]"


def test_multiturn_variants_train_into_folders_of_their_own(tmp_path):
    base, keep1 = (learn_multiturn.jobs(tmp_path, ["frozenlake"], [1], v)[0] for v in ("base", "keep1"))
    assert base.folder == tmp_path / "frozenlake" / "seed1" and keep1.folder == tmp_path / "frozenlake-keep1" / "seed1"
    assert "--filter_ratio" not in base.commands[1]
    train = keep1.commands[1]
    assert train[train.index("--filter_ratio") + 1] == "1.0"
    assert base.commands[0] == keep1.commands[0]  # one warm-up per env and seed, shared
    table = learn_multiturn.report(tmp_path, ["frozenlake"], [1], tmp_path / "r.md", ("base", "keep1"))
    assert "| frozenlake | keep1 | 1 | - | 0 | - | not run |" in table


def test_grpo_replies_differs_from_grpo_only_in_the_loss_mask(tmp_path):
    grpo, replies = (learn_multiturn.jobs(tmp_path, ["frozenlake"], [0], v)[0] for v in ("grpo", "grpo-replies"))
    assert replies.folder == tmp_path / "frozenlake-grpo-replies" / "seed0"
    assert replies.commands[0] == grpo.commands[0]  # the same base warm-up
    train = replies.commands[1]
    assert train[train.index("--loss_mask") + 1] == "replies" and "--loss_mask" not in grpo.commands[1]
    drop = train.index("--loss_mask")
    assert [a for a in train[:drop] + train[drop + 2:] if "grpo-replies" not in a] == [
        a for a in grpo.commands[1] if "frozenlake-grpo" not in a]


def test_an_interrupted_multiturn_run_reports_its_last_validation(tmp_path):
    folder = tmp_path / "frozenlake-keep1" / "seed0"
    folder.mkdir(parents=True)
    rows = [{"step": 1, "val/success": 0.2}, {"step": 11, "val/success": 0.25}, {"step": 12}]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (folder / "summary.json").write_text(json.dumps({"steps": 12, "interrupted": True, "final_validation": {}}))
    assert learn_multiturn.validations(folder) == {0: {"val/success": 0.2}, 10: {"val/success": 0.25}}
    table = learn_multiturn.report(tmp_path, ["frozenlake"], [0], tmp_path / "r.md", ("keep1",))
    assert "| frozenlake | keep1 | 0 | frozenlake | 10 |" in table
    (folder / "summary.json").unlink()  # a run still training has no summary yet
    table = learn_multiturn.report(tmp_path, ["frozenlake"], [0], tmp_path / "r.md", ("keep1",))
    assert "| frozenlake | keep1 | 0 | frozenlake | 10 | unfinished | 0.200" in table


def test_the_mixed_variant_warms_up_on_the_mixed_agent_into_its_own_folder(tmp_path):
    base, mixed = (learn_multiturn.jobs(tmp_path, ["frozenlake"], [2], v)[0] for v in ("base", "mixed"))
    warm = mixed.commands[0]
    assert warm[warm.index("--agent") + 1] == "mixed" and warm[warm.index("--oracle-share") + 1] == "0.5"
    assert warm[warm.index("--out") + 1] == str(tmp_path / "warmup" / "frozenlake-mixed-seed2")
    train = mixed.commands[1]
    assert train[train.index("--model") + 1] == str(tmp_path / "warmup" / "frozenlake-mixed-seed2")
    assert mixed.folder == tmp_path / "frozenlake-mixed" / "seed2"
    state = learn_multiturn.jobs(tmp_path, ["frozenlake"], [2], "mixed-state")[0]
    warm, check, train = state.commands  # the warm-up is checked before RL
    assert check[1].endswith("oracle_logprob.py") and check[2] == str(tmp_path / "warmup" / "frozenlake-mixed-state-seed2")
    assert check[check.index("--own-thinking") + 1] == "96" and "--resume" in check and "--env-kwargs" not in check
    assert len(mixed.commands) == 2  # a fixed-thought warm-up has no state thought to check
    assert warm[warm.index("--think") + 1] == "state" and warm[warm.index("--episodes") + 1] == "128"
    assert warm[warm.index("--out") + 1] == str(tmp_path / "warmup" / "frozenlake-mixed-state-seed2")
    assert train[train.index("--max_new_tokens") + 1] == "96"  # the state thinking's longest reply is 65 tokens
    assert "--think" not in mixed.commands[0]
    assert "--agent" not in base.commands[0]  # the base warm-up is the random agent's, as before


def test_finished_seeds_are_pooled_and_unfinished_ones_are_not(tmp_path):
    for seed, (start, end, steps) in enumerate([(0.2, 0.3, 40), (0.1, 0.3, 40), (0.2, 0.2, 20)]):
        folder = tmp_path / "frozenlake" / f"seed{seed}"
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "val/success": start}) + "\n")
        (folder / "summary.json").write_text(json.dumps({"steps": steps, "wall_seconds": 60,
                                                         "final_validation": {"val/success": end}}))
    table = learn_multiturn.report(tmp_path, ["frozenlake"], [0, 1], tmp_path / "r.md")
    pooled = next(line for line in table.splitlines() if "pooled" in line)
    assert pooled.startswith("| frozenlake | base | pooled (2 seeds) | frozenlake | 40 | - | 0.150 ")
    assert "| 0.300 " in pooled and "+0.150 (+0.08 to +0.22)" in pooled  # 256 states at each end
    table = learn_multiturn.report(tmp_path, ["frozenlake"], [0, 1, 2], tmp_path / "r.md")
    assert "pooled" not in table  # seed 2 stopped at step 20: no pooled row until every seed finished


def test_a_multiturn_report_keeps_the_runs_it_listed_whose_folders_are_gone(tmp_path):
    for seed, (start, end) in enumerate([(0.2, 0.3), (0.1, 0.3)]):
        folder = tmp_path / "runs" / "frozenlake" / f"seed{seed}"
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "val/success": start}) + "\n")
        (folder / "summary.json").write_text(json.dumps({"steps": 40, "wall_seconds": 60,
                                                         "final_validation": {"val/success": end}}))
    md = tmp_path / "r.md"
    before = learn_multiturn.report(tmp_path / "runs", ["frozenlake"], [0, 1], md)
    after = learn_multiturn.report(tmp_path / "elsewhere", ["frozenlake"], [0, 1], md)
    assert after.startswith(before.rstrip("\n"))  # every row and the pooled one, from the earlier table
    assert after.count("pooled (2 seeds)") == 1 and "+0.150 (+0.08 to +0.22)" in after
    assert "Carried from the previous report" in after and "frozenlake-base/seed1" in after
    folder = tmp_path / "elsewhere" / "frozenlake" / "seed1"  # seed 1 trained again here: its new rows win
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "val/success": 0.5}) + "\n")
    table = learn_multiturn.report(tmp_path / "elsewhere", ["frozenlake"], [0, 1, 2], md)
    assert "| frozenlake | base | 1 | frozenlake | 0 | unfinished | 0.500" in table
    assert "| frozenlake | base | 2 | - | 0 | - | not run |" in table
    assert "frozenlake-base/seed0." in table and "base/seed1" not in table.split("Carried")[1]


def test_a_queue_for_one_env_and_seed_reports_every_run(tmp_path):
    """The report a queue writes when it ends lists the whole search, not only the queue's own env and seeds (a
    `run --envs frozenlake --seeds 1` used to rewrite the page with seed 1's FrozenLake rows alone)."""
    folder = tmp_path / "runs" / "sokoban" / "seed0"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "val/success": 0.125}) + "\n")
    md = tmp_path / "r.md"
    assert learn_multiturn.main(["report", "--out", str(tmp_path / "runs"), "--envs", "frozenlake", "--seeds", "1",
                                 "--md", str(md), "--records", str(tmp_path / "records")]) == 0
    table = md.read_text()
    assert "| sokoban | base | 0 | sokoban | 0 | unfinished | 0.125" in table
    assert "| frozenlake | base | 2 | - | 0 | - | not run |" in table and "| frozenlake | grpo-replies | 0 |" in table


def test_a_multiturn_runs_record_is_kept_in_the_repository_and_read_where_its_folder_is_gone(tmp_path):
    folder = tmp_path / "runs" / "frozenlake-grpo" / "seed0"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "val/success": 0.2}) + "\n")
    (folder / "summary.json").write_text(json.dumps({"steps": 40, "wall_seconds": 600,
                                                     "final_validation": {"val/success": 0.25}}))
    (folder / "checkpoint-40").mkdir()  # weights stay on the machine
    records = tmp_path / "docs" / "runs"
    kept = learn_multiturn.keep_records(tmp_path / "runs", records, ["frozenlake"], [0, 1], ("base", "grpo"))
    assert kept == [records / "frozenlake-grpo" / "seed0"]
    assert sorted(p.name for p in kept[0].iterdir()) == ["metrics.jsonl", "summary.json"]
    here = learn_multiturn.report(tmp_path / "runs", ["frozenlake"], [0], tmp_path / "a.md", ("grpo",))
    elsewhere = learn_multiturn.report(tmp_path / "gone", ["frozenlake"], [0], tmp_path / "b.md", ("grpo",), records)
    assert here == elsewhere and "| frozenlake | grpo | 0 | frozenlake | 40 | 10 | 0.200" in here
    assert "not run" in learn_multiturn.report(tmp_path / "gone", ["frozenlake"], [0], tmp_path / "c.md", ("grpo",))


def test_the_echo_trap_variants_change_only_the_preset(tmp_path):
    """``ppo`` / ``grpo``: the vanilla presets from the base warm-up at the same settings; only ``--config`` differs."""
    base, ppo, grpo = (learn_multiturn.jobs(tmp_path, ["frozenlake"], [0], v)[0] for v in ("base", "ppo", "grpo"))
    for job, preset in ((base, "starpo-s"), (ppo, "ppo"), (grpo, "grpo")):
        train = job.commands[1]
        assert train[train.index("--config") + 1] == preset and "config" not in " ".join(train[3:])
        assert job.commands[0] == base.commands[0]
        rest = [a for i, a in enumerate(train) if i not in (train.index("--config") + 1, train.index("--output_dir") + 1)]
        assert rest == [a for i, a in enumerate(base.commands[1])
                        if i not in (base.commands[1].index("--config") + 1, base.commands[1].index("--output_dir") + 1)]


def test_the_perceive_state_variant_perceives_then_warms_up_and_trains_on_the_spaced_grid(tmp_path):
    job = learn_multiturn.jobs(tmp_path, ["frozenlake"], [1], "perceive-state")[0]
    perceive, warm, check, train = job.commands
    seen = str(tmp_path / "warmup" / "frozenlake-perceive-state-seed1-perception")
    assert perceive[1].endswith("grid_perception.py") and perceive[perceive.index("--save") + 1] == seen
    assert "--resume" in perceive and perceive[perceive.index("--task") + 1] == "state"
    assert perceive[perceive.index("--renderings") + 1] == "spaced" and perceive[perceive.index("--seed") + 1] == "1"
    assert warm[warm.index("--model") + 1] == seen and warm[warm.index("--think") + 1] == "state"
    assert warm[warm.index("--env-kwargs") + 1] == train[train.index("--env_kwargs") + 1] == '{cell_separator: " "}'
    assert train[train.index("--model") + 1] == str(tmp_path / "warmup" / "frozenlake-perceive-state-seed1")
    assert check[check.index("--env-kwargs") + 1] == '{cell_separator: " "}'  # checked on the grid it trained on
    assert job.folder == tmp_path / "frozenlake-perceive-state" / "seed1"
    assert "--env_kwargs" not in learn_multiturn.jobs(tmp_path, ["frozenlake"], [1], "mixed-state")[0].commands[2]
    with pytest.raises(ValueError, match="FrozenLake only"):
        learn_multiturn.jobs(tmp_path, ["sokoban"], [1], "perceive-state")
    table = learn_multiturn.report(tmp_path, ["frozenlake", "sokoban"], [1], tmp_path / "r.md", ("perceive-state",))
    assert "| frozenlake | perceive-state | 1 |" in table and "| sokoban | perceive-state" not in table


def test_perceive_state_keep1_trains_from_the_perceive_state_warm_up_without_the_filter(tmp_path):
    """Only the RL differs: the same perception stage, warm-up and check (same commands, same folders), then the same
    training command with ``--filter_ratio 1.0``, into a folder of its own."""
    shared = learn_multiturn.jobs(tmp_path, ["frozenlake"], [0], "perceive-state")[0]
    job = learn_multiturn.jobs(tmp_path, ["frozenlake"], [0], "perceive-state-keep1")[0]
    assert job.commands[:3] == shared.commands[:3]
    train, base_train = job.commands[3], shared.commands[3]
    assert train[train.index("--filter_ratio") + 1] == "1.0" and "--filter_ratio" not in base_train
    out = train.index("--output_dir") + 1
    assert train[out] == str(tmp_path / "frozenlake-perceive-state-keep1" / "seed0")
    flag = train.index("--filter_ratio")
    rest = [a for i, a in enumerate(train) if i not in (out, flag, flag + 1)]
    assert rest == [a for i, a in enumerate(base_train) if i != out]
    with pytest.raises(ValueError, match="FrozenLake only"):
        learn_multiturn.jobs(tmp_path, ["sokoban"], [0], "perceive-state-keep1")


def test_still_ice_is_the_base_run_on_frozenlake_without_slipping_from_the_base_warm_up(tmp_path):
    """The diagnostic differs from ``base`` by the env's ``is_slippery: false`` alone (training and validation, which
    use the run's env arguments), trains from the very same warm-up, and is FrozenLake's only."""
    base = learn_multiturn.jobs(tmp_path, ["frozenlake"], [2])[0]
    job = learn_multiturn.jobs(tmp_path, ["frozenlake"], [2], "still-ice")[0]
    assert job.commands[0] == base.commands[0] and len(job.commands) == len(base.commands) == 2
    train, base_train = job.commands[1], base.commands[1]
    out, kwargs = train.index("--output_dir") + 1, train.index("--env_kwargs")
    assert train[out] == str(tmp_path / "frozenlake-still-ice" / "seed2")
    assert train[kwargs + 1] == "{is_slippery: false}" and "--env_kwargs" not in base_train
    rest = [a for i, a in enumerate(train) if i not in (out, kwargs, kwargs + 1)]
    assert rest == [a for i, a in enumerate(base_train) if i != base_train.index("--output_dir") + 1]
    with pytest.raises(ValueError, match="FrozenLake only"):
        learn_multiturn.jobs(tmp_path, ["sokoban"], [2], "still-ice")


def test_a_resumed_runs_minutes_say_they_time_its_last_segment_only(tmp_path):
    folder = tmp_path / "frozenlake-perceive-state" / "seed0"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "val/success": 0.2}) + "\n")
    summary = {"steps": 40, "interrupted": False, "wall_seconds": 2640, "final_validation": {"val/success": 0.25}}
    (folder / "summary.json").write_text(json.dumps(summary))
    assert learn_multiturn.run_minutes(folder) == "44"
    (folder / "summary.json").write_text(json.dumps({**summary, "resumed_from": str(folder / "checkpoint-26")}))
    assert learn_multiturn.run_minutes(folder) == "44 since checkpoint-26"
    table = learn_multiturn.report(tmp_path, ["frozenlake"], [0], tmp_path / "r.md", ("perceive-state",))
    assert "| frozenlake | perceive-state | 0 | frozenlake | 40 | 44 since checkpoint-26 | 0.200" in table
    (folder / "summary.json").write_text("{not json")
    assert learn_multiturn.run_minutes(folder) == "unfinished"


def test_a_resumed_runs_minutes_add_up_its_segments_when_its_summary_lists_them_all(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    segments = [{"resumed_from": None, "steps": 26, "wall_seconds": 3000, "interrupted": True},
                {"resumed_from": "checkpoint-26", "steps": 40, "wall_seconds": 2640, "interrupted": False}]
    summary = {"steps": 40, "wall_seconds": 2640, "resumed_from": str(folder / "checkpoint-26"), "segments": segments,
               "total_wall_seconds": 5640}
    (folder / "summary.json").write_text(json.dumps(summary))
    assert learn_multiturn.run_minutes(folder) == "94 in 2 segments"
    (folder / "summary.json").write_text(json.dumps({**summary, "segments": segments[:1], "total_wall_seconds": 3000,
                                                     "resumed_from": None}))
    assert learn_multiturn.run_minutes(folder) == "50"
    # The first segment unknown (its summary was never written): the last segment's minutes, said so.
    (folder / "summary.json").write_text(json.dumps({**summary, "segments": segments[1:]}))
    assert learn_multiturn.run_minutes(folder) == "44 since checkpoint-26"
