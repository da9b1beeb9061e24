"""Files written atomically, with the user's permissions, and files read with bounds.

Writing. Every result, summary, config and metrics file the trainer and the evaluation write goes through these
functions: the text is written to a temporary file in the same folder, flushed and fsynced, then renamed over the
target (``os.replace`` is atomic on POSIX and Windows within one filesystem). A crash or a kill in the middle leaves
the previous file intact and, at worst, a stray ``.tmp-*`` file that the next write replaces. The file gets the mode
an ordinary ``open()`` would give it (``0666`` less the umask: ``0644`` under umask 022), or keeps the mode of the
file it replaces: ``tempfile.mkstemp`` alone would make every output ``0600``. :func:`apply_umask` gives files that
other libraries wrote through private temporary files (transformers' ``model.safetensors``) the same modes.

Reading. :func:`read_text_bounded` reads a file a user or another program handed over (a result file, a config)
only when it is a regular file (not a FIFO that never ends, not ``/dev/zero`` behind a symlink) and at most a size
cap, so a hostile path cannot hang or exhaust memory.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any


def current_umask() -> int:
    """The process's umask, read without changing it where the system tells (Linux ``/proc``): setting and restoring
    it (the only portable way) would briefly give files made meanwhile by other threads the wrong mode."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode(existing: str | os.PathLike[str] | None = None) -> int:
    """The permission bits a new file gets from ``open()`` (``0666`` less the umask); the mode of ``existing`` instead
    when that file is there (a write that replaces a file keeps its permissions)."""
    if existing is not None:
        try:
            return stat.S_IMODE(os.stat(existing).st_mode)
        except OSError:
            pass
    return 0o666 & ~current_umask()


def apply_umask(folder: str | os.PathLike[str]) -> None:
    """Give every file under ``folder`` (and the folders) the modes ``open()`` / ``mkdir()`` give under the umask.

    For folders another library filled through private temporary files or folders (``tempfile.mkstemp`` /
    ``mkdtemp`` make them ``0600`` / ``0700``): transformers 5 writes ``model.safetensors`` that way, and a converted
    model's cache folder is made with ``mkdtemp``. Symbolic links are left alone."""
    mask = current_umask()
    root = Path(folder)
    os.chmod(root, 0o777 & ~mask)
    for base, dirs, files in os.walk(root):
        for name in dirs:
            if not os.path.islink(os.path.join(base, name)):
                os.chmod(os.path.join(base, name), 0o777 & ~mask)
        for name in files:
            if not os.path.islink(os.path.join(base, name)):
                os.chmod(os.path.join(base, name), 0o666 & ~mask)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (parent folders are created) with the mode of :func:`file_mode`; returns
    the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = file_mode(target)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{target.name}.", dir=target.parent)
    try:
        os.fchmod(fd, mode)
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


def read_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in ``path``; ``{}`` when the file is missing, unreadable, not JSON or not an object (for the
    small records ragen writes itself next to a model: a missing or broken one reads as empty)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_json_object_checked(path: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, str | None]:
    """``(the JSON object in path, None)``, or ``(None, what is wrong)`` naming the file: missing, not JSON, or not
    an object (for checks that report each problem instead of reading it as empty)."""
    path = Path(path)
    if not path.is_file():
        return None, f"{path.name} is missing"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"{path.name} is not valid JSON ({str(exc)[:80]})"
    if not isinstance(data, dict):
        return None, f"{path.name} is not a JSON object"
    return data, None


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append one line (a JSONL record) with a single ``write`` of the whole line and an fsync, so a crash leaves
    either the whole line or none of it (a partial last line, if the disk itself tears it, is skipped by readers)."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line.rstrip("\n") + "\n")
        fh.flush()
        os.fsync(fh.fileno())


class BoundedReadError(ValueError):
    """A file :func:`read_bytes_bounded` refuses: not a regular file, or over its size cap; the message says which."""


def read_bytes_bounded(path: str | os.PathLike[str], max_bytes: int, what: str = "file") -> bytes:
    """The bytes of ``path``, only when it is a regular file (symbolic links followed) of at most ``max_bytes``.

    ``FileNotFoundError`` when it does not exist; :class:`BoundedReadError` (a ``ValueError``) naming the file when it
    is a FIFO, a device (``/dev/zero``), a socket or a folder, or larger than the cap (checked before reading and
    while reading: a file that grows meanwhile is cut off, not read to the end); ``OSError`` when it cannot be read.
    The file is opened without blocking (a FIFO with no writer would otherwise wait forever in ``open``)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                    else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                    else "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file")  # fmt: skip
            raise BoundedReadError(f"{what} {str(path)!r} is {kind}, not a regular file")
        if info.st_size > max_bytes:
            raise BoundedReadError(f"{what} {str(path)!r} is {info.st_size:,} bytes; at most {max_bytes:,} are read")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise BoundedReadError(f"{what} {str(path)!r} grew past {max_bytes:,} bytes while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text_bounded(path: str | os.PathLike[str], max_bytes: int, what: str = "file",
                      encoding: str = "utf-8") -> str:
    """:func:`read_bytes_bounded` decoded (``UnicodeDecodeError`` when it is not ``encoding`` text)."""
    return read_bytes_bounded(path, max_bytes, what).decode(encoding)


__all__ = [
    "BoundedReadError",
    "append_line",
    "apply_umask",
    "atomic_write_json",
    "atomic_write_text",
    "current_umask",
    "file_mode",
    "read_bytes_bounded",
    "read_json_object",
    "read_json_object_checked",
    "read_text_bounded",
]
