"""A run's folder on disk: deciding what to do with it, writing checkpoints whole or not at all, and reading them back.

* :func:`plan_run_folder` checks ``output_dir`` against the config (a changed config is refused unless ``--resume``
  or ``--overwrite``), removes what an unfinished save left, sets aside checkpoints that fail
  :func:`ragen_trainer.models.checkpoint_problems` (renamed ``broken-checkpoint-N``, with a warning) and chooses the
  checkpoint to resume from. Nothing of the run's record (``config.yaml``) is rewritten here: the trainer writes it
  once the resume has been loaded, so a failed resume leaves the folder as it was.
* :func:`publish_folder` puts a folder written aside (``.saving-<name>``) in place with one rename, after flushing it to
  disk: a checkpoint is whole or absent, whatever kills the process.
* :class:`SignalGuard` holds SIGINT / SIGTERM back while a save runs (each one prints that the save is finishing).
* :func:`disk_full_message` turns a failed write into a sentence that names the disk and what is free.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragen_trainer.config import FolderPlan, StarPOConfig, check_output_folder, run_files
from ragen_trainer.fileio import read_json_object
from ragen_trainer.models import (
    BROKEN_PREFIX,
    CHECKPOINT_PATTERN,
    STAGING_PREFIX,
    checkpoint_problems,
    list_checkpoints,
    newest_good_checkpoint,
    read_checkpoint_info,
    unfinished_saves,
)

logger = logging.getLogger(__name__)

#: The training state a checkpoint holds besides the weights: the step, the validation history and the Echo Trap
#: monitor's (``trainer_state.json``; ``global_step`` is the training step, as the folder's name).
TRAINER_STATE_FILE = "trainer_state.json"


@dataclass
class RunFolder:
    """What :func:`plan_run_folder` decided for ``output_dir``."""

    plan: FolderPlan
    checkpoint: str | None
    """The checkpoint to resume from (``None``: the initial model)."""
    skipped: dict[str, list[str]] = field(default_factory=dict)
    """Checkpoints newer than ``checkpoint`` that failed verification (renamed ``broken-checkpoint-N``), each with
    what was wrong."""


def plan_run_folder(cfg: StarPOConfig, *, explicit: str | None, main: bool, force_resume: bool = False,
                    overwrite: bool = False) -> RunFolder:
    """Check ``cfg.output_dir`` against the config, clean it, and choose the checkpoint to resume from.

    Every process calls this (so all raise alike); only the ``main`` one changes files: it removes an old run
    (``overwrite``), leftovers of saves that never finished, and renames checkpoints that fail verification to
    ``broken-checkpoint-N``. ``explicit`` names a checkpoint folder to start from, which must verify.
    """
    out_dir = Path(cfg.output_dir)
    if explicit is not None:
        problems = checkpoint_problems(explicit)
        if problems:
            raise ValueError(f"invalid argument resume_from_checkpoint={explicit!r}: the checkpoint is not whole: "
                             f"{'; '.join(problems)}")
        plan = FolderPlan("continue")
    else:
        plan = check_output_folder(cfg, force_resume=force_resume, overwrite=overwrite)
    skipped: dict[str, list[str]] = {}
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
        if plan.action == "overwrite":
            old = run_files(out_dir)
            for path in old:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            logger.warning("starting over in %s: removed the previous run's %s", out_dir,
                           ", ".join(p.name for p in old) or "files")
        for folder in unfinished_saves(out_dir):
            logger.warning("warning: removing %s, a checkpoint save that never finished (the run was killed while "
                           "saving it)", folder)
            shutil.rmtree(folder, ignore_errors=True)
        if plan.differences:
            logger.warning("warning: continuing the run in %s with a changed config (--resume): %s", out_dir,
                           ", ".join(f"{n} {o!r} -> {v!r}" for n, o, v in plan.differences))
        if explicit is None and plan.action == "continue":
            good, bad = newest_good_checkpoint(out_dir)
            for folder, problems in bad:
                skipped[folder.name] = problems
                target = free_name(folder.parent / (BROKEN_PREFIX + folder.name))
                os.replace(folder, target)
                logger.warning("warning: checkpoint %s is not whole (%s): skipped, renamed to %s", folder,
                               "; ".join(problems), target.name)
            if bad:
                logger.warning("warning: resuming from %s instead", good if good is not None else
                               "the initial model (no whole checkpoint left)")
    if explicit is not None:
        checkpoint: str | None = explicit
    elif plan.action == "continue":
        good, _ = newest_good_checkpoint(out_dir)
        checkpoint = str(good) if good is not None else None
    else:
        checkpoint = None
    return RunFolder(plan=plan, checkpoint=checkpoint, skipped=skipped)


def checkpoint_step(folder: str | os.PathLike[str]) -> int:
    """The training step a checkpoint holds: its marker's ``step``, else the number in its name."""
    step = read_checkpoint_info(folder).get("step")
    if isinstance(step, int):
        return step
    match = CHECKPOINT_PATTERN.match(Path(folder).name)
    return int(match.group(1)) if match else 0


def read_trainer_state(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``trainer_state.json`` of a checkpoint (``{}`` when unreadable: the checkpoint then fails verification)."""
    return read_json_object(Path(folder) / TRAINER_STATE_FILE)


def newest_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    found = list_checkpoints(output_dir)
    return str(found[-1][1]) if found else None


def staging_path(final: str | os.PathLike[str]) -> str:
    """Where a folder that will be published at ``final`` is written first."""
    final = os.fspath(final)
    return os.path.join(os.path.dirname(final) or ".", STAGING_PREFIX + os.path.basename(final))


def publish_folder(staging: str, final: str) -> None:
    """Flush ``staging`` to disk, then put it at ``final`` with one rename (an existing ``final``, the same step
    saved again, is moved aside first and removed after)."""
    fsync_tree(staging)
    parent = os.path.dirname(final) or "."
    old = None
    if os.path.exists(final):
        old = os.path.join(parent, ".replaced-" + os.path.basename(final))
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(staging, final)
    fsync_dir(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def fsync_tree(folder: str) -> None:
    """Flush every file under ``folder`` and the folders themselves to disk (before the rename that publishes it)."""
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(root)


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def rotate_checkpoints(output_dir: str | os.PathLike[str], keep: int) -> None:
    """Remove the oldest ``checkpoint-N`` folders beyond the newest ``keep`` (``keep`` 0: keep all)."""
    if keep <= 0:
        return
    found = list_checkpoints(output_dir)
    for _, folder in found[: max(0, len(found) - keep)]:
        shutil.rmtree(folder, ignore_errors=True)


def free_name(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``, ... : the first that does not exist."""
    candidate, n = path, 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the disk or the quota is full. torch's writer reports a full disk as
    ``RuntimeError: ... basic_ios::clear: iostream error`` or ``file write failed``, without an errno."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(exc)
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
        if isinstance(exc, RuntimeError) and ("iostream error" in text or "file write failed" in text):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def folder_size(path: str | os.PathLike[str]) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total


def disk_full_message(what: str, target: str | os.PathLike[str], needed: int | None = None) -> str:
    """A sentence for a save that failed because the disk is full: where, how much is free, what was kept."""
    folder = Path(target).parent
    try:
        free = shutil.disk_usage(folder).free
        free_text = f"{free / 1e6:.0f} MB free"
    except OSError:
        free_text = "free space unknown"
    need = f", about {needed / 1e6:.0f} MB needed" if needed else ""
    kept = newest_checkpoint(folder)
    kept_text = f"the previous checkpoint {kept} is kept" if kept else "no earlier checkpoint exists"
    return (f"no space left on the disk of {folder} while saving {what} ({free_text}{need}); nothing half-written "
            f"was left behind and {kept_text}. Free some space (or choose another --output_dir) and run the same "
            "command again to continue.")


class SignalGuard:
    """Holds SIGINT and SIGTERM back while a body runs (a checkpoint save). Each signal received prints that the save
    is finishing; with ``stop_after``, ``KeyboardInterrupt`` is raised once the body is done, so the run stops as the
    signal asked. Nested uses share the outermost one. Off the main thread it only runs the body."""

    def __init__(self) -> None:
        self._depth = 0
        self._received: list[int] = []

    @contextlib.contextmanager
    def hold(self, *, stop_after: bool = True) -> Iterator[None]:
        if self._depth > 0 or threading.current_thread() is not threading.main_thread():
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return

        def on_signal(signum: int, frame: Any) -> None:
            self._received.append(signum)
            name = signal.Signals(signum).name
            print(f"\n{name} received while a checkpoint is being saved: waiting for the save to finish, then "
                  "stopping (a kill -9 now would lose only this save, not the earlier checkpoints)",
                  file=sys.stderr, flush=True)

        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                previous[sig] = signal.signal(sig, on_signal)
            except (ValueError, OSError):  # pragma: no cover - not settable here
                pass
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        received, self._received = self._received, []
        if stop_after and received:
            raise KeyboardInterrupt(f"signal {received[0]} during a checkpoint save")


__all__ = [
    "TRAINER_STATE_FILE",
    "RunFolder",
    "SignalGuard",
    "checkpoint_step",
    "disk_full_message",
    "folder_size",
    "free_name",
    "fsync_tree",
    "is_disk_full",
    "newest_checkpoint",
    "plan_run_folder",
    "publish_folder",
    "read_trainer_state",
    "rotate_checkpoints",
    "staging_path",
]
