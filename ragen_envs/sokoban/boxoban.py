"""Read levels in the Boxoban / XSB text format (DeepMind's published Boxoban levels, most Sokoban collections).

Symbols: ``#`` wall, ``@`` player, ``$`` box, ``.`` goal, ``*`` box on goal, ``+`` player on goal, space (or ``-`` /
``_``) floor. Levels are separated by header lines starting with ``;`` (Boxoban writes ``; 0``, ``; 1``, ...) or by
blank lines. Rows of different lengths are padded with walls on the right.

DeepMind's files (``boxoban-levels``: ``unfiltered/train/000.txt`` ...) are not bundled: pass the path of a file or
a folder of ``.txt`` files that you downloaded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ragen_envs.sokoban.generator import FLOOR, TARGET, WALL, Level

_FLOOR_CHARS = " -_"
_KNOWN = "#@$.*+" + _FLOOR_CHARS
#: Largest level side accepted (guards against feeding a non-level text file).
MAX_SIDE = 64


class BoxobanFormatError(ValueError):
    """A level text that is not valid Boxoban/XSB; the message names the source, the level and what is wrong."""


def parse_boxoban(text: str, source: str = "<text>") -> list[Level]:
    """Parse every level of ``text``; each :class:`Level` has ``meta = {"source", "name", "line"}``.

    Raises :class:`BoxobanFormatError` (a ``ValueError``) on an unknown symbol, a level without exactly one player,
    with no box, or with a different number of boxes and goals.
    """
    if not isinstance(text, str):
        raise BoxobanFormatError(f"{source}: expected the level text as str, got {type(text).__name__}")
    levels: list[Level] = []
    block: list[str] = []
    name: str | None = None
    block_line = 0

    def flush() -> None:
        nonlocal block, name
        if block:
            levels.append(_parse_block(block, source, name if name is not None else str(len(levels)), block_line))
        block = []
        name = None

    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r\n")
        stripped = line.strip()
        if stripped.startswith(";"):
            flush()
            name = stripped[1:].strip() or str(len(levels))
            continue
        if not stripped:
            flush()
            continue
        if not block:
            block_line = number
        block.append(line.rstrip())
    flush()
    if not levels:
        raise BoxobanFormatError(f"{source}: no level found (levels are rows of {_KNOWN!r} separated by '; N' lines)")
    return levels


def _parse_block(lines: list[str], source: str, name: str, first_line: int) -> Level:
    where = f"{source}, level {name!r} (line {first_line})"
    rows, cols = len(lines), max(len(line) for line in lines)
    if rows > MAX_SIDE or cols > MAX_SIDE:
        raise BoxobanFormatError(f"{where}: {rows}x{cols} is larger than {MAX_SIDE}x{MAX_SIDE}")
    fixed = np.full((rows, cols), WALL, dtype=np.int8)
    boxes: list[tuple[int, int]] = []
    players: list[tuple[int, int]] = []
    for r, line in enumerate(lines):
        for c, ch in enumerate(line):
            if ch not in _KNOWN:
                raise BoxobanFormatError(
                    f"{where}: unknown symbol {ch!r} at row {r}, column {c}; expected one of "
                    "'#' wall, '@' player, '$' box, '.' goal, '*' box on goal, '+' player on goal, ' ' floor"
                )
            if ch == "#":
                continue
            fixed[r, c] = TARGET if ch in ".*+" else FLOOR
            if ch in "$*":
                boxes.append((r, c))
            if ch in "@+":
                players.append((r, c))
    if len(players) != 1:
        raise BoxobanFormatError(f"{where}: expected exactly one player ('@' or '+'), found {len(players)}")
    n_targets = int((fixed == TARGET).sum())
    if not boxes:
        raise BoxobanFormatError(f"{where}: the level has no box ('$' or '*')")
    if len(boxes) != n_targets:
        raise BoxobanFormatError(f"{where}: {len(boxes)} boxes but {n_targets} goals; they must be equal")
    return Level(
        fixed=fixed,
        boxes=tuple(sorted(boxes)),
        player=players[0],
        meta={"source": source, "name": name, "line": first_line},
    )


def load_boxoban(path: str | Path) -> list[Level]:
    """Levels of a Boxoban file, or of every ``*.txt`` file of a folder (sorted by name), in order."""
    p = Path(path).expanduser()
    if p.is_dir():
        files = sorted(p.glob("*.txt"))
        if not files:
            raise BoxobanFormatError(f"{p}: the folder holds no .txt level file")
    elif p.is_file():
        files = [p]
    else:
        raise FileNotFoundError(f"Boxoban level file or folder not found: {p}")
    levels: list[Level] = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise BoxobanFormatError(f"{f}: not a UTF-8 text file ({err})") from None
        levels.extend(parse_boxoban(text, source=str(f)))
    return levels
