"""Self-play training on the text games: the opponent pool, rollouts in which the policy plays seats, per-seat metrics.

With ``opponent_pool`` set (a game env such as ``ragen/TicTacToe-v0``), every training game draws its opponent from
the pool, one draw per initial-state group (all N rollouts of a state face the same kind of opponent):

* ``"self"`` -- the current policy plays both seats of the same game; both seats' episodes are trained;
* ``"past"`` -- an earlier snapshot of the policy plays the other seat (not trained). A snapshot of the policy is
  taken at the first step and every ``opponent_snapshot_every`` steps; the newest ``opponent_pool_size`` are kept, and
  each step's ``"past"`` games face one of them drawn at random. Snapshots live in memory only (the trainable weights:
  the whole model in full fine-tuning, the adapter with LoRA) and start over when a run resumes;
* a fixed opponent of the game (``"random"``, ``"rule"``, ``"perfect"`` for TicTacToe, ...).

In the last two the learner takes seat ``seat`` of ``env_kwargs`` when it is set, else ``seed % 2`` (as the
single-agent view does), so consecutive initial states alternate seats.

Games are played by :func:`ragen_envs.games.selfplay.play_games` (the PettingZoo env, each seat through its own turn
protocol). Each learner seat becomes a :class:`~ragen_trainer.trajectory.Trajectory` with ``group_id`` ``2 * g +
seat`` (``g``: the initial state's index): advantages are normalised and StarPO-S filters over the rollouts of the
same initial state *and* seat. Its rewards are the seat's own (see the self-play module): its game score plus its
format penalties. ``tags`` record ``seat``, ``opponent`` and ``game``. A learner seat that never got a turn (the other
seat forfeited before it) has no tokens and is left out of the batch.

Validation is unchanged: the single-agent view against its ``opponent`` (``env_kwargs``), so a run's validation
curve is its win rate against a fixed opponent.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragen_envs.core import check_arg
from ragen_envs.driver import EpisodeJob, rollout_jobs
from ragen_envs.games import GAMES, game_of
from ragen_envs.games.base import parse_seat
from ragen_envs.games.selfplay import FixedOpponentAgent, Matchup, play_games
from ragen_trainer.config import POLICY_OPPONENTS, check_opponent_pool
from ragen_trainer.critic import CRITIC_ATTR, policy_copy
from ragen_trainer.engines.base import GenerationEngine, SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.rollout import TokenAgent, progress_bar
from ragen_trainer.settings import RolloutSettings
from ragen_trainer.trajectory import RolloutBatch, Trajectory

#: View-only arguments of a game env (the PettingZoo env seats both players itself).
_VIEW_ONLY_KWARGS = ("opponent", "seat")


class OpponentPool:
    """The opponents of self-play training: which kind each group faces, and the policy's past snapshots.

    Args:
        pool: the config's ``opponent_pool`` (``"self"``, ``"past"``, fixed opponents' names).
        snapshot_every: steps between two snapshots of the policy (``"past"``).
        size: the most snapshots kept (the oldest is dropped).
        seed: the run's seed (draws are a function of ``(seed, step)``, so a resumed run draws the same kinds).
        tokenizer: the policy's tokenizer (the snapshots generate with it).
        batch_size: rows the snapshot's generation engine decodes together.
    """

    def __init__(self, pool: Sequence[str], *, snapshot_every: int, size: int, seed: int, tokenizer: Any,
                 batch_size: int) -> None:  # fmt: skip
        self.pool = list(pool)
        self.tokenizer = tokenizer
        self.snapshot_every = snapshot_every
        self.seed = seed
        self.batch_size = batch_size
        self.snapshots: deque[tuple[int, dict[str, Any]]] = deque(maxlen=size)
        self._model: Any = None
        self._engine: Any = None
        self._loaded: int | None = None  # the step of the snapshot the opponent model holds

    def kinds(self, step: int, groups: int) -> list[str]:
        """The opponent kind of each of ``groups`` initial states of training step ``step``."""
        rng = np.random.default_rng([self.seed, step, 0x5E1F])
        return [self.pool[int(i)] for i in rng.integers(len(self.pool), size=groups)]

    def observe(self, step: int, model: Any) -> None:
        """Take a snapshot of ``model`` (the policy) when ``"past"`` is in the pool and one is due at ``step``."""
        if "past" not in self.pool:
            return
        if self.snapshots and step - self.snapshots[-1][0] < self.snapshot_every:
            return
        weights = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()
                   if p.requires_grad and CRITIC_ATTR not in n}  # fmt: skip
        self.snapshots.append((step, weights))
        if self._model is None:  # the snapshots' model: a frozen copy of the policy, weights loaded per step
            self._model = policy_copy(model).eval().requires_grad_(False)

    def past_engine(self, step: int) -> tuple[GenerationEngine, int]:
        """An engine on a snapshot drawn for ``step``, and that snapshot's step."""
        if not self.snapshots:
            raise RuntimeError("no snapshot of the policy yet: call observe() before past_engine()")
        rng = np.random.default_rng([self.seed, step, 0xA57])
        taken, weights = self.snapshots[int(rng.integers(len(self.snapshots)))]
        if self._loaded != taken:
            self._model.load_state_dict(weights, strict=False)
            self._loaded = taken
        if self._engine is None:
            self._engine = HFEngine(self._model, self.tokenizer, batch_size=self.batch_size)
        return self._engine, taken

    def play(self, engine: GenerationEngine, tokenizer: Any, env_id: str, seeds: list[int], local: list[int],
             group_size: int, step: int, model: Any, **rollout_kwargs: Any) -> RolloutBatch:
        """Training step ``step``'s self-play games of this process's groups ``local`` (indexes into ``seeds``, all
        the step's initial states): each group's opponent drawn from the pool (the draw covers every group, so it is
        the same on every process), a snapshot of ``model`` taken when one is due. The batch's ``metrics`` name the
        snapshot the ``"past"`` games faced (``selfplay/past_snapshot_step``)."""
        kinds = self.kinds(step, len(seeds))
        self.observe(step, model)
        past, metrics = None, {}
        if "past" in kinds:
            past, taken = self.past_engine(step)
            metrics["selfplay/past_snapshot_step"] = float(taken)
        batch = collect_selfplay_rollouts(engine, tokenizer, env_id, [seeds[g] for g in local], group_size,
                                          [kinds[g] for g in local], past_engine=past, **rollout_kwargs)
        batch.metrics.update(metrics)
        return batch


def learner_seat(env_kwargs: dict[str, Any], seed: int) -> int:
    """The seat the learner takes against a non-self opponent: ``env_kwargs["seat"]`` when set, else ``seed % 2``."""
    fixed = parse_seat(env_kwargs.get("seat"))
    return fixed if fixed is not None else int(seed) % 2


def collect_selfplay_rollouts(
    engine: GenerationEngine,
    tokenizer: Any,
    env_id: str,
    seeds: list[int],
    group_size: int,
    opponents: list[str],
    *,
    settings: RolloutSettings,
    sampling: SamplingParams,
    env_kwargs: dict[str, Any] | None = None,
    past_engine: GenerationEngine | None = None,
    progress: bool = False,
) -> RolloutBatch:
    """Play ``len(seeds) x group_size`` games of ``env_id``'s game, group ``g`` against ``opponents[g]``, and return
    the learner seats' trajectories (``group_id`` = ``2 * g + seat``, tags ``seat`` / ``opponent`` / ``game``).

    Args:
        engine: the policy's token engine.
        tokenizer: the policy's tokenizer.
        env_id: a single-agent game id (``"ragen/TicTacToe-v0"``): its game is played under PettingZoo.
        seeds: the initial states (P).
        group_size: games per initial state (N).
        opponents: per group, ``"self"``, ``"past"`` or a fixed opponent's name.
        settings: the rollout's settings (``StarPOConfig.rollout_settings()``), of the policy and the snapshot
            alike: as :func:`ragen_trainer.rollout.collect_rollouts`.
        sampling: decoding settings of both the policy and the snapshot.
        env_kwargs: the run's env arguments (``cfg.env_make_kwargs()``: the game's arguments, ``protocol=``;
            ``opponent`` and ``seat`` belong to the single-agent view and only ``seat`` is read, for the learner).
        past_engine: the snapshot's engine (needed when a group's opponent is ``"past"``).
        progress: show a progress bar (games finished).
    """
    game = game_of(env_id)
    check_arg(game is not None, "env_id", env_id, "a single-agent game id such as 'ragen/TicTacToe-v0'")
    assert game is not None
    check_arg(len(opponents) == len(seeds), "opponents", opponents, f"one entry per seed ({len(seeds)})")
    check_arg("past" not in opponents or past_engine is not None, "past_engine", past_engine,
              "an engine on a snapshot of the policy when a group plays 'past'")  # fmt: skip
    kwargs = dict(env_kwargs or {})
    game_kwargs = {k: v for k, v in kwargs.items() if k not in _VIEW_ONLY_KWARGS}
    policy = TokenAgent(engine, tokenizer, sampling, settings=settings)
    past = TokenAgent(past_engine, tokenizer, sampling, settings=settings) if past_engine is not None else None
    table = dict(GAMES[game].env.opponents)
    fixed = {name: FixedOpponentAgent(name, table, game) for name in set(opponents) - set(POLICY_OPPONENTS)}

    def matchup(job: EpisodeJob) -> Matchup:
        kind = opponents[job.group_id]
        if kind == "self":
            return Matchup((policy, policy), (True, True), kind)
        other = past if kind == "past" else fixed[kind]
        seat = learner_seat(kwargs, job.seed)
        agents = (policy, other) if seat == 0 else (other, policy)
        return Matchup(agents, (seat == 0, seat == 1), kind)

    jobs = rollout_jobs(list(seeds), group_size, group_randomness=settings.group_randomness)
    started = time.perf_counter()
    bar = progress_bar(progress, len(jobs), f"{env_id} self-play", unit="game")
    try:
        games = play_games(game, jobs, matchup, env_kwargs=game_kwargs, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    trajectories: list[Trajectory] = []
    for record in games:
        for episode in record.learner_episodes():
            if not episode.turns:  # the other seat forfeited before this one moved: nothing to train
                continue
            traj = policy.trajectory(episode)
            traj.tags = dict(episode.job.tag or {})
            trajectories.append(traj)
    trajectories.sort(key=lambda t: t.group_id)  # stable: a group's rollouts keep their order
    total = time.perf_counter() - started
    timings = {k: policy.timings[k] + (past.timings[k] if past is not None else 0.0) for k in policy.timings}
    timings["environment"] = max(total - timings["generation"] - timings["tokenization"], 0.0)
    timings["total"] = total
    return RolloutBatch(trajectories=trajectories, timings=timings)


def selfplay_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Per-seat and per-opponent results of self-play trajectories (those with ``tags``).

    ``selfplay/<first|second>/<outcome>`` and ``selfplay/vs_<opponent>/<outcome>``: the share of the learner's
    seat-games that ended with each outcome word of the game (win / draw / loss; deal / no deal for the negotiation;
    ``none`` for a game cut before its end), ``.../invalid_rate`` the share of its turns whose reply played no move,
    and ``.../games`` their count.
    """
    tagged = [t for t in trajectories if t.tags.get("game") in GAMES]
    if not tagged:
        return {}
    words = GAMES[tagged[0].tags["game"]].core.outcomes
    buckets: dict[str, list[Trajectory]] = {}
    for traj in tagged:
        buckets.setdefault(("first", "second")[int(traj.tags["seat"])], []).append(traj)
        buckets.setdefault(f"vs_{traj.tags['opponent']}", []).append(traj)
    out: dict[str, float] = {}
    for name, group in sorted(buckets.items()):
        finals = [str(t.infos[-1].get("outcome")) if t.infos else "None" for t in group]
        for word in words:
            out[f"selfplay/{name}/{word.replace(' ', '_')}"] = finals.count(word) / len(group)
        unfinished = sum(f not in words for f in finals)
        if unfinished:
            out[f"selfplay/{name}/none"] = unfinished / len(group)
        turns = [info for t in group for info in t.infos]
        out[f"selfplay/{name}/invalid_rate"] = (
            sum(not info.get("action_is_valid", False) for info in turns) / len(turns) if turns else 0.0
        )
        out[f"selfplay/{name}/games"] = float(len(group))
    return out


__all__ = [
    "POLICY_OPPONENTS",
    "OpponentPool",
    "check_opponent_pool",
    "collect_selfplay_rollouts",
    "learner_seat",
    "selfplay_metrics",
]
