"""The ``ragen/<Name>-v0`` ids, each with its env class, env arguments and reference protocol settings.

Every id is registered with :func:`ragen_envs.factory.make_text_env` as its entry point and the env class as a
string, so ``import ragen_envs`` imports no env module: an env is imported the first time it is made.

The protocol settings of each id are the reference code's (RAGEN ``config/base.yaml``, ``config/envs.yaml`` and the
per-env ``config/_*.yaml``; see ``docs/fidelity.md``): Bandit and Countdown are played in one turn with one action
(``_1_bandit.yaml``, ``_4_countdown.yaml``: ``max_turn: 1``, ``max_actions_per_turn: 1``), Sokoban and FrozenLake in
up to 5 turns of up to 5 actions and 10 actions in all, WebShop in up to 9 turns of one action each
(``_6_webshop.yaml``) with a length hint of 200 words.

The text games (:data:`GAME_IDS`; not in the reference) are single-agent views of ``ragen_envs.games``: one seat
against a fixed opponent, one move per turn, and a turn budget of the most moves a seat can need plus
:data:`~ragen_envs.games.base.INVALID_CAP` (3) invalid turns; running out of turns truncates the game (a forfeit).
They are kept apart from :data:`ENV_IDS` (the paper's envs, whose list tests and tables pin) and registered alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from ragen_envs.settings import ProtocolSettings

ENTRY_POINT = "ragen_envs.factory:make_text_env"


@dataclass(frozen=True)
class EnvSpec:
    """What one registered id is: the env class, its arguments and its reference protocol settings."""

    env_cls: str
    """``"package.module:ClassName"`` of a :class:`~ragen_envs.core.BaseTextEnv` subclass."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Registered arguments of the env class; ``gymnasium.make`` kwargs override them."""
    protocol: ProtocolSettings = field(default_factory=ProtocolSettings)
    """The reference's turn-protocol settings for this id."""


_ONE_TURN = ProtocolSettings(max_turns=1, actions_per_turn=1, max_actions_per_episode=1)
_GRID = ProtocolSettings(max_turns=5, actions_per_turn=5, max_actions_per_episode=10)

#: id -> :class:`EnvSpec`. The README's table of ids is written from this.
ENV_IDS: dict[str, EnvSpec] = {
    "ragen/Bandit-v0": EnvSpec("ragen_envs.bandit:BanditEnv", {}, _ONE_TURN),
    "ragen/BanditTest-v0": EnvSpec(
        "ragen_envs.bandit:BanditEnv", {"low_risk_name": "Trader", "high_risk_name": "Librarian"}, _ONE_TURN
    ),
    "ragen/BanditRev-v0": EnvSpec("ragen_envs.bandit:BanditEnv", {"reverse": True}, _ONE_TURN),
    "ragen/FrozenLake-v0": EnvSpec("ragen_envs.frozen_lake:FrozenLakeEnv", {}, _GRID),
    "ragen/Countdown-v0": EnvSpec("ragen_envs.countdown:CountdownEnv", {}, _ONE_TURN),
    "ragen/Sokoban-v0": EnvSpec(
        "ragen_envs.sokoban.env:SokobanEnv", {"dim_room": (6, 6), "num_boxes": 1, "search_depth": 300}, _GRID
    ),
    "ragen/SokobanLarge-v0": EnvSpec(
        "ragen_envs.sokoban.env:SokobanEnv", {"dim_room": (8, 8), "num_boxes": 2, "search_depth": 10}, _GRID
    ),
    "ragen/SokobanNewVocab-v0": EnvSpec(
        "ragen_envs.sokoban.env:SokobanEnv",
        {"dim_room": (6, 6), "num_boxes": 1, "search_depth": 30, "vocab": "new"},
        _GRID,
    ),
    "ragen/WebShop-v0": EnvSpec(
        "ragen_envs.webshop:WebShopEnv",
        {},
        ProtocolSettings(max_turns=9, actions_per_turn=1, max_actions_per_episode=9, length_hint=200),
    ),
}


def _game(turns: int, length_hint: int = 100) -> ProtocolSettings:
    """One move per turn, ``turns`` turns (= actions) per episode."""
    return ProtocolSettings(max_turns=turns, actions_per_turn=1, max_actions_per_episode=turns, length_hint=length_hint)


#: The text games' single-agent ids (:mod:`ragen_envs.games`): id -> :class:`EnvSpec`. Turn budgets (most moves of a
#: seat + 3): tic-tac-toe 5 + 3, Connect Four 21 + 3, Prisoner's Dilemma 10 rounds + 3, negotiation 5 + 3 (its
#: messages get a length hint of 200 words). ``tests/envs/test_games.py`` checks them against the envs.
GAME_IDS: dict[str, EnvSpec] = {
    "ragen/TicTacToe-v0": EnvSpec("ragen_envs.games.tictactoe:TicTacToeEnv", {}, _game(8)),
    "ragen/ConnectFour-v0": EnvSpec("ragen_envs.games.connect_four:ConnectFourEnv", {}, _game(24)),
    "ragen/PrisonersDilemma-v0": EnvSpec("ragen_envs.games.prisoners_dilemma:PrisonersDilemmaEnv", {}, _game(13)),
    "ragen/Negotiation-v0": EnvSpec("ragen_envs.games.negotiation:NegotiationEnv", {}, _game(8, 200)),
}


def reference_settings(env_id: str) -> ProtocolSettings:
    """The protocol settings an id is registered with (its reference values), without making the env.

    Works for ids registered with :func:`register_text_env` too; ``ValueError`` for an id that is not a ragen text env.
    """
    if env_id in ENV_IDS:
        return ENV_IDS[env_id].protocol
    if env_id in GAME_IDS:
        return GAME_IDS[env_id].protocol
    spec = gym.registry.get(env_id)
    if spec is None or spec.entry_point != ENTRY_POINT:
        known = sorted(k for k, s in gym.registry.items() if s.entry_point == ENTRY_POINT)
        raise ValueError(f"invalid env id {env_id!r}: not a registered ragen text env; known ids: {known}")
    settings = spec.kwargs.get("reference_protocol")
    return settings if isinstance(settings, ProtocolSettings) else ProtocolSettings()


def register_text_env(
    env_id: str, env_cls: str, *, protocol: ProtocolSettings | None = None, **defaults: Any
) -> None:
    """Register a text env under ``env_id`` so that ``gymnasium.make(env_id)`` returns it inside the turn protocol.

    ``env_cls`` is ``"package.module:ClassName"`` of a :class:`~ragen_envs.core.BaseTextEnv` subclass; ``protocol``
    its protocol settings (default: :class:`ProtocolSettings`'s); ``defaults`` are keyword arguments of the env class
    that ``gymnasium.make`` kwargs can override.
    """
    gym.register(
        id=env_id,
        entry_point=ENTRY_POINT,
        kwargs={"env_cls": env_cls, "reference_protocol": protocol or ProtocolSettings(), **defaults},
        disable_env_checker=False,
    )


def register_all() -> None:
    for env_id, spec in {**ENV_IDS, **GAME_IDS}.items():
        if env_id not in gym.registry:
            register_text_env(env_id, spec.env_cls, protocol=spec.protocol, **spec.kwargs)
