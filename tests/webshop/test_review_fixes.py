"""Regression tests for bugs found in review of the WebShop server, reward and env (one test per bug)."""

from __future__ import annotations

import json

import pytest

from webshop_server.reward import get_option_reward, get_reward
from webshop_server.shop import ShopError

TEXT = {"Title": "Cotton Shirt in Burgundy, size XL", "BulletPoints": [], "Description": ""}


def _bought(**kw):
    bought = {
        "query": "q", "product_category": "a › b › c", "name": "Cotton Shirt",
        "Attributes": ["machine wash"], "Title": "Cotton Shirt in Burgundy, size XL", "BulletPoints": [],
        "Description": "",
    }  # fmt: skip
    bought.update(kw)
    return bought


def _goal(**kw):
    goal = {
        "query": "q", "product_category": "a › b › c", "name": "Cotton Shirt", "attributes": ["machine wash"],
        "goal_options": {"color": "grey"}, "price_upper": 40.0,
    }  # fmt: skip
    goal.update(kw)
    return goal


def test_option_reward_counts_goal_options_not_purchased_text():
    # A purchased option that is NOT what the goal asked for must not count, even when its value appears in the
    # product's own text (buying "burgundy" for a "grey" goal once scored the option part in full).
    assert get_option_reward(TEXT, ["grey"], {"color": "burgundy"}) == (0, 0)
    # the original matches goal options against purchased options only
    assert get_option_reward(TEXT, ["burgundy"], {}) == (0, 0)


def test_option_matches_never_exceed_the_goal_options():
    # Each goal option is matched at most once, so R stays in [0, 1] and a perfect purchase has R == 1 (success).
    # Before: the extra purchased size (in the title) counted as a second match, R = 4/3 and success was False.
    r_option, n = get_option_reward(TEXT, ["grey"], {"color": "grey", "size": "xl"})
    assert (r_option, n) == (1, 1)
    r_option, n = get_option_reward(TEXT, ["grey"], {"color": "grey", "shade": "grey melange"})
    assert (r_option, n) == (1, 1)
    reward, info = get_reward(_bought(), _goal(), 35.0, {"color": "grey", "size": "xl"})
    assert reward == 1.0 and info["n_option_matches"] == 1


def test_api_step_with_a_lone_surrogate_is_not_a_500(client):
    # The reason of an invalid action echoes the action; a lone surrogate (valid JSON "\\ud800") made the UTF-8
    # encoding of the JSON answer raise, and the server answered 500.
    body = b'{"url": "/train_0", "action": "click[\\ud800]"}'
    status, data = client.request("POST", "/api/step", body, {"Content-Type": "application/json"})
    assert status == 200
    payload = json.loads(data)
    assert payload["valid"] is False and "not available" in payload["reason"]
    status, data = client.request(
        "POST",
        "/api/step",
        b'{"url": "/train_0", "action": "search[\\udfff shoes]"}',
        {"Content-Type": "application/json"},
    )
    assert status == 200 and json.loads(data)["valid"] is True


@pytest.mark.parametrize("session", ["train_0\n", "test_1-abc\n"])
def test_session_id_with_a_trailing_newline_is_unknown(shop, session):
    # `$` in the session pattern also matched before a final "\n", so "/train_0%0A" was served as a session whose
    # id then appeared, newline included, in every URL of its pages.
    with pytest.raises(ShopError) as err:
        shop.goal_index(session)
    assert err.value.status == 404


def test_static_files_load_when_the_package_is_imported_from_outside_the_repo(tmp_path):
    # With an editable install made before webshop_server/ had its __init__.py (as on this machine), the package
    # imports as a namespace package outside the repo root, and importlib.resources.files() then raised
    # NotADirectoryError: every server start (and the WebShop env, and the demo) failed when run from elsewhere.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = "import importlib.util; print(importlib.util.find_spec('webshop_server') is not None)"
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    if found.stdout.strip() != "True":
        pytest.skip("the ragen distribution is not installed: webshop_server cannot be imported outside the repo")
    code = "from webshop_server.app import _static_bytes; print(sorted(_static_bytes()))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "style.css" in out.stdout and "webshop.js" in out.stdout


def test_webshop_env_bad_timeout_and_goal_index_raise_value_error():
    # timeout=inf passed the check and then failed inside the socket layer with OverflowError; goal_index=True was
    # sent as session "train_True" (a ConnectionError from the server's 404) and numpy ints were refused.
    import numpy as np

    from ragen_envs.webshop import WebShopEnv

    with pytest.raises(ValueError, match="timeout"):
        WebShopEnv(num_products=100, timeout=float("inf"))
    env = WebShopEnv(num_products=100)
    try:
        with pytest.raises(ValueError, match="goal_index"):
            env.reset(options={"goal_index": True})
        _, info = env.reset(options={"goal_index": np.int64(3)})
        assert info["url"].startswith(f"/{env.split}_3")
    finally:
        env.close()


def test_embedded_server_release_from_a_finalizer_under_the_lock_does_not_deadlock():
    # WebShopEnv.__del__ releases its embedded server. A garbage collection can run that finalizer in a thread that
    # already holds the registry lock (acquire() builds the shop under it, allocating a lot); with a plain Lock the
    # thread then waited on itself forever.
    import threading

    from ragen_envs.webshop import _Embedded

    done = threading.Event()

    def run() -> None:
        with _Embedded._lock:
            _Embedded.release(("no-such-server",))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(10)


@pytest.mark.parametrize(
    "action", ["search[\x00]", "search[\u200b]", "search[" + "İ" * 400 + "]"], ids=["nul", "zero-width", "long-lower"]
)
def test_webshop_env_reports_actions_the_server_refused_as_invalid(action):
    # The env accepted these searches (non-blank, <= 500 chars) but the server refused them (nothing printable left;
    # 800 chars once lower-cased): the step did nothing, yet it said action_is_valid=True with no reason, so the
    # protocol applied no format penalty.
    import gymnasium as gym

    env = gym.make("ragen/WebShop-v0", num_products=100)
    try:
        env.reset(seed=0)
        base = env.unwrapped
        _, reward, terminated, _, info = base.step(action)
        assert info["action_is_valid"] is False and info["reason"] and info["server_reason"]
        assert reward == 0.0 and not terminated and info["page"] == "search" and base.num_env_steps == 0
        _, reward, _, _, info = env.step(f"<think>x</think><answer>{action}</answer>")
        assert reward == pytest.approx(-0.1) and info["invalid_actions"] and info["reason"]
    finally:
        env.close()
