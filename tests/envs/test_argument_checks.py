"""Bad constructor arguments of the envs, wrappers and protocol raise a ValueError that names the argument: numbers
that are not finite (they would poison every reward of an episode) and values of the wrong type."""

from __future__ import annotations

import gymnasium as gym
import pytest

import ragen_envs  # noqa: F401
from ragen_envs.bandit import BanditEnv
from ragen_envs.countdown import CountdownEnv
from ragen_envs.frozen_lake import FrozenLakeEnv
from ragen_envs.protocol import TurnProtocol
from ragen_envs.rewards import FormatReward


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
