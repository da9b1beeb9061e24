"""Writing a folder whole or not at all: written aside (``.saving-<name>``), flushed to disk, then put in place with one
rename (:func:`publish_folder`), whatever kills the process; old checkpoints rotated out; a full disk turned into a
sentence that names the disk and what is free; SIGINT / SIGTERM held back while a save runs (:class:`SignalGuard`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ragen_trainer.checkpoints.layout import REPLACED_PREFIX, list_checkpoints, newest_checkpoint


class CheckpointSaveError(OSError):
    """A checkpoint or the final model could not be written (the disk is full); the message says what was kept."""


def publish_folder(staging: str, final: str) -> None:
    """Flush ``staging`` to disk, then put it at ``final`` with one rename (an existing ``final``, the same step
    saved again, is moved aside first and removed after)."""
    fsync_tree(staging)
    parent = os.path.dirname(final) or "."
    old = None
    if os.path.exists(final):
        old = os.path.join(parent, REPLACED_PREFIX + os.path.basename(final))
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
