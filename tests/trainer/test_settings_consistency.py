"""Each setting has one default and one range check, and nothing is replaced silently."""

from __future__ import annotations

import inspect

import pytest

import ragen_envs
from ragen_trainer.config import StarPOConfig, load_config
from ragen_trainer.filtering import DEFAULT_FILTER_RATIO, KEEP_RATIO_RANGE, filter_groups, num_kept, valid_keep_ratio


def test_filter_ratio_has_one_default_everywhere():
    pytest.importorskip("trl")
    from ragen_trainer.trl_integration import RagenGRPOTrainer

    trl_default = inspect.signature(RagenGRPOTrainer.__init__).parameters["filter_ratio"].default
    groups_default = inspect.signature(filter_groups).parameters["keep_ratio"].default
    assert StarPOConfig().filter_ratio == trl_default == groups_default == DEFAULT_FILTER_RATIO == 0.25


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5])
def test_filter_ratio_has_one_range_check(bad):
    assert not valid_keep_ratio(bad)
    with pytest.raises(ValueError, match=r"invalid config field filter_ratio=.*\(0, 1\]"):
        load_config("starpo-s").replace(filter_ratio=bad).validate()
    with pytest.raises(ValueError, match=r"keep_ratio=.*\(0, 1\]"):
        num_kept(8, bad)
    assert "(0, 1]" in KEEP_RATIO_RANGE and not valid_keep_ratio(True) and not valid_keep_ratio("0.5")


def test_self_play_refuses_a_max_turns_the_game_would_replace():
    base = load_config("starpo-s").replace(env_id="ragen/TicTacToe-v0", opponent_pool=["self"])
    base.validate()  # the registered turn budget: the game's own applies
    with pytest.raises(ValueError, match=r"invalid config field max_turns=5: expected the game's registered 8.*"
                                         r"invalid_cap"):  # fmt: skip
        base.replace(max_turns=5).validate()


def test_the_pettingzoo_game_names_its_turn_budget_and_says_when_it_replaces_a_changed_one():
    pytest.importorskip("pettingzoo")
    from ragen_envs.games import aec_env

    registered = ragen_envs.reference_settings("ragen/TicTacToe-v0")
    env = aec_env("tictactoe", protocol=registered, invalid_cap=2)
    assert env.unwrapped.turn_budget == 5 + 2 * 2 == env.unwrapped.settings.max_turns
    with pytest.warns(UserWarning, match=r"max_turns=4 \(registered: 8\) replaced by the game's own turn budget 11"):
        env = aec_env("tictactoe", protocol=registered.updated({"max_turns": 4}))
    assert env.unwrapped.settings.max_turns == 11


def test_the_resolved_protocol_is_one_object_from_config_to_env():
    """The config resolves the protocol once; gymnasium.make plays that very object (no dict round trip, no second
    merge); keywords on top of it still meet the conflict check."""
    import gymnasium as gym

    cfg = load_config("starpo-s").replace(env_id="ragen/FrozenLake-v0", max_turns=3).validate()
    settings = cfg.protocol_settings()
    kwargs = cfg.env_make_kwargs(settings)
    assert kwargs["protocol"] is settings and settings.max_turns == 3
    env = gym.make(cfg.env_id, **kwargs)
    try:
        assert env.get_wrapper_attr("settings") is settings
    finally:
        env.close()
    with pytest.raises(ValueError, match="max_turns.*given twice"):
        gym.make(cfg.env_id, **kwargs, max_turns=4)
