"""The user cache folder shared by every part of ragen (level pools, search indexes, converted model weights)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$RAGEN_CACHE_DIR`` (default ``$XDG_CACHE_HOME/ragen`` or ``~/.cache/ragen``) joined with ``parts``, created."""
    root = os.environ.get("RAGEN_CACHE_DIR")
    if root:
        base = Path(root)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ragen"
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
