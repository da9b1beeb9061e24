"""The RAGEN paper's findings, reproduced at small scale: one command per experiment, curves as JSON and PNG.

Each experiment is a list of ``ragen-trainer`` runs (the same code path as ``ragen-trainer train``) on the same seeds,
played one after the other; their per-step metrics (``metrics.jsonl``) are gathered into
``<out>/<experiment>-<env>.json`` and drawn into ``<out>/<experiment>-<env>.png`` (the curves that show the
experiment's finding), with the Echo Trap monitor's warnings marked on the curves. A run already finished in
``--runs`` is read back instead of trained again (delete its folder to redo it), so an interrupted experiment resumes
where it stopped.

    python benchmarks/reproduce.py echo-trap                  # Bandit: vanilla PPO, vanilla GRPO, StarPO-S + filter sweep
    python benchmarks/reproduce.py echo-trap --env ragen/FrozenLake-v0 --max-new-tokens 48
    python benchmarks/reproduce.py echo-trap --model Qwen/Qwen2.5-0.5B-Instruct --engine vllm \\
        --engine-url http://127.0.0.1:8000 --groups 8 --group-size 16 --steps 200 --lr 1e-6 --max-new-tokens 400 \\
        --enable-think true
    python benchmarks/reproduce.py reasoning                  # FrozenLake: outcome reward vs grounding reward, thinking
    python benchmarks/reproduce.py rollout-shape              # FrozenLake: 1..7 actions per turn, fresh vs stale

Experiments (each has its own default env and reply budget; ``--env`` and ``--max-new-tokens`` override them):

* ``echo-trap`` (Finding 1; Bandit, 8 tokens per reply): vanilla StarPO with the PPO backbone (``ppo``) and the GRPO
  backbone (``grpo``) against StarPO-S (``starpo-s``), plus the filter-ratio sweep of the PPO backbone (keep 1.0 =
  ``ppo``, 0.75, 0.5, 0.25). Curves: training success, in-group reward std, entropy, gradient norm, share of
  distinct replies.
* ``reasoning`` (Finding 3; FrozenLake, 64 tokens per reply): StarPO-S (``starpo-s``) with thinking on and the
  outcome reward only (``think-outcome``), with thinking on and the reasoning-grounding reward added
  (``think-grounding``: :class:`~ragen_envs.rewards.ReasoningGroundingReward` at its default weight 1), and with
  thinking off (``no-think-outcome``). Every run wraps the env in the grounding wrapper: the outcome-only runs at
  ``weight: 0``, where it changes no reward and only *measures* how many claims each turn's ``<think>`` makes about
  the state it saw that are true (supported) or false (contradicted, the paper's "hallucinated" reasoning). Thinking
  off has no grounding-reward twin: the wrapper pays nothing for a reply without thinking, so that run would train on
  the same rewards as ``no-think-outcome``. Each run's own ``enable_think`` wins over ``--enable-think``. Curves:
  thinking length (tokens of ``<think>`` per turn), supported and contradicted claims per turn, training success,
  format errors (a small model with thinking on often fails to close its reply within the budget; this panel tells
  that apart from thinking that shrinks). The paper's claim: with the outcome reward alone thinking shrinks or stops
  matching the state; the grounding reward keeps it grounded.
* ``rollout-shape`` (Finding 2; FrozenLake, 32 tokens per reply, thinking off as ``--enable-think``): StarPO-S with
  ``actions_per_turn`` 1..7 (``actions-1`` .. ``actions-7``; the episode keeps the env's 5 turns and its 10-action
  budget, so 1 or 2 actions per turn cannot spend the budget: the paper's granularity trade-off), and fresh against
  stale rollouts. *Fresh* is ``actions-5`` (the reference's 5 actions per turn): new rollouts for every update pass.
  *Stale* (``stale-3x``) is the same run with ``ppo_epochs: 3`` and a third of the training steps: each rollout batch
  is used for 3 passes of PPO updates before new rollouts are drawn (the paper's rollouts refreshed every 3 updates
  rather than every update), so both runs make the same number of update passes and the stale run sees a third of
  the rollouts. The 2nd and 3rd passes train on rollouts of a policy that has since changed, against the log-probs,
  critic values and advantages computed when the batch was drawn, with PPO's clipping bounding the drift
  (``policy/clipfrac`` shows it); the filter picks its groups once per batch. The x axis of this experiment's curves is
  update passes (training steps x ``ppo_epochs``), so fresh and stale line up. Curves: training success, reward,
  in-group reward std, format errors (more actions need more tokens), clip fraction.

Scale. The CPU defaults of ``echo-trap`` (SmolLM2-135M, 8 initial states x 4 rollouts, 15 steps, validation on 32
states every 5 steps, thinking off and 8 tokens per reply as the quickstart's Bandit run -- with thinking on, the 135M
model rarely closes its answer within a CPU-sized token budget, so every reply would earn the same format penalty and
nothing would be learned --, learning rate 5e-5 and 10x for the critic as in the reference's 1e-6 / 1e-5, PPO
mini-batches of a quarter of the batch as the reference's 32 of 128) make it about 1.5 hours on a 2-core CPU
(measured: 65 minutes for five of its six runs; ``ppo-keep-0.75``, 3 updates a step, about 2 to 4 minutes a step).
The two FrozenLake experiments play five-turn episodes with longer replies, so their defaults are smaller
(:data:`_MULTI_TURN_SCALE`: 4 initial states x 4 rollouts, 6 steps, validation on 8 states every 3 steps):
``reasoning`` took about 50 minutes (measured: 17-18 minutes a run); ``rollout-shape`` takes 12-16 minutes per
``actions-k`` run and about 8 for ``stale-3x`` (measured), so all eight runs take about 1.8 hours and the documented
subset (``--only actions-1 actions-3 actions-5 actions-7 stale-3x``) about an hour. Their reply budgets are the smallest
that fit a short thought and an answer (64) or seven actions (32). A run uses up to ~15 GB of memory: run one
experiment at a time. All of it was fixed before any result was seen and is the same for every run of an experiment; nothing here is
tuned toward the paper's curves. ``--groups``, ``--steps``, ``--val-every`` and ``--val-groups`` change the scale.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: Curves of ``echo-trap`` (Finding 1): metric key -> panel title.
CURVES: dict[str, str] = {
    "success_rate": "training success",
    "reward/in_group_std": "in-group reward std",
    "policy/entropy": "entropy",
    "optim/grad_norm": "gradient norm (policy)",
    "diversity/unique_reply_share": "distinct replies",
}

#: Curves of ``reasoning`` (Finding 3).
REASONING_CURVES: dict[str, str] = {
    "response/thinking_length": "thinking length (tokens per turn)",
    "grounding/supported_claims": "supported claims per turn",
    "grounding/contradicted_claims": "contradicted claims per turn",
    "success_rate": "training success",
    "actions/format_error_rate": "format errors per turn",
}

#: Curves of ``rollout-shape`` (Finding 2).
ROLLOUT_SHAPE_CURVES: dict[str, str] = {
    "success_rate": "training success",
    "reward/mean": "reward",
    "reward/in_group_std": "in-group reward std",
    "actions/format_error_rate": "format errors per turn",
    "policy/clipfrac": "clip fraction",
}

#: Gathered into every experiment's JSON besides its curves (the summary table reads the first three).
ALWAYS_KEPT: tuple[str, ...] = ("success_rate", "reward/in_group_std", "val/success", "policy/clipfrac",
                                "filter/kept_ratio", "response/thinking_length")  # fmt: skip

#: ``rollout-shape``: the fresh run's actions per turn (the reference's), and the update passes per rollout batch of
#: the stale run.
FRESH_ACTIONS_PER_TURN = 5
STALE_PASSES = 3


@dataclass
class Run:
    """One training run of an experiment: a preset and the fields it changes."""

    name: str
    preset: str
    changes: dict[str, Any] = field(default_factory=dict)


def echo_trap_runs(args: argparse.Namespace | None = None) -> list[Run]:
    """Finding 1: vanilla PPO and GRPO against StarPO-S, and the filter-ratio sweep of the PPO backbone."""
    runs = [Run("ppo", "ppo"), Run("grpo", "grpo"), Run("starpo-s", "starpo-s")]
    runs += [Run(f"ppo-keep-{ratio}", "ppo", {"filter_ratio": ratio}) for ratio in (0.75, 0.5, 0.25)]
    return runs


def grounding_wrapper(weight: float | None) -> dict[str, Any]:
    """``env_kwargs`` that wrap the env in the reasoning-grounding reward; ``weight=0`` measures without rewarding,
    ``None`` keeps the wrapper's default weight."""
    spec: dict[str, Any] = {"name": "grounding"}
    if weight is not None:
        spec["weight"] = weight
    return {"reward_wrappers": [spec]}


def reasoning_runs(args: argparse.Namespace | None = None) -> list[Run]:
    """Finding 3: thinking with the outcome reward only (grounding measured at weight 0), thinking with the grounding
    reward, and no thinking; all StarPO-S on the same seeds."""

    def run(name: str, think: bool, weight: float | None) -> Run:
        return Run(name, "starpo-s", {"protocol": {"enable_think": think}, "env_kwargs": grounding_wrapper(weight)})

    return [run("think-outcome", True, 0.0), run("think-grounding", True, None), run("no-think-outcome", False, 0.0)]


def rollout_shape_runs(args: argparse.Namespace) -> list[Run]:
    """Finding 2: 1..7 actions per turn, and fresh rollouts (``actions-5``) against rollouts reused for
    :data:`STALE_PASSES` update passes (``ppo_epochs``) over a third of the steps, so both make as many passes."""
    runs = [Run(f"actions-{k}", "starpo-s", {"protocol": {"actions_per_turn": k}}) for k in range(1, 8)]
    stale = {"protocol": {"actions_per_turn": FRESH_ACTIONS_PER_TURN}, "ppo_epochs": STALE_PASSES,
             "total_steps": max(1, args.steps // STALE_PASSES)}  # fmt: skip
    runs.append(Run(f"stale-{STALE_PASSES}x", "starpo-s", stale))
    return runs


@dataclass(frozen=True)
class Experiment:
    """One experiment: the runs it trains, the defaults that fit them, and the curves that show its finding."""

    runs: Callable[[argparse.Namespace], list[Run]]
    env: str
    """Default env id (``--env`` overrides)."""
    max_new_tokens: int
    """Default tokens per reply (``--max-new-tokens`` overrides)."""
    curves: dict[str, str]
    """Metric key -> panel title, drawn for every run."""
    x_key: str = "step"
    """The curves' x axis: ``step`` (training steps) or ``update_passes`` (steps x ``ppo_epochs``)."""
    scale: dict[str, int] = field(default_factory=dict)
    """Defaults of ``--groups``, ``--steps``, ``--val-every``, ``--val-groups`` (options not named here take
    :data:`DEFAULT_SCALE`'s): what fits the experiment's runs into about an hour on a 2-core CPU."""


#: The CPU scale of an experiment unless it sets its own (:attr:`Experiment.scale`) or the command line does.
DEFAULT_SCALE: dict[str, int] = {"groups": 8, "steps": 15, "val_every": 5, "val_groups": 32}

#: The multi-turn experiments' CPU scale: 4 initial states x 4 rollouts, 6 steps, validation on 8 states every 3
#: steps. Set before any of their runs, from the measured cost of the Bandit runs, so that each experiment takes about
#: an hour on 2 cores; not tuned on results.
_MULTI_TURN_SCALE: dict[str, int] = {"groups": 4, "steps": 6, "val_every": 3, "val_groups": 8}

EXPERIMENTS: dict[str, Experiment] = {
    "echo-trap": Experiment(echo_trap_runs, "ragen/Bandit-v0", 8, CURVES),
    "reasoning": Experiment(reasoning_runs, "ragen/FrozenLake-v0", 64, REASONING_CURVES, scale=_MULTI_TURN_SCALE),
    "rollout-shape": Experiment(
        rollout_shape_runs, "ragen/FrozenLake-v0", 32, ROLLOUT_SHAPE_CURVES, x_key="update_passes",
        scale=_MULTI_TURN_SCALE,
    ),
}

#: Config fields that are dicts: a run's entries are merged into the scale's rather than replacing the whole dict.
_MERGED_FIELDS = ("protocol", "env_kwargs")


def merged_changes(scale: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The experiment's scale with a run's changes on top: the run wins field by field, and inside ``protocol`` and
    ``env_kwargs`` setting by setting (a run's ``enable_think`` replaces ``--enable-think``, the rest stays)."""
    out = {**scale, **changes}
    for key in _MERGED_FIELDS:
        if isinstance(scale.get(key), dict) and isinstance(changes.get(key), dict):
            out[key] = {**scale[key], **changes[key]}
    return out


def run_config(run: Run, args: argparse.Namespace, output_dir: Path) -> Any:
    """The run's :class:`~ragen_trainer.config.StarPOConfig`: its preset, the experiment's scale, its changes."""
    from ragen_trainer.config import load_config

    batch = args.groups * args.group_size
    scale: dict[str, Any] = {
        "env_id": args.env,
        "model": args.model,
        "engine": args.engine,
        "engine_url": args.engine_url,
        "seed": args.seed,
        "total_steps": args.steps,
        "env_groups": args.groups,
        "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens,
        "protocol": {"enable_think": args.enable_think},
        "actor_lr": args.lr,
        "critic_lr": args.lr * 10,
        "ppo_mini_batch_size": max(1, batch // 4),
        "micro_batch_size": args.micro_batch_size,
        "val_every": args.val_every,
        "val_groups": args.val_groups,
        "save_steps": 0,
        "report_to": ["jsonl"],
        "output_dir": str(output_dir),
        "resume": False,
    }
    if args.lora_rank:
        scale["lora_rank"] = args.lora_rank
    return load_config(run.preset).replace(**merged_changes(scale, run.changes)).validate()


def finished(folder: Path) -> bool:
    """Whether the run in ``folder`` ended by itself (an interrupted run also writes a summary: it is trained again)."""
    summary = folder / "summary.json"
    if not summary.is_file():
        return False
    try:
        return not json.loads(summary.read_text()).get("interrupted", False)
    except (OSError, ValueError):
        return False


def train(run: Run, args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    """Train ``run`` into ``folder`` (or read it back if it finished before); its metric rows."""
    from ragen_trainer.cli import train_from_config
    from ragen_trainer.monitor import read_metrics

    if not finished(folder):
        cfg = run_config(run, args, folder)
        status = train_from_config(cfg, overwrite=True)
        if status != 0:
            raise SystemExit(f"run {run.name} failed with status {status}")
    return read_metrics(folder / "metrics.jsonl")


def curves(
    rows: list[dict[str, Any]], keys: dict[str, str] | tuple[str, ...], passes_per_step: int = 1
) -> dict[str, Any]:
    """Per-step values of ``keys`` and of :data:`ALWAYS_KEPT`, the update passes done by each step's end (steps x
    ``passes_per_step``, the run's ``ppo_epochs``), and the steps where the monitor warned."""
    steps = [int(r["step"]) for r in rows]
    out: dict[str, Any] = {"step": steps, "update_passes": [s * passes_per_step for s in steps]}
    for key in dict.fromkeys((*keys, *ALWAYS_KEPT)):  # ordered, without repeats
        out[key] = [r.get(key) for r in rows]
    out["warnings"] = [{"step": int(r["step"]), "messages": r["warnings"]} for r in rows if r.get("warnings")]
    return out


def plot(experiment: Experiment, results: dict[str, Any], path: Path, title: str) -> None:
    """One panel per curve of ``experiment``, one line per run, open triangles where the monitor warned."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = experiment.curves
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False)
    axes = axes[0]
    x_label = "update passes (steps x ppo_epochs)" if experiment.x_key == "update_passes" else "step"
    for name, data in results["runs"].items():
        warned = {w["step"] for w in data["warnings"]}
        for ax, (key, label) in zip(axes, panels.items()):
            points = [(x, v, s) for x, v, s in zip(data[experiment.x_key], data[key], data["step"])
                      if v is not None and math.isfinite(v)]  # fmt: skip
            if not points:
                continue
            (line,) = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=2,
                              linewidth=1.2, label=name)  # fmt: skip
            marks = [(x, v) for x, v, s in points if s in warned]
            if marks:  # the Echo Trap monitor's warnings: open triangles on every panel
                ax.plot(*zip(*marks), linestyle="none", marker="^", markersize=7, markerfacecolor="none",
                        color=line.get_color())  # fmt: skip
            ax.set_title(label, fontsize=10)
            ax.set_xlabel(x_label)
    axes[0].legend(fontsize=7)
    fig.suptitle(title + "  (^ = Echo Trap monitor warning)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mean(values: list[Any], part: slice) -> str:
    """The mean of the non-missing ``values[part]`` to 3 decimals, ``-`` when there are none."""
    kept = [v for v in values[part] if v is not None]
    return f"{sum(kept) / len(kept):.3f}" if kept else "-"


def summary_table(results: dict[str, Any]) -> str:
    """Markdown: per run, success at the start / best / end, in-group std start / end, first warning step."""
    header = ("| run | success first 3 steps | best | last 3 steps | in-group std first 3 | last 3 "
              "| val success (first, last) | first warning |")  # fmt: skip
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for name, data in results["runs"].items():
        succ = [v for v in data["success_rate"] if v is not None]
        val = [v for v in data["val/success"] if v is not None]
        first_warning = data["warnings"][0]["step"] if data["warnings"] else "-"
        lines.append(
            f"| {name} | {_mean(data['success_rate'], slice(0, 3))} | {f'{max(succ):.3f}' if succ else '-'} | "
            f"{_mean(data['success_rate'], slice(-3, None))} | {_mean(data['reward/in_group_std'], slice(0, 3))} | "
            f"{_mean(data['reward/in_group_std'], slice(-3, None))} | "
            f"{(f'{val[0]:.3f}, {val[-1]:.3f}') if val else '-'} | {first_warning} |"
        )
    return "\n".join(lines)


def curve_table(results: dict[str, Any], keys: dict[str, str]) -> str:
    """Markdown: per run, each of the experiment's curves averaged over its first 3 and last 3 steps."""
    header = "| run | " + " | ".join(f"{label} (first 3 -> last 3)" for label in keys.values()) + " |"
    lines = [header, "|---|" + "---|" * len(keys)]
    for name, data in results["runs"].items():
        cells = [f"{_mean(data[k], slice(0, 3))} -> {_mean(data[k], slice(-3, None))}" for k in keys]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", choices=sorted(EXPERIMENTS))
    parser.add_argument("--env", default=None,
                        help="env id (default: the experiment's: echo-trap ragen/Bandit-v0, reasoning and "
                             "rollout-shape ragen/FrozenLake-v0)")  # fmt: skip
    parser.add_argument("--model", default="smollm2", help="model (default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--engine", default="hf", choices=["hf", "hf-generate", "vllm"])
    parser.add_argument("--engine-url", default="", help="vLLM server URL for --engine vllm")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps per run (default: the experiment's: echo-trap 15, the others 6)")
    parser.add_argument("--groups", type=int, default=None,
                        help="initial states per step P (default: the experiment's: echo-trap 8, the others 4)")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per state N (default %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="tokens per reply (default: the experiment's: echo-trap 8, reasoning 64, "
                             "rollout-shape 32)")  # fmt: skip
    parser.add_argument("--enable-think", type=lambda t: t.lower() in ("1", "true", "yes"), default=False,
                        help="thinking on (true) or off (default false; the paper: true); the reasoning "
                             "experiment's runs set it themselves")  # fmt: skip
    parser.add_argument("--lr", type=float, default=5e-5, help="actor learning rate; critic 10x (default %(default)s)")
    parser.add_argument("--lora-rank", type=int, default=0, help="> 0: train a LoRA adapter of this rank")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--val-every", type=int, default=None,
                        help="validate every this many steps (default: the experiment's: echo-trap 5, the others 3)")
    parser.add_argument("--val-groups", type=int, default=None,
                        help="initial states of each validation (default: the experiment's: echo-trap 32, the "
                             "others 8)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", default="runs/reproduce", help="folder of the training runs (default %(default)s)")
    parser.add_argument("--out", default="docs/reproduction", help="folder for the JSON and PNG (default %(default)s)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these runs of the experiment (by name)")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the experiment's own defaults filled in where ``--env`` / ``--max-new-tokens`` were
    not given."""
    args = build_parser().parse_args(argv)
    experiment = EXPERIMENTS[args.experiment]
    if args.env is None:
        args.env = experiment.env
    if args.max_new_tokens is None:
        args.max_new_tokens = experiment.max_new_tokens
    for name, default in {**DEFAULT_SCALE, **experiment.scale}.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    experiment = EXPERIMENTS[args.experiment]
    runs = experiment.runs(args)
    if args.only:
        unknown = sorted(set(args.only) - {r.name for r in runs})
        if unknown:
            build_parser().error(f"unknown run(s) {unknown}; this experiment has {[r.name for r in runs]}")
        runs = [r for r in runs if r.name in args.only]
    env_name = args.env.removeprefix("ragen/").removesuffix("-v0")
    tag = f"{args.experiment}-{env_name.lower()}"
    results: dict[str, Any] = {
        "experiment": args.experiment,
        "command": " ".join(["python", "benchmarks/reproduce.py", *(argv if argv is not None else sys.argv[1:])]),
        "settings": {k: v for k, v in vars(args).items() if k not in ("only",)},
        "curves": experiment.curves,
        "x": experiment.x_key,
        "runs": {},
        "seconds": {},
    }
    for i, run in enumerate(runs, 1):
        print(f"== [{i}/{len(runs)}] {args.experiment} on {args.env}: {run.name} ({run.preset} {run.changes or ''})",
              flush=True)  # fmt: skip
        started = time.perf_counter()
        folder = Path(args.runs) / tag / run.name
        rows = train(run, args, folder)
        passes = run_config(run, args, folder).ppo_epochs
        results["runs"][run.name] = curves(rows, experiment.curves, passes)
        results["seconds"][run.name] = round(time.perf_counter() - started, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{tag}.json").write_text(json.dumps(results, indent=1))
    plot(experiment, results, out / f"{tag}.png", f"{args.experiment}, {args.env}, {args.model}")
    print()
    print(summary_table(results))
    print()
    print(curve_table(results, experiment.curves))
    print(f"\nwrote {out / (tag + '.json')} and {out / (tag + '.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
