"""Reward wrappers: what each one rewards, that parts appear in info and sum to the reward, composition, registry."""

from __future__ import annotations

import gymnasium as gym
import pytest

import ragen_envs  # noqa: F401
from ragen_envs.rewards import (
    REWARD_WRAPPERS,
    FormatReward,
    ReasoningGroundingReward,
    RewardShaping,
    ThinkingLengthReward,
    padding_stats,
    register_reward,
    wrap_rewards,
)

NATURAL = (
    "I am standing on the top left corner of the lake and the goal sits at the bottom right. The holes are in the "
    "second row and on the right side, so the safest route goes down along the left column first, then right along "
    "the third row while keeping away from the edge where slipping could drop me into water."
)


def lake(**kw):
    return gym.make("ragen/FrozenLake-v0", map_name="4x4", is_slippery=False, **kw)


def test_format_reward_credits_good_turns_only():
    env = lake(reward_wrappers=[{"name": "format", "reward": 0.2, "penalty": 0.05}])
    _, info = env.reset(seed=0)
    assert info["reward_parts"]["format"] == 0.0
    _, reward, _, _, info = env.step("<think>go</think><answer>Right</answer>")
    assert reward == pytest.approx(0.2) and info["reward_parts"]["format"] == 0.2
    assert info["reward_details"]["format"]["ok"] is True
    _, reward, _, _, info = env.step("Right")
    assert reward == pytest.approx(-0.1 - 0.05)
    assert info["reward_details"]["format"]["problems"][0] == "malformed reply"
    _, reward, _, _, info = env.step("<think> </think><answer>Left</answer>")
    assert info["reward_parts"]["format"] == -0.05 and "empty <think>" in info["reward_details"]["format"]["problems"]
    _, reward, _, _, info = env.step("<think>x</think><answer>Fly</answer>")
    assert info["reward_details"]["format"]["problems"] == ["invalid action"]


def test_format_reward_without_thinking():
    env = lake(enable_think=False, reward_wrappers=["format"])
    env.reset(seed=0)
    assert env.step("<answer>Right</answer>")[4]["reward_parts"]["format"] == pytest.approx(0.1)


def test_grounding_rewards_true_claims_and_penalises_hallucinations():
    env = lake(reward_wrappers=["grounding"])
    env.reset(seed=0)
    true_think = "I am at (0, 0). The goal is at (3, 3). Moving down does not lead to a hole."
    _, reward, _, _, info = env.step(f"<think>{true_think}</think><answer>Down</answer>")
    assert info["reward_details"]["grounding"] == {"supported": 3, "contradicted": 0}
    assert reward == pytest.approx(0.15)
    # The claims are checked against the state *before* the turn: the player is now at (1, 0).
    false_think = "I am at (2, 2). The goal is at (0, 1). Holes at (0, 0)."
    _, reward, _, _, info = env.step(f"<think>{false_think}</think><answer>Down</answer>")
    assert info["reward_details"]["grounding"] == {"supported": 0, "contradicted": 3}
    assert reward == pytest.approx(-0.3)


def test_grounding_caps_and_format_gate():
    env = lake(reward_wrappers=[{"name": "grounding", "per_supported": 0.1, "max_bonus": 0.15, "max_penalty": 0.1}])
    env.reset(seed=0)
    think = "I am at (0, 0). The goal is at (3, 3). Holes at (1,1), (1,3) and (2,3)."
    assert env.step(f"<think>{think}</think><answer>Right</answer>")[1] == pytest.approx(0.15)
    env.reset(seed=0)
    # A malformed reply gets no credit for true claims, but still pays for false ones.
    _, reward, _, _, info = env.step(f"<think>{think} I am at (3, 0). The goal is at (0,0).</think>")
    assert info["reward_parts"]["grounding"] == pytest.approx(-0.1) and reward == pytest.approx(-0.2)


def test_grounding_on_bandit_and_countdown():
    bandit = gym.make("ragen/Bandit-v0", reward_wrappers=["grounding"])
    bandit.reset(seed=0)
    info = bandit.step("<think>Dragon is risky but pays more on average.</think><answer>Dragon</answer>")[4]
    assert info["reward_details"]["grounding"]["supported"] == 1
    countdown = gym.make("ragen/Countdown-v0", reward_wrappers=["grounding"])
    countdown.reset(options={"numbers": [2, 3, 4], "target": 24})
    info = countdown.step("<think>2 * 3 = 6 and 6 * 4 = 25</think><answer>2 * 3 * 4</answer>")[4]
    assert info["reward_details"]["grounding"] == {"supported": 1, "contradicted": 1}
    assert info["reward_parts"]["grounding"] == pytest.approx(0.05 - 0.1)


def test_thinking_length_grows_to_a_cap():
    env = lake(reward_wrappers=[{"name": "thinking_length", "target_words": 20, "min_words": 3}])
    rewards = []
    for n in (2, 5, 10, 20, 40):
        env.reset(seed=0)
        words = NATURAL.split()[:n]
        rewards.append(env.step(f"<think>{' '.join(words)}</think><answer>Left</answer>")[1])
    assert rewards[0] == 0.0  # below min_words
    assert rewards[1] == pytest.approx(0.1 * 5 / 20) and rewards[2] == pytest.approx(0.05)
    assert rewards[3] == pytest.approx(0.1) and rewards[4] == pytest.approx(0.1)  # capped


@pytest.mark.parametrize(
    "think, why",
    [
        ("go " * 50, "distinct"),
        ("I should go left now. " * 10, "distinct"),
        (NATURAL + " " + NATURAL, "repeated"),  # enough distinct words, but the same sentences twice
        ("... ,,, !!! ??? ;;; " * 30, "fewer than"),
        (" ".join(f"w{i}" for i in range(500)), "more than"),
    ],
)
def test_thinking_length_gives_padding_nothing(think, why):
    env = lake(reward_wrappers=["thinking_length"])
    env.reset(seed=0)
    _, reward, _, _, info = env.step(f"<think>{think}</think><answer>Left</answer>")
    assert reward == 0.0 and why in info["reward_details"]["thinking_length"]["why_zero"]


def test_thinking_length_needs_a_well_formed_reply():
    env = lake(reward_wrappers=["thinking_length"])
    env.reset(seed=0)
    _, reward, _, _, info = env.step(f"<think>{NATURAL}</think>")
    assert info["reward_parts"]["thinking_length"] == 0.0 and reward == pytest.approx(-0.1)


def test_padding_stats():
    assert padding_stats([]) == (0.0, 0.0)
    distinct, repeated = padding_stats("a b c a b c a b c".split())
    assert distinct == pytest.approx(3 / 9) and repeated == pytest.approx(1 - 3 / 7)
    assert padding_stats(NATURAL.lower().split())[1] == 0.0


def test_wrappers_compose_and_parts_sum_to_reward():
    env = lake(reward_wrappers=["format", "grounding", "thinking_length", "grounding"])
    _, info = env.reset(seed=0)
    assert set(info["reward_parts"]) == {"format", "grounding", "thinking_length", "grounding_2"}
    for text in (f"<think>I am at (0, 0). {NATURAL}</think><answer>Down</answer>", "nonsense", "<think>x</think>"):
        _, reward, terminated, truncated, info = env.step(text)
        assert sum(info["reward_parts"].values()) == pytest.approx(reward)
        assert {"env", "format_penalty", "format", "grounding", "thinking_length", "grounding_2"} <= set(
            info["reward_parts"]
        )


def test_no_bonus_after_the_episode_ended():
    env = lake(reward_wrappers=["format"])
    env.reset(seed=0)
    assert env.step("<think>x</think><answer>Down || Right</answer>")[2]  # hole: terminated
    _, reward, _, _, info = env.step("<think>x</think><answer>Down</answer>")
    assert reward == 0.0 and info["reward_parts"]["format"] == 0.0
    assert "ended" in info["reward_details"]["format"]["skipped"]


def test_weight_and_wrapping_directly():
    env = FormatReward(ThinkingLengthReward(lake(), weight=0.0), weight=2.0)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(f"<think>{NATURAL}</think><answer>Right</answer>")
    assert reward == pytest.approx(0.2) and info["reward_parts"]["thinking_length"] == 0.0
    assert info["reward_details"]["thinking_length"]["words"] > 0
    grounded = ReasoningGroundingReward(gym.make("ragen/Bandit-v0"))
    grounded.reset(seed=0)
    assert "grounding" in grounded.step("<think>x</think><answer>Dragon</answer>")[4]["reward_parts"]


def test_registry_and_errors():
    assert {"format", "grounding", "thinking_length"} <= set(REWARD_WRAPPERS)
    with pytest.raises(ValueError, match="unknown reward wrapper 'nope'"):
        lake(reward_wrappers=["nope"])
    with pytest.raises(ValueError, match="bad keyword for FormatReward"):
        lake(reward_wrappers=[{"name": "format", "bogus": 1}])
    with pytest.raises(ValueError, match="invalid argument reward_wrappers item"):
        lake(reward_wrappers=[3])
    with pytest.raises(ValueError, match="invalid argument per_supported="):
        lake(reward_wrappers=[{"name": "grounding", "per_supported": -1}])
    with pytest.raises(ValueError, match="invalid argument target_words="):
        lake(reward_wrappers=[{"name": "thinking_length", "target_words": 0}])
    with pytest.raises(ValueError, match="invalid argument name="):
        FormatReward(lake(), name="env")
    with pytest.raises(ValueError, match="RewardShaping"):
        register_reward("x", dict)  # type: ignore[arg-type]


def test_custom_wrapper_by_registration():
    class ShortAnswer(RewardShaping):
        """+0.01 for a turn with exactly one action."""

        default_name = "short"

        def compute(self, action, info, context):
            return (0.01 if len(info["actions"]) == 1 else 0.0), {"n": len(info["actions"])}

    register_reward("short", ShortAnswer)
    try:
        env = lake(reward_wrappers=["short", {"name": "short", "part_name": "short_again", "weight": 2}])
        env.reset(seed=0)
        info = env.step("<think>x</think><answer>Right</answer>")[4]
        assert info["reward_parts"]["short"] == pytest.approx(0.01)
        assert info["reward_parts"]["short_again"] == pytest.approx(0.02)
        direct = wrap_rewards(lake(), "short")
        assert isinstance(direct, ShortAnswer)
    finally:
        REWARD_WRAPPERS.pop("short")
