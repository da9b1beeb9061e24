"""Multi-agent text games for LLM agents: TicTacToe, ConnectFour, the iterated Prisoner's Dilemma and a negotiation
language game, each playable three ways:

* **single-agent** -- ``gymnasium.make("ragen/TicTacToe-v0", opponent="perfect")``: one seat against a fixed opponent,
  a ragen text env like the others (turn protocol, reward wrappers, info contract), so the trainer, the evaluation
  and the TRL integration work on it unchanged (:mod:`ragen_envs.games.view`);
* **PettingZoo** -- :func:`aec_env` (turn-based games) and :func:`parallel_env` (the Prisoner's Dilemma): every seat
  is an agent replying through its own turn protocol (:mod:`ragen_envs.games.pettingzoo_env`; needs ``pettingzoo``,
  the ``games`` extra, imported only when one of these two functions is called);
* **rules only** -- the game cores (:class:`TicTacToe`, ...) and the fixed opponents (each game module's
  ``OPPONENTS``; their names in :data:`OPPONENT_NAMES`), plain Python, for tests, search and scripted play.

See ``docs/games.md`` for each game's rules, texts, rewards, forfeit rule and opponents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ragen_envs.games.base import DRAW, INVALID_CAP, LOSS, WIN, GameCore, Opponent, RandomOpponent
from ragen_envs.games.connect_four import ConnectFour, ConnectFourEnv
from ragen_envs.games.negotiation import Negotiation, NegotiationEnv
from ragen_envs.games.prisoners_dilemma import PrisonersDilemma, PrisonersDilemmaEnv
from ragen_envs.games.tictactoe import PerfectTicTacToe, TicTacToe, TicTacToeEnv
from ragen_envs.games.view import GameEnv, SeatView

if TYPE_CHECKING:  # pettingzoo is optional: only the type checker sees these imports
    from pettingzoo import AECEnv, ParallelEnv


@dataclass(frozen=True)
class GameEntry:
    """One game: its rules, its single-agent env class and id, and its PettingZoo API."""

    core: type[GameCore]
    env: type[GameEnv]
    env_id: str
    api: str  # "aec" or "parallel"
    strongest: str
    """The strongest of its fixed opponents, which reference players (the leaderboard's oracle, ``ragen-demo``) put
    in a seat: perfect play for TicTacToe; rule-based players for the others, strong but not optimal, and
    tit-for-tat for the Prisoner's Dilemma, which is not a best response to every opponent."""

    @property
    def opponents(self) -> dict[str, type[Opponent]]:
        """The fixed opponents of its single-agent view, by name."""
        return dict(self.env.opponents)


#: Game name -> :class:`GameEntry`; the names are what :func:`aec_env` / :func:`parallel_env` take.
GAMES: dict[str, GameEntry] = {
    "tictactoe": GameEntry(TicTacToe, TicTacToeEnv, "ragen/TicTacToe-v0", "aec", "perfect"),
    "connect_four": GameEntry(ConnectFour, ConnectFourEnv, "ragen/ConnectFour-v0", "aec", "rule"),
    "prisoners_dilemma": GameEntry(PrisonersDilemma, PrisonersDilemmaEnv, "ragen/PrisonersDilemma-v0", "parallel",
                                   "tit_for_tat"),
    "negotiation": GameEntry(Negotiation, NegotiationEnv, "ragen/Negotiation-v0", "aec", "rule"),
}

#: Game name -> its opponents' names (what ``opponent=`` accepts besides an :class:`Opponent` instance).
OPPONENT_NAMES: dict[str, tuple[str, ...]] = {name: tuple(entry.env.opponents) for name, entry in GAMES.items()}


def game_of(env_id: str) -> str | None:
    """The game name of a single-agent game id (``"ragen/TicTacToe-v0"`` -> ``"tictactoe"``), ``None`` for other ids."""
    return next((name for name, entry in GAMES.items() if entry.env_id == env_id), None)


def aec_env(game: str | GameCore = "tictactoe", **kwargs: Any) -> AECEnv:
    """A turn-based game as a PettingZoo AEC env (``"tictactoe"``, ``"connect_four"``, ``"negotiation"``).

    Imports ``pettingzoo`` (``pip install "ragen[games]"``); arguments: ``TextGameAECEnv``.
    """
    return pettingzoo_module().aec_env(game, **kwargs)


def parallel_env(game: str | GameCore = "prisoners_dilemma", **kwargs: Any) -> ParallelEnv:
    """A simultaneous game as a PettingZoo Parallel env (``"prisoners_dilemma"``).

    Imports ``pettingzoo`` (``pip install "ragen[games]"``); arguments: ``TextGameParallelEnv``.
    """
    return pettingzoo_module().parallel_env(game, **kwargs)


def pettingzoo_module() -> Any:
    """:mod:`ragen_envs.games.pettingzoo_env`, or an ``ImportError`` that says how to install PettingZoo."""
    try:
        from ragen_envs.games import pettingzoo_env
    except ImportError as exc:
        raise ImportError(
            f"the PettingZoo games need the pettingzoo package ({exc}); install it with "
            "pip install 'ragen[games]' (or pip install 'pettingzoo>=1.24')"
        ) from exc
    return pettingzoo_env


__all__ = [
    "DRAW",
    "GAMES",
    "INVALID_CAP",
    "LOSS",
    "OPPONENT_NAMES",
    "WIN",
    "ConnectFour",
    "ConnectFourEnv",
    "GameCore",
    "GameEntry",
    "GameEnv",
    "Negotiation",
    "NegotiationEnv",
    "Opponent",
    "PerfectTicTacToe",
    "PrisonersDilemma",
    "PrisonersDilemmaEnv",
    "RandomOpponent",
    "SeatView",
    "TicTacToe",
    "TicTacToeEnv",
    "aec_env",
    "game_of",
    "parallel_env",
    "pettingzoo_module",
]
