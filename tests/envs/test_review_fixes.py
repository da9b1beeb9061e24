"""Regression tests for bugs found in review of the foundation and Sokoban envs (one test per bug)."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import pytest

import ragen_envs  # noqa: F401
from ragen_envs.bandit import BanditEnv
from ragen_envs.countdown import CountdownEnv
from ragen_envs.frozen_lake import FrozenLakeEnv
from ragen_envs.protocol import TurnProtocol
from ragen_envs.rewards import FormatReward


def test_countdown_claim_with_zero_denominator_does_not_crash_grounding():
    # "= 3/0" used to raise ZeroDivisionError from Fraction("3/0") inside check_reasoning, which crashed
    # the grounding reward wrapper (and so a training run) on a plain thinking text.
    env = CountdownEnv()
    env.reset(seed=0)
    counts = env.check_reasoning("6 / 4 = 3/0 and 2 + 2 = 4", env.state_view(), [])
    assert counts == {"supported": 1, "contradicted": 1}

    wrapped = gym.make("ragen/Countdown-v0", reward_wrappers=["grounding"])
    wrapped.reset(seed=0)
    _, reward, *_, info = wrapped.step("<think>so 6 / 4 = 3/0</think><answer>1 + 2</answer>")
    assert math.isfinite(reward)
    assert info["reward_details"]["grounding"]["contradicted"] == 1


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


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize(
    "make, name",
    [
        (lambda v: BanditEnv(low_risk_payout=v), "low_risk_payout"),
        (lambda v: BanditEnv(high_risk_payout=v), "high_risk_payout"),
        (lambda v: CountdownEnv(format_score=v), "format_score"),
        (lambda v: TurnProtocol(BanditEnv(), format_penalty=v), "format_penalty"),
        (lambda v: FormatReward(gym.make("ragen/Bandit-v0"), weight=v), "weight"),
    ],
)
def test_non_finite_reward_numbers_are_rejected(make, name, value):
    # NaN / inf were accepted and turned every reward of the episode into NaN / inf (a poisoned training batch).
    with pytest.raises(ValueError, match=name):
        make(value)


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: BanditEnv(high_risk_prob="0.5"), "high_risk_prob"),
        (lambda: BanditEnv(high_risk_prob=None), "high_risk_prob"),
        (lambda: FrozenLakeEnv(map_name=["4x4"]), "map_name"),
        # names equal once stripped made both arms one action (the lookup kept only one of them)
        (lambda: BanditEnv(low_risk_name=" Dragon", high_risk_name="dragon"), "high_risk_name"),
        (lambda: FrozenLakeEnv(desc=4), "desc"),
        (lambda: FrozenLakeEnv(desc=True), "desc"),
        (lambda: FrozenLakeEnv(desc=float("nan")), "desc"),
    ],
)
def test_wrongly_typed_arguments_raise_value_error(make, name):
    # These raised TypeError (from a comparison, a dict lookup or iterating a number), or nothing at all, instead of
    # the ValueError naming the argument that every other bad constructor argument gets.
    with pytest.raises(ValueError, match=name):
        make()


def test_sokoban_current_level_before_reset_says_so():
    # current_level() before the first reset raised AttributeError: '_pool_current' (an attribute set only by
    # a pooled reset), whatever the level source.
    from ragen_envs.sokoban.env import SokobanEnv

    env = SokobanEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.current_level()
    env.reset(seed=0)
    assert env.current_level() is env.level
