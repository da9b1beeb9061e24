"""``ragen-trainer plot``: the curves a researcher looks at first, for one run or several configurations of several
seeds each.

A *run* is a folder with a ``metrics.jsonl`` (what ``ragen-trainer train`` writes). A *configuration* is one run, or
a folder whose sub-folders are runs of the same settings with different seeds (``runs/sweep/starpo-s/seed0``,
``seed1``, ...): its curves are the mean over seeds with a band of one standard deviation (the band is left out for a
single seed). Each argument of ``plot`` is one configuration, drawn in its own colour on every panel.

Panels (a panel is drawn when some run logged its metric):

* training success (the rollouts' ``success_rate``) and validation success, one line style per split (the training
  env's ``val/success``, each generalisation split's ``val/<Name>/success``);
* the mean reward and the in-group reward std (the StarPO-S filter's signal; it falls to 0 in the Echo Trap);
* the entropy of the replies (``policy/reply_entropy``; ``policy/entropy`` for runs logged before it existed);
* the policy's gradient norm (``optim/grad_norm``; the Echo Trap's spike);
* the share of malformed replies (``actions/format_error_rate``: vanilla GRPO's fall on FrozenLake);
* the policy's log-ratio to its reference over the environment's text (``policy/log_ratio_context``, in runs that
  score a reference under the paper's ``after_system`` mask: below zero, the policy is unlearning its observations).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragen_trainer.monitor import (
    KEY_CONTEXT_LOG_RATIO,
    KEY_ENTROPY,
    KEY_FORMAT_ERROR_RATE,
    KEY_GRAD_NORM,
    KEY_IN_GROUP_STD,
    KEY_REPLY_ENTROPY,
    KEY_REWARD_MEAN,
    KEY_SUCCESS,
    read_metrics,
)

METRICS_FILE = "metrics.jsonl"

#: A validation split's success: ``val/success`` (the training env) or ``val/<Name>/success``.
_VAL_KEY = re.compile(r"^val/(?:(?P<split>[^/]+)/)?success$")

#: The panels: (title, y label, metric keys tried in order for each run).
PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("reward", "mean reward", (KEY_REWARD_MEAN,)),
    ("in-group reward std", "std", (KEY_IN_GROUP_STD,)),
    ("reply entropy", "nats / token", (KEY_REPLY_ENTROPY, KEY_ENTROPY)),
    ("gradient norm", "global norm", (KEY_GRAD_NORM,)),
    ("format errors", "malformed replies / turns", (KEY_FORMAT_ERROR_RATE,)),
    ("environment's text vs reference", "log pi - log pi_ref, nats / token", (KEY_CONTEXT_LOG_RATIO,)),
)


@dataclass
class Configuration:
    """One line on every panel: a label and the runs (seeds) that share its settings."""

    label: str
    runs: list[Path]
    records: list[list[dict[str, Any]]] = field(default_factory=list)


def find_configurations(paths: list[str | os.PathLike[str]], labels: list[str] | None = None) -> list[Configuration]:
    """One :class:`Configuration` per path: a run folder, or a folder of run folders (seeds). Raises ``ValueError``
    naming a path that is neither, or whose ``metrics.jsonl`` holds no step."""
    if labels is not None and len(labels) != len(paths):
        raise ValueError(f"invalid argument --labels: {len(labels)} label(s) for {len(paths)} run argument(s); give "
                         "one label per run argument, or none")
    out: list[Configuration] = []
    for i, raw in enumerate(paths):
        path = Path(raw)
        if not path.is_dir():
            raise ValueError(f"invalid run {str(raw)!r}: not a folder; expected a run folder (with {METRICS_FILE}) "
                             "or a folder of run folders (one per seed)")
        runs = [path] if (path / METRICS_FILE).is_file() else sorted(
            p for p in path.iterdir() if p.is_dir() and (p / METRICS_FILE).is_file())
        if not runs:
            raise ValueError(f"invalid run {str(raw)!r}: no {METRICS_FILE} in it or in its sub-folders; expected a "
                             "run folder written by ragen-trainer train, or a folder of such folders")
        records = [load_records(run) for run in runs]
        empty = [str(run) for run, rec in zip(runs, records) if not rec]
        if empty:
            raise ValueError(f"invalid run {str(raw)!r}: {', '.join(e + '/' + METRICS_FILE for e in empty)} holds no "
                             "step (empty, damaged, or the run has not finished a step yet)")
        label = labels[i] if labels else (path.name if len(runs) == 1 else f"{path.name} ({len(runs)} seeds)")
        out.append(Configuration(label, runs, records))
    return out


def load_records(run: Path) -> list[dict[str, Any]]:
    """A run's step records, with its validations placed at the step they measured: a validation runs before the
    step it is logged with (row ``s`` holds the validation of the policy after ``s - 1`` steps), and the final one,
    after the last step, is in ``summary.json``."""
    out: list[dict[str, Any]] = []
    for record in read_metrics(run / METRICS_FILE):
        step = _number(record.get("step"))
        if step is None:
            continue
        out.append({k: v for k, v in record.items() if not k.startswith("val/")})
        val = {k: v for k, v in record.items() if k.startswith("val/")}
        if val:
            out.append({"step": step - 1, **val})
    try:
        summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        summary = None
    if isinstance(summary, dict) and isinstance(summary.get("final_validation"), dict) \
            and _number(summary.get("steps")) is not None:
        out.append({"step": summary["steps"], **summary["final_validation"]})
    return out


def series(records: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[int, float]:
    """``step -> value`` of the first of ``keys`` that the run logged (non-finite values left out)."""
    for key in keys:
        points = {int(r["step"]): v for r in records if (v := _number(r.get(key))) is not None}
        if points:
            return points
    return {}


def mean_band(per_seed: list[dict[int, float]]) -> tuple[list[int], list[float], list[float]]:
    """Steps, the mean over the seeds that logged each step, and the standard deviation (0 for one seed)."""
    steps = sorted({s for points in per_seed for s in points})
    means, stds = [], []
    for step in steps:
        values = [points[step] for points in per_seed if step in points]
        mu = sum(values) / len(values)
        var = sum((v - mu) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
        means.append(mu)
        stds.append(math.sqrt(var))
    return steps, means, stds


def validation_splits(configs: list[Configuration]) -> list[str]:
    """The validation splits any run logged: ``""`` for the training env, then the others' names, sorted."""
    names = set()
    for config in configs:
        for records in config.records:
            for record in records:
                for key in record:
                    match = _VAL_KEY.match(key)
                    if match:
                        names.add(match.group("split") or "")
    return sorted(names, key=lambda n: (n != "", n))


def plot_runs(paths: list[str | os.PathLike[str]], output: str | os.PathLike[str], *, labels: list[str] | None = None,
              title: str | None = None) -> Path:
    """Draw the panels for ``paths`` (see the module docstring) into ``output`` (PNG, PDF or SVG by its suffix);
    returns the written path. Raises ``ValueError`` for bad arguments."""
    out = Path(output)
    if out.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise ValueError(f"invalid argument -o {str(output)!r}: expected a file name ending in .png, .pdf or .svg")
    configs = find_configurations(paths, labels)
    # matplotlib loads only when a figure is drawn: the other commands of ragen-trainer start without it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = validation_splits(configs)
    panels: list[tuple[str, str, list[tuple[tuple[str, ...], str]]]] = [
        ("success", "success rate", [((KEY_SUCCESS,), "train")] + [
            ((f"val/{s}/success" if s else "val/success",), f"val {s}" if s else "val") for s in splits]),
    ]
    panels += [(name, ylabel, [(keys, "")]) for name, ylabel, keys in PANELS]
    panels = [p for p in panels if any(series(rec, keys) for c in configs for rec in c.records for keys, _ in p[2])]
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    styles = ["-", "--", ":", "-."]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (name, ylabel, lines) in zip(axes.flat, panels):
        for c_index, config in enumerate(configs):
            colour = colours[c_index % len(colours)]
            for l_index, (keys, line_name) in enumerate(lines):
                steps, means, stds = mean_band([series(rec, keys) for rec in config.records])
                if not steps:
                    continue
                if len(configs) == 1:  # one configuration: the lines are named by what they show
                    label = line_name or name
                else:
                    label = f"{config.label}: {line_name}" if line_name else config.label
                ax.plot(steps, means, styles[l_index % len(styles)], color=colour, label=label,
                        marker="o" if len(steps) <= 12 else None, markersize=3)
                if len(config.runs) > 1:
                    ax.fill_between(steps, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)],
                                    color=colour, alpha=0.15, linewidth=0)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, names = [], []
    for ax in axes.flat:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            if name not in names:
                handles.append(handle)
                names.append(name)
    fig.legend(handles, names, loc="lower center", ncol=min(3, max(1, len(names))), fontsize=8, frameon=False)
    band = "mean over seeds, band: ±1 s.d." if any(len(c.runs) > 1 for c in configs) else "one run each"
    fig.suptitle(f"{title} ({band})" if title else band, fontsize=10)
    legend_rows = math.ceil(len(names) / 3)
    fig.tight_layout(rect=(0, min(0.45, 0.035 * legend_rows / rows + 0.02), 1, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{out.suffix}")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, out)  # a reader sees the old figure or the new one
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


__all__ = ["Configuration", "find_configurations", "mean_band", "plot_runs", "series", "validation_splits"]
