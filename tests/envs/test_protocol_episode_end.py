"""The turn protocol at the end of an episode: it stops at the inner env's truncation, and a turn sent after the end
still carries the env's state keys."""

from __future__ import annotations

import json

import gymnasium as gym

import ragen_envs  # noqa: F401


def test_protocol_stops_at_the_inner_envs_truncation():
    # Sokoban truncates after max_steps env steps; the protocol ignored the inner `truncated` and kept stepping
    # past it (and did not report the episode's end) whenever the protocol's own budget was larger.
    env = gym.make("ragen/Sokoban-v0", max_steps=3)
    env.reset(seed=0)
    reply = "<think>go</think><answer>Up || Up || Up || Up || Up</answer>"
    _, _, terminated, truncated, info = env.step(reply)
    assert len(info["actions"]) == 3
    assert info["dropped_actions"] == ["Up", "Up"]
    assert env.unwrapped.num_env_steps == 3
    assert truncated and not terminated
    # the episode is over: the next turn is the protocol's "episode has ended" answer
    _, reward, _, truncated, info = env.step(reply)
    assert reward == 0.0 and truncated and info["reason"].startswith("the episode has ended")


def test_step_after_the_end_still_carries_the_envs_state_keys():
    # Every turn's info carries the env's state keys (state_info), also a turn sent after the episode ended.
    env = gym.make("ragen/Sokoban-v0", max_turns=1)
    _, first = env.reset(seed=0)
    env.step("<think>x</think><answer>Up</answer>")
    _, _, _, truncated, info = env.step("<think>x</think><answer>Up</answer>")
    assert truncated
    for key in ("boxes_on_target", "deadlock"):
        assert key in first and key in info
    json.dumps(info, allow_nan=False)
