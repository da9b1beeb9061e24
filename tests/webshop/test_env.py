"""ragen/WebShop-v0: the env over HTTP (embedded server or a running one), check_env, protocol defaults, reward,
invalid actions, observation modes, reasoning checks, and that importing ragen_envs stays light."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import ragen_envs
from ragen_envs.webshop import WebShopEnv
from webshop_server.catalog import GeneratedCatalog

SMALL = {"num_products": 100}


def _goal_of(env: WebShopEnv, catalog: GeneratedCatalog):
    k = int(env._page["url"].split("/")[1].split("_")[1])
    return catalog.goal(catalog.splits[env.split][k])


def _solve_actions(goal) -> list[str]:
    values = goal.goal_options.values() if isinstance(goal.goal_options, dict) else goal.goal_options
    return [f"search[{goal.name}]", f"click[{goal.asin.lower()}]", *[f"click[{v}]" for v in values], "click[buy now]"]


def test_check_env_unwrapped_and_wrapped():
    env = gym.make("ragen/WebShop-v0", **SMALL)
    try:
        check_env(env.unwrapped, skip_render_check=True)
        check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_protocol_defaults_match_the_reference():
    env = gym.make("ragen/WebShop-v0", **SMALL)
    try:
        proto = ragen_envs.find_protocol(env)
        assert (proto.actions_per_turn, proto.max_turns, proto.max_actions_per_episode) == (1, 9, 9)
        assert proto.settings.length_hint == 200
        prompt, info = env.reset(seed=0)
        assert prompt.startswith(env.unwrapped.reference_instruction) and "Max response length: 200 words" in prompt
        assert "You must choose from these actions:search[<content>]." in prompt
        assert info["available_actions"] == ["search[<content>]"]
        for turn in range(9):
            reply = "no tags at all" if turn % 2 else "<think>look</think><answer>click[nothing]</answer>"
            prompt, reward, terminated, truncated, info = env.step(reply)
            assert reward == pytest.approx(-0.1) and not info["action_is_valid"]
            # Whatever the reply, the agent is told what it can do next.
            assert info["available_actions"] == ["search[<content>]"]
        assert truncated and not terminated
    finally:
        env.close()


def test_oracle_episode_reaches_reward_one():
    catalog = GeneratedCatalog(100)
    env = WebShopEnv(split="test", **SMALL)
    try:
        for seed in range(4):
            obs, info = env.reset(seed=seed)
            goal = _goal_of(env, catalog)
            assert goal.instruction_text in obs and info["available_actions"] == ["search[<content>]"]
            total, terminated = 0.0, False
            for action in _solve_actions(goal):
                obs, reward, terminated, truncated, info = env.step(action)
                assert info["action_is_valid"], (action, info.get("reason"))
                total += reward
            assert terminated and total == 1.0 and info["success"] and env.is_success()
            assert info["reward_info"]["r_type"] == 1.0 and info["page"] == "done"
            assert "Your score (min 0.0, max 1.0) [SEP] 1.0" in obs
    finally:
        env.close()


def test_reset_is_deterministic_and_splits_differ():
    a, b = WebShopEnv(split="test", **SMALL), WebShopEnv(split="train", **SMALL)
    try:
        assert a.reset(seed=5)[0] == a.reset(seed=5)[0]
        seen = {a.reset(seed=s)[0] for s in range(10)}
        assert len(seen) > 3
        assert a.reset(options={"goal_index": 0})[0] == a.reset(options={"goal_index": 0})[0]
        assert b.n_goals == 160 and a.n_goals == 20
    finally:
        a.close()
        b.close()


def test_actions_are_case_and_space_tolerant_and_invalid_ones_are_noops():
    env = WebShopEnv(**SMALL)
    try:
        env.reset(seed=1)
        obs0 = env.state_text()
        obs, r, term, trunc, info = env.step("click[back to search]")  # not on the search page
        assert not info["action_is_valid"] and "not available" in info["reason"] and obs == obs0 and r == 0
        obs, r, term, trunc, info = env.step("buy it now")
        assert not info["action_is_valid"] and "search[keywords] or click[label]" in info["reason"]
        obs, r, term, trunc, info = env.step("  SEARCH [ Coffee   Table ]  ")
        assert info["action_is_valid"] and info["actions"] == ["search[Coffee Table]"] and info["page"] == "results"
        asin = next(a for a in info["available_actions"] if a.startswith("click[b0"))[len("click[") : -1]
        obs, r, term, trunc, info = env.step("search[again]")
        assert not info["action_is_valid"] and "only available on the search page" in info["reason"]
        obs, r, term, trunc, info = env.step(f"`Click[ {asin.upper()} ]`")
        assert info["action_is_valid"] and info["page"] == "item" and info["action_is_effective"]
        assert env.step(12)[4]["action_is_valid"] is False  # type: ignore[arg-type]
    finally:
        env.close()


@pytest.mark.parametrize("mode", ["text_rich", "html"])
def test_observation_modes(mode):
    env = WebShopEnv(observation_mode=mode, **SMALL)
    try:
        obs, _ = env.reset(seed=0)
        if mode == "html":
            assert obs.startswith("<!DOCTYPE html>") and 'id="search_input"' in obs
        else:
            assert "[button] Search [button_]" in obs
        assert "Available actions: ['search[<content>]']" in obs
    finally:
        env.close()


def test_env_against_a_running_server(server, shop):
    host, port = server.server_address[:2]
    env = WebShopEnv(server_url=f"http://{host}:{port}", split="eval")
    try:
        env.reset(seed=0)
        k = int(env._page["url"].split("_")[1])
        goal = shop.catalog.goal(shop.catalog.splits["eval"][k])
        for action in _solve_actions(goal):
            _, reward, terminated, _, info = env.step(action)
        assert terminated and reward == 1.0 and info["success"]
    finally:
        env.close()


def test_embedded_server_is_shared_and_stopped():
    from ragen_envs.webshop import _Embedded

    before = len(_Embedded._servers)
    a, b = WebShopEnv(num_products=64), WebShopEnv(num_products=64)
    assert a.server_url == b.server_url and len(_Embedded._servers) == before + 1
    a.close()
    assert len(_Embedded._servers) == before + 1
    b.close()
    b.close()  # idempotent
    assert len(_Embedded._servers) == before


def test_bad_arguments_and_unreachable_server():
    for kwargs, name in [({"split": "dev"}, "split"), ({"observation_mode": "url2"}, "observation_mode"),
                         ({"num_products": 0}, "num_products"), ({"server_url": "ftp://x"}, "server_url"),
                         ({"timeout": 0}, "timeout")]:  # fmt: skip
        with pytest.raises(ValueError, match=name):
            WebShopEnv(**kwargs)
    with pytest.raises(ConnectionError, match="did not answer"):
        WebShopEnv(server_url="http://127.0.0.1:9", timeout=2)


def test_check_reasoning_price_claims():
    env = WebShopEnv(**SMALL)
    try:
        env.reset(seed=0)
        env.step("search[coffee table]")
        view = env.state_view()
        p = view["products"][0]
        low = float(p["price"].split(" to ")[0].lstrip("$"))
        good = f"{p['asin']} costs ${low}. Let me open it."
        bad = f"{p['asin']} costs ${low + 123.45:.2f}."
        assert env.check_reasoning(good, view, []) == {"supported": 1, "contradicted": 0}
        assert env.check_reasoning(bad, view, []) == {"supported": 0, "contradicted": 1}
        budget = view["budget"]
        if budget is not None:
            assert env.check_reasoning(f"My budget is ${budget:.2f}.", view, []) == {"supported": 0, "contradicted": 0}
        assert env.check_reasoning("I will search.", view, []) == {"supported": 0, "contradicted": 0}
    finally:
        env.close()


def test_importing_ragen_envs_stays_light():
    code = (
        "import sys, ragen_envs, ragen_envs.webshop, gymnasium;"
        "bad = [m for m in ('webshop_server', 'bm25s', 'rapidfuzz', 'scipy', 'torch') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_server_imports_nothing_of_ragen_and_caches_where_ragen_does(tmp_path, monkeypatch):
    """The layers: webshop_server stands below ragen_envs (DESIGN.md), so it imports neither the envs nor the trainer,
    and finds the same cache folder as ragen's own (``ragen_envs.cache``) by itself."""
    code = (
        "import pkgutil, importlib, sys, webshop_server;"
        "[importlib.import_module('webshop_server.' + m.name) for m in pkgutil.iter_modules(webshop_server.__path__)];"
        "from webshop_server.app import build_shop; build_shop(num_products=20, seed=0);"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('ragen_envs', 'ragen_trainer')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    from ragen_envs.cache import cache_dir
    from webshop_server.search import default_cache_root

    monkeypatch.setenv("RAGEN_CACHE_DIR", str(tmp_path / "ragen"))
    assert default_cache_root() == cache_dir("webshop") == tmp_path / "ragen" / "webshop"
    monkeypatch.delenv("RAGEN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_root() == cache_dir("webshop") == tmp_path / "xdg" / "ragen" / "webshop"


def test_current_goal_is_the_answer_key_of_the_embedded_server_only(server):
    env = WebShopEnv(split="test", **SMALL)
    try:
        env.reset(seed=3)
        goal = env.current_goal()
        assert goal.asin and goal.price_upper > 0 and goal.instruction_text
        assert env.current_goal() == goal  # the same episode, the same goal
    finally:
        env.close()
    remote = WebShopEnv(server_url=server.url, split="test")
    try:
        remote.reset(seed=3)
        with pytest.raises(ValueError, match="embedded server"):
            remote.current_goal()
    finally:
        remote.close()
