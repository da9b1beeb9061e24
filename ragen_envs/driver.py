"""The one episode driver: play batches of episodes of a ragen env with any agent.

Training rollouts, validation, ``ragen-trainer eval`` and ``ragen-demo`` all play episodes through
:func:`play_episodes`, so they cannot drift apart: the same seeds and the same agent give the same episodes wherever
they are played.

    from ragen_envs.driver import play_episodes, rollout_jobs

    episodes = play_episodes("ragen/Sokoban-v0", rollout_jobs(seeds=[0, 1], group_size=4), agent)

An *agent* is any object with ``reply_batch(episodes) -> list[AgentReply | str]``: it gets the live episodes of a
batch (each with its chat so far in ``episode.messages``, the latest ``info``, the env and a per-episode ``memory``)
and returns one reply each. A model agent keeps its token ids in ``memory`` (see ``ragen_trainer.rollout``); a scripted
agent may read ``episode.env.unwrapped``. An :class:`AgentReply` with ``stop`` set ends its episode (truncated) without
a step, e.g. when the model's context is full.

Jobs and seeds. A job is one episode: its group (initial state), the env ``seed`` of that state, its ``rollout`` index
in the group and any reset ``options``. Every rollout of a group resets with the group's seed, so they share the
initial state. By default (``group_randomness="shared"``, the reference's ``es_manager``) they also share the env's
randomness from that seed: the same Bandit payouts, the same FrozenLake slips, so the rollouts of a group differ only
by what the model does. With ``group_randomness="independent"`` each further rollout ``r`` re-seeds what happens after
the reset (``options["dynamics_seed"]`` = :func:`dynamics_seed`) and sees its own payouts and slips. Either way a
single-rollout evaluation and rollout 0 of a training group are the same episode.

One loop plays every episode (:class:`_Play`): an episode asks the agent for its next reply as soon as it is ready,
its env steps as soon as the reply comes back, and a finished episode hands its env slot to the next job. What the
agent offers decides only how episodes are admitted and answered:

* **Streaming** (a :class:`StreamingAgent`, e.g. ``ragen_trainer.rollout.TokenAgent``): every episode advances on its
  own and the next job starts in a slot as soon as an episode ends (up to ``batch_size`` episodes live). The agent
  keeps generating for the other episodes meanwhile: with a continuous-batching engine the model's batch stays full
  while episodes end at different turns. With ``env_workers`` > 0 env steps run in threads, so slow steps (WebShop's
  HTTP round trips) overlap with generation; by default only envs that declare ``io_bound = True`` get threads
  (in-process envs step in microseconds, and inline steps keep the order of events reproducible).
* **Turn-synchronous** (an agent with ``reply_batch``): ``batch_size`` episodes are admitted together (all of them by
  default) and the next batch only when all of them have ended; every turn the agent answers all live episodes of the
  batch in one call (:class:`_TurnSynchronous`), then each reply is stepped, inline.

Envs are made once per slot and reset for each episode (:class:`EnvSlots`; WebShop starts its server once, not per
episode).
"""

from __future__ import annotations

import traceback
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from ragen_envs.core import INFO_KEYS, check_arg
from ragen_envs.protocol import TurnProtocol, find_protocol

#: Info keys the protocol itself adds (besides the contract); everything else is the env's own.
PROTOCOL_INFO_KEYS: frozenset[str] = frozenset(
    {"reason", "turn", "actions_left", "invalid_actions", "dropped_actions", "system_prompt"}
)
#: No episode is played for more turns than this, whatever its protocol says (a guard against a broken env).
MAX_TURNS_GUARD = 10_000


@dataclass
class AgentReply:
    """One reply of an agent."""

    text: str
    """The reply as the env receives it."""
    tokens: int | None = None
    """Generated tokens (model agents), for the records."""
    stop: str | None = None
    """Set to a reason to end the episode here, truncated, without stepping the env (e.g. ``"context full"``)."""


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to play: which initial state (``seed``), which rollout of its group, and reset options."""

    group_id: int
    seed: int
    rollout: int = 0
    options: dict[str, Any] | None = None
    tag: Any = None
    """Anything the caller wants back on the episode (e.g. the suite's state index)."""


@dataclass
class Turn:
    """One played turn: the reply and what the env answered."""

    reply: str
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    tokens: int | None = None


@dataclass
class Episode:
    """One episode, live while it is played and a record afterwards."""

    env_id: str
    env_name: str
    job: EpisodeJob
    env: gym.Env | None
    messages: list[dict[str, str]]
    """The chat: system (when the layout has one), user, then assistant / user per turn."""
    info: dict[str, Any]
    """The latest ``info`` (from ``reset``, then from each ``step``)."""
    reset_info: dict[str, Any]
    turns: list[Turn] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    """Per-episode scratch space of the agent (kept across the episode's turns)."""
    done: bool = False
    terminated: bool = False
    truncated: bool = False
    end_reason: str | None = None
    """Why the driver ended the episode when the env did not (the agent's ``stop``, an error)."""
    error: str | None = None

    # ---------------------------------------------------------------- identity, for agents and records
    @property
    def group_id(self) -> int:
        return self.job.group_id

    @property
    def seed(self) -> int:
        return self.job.seed

    @property
    def rollout(self) -> int:
        return self.job.rollout

    @property
    def protocol(self) -> TurnProtocol:
        """The env's turn protocol (its settings: ``episode.protocol.settings``)."""
        if self.env is None:
            raise ValueError("the episode is over; its env has been handed back")
        return find_protocol(self.env)

    @property
    def system_prompt(self) -> str:
        return str(self.reset_info.get("system_prompt", ""))

    @property
    def first_observation(self) -> str:
        return next(m["content"] for m in self.messages if m["role"] == "user")

    @property
    def reward(self) -> float:
        """The episode's return: the sum of its turn rewards (format penalties and reward wrappers included)."""
        return float(sum(t.reward for t in self.turns))

    @property
    def success(self) -> bool:
        """The env's own success flag after the last turn (never inferred from the reward)."""
        return bool(self.info.get("success", False))


class Agent(Protocol):
    """What :func:`play_episodes` asks of a turn-synchronous agent."""

    def reply_batch(self, episodes: list[Episode]) -> list[AgentReply | str]: ...


class StreamingAgent(Protocol):
    """What :func:`play_episodes` asks of a streaming agent (episodes advance independently).

    ``submit`` asks for an episode's next reply (it may answer at once, e.g. a ``stop`` when the context is full);
    ``poll`` advances the agent's work a little and returns the replies that are ready; ``pending`` says whether
    replies are still to come; ``release`` says an episode is over; ``finish_stream`` ends the play.
    """

    def submit(self, episode: Episode) -> AgentReply | str | None: ...

    def poll(self) -> list[tuple[Episode, AgentReply | str]]: ...

    def pending(self) -> bool: ...

    def release(self, episode: Episode) -> None: ...

    def finish_stream(self) -> None: ...


def is_streaming(agent: object) -> bool:
    """``agent`` implements :class:`StreamingAgent`."""
    return all(
        callable(getattr(agent, name, None)) for name in ("submit", "poll", "pending", "release", "finish_stream")
    )


def dynamics_seed(seed: int, rollout: int) -> int:
    """The env-randomness seed of rollout ``rollout`` of the group started from ``seed`` (stable, distinct)."""
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(rollout)]).generate_state(1)[0])


#: How the rollouts of a group draw the env's randomness: ``shared`` (the group's seed, the reference's) or
#: ``independent`` (rollout ``r > 0`` re-seeded with :func:`dynamics_seed`).
GROUP_RANDOMNESS: tuple[str, ...] = ("shared", "independent")


def rollout_jobs(
    seeds: Sequence[int],
    group_size: int = 1,
    *,
    options: Sequence[dict[str, Any] | None] | None = None,
    group_randomness: str = "shared",
) -> list[EpisodeJob]:
    """``len(seeds) x group_size`` jobs, group by group: group ``g`` starts from ``seeds[g]`` (with ``options[g]``).

    ``group_randomness``: ``"shared"`` (default, the reference's): every rollout of a group plays with the env
    randomness of the group's seed; ``"independent"``: rollout ``r > 0`` gets ``options["dynamics_seed"]`` =
    :func:`dynamics_seed` ``(seed, r)``, its own payouts and slips."""
    check_arg(
        isinstance(seeds, (list, tuple)) and all(isinstance(s, (int, np.integer)) and not isinstance(s, bool)
                                                 for s in seeds),
        "seeds",
        seeds,
        "a list of ints",
    )  # fmt: skip
    check_arg(
        isinstance(group_size, int) and not isinstance(group_size, bool) and group_size >= 1,
        "group_size",
        group_size,
        "an int >= 1",
    )
    check_arg(options is None or len(options) == len(seeds), "options", options, "None or one entry per seed")
    check_arg(group_randomness in GROUP_RANDOMNESS, "group_randomness", group_randomness,
              f"one of {list(GROUP_RANDOMNESS)}")  # fmt: skip
    jobs = []
    for g, seed in enumerate(seeds):
        for r in range(group_size):
            job_options = None if options is None or options[g] is None else dict(options[g])
            if group_randomness == "independent" and r > 0:
                job_options = {**(job_options or {}), "dynamics_seed": dynamics_seed(int(seed), r)}
            jobs.append(EpisodeJob(group_id=g, seed=int(seed), rollout=r, options=job_options))
    return jobs


class EnvSlots:
    """Envs made on demand and reused: slot ``i`` is one env, reset for each episode played in it."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None = None) -> None:
        check_arg(isinstance(env_id, str) and env_id in gym.registry, "env_id", env_id, "a registered gymnasium id")
        check_arg(env_kwargs is None or isinstance(env_kwargs, dict), "env_kwargs", env_kwargs, "None or a dict")
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self._envs: list[gym.Env] = []

    def get(self, index: int) -> gym.Env:
        while len(self._envs) <= index:
            self._envs.append(gym.make(self.env_id, **self.env_kwargs))
        return self._envs[index]

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs.clear()

    def __enter__(self) -> EnvSlots:  # noqa: PYI034 (Python 3.10 has no typing.Self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def play_episodes(
    env_id: str,
    jobs: Sequence[EpisodeJob],
    agent: Agent,
    *,
    env_kwargs: dict[str, Any] | None = None,
    env_name: str | None = None,
    batch_size: int | None = None,
    envs: EnvSlots | None = None,
    on_error: str = "raise",
    progress: Any = None,
    on_reset: Callable[[Episode], None] | None = None,
    on_step: Callable[[Episode, Turn], None] | None = None,
    on_batch_end: Callable[[list[Episode]], None] | None = None,
    env_workers: int | None = None,
) -> list[Episode]:
    """Play every job with ``agent``; returns the finished episodes in job order.

    Args:
        env_id: a registered ragen id (``"ragen/Sokoban-v0"``).
        jobs: the episodes to play (:func:`rollout_jobs` makes the usual ``P x N`` groups).
        agent: a turn-synchronous agent (``reply_batch``) or a :class:`StreamingAgent` (see the module docstring).
        env_kwargs: ``gymnasium.make`` keyword arguments (env arguments and protocol settings).
        env_name: a display name for records (default: ``env_id``).
        batch_size: episodes played at a time (``None``: all at once); streaming: most episodes live at once.
        envs: reuse these env slots (the caller closes them); default: make them here and close them at the end.
        on_error: ``"raise"`` (training: a failing agent or env stops the run) or ``"record"`` (evaluation: the
            episode ends with ``error`` set and the others go on).
        progress: a tqdm-like bar updated by one per finished episode (``update(n)``, optional
            ``set_postfix_str``), or ``None``.
        on_reset: called with each episode after its reset, while the env holds the initial state (e.g. to record it).
        on_step: called after each step with the episode and its new turn, while the env holds that state (e.g. to
            record the grid after the turn).
        on_batch_end: called with each batch's finished episodes while their envs still hold the final states
            (streaming: with each episode as it ends).
        env_workers: streaming only: threads that step envs while the agent generates (0: step inline); ``None``:
            ``4`` when the env declares ``io_bound = True`` (WebShop), else 0.
    """
    check_arg(on_error in ("raise", "record"), "on_error", on_error, "'raise' or 'record'")
    check_arg(
        batch_size is None or (isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size >= 1),
        "batch_size",
        batch_size,
        "None or an int >= 1",
    )
    streaming = is_streaming(agent)
    check_arg(
        streaming or callable(getattr(agent, "reply_batch", None)),
        "agent",
        agent,
        "an object with reply_batch(episodes), or a StreamingAgent (submit, poll, pending, release, finish_stream)",
    )
    check_arg(
        env_workers is None or (isinstance(env_workers, int) and env_workers >= 0),
        "env_workers",
        env_workers,
        "None or an int >= 0",
    )
    jobs = list(jobs)
    own_envs = envs is None
    slots = envs if envs is not None else EnvSlots(env_id, env_kwargs)
    size = batch_size or max(len(jobs), 1)
    hooks = _Hooks(on_reset, on_step, on_batch_end, progress, env_name or env_id)
    if streaming:
        play = _Play(env_id, jobs, agent, slots, size, on_error, hooks, admit=1, env_workers=env_workers)
    else:
        play = _Play(env_id, jobs, _TurnSynchronous(agent), slots, size, on_error, hooks, admit=size, env_workers=0)
    try:
        return play.run()
    finally:
        if own_envs:
            slots.close()


@dataclass
class _Hooks:
    on_reset: Callable[[Episode], None] | None
    on_step: Callable[[Episode, Turn], None] | None
    on_end: Callable[[list[Episode]], None] | None
    progress: Any
    env_name: str


class _TurnSynchronous:
    """A turn-synchronous agent (``reply_batch``) as a :class:`StreamingAgent`: the episodes asked since the last poll
    are answered together in one ``reply_batch`` call, in the order they were asked."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._asked: list[Episode] = []

    def submit(self, episode: Episode) -> None:
        self._asked.append(episode)

    def poll(self) -> list[tuple[Episode, AgentReply | str]]:
        asked, self._asked = self._asked, []
        replies = list(self.agent.reply_batch(asked))
        if len(replies) != len(asked):
            raise RuntimeError(f"the agent returned {len(replies)} replies for {len(asked)} episodes")
        return list(zip(asked, replies))

    def pending(self) -> bool:
        return bool(self._asked)

    def release(self, episode: Episode) -> None:
        pass

    def finish_stream(self) -> None:
        pass


@dataclass(eq=False)
class _Cohort:
    """Episodes admitted together: their slots are handed on, and ``on_batch_end`` called, once all have ended."""

    live: int
    """Episodes of the cohort not ended yet (those still to start included)."""
    episodes: list[Episode] = field(default_factory=list)


class _Play:
    """The episode loop (see the module docstring): three queues, no recursion.

    ``to_ask``: episodes whose next reply must be requested; ``answered``: replies to apply; ``stepping``: env steps
    running in threads. Jobs are admitted ``admit`` at a time (a *cohort*: 1 for a streaming agent, the batch for a
    turn-synchronous one), each cohort as soon as there are free slots for all of it.
    """

    def __init__(self, env_id: str, jobs: list[EpisodeJob], agent: Any, slots: EnvSlots, size: int, on_error: str,
                 hooks: _Hooks, *, admit: int, env_workers: int | None) -> None:  # fmt: skip
        self.env_id, self.agent, self.slots = env_id, agent, slots
        self.on_error, self.hooks, self.admit, self.env_workers = on_error, hooks, admit, env_workers
        self.jobs: deque[tuple[int, EpisodeJob]] = deque(enumerate(jobs))
        self.results: list[Episode | None] = [None] * len(jobs)
        self.free = list(range(min(size, max(len(jobs), 1))))[::-1]  # pop() gives slot 0 first
        self.slot_of: dict[int, tuple[int, int, _Cohort]] = {}  # id(episode) -> (job index, slot, cohort)
        self.to_ask: deque[Episode] = deque()
        self.answered: deque[tuple[Episode, AgentReply]] = deque()
        self.asked: dict[int, Episode] = {}  # id(episode) -> episode waiting for the agent
        self.stepping: dict[Future, Episode] = {}
        self.pool: ThreadPoolExecutor | None = None

    def run(self) -> list[Episode]:
        try:
            while True:
                self._start_jobs()
                while self.to_ask:
                    self._ask(self.to_ask.popleft())
                while self.answered:
                    self._apply(*self.answered.popleft())
                if self.to_ask or self.answered or self._can_start():
                    continue
                if self.asked and self.agent.pending():
                    self._poll()
                elif self.stepping:
                    done, _ = wait(list(self.stepping), return_when=FIRST_COMPLETED)
                    for future in done:
                        self._after_step(self.stepping.pop(future), future)
                elif self.asked:
                    raise RuntimeError(f"the agent has no pending work but owes {len(self.asked)} replies")
                else:
                    break
                for future in [f for f in self.stepping if f.done()]:
                    self._after_step(self.stepping.pop(future), future)
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True)
            self.agent.finish_stream()
        return [e for e in self.results if e is not None]

    # ---------------------------------------------------------------- episodes in and out of slots
    def _can_start(self) -> bool:
        return bool(self.jobs) and len(self.free) >= min(self.admit, len(self.jobs))

    def _start_jobs(self) -> None:
        while self._can_start():
            cohort = _Cohort(live=min(self.admit, len(self.jobs)))  # complete only once every job of it has ended
            for _ in range(cohort.live):
                index, job = self.jobs.popleft()
                slot = self.free.pop()
                env = self.slots.get(slot)
                if self.pool is None and self._workers(env) > 0:
                    self.pool = ThreadPoolExecutor(self._workers(env), thread_name_prefix="ragen-env")
                episode = _start_episode(self.env_id, self.hooks.env_name, job, env, self.on_error)
                self.slot_of[id(episode)] = (index, slot, cohort)
                cohort.episodes.append(episode)
                if episode.done:  # a failed reset (on_error="record")
                    self._end_episode(episode)
                    continue
                if self.hooks.on_reset is not None:
                    self.hooks.on_reset(episode)
                self.to_ask.append(episode)

    def _workers(self, env: gym.Env) -> int:
        if self.env_workers is not None:
            return self.env_workers
        return 4 if getattr(env.unwrapped, "io_bound", False) else 0

    def _end_episode(self, episode: Episode) -> None:
        _, _, cohort = self.slot_of[id(episode)]
        self.agent.release(episode)
        cohort.live -= 1
        _count(self.hooks.progress, 1)
        if self.hooks.progress is not None and hasattr(self.hooks.progress, "set_postfix_str"):
            live = len(self.slot_of) - len(cohort.episodes) + cohort.live
            self.hooks.progress.set_postfix_str(f"{self.hooks.env_name}: {live} live")
        if cohort.live:
            return
        if self.hooks.on_end is not None:
            self.hooks.on_end(cohort.episodes)  # the envs still hold the final states
        for ended in reversed(cohort.episodes):  # the slots back in order: the next cohort's first job gets the first
            index, slot, _ = self.slot_of.pop(id(ended))
            ended.env = None  # the slot is reused; the record keeps no live env
            self.results[index] = ended
            self.free.append(slot)

    # ---------------------------------------------------------------- the agent
    def _ask(self, episode: Episode) -> None:
        if len(episode.turns) >= MAX_TURNS_GUARD:
            _end(episode, error=f"the episode did not end within {MAX_TURNS_GUARD} turns")
            self._end_episode(episode)
            return
        try:
            reply = self.agent.submit(episode)
        except Exception:
            if self.on_error == "raise":
                raise
            self._record_failure([episode])
            return
        if reply is None:
            self.asked[id(episode)] = episode
        else:
            self.answered.append((episode, _as_reply(reply)))

    def _poll(self) -> None:
        try:
            ready = self.agent.poll()
        except Exception:
            if self.on_error == "raise":
                raise
            self._record_failure(list(self.asked.values()))
            self.asked.clear()
            return
        for episode, reply in ready:
            if self.asked.pop(id(episode), None) is None:
                raise RuntimeError(f"the agent replied to an episode it was not asked about (seed {episode.seed})")
            self.answered.append((episode, _as_reply(reply)))

    def _record_failure(self, episodes: list[Episode]) -> None:
        """End ``episodes`` with the exception being handled (``on_error="record"``)."""
        message = traceback.format_exc(limit=3)
        for episode in episodes:
            _end(episode, error=message)
            self._end_episode(episode)

    # ---------------------------------------------------------------- the env
    def _apply(self, episode: Episode, reply: AgentReply) -> None:
        if reply.stop is not None:
            _end(episode, truncated=True, reason=reply.stop)
            self._end_episode(episode)
        elif self.pool is not None:
            self.stepping[self.pool.submit(_step, episode, reply)] = episode
        else:
            self._settle(episode, lambda: _step(episode, reply))

    def _after_step(self, episode: Episode, future: Future) -> None:
        self._settle(episode, future.result)

    def _settle(self, episode: Episode, step: Callable[[], object]) -> None:
        """Run (or collect) ``episode``'s env step and the ``on_step`` hook; then the episode ends or asks again. A
        failure ends the episode with its traceback (``on_error="record"``) or stops the play."""
        try:
            step()
            if self.hooks.on_step is not None:
                self.hooks.on_step(episode, episode.turns[-1])
        except Exception:
            if self.on_error == "raise":
                raise
            self._record_failure([episode])
            return
        if episode.done:
            self._end_episode(episode)
        else:
            self.to_ask.append(episode)


def _as_reply(reply: AgentReply | str) -> AgentReply:
    return reply if isinstance(reply, AgentReply) else AgentReply(str(reply))


def _start_episode(env_id: str, env_name: str, job: EpisodeJob, env: gym.Env, on_error: str) -> Episode:
    options = dict(job.options or {})
    episode = Episode(env_id=env_id, env_name=env_name, job=job, env=env, messages=[], info={}, reset_info={})
    try:
        observation, info = env.reset(seed=job.seed, options=options or None)
    except Exception:
        if on_error == "raise":
            raise
        _end(episode, error=traceback.format_exc(limit=3))
        return episode
    system = str(info.get("system_prompt") or "")
    episode.messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": observation}
    ]
    episode.info = info
    episode.reset_info = info
    return episode


def _step(episode: Episode, reply: AgentReply) -> None:
    assert episode.env is not None
    observation, reward, terminated, truncated, info = episode.env.step(reply.text)
    episode.turns.append(
        Turn(reply.text, observation, float(reward), bool(terminated), bool(truncated), dict(info), reply.tokens)
    )
    episode.info = info
    episode.messages.append({"role": "assistant", "content": reply.text})
    episode.messages.append({"role": "user", "content": observation})
    if terminated or truncated:
        episode.done, episode.terminated, episode.truncated = True, bool(terminated), bool(truncated and not terminated)


def _end(episode: Episode, *, truncated: bool = False, reason: str | None = None, error: str | None = None) -> None:
    episode.done = True
    episode.truncated = truncated
    episode.end_reason = reason if error is None else "error"
    episode.error = error


def _count(progress: Any, n: int) -> None:
    if progress is not None and n:
        progress.update(n)


def env_extras(info: dict[str, Any]) -> dict[str, Any]:
    """The env's own keys of an ``info`` dict (neither the contract's nor the protocol's)."""
    return {k: v for k, v in info.items() if k not in INFO_KEYS and k not in PROTOCOL_INFO_KEYS}


__all__ = [
    "GROUP_RANDOMNESS",
    "MAX_TURNS_GUARD",
    "PROTOCOL_INFO_KEYS",
    "Agent",
    "AgentReply",
    "EnvSlots",
    "Episode",
    "EpisodeJob",
    "StreamingAgent",
    "Turn",
    "dynamics_seed",
    "env_extras",
    "is_streaming",
    "play_episodes",
    "rollout_jobs",
]
