"""Bandit, BanditTest, BanditRev: arm names, shuffling per seed, payout statistics, reasoning checks, arguments."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

import ragen_envs  # noqa: F401
from ragen_envs.bandit import BanditEnv


def payouts(env: BanditEnv, arm: str, n: int, seed0: int = 0) -> np.ndarray:
    out = np.empty(n)
    for i in range(n):
        env.reset(seed=seed0 + i)
        out[i] = env.step(arm)[1]
    return out


@pytest.mark.parametrize(
    "env_id, low, high",
    [
        ("ragen/Bandit-v0", "Phoenix", "Dragon"),
        ("ragen/BanditTest-v0", "Trader", "Librarian"),
        ("ragen/BanditRev-v0", "Dragon", "Phoenix"),  # reversed: the safe-sounding name carries the risk
    ],
)
def test_registered_vocabularies(env_id, low, high):
    env = gym.make(env_id)
    obs, info = env.reset(seed=0)
    view = env.unwrapped.state_view()
    assert view["low_risk_arm"] == low and view["high_risk_arm"] == high
    assert f"named {view['arms'][0]} and {view['arms'][1]}\n" in obs  # the reference's rules name both arms
    assert low in gym.make(env_id, prompt_layout="ragen").reset(seed=0)[1]["system_prompt"]
    _, _, terminated, _, info = env.step(f"<think>t</think><answer>{high.lower()}</answer>")
    assert terminated and info["success"] and info["actions"] == [high]


def test_arm_order_is_shuffled_per_seed_and_deterministic():
    env = gym.make("ragen/Bandit-v0").unwrapped
    orders = []
    for seed in range(200):
        env.reset(seed=seed)
        orders.append(tuple(env.state_view()["arms"]))
        env.reset(seed=seed)
        assert tuple(env.state_view()["arms"]) == orders[-1]
    first_dragon = sum(o[0] == "Dragon" for o in orders)
    assert 60 <= first_dragon <= 140  # both orders, roughly half each (binomial(200, 0.5): 5 sigma ~ 35)


def test_numbered_actions_follow_the_shown_order():
    env = gym.make("ragen/Bandit-v0").unwrapped
    env.reset(seed=1)
    arms = env.state_view()["arms"]
    assert env.parse_action("1") == arms[0] and env.parse_action(" 2 ") == arms[1] and env.parse_action("3") is None


@pytest.mark.parametrize("prob, payout", [(0.25, 1.0), (0.6, 2.0)])
def test_high_risk_payout_statistics(prob, payout):
    env = BanditEnv(high_risk_prob=prob, high_risk_payout=payout)
    n = 20_000
    values = payouts(env, "Dragon", n)
    assert set(np.unique(values)) <= {0.0, payout}
    rate = float(np.mean(values == payout))
    bound = 5 * math.sqrt(prob * (1 - prob) / n)
    assert abs(rate - prob) < bound, (rate, prob, bound)


def test_low_risk_arm_pays_a_fixed_amount():
    env = BanditEnv(low_risk_payout=0.15)
    values = payouts(env, "Phoenix", 500)
    assert np.all(values == 0.15)
    env.reset(seed=0)
    assert env.step("Phoenix")[4]["success"] is False


def test_same_seed_same_payouts():
    env = BanditEnv()
    assert np.array_equal(payouts(env, "Dragon", 300, seed0=7), payouts(env, "Dragon", 300, seed0=7))


def test_episode_is_one_pull_through_the_protocol():
    env = gym.make("ragen/Bandit-v0")
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step("<think>t</think><answer>Phoenix || Dragon</answer>")
    assert terminated and info["actions"] == ["Phoenix"] and info["dropped_actions"] == ["Dragon"]
    assert reward == pytest.approx(0.1)


def test_bandit_is_one_turn_and_more_turns_are_a_setting():
    env = gym.make("ragen/Bandit-v0")  # the reference's max_turn: 1
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step("<answer>no thinking</answer>")
    assert reward == pytest.approx(-0.1) and not terminated and truncated
    env = gym.make("ragen/Bandit-v0", max_turns=5)
    env.reset(seed=0)
    for turn in range(1, 6):
        _, reward, terminated, truncated, info = env.step("<answer>no thinking</answer>")
        assert reward == pytest.approx(-0.1) and not terminated
        assert truncated == (turn == 5)


def test_check_reasoning_recognises_which_arm_is_risky():
    env = gym.make("ragen/Bandit-v0").unwrapped
    env.reset(seed=0)
    view = env.state_view()
    good = env.check_reasoning("Dragon is risky. Phoenix is the safe choice.", view, [])
    assert good == {"supported": 2, "contradicted": 0}
    bad = env.check_reasoning("Dragon is the safe option. Phoenix is a gamble.", view, [])
    assert bad == {"supported": 0, "contradicted": 2}
    assert env.check_reasoning("Dragon is safer than Phoenix.", view, []) == {"supported": 0, "contradicted": 0}
    rev = gym.make("ragen/BanditRev-v0").unwrapped
    rev.reset(seed=0)
    assert rev.check_reasoning("Phoenix is risky", rev.state_view(), [])["supported"] == 1


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"low_risk_name": ""}, "low_risk_name"),
        ({"high_risk_name": "1"}, "high_risk_name"),
        ({"high_risk_name": "phoenix"}, "high_risk_name"),
        ({"high_risk_prob": 1.5}, "high_risk_prob"),
        ({"low_risk_payout": "x"}, "low_risk_payout"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=f"invalid argument {name}="):
        gym.make("ragen/Bandit-v0", **kwargs)
