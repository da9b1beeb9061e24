"""Files written atomically: a reader sees the old content or the new one, never half of either.

Every result, summary, config and metrics file the trainer and the evaluation write goes through these functions: the
text is written to a temporary file in the same folder, flushed and fsynced, then renamed over the target
(``os.replace`` is atomic on POSIX and Windows within one filesystem). A crash or a kill in the middle leaves the
previous file intact and, at worst, a stray ``.tmp-*`` file that the next write replaces.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (parent folders are created); returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding=encoding) as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def atomic_write_json(path: str | os.PathLike[str], data: Any, *, indent: int | None = 1, **dumps: Any) -> Path:
    """``json.dumps(data)`` (UTF-8, no NaN: a non-finite number is a ``ValueError``) written atomically."""
    dumps.setdefault("ensure_ascii", False)
    return atomic_write_text(path, json.dumps(data, indent=indent, allow_nan=False, **dumps) + "\n")


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append one line (a JSONL record) with a single ``write`` of the whole line and an fsync, so a crash leaves
    either the whole line or none of it (a partial last line, if the disk itself tears it, is skipped by readers)."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line.rstrip("\n") + "\n")
        fh.flush()
        os.fsync(fh.fileno())


__all__ = ["append_line", "atomic_write_json", "atomic_write_text"]
