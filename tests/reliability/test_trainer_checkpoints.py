"""Checkpoints that survive faults, with the tiny random model of tests/trainer/conftest.py (never the real SmolLM2).

* A checkpoint with a truncated, missing or garbled file (weights, critic, config, marker JSON, optimizer, trainer
  state, RNG state) is skipped on resume with a warning naming it and what is wrong; the run continues from the
  newest checkpoint that verifies, and the broken one is kept as ``broken-checkpoint-N``.
* A save killed in the middle (SIGKILL in a subprocess) or raising midway never leaves a ``checkpoint-N`` behind;
  the next run removes the leftover and resumes from the checkpoint before.
* Two SIGINTs during a save (a subprocess running a tiny training run): the save finishes, the checkpoint verifies,
  the exit status is 130.
* ``metrics.jsonl`` holds each step once after any of these resumes, and a torn last line is dropped.
* A changed config in the output folder is refused (``RunConflictError``) unless ``force_resume`` or ``overwrite``.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from ragen_trainer.checkpoints.folders import RunConflictError
from ragen_trainer.checkpoints.verify import checkpoint_problems
from ragen_trainer.config import load_config
from ragen_trainer.monitor import MetricsLogger, read_metrics
from ragen_trainer.trainer import StarPOTrainer, TrainerCallback
from tests.trainer.conftest import ScriptedEngine, build_tiny_model, build_tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]


def small_config(output_dir, preset="starpo-s", **changes):
    base = {
        "env_groups": 2, "group_size": 2, "max_turns": 1, "max_new_tokens": 8, "max_context_tokens": 1024,
        "enable_think": False, "total_steps": 3, "save_steps": 1, "save_total_limit": 0, "val_every": 0,
        "micro_batch_size": 2,
        "generation_batch_size": 8, "actor_lr": 1e-3, "critic_lr": 1e-3, "report_to": ["jsonl"],
        "output_dir": str(output_dir),
        "reply_prefix": "", "bare_answers": True,  # the scripted engine writes bare answers
    }
    base.update(changes)
    return load_config(preset).replace(**base).validate()


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


class StartStep(TrainerCallback):
    """Records the training step training starts from (the resumed checkpoint's)."""

    def __init__(self):
        self.step = None

    def on_train_begin(self, trainer, step):
        self.step = step


def train(tokenizer, out, *, model_seed=0, callbacks=(), train_kwargs=None, **changes):
    """A run in ``out`` (``changes`` to :func:`small_config`); returns (result, step it started from, trainer)."""
    cfg = small_config(out, **changes)
    start = StartStep()
    trainer = StarPOTrainer(cfg, build_tiny_model(tokenizer, seed=model_seed), tokenizer,
                            engine=ScriptedEngine(tokenizer, ["Dragon"]), callbacks=[start, *callbacks])
    return trainer.train(**(train_kwargs or {})), start.step, trainer


def steps_of(out):
    return [int(r["step"]) for r in read_metrics(Path(out) / "metrics.jsonl")]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, tokenizer):
    """A finished 3-step StarPO-S run (critic included) with checkpoint-1, -2, -3; tests work on copies."""
    out = tmp_path_factory.mktemp("base") / "run"
    result, _, _ = train(tokenizer, out)
    assert result.global_step == 3 and steps_of(out) == [1, 2, 3]
    for step in (1, 2, 3):
        assert checkpoint_problems(out / f"checkpoint-{step}") == [], step
    return out


@pytest.fixture
def run_copy(base_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(base_run, out)
    return out


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


#: fault name -> (how to break a checkpoint folder, text the warning must contain)
FAULTS = {
    "truncated-weights": (lambda c: truncate(c / "model.safetensors"), "model.safetensors is truncated"),
    "weights-cut-to-a-few-bytes": (lambda c: truncate(c / "model.safetensors", 0.00001), "model.safetensors"),
    "garbled-weights-header": (
        lambda c: (c / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a json head}"),
        "model.safetensors"),
    "missing-weights": (lambda c: (c / "model.safetensors").unlink(), "model.safetensors is missing"),
    "truncated-critic": (lambda c: truncate(c / "critic.safetensors"), "critic.safetensors is truncated"),
    "missing-config": (lambda c: (c / "config.json").unlink(), "config.json"),
    "garbled-config": (lambda c: (c / "config.json").write_text("{\"model_type\": "), "config.json is not valid JSON"),
    "missing-marker": (lambda c: (c / "ragen_checkpoint.json").unlink(), "ragen_checkpoint.json is missing"),
    "garbled-marker": (lambda c: (c / "ragen_checkpoint.json").write_text("{\"step\": 3, "),
                       "ragen_checkpoint.json is not valid JSON"),
    "marker-not-an-object": (lambda c: (c / "ragen_checkpoint.json").write_text("[3]"),
                             "ragen_checkpoint.json is not a JSON object"),
    "truncated-optimizer": (lambda c: truncate(c / "optimizer.pt"), "optimizer.pt is truncated"),
    "missing-scheduler": (lambda c: (c / "scheduler.pt").unlink(), "scheduler.pt is missing"),
    "missing-trainer-state": (lambda c: (c / "trainer_state.json").unlink(), "trainer_state.json is missing"),
    "missing-rng-state": (lambda c: (c / "rng_state.json").unlink(), "rng_state.json is missing"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_broken_last_checkpoint_is_skipped_with_a_warning(run_copy, tokenizer, caplog, fault):
    out = run_copy
    breaker, reason = FAULTS[fault]
    breaker(out / "checkpoint-3")
    assert any(reason in p for p in checkpoint_problems(out / "checkpoint-3")), checkpoint_problems(
        out / "checkpoint-3")

    result, start, _ = train(tokenizer, out, model_seed=5, total_steps=4)

    assert start == 2 and result.resumed_from == str(out / "checkpoint-2")
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "checkpoint-3" in warning and reason in warning, warning
    assert (out / "broken-checkpoint-3").is_dir()  # kept for inspection, never loaded again
    assert list(result.skipped_checkpoints) == ["checkpoint-3"]
    assert result.global_step == 4 and not result.interrupted
    for step in (2, 3, 4):
        assert checkpoint_problems(out / f"checkpoint-{step}") == [], step
    assert steps_of(out) == [1, 2, 3, 4]  # step 3 is trained again and written once
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped_checkpoints"]["checkpoint-3"]


def test_two_broken_checkpoints_fall_back_two(run_copy, tokenizer, caplog):
    out = run_copy
    truncate(out / "checkpoint-3" / "model.safetensors")
    (out / "checkpoint-2" / "ragen_checkpoint.json").write_text("garbage")
    result, start, _ = train(tokenizer, out, model_seed=5, total_steps=3)
    assert start == 1 and result.resumed_from == str(out / "checkpoint-1")
    assert sorted(result.skipped_checkpoints) == ["checkpoint-2", "checkpoint-3"]
    assert "checkpoint-2" in caplog.text and "checkpoint-3" in caplog.text
    assert steps_of(out) == [1, 2, 3]


def test_no_whole_checkpoint_starts_from_the_initial_model(run_copy, tokenizer, caplog):
    out = run_copy
    for step in (1, 2, 3):
        (out / f"checkpoint-{step}" / "trainer_state.json").unlink()
    result, start, _ = train(tokenizer, out, total_steps=2)
    assert start == 0 and result.resumed_from is None
    assert "initial model" in caplog.text
    assert steps_of(out) == [1, 2]


def test_a_save_that_raises_midway_leaves_no_checkpoint(tmp_path, tokenizer, monkeypatch, caplog):
    out = tmp_path / "run"
    original = StarPOTrainer._save_training_state

    def failing(self, output_dir):
        if self.global_step == 2:
            raise OSError("the disk went away (simulated)")
        return original(self, output_dir)

    monkeypatch.setattr(StarPOTrainer, "_save_training_state", failing)
    with pytest.raises(OSError, match="simulated"):
        train(tokenizer, out)
    assert (out / "checkpoint-1").is_dir() and not (out / "checkpoint-2").exists()
    assert not list(out.glob(".saving-*"))  # the half-written save was removed
    assert steps_of(out) == [1, 2]  # step 2 was logged before its save failed

    monkeypatch.setattr(StarPOTrainer, "_save_training_state", original)
    result, start, _ = train(tokenizer, out, model_seed=5)
    assert start == 1 and result.global_step == 3
    assert steps_of(out) == [1, 2, 3]  # step 2's first row was dropped, its rerun written once


def test_a_torn_metrics_line_is_dropped_on_resume(run_copy, tokenizer):
    out = run_copy
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"step": 4, "reward/me')  # a crash in the middle of a line
    assert steps_of(out) == [1, 2, 3]  # readers skip the torn line
    _, start, _ = train(tokenizer, out, model_seed=5, total_steps=4)
    assert start == 3
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # no torn line left
    assert steps_of(out) == [1, 2, 3, 4]


def test_metrics_logger_starts_a_new_line_after_a_torn_one(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "x')
    with MetricsLogger(tmp_path, tensorboard=False, wandb=False, console=False) as log:
        log.log(3, {"reward/mean": 1.0})
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 3]


def test_an_explicitly_named_broken_checkpoint_is_refused(run_copy, tokenizer):
    out = run_copy
    truncate(out / "checkpoint-2" / "model.safetensors")
    cfg = small_config(out, total_steps=4)
    trainer = StarPOTrainer(cfg, build_tiny_model(tokenizer), tokenizer, engine=ScriptedEngine(tokenizer, ["Dragon"]))
    with pytest.raises(ValueError, match="model.safetensors is truncated"):
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-2"))


def test_the_final_model_verifies_as_a_model(base_run):
    assert checkpoint_problems(base_run / "final", training_state=False) == []
    assert checkpoint_problems(base_run / "final")  # but it holds no optimizer state to resume from


def test_a_changed_config_is_refused_unless_forced_or_overwritten(run_copy, tokenizer, caplog):
    out = run_copy
    with pytest.raises(RunConflictError) as info:
        train(tokenizer, out, total_steps=4, clip_high=0.25, max_turns=2)
    text = str(info.value)
    assert "clip_high: 0.28 -> 0.25" in text and "protocol.max_turns: 1 -> 2" in text, text
    assert "total_steps" not in text.split("Fields that may change")[0]  # more steps is not a change of run
    assert steps_of(out) == [1, 2, 3] and not list(out.glob("broken-*"))  # nothing was touched

    result, start, _ = train(tokenizer, out, total_steps=4, clip_high=0.25, train_kwargs={"force_resume": True})
    assert start == 3 and result.global_step == 4 and steps_of(out) == [1, 2, 3, 4]
    assert "changed config" in caplog.text and "clip_high" in caplog.text

    result, start, _ = train(tokenizer, out, total_steps=1, seed=3, train_kwargs={"overwrite": True})
    assert start == 0 and result.global_step == 1 and steps_of(out) == [1]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]


# ------------------------------------------------------------------------------------------ subprocess tests
CHILD = r"""
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from tests.reliability.test_trainer_checkpoints import small_config
from tests.trainer.conftest import ScriptedEngine, build_tiny_model, build_tiny_tokenizer
from ragen_trainer.trainer import StarPOTrainer, TrainerCallback

out, mode = sys.argv[2], sys.argv[3]
cfg = small_config(out, total_steps=50, save_steps=0 if mode == "interrupt" else 1)
original = StarPOTrainer._save_training_state

def slow_save(self, output_dir):  # a slow disk: the window in which the signals arrive
    print(f"SAVING {self.global_step}", flush=True)
    time.sleep(float(os.environ.get("RAGEN_TEST_SAVE_SECONDS", "2")))
    return original(self, output_dir)

StarPOTrainer._save_training_state = slow_save

class CtrlCAfterStep1(TrainerCallback):
    def on_step_end(self, trainer, step, metrics):
        if step == 1:
            os.kill(os.getpid(), signal.SIGINT)

tok = build_tiny_tokenizer()
trainer = StarPOTrainer(cfg, build_tiny_model(tok), tok, engine=ScriptedEngine(tok, ["Dragon"]),
                        callbacks=[CtrlCAfterStep1()] if mode == "interrupt" else [])
result = trainer.train()
print(f"RESULT interrupted={result.interrupted} step={result.global_step}", flush=True)
sys.exit(130 if result.interrupted else 0)
"""


class Child:
    """A tiny training run in a subprocess whose stdout lines can be waited for (every wait is bounded)."""

    def __init__(self, tmp_path: Path, out: Path, mode: str, save_seconds: float) -> None:
        script = tmp_path / "child.py"
        script.write_text(CHILD)
        env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
                   RAGEN_TEST_SAVE_SECONDS=str(save_seconds))
        self.proc = subprocess.Popen([sys.executable, str(script), str(REPO), str(out), mode], cwd=str(REPO), env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.pumps = [threading.Thread(target=self._pump, args=(self.proc.stdout, self.stdout, True), daemon=True),
                      threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr, False), daemon=True)]
        for pump in self.pumps:
            pump.start()

    def _pump(self, stream, sink, lines):
        for line in stream:
            sink.append(line)
            if lines:
                self.lines.put(line.strip())

    def wait_for(self, prefix: str, timeout: float = 180.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            if line.startswith(prefix):
                return line
        self.kill()
        raise AssertionError(f"no {prefix!r} line from the child; stderr:\n{''.join(self.stderr)[-3000:]}")

    def finish(self, timeout: float = 120.0) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the child did not exit; stderr:\n{''.join(self.stderr)[-3000:]}") from None
        for pump in self.pumps:  # the pipes are closed: the pumps end once they have read everything
            pump.join(timeout=10)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.mark.parametrize("mode", ["periodic", "interrupt"])
def test_a_second_ctrl_c_during_the_save_waits_for_it(tmp_path, mode):
    """periodic: both SIGINTs arrive during checkpoint-1's regular save; interrupt: a first Ctrl-C after step 1
    starts the interrupt save, and two more arrive during it. Either way the save completes and verifies."""
    out = tmp_path / "run"
    child = Child(tmp_path, out, mode, save_seconds=3)
    try:
        child.wait_for("SAVING 1")
        child.proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        child.proc.send_signal(signal.SIGINT)
        rc = child.finish()
    finally:
        child.kill()
    stdout, stderr = "".join(child.stdout), "".join(child.stderr)
    assert rc == 130, stderr[-3000:]
    assert "RESULT interrupted=True step=1" in stdout, stdout
    assert stdout.count("SAVING") == 1  # the checkpoint is not saved a second time
    assert stderr.count("waiting for the save to finish") == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert checkpoint_problems(out / "checkpoint-1") == []
    assert not list(out.glob(".saving-*"))
    assert json.loads((out / "summary.json").read_text())["interrupted"] is True


def test_a_kill_during_a_save_then_resume(tmp_path, tokenizer, caplog):
    """SIGKILL while checkpoint-2 is being written: no checkpoint-2 appears (only the unfinished .saving- folder),
    and the next run removes the leftover with a warning and resumes from checkpoint-1."""
    out = tmp_path / "run"
    child = Child(tmp_path, out, "kill", save_seconds=1)
    try:
        child.wait_for("SAVING 2")
        child.proc.send_signal(signal.SIGKILL)
        rc = child.finish()
    finally:
        child.kill()
    assert rc == -signal.SIGKILL
    assert (out / ".saving-checkpoint-2").is_dir() and not (out / "checkpoint-2").exists()
    assert checkpoint_problems(out / "checkpoint-1") == []
    assert steps_of(out) == [1, 2]

    result, start, _ = train(tokenizer, out, model_seed=5, total_steps=3)  # the child's config, total_steps aside
    assert start == 1 and result.resumed_from == str(out / "checkpoint-1")
    assert ".saving-checkpoint-2" in caplog.text and "never finished" in caplog.text
    assert not (out / ".saving-checkpoint-2").exists()
    assert steps_of(out) == [1, 2, 3]
    for step in (1, 2, 3):
        assert checkpoint_problems(out / f"checkpoint-{step}") == [], step
