"""Whole ``ragen-trainer train`` runs against a faulty world (the tiny model of tests/trainer/conftest.py, CPU):

* the disk fills up while a checkpoint is written: the command says so (the disk, what is free, what was kept),
  exits 1 with no traceback, leaves no half-written folder, and the previous checkpoint resumes;
* the same during the final save of a run without periodic checkpoints (``save_steps 0``);
* ``--resume`` with a model the checkpoint does not fit: refused (exit 2) before the run's ``config.yaml`` is touched,
  so the run still resumes with its own model;
* a finished run run again: nothing is trained or rewritten (``final/``, ``summary.json`` with its validation history);
* Ctrl-C before the first step finished: no claim that a checkpoint was saved.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer import cli
from ragen_trainer.checkpoints.verify import checkpoint_problems
from ragen_trainer.trainer import StarPOTrainer
from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer


def _args(model_dir, out, *extra):
    return ["train", "--config", "starpo-s", "--env", "ragen/Bandit-v0", "--model", str(model_dir),
            "--output_dir", str(out), "--env_groups", "2", "--group_size", "2", "--max_new_tokens", "4",
            "--max_context_tokens", "1024", "--max_turns", "1", "--report_to", "jsonl", "--val_every", "1",
            "--val_groups", "2", *extra]  # fmt: skip


def _full_disk(error):
    """A replacement for ``StarPOTrainer._save_training_state`` that fails as a full disk does at step 2."""
    original = StarPOTrainer._save_training_state

    def save(self, folder):
        if self.global_step == 2:
            raise error
        return original(self, folder)

    return save


@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, "No space left on device"),
    # what torch.save raises when its writer hits a full disk: no errno, no word about the disk
    RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 1856 vs 1748 basic_ios::clear: "
                 "iostream error"),
], ids=["enospc", "torch-writer"])
def test_a_full_disk_during_a_checkpoint_says_so_and_keeps_the_previous_one(tmp_path, tiny_model_dir, monkeypatch,
                                                                            capsys, error):
    out = tmp_path / "run"
    monkeypatch.setattr(StarPOTrainer, "_save_training_state", _full_disk(error))
    rc = cli.main(_args(tiny_model_dir, out, "--total_steps", "3", "--save_steps", "1"))
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "no space left on the disk" in err and "checkpoint-2" in err and "MB free" in err, err
    assert "checkpoint-1 is kept" in err and "Traceback" not in err
    assert checkpoint_problems(out / "checkpoint-1") == []
    assert not (out / "checkpoint-2").exists() and not list(out.glob(".saving-*"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and "no space left" in summary["save_error"]

    monkeypatch.undo()  # space was freed: the same command continues from checkpoint-1
    assert cli.main(_args(tiny_model_dir, out, "--total_steps", "3", "--save_steps", "1")) == 0
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["resumed_from"] == str(out / "checkpoint-1")
    assert (out / "final" / "model.safetensors").is_file()
    # Both segments are on record: the one the full disk stopped at step 2, and the one that finished from step 1.
    first, second = resumed["segments"]
    assert first["resumed_from"] is None and first["steps"] == 2 and first["interrupted"] is False
    assert second["resumed_from"] == str(out / "checkpoint-1") and second["steps"] == 3
    assert resumed["total_wall_seconds"] == pytest.approx(first["wall_seconds"] + second["wall_seconds"], abs=0.02)


def test_a_full_disk_during_the_final_save_says_so(tmp_path, tiny_model_dir, monkeypatch, capsys):
    out = tmp_path / "run"
    original = StarPOTrainer.save_model

    def save_model(self, output_dir, *, kind="checkpoint"):
        if kind == "final":
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, output_dir, kind=kind)

    monkeypatch.setattr(StarPOTrainer, "save_model", save_model)
    rc = cli.main(_args(tiny_model_dir, out, "--total_steps", "2", "--save_steps", "0"))
    err = capsys.readouterr().err
    assert rc == 1 and "no space left on the disk" in err and "the final model" in err, err
    assert "no earlier checkpoint exists" in err and "Traceback" not in err
    assert not (out / "final").exists() and not list(out.glob(".saving-*"))
    assert json.loads((out / "summary.json").read_text())["save_error"]


def test_resume_with_a_model_that_does_not_fit_leaves_the_run_as_it_was(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "run"
    assert cli.main(_args(tiny_model_dir, out, "--total_steps", "1", "--save_steps", "1")) == 0
    record = (out / "config.yaml").read_bytes()
    other = tmp_path / "other-model"
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer, hidden_size=48).save_pretrained(other)
    tokenizer.save_pretrained(other)
    capsys.readouterr()
    rc = cli.main(_args(other, out, "--total_steps", "2", "--save_steps", "1", "--resume"))
    err = capsys.readouterr().err
    assert rc == 2 and "do not fit the model" in err and "Traceback" not in err, err
    assert (out / "config.yaml").read_bytes() == record  # the run's record was not rewritten
    assert cli.main(_args(tiny_model_dir, out, "--total_steps", "2", "--save_steps", "1")) == 0  # still resumes
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


def test_running_a_finished_run_again_changes_nothing(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "run"
    assert cli.main(_args(tiny_model_dir, out, "--total_steps", "2", "--save_steps", "1")) == 0
    summary = (out / "summary.json").read_bytes()
    assert [v["step"] for v in json.loads(summary)["validation"]] == [0, 1, 2]  # before each step, and at the end
    weights = out / "final" / "model.safetensors"
    stamp = os.stat(weights).st_mtime_ns
    capsys.readouterr()
    assert cli.main(_args(tiny_model_dir, out, "--total_steps", "2", "--save_steps", "1")) == 0
    err = capsys.readouterr().err
    assert "already finished its 2 steps" in err and "--total_steps" in err, err
    assert len(err) < 2000 and "missing" not in err.lower()
    assert (out / "summary.json").read_bytes() == summary and os.stat(weights).st_mtime_ns == stamp
    # Asked for more steps, it continues, and the validation history of the first run is kept.
    assert cli.main(_args(tiny_model_dir, out, "--total_steps", "3", "--save_steps", "1")) == 0
    assert [v["step"] for v in json.loads((out / "summary.json").read_text())["validation"]] == [0, 1, 2, 3]


def test_ctrl_c_before_the_first_step_claims_no_checkpoint(tmp_path, tiny_model_dir, monkeypatch, capsys):
    def interrupted(self, step):
        raise KeyboardInterrupt

    monkeypatch.setattr(StarPOTrainer, "rollout", interrupted)
    rc = cli.main(_args(tiny_model_dir, tmp_path / "run", "--total_steps", "2", "--val_every", "0"))
    err = capsys.readouterr().err
    assert rc == 130
    assert "before the first step finished: nothing to save" in err and "checkpoint saved" not in err, err
    assert not list((tmp_path / "run").glob("checkpoint-*"))
