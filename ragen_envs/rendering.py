"""Draw grid states as RGB pictures with plain numpy (no pygame, no fonts).

Each cell is a ``tile`` x ``tile`` square filled with a background colour; an optional shape (a disc, a square, a
ring or a cross) is drawn on top in a second colour. Grid envs describe each cell code with a :class:`CellStyle`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RGB = tuple[int, int, int]


@dataclass(frozen=True)
class CellStyle:
    """How to draw one cell code: a background colour, and optionally a ``shape`` in ``color``."""

    background: RGB
    shape: str | None = None  # None, "disc", "square", "ring", "cross"
    color: RGB = (0, 0, 0)


def _shape_mask(shape: str, tile: int) -> np.ndarray:
    yy, xx = np.mgrid[0:tile, 0:tile]
    c = (tile - 1) / 2.0
    r = np.hypot(yy - c, xx - c)
    if shape == "disc":
        return r <= tile * 0.32
    if shape == "ring":
        return (r <= tile * 0.36) & (r >= tile * 0.24)
    if shape == "square":
        m = int(round(tile * 0.15))
        mask = np.zeros((tile, tile), dtype=bool)
        mask[m : tile - m, m : tile - m] = True
        return mask
    if shape == "cross":
        w = max(1, tile // 8)
        d1 = np.abs(yy - xx) <= w
        d2 = np.abs(yy + xx - (tile - 1)) <= w
        inner = (yy > tile * 0.15) & (yy < tile * 0.85)
        return (d1 | d2) & inner
    raise ValueError(f"invalid argument shape={shape!r}: expected None, 'disc', 'square', 'ring' or 'cross'")


def draw_grid(codes: np.ndarray, styles: dict[int, CellStyle], tile: int = 24) -> np.ndarray:
    """Render a 2-D array of cell codes to an ``(H*tile, W*tile, 3)`` ``uint8`` image.

    Cells are separated by a one-pixel darker grid line so that adjacent floor cells stay distinguishable.
    """
    codes = np.asarray(codes)
    if codes.ndim != 2:
        raise ValueError(f"invalid argument codes with shape {codes.shape}: expected a 2-D array")
    h, w = codes.shape
    image = np.zeros((h * tile, w * tile, 3), dtype=np.uint8)
    masks: dict[str, np.ndarray] = {}
    for code in np.unique(codes):
        style = styles.get(int(code))
        if style is None:
            raise ValueError(f"no CellStyle for cell code {int(code)}; known codes: {sorted(styles)}")
        patch = np.empty((tile, tile, 3), dtype=np.uint8)
        patch[:] = style.background
        if style.shape is not None:
            mask = masks.setdefault(style.shape, _shape_mask(style.shape, tile))
            patch[mask] = style.color
        patch[-1, :] = (np.asarray(style.background) * 0.7).astype(np.uint8)
        patch[:, -1] = (np.asarray(style.background) * 0.7).astype(np.uint8)
        for y, x in zip(*np.nonzero(codes == code)):
            image[y * tile : (y + 1) * tile, x * tile : (x + 1) * tile] = patch
    return image
