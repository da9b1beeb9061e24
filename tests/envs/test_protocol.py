"""The turn protocol: actions per turn, separator, action and turn budgets, format penalty with a reason,
case-insensitive actions, thinking off, and the prompt text of both layouts."""

from __future__ import annotations

import gymnasium as gym
import pytest

import ragen_envs
from ragen_envs.core import INFO_KEYS
from ragen_envs.factory import load_object, make_text_env
from ragen_envs.protocol import TurnProtocol, find_protocol
from ragen_envs.settings import FIELD_NAMES, ProtocolSettings


def lake(**kw):
    """A non-slippery 4x4 gymnasium map: deterministic moves. Start (0,0); holes (1,1) (1,3) (2,3) (3,0)."""
    return gym.make("ragen/FrozenLake-v0", map_name="4x4", is_slippery=False, **kw)


def reply(*actions, think="plan", sep=" || "):
    return f"<think>{think}</think><answer>{sep.join(actions)}</answer>"


def test_executes_actions_in_order_and_sums_rewards():
    env = lake()
    env.reset(seed=0)
    # (0,0) -> Right (0,1) -> Right (0,2) -> Down (1,2) -> Down (2,2) -> Down (3,2)
    obs, reward, terminated, truncated, info = env.step(reply("Right", "Right", "Down", "Down", "Down"))
    assert info["actions"] == ["Right", "Right", "Down", "Down", "Down"]
    assert env.unwrapped.state_view()["player"] == [3, 2]
    assert reward == 0.0 and not terminated and not truncated
    assert info["actions_left"] == 5 and info["turn"] == 1
    obs, reward, terminated, truncated, info = env.step(reply("Right"))
    assert reward == 1.0 and terminated and info["success"]
    assert info["reward_parts"] == {"env": 1.0, "format_penalty": 0.0}
    assert "The episode has ended" in obs


@pytest.mark.parametrize("per_turn", [1, 2, 3, 7])
def test_actions_per_turn_limits_and_drops_the_rest(per_turn):
    env = lake(actions_per_turn=per_turn, max_actions_per_episode=20)
    env.reset(seed=0)
    moves = ["Right", "Left"] * 4  # 8 moves that never leave row 0
    _, _, _, _, info = env.step(reply(*moves))
    assert info["actions"] == moves[:per_turn]
    assert info["dropped_actions"] == moves[per_turn:]
    assert info["actions_left"] == 20 - per_turn
    assert info["reason"] is None  # dropping extra actions is not a format error


def test_stops_at_episode_end_and_drops_remaining_actions():
    env = lake()
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(reply("Down", "Right", "Up"))  # (1,0) then (1,1) is a hole
    assert terminated and reward == 0.0
    assert info["actions"] == ["Down", "Right"] and info["dropped_actions"] == ["Up"]
    assert "X" in env.unwrapped.state_text()


def test_max_actions_per_episode_truncates():
    env = lake(actions_per_turn=3, max_actions_per_episode=4)
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step(reply("Right", "Left", "Right"))
    assert not truncated and info["actions_left"] == 1
    _, _, terminated, truncated, info = env.step(reply("Left", "Right", "Left"))
    assert truncated and not terminated
    assert info["actions"] == ["Left"] and info["dropped_actions"] == ["Right", "Left"] and info["actions_left"] == 0


def test_truncation_at_max_turns_and_step_after_end():
    env = lake(max_turns=2)
    env.reset(seed=0)
    assert env.step(reply("Right"))[3] is False
    obs, reward, terminated, truncated, info = env.step("garbage")
    assert truncated and not terminated and reward == pytest.approx(-0.1)
    # A step after the end is answered, not raised, and says why.
    obs, reward, terminated, truncated, info = env.step(reply("Right"))
    assert truncated and reward == 0.0 and "reset()" in info["reason"]
    assert set(INFO_KEYS) <= set(info)
    env.reset(seed=0)
    assert env.step(reply("Right"))[3] is False  # reset restores the budgets


def test_format_penalty_and_reason():
    env = lake(format_penalty=-0.25, prompt_layout="ragen")
    obs0, _ = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("I'd go right")
    assert reward == pytest.approx(-0.25) and info["reward_parts"]["format_penalty"] == -0.25
    assert info["format_ok"] is False and info["action_is_valid"] is False
    assert "missing <think>" in info["reason"] and "not used in full" in obs
    assert info["turn"] == 1 and info["actions_left"] == 10  # a bad reply spends a turn, not actions


def test_reference_layout_shows_the_env_reward_without_the_penalty():
    env = lake(format_penalty=-0.25)
    env.reset(seed=0)
    obs, reward, *_ = env.step("I'd go right")
    assert reward == pytest.approx(-0.25)
    assert obs.startswith("Reward:\n0\n\nTurn 2:\nState:\n")  # RAGEN prints the env's reward (the int 0 here)
    assert "not used in full" not in obs


def test_invalid_action_is_penalised_but_valid_ones_run():
    env = lake()
    env.reset(seed=0)
    _, reward, _, _, info = env.step(reply("Right", "Jump", "Left"))
    assert info["format_ok"] is True and info["action_is_valid"] is False
    assert info["invalid_actions"] == ["Jump"] and info["actions"] == ["Right", "Left"]
    assert reward == pytest.approx(-0.1) and "Jump" in info["reason"] and "Left, Down, Right, Up" in info["reason"]


def test_actions_are_the_names_in_any_case_as_the_reference():
    env = lake()
    env.reset(seed=0)
    _, reward, _, _, info = env.step(reply("RIGHT", "left", "East", "go west"))
    assert info["actions"] == ["Right", "Left"] and info["invalid_actions"] == ["East", "go west"]
    assert reward == pytest.approx(-0.1)


def test_lenient_actions_accept_the_envs_synonyms():
    env = lake(lenient_actions=True)
    env.reset(seed=0)
    _, _, _, _, info = env.step(reply("RIGHT", "left", "East", "go west"))
    assert info["actions"] == ["Right", "Left", "Right", "Left"] and info["reason"] is None


def test_custom_separator():
    env = lake(action_sep=";")
    obs, info = env.reset(seed=0)
    assert 'separated by the action separator " ; "' in obs
    _, _, _, _, info = env.step(reply("Right", "Right", sep=" ; "))
    assert info["actions"] == ["Right", "Right"]
    # With ";" as separator, "||" is not one: the whole answer is one (invalid) action.
    _, _, _, _, info = env.step(reply("Right", "Right"))
    assert info["invalid_actions"] == ["Right || Right"]


def test_thinking_off_requires_the_answer_tags_as_the_reference():
    env = lake(enable_think=False)
    env.reset(seed=0)
    _, reward, _, _, info = env.step("Right || Left")
    assert info["actions"] == [] and "<answer>" in info["reason"] and reward == pytest.approx(-0.1)
    _, _, _, _, info = env.step("<answer>Up</answer>")
    assert info["actions"] == ["Up"] and info["reason"] is None


def test_thinking_off_accepts_bare_actions_with_bare_answers():
    env = lake(enable_think=False, bare_answers=True)
    obs, info = env.reset(seed=0)
    # (the reference's FrozenLake instruction keeps its <think> example even then; the format line changes)
    assert "[Your thoughts]" not in obs and "Always output: <answer> [your answer] </answer> with no extra text" in obs
    _, _, _, _, info = env.step("Right || Left")
    assert info["actions"] == ["Right", "Left"] and info["reason"] is None and info["think"] == ""
    _, _, _, _, info = env.step("<answer>Up</answer>")
    assert info["actions"] == ["Up"]


def test_reference_layout_is_ragens_ctx_manager_text():
    """The exact messages of RAGEN's ctx_manager.py: system, instruction + legend + actions, Turn/State blocks."""
    env = lake(length_hint=123)
    obs, info = env.reset(seed=0)
    assert info["system_prompt"] == "You're a helpful assistant. "
    base = env.unwrapped
    expected = (
        base.reference_instruction
        + "\nThe meaning of each symbol in the state is:\nP: player, _: empty, O: hole, G: goal, X: player in hole, "
        "√: player on goal"
        + "\nYour available actions are:\nLeft, Down, Right, Up"
        + '\nYou can make up to 10 actions, separated by the action separator " || "\n'
        + f"\nTurn 1:\nState:\n{base.state_text()}\nYou have 10 actions left. Always output: <think> [Your thoughts] "
        "</think> <answer> [your answer] </answer> with no extra text. Strictly follow this format. "
        "Max response length: 123 words (tokens).\n"
    )
    assert obs == expected
    obs, *_ = env.step(reply("Right"))
    assert obs.startswith("Reward:\n0.0\n\nTurn 2:\nState:\n") and "You have 9 actions left." in obs


def test_one_turn_envs_end_after_one_reply_as_the_reference():
    for env_id in ("ragen/Bandit-v0", "ragen/BanditTest-v0", "ragen/BanditRev-v0"):
        env = gym.make(env_id)
        obs, info = env.reset(seed=0)
        assert obs.startswith("\nTurn 1:\nState:\nYou are playing a bandit game.") and "You have 1 actions left." in obs
        _, reward, terminated, truncated, info = env.step("no answer tag")
        assert truncated and not terminated and reward == pytest.approx(-0.1)


def test_ragen_layout_keeps_instructions_in_the_system_message():
    env = lake(length_hint=123, prompt_layout="ragen")
    obs, info = env.reset(seed=0)
    assert (
        "Turn 1:" in obs and "P" in obs and "10 actions left" in obs and "<think>...</think><answer>...</answer>" in obs
    )
    assert "123 words" in obs
    assert info["system_prompt"].startswith("You're a helpful assistant. You are solving the FrozenLake puzzle")
    assert "up to 5 actions per turn" in info["system_prompt"]
    obs, *_ = env.step(reply("Right"))
    assert obs.startswith("Reward:\n0") and "Turn 2:" in obs and "9 actions left" in obs
    one = gym.make("ragen/Bandit-v0", prompt_layout="ragen")
    assert "exactly one action per turn" in one.reset(seed=0)[1]["system_prompt"]


def test_reward_parts_sum_to_reward_and_env_extras_pass_through():
    env = gym.make("ragen/FrozenLake-v0")
    env.reset(seed=5)
    for text in (reply("Left", "Down"), "bad", reply("Up", "nope")):
        _, reward, terminated, truncated, info = env.step(text)
        assert sum(info["reward_parts"].values()) == pytest.approx(reward)
        if terminated or truncated:
            break
    env.reset(seed=5)
    info = env.step(reply("Left"))[4]
    assert "slipped" in info and "moved" in info


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"actions_per_turn": 0}, "actions_per_turn"),
        ({"actions_per_turn": 1.5}, "actions_per_turn"),
        ({"max_actions_per_episode": True}, "max_actions_per_episode"),
        ({"max_turns": -1}, "max_turns"),
        ({"action_sep": "  "}, "action_sep"),
        ({"enable_think": "yes"}, "enable_think"),
        ({"format_penalty": "-0.1"}, "format_penalty"),
        ({"length_hint": 0}, "length_hint"),
        ({"prompt_layout": "chatml"}, "prompt_layout"),
        ({"max_reply_chars": 10}, "max_reply_chars"),
    ],
)
def test_bad_protocol_arguments_raise_value_error(kwargs, name):
    with pytest.raises(ValueError, match=f"invalid argument {name}="):
        gym.make("ragen/FrozenLake-v0", **kwargs)


def test_make_text_env_routes_kwargs_and_rejects_bad_entry_points():
    env = make_text_env("ragen_envs.frozen_lake:FrozenLakeEnv", size=5, actions_per_turn=2)
    assert isinstance(env, TurnProtocol) and env.actions_per_turn == 2 and env.unwrapped.size == 5
    assert set(FIELD_NAMES) >= {"actions_per_turn", "action_sep", "enable_think", "prompt_layout", "reply_prefix"}
    with pytest.raises(ValueError, match="env_cls"):
        load_object("no_colon_here")
    with pytest.raises(ValueError, match="env"):
        TurnProtocol(gym.make("CartPole-v1"))


def test_each_id_plays_its_reference_settings_and_make_kwargs_override_them():
    assert find_protocol(gym.make("ragen/Bandit-v0")).settings == ragen_envs.reference_settings("ragen/Bandit-v0")
    web = ragen_envs.reference_settings("ragen/WebShop-v0")
    assert (web.max_turns, web.actions_per_turn, web.max_actions_per_episode, web.length_hint) == (9, 1, 9, 200)
    env = gym.make("ragen/FrozenLake-v0", protocol={"max_turns": 3}, action_sep=";")
    settings = find_protocol(env).settings
    assert (settings.max_turns, settings.action_sep, settings.actions_per_turn) == (3, ";", 5)
    whole = ProtocolSettings(max_turns=2)
    assert find_protocol(gym.make("ragen/Sokoban-v0", protocol=whole)).settings == whole


def test_a_setting_given_twice_differently_names_both_places():
    with pytest.raises(ValueError, match="'max_turns' is given twice.*the protocol argument.*gymnasium.make keywords"):
        gym.make("ragen/FrozenLake-v0", protocol={"max_turns": 3}, max_turns=4)
    gym.make("ragen/FrozenLake-v0", protocol={"max_turns": 3}, max_turns=3)  # agreeing places are fine
    with pytest.raises(ValueError, match="unknown protocol setting"):
        gym.make("ragen/FrozenLake-v0", protocol={"max_turn": 3})


def test_find_protocol_through_reward_wrappers_and_without_one():
    env = gym.make("ragen/FrozenLake-v0", reward_wrappers=["format"])
    assert isinstance(find_protocol(env), TurnProtocol)
    with pytest.raises(ValueError, match="TurnProtocol"):
        find_protocol(env.unwrapped)


def test_invalid_actions_are_named_briefly():
    env = lake()
    env.reset(seed=0)
    junk = ["x" * 100_000] * 8
    _, _, _, _, info = env.step(reply(*junk))
    assert len(info["reason"]) < 600 and "more" not in info["reason"]  # 5 per turn: all named, each cut short
    env = lake(actions_per_turn=8)
    env.reset(seed=0)
    _, _, _, _, info = env.step(reply(*junk))
    assert "and 3 more" in info["reason"] and len(info["reason"]) < 600


def test_observation_cap():
    env = lake(max_observation_chars=300)
    obs, _ = env.reset(seed=0)
    assert len(obs) <= 300 and "[... cut ...]" in obs


def test_overlong_reply_is_cut_and_penalised():
    env = lake(max_reply_chars=1000)
    env.reset(seed=0)
    long_reply = reply("Right") + " " * 1000
    _, reward, _, _, info = env.step(long_reply)
    assert info["actions"] == ["Right"]  # the well-formed start is still used
    assert "cut to its first" in info["reason"] and reward == pytest.approx(-0.1)
