"""Echo Trap monitor: rollout metrics on known batches, the signature detector on synthetic curves (and its negative
controls), and the metrics logger's JSONL / TensorBoard / console output."""

from __future__ import annotations

import json
import math

import pytest

from ragen_trainer.monitor import (
    KEY_ENTROPY,
    KEY_GRAD_NORM,
    KEY_IN_GROUP_STD,
    KEY_UNIQUE_REPLIES,
    EchoTrapMonitor,
    EchoTrapThresholds,
    MetricsLogger,
    rollout_metrics,
)
from ragen_trainer.trajectory import RolloutBatch, Trajectory


def _traj(group_id, reward, replies, *, success=False, infos=None, spans=None, finish=None):
    infos = infos or [
        {"format_ok": True, "action_is_valid": True, "action_is_effective": True, "think": ""} for _ in replies
    ]
    spans = spans or [(i * 10, i * 10 + 4) for i in range(len(replies))]
    n = spans[-1][1] + 2
    mask = [0] * n
    for s, e in spans:
        mask[s:e] = [1] * (e - s)
    return Trajectory(
        group_id=group_id,
        seed=group_id,
        env_id="ragen/Bandit-v0",
        messages=[],
        input_ids=[5] * n,
        loss_mask=mask,
        turn_spans=spans,
        turn_rewards=[reward] + [0.0] * (len(replies) - 1),
        success=success,
        replies=replies,
        infos=infos,
        finish_reasons=finish or ["stop"] * len(replies),
    )


def test_rollout_metrics_on_a_known_batch():
    bad_format = {"format_ok": False, "action_is_valid": False, "action_is_effective": False, "think": ""}
    invalid = {"format_ok": True, "action_is_valid": False, "action_is_effective": False, "think": "one two three"}
    batch = RolloutBatch(
        [
            _traj(0, 1.0, ["a b c"], success=True),
            _traj(0, 0.0, ["a b c"], infos=[bad_format], finish=["length"]),
            _traj(1, 0.5, ["x y", "x y"], infos=[invalid, invalid], spans=[(0, 6), (10, 12)]),
            _traj(1, 0.5, ["q"]),
        ]
    )
    m = rollout_metrics(batch)
    assert m["reward/mean"] == pytest.approx(0.5)
    assert m["reward/std"] == pytest.approx(math.sqrt(0.125))
    # group 0: sample std 0.707 (the filter's in-group std, as the reference's torch.std), group 1: 0
    assert m[KEY_IN_GROUP_STD] == pytest.approx(math.sqrt(0.5) / 2)
    assert m["reward/zero_std_groups"] == pytest.approx(0.5)
    assert m["success_rate"] == pytest.approx(0.25)
    assert m["episode/num_turns"] == pytest.approx(1.25)
    assert m["response/length"] == pytest.approx((4 + 4 + 6 + 2 + 4) / 5)
    assert m["response/clipped_rate"] == pytest.approx(1 / 5)
    assert m["response/thinking_length"] == pytest.approx(6 / 5)  # words, no tokenizer
    assert m[KEY_UNIQUE_REPLIES] == pytest.approx(3 / 5)
    # words: a b c a b c x y x y q -> 11 unigrams, 6 distinct; bigrams ab bc ab bc xy xy -> 6, 3 distinct
    assert m["diversity/distinct_1"] == pytest.approx(6 / 11)
    assert m["diversity/distinct_2"] == pytest.approx(3 / 6)
    assert m["actions/format_error_rate"] == pytest.approx(1 / 5)
    assert m["actions/invalid_rate"] == pytest.approx(2 / 5)
    assert m["actions/effective_rate"] == pytest.approx(2 / 5)
    assert rollout_metrics(RolloutBatch([])) == {}


def test_rollout_metrics_count_thinking_tokens_with_a_tokenizer(tiny_tokenizer, scripted_engine):
    from ragen_trainer.engines import SamplingParams
    from ragen_trainer.rollout import collect_rollouts
    from tests.trainer.conftest import latest_rollout

    think = "The dragon is risky but pays more on average."
    engine = scripted_engine(tiny_tokenizer, [f"<think>{think}</think><answer>Dragon</answer>"])
    batch = collect_rollouts(
        engine, tiny_tokenizer, "ragen/Bandit-v0", [0, 1], 2, settings=latest_rollout(), sampling=SamplingParams(),
        env_kwargs={"reply_prefix": ""},
    )
    m = rollout_metrics(batch, tiny_tokenizer)
    assert m["response/thinking_length"] == len(tiny_tokenizer(think, add_special_tokens=False)["input_ids"])
    assert m["success_rate"] == 1.0 and m[KEY_UNIQUE_REPLIES] == pytest.approx(1 / 4)
    assert m["actions/format_error_rate"] == 0.0 and m["actions/invalid_rate"] == 0.0


def _healthy(step):
    wobble = 0.02 * ((step * 7) % 3)
    return {
        KEY_IN_GROUP_STD: 0.40 + wobble,
        KEY_ENTROPY: 1.0 - 0.001 * step,
        KEY_GRAD_NORM: 1.0 + wobble,
        KEY_UNIQUE_REPLIES: 0.9,
    }


def test_monitor_detects_the_echo_trap_signature_in_order():
    monitor = EchoTrapMonitor()
    for step in range(10):
        assert monitor.update(step, _healthy(step)) == []
    # Stage 1: in-group std cliff with falling entropy.
    warnings = monitor.update(10, {KEY_IN_GROUP_STD: 0.08, KEY_ENTROPY: 0.7, KEY_GRAD_NORM: 1.1})
    assert len(warnings) == 1 and "warning signs" in warnings[0] and "entropy" in warnings[0]
    assert monitor.cliff_step == 10 and monitor.detected_step is None
    assert monitor.update(11, {KEY_IN_GROUP_STD: 0.07, KEY_ENTROPY: 0.6, KEY_GRAD_NORM: 1.0}) == []  # cooldown
    # Stage 2: gradient-norm spike soon after: the trap.
    warnings = monitor.update(12, {KEY_IN_GROUP_STD: 0.05, KEY_ENTROPY: 0.5, KEY_GRAD_NORM: 9.0})
    assert any("Echo Trap detected at step 12" in w for w in warnings)
    assert monitor.detected_step == 12
    assert [e.kind for e in monitor.events] == ["std_cliff", "echo_trap"]


def test_monitor_negative_controls():
    # Healthy training: nothing.
    calm = EchoTrapMonitor()
    assert all(calm.update(s, _healthy(s)) == [] for s in range(40))
    # A cliff while entropy holds: no warning (rewards can converge for good reasons).
    steady = EchoTrapMonitor()
    for s in range(10):
        steady.update(s, _healthy(s))
    assert steady.update(10, {KEY_IN_GROUP_STD: 0.05, KEY_ENTROPY: 0.99, KEY_GRAD_NORM: 1.0}) == []
    # A gradient spike without a cliff before it: a plain spike warning, not the trap.
    spiky = EchoTrapMonitor()
    for s in range(10):
        spiky.update(s, _healthy(s))
    warnings = spiky.update(10, {**_healthy(10), KEY_GRAD_NORM: 20.0})
    assert len(warnings) == 1 and warnings[0].startswith("gradient-norm spike")
    assert spiky.detected_step is None
    # A spike long after the cliff does not complete the signature.
    late = EchoTrapMonitor(EchoTrapThresholds(spike_within=3))
    for s in range(10):
        late.update(s, _healthy(s))
    late.update(10, {KEY_IN_GROUP_STD: 0.05, KEY_ENTROPY: 0.5, KEY_GRAD_NORM: 1.0})
    for s in range(11, 20):
        late.update(s, {KEY_IN_GROUP_STD: 0.05, KEY_ENTROPY: 0.5, KEY_GRAD_NORM: 1.0})
    late.update(20, {KEY_IN_GROUP_STD: 0.05, KEY_ENTROPY: 0.5, KEY_GRAD_NORM: 30.0})
    assert late.detected_step is None
    # Too little history: nothing is judged.
    young = EchoTrapMonitor()
    young.update(0, {KEY_IN_GROUP_STD: 0.5, KEY_GRAD_NORM: 1.0})
    assert young.update(1, {KEY_IN_GROUP_STD: 0.0, KEY_GRAD_NORM: 50.0}) == []


def test_monitor_without_entropy_uses_the_cliff_alone_and_warns_on_template_collapse():
    monitor = EchoTrapMonitor()
    for s in range(5):
        monitor.update(s, {KEY_IN_GROUP_STD: 0.5, KEY_UNIQUE_REPLIES: 0.8, "reward/mean": float("nan")})
    warnings = monitor.update(5, {KEY_IN_GROUP_STD: 0.1, KEY_UNIQUE_REPLIES: 0.1})
    assert any("entropy not logged" in w for w in warnings)
    assert any("template" in w for w in warnings)
    state = monitor.state_dict()
    copy = EchoTrapMonitor()
    copy.load_state_dict(json.loads(json.dumps(state)))
    assert copy.state_dict() == state


def test_thresholds_validation():
    with pytest.raises(ValueError, match="std_drop_fraction"):
        EchoTrapThresholds(std_drop_fraction=1.5)
    with pytest.raises(ValueError, match="grad_spike_factor"):
        EchoTrapThresholds(grad_spike_factor=1.0)
    with pytest.raises(ValueError, match="window"):
        EchoTrapThresholds(window=0)


def test_metrics_logger_writes_jsonl_tensorboard_and_console(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    pytest.importorskip("tensorboard")
    with MetricsLogger(tmp_path / "run", wandb=False, total_steps=3, config={"lr": 1e-6}) as log:
        log.log(1, {"reward/mean": 0.5, KEY_GRAD_NORM: torch.tensor(2.5), "note": "hi", "bad": float("nan")})
        log.log(2, {"reward/mean": 0.25, KEY_IN_GROUP_STD: 0.125}, warnings=["Echo Trap detected at step 2: x"])
        log.log_text("checkpoint saved", step=2)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["step"] == 1 and lines[0][KEY_GRAD_NORM] == 2.5 and lines[0]["note"] == "hi"
    assert lines[0]["bad"] is None
    assert lines[1]["warnings"] == ["Echo Trap detected at step 2: x"]
    assert lines[2]["note"] == "checkpoint saved"

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("reward/mean")] == [0.5, 0.25]
    assert [e.step for e in acc.Scalars(KEY_GRAD_NORM)] == [1]

    err = capsys.readouterr().err
    assert "reward" in err and "grp std" in err
    assert "1/3" in err and "0.25" in err and "0.125" in err
    assert "warning:" in err and "Echo Trap detected at step 2" in err
    with pytest.raises(ValueError, match="logger"):
        log.log(3, {})


def _screen(text: str) -> list[str]:
    """What a terminal shows after ``text``: handles carriage return, newline and tqdm's cursor-up (ESC[A)."""
    import re

    rows: list[list[str]] = [[]]
    row = col = 0
    for token in re.findall(r"\x1b\[A|\x1b\[[0-9;]*[A-Za-z]|\r|\n|[^\x1b\r\n]", text):
        if token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
        elif token == "\x1b[A":
            row = max(row - 1, 0)
        elif token.startswith("\x1b"):
            continue  # colours and other attributes
        else:
            while len(rows) <= row:
                rows.append([])
            line = rows[row]
            line.extend(" " * (col + 1 - len(line)))
            line[col] = token
            col += 1
    return ["".join(r).rstrip() for r in rows]


def test_the_console_eta_comes_from_measured_step_times(tmp_path, capsys, monkeypatch):
    """No ETA on the first row (it comes after loading and the initial validation, which took 600 s here); then the
    time per step measured since that row: steps 1 -> 3 took 20 s, so 7 steps left take 70 s."""
    from ragen_trainer import monitor

    clock = [600.0]
    monkeypatch.setattr(monitor.time, "perf_counter", lambda: clock[0])
    with MetricsLogger(tmp_path / "run", wandb=False, tensorboard=False, total_steps=10) as log:
        log.log(1, {"reward/mean": 0.5})
        clock[0] += 20.0
        log.log(3, {"reward/mean": 0.5})
        clock[0] += 10.0
        log.log(10, {"reward/mean": 0.5})
    rows = [line.split() for line in capsys.readouterr().err.splitlines() if line.strip()[:1].isdigit()]
    assert [(row[0], row[-1]) for row in rows] == [("1/10", "-"), ("3/10", "1:10"), ("10/10", "0:00")]


def test_metrics_logger_rows_stay_visible_under_live_progress_bars(tmp_path, capsys):
    """The trainer draws a step bar and a nested rollout bar (tqdm) while the logger prints its table; every row
    must stay on screen (the bars' redraws used to erase all but the first)."""
    import sys

    from tqdm.std import tqdm

    log = MetricsLogger(tmp_path / "run", wandb=False, tensorboard=False, total_steps=4)
    steps = tqdm(total=4, file=sys.stderr, mininterval=0, dynamic_ncols=False, ncols=60)
    for step in range(1, 5):
        rollout = tqdm(total=3, file=sys.stderr, leave=False, mininterval=0, ncols=60, desc="rollout")
        rollout.update(3)
        rollout.close()
        steps.update(1)
        log.log(step, {"reward/mean": step / 8, KEY_IN_GROUP_STD: 0.5})
    steps.close()
    log.close()
    screen = _screen(capsys.readouterr().err)
    for step in range(1, 5):
        assert any(line.lstrip().startswith(f"{step}/4 ") for line in screen), (step, screen)
    assert sum("grp std" in line for line in screen) == 1  # one header


def test_metrics_logger_wandb_choice(tmp_path):
    with pytest.raises(ValueError, match="wandb"):
        MetricsLogger(tmp_path, wandb="yes")
    try:
        import wandb  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install wandb"):
            MetricsLogger(tmp_path, wandb=True, tensorboard=False, console=False)
        quiet = MetricsLogger(tmp_path, wandb="auto", tensorboard=False, console=False)  # silently without
        quiet.log(0, {"x": 1})
        quiet.close()
    else:
        pytest.skip("wandb is installed here")
