"""Sokoban for LLM agents: a fast always-solvable level generator, an optimal solver, level pools, a Boxoban loader,
and :class:`~ragen_envs.sokoban.env.SokobanEnv` (``ragen/Sokoban-v0``, ``ragen/SokobanLarge-v0``,
``ragen/SokobanNewVocab-v0``).

Importing this package is cheap: the submodules load on first use of a name (numba, when installed, only when the
first level is generated).

    from ragen_envs.sokoban import generate_level, solve_level
    level = generate_level(0)            # 6x6, one box
    print(level.to_text())
    print(solve_level(level).actions)
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SokobanEnv": "ragen_envs.sokoban.env",
    "GeneratorConfig": "ragen_envs.sokoban.generator",
    "GenerationError": "ragen_envs.sokoban.generator",
    "Level": "ragen_envs.sokoban.generator",
    "SokobanGenerator": "ragen_envs.sokoban.generator",
    "generate_level": "ragen_envs.sokoban.generator",
    "shared_generator": "ragen_envs.sokoban.generator",
    "GENERATOR_VERSION": "ragen_envs.sokoban.generator",
    "Solution": "ragen_envs.sokoban.solver",
    "solve": "ragen_envs.sokoban.solver",
    "solve_level": "ragen_envs.sokoban.solver",
    "LevelPool": "ragen_envs.sokoban.pool",
    "load_boxoban": "ragen_envs.sokoban.boxoban",
    "parse_boxoban": "ragen_envs.sokoban.boxoban",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ragen_envs.sokoban' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
