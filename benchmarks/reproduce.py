"""The RAGEN paper's findings, reproduced at small scale: one command per experiment, curves as JSON and PNG.

Each experiment is a list of ``ragen-trainer`` runs (the same code path as ``ragen-trainer train``) on the same seeds,
played one after the other; their per-step metrics (``metrics.jsonl``) are gathered into
``<out>/<experiment>.json`` and drawn into ``<out>/<experiment>.png``, with the Echo Trap monitor's warnings marked
on the curves. A run already finished in ``--runs`` is read back instead of trained again (delete its folder to
redo it), so an interrupted experiment resumes where it stopped.

    python benchmarks/reproduce.py echo-trap                  # Bandit: vanilla PPO, vanilla GRPO, StarPO-S + filter sweep
    python benchmarks/reproduce.py echo-trap --env ragen/FrozenLake-v0 --steps 20
    python benchmarks/reproduce.py echo-trap --model Qwen/Qwen2.5-0.5B-Instruct --engine vllm \\
        --engine-url http://127.0.0.1:8000 --groups 8 --group-size 16 --steps 200 --lr 1e-6 --max-new-tokens 400

Experiments:

* ``echo-trap`` (Finding 1): vanilla StarPO with the PPO backbone (``ppo``) and the GRPO backbone (``grpo``) against
  StarPO-S (``starpo-s``), plus the filter-ratio sweep of the PPO backbone (keep 1.0 = ``ppo``, 0.75, 0.5, 0.25).
  Curves: training success, in-group reward std, entropy, gradient norm, share of distinct replies.

Scale. The CPU defaults (SmolLM2-135M, 8 initial states x 4 rollouts, thinking on, 32 tokens per reply, learning rate
5e-5 and 10x for the critic as in the reference's 1e-6 / 1e-5, PPO mini-batches of a quarter of the batch as the
reference's 32 of 128) keep one experiment within about an hour on a 2-core CPU. They are fixed before any result was
seen and are the same for every run of an experiment; nothing here is tuned toward the paper's curves.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: Curves drawn for every run: metric key -> panel title.
CURVES: dict[str, str] = {
    "success_rate": "training success",
    "reward/in_group_std": "in-group reward std",
    "policy/entropy": "entropy",
    "optim/grad_norm": "gradient norm (policy)",
    "diversity/unique_reply_share": "distinct replies",
}


@dataclass
class Run:
    """One training run of an experiment: a preset and the fields it changes."""

    name: str
    preset: str
    changes: dict[str, Any] = field(default_factory=dict)


def echo_trap_runs() -> list[Run]:
    """Finding 1: vanilla PPO and GRPO against StarPO-S, and the filter-ratio sweep of the PPO backbone."""
    runs = [Run("ppo", "ppo"), Run("grpo", "grpo"), Run("starpo-s", "starpo-s")]
    runs += [Run(f"ppo-keep-{ratio}", "ppo", {"filter_ratio": ratio}) for ratio in (0.75, 0.5, 0.25)]
    return runs


EXPERIMENTS = {"echo-trap": echo_trap_runs}


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
    return load_config(run.preset).replace(**scale, **run.changes).validate()


def train(run: Run, args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    """Train ``run`` into ``folder`` (or read it back if it finished before); its metric rows."""
    from ragen_trainer.cli import train_from_config
    from ragen_trainer.monitor import read_metrics

    summary = folder / "summary.json"
    if not summary.is_file():
        cfg = run_config(run, args, folder)
        status = train_from_config(cfg, overwrite=True)
        if status != 0:
            raise SystemExit(f"run {run.name} failed with status {status}")
    return read_metrics(folder / "metrics.jsonl")


def curves(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-step values of :data:`CURVES` and the validation success, and the steps where the monitor warned."""
    out: dict[str, Any] = {"step": [int(r["step"]) for r in rows]}
    for key in (*CURVES, "val/success", "policy/clipfrac", "filter/kept_ratio", "response/thinking_length"):
        out[key] = [r.get(key) for r in rows]
    out["warnings"] = [{"step": int(r["step"]), "messages": r["warnings"]} for r in rows if r.get("warnings")]
    return out


def plot(experiment: str, results: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(4 * len(CURVES), 3.6))
    for name, data in results["runs"].items():
        for ax, (key, label) in zip(axes, CURVES.items()):
            points = [(s, v) for s, v in zip(data["step"], data[key]) if v is not None and math.isfinite(v)]
            if not points:
                continue
            (line,) = ax.plot(*zip(*points), marker="o", markersize=2, linewidth=1.2, label=name)
            warned = {w["step"] for w in data["warnings"]}
            marks = [(s, v) for s, v in points if s in warned]
            if marks:  # the Echo Trap monitor's warnings: open triangles on every panel
                ax.plot(*zip(*marks), linestyle="none", marker="^", markersize=7, markerfacecolor="none",
                        color=line.get_color())  # fmt: skip
            ax.set_title(label, fontsize=10)
            ax.set_xlabel("step")
    axes[0].legend(fontsize=7)
    fig.suptitle(title + "  (^ = Echo Trap monitor warning)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_table(results: dict[str, Any]) -> str:
    """Markdown: per run, success at the start / best / end, in-group std start / end, first warning step."""
    lines = ["| run | success first 3 steps | best | last 3 steps | in-group std first 3 | last 3 | val success (first, last) "
             "| first warning |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, data in results["runs"].items():
        def mean(key: str, part: slice, _data: dict[str, Any] = data) -> str:
            values = [v for v in _data[key][part] if v is not None]
            return f"{sum(values) / len(values):.3f}" if values else "-"

        succ = [v for v in data["success_rate"] if v is not None]
        val = [v for v in data["val/success"] if v is not None]
        first_warning = data["warnings"][0]["step"] if data["warnings"] else "-"
        lines.append(
            f"| {name} | {mean('success_rate', slice(0, 3))} | {max(succ) if succ else '-':.3f} | "
            f"{mean('success_rate', slice(-3, None))} | {mean('reward/in_group_std', slice(0, 3))} | "
            f"{mean('reward/in_group_std', slice(-3, None))} | "
            f"{(f'{val[0]:.3f}, {val[-1]:.3f}') if val else '-'} | {first_warning} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", choices=sorted(EXPERIMENTS))
    parser.add_argument("--env", default="ragen/Bandit-v0", help="env id (default %(default)s)")
    parser.add_argument("--model", default="smollm2", help="model (default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--engine", default="hf", choices=["hf", "hf-generate", "vllm"])
    parser.add_argument("--engine-url", default="", help="vLLM server URL for --engine vllm")
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (default %(default)s)")
    parser.add_argument("--groups", type=int, default=8, help="initial states per step P (default %(default)s)")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per state N (default %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per reply (default %(default)s)")
    parser.add_argument("--lr", type=float, default=5e-5, help="actor learning rate; critic 10x (default %(default)s)")
    parser.add_argument("--lora-rank", type=int, default=0, help="> 0: train a LoRA adapter of this rank")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--val-every", type=int, default=5)
    parser.add_argument("--val-groups", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", default="runs/reproduce", help="folder of the training runs (default %(default)s)")
    parser.add_argument("--out", default="docs/reproduction", help="folder for the JSON and PNG (default %(default)s)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these runs of the experiment (by name)")
    args = parser.parse_args(argv)

    runs = EXPERIMENTS[args.experiment]()
    if args.only:
        unknown = sorted(set(args.only) - {r.name for r in runs})
        if unknown:
            parser.error(f"unknown run(s) {unknown}; this experiment has {[r.name for r in runs]}")
        runs = [r for r in runs if r.name in args.only]
    env_name = args.env.removeprefix("ragen/").removesuffix("-v0")
    tag = f"{args.experiment}-{env_name.lower()}"
    results: dict[str, Any] = {
        "experiment": args.experiment,
        "command": " ".join(["python", "benchmarks/reproduce.py", *(argv if argv is not None else sys.argv[1:])]),
        "settings": {k: v for k, v in vars(args).items() if k not in ("only",)},
        "runs": {},
        "seconds": {},
    }
    for i, run in enumerate(runs, 1):
        print(f"== [{i}/{len(runs)}] {args.experiment} on {args.env}: {run.name} ({run.preset} {run.changes or ''})",
              flush=True)  # fmt: skip
        started = time.perf_counter()
        rows = train(run, args, Path(args.runs) / tag / run.name)
        results["runs"][run.name] = curves(rows)
        results["seconds"][run.name] = round(time.perf_counter() - started, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{tag}.json").write_text(json.dumps(results, indent=1))
    plot(args.experiment, results, out / f"{tag}.png", f"{args.experiment}, {args.env}, {args.model}")
    print()
    print(summary_table(results))
    print(f"\nwrote {out / (tag + '.json')} and {out / (tag + '.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
