"""``benchmarks/reproduce.py`` answers for its own run and keeps what it has.

* A run's identity is its whole resolved configuration (model, seed, engine, preset, changes, scale, the warm-up's
  settings): another one trains in its own folder, the results record it, and a folder of another run is refused
  with both named.
* ``splits.json`` is keyed by the run and its final model: a retrained model is evaluated again, a torn cache too.
* Ctrl-C, then the same command, resumes from the checkpoint (the real trainer on the tiny model); the trainer's
  subprocess at the paper's scale is let finish its save; an interrupted run exits 130 with "run the same command
  again to resume", a failed one 1.
* Damaged records say which file and what is done: a finished run's missing, empty or corrupt ``metrics.jsonl`` stops
  the experiment (exit 3) with its JSON and PNG untouched; a torn or odd ``summary.json`` trains the run again without
  deleting its ``final/`` first.

Training is replaced by a fake that writes what the trainer writes, except in the Ctrl-C test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer.trainer import StarPOTrainer
from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "reproduce.py"
EXPERIMENT = "table4-generalization"
RUN = "bandit/generalization"  # a run with a generalisation split


@pytest.fixture(scope="module")
def reproduce() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reproduce_script_runs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class FakeTrainer:
    """Stands in for ``train_from_config``: writes the files the trainer writes for a finished run (metrics of every
    step, summary, ``final/`` holding a version number) and remembers what it was called with."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.status = 0

    def __call__(self, cfg: Any, **kwargs: Any) -> int:
        folder = Path(cfg.output_dir)
        self.calls.append({"seed": cfg.seed, "folder": folder, "final_existed": (folder / "final").exists(),
                           "splits_existed": (folder / "splits.json").exists()})  # fmt: skip
        if self.status:
            return self.status
        folder.mkdir(parents=True, exist_ok=True)
        rows = [{"step": s, "time": 10.0 * s, "val/success": 0.5, "reward/mean": 0.1 * s + cfg.seed,
                 "reward/in_group_std": 0.2, "response/thinking_length": 5.0, "response/length": 9.0}
                for s in range(1, cfg.total_steps + 1)]  # fmt: skip
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "final").mkdir(exist_ok=True)
        (folder / "final" / "model.safetensors").write_text(f"v{len(self.calls)}")
        summary = {"steps": cfg.total_steps, "total_steps": cfg.total_steps, "interrupted": False,
                   "final_validation": {"val/success": 0.75}, "model": cfg.model}  # fmt: skip
        (folder / "summary.json").write_text(json.dumps(summary))
        return 0


@pytest.fixture
def fake(reproduce, monkeypatch) -> FakeTrainer:
    """The fake trainer, no warm-up, and split evaluation whose success is the final model's version: v1 fails every
    state, later versions solve every one."""
    trainer = FakeTrainer()
    monkeypatch.setattr(reproduce, "train_from_config", trainer)
    monkeypatch.setattr(reproduce, "warm_model", lambda cfg, runs_dir: "warm-model")
    monkeypatch.setattr(reproduce, "load_model_and_tokenizer", lambda path, **kw: (Path(path), None))
    monkeypatch.setattr(reproduce, "HFEngine", lambda model, tokenizer, **kw: model)

    def rollouts(engine, tokenizer, env_id, seeds, n, **kw):
        solved = (engine / "model.safetensors").read_text() != "v1"
        return SimpleNamespace(trajectories=[SimpleNamespace(success=solved) for _ in seeds])

    monkeypatch.setattr(reproduce, "collect_rollouts", rollouts)
    return trainer


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    return [EXPERIMENT, "--scale", "cpu", "--only", RUN, "--runs", str(tmp_path / "runs"), "--out",
            str(tmp_path / "out"), *extra]  # fmt: skip


def _folder(reproduce, tmp_path: Path, **options: Any) -> Path:
    run = next(r for r in reproduce.EXPERIMENTS[EXPERIMENT].runs() if r.key == RUN)
    return Path(reproduce.run_config(run, "cpu", tmp_path / "runs", **options).output_dir)


# ------------------------------------------------------------------------------------------------- identity
def test_another_model_seed_or_engine_is_another_run_in_its_own_folder(reproduce, tmp_path):
    run = next(r for r in reproduce.EXPERIMENTS["fig9-starpo-s"].runs() if r.key == "bandit/starpo-s")
    for scale in ("cpu", "paper"):
        base = reproduce.run_config(run, scale, tmp_path)
        others = [reproduce.run_config(run, scale, tmp_path, seed=1),
                  reproduce.run_config(run, scale, tmp_path, model="some/other-model"),
                  reproduce.run_config(run, scale, tmp_path, engine="hf-generate")]  # fmt: skip
        folders = {base.output_dir} | {c.output_dir for c in others}
        assert len(folders) == 4, folders
        assert reproduce.run_config(run, scale, tmp_path).output_dir == base.output_dir  # the same run: the same
        # where a vLLM server listens places the run, it does not change what it trains
        assert "engine_url" in reproduce.PLACEMENT_FIELDS
    cpu = reproduce.run_config(run, "cpu", tmp_path)
    warmups = {reproduce.settings_key(reproduce.warmup_plan(c)[0]) for c in
               (cpu, reproduce.run_config(run, "cpu", tmp_path, seed=1),
                reproduce.run_config(run, "cpu", tmp_path, model="some/other-model"))}  # fmt: skip
    assert len(warmups) == 3  # the warm-up cache is keyed by the model and the seed too


def test_the_same_command_with_another_seed_trains_its_own_run_and_records_it(reproduce, fake, tmp_path, capsys):
    assert reproduce.main(_argv(tmp_path)) == 0
    assert len(fake.calls) == 1
    seed0 = tmp_path / "out" / f"{EXPERIMENT}-cpu.json"
    saved = seed0.read_bytes()
    result = json.loads(saved)
    identity = result["identity"][RUN]
    assert identity["config"]["seed"] == 0 and identity["config"]["model"] == "smollm2"
    assert identity["warmup"]["seed"] == 0 and identity["warmup"]["model"] == "smollm2"
    assert identity["folder"] == str(_folder(reproduce, tmp_path)) and result["options"]["seed"] == 0
    assert json.loads((_folder(reproduce, tmp_path) / "reproduce.json").read_text())["id"] == identity["id"]

    assert reproduce.main(_argv(tmp_path)) == 0  # the same command: read back
    assert len(fake.calls) == 1
    saved = seed0.read_bytes()  # (the read-back writes the results again, with its own timing)

    capsys.readouterr()
    assert reproduce.main(_argv(tmp_path, "--seed", "1")) == 0  # another seed: trained, in its own folder
    assert len(fake.calls) == 2 and fake.calls[1]["seed"] == 1
    assert fake.calls[1]["folder"] == _folder(reproduce, tmp_path, seed=1) != _folder(reproduce, tmp_path)
    assert "is another configuration of bandit/generalization (seed: 0 -> 1" in capsys.readouterr().err
    seed1 = json.loads((tmp_path / "out" / f"{EXPERIMENT}-cpu-seed1.json").read_text())
    assert seed1["identity"][RUN]["config"]["seed"] == 1 and seed1["runs"][RUN]["reward/mean"][0] == pytest.approx(1.1)
    assert seed0.read_bytes() == saved  # the seed-0 results are not overwritten


def test_a_folder_holding_another_run_is_refused_with_both_named(reproduce, fake, tmp_path, capsys):
    folder = _folder(reproduce, tmp_path)
    folder.mkdir(parents=True)
    # the seed-7 run's folder copied by hand under the seed-0 run's name
    (_folder(reproduce, tmp_path, seed=7)).mkdir(parents=True)
    assert reproduce.main(_argv(tmp_path, "--seed", "7", "--dry-run")) == 0
    run = next(r for r in reproduce.EXPERIMENTS[EXPERIMENT].runs() if r.key == RUN)
    identity = reproduce.run_identity(reproduce.run_config(run, "cpu", tmp_path / "runs", seed=7), "cpu")
    other = {"id": reproduce.identity_key(identity), "run": RUN, "identity": identity}
    (folder / "reproduce.json").write_text(json.dumps(other))
    capsys.readouterr()
    assert reproduce.main(_argv(tmp_path)) == reproduce.EXIT_REFUSED
    err = capsys.readouterr().err
    assert f"holds run {other['id']}" in err and folder.name.rsplit("-", 1)[1] in err, err
    assert "seed: 7 -> 0; warmup.seed: 7 -> 0" in err, err
    assert not fake.calls and "Traceback" not in err


def test_bad_options_are_usage_errors_before_anything_trains(reproduce, fake, tmp_path, capsys):
    for extra, named in ((["--seed", "-1"], "seed"), (["--model", str(tmp_path / "nowhere")], "--model")):
        with pytest.raises(SystemExit) as exit_info:
            reproduce.main(_argv(tmp_path, *extra))
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and named in err and "Traceback" not in err, err
    assert not fake.calls


# ------------------------------------------------------------------------------------------------- splits
def test_split_results_follow_the_model_they_scored(reproduce, fake, tmp_path, capsys):
    out = tmp_path / "out" / f"{EXPERIMENT}-cpu.json"
    folder = _folder(reproduce, tmp_path)
    assert reproduce.main(_argv(tmp_path)) == 0
    assert json.loads(out.read_text())["runs"][RUN]["splits"] == {"bandit-rev-test": 0.0}  # model v1
    cache = json.loads((folder / "splits.json").read_text())
    assert cache["run"] == folder.name and cache["success"] == {"bandit-rev-test": 0.0}

    # final/ rewritten by hand (ragen-trainer train --overwrite on the folder): the old score is not reported
    (folder / "final" / "model.safetensors").write_text("v-by-hand")
    capsys.readouterr()
    assert reproduce.main(_argv(tmp_path)) == 0
    assert "scored another model" in capsys.readouterr().err
    assert json.loads(out.read_text())["runs"][RUN]["splits"] == {"bandit-rev-test": 1.0}

    # torn: named, evaluated again
    (folder / "splits.json").write_text('{"run": "x", "succ')
    assert reproduce.main(_argv(tmp_path)) == 0
    err = capsys.readouterr().err
    assert f"{folder / 'splits.json'} is damaged" in err and "evaluated again" in err and "Traceback" not in err

    # the run trains again (its summary went): the cache is dropped before the training replaces the model
    (folder / "summary.json").unlink()
    assert reproduce.main(_argv(tmp_path)) == 0
    assert f"dropping {folder / 'splits.json'}" in capsys.readouterr().err
    assert fake.calls[-1]["splits_existed"] is False and len(fake.calls) == 2
    assert json.loads(out.read_text())["runs"][RUN]["splits"] == {"bandit-rev-test": 1.0}  # model v2


# ------------------------------------------------------------------------------------------------- interrupted
def test_ctrl_c_then_the_same_command_resumes_from_the_checkpoint(reproduce, tmp_path, tiny_model_dir, monkeypatch,
                                                                 capsys):
    """The real trainer on the tiny model: Ctrl-C during step 2 saves checkpoint-1; reproduce.py exits 130 with the
    trainer's advice; the same command continues from checkpoint-1 (before: it deleted the checkpoint and started
    over, and said "failed")."""
    monkeypatch.setitem(reproduce.CPU_SCALE, "common", {
        "model": "smollm2", "total_steps": 3, "env_groups": 2, "group_size": 2, "actor_lr": 5e-5, "critic_lr": 5e-4,
        "ppo_mini_batch_size": 2, "micro_batch_size": 2, "val_every": 0, "val_groups": 2, "save_steps": 0,
        "max_new_tokens": 4, "max_context_tokens": 1024})  # fmt: skip
    monkeypatch.setattr(reproduce, "warm_model", lambda cfg, runs_dir: str(tiny_model_dir))
    train_step = StarPOTrainer.train_step

    def interrupted_at_step_2(self, step):
        if step == 1:
            raise KeyboardInterrupt
        return train_step(self, step)

    monkeypatch.setattr(StarPOTrainer, "train_step", interrupted_at_step_2)
    argv = ["fig9-starpo-s", "--scale", "cpu", "--only", "bandit/starpo-s", "--runs", str(tmp_path / "runs"), "--out",
            str(tmp_path / "out")]  # fmt: skip
    assert reproduce.main(argv) == 130
    err = capsys.readouterr().err
    assert "interrupted; run the same command again to resume" in err and "failed" not in err, err
    run = next(r for r in reproduce.EXPERIMENTS["fig9-starpo-s"].runs() if r.key == "bandit/starpo-s")
    folder = Path(reproduce.run_config(run, "cpu", tmp_path / "runs").output_dir)
    assert (folder / "checkpoint-1").is_dir() and not (tmp_path / "out").exists()

    monkeypatch.setattr(StarPOTrainer, "train_step", train_step)
    assert reproduce.main(argv) == 0
    err = capsys.readouterr().err
    assert "was interrupted at step 1: it resumes from its newest checkpoint" in err, err
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["resumed_from"] == str(folder / "checkpoint-1") and summary["steps"] == 3
    result = json.loads((tmp_path / "out" / "fig9-starpo-s-cpu.json").read_text())
    assert result["runs"]["bandit/starpo-s"]["step"] == [1, 2, 3]

    # a summary holding [] (the real trainer would stop on it): named, set aside, the run trained again from its
    # newest checkpoint
    (folder / "summary.json").write_text("[]")
    assert reproduce.main(argv) == 0
    err = capsys.readouterr().err
    assert f"{folder / 'summary.json'} is damaged" in err and "Traceback" not in err, err
    assert json.loads((folder / "summary.json").read_text())["steps"] == 3


def test_the_trainer_subprocess_finishes_its_save_on_ctrl_c(reproduce, tmp_path):
    """At the paper's scale the trainer is a subprocess: Ctrl-C reaches it once, through reproduce.py, which waits
    for it (``subprocess.call`` killed it in the middle of its checkpoint)."""
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent("""
        import pathlib, signal, sys, time
        out = pathlib.Path(sys.argv[1])
        signals = []
        def stop(signum, frame):
            signals.append(signum)
            if len(signals) == 1:
                time.sleep(0.5)  # saving a checkpoint
                (out / "saved").write_text(str(len(signals)))
                sys.exit(130)
        signal.signal(signal.SIGINT, stop)
        (out / "ready").write_text("1")
        time.sleep(60)
    """))

    def press_ctrl_c() -> None:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    threading.Thread(target=press_ctrl_c, daemon=True).start()
    status = reproduce.run_trainer([sys.executable, str(script), str(tmp_path)])
    assert status == 130 and (tmp_path / "saved").read_text() == "1"
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize("status", [130, 1, 2])
def test_an_interrupted_run_is_not_called_failed(reproduce, fake, tmp_path, capsys, status):
    fake.status = status
    assert reproduce.main(_argv(tmp_path)) == (130 if status == 130 else reproduce.EXIT_FAILED)
    err = capsys.readouterr().err
    if status == 130:
        assert "interrupted; run the same command again to resume" in err and "failed" not in err, err
    else:
        assert f"failed: run {RUN} failed with status {status}" in err, err


def test_ctrl_c_outside_the_trainer_says_how_to_resume(reproduce, fake, tmp_path, monkeypatch, capsys):
    def warm(cfg, runs_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(reproduce, "warm_model", warm)
    assert reproduce.main(_argv(tmp_path)) == 130
    err = capsys.readouterr().err
    assert "interrupted; run the same command again to resume" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------------- damaged records
DAMAGED_METRICS = {
    "missing": (None, "is missing"),
    "empty": ("", "is empty"),
    "corrupt": ("\x00\x7f garbage\n{not json\n" * 3, "lacks 6 of the run's 6 logged steps"),
    "cut-short": ('{"step": 1, "reward/mean": 0.1}\n{"step": 2, "rew', "lacks 5 of the run's 6 logged steps"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED_METRICS))
def test_damaged_metrics_stop_the_experiment_and_keep_its_json_and_png(reproduce, fake, tmp_path, capsys, damage):
    assert reproduce.main(_argv(tmp_path)) == 0
    json_path, png_path = tmp_path / "out" / f"{EXPERIMENT}-cpu.json", tmp_path / "out" / f"{EXPERIMENT}-cpu.png"
    saved = json_path.read_bytes(), png_path.read_bytes()
    metrics = _folder(reproduce, tmp_path) / "metrics.jsonl"
    text, message = DAMAGED_METRICS[damage]
    if text is None:
        metrics.unlink()
    else:
        metrics.write_text(text)
    capsys.readouterr()
    assert reproduce.main(_argv(tmp_path)) == reproduce.EXIT_REFUSED
    err = capsys.readouterr().err
    assert f"{metrics} {message}" in err or (f"{metrics} is damaged" in err and message in err), err
    assert "left as they are" in err and "Traceback" not in err
    assert (json_path.read_bytes(), png_path.read_bytes()) == saved
    assert len(fake.calls) == 1  # nothing trained meanwhile


@pytest.mark.parametrize("text", ['{"steps": 6, "interr', "[]", '"done"', ""], ids=["torn", "list", "string", "empty"])
def test_a_damaged_summary_trains_the_run_again_saying_why(reproduce, fake, tmp_path, capsys, text):
    assert reproduce.main(_argv(tmp_path)) == 0
    summary = _folder(reproduce, tmp_path) / "summary.json"
    summary.write_text(text)
    assert not reproduce.finished(summary.parent)
    capsys.readouterr()
    assert reproduce.main(_argv(tmp_path)) == 0
    err = capsys.readouterr().err
    assert f"{summary} is damaged" in err and "trains again" in err and "final/ is replaced" in err, err
    assert "Traceback" not in err
    assert len(fake.calls) == 2 and fake.calls[1]["final_existed"]  # final/ was not deleted before the training
    assert (summary.parent / "summary.json.damaged").read_text() == text  # kept aside, named in the note
    assert f"moved the damaged summary to {summary.parent / 'summary.json.damaged'}" in err


def test_results_with_a_run_without_steps_are_not_written(reproduce, tmp_path):
    experiment = reproduce.EXPERIMENTS[EXPERIMENT]
    json_path, png_path = tmp_path / "r.json", tmp_path / "r.png"
    json_path.write_text("good")
    results = {"runs": {RUN: reproduce.curves([], experiment.curves)}}
    with pytest.raises(reproduce.RecordRefused, match="no training steps"):
        reproduce.write_results(experiment, results, json_path, png_path, "t")
    assert json_path.read_text() == "good" and not png_path.exists()
