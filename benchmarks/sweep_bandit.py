"""Why does the main job collapse? Sweeps on Bandit around the main job's settings, every run listed.

The main job (``scripts/main.sh``) trains StarPO-S on ``ragen/Bandit-v0`` with the bundled SmolLM2-135M-Instruct: 4
initial states x 8 rollouts, no ``<think>``, 8 tokens a reply, micro-batches of 8. This script varies one thing at a
time around those settings, each value with several seeds, and trains every run through ``ragen-trainer train`` in a
subprocess (``OMP_NUM_THREADS=1`` each, ``--jobs`` at once):

* ``lr``: StarPO-S at actor learning rates 5e-5 (the shipped main job), 2e-5, 1e-5 and 5e-6;
* ``keep``: StarPO-S at keep ratios 0.5 and 0.25, at 5e-5 (``keep-1.0``: 1.0, trained only when named);
* ``algo``: vanilla PPO (``ppo``: critic, no filter, clip 0.2/0.2, KL 0.001 in the reward), StarPO-S and vanilla GRPO
  (``grpo``: no critic, no filter, KL loss 0.001), at 5e-5. At 4 x 8 rollouts and PPO mini-batches of 32 every run
  makes exactly one update per step (StarPO-S keeps 8 trajectories, the others 32), so the learning rate and the
  update count are the same across the three: only the method differs (the Echo Trap contrast, one cause at a time);
* ``algo-1e-5``, ``keep-1e-5``: the same at 1e-5 (trained only when named with ``--only``);
* ``dtype``: the learning rate that learns (StarPO-S at 5e-6, ``lr``'s last runs) with ``--dtype bfloat16`` (autocast
  of the rollout, scoring and update passes; float32 master weights): whether the faster numerics change what is
  learnt (trained only when named with ``--only``; its float32 side is ``lr``'s ``starpo-s-lr5e-06``).

Runs that share a configuration train once (StarPO-S at 5e-5, keep 0.25 is in all three). A run whose ``summary.json``
says it finished is read back, not trained again; an interrupted one resumes from its checkpoint (the trainer's own
resume), so ``run`` can be repeated until everything is done. After a run its weights are deleted (its metrics, config
and summary stay): the sweep keeps curves, not models.

    python benchmarks/sweep_bandit.py run --jobs 2                 # every run (resumable)
    python benchmarks/sweep_bandit.py run --only lr --seeds 0 1 2  # one experiment
    python benchmarks/sweep_bandit.py report                       # the table (Markdown + JSON) of every run
    python benchmarks/sweep_bandit.py list                         # the runs and their commands

``report`` writes ``docs/sweeps/bandit.md`` (every run: validation success on Bandit at step 0 and at the end, the
training success, the share of distinct replies and the reply entropy at the end, the step the replies collapsed)
and ``docs/sweeps/bandit.json``; the figures are drawn with ``ragen-trainer plot``. A run the report already lists
whose folder is gone (a fresh machine) keeps its row, read back from ``bandit.json``, and the table says so.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's root, for benchmarks.*
from benchmarks.run_queue import Job, parse_queue_args, prune_weights, queue_parser, run_finished, run_jobs

#: The main job's settings (scripts/main.sh), which every run shares.
BASE_ARGS: tuple[str, ...] = (
    "--env", "ragen/Bandit-v0", "--model", "smollm2", "--enable_think", "false", "--max_new_tokens", "8",
    "--env_groups", "4", "--group_size", "8", "--micro_batch_size", "8",
)
STEPS = 20
VAL_EVERY = 5
VAL_GROUPS = 64
SEEDS = (0, 1, 2)

#: A run's configuration: (preset, actor_lr, keep ratio, compute dtype). ``None`` keeps the preset's own keep ratio.
Setting = tuple[str, float, float | None, str]
FP32, BF16 = "float32", "bfloat16"

#: The experiments: name -> the settings it compares (one thing varied at a time).
EXPERIMENTS: dict[str, list[Setting]] = {
    "lr": [("starpo-s", lr, None, FP32) for lr in (5e-5, 2e-5, 1e-5, 5e-6)],
    "algo": [(p, 5e-5, None, FP32) for p in ("ppo", "starpo-s", "grpo")],
    "keep": [("starpo-s", 5e-5, k, FP32) for k in (0.5, 0.25)],
    # keep 1.0 at 5e-5 (not run yet on this machine, time; `ppo` differs from it only by clip 0.2 and KL 0.001)
    "keep-1.0": [("starpo-s", 5e-5, 1.0, FP32)],
    # the same comparisons at the learning rate that learns: not run yet on this machine (time), `--only` them
    "algo-1e-5": [(p, 1e-5, None, FP32) for p in ("ppo", "starpo-s", "grpo")],
    "keep-1e-5": [("starpo-s", 1e-5, k, FP32) for k in (1.0, 0.5, 0.25)],
    "dtype": [("starpo-s", 5e-6, None, BF16)],
}
#: The experiments ``run`` trains when none is named.
DEFAULT_EXPERIMENTS = ("lr", "algo", "keep")


@dataclass(frozen=True)
class Run:
    preset: str
    lr: float
    keep: float | None
    seed: int
    dtype: str = FP32

    @property
    def label(self) -> str:
        keep = "" if self.keep is None or (self.preset == "starpo-s" and self.keep == 0.25) else f"-keep{self.keep:g}"
        dtype = "" if self.dtype == FP32 else "-bf16"
        return f"{self.preset}-lr{self.lr:g}{keep}{dtype}"

    def folder(self, root: Path) -> Path:
        return root / self.label / f"seed{self.seed}"

    def command(self, root: Path) -> list[str]:
        cmd = ["ragen-trainer", "train", "--config", self.preset, *BASE_ARGS, "--actor_lr", f"{self.lr:g}",
               "--seed", str(self.seed), "--total_steps", str(STEPS), "--val_every", str(VAL_EVERY),
               "--val_groups", str(VAL_GROUPS), "--save_steps", str(VAL_EVERY), "--save_total_limit", "1",
               "--report_to", "[console, jsonl]", "--output_dir", str(self.folder(root))]
        if self.keep is not None:
            cmd += ["--filter_ratio", f"{self.keep:g}"]
        # float32 is named, not left to `auto`: a float32 run stays float32 on a GPU that would pick bfloat16
        return cmd + ["--dtype", self.dtype]


def plan(only: list[str] | None, seeds: list[int]) -> list[Run]:
    """Every run of the chosen experiments, each configuration once, in experiment order."""
    runs: list[Run] = []
    for name, settings in EXPERIMENTS.items():
        if name not in (only or DEFAULT_EXPERIMENTS):
            continue
        for seed in seeds:
            for preset, lr, keep, dtype in settings:
                run = Run(preset, lr, None if (preset == "starpo-s" and keep == 0.25) else keep, seed, dtype)
                if run not in runs:
                    runs.append(run)
    return runs


def finished(folder: Path) -> bool:
    """True when ``folder``'s run trained all its steps."""
    return run_finished(folder, STEPS)


def jobs_of(runs: list[Run], root: Path) -> list[Job]:
    return [Job(f"{r.label}/seed{r.seed}", r.folder(root), [r.command(root)], done=partial(finished, r.folder(root)),
                after=partial(prune_weights, r.folder(root))) for r in runs]


# ------------------------------------------------------------------------------------------------------ report
def read_rows(folder: Path) -> list[dict[str, Any]]:
    rows = []
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def collapse_step(rows: list[dict[str, Any]], share: float = 0.1) -> int | None:
    """The first step from which every later step's distinct-reply share stays at or below ``share``."""
    steps = [(int(r["step"]), r.get("diversity/unique_reply_share")) for r in rows if "step" in r]
    steps = [(s, v) for s, v in steps if isinstance(v, (int, float))]
    for i, (step, _) in enumerate(steps):
        if all(v <= share for _, v in steps[i:]):
            return step
    return None


def summarise(run: Run, root: Path) -> dict[str, Any] | None:
    folder = run.folder(root)
    if not finished(folder):
        return None
    rows = read_rows(folder)
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    val = [(int(r["step"]), r["val/success"]) for r in rows if "val/success" in r]
    final_val = (summary.get("final_validation") or {}).get("val/success")
    last = rows[-1] if rows else {}
    tail = rows[-5:]

    def mean(key: str) -> float | None:
        vals = [r[key] for r in tail if isinstance(r.get(key), (int, float))]
        return sum(vals) / len(vals) if vals else None

    return {
        "label": run.label, "preset": run.preset, "actor_lr": run.lr, "keep": run.keep, "seed": run.seed,
        "val_start": val[0][1] if val else None, "val_curve": val, "val_end": final_val,
        "train_success_last5": mean("success_rate"), "format_error_last5": mean("actions/format_error_rate"),
        "unique_reply_share_last5": mean("diversity/unique_reply_share"),
        "reply_entropy_last5": mean("policy/reply_entropy"), "entropy_last5": mean("policy/entropy"),
        "collapse_step": collapse_step(rows), "minutes": (summary.get("wall_seconds") or 0) / 60,
        "last_step": last.get("step"),
    }


def fmt(value: Any, spec: str = ".2f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec) if isinstance(value, (int, float)) else str(value)


def earlier_summaries(out_json: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """The finished runs that the report already in ``out_json`` lists, per (label, seed)."""
    try:
        earlier = json.loads(out_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    runs = earlier.get("runs") if isinstance(earlier, dict) else None
    return {(r["label"], r["seed"]): r for r in runs or [] if isinstance(r, dict) and "label" in r and "seed" in r}


def reported_runs(planned: list[Run], root: Path, out_json: Path) -> list[Run]:
    """The runs a report lists: those ``planned`` (trained by this call, finished or not), every run of any experiment
    that has finished under ``root``, and every run the report in ``out_json`` already lists, in experiment order. A
    report for one experiment (``--only dtype``) so keeps every other experiment's rows."""
    earlier = earlier_summaries(out_json)
    seeds = sorted({r.seed for r in planned} | {seed for _, seed in earlier})
    keep = set(planned)
    return [r for r in plan(list(EXPERIMENTS), seeds)
            if r in keep or (r.label, r.seed) in earlier or finished(r.folder(root))]


def report(runs: list[Run], root: Path, out_md: Path, out_json: Path, console: Console) -> None:
    """Every finished run's row, and each configuration over its seeds. A run whose folder is not under ``root`` but
    which ``out_json`` already lists (trained on another machine, or its folder deleted) keeps its summary from there,
    and the table says so: a report never drops a run it once listed."""
    earlier = earlier_summaries(out_json)
    local = [summarise(r, root) for r in runs]
    carried = [f"{r.label}/seed{r.seed}" for r, s in zip(runs, local) if s is None and (r.label, r.seed) in earlier]
    rows = [s if s is not None else earlier.get((r.label, r.seed)) for r, s in zip(runs, local)]
    done = [r for r in rows if r is not None]
    missing = [f"{r.label}/seed{r.seed}" for r, s in zip(runs, rows) if s is None]
    lines = [("| run | seed | val success step 0 | val success end | train success (last 5) | format errors "
              "(last 5) | distinct replies (last 5) | reply entropy (last 5) | one reply from step | minutes |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in done:
        lines.append(f"| {r['label']} | {r['seed']} | {fmt(r['val_start'])} | {fmt(r['val_end'])} | "
                     f"{fmt(r['train_success_last5'])} | {fmt(r['format_error_last5'])} | "
                     f"{fmt(r['unique_reply_share_last5'])} | {fmt(r['reply_entropy_last5'])} | "
                     f"{fmt(r['collapse_step'], 'd') if r['collapse_step'] is not None else '-'} | "
                     f"{fmt(r['minutes'], '.1f')} |")
    summary = [("| run | seeds | val success step 0 | val success end: mean ± s.d. | each seed | seeds >= 0.9 | "
                "distinct replies (last 5), mean |"), "|---|---:|---:|---:|---|---:|---:|"]
    for label in dict.fromkeys(r["label"] for r in done):
        group = [r for r in done if r["label"] == label]
        ends = [r["val_end"] for r in group if r["val_end"] is not None]
        mu = sum(ends) / len(ends) if ends else float("nan")
        sd = math.sqrt(sum((e - mu) ** 2 for e in ends) / (len(ends) - 1)) if len(ends) > 1 else 0.0
        uniq = [r["unique_reply_share_last5"] for r in group if r["unique_reply_share_last5"] is not None]
        summary.append(f"| {label} | {len(group)} | {fmt(group[0]['val_start'])} | {mu:.2f} ± {sd:.2f} | "
                       f"{', '.join(fmt(e) for e in ends)} | {sum(e >= 0.9 for e in ends)} | "
                       f"{fmt(sum(uniq) / len(uniq) if uniq else None)} |")
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text("\n".join(summary) + "\n\nEvery run:\n\n" + "\n".join(lines) + "\n"
                      + (f"\nNot finished: {', '.join(missing)}\n" if missing else "")
                      + (f"\nCarried from the previous report (their folders are not under {root} on the machine that "
                         f"wrote this one): {', '.join(carried)}\n" if carried else ""), encoding="utf-8")
    out_json.write_text(json.dumps({"steps": STEPS, "val_every": VAL_EVERY, "val_groups": VAL_GROUPS,
                                    "base_args": list(BASE_ARGS), "runs": done, "not_finished": missing,
                                    "carried": carried}, indent=1)
                        + "\n", encoding="utf-8")
    console.print("\n".join(summary + [""] + lines), markup=False)
    console.print(f"{len(done)} of {len(runs)} runs finished; table in {out_md}, data in {out_json}")


def main(argv: list[str] | None = None) -> int:
    parser = queue_parser(__doc__.split("\n\n")[0], out="runs/sweep-bandit", seeds=SEEDS, md="docs/sweeps/bandit.md")
    parser.add_argument("--only", nargs="*", choices=list(EXPERIMENTS),
                        help=f"experiments to include (default: {', '.join(DEFAULT_EXPERIMENTS)})")
    parser.add_argument("--json", default="docs/sweeps/bandit.json")
    args = parse_queue_args(parser, argv)
    console = Console()
    root = Path(args.out)
    runs = plan(args.only, args.seeds)
    if args.action == "list":
        for run in runs:
            console.print(f"{run.label} seed {run.seed}: {' '.join(run.command(root))}", soft_wrap=True, markup=False)
        return 0
    failed = run_jobs(jobs_of(runs, root), args.jobs, console) if args.action == "run" else 0
    report(reported_runs(runs, root, Path(args.json)), root, Path(args.md), Path(args.json), console)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
