"""Train a list of runs as subprocesses, a few at a time, resumably: the machinery of the learning sweeps.

Each :class:`Job` is a run folder and the commands that make it (a warm-up, then ``ragen-trainer train``); a job whose
``done`` check passes is skipped, so the same queue can be started again after an interruption and only the unfinished
runs train (each resumes from its own checkpoint: the trainer's resume). Every process gets one torch thread
(``OMP_NUM_THREADS=1``): two jobs at once fill this project's 2-core machine without thrashing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

#: One torch thread per process, and no tokenizer threads: ``jobs`` processes share the cores.
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class Job:
    name: str
    folder: Path
    commands: list[list[str]]
    """Run in order; a command that fails stops the job."""
    done: Callable[[], bool]
    after: Callable[[], None] = field(default=lambda: None)
    """Called once the job is done (e.g. delete its weights)."""


def run_finished(folder: Path, steps: int) -> bool:
    """True when the training run in ``folder`` trained all ``steps`` (its ``summary.json`` says so)."""
    try:
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("steps") == steps and not summary.get("interrupted")


def prune_weights(folder: Path) -> None:
    """Delete a finished run's checkpoints and final model: a sweep keeps its metrics, not its weights."""
    for path in list(folder.glob("checkpoint-*")) + [folder / "final"]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def queue_parser(description: str, *, out: str, seeds: tuple[int, ...], md: str) -> argparse.ArgumentParser:
    """The options every learning-sweep script shares: ``run`` / ``report`` / ``list``, the runs' root folder, the
    seeds, how many runs train at once, and where the report goes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("action", choices=["run", "report", "list"])
    parser.add_argument("--out", default=out, help="root folder of the runs")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(seeds))
    parser.add_argument("--jobs", type=int, default=2, help="runs trained at once (each on one torch thread)")
    parser.add_argument("--md", default=md, help="the report's Markdown table")
    return parser


def parse_queue_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    return args


def busy(folder: Path) -> bool:
    """True when another process is training into ``folder`` (a queue stopped and started again while its runs went
    on): such a run is waited for, never started twice into the same folder."""
    target = str(folder)
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.pid != os.getpid() and any(arg == target for arg in cmdline):
            return True
    return False


def run_jobs(jobs: list[Job], parallel: int, console: Console) -> int:
    """Run every unfinished job, ``parallel`` at a time, each command's output appended to ``folder/train.log``;
    returns the number of jobs that failed."""
    todo = [j for j in jobs if not j.done()]
    for job in jobs:
        if job not in todo:
            job.after()
    console.print(f"{len(jobs)} runs, {len(jobs) - len(todo)} already finished, {len(todo)} to train, "
                  f"{parallel} at once")
    env = {**os.environ, **THREAD_ENV}
    failed = 0
    running: list[tuple[Job, list[list[str]], subprocess.Popen[bytes], float]] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        task = progress.add_task("runs", total=len(todo))
        queue = list(todo)

        def start(job: Job, commands: list[list[str]], t0: float) -> None:
            job.folder.mkdir(parents=True, exist_ok=True)
            with open(job.folder / "train.log", "ab") as log:
                proc = subprocess.Popen(commands[0], stdout=log, stderr=subprocess.STDOUT, env=env,
                                        stdin=subprocess.DEVNULL)
            running.append((job, commands[1:], proc, t0))

        while queue or running:
            while queue:
                elsewhere = [j for j in queue if busy(j.folder)]  # trained by another process: they hold a core too
                free = [j for j in queue if j not in elsewhere]
                if not free or len(running) + len(elsewhere) >= parallel:
                    break
                job = free[0]
                queue.remove(job)
                if job.done():  # finished by the other process while it waited
                    job.after()
                    progress.advance(task)
                    continue
                start(job, list(job.commands), time.time())
                progress.update(task, description=", ".join(j.name for j, _, _, _ in running))
            time.sleep(2)
            for item in list(running):
                job, rest, proc, t0 = item
                if proc.poll() is None:
                    continue
                running.remove(item)
                if proc.returncode == 0 and rest:  # the job's next command (the training after its warm-up)
                    start(job, rest, t0)
                    continue
                ok = proc.returncode == 0 and job.done()
                if ok:
                    job.after()
                else:
                    failed += 1
                progress.console.print(f"{'done' if ok else 'FAILED'}: {job.name} in {time.time() - t0:.0f} s "
                                       f"(load {os.getloadavg()[0]:.1f})"
                                       + ("" if ok else f"; see {job.folder / 'train.log'}"))
                progress.advance(task)
    return failed


__all__ = ["THREAD_ENV", "Job", "parse_queue_args", "prune_weights", "queue_parser", "run_finished", "run_jobs"]
