"""The episode driver's one loop: turn-synchronous and streaming agents play the same episodes; a turn-synchronous
batch is admitted, answered and handed to ``on_batch_end`` as one, also when some of its episodes fail."""

from __future__ import annotations

import gymnasium as gym
import pytest

import ragen_envs  # noqa: F401  (registers the ragen/* ids)
from ragen_envs.driver import AgentReply, play_episodes, rollout_jobs

REPLIES = ["<answer>Left</answer>", "<answer>Up || Right</answer>", "no tags at all", "<answer>Down</answer>"]


def _policy(episode) -> str:
    """A reply that depends on the episode and its turn only (not on the batch or the order of play)."""
    return REPLIES[(episode.seed * 7 + episode.rollout * 3 + len(episode.turns)) % len(REPLIES)]


class _Batched:
    """Turn-synchronous: records every batch it answers."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[int, int, int]]] = []

    def reply_batch(self, episodes):
        self.calls.append([(e.seed, e.rollout, len(e.turns)) for e in episodes])
        return [_policy(e) for e in episodes]


class _Streaming:
    """Streaming: answers each episode a few polls after it asked (later for some episodes than for others)."""

    def __init__(self) -> None:
        self.waiting: dict[int, list] = {}

    def submit(self, episode):
        self.waiting[id(episode)] = [episode, 1 + (episode.seed + episode.rollout) % 3]

    def poll(self):
        ready = []
        for key, item in list(self.waiting.items()):
            item[1] -= 1
            if item[1] <= 0:
                ready.append((item[0], AgentReply(_policy(item[0]))))
                del self.waiting[key]
        return ready

    def pending(self):
        return bool(self.waiting)

    def release(self, episode):
        pass

    def finish_stream(self):
        self.waiting.clear()


def _played(episodes):
    return [(e.seed, e.rollout, [(t.reply, t.observation, t.reward) for t in e.turns], e.terminated, e.truncated)
            for e in episodes]  # fmt: skip


@pytest.mark.parametrize("batch_size", [None, 1, 4])
def test_turn_synchronous_and_streaming_agents_play_the_same_episodes(batch_size):
    jobs = rollout_jobs([0, 1, 2], 3)
    batched = play_episodes("ragen/FrozenLake-v0", jobs, _Batched(), batch_size=batch_size)
    streamed = play_episodes("ragen/FrozenLake-v0", jobs, _Streaming(), batch_size=batch_size)
    assert [(e.seed, e.rollout) for e in batched] == [(j.seed, j.rollout) for j in jobs]
    assert _played(streamed) == _played(batched)
    assert all(e.done and e.env is None for e in batched + streamed)


def test_a_turn_synchronous_batch_is_admitted_answered_and_ended_as_one():
    agent, ended, slots = _Batched(), [], {}
    jobs = rollout_jobs([0, 1, 2], 3)

    def on_reset(episode):
        slots[(episode.seed, episode.rollout)] = id(episode.env)

    def on_batch_end(batch):
        assert all(e.done and e.env is not None for e in batch)  # the envs still hold the final states
        ended.append([(e.seed, e.rollout) for e in batch])

    episodes = play_episodes("ragen/FrozenLake-v0", jobs, agent, batch_size=4, on_reset=on_reset,
                             on_batch_end=on_batch_end)  # fmt: skip
    order = [(j.seed, j.rollout) for j in jobs]
    assert ended == [order[0:4], order[4:8], order[8:9]]
    # Each call answers live episodes of one batch only, all of them at the same turn.
    batch_of = {key: i // 4 for i, key in enumerate(order)}
    for call in agent.calls:
        assert len({batch_of[(seed, rollout)] for seed, rollout, _ in call}) == 1
        assert len({turn for _, _, turn in call}) == 1
    # Job k of every batch plays in env slot k.
    assert [slots[key] for key in order[4:8]] == [slots[key] for key in order[0:4]]
    assert slots[order[8]] == slots[order[0]]
    assert all(e.env is None for e in episodes)


class _FailsOnSeed1(gym.Wrapper):
    def reset(self, *, seed=None, options=None):
        if seed == 1:
            raise ValueError("reset broke")
        return self.env.reset(seed=seed, options=options)


def test_failed_resets_end_their_episodes_without_ending_the_batch():
    env_id = "test/DriverFailsOnSeed1-v0"
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=lambda **kw: _FailsOnSeed1(gym.make("ragen/FrozenLake-v0", **kw)),
                     disable_env_checker=True)  # its first-step check does not expect a failed first reset
    for agent in (_Batched(), _Streaming()):
        ended = []

        def on_batch_end(batch, ended=ended):
            ended.append([(e.seed, e.rollout) for e in batch])

        episodes = play_episodes(env_id, rollout_jobs([1, 0, 2], 2), agent, batch_size=3, on_error="record",
                                 on_batch_end=on_batch_end)  # fmt: skip
        failed = [bool(e.error and "reset broke" in e.error) for e in episodes]
        assert failed == [True, True, False, False, False, False]
        assert all(e.turns for e in episodes[2:])  # the others were played
        if isinstance(agent, _Batched):
            assert ended == [[(1, 0), (1, 1), (0, 0)], [(0, 1), (2, 0), (2, 1)]]
        else:
            assert sorted(key for batch in ended for key in batch) == sorted((e.seed, e.rollout) for e in episodes)
            assert all(len(batch) == 1 for batch in ended)
