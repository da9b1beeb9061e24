"""The WebShop env on bad arguments, a finalizer run under the server registry's lock, and actions the server
refuses."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest

from ragen_envs.webshop import WebShopEnv, _Embedded


def test_webshop_env_bad_timeout_and_goal_index_raise_value_error():
    # timeout=inf passed the check and then failed inside the socket layer with OverflowError; goal_index=True was
    # sent as session "train_True" (a ConnectionError from the server's 404) and numpy ints were refused.
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
