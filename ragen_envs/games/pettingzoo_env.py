"""PettingZoo environments of the text games: every seat is an LLM agent replying through the turn protocol.

This module imports ``pettingzoo`` (the ``games`` extra: ``pip install "ragen[games]"``); nothing else in
``ragen_envs`` imports it, so ``import ragen_envs`` stays light and works without it.

* :class:`TextGameAECEnv` -- the AEC API, for the turn-based games (``tictactoe``, ``connect_four``,
  ``negotiation``); :func:`aec_env` makes one inside PettingZoo's order-enforcing wrapper.
* :class:`TextGameParallelEnv` -- the Parallel API, for the simultaneous game (``prisoners_dilemma``);
  :func:`parallel_env` makes one.

::

    from ragen_envs.games import aec_env
    env = aec_env("tictactoe")
    env.reset(seed=0)
    for agent in env.agent_iter():
        prompt, reward, terminated, truncated, info = env.last()
        env.step(None if terminated or truncated else my_model(agent, prompt, info))

Agents are ``player_0`` (seat 0, moves first) and ``player_1``. ``reset(seed=s)`` gives the same game for the same
``s`` (an unseeded reset continues the generator; ``options`` are accepted and not used). Spaces: ``UnicodeText``
for both, like the single-agent envs: an action is the model's whole reply for the turn
(``<think>...</think><answer>5</answer>``, or the bare-answer forms when thinking is off), an observation the next
user message of that seat (a ``str``; its subclass :class:`TextObservation` only adds the ``dtype`` attribute that
PettingZoo's API test asks of observations).

The protocol per seat. Each seat has its own :class:`SeatProtocol` -- the single-agent
:class:`~ragen_envs.protocol.TurnProtocol` (the same parsing, format penalty, protocol settings, prompt layouts and
``info`` contract) over a :class:`~ragen_envs.games.view.SeatView` of the shared game -- inside the reward wrappers
named by ``reward_wrappers`` (``format``, ``thinking_length``; ``grounding`` recognises no claims in games and pays 0).
``observe(agent)`` is the message the seat reads at its next turn, made when that turn comes, so it shows the other
seat's moves since its last one; the seat's first message carries the instructions (reference layout) and
``info["system_prompt"]`` the system message, as on the single-agent envs.

Settings: the game's registered single-agent settings (``reference_settings("ragen/TicTacToe-v0")`` ...), with
``protocol=`` (a dict or :class:`~ragen_envs.settings.ProtocolSettings`) and keyword fields on top, except the turn
budget, which the game owns: one move per turn (``actions_per_turn`` must stay 1), and ``max_turns`` /
``max_actions_per_episode`` are set to ``max_moves + 2 * invalid_cap`` per seat (:attr:`turn_budget`), so the
protocol never ends a game before its rules do (setting them by keyword or in a dict is an error; a whole
``ProtocolSettings`` has them replaced, with a ``UserWarning`` naming both values when they differ from the id's
registered ones).

Invalid turns. A turn in which no move was played (unparseable reply, illegal or unknown move, a non-``str`` action)
has the protocol's format penalty and ``info["reason"]``; in turn-based games the same seat moves again, in the
Prisoner's Dilemma the round is void and replayed (the other seat's valid choice is discarded, unseen). A seat's
``invalid_cap``-th invalid turn (default 3, counted over the game) forfeits it (each game's docstring says what a
forfeit scores); in the Prisoner's Dilemma, if both seats reach the cap in the same round, every round left scores
as mutual defection. So every game ends within a bounded number of steps, whatever the replies.

Rewards (``rewards[agent]``, accumulated by ``last()``): the acting seat's turn reward (format penalty, reward
wrappers' bonuses, its game reward) and the game rewards the move gave the other seat (a loss, a deal, a round's
payoff); each seat's game rewards sum to its score in [0, 1]. ``infos[agent]`` holds the info contract of the seat's
last turn (``reward_parts`` sum to its last reward) plus ``agent``, ``seat``, ``legal_actions``, ``outcome``,
``score``, ``invalid_turns``, ``invalid_cap`` and ``forfeit`` (and, in the Parallel env, ``round_void``: whether
this step's choices were discarded). The state keys (``success``, ``legal_actions``, ``outcome``, ``score``) of every
live seat are refreshed after each step.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils.seeding import np_random
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils import wrappers

from ragen_envs.core import check_arg, default_info
from ragen_envs.games import GAMES
from ragen_envs.games.base import AGENTS, INVALID_CAP, GameCore, turn_budget_changes
from ragen_envs.games.view import SeatView
from ragen_envs.protocol import TurnProtocol
from ragen_envs.registration import reference_settings
from ragen_envs.rewards import wrap_rewards
from ragen_envs.settings import ProtocolSettings, merge_settings, split_protocol_kwargs
from ragen_envs.spaces import UnicodeText

#: Longest reply the action space samples (replies of any length are accepted).
MAX_SAMPLED_REPLY = 256
#: Protocol fields the game sets in PettingZoo (the turn budget).
_GAME_OWNED = ("max_turns", "actions_per_turn", "max_actions_per_episode")


class TextObservation(str):
    """An observation: a plain ``str`` that also carries its space's ``dtype`` (``UnicodeText``'s,
    ``numpy.dtype(str)``), because PettingZoo's API contract checks every observation's ``dtype`` against its
    space's. Everything else about it is ``str`` (operations on it return plain ``str``)."""

    __slots__ = ()
    dtype = np.dtype(str)


class SeatProtocol(TurnProtocol):
    """The turn protocol of one seat of a multi-seat game.

    It steps exactly as :class:`~ragen_envs.protocol.TurnProtocol` does; what it adds is the seat's *next* message,
    made when asked (:meth:`message`): the other seat moves between two turns of this one, so the message that
    ``step`` returns (the state right after this seat's own move) is not the one the seat should read next.
    """

    def __init__(self, env: SeatView, settings: ProtocolSettings) -> None:
        super().__init__(env, settings)
        self._last: tuple[float | int, float, str | None] = (0, 0.0, None)  # env reward, total, reason

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._last = (0, 0.0, None)
        return super().reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = super().step(action)
        penalty = info["reward_parts"].get("format_penalty", 0.0)
        # As the protocol prints it: the int 0 when no move ran, else the move's reward.
        env_reward: float | int = float(reward) - penalty if info["actions"] else 0
        self._last = (env_reward, float(reward), info["reason"])
        return observation, float(reward), terminated, truncated, info

    def add_game_reward(self, reward: float) -> None:
        """Add a game reward that reached the seat after its turn (a round resolved by the other seat's choice)."""
        env_reward, total, reason = self._last
        self._last = (float(env_reward) + reward, total + reward, reason)

    def end_game(self, reward: float | None = None) -> None:
        """Mark the game over for this seat (its next message says so). ``reward``: the game ended on the other
        seat's turn and gave this seat that reward, which the message shows."""
        self._done = True
        if reward is not None:
            self._last = (reward, reward, None)

    @property
    def turns_taken(self) -> int:
        """The turns this seat has taken in the current game."""
        return self._turn

    def message(self) -> str:
        """The user message this seat reads now: the first message before its first turn, then the reward of its
        last turn and the current state (or that the game has ended)."""
        if self._turn == 0 and not self._done:
            state = self._turn_prompt(self._state_text())
            if self.settings.prompt_layout == "reference":
                return self._cap(self.reference_instructions() + state)
            return self._cap(state)
        return self._cap(self._next_observation(*self._last))


def _resolve_game(game: str | GameCore, game_kwargs: dict[str, Any]) -> tuple[GameCore, str]:
    """The game core and its single-agent id, from a name of :data:`ragen_envs.games.GAMES` or a core instance."""
    if isinstance(game, GameCore):
        check_arg(not game_kwargs, "game_kwargs", sorted(game_kwargs), "none when game is a GameCore instance")
        matches = [g.env_id for g in GAMES.values() if isinstance(game, g.core)]
        return game, matches[0] if matches else ""
    check_arg(isinstance(game, str) and game in GAMES, "game", game, f"one of {sorted(GAMES)} or a GameCore instance")
    entry = GAMES[game]
    return entry.core(**game_kwargs), entry.env_id


class _TextGameBase:
    """What the AEC and the Parallel env share: the game, the seats' protocols and their bookkeeping.

    Its ``__init__`` takes the arguments of both envs (see :class:`TextGameAECEnv`); each env sets its own default
    ``game`` and checks that the game fits its API.
    """

    def __init__(
        self,
        game: str | GameCore,
        *,
        invalid_cap: int = INVALID_CAP,
        protocol: ProtocolSettings | Mapping[str, Any] | None = None,
        reward_wrappers: Sequence[Any] | str = (),
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()  # the PettingZoo class that follows this mixin in the MRO (AECEnv or ParallelEnv)
        check_arg(
            isinstance(invalid_cap, int) and not isinstance(invalid_cap, bool) and invalid_cap >= 1,
            "invalid_cap",
            invalid_cap,
            "an int >= 1 (a seat's invalid_cap-th invalid turn forfeits the game)",
        )
        check_arg(render_mode in (None, "ansi"), "render_mode", render_mode, "None or 'ansi'")
        fields = split_protocol_kwargs(kwargs)
        self.core, env_id = _resolve_game(game, kwargs)
        self.invalid_cap = invalid_cap
        self.render_mode = render_mode
        self.settings = self._settings(env_id, protocol, fields)
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self.views = [SeatView(self.core, seat) for seat in (0, 1)]
        self.protocols = [SeatProtocol(view, self.settings) for view in self.views]
        self.chains: list[gym.Env] = list(self.protocols)
        if reward_wrappers:
            self.chains = [wrap_rewards(p, reward_wrappers) for p in self.protocols]
        self.observation_spaces = {a: UnicodeText(self.settings.max_observation_chars) for a in AGENTS}
        self.action_spaces = {a: UnicodeText(MAX_SAMPLED_REPLY) for a in AGENTS}
        self.metadata = {"render_modes": ["ansi"], "name": f"ragen_{self.core.name}_v0", "is_parallelizable": False}
        self._rng: np.random.Generator | None = None
        self.invalid_turns = [0, 0]

    def _settings(
        self, env_id: str, protocol: ProtocolSettings | Mapping[str, Any] | None, fields: dict[str, Any]
    ) -> ProtocolSettings:
        """The seats' protocol settings: the game's registered ones, the caller's on top, the game's turn budget."""
        base = reference_settings(env_id) if env_id else ProtocolSettings()
        whole = isinstance(protocol, ProtocolSettings)  # a whole settings object carries every field
        given = protocol.to_dict() if isinstance(protocol, ProtocolSettings) else protocol
        check_arg(given is None or isinstance(given, Mapping), "protocol", protocol, "a dict or a ProtocolSettings")
        given = dict(given or {})
        # A whole ProtocolSettings has every field: its turn budget is replaced by the game's, with a warning that
        # names both when it differs from the registered one (never silently). Given one by one (keywords, a dict),
        # a turn-budget field is a mistake to report, except one move per turn.
        if whole and env_id:
            changed = turn_budget_changes(protocol, base)
            if changed:
                given_text = ", ".join(f"{name}={mine} (registered: {theirs})"
                                       for name, (mine, theirs) in changed.items())  # fmt: skip
                warnings.warn(f"{env_id}: the protocol's {given_text} replaced by the game's own turn budget "
                              f"{self.turn_budget} (max_moves + 2 * invalid_cap; set it with invalid_cap): when both "
                              "seats play, the game's rules end it", UserWarning, stacklevel=4)  # fmt: skip
        explicit = {**({} if whole else given), **fields}
        per_turn = explicit.get("actions_per_turn", 1)
        check_arg(per_turn == 1, "actions_per_turn", per_turn, "1 (a game takes one move per turn)")
        for name in ("max_turns", "max_actions_per_episode"):
            check_arg(
                name not in explicit,
                name,
                explicit.get(name),
                "left unset: in PettingZoo the game's rules end it (a seat's budget is max_moves + 2 * invalid_cap)",
            )
        given = {k: v for k, v in given.items() if k not in _GAME_OWNED}
        fields = {k: v for k, v in fields.items() if k not in _GAME_OWNED}
        settings = merge_settings(base, [("the protocol argument", given), ("keyword arguments", fields)])
        budget = self.turn_budget
        return settings.updated({"actions_per_turn": 1, "max_turns": budget, "max_actions_per_episode": budget})

    @property
    def turn_budget(self) -> int:
        """The game's own move budget per seat: the most moves a seat can need plus ``2 * invalid_cap`` (what the
        seats' ``max_turns`` and ``max_actions_per_episode`` are set to)."""
        return max(self.core.max_moves(0), self.core.max_moves(1)) + 2 * self.invalid_cap

    # ------------------------------------------------------------------ spaces, render
    def observation_space(self, agent: str) -> gym.spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gym.spaces.Space:
        return self.action_spaces[agent]

    def observe(self, agent: str) -> str:
        """The user message ``agent`` reads at its next turn (see the module docstring)."""
        return TextObservation(self.protocols[AGENTS.index(agent)].message())

    def render(self) -> str | None:
        return self.core.render() if self.render_mode == "ansi" else None

    def close(self) -> None:
        return None

    # ------------------------------------------------------------------ shared steps
    def _start(self, seed: int | None) -> dict[str, dict[str, Any]]:
        """Restart the game and every seat's protocol; the seats' reset infos."""
        if seed is not None or self._rng is None:
            self._rng, _ = np_random(seed)
        self.core.reset(self._rng)
        self.agents = list(AGENTS)
        self.invalid_turns = [0, 0]
        infos = {}
        for seat, agent in enumerate(AGENTS):
            _, info = self.chains[seat].reset()
            infos[agent] = self._decorate(info, seat, forfeit=False)
        return infos

    def _refresh(self, info: dict[str, Any], seat: int) -> None:
        """Bring the state keys of ``info`` (``success``, ``legal_actions``, ``outcome``, ``score``) up to date."""
        info.update(self.views[seat].state_info())
        info["success"] = self.core.success(seat)

    def _decorate(self, info: dict[str, Any], seat: int, *, forfeit: bool) -> dict[str, Any]:
        self._refresh(info, seat)
        info.update(
            agent=AGENTS[seat], invalid_turns=self.invalid_turns[seat], invalid_cap=self.invalid_cap, forfeit=forfeit
        )
        return info

    def _turn(self, seat: int, action: Any) -> tuple[float, dict[str, Any], bool]:
        """Step ``seat``'s protocol with its reply: ``(reward, info, moved)``; counts an invalid turn."""
        self.views[seat].last_rewards = {}
        _, reward, _, truncated, info = self.chains[seat].step(action)
        moved = bool(info["actions"])
        if not moved:
            self.invalid_turns[seat] += 1
        # A protocol out of turns (it cannot happen within the game's budget) is treated as reaching the cap.
        if truncated and not self.core.over:
            self.invalid_turns[seat] = max(self.invalid_turns[seat], self.invalid_cap)
        return float(reward), info, moved

    def _passive_info(self, seat: int, reward: float) -> dict[str, Any]:
        """The info of a seat that did not reply this step but got a game reward (the game ended, a round paid)."""
        info = default_info(success=self.core.success(seat), reward_parts={"env": reward, "format_penalty": 0.0})
        info.update(reason=None, turn=self.protocols[seat].turns_taken, invalid_actions=[], dropped_actions=[])
        return self._decorate(info, seat, forfeit=False)


class TextGameAECEnv(_TextGameBase, AECEnv):
    """A turn-based text game under PettingZoo's AEC API. See the module docstring.

    Args:
        game: ``"tictactoe"``, ``"connect_four"`` or ``"negotiation"`` (or a turn-based :class:`GameCore`).
        invalid_cap: a seat's ``invalid_cap``-th invalid turn forfeits the game (default 3).
        protocol: protocol settings on top of the game's registered ones (a dict or a ``ProtocolSettings``).
        reward_wrappers: reward wrappers per seat, as ``gymnasium.make(..., reward_wrappers=...)`` takes them.
        render_mode: ``None`` or ``"ansi"`` (``render()`` returns the whole board or history as text).
        **kwargs: protocol fields (``enable_think=False``, ``format_penalty=-0.2``, ...) and the game's own
            arguments (``turn_cap=6`` for the negotiation).
    """

    def __init__(self, game: str | GameCore = "tictactoe", **kwargs: Any) -> None:
        super().__init__(game, **kwargs)
        check_arg(
            not self.core.simultaneous, "game", game, "a turn-based game (use parallel_env for simultaneous ones)"
        )
        self.agent_selection = AGENTS[0]
        self.rewards: dict[str, float] = {}
        self._cumulative_rewards: dict[str, float] = {}
        self.terminations: dict[str, bool] = {}
        self.truncations: dict[str, bool] = {}
        self.infos: dict[str, dict[str, Any]] = {}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.infos = self._start(seed)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.agent_selection = AGENTS[self.core.to_move()[0]]

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        seat = AGENTS.index(agent)
        other = 1 - seat
        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict.fromkeys(self.agents, 0.0)

        reward, info, moved = self._turn(seat, action)
        game_rewards = dict(self.views[seat].last_rewards) if moved else {}
        forfeit = False
        if not self.core.over and self.invalid_turns[seat] >= self.invalid_cap:
            forfeit = True
            penalties = self.core.forfeit(seat)
            own = float(penalties.get(seat, 0.0))
            reward += own
            info["reward_parts"]["env"] = info["reward_parts"].get("env", 0.0) + own
            self.protocols[seat].add_game_reward(own)
            info["reason"] = f"{info['reason']}; invalid turn {self.invalid_turns[seat]} of {self.invalid_cap}: forfeit"
            game_rewards = {other: float(penalties.get(other, 0.0))}
        self.rewards[agent] = reward
        self.infos[agent] = self._decorate(info, seat, forfeit=forfeit)

        if self.core.over:
            other_reward = float(game_rewards.get(other, 0.0))
            self.rewards[AGENTS[other]] = other_reward
            self.protocols[other].end_game(other_reward)
            self.protocols[seat].end_game()  # after a forfeit its protocol does not know yet
            self.infos[AGENTS[other]] = self._passive_info(other, other_reward)
            self.terminations = dict.fromkeys(self.agents, True)
            self.agent_selection = AGENTS[other]  # the dead agents are stepped with None, the other one first
        else:
            self.agent_selection = AGENTS[self.core.to_move()[0]]  # the same seat again after an invalid turn
        for a in self.agents:  # the state keys (legal actions, outcome, score) are the current state's for everyone
            self._refresh(self.infos[a], AGENTS.index(a))
        self._accumulate_rewards()


class TextGameParallelEnv(_TextGameBase, ParallelEnv):
    """A simultaneous text game under PettingZoo's Parallel API. See the module docstring; arguments as
    :class:`TextGameAECEnv` (``game``: ``"prisoners_dilemma"``, whose arguments ``rounds`` and ``payoffs`` go in
    ``kwargs``)."""

    def __init__(self, game: str | GameCore = "prisoners_dilemma", **kwargs: Any) -> None:
        super().__init__(game, **kwargs)
        check_arg(self.core.simultaneous, "game", game, "a simultaneous game (use aec_env for turn-based ones)")

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        infos = self._start(seed)
        return {a: self.observe(a) for a in self.agents}, infos

    def step(
        self, actions: Mapping[str, Any]
    ) -> tuple[dict[str, str], dict[str, float], dict[str, bool], dict[str, bool], dict[str, dict[str, Any]]]:
        check_arg(isinstance(actions, Mapping), "actions", type(actions).__name__, "a dict agent -> reply text")
        live = list(self.agents)
        if not live:
            raise ValueError("invalid call to step(): the game is over; call reset()")
        rewards: dict[str, float] = {}
        infos: dict[str, dict[str, Any]] = {}
        moved: dict[int, bool] = {}
        for agent in live:
            seat = AGENTS.index(agent)
            # A live agent without an action replied nothing: an invalid turn, like any non-text reply.
            rewards[agent], infos[agent], moved[seat] = self._turn(seat, actions.get(agent))
        movers = [s for s, ok in moved.items() if ok]
        if len(movers) < len(live):  # someone's reply was invalid: the round is void and replayed
            for seat in movers:
                self.core.withdraw(
                    seat,
                    f"Your choice for round {self.core.state_view(seat).get('round')} was discarded: the other "
                    "player's reply was invalid, so the round is played again.",
                )
                self.views[seat].last_rewards = {}
        # The round's payoffs came from the last choice made; the first chooser's protocol saw none of them.
        round_rewards: dict[int, float] = {}
        for seat in movers:
            for k, r in self.views[seat].last_rewards.items():
                round_rewards[k] = round_rewards.get(k, 0.0) + float(r)
        for seat in movers:
            late = round_rewards.get(seat, 0.0) - float(self.views[seat].last_rewards.get(seat, 0.0))
            if late:
                agent = AGENTS[seat]
                rewards[agent] += late
                infos[agent]["reward_parts"]["env"] = infos[agent]["reward_parts"].get("env", 0.0) + late
                self.protocols[seat].add_game_reward(late)
        capped = [s for s in (0, 1) if AGENTS[s] in live and self.invalid_turns[s] >= self.invalid_cap]
        forfeits: dict[int, float] = {}
        if capped and not self.core.over:
            forfeits = self.core.forfeit(capped[0]) if len(capped) == 1 else self.core.forfeit_all()
            for seat, r in forfeits.items():
                agent = AGENTS[seat]
                rewards[agent] += float(r)
                infos[agent]["reward_parts"]["env"] = infos[agent]["reward_parts"].get("env", 0.0) + float(r)
                self.protocols[seat].add_game_reward(float(r))
                if seat in capped:
                    infos[agent]["reason"] = (
                        f"{infos[agent]['reason']}; invalid turn {self.invalid_turns[seat]} of {self.invalid_cap}: "
                        "forfeit"
                    )
        over = self.core.over
        for agent in live:
            seat = AGENTS.index(agent)
            infos[agent] = self._decorate(infos[agent], seat, forfeit=seat in capped)
            infos[agent]["round_void"] = len(movers) < len(live)
            if over:
                self.protocols[seat].end_game()
        observations = {a: self.observe(a) for a in live}
        terminations = dict.fromkeys(live, over)
        truncations = dict.fromkeys(live, False)
        if over:
            self.agents = []
        return observations, rewards, terminations, truncations, infos


def aec_env(game: str | GameCore = "tictactoe", **kwargs: Any) -> AECEnv:
    """A turn-based game as a PettingZoo AEC env, inside PettingZoo's order-enforcing wrapper (arguments:
    :class:`TextGameAECEnv`)."""
    return wrappers.OrderEnforcingWrapper(TextGameAECEnv(game, **kwargs))


def parallel_env(game: str | GameCore = "prisoners_dilemma", **kwargs: Any) -> ParallelEnv:
    """A simultaneous game as a PettingZoo Parallel env (arguments: :class:`TextGameParallelEnv`)."""
    return TextGameParallelEnv(game, **kwargs)


__all__ = [
    "AGENTS",
    "SeatProtocol",
    "TextGameAECEnv",
    "TextGameParallelEnv",
    "aec_env",
    "parallel_env",
]
