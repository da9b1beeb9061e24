"""The base env and the info contract: every key on every reset and step, unknown actions are no-ops, bad arguments
raise ValueError naming the argument."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

import ragen_envs
from ragen_envs.core import INFO_KEYS, BaseTextEnv, StepOutcome, check_arg, default_info
from ragen_envs.spaces import UnicodeText

OFFLINE_IDS = [
    "ragen/Bandit-v0",
    "ragen/BanditTest-v0",
    "ragen/BanditRev-v0",
    "ragen/FrozenLake-v0",
    "ragen/Countdown-v0",
]


def test_default_info_has_every_key_and_fresh_containers():
    a, b = default_info(), default_info(success=True)
    assert set(INFO_KEYS) <= set(a)
    assert b["success"] is True and a["success"] is False
    a["actions"].append("x")
    assert b["actions"] == []


def test_check_arg_message_names_argument_and_allowed_values():
    check_arg(True, "size", 4, "an int")
    with pytest.raises(ValueError, match=r"invalid argument size=1: expected an int in 2\.\.64"):
        check_arg(False, "size", 1, "an int in 2..64")


def test_unicode_text_space_accepts_any_unicode_within_length():
    space = UnicodeText(10)
    assert space.contains("√→中文 ok")
    assert not space.contains("x" * 11)
    assert not space.contains(5)
    assert space.contains(space.sample())
    assert space == UnicodeText(10) and space != UnicodeText(11)


@pytest.mark.parametrize("env_id", OFFLINE_IDS)
def test_unwrapped_env_contract(env_id):
    env = gym.make(env_id).unwrapped
    assert isinstance(env, BaseTextEnv)
    assert isinstance(env.instructions, str) and env.instructions
    obs, info = env.reset(seed=0)
    assert isinstance(obs, str) and obs == env.state_text()
    assert set(INFO_KEYS) <= set(info)
    view = env.state_view()
    json.dumps(view)  # the structured view is JSON-serialisable
    # An unknown action is a no-op with a reason, never an exception.
    # Countdown's reference scoring takes any non-empty answer (as the reference), so it gets a blank one
    invalid = "   " if "Countdown" in env_id else "definitely not an action"
    obs2, reward, terminated, truncated, info = env.step(invalid)
    assert obs2 == obs and reward == 0.0 and not terminated and not truncated
    assert set(INFO_KEYS) <= set(info)
    assert info["action_is_valid"] is False and "unknown action" in info["reason"]
    assert env.num_env_steps == 0
    assert env.step(12345)[4]["action_is_valid"] is False  # non-str action


def test_action_names_are_case_insensitive_on_the_base_env():
    env = gym.make("ragen/FrozenLake-v0", is_slippery=False).unwrapped
    env.reset(seed=0)
    for spelling in ("left", "LEFT", " Left ", "'left'", "[Left]", "move left", "west", "←"):
        assert env.parse_action(spelling) == "Left", spelling
    assert env.parse_action("leftt") is None


def test_render_mode_validation():
    with pytest.raises(ValueError, match="render_mode"):
        gym.make("ragen/Bandit-v0", render_mode="rgb_array")
    env = gym.make("ragen/Bandit-v0", render_mode="ansi")
    env.reset(seed=0)
    assert env.render() == env.unwrapped.state_text()
    assert gym.make("ragen/Bandit-v0").unwrapped.render() is None
    with pytest.raises(NotImplementedError):
        gym.make("ragen/Bandit-v0").unwrapped.render_rgb()


class _Counter(BaseTextEnv):
    """A minimal env: the hooks are enough for the whole API."""

    action_names = ("Inc", "Stop")
    action_synonyms = {"+1": "Inc"}

    @property
    def instructions(self) -> str:
        return "count"

    def _reset_state(self, options):
        self.n = int(self.np_random.integers(10))

    def _apply_action(self, action):
        if action == "Stop":
            return StepOutcome(terminated=True, success=self.n >= 10)
        self.n += 1
        return StepOutcome(reward=1.0, effective=True, reward_parts={"count": 0.5, "bonus": 0.5})

    def state_text(self):
        return f"n={self.n}"

    def state_view(self):
        return {"n": self.n}


def test_subclass_with_only_hooks_works_through_the_protocol():
    env = ragen_envs.make_text_env(_Counter, actions_per_turn=3, lenient_actions=True)  # "+1" is a synonym
    obs, info = env.reset(seed=3)
    # An env the reference does not have opens the reference layout's first message with its own instructions.
    assert obs.startswith(env.unwrapped.instructions.strip() + "\nTurn 1:\nState:\nn=")
    obs, reward, terminated, truncated, info = env.step("<think>t</think><answer>inc || +1 || stop</answer>")
    assert reward == pytest.approx(2.0)
    parts = info["reward_parts"]
    assert parts["count"] == 1.0 and parts["bonus"] == 1.0 and parts["format_penalty"] == 0.0
    assert sum(parts.values()) == pytest.approx(reward)
    assert info["actions"] == ["Inc", "Inc", "Stop"] and terminated
    assert env.unwrapped.num_env_steps == 3
    assert isinstance(env.unwrapped.np_random, np.random.Generator)


def test_dynamics_seed_keeps_the_initial_state_and_reseeds_what_follows():
    import gymnasium as gym

    def payouts(dynamics_seed):
        out = []
        for k in range(200):
            env = gym.make("ragen/Bandit-v0").unwrapped
            options = None if dynamics_seed is None else {"dynamics_seed": dynamics_seed + k}
            obs, _ = env.reset(seed=7, options=options)
            out.append((obs, env.step("Dragon")[1]))
        return out

    same_stream = payouts(None)
    assert len({p for _, p in same_stream}) == 1  # reset(seed) alone: every episode replays the same payout
    reseeded = payouts(1000)
    assert len({obs for obs, _ in reseeded}) == 1  # the initial state still comes from seed
    wins = sum(p == 1.0 for _, p in reseeded)
    assert 20 < wins < 80  # about a quarter of 200 pulls pay, as high_risk_prob says
    assert reseeded == payouts(1000)  # and the same dynamics seeds replay the same outcomes
    env = gym.make("ragen/Bandit-v0").unwrapped
    with pytest.raises(ValueError, match="dynamics_seed"):
        env.reset(seed=0, options={"dynamics_seed": -1})
