"""The ``ragen/<Name>-v0`` ids.

Every id is registered with :func:`ragen_envs.protocol.make_text_env` as its entry point and the env class as a
string, so ``import ragen_envs`` imports no env module: an env is imported the first time it is made.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

ENTRY_POINT = "ragen_envs.protocol:make_text_env"

#: id -> (env class path, registered default kwargs). The README's table of ids is written from this.
ENV_IDS: dict[str, tuple[str, dict[str, Any]]] = {
    "ragen/Bandit-v0": ("ragen_envs.bandit:BanditEnv", {}),
    "ragen/BanditTest-v0": ("ragen_envs.bandit:BanditEnv", {"low_risk_name": "Trader", "high_risk_name": "Librarian"}),
    "ragen/BanditRev-v0": ("ragen_envs.bandit:BanditEnv", {"reverse": True}),
    "ragen/FrozenLake-v0": ("ragen_envs.frozen_lake:FrozenLakeEnv", {}),
    "ragen/Countdown-v0": ("ragen_envs.countdown:CountdownEnv", {}),
    "ragen/Sokoban-v0": ("ragen_envs.sokoban.env:SokobanEnv", {"dim_room": (6, 6), "num_boxes": 1}),
    "ragen/SokobanLarge-v0": ("ragen_envs.sokoban.env:SokobanEnv", {"dim_room": (8, 8), "num_boxes": 2}),
    "ragen/SokobanNewVocab-v0": (
        "ragen_envs.sokoban.env:SokobanEnv",
        {"dim_room": (6, 6), "num_boxes": 1, "vocab": "new"},
    ),
    "ragen/WebShop-v0": ("ragen_envs.webshop:WebShopEnv", {}),
}


def register_text_env(env_id: str, env_cls: str, **defaults: Any) -> None:
    """Register a text env under ``env_id`` so that ``gymnasium.make(env_id)`` returns it inside the turn protocol.

    ``env_cls`` is ``"package.module:ClassName"`` of a :class:`~ragen_envs.core.BaseTextEnv` subclass; ``defaults``
    are keyword arguments for the env or the protocol that ``gymnasium.make`` kwargs can override.
    """
    gym.register(id=env_id, entry_point=ENTRY_POINT, kwargs={"env_cls": env_cls, **defaults}, disable_env_checker=False)


def register_all() -> None:
    for env_id, (env_cls, defaults) in ENV_IDS.items():
        if env_id not in gym.registry:
            register_text_env(env_id, env_cls, **defaults)
