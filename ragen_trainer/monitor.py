"""The Echo Trap monitor (paper, Finding 1) and the per-step metrics logger.

The Echo Trap: multi-turn RL first improves, then collapses into repeated, template-like replies. Its signature, in
the order it appears, is (1) a *cliff* in the in-group reward std (the N rollouts of one initial state stop
differing), together with *falling entropy*, then (2) a *spike* in the gradient norm. :class:`EchoTrapMonitor`
watches the per-step metrics for that sequence and returns warnings; :func:`rollout_metrics` computes the rollout side
of the metrics (rewards, success, lengths, diversity, invalid actions); :class:`MetricsLogger` writes every step to
JSONL, TensorBoard, wandb (when installed) and a compact console table.

Metric names are plain strings with ``/`` groups. The monitor reads :data:`KEY_IN_GROUP_STD`, :data:`KEY_ENTROPY`,
:data:`KEY_GRAD_NORM` and :data:`KEY_UNIQUE_REPLIES` (the trainer logs entropy and gradient norm under those names).
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ragen_envs.core import check_arg
from ragen_trainer.fileio import append_line, atomic_write_text
from ragen_trainer.filtering import in_group_std
from ragen_trainer.trajectory import RolloutBatch, Trajectory

logger = logging.getLogger(__name__)

KEY_REWARD_MEAN = "reward/mean"
KEY_REWARD_STD = "reward/std"
KEY_IN_GROUP_STD = "reward/in_group_std"
KEY_SUCCESS = "success_rate"
KEY_ENTROPY = "policy/entropy"
#: The entropy over the model's replies' tokens only. Under the paper's ``after_system`` loss mask ``policy/entropy``
#: also averages the environment's prompt tokens, which stay as uncertain however alike the replies become (measured:
#: 2.7 while 97 % of the replies were one word); the monitor watches this one.
KEY_REPLY_ENTROPY = "policy/reply_entropy"
KEY_GRAD_NORM = "optim/grad_norm"
#: ``log pi - log pi_ref`` over the trained tokens the policy did not write (the environment's text and the template,
#: trained under the paper's ``after_system`` mask); logged when the run scores a reference (a KL term). Measured on
#: FrozenLake: vanilla GRPO's fell to -4 to -6 nats a token and its replies stopped parsing, PPO's stayed near +0.1.
KEY_CONTEXT_LOG_RATIO = "policy/log_ratio_context"
KEY_RESPONSE_LENGTH = "response/length"
KEY_THINKING_LENGTH = "response/thinking_length"
KEY_UNIQUE_REPLIES = "diversity/unique_reply_share"
KEY_DISTINCT_1 = "diversity/distinct_1"
KEY_DISTINCT_2 = "diversity/distinct_2"
KEY_INVALID_RATE = "actions/invalid_rate"
KEY_FORMAT_ERROR_RATE = "actions/format_error_rate"
#: Kept-group statistics of StarPO-S filtering (logged by the trainer under these names).
KEY_KEPT_GROUPS = "filter/kept_groups"
KEY_KEPT_RATIO = "filter/kept_ratio"
#: ``reward/part/<name>``: each reward part summed per trajectory (:func:`reward_part_metrics`).
KEY_REWARD_PART_PREFIX = "reward/part/"
#: The grounding wrapper's claims per turn, under its default part name (:func:`claim_metrics`).
KEY_SUPPORTED_CLAIMS = "grounding/supported_claims"
KEY_CONTRADICTED_CLAIMS = "grounding/contradicted_claims"
#: The ``reward_details`` keys that mark a wrapper's details as claim counts.
_CLAIM_KEYS = frozenset({"supported", "contradicted"})


# ------------------------------------------------------------------------------------------------ rollout metrics
def _std(values: list[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def _distinct_n(sequences: list[list[str]], n: int) -> float:
    """Distinct-n: unique n-grams / all n-grams over every reply (1.0 = no n-gram repeats; 0 when there are none)."""
    total = 0
    unique: set[tuple[str, ...]] = set()
    for words in sequences:
        grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        total += len(grams)
        unique.update(grams)
    return len(unique) / total if total else 0.0


def reward_part_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """``reward/part/<name>``: the mean over trajectories of each reward part summed over the trajectory's turns.

    Parts are the env's split of each turn's reward (``env``, ``format_penalty``, and one per reward wrapper such as
    ``grounding``); they add up to ``reward/mean``. A trajectory without a part (no turn reported it) counts as 0, so
    every part is averaged over the same trajectories.
    """
    if not trajs:
        return {}
    totals: dict[str, float] = {}
    for traj in trajs:
        for parts in traj.reward_parts:
            for name, value in parts.items():
                totals[name] = totals.get(name, 0.0) + float(value)
    return {f"{KEY_REWARD_PART_PREFIX}{name}": total / len(trajs) for name, total in sorted(totals.items())}


def claim_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """``<name>/supported_claims`` and ``<name>/contradicted_claims``: claims about the state per turn, for each reward
    wrapper whose ``reward_details`` count them (:class:`~ragen_envs.rewards.ReasoningGroundingReward`, part name
    ``grounding`` by default).

    Averaged over the turns the wrapper judged, a turn without thinking counting 0 claims, so the curve falls when
    thinking shrinks as well as when it stops making checkable claims. With ``weight: 0`` the wrapper only measures.
    """
    counts: dict[str, list[int]] = {}  # name -> [supported, contradicted, turns]
    for traj in trajs:
        for details in traj.reward_details:
            for name, detail in details.items():
                if not (isinstance(detail, dict) and _CLAIM_KEYS <= detail.keys()):
                    continue  # another wrapper's details, or a step after the episode ended ("skipped")
                count = counts.setdefault(name, [0, 0, 0])
                count[0] += int(detail["supported"])
                count[1] += int(detail["contradicted"])
                count[2] += 1
    out: dict[str, float] = {}
    for name, (supported, contradicted, turns) in sorted(counts.items()):
        out[f"{name}/supported_claims"] = supported / turns
        out[f"{name}/contradicted_claims"] = contradicted / turns
    return out


def rollout_metrics(batch: RolloutBatch, tokenizer: Any = None) -> dict[str, float]:
    """Per-step statistics of one rollout batch.

    Keys: ``reward/mean``, ``reward/std``, ``reward/min``, ``reward/max``, ``reward/in_group_std`` (mean over initial
    states of the std of their N rewards), ``reward/zero_std_groups`` (share of groups whose rollouts all got the same
    reward: no GRPO signal), ``success_rate``, ``episode/num_turns``, ``episode/truncated_rate``,
    ``response/length`` (tokens per reply), ``response/tokens_per_trajectory``, ``response/clipped_rate`` (replies cut
    by the token limit), ``response/thinking_length`` (``<think>`` tokens per turn, words without a tokenizer),
    ``diversity/distinct_1`` / ``distinct_2`` (unique word n-grams / all, over every reply),
    ``diversity/unique_reply_share`` (distinct replies / replies), ``actions/invalid_rate`` (well-formed turns naming an
    invalid action / turns), ``actions/format_error_rate`` (malformed turns / turns), ``actions/effective_rate``;
    ``reward/part/<name>`` for every reward part the env reports (see :func:`reward_part_metrics`) and, for a reasoning
    grounding wrapper, ``<name>/supported_claims`` / ``<name>/contradicted_claims`` (see :func:`claim_metrics`).
    """
    trajs = batch.trajectories
    if not trajs:
        return {}
    rewards = [t.reward for t in trajs]
    groups = batch.groups()
    # The same in-group std the StarPO-S filter ranks by (sample std, as the reference's torch.std).
    group_stds = [in_group_std([t.reward for t in members]) for members in groups.values()]

    reply_lengths: list[int] = []
    for t in trajs:
        if t.turn_spans and any(end > start for start, end in t.turn_spans):
            reply_lengths.extend(end - start for start, end in t.turn_spans)
        else:  # text-only trajectories (chat engine without tokenizer): words
            reply_lengths.extend(len(r.split()) for r in t.replies)
    replies = [r for t in trajs for r in t.replies]
    infos = [info for t in trajs for info in t.infos]
    finish = [f for t in trajs for f in t.finish_reasons]

    think_lengths = []
    for info in infos:
        think = info.get("think") or ""
        if tokenizer is not None:
            think_lengths.append(len(tokenizer(think, add_special_tokens=False)["input_ids"]) if think else 0)
        else:
            think_lengths.append(len(think.split()))

    n_turns = max(len(infos), 1)
    format_errors = sum(1 for i in infos if not i.get("format_ok", True))
    invalid = sum(1 for i in infos if i.get("format_ok", True) and not i.get("action_is_valid", True))
    effective = sum(1 for i in infos if i.get("action_is_effective", False))
    words = [r.split() for r in replies]

    def mean(values: list[float] | list[int]) -> float:
        return float(sum(values) / len(values)) if values else 0.0

    return {
        **reward_part_metrics(trajs),
        **claim_metrics(trajs),
        KEY_REWARD_MEAN: mean(rewards),
        KEY_REWARD_STD: _std(rewards),
        "reward/min": float(min(rewards)),
        "reward/max": float(max(rewards)),
        KEY_IN_GROUP_STD: mean(group_stds),
        "reward/zero_std_groups": mean([1.0 if s == 0 else 0.0 for s in group_stds]),
        KEY_SUCCESS: mean([1.0 if t.success else 0.0 for t in trajs]),
        "episode/num_turns": mean([t.num_turns for t in trajs]),
        "episode/truncated_rate": mean([1.0 if t.truncated else 0.0 for t in trajs]),
        KEY_RESPONSE_LENGTH: mean(reply_lengths),
        "response/tokens_per_trajectory": mean([t.num_model_tokens for t in trajs]),
        "response/clipped_rate": mean([1.0 if f == "length" else 0.0 for f in finish]),
        KEY_THINKING_LENGTH: mean(think_lengths),
        KEY_DISTINCT_1: _distinct_n(words, 1),
        KEY_DISTINCT_2: _distinct_n(words, 2),
        KEY_UNIQUE_REPLIES: len(set(replies)) / len(replies) if replies else 0.0,
        KEY_INVALID_RATE: invalid / n_turns,
        KEY_FORMAT_ERROR_RATE: format_errors / n_turns,
        "actions/effective_rate": effective / n_turns,
        "batch/trajectories": float(len(trajs)),
        "batch/groups": float(len(groups)),
    }


# ------------------------------------------------------------------------------------------------ the monitor
@dataclass
class EchoTrapThresholds:
    """When :class:`EchoTrapMonitor` warns. Fractions are relative to a recent reference value."""

    window: int = 10
    """Steps of history that the reference values (recent max std, recent max entropy, median grad norm) use."""
    min_history: int = 3
    """Steps of history needed before anything is judged."""
    std_drop_fraction: float = 0.5
    """Cliff: in-group reward std fell by at least this fraction of its recent max."""
    min_peak_std: float = 1e-3
    """A recent max in-group std below this is no peak to fall from (rewards that never varied)."""
    entropy_drop_fraction: float = 0.05
    """Falling entropy: entropy at least this fraction below its recent max."""
    grad_spike_factor: float = 3.0
    """Spike: gradient norm at least this many times its recent median."""
    spike_within: int = 10
    """A spike this many steps or fewer after the cliff completes the signature."""
    min_unique_reply_share: float = 0.25
    """Replies collapsing to a template: the share of unique replies fell below this (after having been above it)."""
    cooldown: int = 5
    """Steps before the same kind of warning is given again."""
    context_drift_nats: float = 1.0
    """Unlearned observations: the policy finds the environment's text this many nats a token less likely than its
    reference did (``policy/log_ratio_context`` below minus this)."""
    std_key: str = KEY_IN_GROUP_STD
    entropy_key: str = KEY_REPLY_ENTROPY
    """The entropy watched; a step without it falls back to ``fallback_entropy_key`` (the trained tokens')."""
    fallback_entropy_key: str = KEY_ENTROPY
    grad_norm_key: str = KEY_GRAD_NORM
    unique_key: str = KEY_UNIQUE_REPLIES
    context_log_ratio_key: str = KEY_CONTEXT_LOG_RATIO

    def __post_init__(self) -> None:
        for name in ("window", "min_history", "spike_within", "cooldown"):
            value = getattr(self, name)
            check_arg(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name, value, "an int >= 1")
        for name in ("std_drop_fraction", "entropy_drop_fraction", "min_unique_reply_share"):
            value = getattr(self, name)
            check_arg(isinstance(value, (int, float)) and 0 <= value < 1, name, value, "a number in [0, 1)")
        check_arg(self.grad_spike_factor > 1, "grad_spike_factor", self.grad_spike_factor, "a number > 1")
        check_arg(self.min_peak_std >= 0, "min_peak_std", self.min_peak_std, "a number >= 0")
        check_arg(self.context_drift_nats > 0, "context_drift_nats", self.context_drift_nats, "a number > 0")


@dataclass
class EchoTrapEvent:
    step: int
    kind: str
    """``"std_cliff"`` (stage 1), ``"echo_trap"`` (stage 2: the full signature), ``"grad_spike"`` (a spike on its
    own), ``"template_collapse"`` (few unique replies)."""
    message: str


class EchoTrapMonitor:
    """Watches the per-step metrics for the Echo Trap's signature.

    Call :meth:`update` once per step with the step's metrics (rollout metrics plus the trainer's entropy and gradient
    norm); it returns warnings as strings (empty when all is well) and records them in :attr:`events`.
    :attr:`detected_step` is the first step at which the whole signature was seen.

    Stage 1 (warning signs): the in-group reward std fell by ``std_drop_fraction`` of its recent max, and the entropy
    is falling (when the trainer logs entropy; without it the std cliff alone counts); warned once per cliff (staying
    low afterwards is the same cliff). Stage 2 (the trap): within ``spike_within`` steps of the cliff, the gradient
    norm spikes to ``grad_spike_factor`` x its recent median. A spike without a cliff before it is reported as a
    plain spike; a share of unique replies falling below ``min_unique_reply_share`` as a template collapse, and a
    policy that finds the environment's text ``context_drift_nats`` less likely than its reference (logged only when
    the run scores a reference) as unlearned observations.
    """

    def __init__(self, thresholds: EchoTrapThresholds | None = None) -> None:
        self.thresholds = thresholds or EchoTrapThresholds()
        window = self.thresholds.window
        self._std: deque[float] = deque(maxlen=window)
        self._entropy: deque[float] = deque(maxlen=window)
        self._grad: deque[float] = deque(maxlen=window)
        self._unique_peak = 0.0
        self._last_warned: dict[str, int] = {}
        self._in_cliff = False
        self.cliff_step: int | None = None
        self.detected_step: int | None = None
        self.events: list[EchoTrapEvent] = []

    def update(self, step: int, metrics: dict[str, Any]) -> list[str]:
        th = self.thresholds
        std = _number(metrics.get(th.std_key))
        entropy = _number(metrics.get(th.entropy_key))
        if entropy is None:
            entropy = _number(metrics.get(th.fallback_entropy_key))
        grad = _number(metrics.get(th.grad_norm_key))
        unique = _number(metrics.get(th.unique_key))
        out: list[str] = []

        # Stage 1: in-group std cliff with falling entropy. The cliff's step is where the drop happened: staying
        # low afterwards is the same cliff, not a new one.
        in_cliff = False
        if std is not None and len(self._std) >= th.min_history:
            peak = max(self._std)
            if peak >= th.min_peak_std and std <= (1.0 - th.std_drop_fraction) * peak:
                entropy_note, entropy_ok = "entropy not logged", True
                if entropy is not None and len(self._entropy) >= th.min_history:
                    ent_peak = max(self._entropy)
                    entropy_ok = entropy <= (1.0 - th.entropy_drop_fraction) * ent_peak
                    entropy_note = f"entropy {ent_peak:.3g} -> {entropy:.3g}"
                if entropy_ok:
                    in_cliff = True
                if entropy_ok and not self._in_cliff:
                    self.cliff_step = step
                    out += self._warn(
                        step,
                        "std_cliff",
                        (
                            f"Echo Trap warning signs at step {step}: in-group reward std fell "
                            f"{100 * (1 - std / peak):.0f}% (from {peak:.3g} to {std:.3g}), {entropy_note}. "
                            f"The rollouts of each initial state are becoming alike; a gradient-norm spike would "
                            f"confirm the trap."
                        ),
                    )

        if std is not None:
            self._in_cliff = in_cliff

        # Stage 2: gradient-norm spike, after the cliff = the trap.
        if grad is not None and len(self._grad) >= th.min_history:
            median = statistics.median(self._grad)
            if median > 0 and grad >= th.grad_spike_factor * median:
                if self.cliff_step is not None and 0 <= step - self.cliff_step <= th.spike_within:
                    if self.detected_step is None:
                        self.detected_step = step
                    out += self._warn(
                        step,
                        "echo_trap",
                        (
                            f"Echo Trap detected at step {step}: gradient norm {grad:.3g} is "
                            f"{grad / median:.1f}x its recent median {median:.3g}, "
                            f"{step - self.cliff_step} step(s) after the in-group std cliff (step {self.cliff_step}). "
                            "Training is likely collapsing into repetitive replies; consider StarPO-S (variance "
                            "filtering, critic, clip-higher), a lower learning rate, or the checkpoint from before "
                            f"step {self.cliff_step}."
                        ),
                    )
                else:
                    out += self._warn(
                        step,
                        "grad_spike",
                        (
                            f"gradient-norm spike at step {step}: {grad:.3g} is {grad / median:.1f}x its recent median "
                            f"{median:.3g} (no in-group std cliff before it)."
                        ),
                    )

        # Supporting sign: replies collapsing into a template.
        if unique is not None:
            if self._unique_peak >= th.min_unique_reply_share and unique < th.min_unique_reply_share:
                out += self._warn(
                    step,
                    "template_collapse",
                    (
                        f"replies collapsing into a template at step {step}: only {100 * unique:.0f}% of replies are "
                        f"distinct (it was {100 * self._unique_peak:.0f}%)."
                    ),
                )
            self._unique_peak = max(self._unique_peak, unique)

        # Supporting sign: the policy unlearning the environment's text (trained under after_system). On FrozenLake
        # it crossed -1 nat 4 and 11 steps before vanilla GRPO's replies stopped parsing (docs/learning.md).
        context = _number(metrics.get(th.context_log_ratio_key))
        if context is not None and context < -th.context_drift_nats:
            out += self._warn(
                step,
                "context_drift",
                (
                    f"the policy is unlearning its observations at step {step}: it finds the environment's text "
                    f"{-context:.2g} nats a token less likely than its reference. The trained environment tokens "
                    "(loss_mask: after_system) take a push from the advantage that the replies' sampling does not "
                    "balance; consider loss_mask: replies, or a critic's baseline (PPO, StarPO-S)."
                ),
            )

        for value, hist in ((std, self._std), (entropy, self._entropy), (grad, self._grad)):
            if value is not None:
                hist.append(value)
        return out

    def _warn(self, step: int, kind: str, message: str) -> list[str]:
        last = self._last_warned.get(kind)
        if last is not None and step - last < self.thresholds.cooldown:
            return []
        self._last_warned[kind] = step
        self.events.append(EchoTrapEvent(step=step, kind=kind, message=message))
        return [message]

    def state_dict(self) -> dict[str, Any]:
        """The monitor's history, for resuming from a checkpoint."""
        return {
            "std": list(self._std),
            "entropy": list(self._entropy),
            "grad": list(self._grad),
            "unique_peak": self._unique_peak,
            "in_cliff": self._in_cliff,
            "last_warned": dict(self._last_warned),
            "cliff_step": self.cliff_step,
            "detected_step": self.detected_step,
            "events": [asdict(e) for e in self.events],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._std.extend(state.get("std", []))
        self._entropy.extend(state.get("entropy", []))
        self._grad.extend(state.get("grad", []))
        self._unique_peak = float(state.get("unique_peak", 0.0))
        self._in_cliff = bool(state.get("in_cliff", False))
        self._last_warned = {str(k): int(v) for k, v in state.get("last_warned", {}).items()}
        self.cliff_step = state.get("cliff_step")
        self.detected_step = state.get("detected_step")
        self.events = [EchoTrapEvent(**e) for e in state.get("events", [])]


def _number(value: Any) -> float | None:
    """A finite float from a number / 0-d tensor / numpy scalar, else ``None``."""
    if value is None or isinstance(value, (str, bytes, bool)):
        return None
    if hasattr(value, "item"):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


# ------------------------------------------------------------------------------------------------ the logger
#: Columns of the console table: (metric key, header, width).
CONSOLE_COLUMNS: tuple[tuple[str, str, int], ...] = (
    (KEY_REWARD_MEAN, "reward", 8),
    (KEY_IN_GROUP_STD, "grp std", 8),
    (KEY_SUCCESS, "success", 8),
    (KEY_REPLY_ENTROPY, "reply H", 8),
    (KEY_GRAD_NORM, "grad", 8),
    (KEY_RESPONSE_LENGTH, "len", 6),
    (KEY_UNIQUE_REPLIES, "uniq", 5),
    (KEY_KEPT_RATIO, "kept", 5),
)


@dataclass
class _ConsoleState:
    rows: int = 0
    first: tuple[int, float] | None = None
    """The step and time of the first row: the ETA is measured from there (what came before it, model loading and
    the initial validation, says nothing about how long a step takes)."""


def _tqdm_write_mode(file: Any) -> Any:
    """A context in which printing to ``file`` does not collide with live tqdm bars (a no-op without tqdm)."""
    try:
        from tqdm.std import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with transformers
        from contextlib import nullcontext

        return nullcontext()
    return tqdm.external_write_mode(file=file)


class MetricsLogger:
    """Writes each step's metrics to ``output_dir/metrics.jsonl``, TensorBoard (``output_dir/tensorboard``), wandb
    (when installed) and the console (one compact table row per step, warnings highlighted).

    Args:
        output_dir: the run's folder (created).
        tensorboard: write TensorBoard event files (needs the ``tensorboard`` package).
        wandb: ``"auto"`` (log to wandb when it is installed; offline unless ``WANDB_API_KEY`` or ``WANDB_MODE`` says
            otherwise), ``True`` (required: an error when missing) or ``False``.
        console: print the table to stderr.
        run_name / config: the run's name and its configuration (a dict or dataclass), for wandb and ``config.json``.
        total_steps: shown as ``step/total`` with an ETA.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike[str],
        *,
        tensorboard: bool = True,
        wandb: bool | str = "auto",
        console: bool = True,
        run_name: str | None = None,
        config: Any = None,
        total_steps: int | None = None,
        project: str = "ragen",
    ) -> None:
        check_arg(wandb in (True, False, "auto"), "wandb", wandb, "True, False or 'auto'")
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.output_dir / "metrics.jsonl"
        # Each record is appended with one write + fsync (fileio.append_line): a crash leaves whole lines. A torn
        # last line (a disk that tore it) gets its newline here, so the next record starts a line of its own.
        if self.jsonl_path.is_file() and self.jsonl_path.stat().st_size > 0:
            with open(self.jsonl_path, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    append_line(self.jsonl_path, "")
        self.total_steps = total_steps
        self._console_state = _ConsoleState()
        self._console = None
        if console:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.output_dir / "tensorboard"))
        self._wandb = None
        if wandb:
            self._wandb = _start_wandb(wandb == "auto", self.output_dir, project, run_name, _as_dict(config))
        self._closed = False

    def log(self, step: int, metrics: dict[str, Any], warnings: list[str] | None = None) -> None:
        """Record one step. Non-numeric values go to JSONL only; NaN/inf are written as ``null``."""
        check_arg(not self._closed, "logger", "closed", "an open MetricsLogger (log() after close())")
        warnings = list(warnings or [])
        record: dict[str, Any] = {"step": int(step), "time": time.time()}
        scalars: dict[str, float] = {}
        for key, value in metrics.items():
            number = _number(value)
            if number is not None:
                scalars[str(key)] = number
                record[str(key)] = number
            elif isinstance(value, (str, bool)) or value is None:
                record[str(key)] = value
            elif isinstance(value, (int, float)):  # non-finite
                record[str(key)] = None
            else:
                record[str(key)] = _jsonable(value)
        if warnings:
            record["warnings"] = warnings
        append_line(self.jsonl_path, json.dumps(record, allow_nan=False, default=str))

        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
            for message in warnings:
                self._tb.add_text("echo_trap", message, step)
        if self._wandb is not None:
            payload: dict[str, Any] = dict(scalars)
            if warnings:
                payload["warnings"] = "\n".join(warnings)
            self._wandb.log(payload, step=step)
        if self._console is not None:
            self._print_row(step, scalars, warnings)

    def _print_row(self, step: int, scalars: dict[str, float], warnings: list[str]) -> None:
        state = self._console_state
        step_w = max(len(str(self.total_steps or 0)) * 2 + 1, 6)
        lines: list[tuple[str, bool]] = []  # (text, rich markup)
        if state.rows % 20 == 0:
            header = f"{'step':>{step_w}} " + " ".join(f"{h:>{w}}" for _, h, w in CONSOLE_COLUMNS) + "  eta"
            lines.append((f"[bold]{header}[/bold]", True))
        state.rows += 1
        label = f"{step}/{self.total_steps}" if self.total_steps else str(step)
        cells = []
        for key, _, width in CONSOLE_COLUMNS:
            value = scalars.get(key)
            cells.append(f"{'-':>{width}}" if value is None else f"{_fmt(value, width):>{width}}")
        eta = ""
        if self.total_steps:
            eta = self._eta(step)
        lines.append((f"{label:>{step_w}} " + " ".join(cells) + f"  {eta}", False))
        for message in warnings:
            lines.append((f"[bold yellow]warning:[/bold yellow] {message}", True))
        self._print_lines(lines)

    def _eta(self, step: int) -> str:
        """Time left, from the measured time per step since the first row (``-`` until a step has been timed: the
        first row comes after loading and the initial validation, which no later step repeats)."""
        state, now = self._console_state, time.perf_counter()
        if state.first is None or step <= state.first[0]:
            state.first = state.first or (step, now)
            return "-"
        per_step = (now - state.first[1]) / (step - state.first[0])
        return _duration(per_step * max(self.total_steps - step, 0))

    def _print_lines(self, lines: list[tuple[str, bool]]) -> None:
        # The trainer's step bar and the rollout bar (tqdm) share the terminal: a row printed while they are drawn
        # lands on the bar's own line and the bar's next redraw ("\r" + bar) erases it, so only the first row stayed
        # visible. tqdm's external write mode clears the bars, lets the rows print, and redraws the bars below them.
        with _tqdm_write_mode(self._console.file):
            for text, markup in lines:
                self._console.print(text, markup=markup)

    def log_text(self, message: str, step: int | None = None) -> None:
        """A free-text note (console and JSONL), e.g. 'checkpoint saved'."""
        append_line(self.jsonl_path, json.dumps({"step": step, "time": time.time(), "note": message}))
        if self._console is not None:
            self._print_lines([(message, False)])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | os.PathLike[str], *, notes: bool = False) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``, in order. Lines that are not a JSON object (a torn last line after a
    crash) are skipped; free-text notes (``"note"`` records) only with ``notes``. A missing file is ``[]``."""
    out: list[dict[str, Any]] = []
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and (notes or "note" not in record):
            out.append(record)
    return out


def truncate_metrics(path: str | os.PathLike[str], last_step: int) -> int:
    """Keep the records of ``metrics.jsonl`` up to ``last_step`` (those a resumed run does not write again) and drop
    the later ones and any torn line, atomically; returns how many lines were dropped (0: the file is untouched)."""
    file = Path(path)
    if not file.is_file():
        return 0
    kept: list[str] = []
    dropped = 0
    for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(record, dict) or (isinstance(step, (int, float)) and step > last_step):
            dropped += 1
            continue
        kept.append(line)
    if dropped:
        atomic_write_text(file, "".join(line + "\n" for line in kept))
    return dropped


def _fmt(value: float, width: int) -> str:
    text = f"{value:.4g}"
    if len(text) > width:
        text = f"{value:.2g}"
    return text


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _as_dict(config: Any) -> dict[str, Any] | None:
    if config is None:
        return None
    if isinstance(config, dict):
        return config
    try:
        return asdict(config)
    except TypeError:
        return {"config": str(config)}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        return str(value)


def _start_wandb(
    optional: bool, output_dir: Path, project: str, run_name: str | None, config: dict[str, Any] | None
) -> Any:
    try:
        import wandb
    except ImportError as exc:
        if optional:
            return None
        raise ImportError(
            "wandb=True needs the wandb package: pip install wandb (or pass wandb='auto' / False)"
        ) from exc
    mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
    return wandb.init(project=project, name=run_name, config=config, dir=str(output_dir), mode=mode)


__all__ = [
    "CONSOLE_COLUMNS",
    "EchoTrapEvent",
    "EchoTrapMonitor",
    "EchoTrapThresholds",
    "MetricsLogger",
    "claim_metrics",
    "read_metrics",
    "reward_part_metrics",
    "rollout_metrics",
    "truncate_metrics",
]
