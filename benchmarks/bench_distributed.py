"""A training step with each distributed backend, side by side in one run, on CPU processes.

Runs the same short ``ragen-trainer train`` (StarPO-S on ``ragen/Bandit-v0``) four ways and prints the seconds per
step of each phase from the run's ``metrics.jsonl``:

* ``single``: one process, no launcher;
* ``ddp``: two processes under ``accelerate launch --multi_gpu`` (gloo);
* ``zero2``: two processes under ``torchrun`` with ``configs/distributed/ds_zero2.json``;
* ``zero3``: the same with ``configs/distributed/ds_zero3.json``.

Each process of a two-process run rolls out half of the groups, so the work per step is the same in every row:
``--groups`` groups of ``--group-size`` rollouts, one optimizer step. The first ``--warmup`` steps are not averaged
(AdamW allocates its state there). Every process runs with ``OMP_NUM_THREADS=1``: on a 2-core machine the single
process has one core and the two-process runs two, so the rows say what the backends cost here, not what they
cost on GPUs.

    python benchmarks/bench_distributed.py                        # the bundled SmolLM2, 4 x 4 rollouts, 3 steps
    python benchmarks/bench_distributed.py --model tiny --backends single ddp
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ragen_trainer.engines.local_server import free_port  # noqa: E402
from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer  # noqa: E402

BACKENDS = ("single", "ddp", "zero2", "zero3")
PHASES = ("time/rollout", "time/scoring", "time/update")


def launcher(backend: str) -> list[str]:
    """The command prefix that starts ``ragen_trainer.cli`` as ``backend`` asks."""
    if backend == "single":
        return [sys.executable, "-m", "ragen_trainer.cli"]
    if backend == "ddp":
        return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
                str(free_port()), "-m", "ragen_trainer.cli"]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
            "-m", "ragen_trainer.cli"]


def train_command(backend: str, model: str, out: Path, args: argparse.Namespace) -> list[str]:
    cmd = launcher(backend) + [
        "train", "--config", "starpo-s", "--env", "ragen/Bandit-v0", "--model", model, "--output_dir", str(out),
        "--enable_think", "false", "--max_new_tokens", str(args.tokens), "--env_groups", str(args.groups),
        "--group_size", str(args.group_size), "--total_steps", str(args.steps), "--val_every", "0", "--save_steps",
        "0", "--micro_batch_size", str(args.micro_batch), "--filter_ratio", "1.0", "--report_to", "jsonl",
        "--seed", "0",
    ]
    if backend in ("zero2", "zero3"):
        cmd += ["--deepspeed", str(REPO / "configs" / "distributed" / f"ds_{backend}.json")]
    return cmd


def tiny_model(folder: Path) -> str:
    """A small random Llama with the bundled SmolLM2 tokenizer, saved once for every backend's run."""
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def measure(backend: str, model: str, work: Path, args: argparse.Namespace, console: Console) -> dict[str, float]:
    out = work / backend
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    start = time.perf_counter()
    proc = subprocess.run(train_command(backend, model, out, args), capture_output=True, text=True, env=env,
                          timeout=args.timeout, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        console.print(f"[red]{backend} failed (exit {proc.returncode}):[/red]\n{proc.stderr[-2000:]}")
        return {}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][args.warmup:]
    result = {phase: statistics.mean(row.get(phase, 0.0) for row in rows) for phase in PHASES}
    result["step"] = sum(result[phase] for phase in PHASES)
    result["wall"] = wall
    result["trajectories"] = statistics.mean(row["batch/trajectories"] for row in rows)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny (a random Llama) or any model id / path")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--groups", type=int, default=4, help="initial states a step (split across processes)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=8, help="max new tokens a reply")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the means")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds allowed per backend's run")
    args = parser.parse_args()
    if args.warmup >= args.steps:
        parser.error(f"--warmup ({args.warmup}) must be below --steps ({args.steps})")
    console = Console(width=max(Console().width, 140))  # the table whole, even when piped
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="ragen-bench-distributed-") as tmp:
        work = Path(tmp)
        model = tiny_model(work / "tiny-model") if args.model == "tiny" else args.model
        for i, backend in enumerate(args.backends, 1):
            console.print(f"[{i}/{len(args.backends)}] {backend}: {args.steps} steps of {args.groups} x "
                          f"{args.group_size} rollouts ...")
            results[backend] = measure(backend, model, work, args, console)

    table = Table(title=f"StarPO-S step on ragen/Bandit-v0 ({args.model}, {args.groups} x {args.group_size}, "
                        f"{args.tokens} tokens; mean of steps {args.warmup + 1}-{args.steps}; OMP_NUM_THREADS=1 a "
                        "process)")
    for column in ("backend", "processes", "trajectories", "rollout s", "scoring s", "update s", "step s",
                   "vs single", "run wall s"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    base = results.get("single", {}).get("step")
    for backend, r in results.items():
        if not r:
            table.add_row(backend, "", "", "failed", "", "", "", "", "")
            continue
        table.add_row(backend, "1" if backend == "single" else "2", f"{r['trajectories']:.0f}",
                      f"{r['time/rollout']:.2f}", f"{r['time/scoring']:.2f}", f"{r['time/update']:.2f}",
                      f"{r['step']:.2f}", f"{r['step'] / base:.2f}x" if base else "-", f"{r['wall']:.0f}")
    console.print(table)
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
