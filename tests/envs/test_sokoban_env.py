"""SokobanEnv: gymnasium checks, reward accounting on scripted moves, info, text, rendering, protocol, reasoning."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import ragen_envs
from ragen_envs.core import INFO_KEYS
from ragen_envs.sokoban.boxoban import parse_boxoban
from ragen_envs.sokoban.env import SokobanEnv
from ragen_envs.sokoban.solver import solve_level

SOKOBAN_IDS = [i for i in ragen_envs.ENV_IDS if "Sokoban" in i]

# Two boxes, two targets: a push onto a target, off it, and a win are all a few scripted moves away.
#   row 0  #######
#   row 1  #@$ . #
#   row 2  #  $. #
#   row 3  #     #
#   row 4  #######
TWO_BOXES = parse_boxoban("#######\n#@$ . #\n#  $. #\n#     #\n#######")[0]


def _env(**kwargs) -> SokobanEnv:
    env = SokobanEnv(**kwargs)
    env.reset(seed=0, options={"level": TWO_BOXES})
    return env


@pytest.mark.parametrize("env_id", SOKOBAN_IDS)
def test_check_env_wrapped_and_unwrapped(env_id):
    assert env_id in gym.registry
    env = gym.make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env, skip_render_check=False)
    check_env(gym.make(env_id, render_mode="rgb_array").unwrapped, skip_render_check=False)


@pytest.mark.parametrize("env_id, dim, nb", [
    ("ragen/Sokoban-v0", (6, 6), 1), ("ragen/SokobanLarge-v0", (8, 8), 2), ("ragen/SokobanNewVocab-v0", (6, 6), 1),
])  # fmt: skip
def test_registered_variants_and_determinism(env_id, dim, nb):
    env = gym.make(env_id)
    obs, info = env.reset(seed=11)
    base = env.unwrapped
    assert base.dim_room == dim and len(base.state_view()["boxes"]) == nb
    assert obs == gym.make(env_id).reset(seed=11)[0]
    assert len({gym.make(env_id).reset(seed=s)[0] for s in range(15)}) > 10
    # the reference generator (the default) does not know a level's optimum
    assert info["optimal_pushes"] is None and info["boxes_on_target"] == 0 and info["deadlock"] is False
    grid = base.state_view()["grid"]
    assert len(grid) == dim[0] and all(len(row) == dim[1] for row in grid)
    symbols = set("".join(grid))
    ragen_prompt = gym.make(env_id, prompt_layout="ragen").reset(seed=11)[1]["system_prompt"]
    default_legend = "#: wall, _: empty, O: target, √: box on target, X: box, P: player, S: player on target"
    # The reference layout prints the reference's default legend for every variant (its NewVocab quirk).
    assert default_legend in obs and "Your available actions are:\nUp, Down, Left, Right" in obs
    if "NewVocab" in env_id:
        assert symbols <= set("W.GCBA@") and "A" in symbols | {"@"} and "B" in symbols
        # the ragen layout names the symbols the grid really uses
        assert "W: wall, .: empty, G: target, C: box on target, B: box, A: player, @: player on target" in ragen_prompt
    else:
        assert symbols <= set("#_O√XPS") and "X" in symbols
        assert default_legend in ragen_prompt
    assert "Up, Down, Left, Right" in ragen_prompt
    # the reference's protocol defaults
    assert tuple(env.get_wrapper_attr(k) for k in ("actions_per_turn", "max_actions_per_episode", "max_turns")) == (
        5,
        10,
        5,
    )


def test_reward_accounting_on_scripted_moves():
    env = _env()
    assert env.state_text() == "#######\n#PX_O_#\n#__XO_#\n#_____#\n#######"
    # Up: a wall; nothing moves, the step still costs 0.1
    _, r, term, trunc, info = env.step("Up")
    assert r == pytest.approx(-0.1) and info["reward_parts"] == {"step": -0.1}
    assert info["action_is_effective"] is False and not term and not trunc
    # Right, Right: push box 1 to (1,3), then onto the target (1,4)
    _, r, *_ = env.step("Right")
    assert r == pytest.approx(-0.1)
    _, r, term, _, info = env.step("right")  # case-insensitive
    assert info["reward_parts"] == {"step": -0.1, "box_on": 1.0} and r == pytest.approx(0.9)
    assert info["boxes_on_target"] == 1 and not term and info["action_is_effective"]
    # Right again: push it off the target to (1,5)
    _, r, _, _, info = env.step("Right")
    assert info["reward_parts"] == {"step": -0.1, "box_off": -1.0} and r == pytest.approx(-1.1)
    assert info["boxes_on_target"] == 0
    # the box now sits in a corner off target: the level can no longer be solved
    assert info["deadlock"] is True
    assert solve_level(env.snapshot()) is None


def test_winning_push_pays_box_and_solved_rewards():
    env = _env()
    # box 2 at (2,3) goes right onto (2,4); box 1 at (1,2) goes right twice onto (1,4)
    for a in ["Down", "Right"]:  # player to (2,2)
        env.step(a)
    _, r, term, _, info = env.step("Right")  # box 2 onto (2,4)
    assert r == pytest.approx(0.9) and info["boxes_on_target"] == 1 and not term
    total = 0.0
    for a in ["Left", "Left", "Up", "Right"]:  # back to (1,1), push box 1 to (1,3)
        _, r, term, _, info = env.step(a)
        total += r
    assert total == pytest.approx(-0.4) and not term
    _, r, term, trunc, info = env.step("Right")  # box 1 onto (1,4): solved
    assert info["reward_parts"] == {"step": -0.1, "box_on": 1.0, "solved": 10.0}
    assert r == pytest.approx(10.9) and term and not trunc and info["success"] and env.is_success()
    assert "√" in env.state_text() and "X" not in env.state_text()


def test_max_steps_truncates():
    env = _env(max_steps=3)
    results = [env.step("Up") for _ in range(3)]
    assert [res[3] for res in results] == [False, False, True]
    assert not any(res[2] for res in results)


def test_invalid_action_is_a_noop_with_reason():
    env = _env()
    before = env.state_text()
    obs, r, _term, _trunc, info = env.step("jump")
    assert obs == before and r == 0.0 and not info["action_is_valid"] and "Up, Down, Left, Right" in info["reason"]
    for key in INFO_KEYS:
        assert key in info
    assert env.parse_action("3") == "Left" and env.parse_action(" north ") == "Up"


def test_protocol_turn_and_reward_wrappers_work_unchanged():
    env = gym.make("ragen/Sokoban-v0", reward_wrappers=["format", "grounding"])
    env.reset(seed=0, options={"level": TWO_BOXES})
    reply = (
        "<think>I am at (1, 1). The box is at (1, 2) and a target is at (1, 4). "
        "Moving right pushes the box.</think><answer>Right || Right || Up</answer>"
    )
    _, reward, _, _, info = env.step(reply)
    assert info["actions"] == ["Right", "Right", "Up"] and info["format_ok"]
    assert info["reward_parts"]["box_on"] == pytest.approx(1.0)
    assert reward == pytest.approx(sum(info["reward_parts"].values()))
    assert info["reward_parts"]["grounding"] > 0  # four true claims, none false
    assert info["boxes_on_target"] == 1 and info["actions_left"] == 7
    # a malformed reply: a format penalty, nothing executed
    _obs, reward, *_, info = env.step("Right Right")
    assert info["reward_parts"]["format_penalty"] == pytest.approx(-0.1) and info["actions"] == []


def test_check_reasoning_verifies_claims():
    env = _env()
    view = env.state_view()
    assert view["player"] == [1, 1] and view["boxes"] == [[1, 2], [2, 3]] and view["targets"] == [[1, 4], [2, 4]]
    true = (
        "I am at (1, 1). Boxes at (1, 2) and (2, 3). The target is at (2, 4). "
        "Moving up hits a wall. The box is to the right of me."
    )
    assert env.check_reasoning(true, view, []) == {"supported": 6, "contradicted": 0}
    false = "I am at (3, 3). The box is at (3, 1). Moving left pushes the box onto the target."
    result = env.check_reasoning(false, view, [])
    assert result["supported"] == 0 and result["contradicted"] == 4
    # after stepping next to box 2 (player at (2,2)): Right really pushes it onto a target
    env.step("Down")
    env.step("Right")
    view = env.state_view()
    ok = env.check_reasoning("Moving right pushes the box onto the target.", view, ["Right"])
    assert ok == {"supported": 2, "contradicted": 0}
    assert env.check_reasoning("", view, []) == {"supported": 0, "contradicted": 0}


def test_observation_formats_and_vocab():
    env = _env(observation_format="coord")
    text = env.state_text()
    assert "Player: (1, 1)" in text and "Boxes: (1, 2), (2, 3)" in text and "Targets: (1, 4), (2, 4)" in text
    both = _env(observation_format="grid_coord", vocab="new").state_text()
    assert both.endswith("WWWWWWW\nWAB.G.W\nW..BG.W\nW.....W\nWWWWWWW")
    custom = {"wall": "▓", "empty": " ", "target": "o", "box_on_target": "*", "box": "b", "player": "@",
              "player_on_target": "+"}  # fmt: skip
    assert _env(vocab=custom).state_text().splitlines()[1] == "▓@b o ▓"
    for kwargs, name in [
        ({"vocab": "old"}, "vocab"),
        ({"vocab": {"wall": "#"}}, "vocab"),
        ({"observation_format": "image"}, "observation_format"),
        ({"max_steps": 0}, "max_steps"),
        ({"dim_room": (2, 2)}, "dim_room"),
        ({"num_boxes": -1}, "num_boxes"),
        ({"pool_size": -5}, "pool_size"),
        ({"render_mode": "human"}, "render_mode"),
    ]:
        with pytest.raises(ValueError, match=name):
            SokobanEnv(**kwargs)


def test_rgb_rendering_draws_each_thing():
    env = SokobanEnv(render_mode="rgb_array")
    env.reset(seed=0, options={"level": TWO_BOXES})
    img = env.render()
    assert img.shape == (5 * 32, 7 * 32, 3) and img.dtype == np.uint8
    tile = lambda r, c: img[r * 32 : (r + 1) * 32, c * 32 : (c + 1) * 32]
    centre = lambda r, c: tuple(tile(r, c)[16, 16])
    wall, player, box, target = centre(0, 0), centre(1, 1), centre(1, 2), tuple(tile(1, 4)[16, 16 + 9])
    assert len({wall, player, box, target, centre(3, 3)}) == 5  # wall, player, box, target ring, floor differ
    ansi = SokobanEnv(render_mode="ansi")
    assert "reset" in ansi.render()
    ansi.reset(seed=0)
    assert ansi.render() == ansi.state_text() and "P" in ansi.render()


def test_pooled_env_resets_from_the_pool(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGEN_CACHE_DIR", str(tmp_path))
    env = SokobanEnv((6, 6), 1, generator="exact", pool_size=50, pool_seed=1, max_pushes=2)
    seen = set()
    for seed in range(30):
        obs, info = env.reset(seed=seed)
        assert 1 <= info["optimal_pushes"] <= 2 and info["optimal_moves"] >= info["optimal_pushes"]
        seen.add(obs)
        level = env.current_level()
        assert solve_level(level).moves == info["optimal_moves"]
    assert len(seen) > 5
    again = SokobanEnv((6, 6), 1, generator="exact", pool_size=50, pool_seed=1, max_pushes=2)
    assert env.reset(seed=4)[0] == again.reset(seed=4)[0]
    first = env.reset(options={"level_index": 0})[0]
    assert first == env.reset(options={"level_index": 0})[0]
    with pytest.raises(ValueError, match="level_index"):
        env.reset(options={"level_index": 10_000})


def test_boxoban_file_levels(tmp_path):
    path = tmp_path / "levels.txt"
    path.write_text("; 0\n#######\n#@$ . #\n#  $. #\n#     #\n#######\n\n; 1\n#####\n#@$.#\n#####\n")
    env = gym.make("ragen/Sokoban-v0", levels=str(path))
    obs, info = env.reset(seed=0, options={"level_index": 1})
    assert "#P" in obs and info["optimal_pushes"] is None
    obs, reward, term, _, info = env.step("<think>push it</think><answer>Right</answer>")
    assert term and info["success"] and reward == pytest.approx(10.9)
    starts = {env.reset(seed=s)[0] for s in range(10)}
    assert len(starts) == 2
    with pytest.raises(ValueError, match="pool_size"):
        SokobanEnv(levels=str(path), pool_size=10)
    with pytest.raises(FileNotFoundError):
        SokobanEnv(levels=str(tmp_path / "nope.txt"))


def test_oracle_plays_generated_levels_to_success():
    """The solver as the oracle agent through the LLM-facing env (5 actions a turn)."""
    env = gym.make("ragen/SokobanLarge-v0", max_actions_per_episode=100, max_turns=40)
    for seed in range(10):
        env.reset(seed=seed)
        plan = solve_level(env.unwrapped.current_level()).actions
        total = 0.0
        for i in range(0, len(plan), 5):
            _, reward, term, _trunc, info = env.step(
                "<think>plan</think><answer>" + " || ".join(plan[i : i + 5]) + "</answer>"
            )
            total += reward
        assert term and info["success"]
        assert total == pytest.approx(-0.1 * len(plan) + 10 + env.unwrapped.num_boxes, abs=1e-6)


def test_random_play_keeps_the_rules():
    """Random actions (valid or not) on generated levels: boxes stay on floor, never overlap, the count holds, the
    reward always equals the sum of its parts, and a reported deadlock really is unsolvable."""
    rng = np.random.default_rng(0)
    words = ["Up", "Down", "Left", "Right", "up", "LEFT", "4", "jump", "", "Up || Down", "<answer>"]
    for seed in range(12):
        env = SokobanEnv((7, 7), 2, max_steps=400)
        env.reset(seed=seed)
        walls = {tuple(w) for w in env.state_view()["walls"]}
        checked_deadlock = False
        for _ in range(150):
            _, reward, term, _trunc, info = env.step(str(rng.choice(words)))
            view = env.state_view()
            boxes = {tuple(b) for b in view["boxes"]}
            assert len(boxes) == 2 and not boxes & walls and tuple(view["player"]) not in boxes | walls
            assert reward == pytest.approx(sum(info["reward_parts"].values()))
            if info["deadlock"] and not checked_deadlock:
                assert solve_level(env.snapshot()) is None
                checked_deadlock = True
            if term:
                assert info["success"]
                break


def test_state_keys_reach_every_turn_info():
    env = gym.make("ragen/Sokoban-v0")
    env.reset(seed=0, options={"level": TWO_BOXES})
    _, _, _, _, info = env.step("<think>t</think><answer>Right || Right</answer>")
    assert info["boxes_on_target"] == 1 and info["deadlock"] is False
    _, _, _, _, info = env.step("no tags at all")  # nothing runs; the state keys are still there
    assert info["boxes_on_target"] == 1 and info["deadlock"] is False and info["actions"] == []
    _, _, _, _, info = env.step("<think>t</think><answer>Right</answer>")  # off the target into the corner
    assert info["boxes_on_target"] == 0 and info["deadlock"] is True


def test_sokoban_current_level_before_reset_says_so():
    # current_level() before the first reset raised AttributeError: '_pool_current' (an attribute set only by
    # a pooled reset), whatever the level source.
    env = SokobanEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.current_level()
    env.reset(seed=0)
    assert env.current_level() is env.level
