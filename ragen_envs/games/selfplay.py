"""Self-play: both seats of a text game played by agents in the same game, each seat recorded as its own episode.

:func:`play_games` is the multi-seat counterpart of the episode driver (:func:`ragen_envs.driver.play_episodes`): it
plays each job as one game of a PettingZoo env of :mod:`ragen_envs.games.pettingzoo_env` (the AEC env for
turn-based games, the Parallel env for the Prisoner's Dilemma), with one agent per seat, and returns each seat's side
of the game as a driver :class:`~ragen_envs.driver.Episode`. The agents are the driver's (``reply_batch``, or a
:class:`~ragen_envs.driver.StreamingAgent` such as ``ragen_trainer.rollout.TokenAgent``), so the same model agent that
plays single-agent episodes plays a seat here, keeping its token ids in ``episode.memory``; the trainer turns a
seat's episode into a trajectory exactly as it does a single-agent one. ::

    from ragen_envs.driver import rollout_jobs
    from ragen_envs.games.selfplay import FixedOpponentAgent, Matchup, play_games

    jobs = rollout_jobs([0, 1], group_size=4)
    games = play_games("tictactoe", jobs, lambda job: Matchup((policy, policy), (True, True), "self"))

Seat episodes. Each seat reads its own chat (system prompt, its first message with the instructions, then after each
of its replies the message it reads at its next turn, which shows the other seat's moves in between) through its own
turn protocol (:class:`~ragen_envs.games.pettingzoo_env.SeatProtocol`: the same parsing, format penalty and
``info`` contract as the single-agent envs). A seat episode's ``job`` is the game's job with ``group_id`` =
``2 * job.group_id + seat`` and ``tag`` = ``{"seat", "opponent", "game"}``: the rollouts of one initial state are
grouped by state *and* seat (the two seats of a game face different problems), and the agent's per-episode sampling
streams differ between the seats.

Rewards. A seat's turn reward is its own turn's (format penalty, reward wrappers, the game reward of its move) plus
every game reward that reached it before its next turn (a loss or a draw the other seat's move produced, a round's
payoff), credited to its latest turn, so each seat's return is its game score plus its own penalties. A reward that
reaches a seat before its first turn (the other seat forfeited at once) has no turn to sit on: it is kept in the
game's ``scores`` and the seat's episode has no turns (no tokens to train).

Invalid turns and stalls. Bad replies are the PettingZoo env's invalid turns (format penalty, a reason, the same seat
moves again); the ``invalid_cap``-th forfeits, so every game ends. An agent that stops a seat (``AgentReply.stop``,
e.g. the context is full) has that seat's remaining turns played as invalid ones, which forfeits it; the seat's
episode is ``truncated`` with the stop's reason.

Randomness. ``reset(seed=job.seed)``: the rollouts of a group start from the same game. Fixed opponents
(:class:`FixedOpponentAgent`) draw from a generator seeded with the group's seed (shared randomness, the default of
the driver's ``rollout_jobs``), or with ``options["dynamics_seed"]`` when the job carries one (independent).

Needs ``pettingzoo`` (the ``games`` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ragen_envs.core import check_arg
from ragen_envs.driver import MAX_TURNS_GUARD, AgentReply, Episode, EpisodeJob, Turn, is_streaming
from ragen_envs.games import GAMES, pettingzoo_module
from ragen_envs.games.base import AGENTS, Opponent, make_opponent

#: The state keys of a seat's final ``info`` copied onto its last turn when the game ends after that turn.
_FINAL_KEYS = ("success", "outcome", "score")


@dataclass(frozen=True)
class Matchup:
    """Who plays the two seats of one game."""

    agents: tuple[Any, Any]
    """The agent of seat 0 and of seat 1 (the same object for pure self-play)."""
    learner: tuple[bool, bool]
    """Which seats are the learning policy's (their episodes become training trajectories)."""
    opponent: str
    """What the learner faces, for records and metrics: ``"self"``, ``"past"``, or a fixed opponent's name."""


@dataclass
class GameRecord:
    """One played game: its job, matchup, each seat's episode and final score."""

    job: EpisodeJob
    matchup: Matchup
    seats: tuple[Episode, Episode]
    scores: tuple[float, float]
    """Each seat's game score in [0, 1] (win 1, draw 0.5, loss 0 for the board games; see each game)."""
    outcomes: tuple[str | None, str | None]
    """Each seat's outcome word (``"win"``, ``"draw"``, ``"loss"``, ``"deal"``, ...)."""

    def learner_episodes(self) -> list[Episode]:
        """The episodes of the learner's seats, seat 0 first."""
        return [episode for episode, trained in zip(self.seats, self.matchup.learner) if trained]


class FixedOpponentAgent:
    """A turn-synchronous agent that plays one of a game's fixed opponents (``"random"``, ``"rule"``,
    ``"perfect"``...) as a seat: it reads the seat's view of the shared game and answers a well-formed reply.

    One :class:`~ragen_envs.games.base.Opponent` is made per game (stateful opponents remember only their game);
    its generator is seeded with the job's ``dynamics_seed`` when there is one, else with the game's seed.
    """

    def __init__(self, opponent: str | Callable[[], Opponent], table: dict[str, type[Opponent]], game: str) -> None:
        self.name = opponent if isinstance(opponent, str) else getattr(opponent, "name", "opponent")
        self._make = (lambda: make_opponent(opponent, table, game)) if isinstance(opponent, str) else opponent
        if isinstance(opponent, str):
            make_opponent(opponent, table, game)  # a bad name fails now, with the game's choices

    def reply_batch(self, episodes: list[Episode]) -> list[AgentReply]:
        replies = []
        for episode in episodes:
            view = episode.env.unwrapped  # the seat's SeatView over the shared game
            if "opponent" not in episode.memory:
                opponent = self._make()
                opponent.reset(view.seat)
                seed = (episode.job.options or {}).get("dynamics_seed", episode.seed)
                episode.memory["opponent"] = (opponent, np.random.default_rng(int(seed)))
            opponent, rng = episode.memory["opponent"]
            move = opponent.act(view.core.state_view(view.seat), rng)
            replies.append(AgentReply(episode.protocol.format_reply([move], think="fixed opponent")))
        return replies


def play_games(
    game: str,
    jobs: Sequence[EpisodeJob],
    matchup_for: Callable[[EpisodeJob], Matchup],
    *,
    env_kwargs: dict[str, Any] | None = None,
    batch_size: int | None = None,
    progress: Any = None,
) -> list[GameRecord]:
    """Play one game of ``game`` per job, the seats by ``matchup_for(job)``'s agents; returns the games in job order.

    Args:
        game: a name of :data:`ragen_envs.games.GAMES` (``"tictactoe"``, ``"prisoners_dilemma"``, ...).
        jobs: one game each (:func:`ragen_envs.driver.rollout_jobs` makes the usual ``P x N`` groups).
        matchup_for: the :class:`Matchup` of a job (who plays each seat, which seats learn).
        env_kwargs: arguments of the PettingZoo env (``protocol=``, protocol fields, the game's own arguments,
            ``invalid_cap``, ``reward_wrappers``); see :class:`~ragen_envs.games.pettingzoo_env.TextGameAECEnv`.
        batch_size: games played at a time (``None``: all at once).
        progress: a tqdm-like bar advanced by one per finished game, or ``None``.

    Errors of agents and envs propagate (this is the training path); every agent's stream is ended either way.
    """
    check_arg(isinstance(game, str) and game in GAMES, "game", game, f"one of {sorted(GAMES)}")
    check_arg(env_kwargs is None or isinstance(env_kwargs, dict), "env_kwargs", env_kwargs, "None or a dict")
    check_arg(
        batch_size is None or (isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size >= 1),
        "batch_size",
        batch_size,
        "None or an int >= 1",
    )
    entry = GAMES[game]
    pz = pettingzoo_module()  # the games extra; an ImportError that names it when it is missing
    env_cls = pz.TextGameParallelEnv if entry.api == "parallel" else pz.TextGameAECEnv
    jobs = list(jobs)
    size = batch_size or max(len(jobs), 1)
    records: list[GameRecord] = []
    agents: dict[int, _SeatAgent] = {}
    try:
        for start in range(0, len(jobs), size):
            batch = [_LiveGame(env_cls(game, **dict(env_kwargs or {})), job, matchup_for(job), entry.env_id, game)
                     for job in jobs[start : start + size]]  # fmt: skip
            for live in batch:
                for agent in live.matchup.agents:
                    agents.setdefault(id(agent), _SeatAgent(agent))
            _play(batch, agents, progress)
            records.extend(live.record() for live in batch)
    finally:
        for agent in agents.values():
            agent.finish()
    return records


# ---------------------------------------------------------------------------------------------------- internals
class _SeatAgent:
    """One agent as the game loop uses it: a streaming agent as it is, a turn-synchronous one answering at once."""

    def __init__(self, agent: Any) -> None:
        check_arg(
            is_streaming(agent) or callable(getattr(agent, "reply_batch", None)),
            "agent",
            agent,
            "an object with reply_batch(episodes), or a StreamingAgent (submit, poll, pending, release, finish_stream)",
        )
        self.agent = agent
        self.streaming = is_streaming(agent)

    def submit(self, episode: Episode) -> AgentReply | str | None:
        return self.agent.submit(episode) if self.streaming else self.agent.reply_batch([episode])[0]

    def poll(self) -> list[tuple[Episode, AgentReply | str]]:
        return self.agent.poll() if self.streaming and self.agent.pending() else []

    def pending(self) -> bool:
        return self.streaming and self.agent.pending()

    def release(self, episode: Episode) -> None:
        if self.streaming:
            self.agent.release(episode)

    def finish(self) -> None:
        if self.streaming:
            self.agent.finish_stream()


@dataclass
class _LiveGame:
    """A game being played: the PettingZoo env, the seats' episodes and the replies in flight."""

    env: Any
    job: EpisodeJob
    matchup: Matchup
    env_id: str
    game: str
    seats: list[Episode] = field(default_factory=list)
    asked: set[int] = field(default_factory=set)  # seats whose reply is being generated
    replies: dict[int, AgentReply] = field(default_factory=dict)  # seats whose reply waits to be stepped
    stopped: set[int] = field(default_factory=set)  # seats an agent stopped (their turns are played as invalid)

    def __post_init__(self) -> None:
        self.agent_names = AGENTS
        self.parallel = not hasattr(self.env, "agent_selection")
        if self.parallel:
            _, infos = self.env.reset(seed=self.job.seed, options=self.job.options)
        else:
            self.env.reset(seed=self.job.seed, options=self.job.options)
            infos = self.env.infos
        for seat, name in enumerate(self.agent_names):
            chain = self.env.chains[seat]
            info = dict(infos[name])
            system = str(info.get("system_prompt") or "")
            job = replace(self.job, group_id=2 * self.job.group_id + seat,
                          tag={"seat": seat, "opponent": self.matchup.opponent, "game": self.game})  # fmt: skip
            # The first user message is made when the seat first moves: it shows the moves played before it.
            messages = [{"role": "system", "content": system}] if system else []
            self.seats.append(Episode(env_id=self.env_id, env_name=f"{self.env_id} seat {seat}", job=job, env=chain,
                                      messages=messages, info=info, reset_info=info))  # fmt: skip

    @property
    def over(self) -> bool:
        return all(e.done for e in self.seats)

    def to_move(self) -> list[int]:
        """The seats expected to reply now."""
        if self.over:
            return []
        if self.parallel:
            return [self.agent_names.index(a) for a in self.env.agents]
        name = self.env.agent_selection
        if self.env.terminations[name] or self.env.truncations[name]:
            return []
        return [self.agent_names.index(name)]

    def message_for(self, seat: int) -> None:
        """Before asking a seat: its chat gets the message it reads now (the other seat's moves included), unless
        it already ends with one. The previous turn's ``observation`` is that message."""
        episode = self.seats[seat]
        if episode.messages and episode.messages[-1]["role"] == "user":
            return
        observation = str(self.env.observe(self.agent_names[seat]))
        episode.messages.append({"role": "user", "content": observation})
        if episode.turns:
            episode.turns[-1].observation = observation

    def ready(self) -> bool:
        """Every seat to move has its reply (or was stopped): the env can step."""
        return all(seat in self.replies or seat in self.stopped for seat in self.to_move())

    def step(self) -> None:
        """Step the env with the replies of the seats to move and record each seat's turn and rewards."""
        movers = self.to_move()
        replies = {seat: self.replies.pop(seat) for seat in movers if seat not in self.stopped}
        names = self.agent_names
        if self.parallel:  # a stopped seat's action is None: an invalid turn
            actions = {names[s]: (replies[s].text if s in replies else None) for s in movers}
            _, rewards, terminations, truncations, infos = self.env.step(actions)
        else:
            self.env.step(replies[movers[0]].text if movers[0] in replies else None)
            rewards, infos = dict(self.env.rewards), self.env.infos
            terminations, truncations = self.env.terminations, self.env.truncations
        for seat in movers:
            name = names[seat]
            if seat not in replies:  # no reply of the model: the reward goes to its latest turn, if any
                self._credit(seat, float(rewards.get(name, 0.0)))
                continue
            reply = replies[seat]
            self.seats[seat].turns.append(Turn(reply.text, "", float(rewards.get(name, 0.0)),
                                               bool(terminations.get(name, False)), bool(truncations.get(name, False)),
                                               dict(infos[name]), reply.tokens))  # fmt: skip
            self.seats[seat].messages.append({"role": "assistant", "content": reply.text})
        for seat in (0, 1):  # a passive seat's game reward (the other seat's move ended the game or paid a round)
            if seat not in movers and rewards.get(names[seat], 0.0):
                self._credit(seat, float(rewards[names[seat]]))
        for seat, name in enumerate(names):  # the latest info (the env refreshes every seat's state keys)
            latest = self.env.infos.get(name) if not self.parallel else infos.get(name)
            if latest is not None:
                self.seats[seat].info = dict(latest)
        if self._finished():
            self._end()

    def _credit(self, seat: int, reward: float) -> None:
        """Add a game reward that reached ``seat`` outside its own turn to its latest turn (none yet: it is only in
        the game's score)."""
        episode = self.seats[seat]
        if episode.turns:
            turn = episode.turns[-1]
            turn.reward += reward
            parts = turn.info.setdefault("reward_parts", {})
            parts["env"] = float(parts.get("env", 0.0)) + reward

    def _finished(self) -> bool:
        if self.parallel:
            return not self.env.agents
        return all(self.env.terminations.values()) or all(self.env.truncations.values())

    def _end(self) -> None:
        for seat, episode in enumerate(self.seats):
            self.message_for(seat)  # the message that says the game is over, for the record
            if episode.turns:  # the result reached the seat after its last turn: its last turn's info says it
                episode.turns[-1].info.update({k: episode.info[k] for k in _FINAL_KEYS if k in episode.info})
            episode.done = True
            episode.terminated = seat not in self.stopped
            episode.truncated = seat in self.stopped

    def record(self) -> GameRecord:
        core = self.env.core
        outcomes = (core.outcome(0), core.outcome(1))
        for episode in self.seats:
            episode.env = None  # the record keeps no live env
        return GameRecord(self.job, self.matchup, (self.seats[0], self.seats[1]),
                          (core.score(0), core.score(1)), outcomes)  # fmt: skip


def _play(games: list[_LiveGame], agents: dict[int, _SeatAgent], progress: Any) -> None:
    """The loop: ask every seat to move, step the games whose movers have replied, poll the agents otherwise;
    ``progress`` advances by one as each game ends."""
    waiting: dict[int, tuple[_LiveGame, int]] = {}  # id(seat episode) -> its game and seat
    while True:
        live = [g for g in games if not g.over]
        if not live:
            return
        progressed = False
        for game in live:
            if max(len(e.turns) for e in game.seats) >= MAX_TURNS_GUARD:  # a guard against a broken game
                raise RuntimeError(f"a {game.game} game (seed {game.job.seed}) did not end in {MAX_TURNS_GUARD} turns")
            for seat in game.to_move():
                if seat in game.asked or seat in game.replies or seat in game.stopped:
                    continue
                game.message_for(seat)
                agent = agents[id(game.matchup.agents[seat])]
                reply = agent.submit(game.seats[seat])
                game.asked.add(seat)
                if reply is None:
                    waiting[id(game.seats[seat])] = (game, seat)
                else:
                    _take(game, seat, reply)
                progressed = True
            if not game.over and game.to_move() and game.ready():
                game.step()
                progressed = True
                if game.over:
                    for seat, episode in enumerate(game.seats):
                        agents[id(game.matchup.agents[seat])].release(episode)
                    if progress is not None:
                        progress.update(1)
        if progressed:
            continue
        busy = [a for a in agents.values() if a.pending()]
        if not busy:
            raise RuntimeError(f"self-play stalled: {len(waiting)} replies owed and no agent has pending work")
        for agent in busy:
            for episode, reply in agent.poll():
                game, seat = waiting.pop(id(episode))
                _take(game, seat, reply)


def _take(game: _LiveGame, seat: int, reply: AgentReply | str) -> None:
    """A seat's reply arrived: keep it for the step, or stop the seat (its turns are then played as invalid)."""
    reply = reply if isinstance(reply, AgentReply) else AgentReply(str(reply))
    game.asked.discard(seat)
    if reply.stop is not None:
        game.stopped.add(seat)
        game.seats[seat].end_reason = reply.stop
    else:
        game.replies[seat] = reply


__all__ = ["FixedOpponentAgent", "GameRecord", "Matchup", "play_games"]
