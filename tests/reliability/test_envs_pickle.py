"""Every env pickles (multiprocessing needs it), and a process that used any env exits without ``close()``.

Before, Sokoban envs held a thread lock (their generator's) and WebShop envs a socket and a server thread, so
``pickle.dumps`` failed; and a script that made ``ragen/WebShop-v0`` and ended without ``env.close()`` hung at exit
(the env's ``__del__`` waited, during interpreter shutdown, for the frozen server thread).
"""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import textwrap

import gymnasium as gym
import pytest

import ragen_envs  # noqa: F401
from ragen_envs.registration import ENV_IDS
from ragen_envs.sokoban.env import SokobanEnv

WEBSHOP = {"num_products": 60}
REPLIES = {
    "Bandit": ["<think>t</think><answer>Dragon</answer>"],
    "FrozenLake": ["<think>t</think><answer>Down || Right</answer>", "bad", "<think>t</think><answer>Left</answer>"],
    "Countdown": ["<think>t</think><answer>1 + 2</answer>"],
    "Sokoban": ["<think>t</think><answer>Up || Left</answer>", "<think>t</think><answer>Down || Right</answer>"],
    "WebShop": ["<think>t</think><answer>search[red shirt]</answer>", "<think>t</think><answer>click[< prev]</answer>"],
}


def _kwargs(env_id: str) -> dict:
    return dict(WEBSHOP) if "WebShop" in env_id else {}


def _replies(env_id: str) -> list[str]:
    name = env_id.split("/")[1].rsplit("-", 1)[0]
    return next(v for k, v in REPLIES.items() if name.startswith(k))


def _steps(env: gym.Env, replies: list[str]) -> list:
    out = []
    for reply in replies:
        obs, reward, terminated, truncated, _ = env.step(reply)
        out.append((obs, reward, terminated, truncated))
        if terminated or truncated:
            break
    return out


@pytest.fixture(params=list(ENV_IDS))
def env_id(request):
    return request.param


def test_round_trip_continues_the_episode_and_reseeds_the_same(env_id):
    env = gym.make(env_id, **_kwargs(env_id))
    try:
        fresh = pickle.loads(pickle.dumps(env))  # before any reset too
        first, _ = env.reset(seed=4)
        assert fresh.reset(seed=4)[0] == first
        replies = _replies(env_id)
        env.step(replies[0]) if len(replies) > 1 else None
        twin = pickle.loads(pickle.dumps(env))
        assert _steps(twin, replies[1:]) == _steps(env, replies[1:])  # mid-episode state carried over
        assert twin.reset(seed=9)[0] == env.reset(seed=9)[0]
        assert _steps(twin, replies) == _steps(env, replies)
        clone = copy.deepcopy(env)
        assert clone.reset(seed=2)[0] == env.reset(seed=2)[0]
        for other in (fresh, twin, clone):
            other.close()
        env.reset(seed=1)  # closing the copies leaves the original working
        assert _steps(env, replies)
    finally:
        env.close()


def test_unwrapped_envs_pickle(env_id):
    env = gym.make(env_id, **_kwargs(env_id)).unwrapped
    try:
        env.reset(seed=3)
        twin = pickle.loads(pickle.dumps(env))
        assert twin.state_text() == env.state_text()
        action = {"WebShop": "search[shoes]", "Countdown": "1 + 2", "Bandit": "Dragon"}
        name = next((k for k in action if k in env_id), None)
        a = action[name] if name else env.action_names[0]
        assert twin.step(a)[:4] == env.step(a)[:4]
        twin.close()
    finally:
        env.close()


def test_a_pickled_env_plays_in_another_process(env_id, tmp_path):
    env = gym.make(env_id, **_kwargs(env_id))
    try:
        env.reset(seed=6)
        (tmp_path / "env.pkl").write_bytes(pickle.dumps(env))
        replies = _replies(env_id)
        expected = [env.reset(seed=6)[0], *_steps(env, replies)]
    finally:
        env.close()
    (tmp_path / "replies.pkl").write_bytes(pickle.dumps(replies))
    script = textwrap.dedent(
        f"""
        import pickle, sys
        env = pickle.loads(open({str(tmp_path / "env.pkl")!r}, "rb").read())  # no import of ragen_envs first
        replies = pickle.loads(open({str(tmp_path / "replies.pkl")!r}, "rb").read())
        out = [env.reset(seed=6)[0]]
        for reply in replies:
            obs, reward, terminated, truncated, _ = env.step(reply)
            out.append((obs, reward, terminated, truncated))
            if terminated or truncated:
                break
        sys.stdout.buffer.write(pickle.dumps(out))
        """
    )  # and no close(): the process must exit by itself
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert pickle.loads(done.stdout) == expected


def test_pooled_sokoban_pickles_without_its_pool():
    env = SokobanEnv(pool_size=30)
    env.reset(seed=0)
    data = pickle.dumps(env)
    assert len(data) < 20_000  # the pool is found again (the process's, or the disk cache), not copied
    twin = pickle.loads(data)
    assert twin._pool is env._pool
    assert twin.reset(seed=5)[0] == env.reset(seed=5)[0]
    assert twin.current_level() == env.current_level()


def test_a_closed_webshop_env_unpickles_closed():
    env = gym.make("ragen/WebShop-v0", **WEBSHOP)
    env.reset(seed=0)
    env.close()
    twin = pickle.loads(pickle.dumps(env))
    assert twin.unwrapped._closed and twin.unwrapped._embedded_key is None


_EXIT_SCRIPT = """
import gymnasium as gym, ragen_envs
from ragen_envs.registration import ENV_IDS
envs = []
for env_id in ENV_IDS:
    env = gym.make(env_id, **({"num_products": 60} if "WebShop" in env_id else {}))
    env.reset(seed=0)
    env.step("<think>t</think><answer>" + ("search[shirt]" if "WebShop" in env_id else "Up") + "</answer>")
    envs.append(env)
{extra}
print("played", flush=True)
"""


@pytest.mark.parametrize(
    "extra",
    [
        "",  # envs alive at exit, never closed
        "del envs",  # envs collected before exit
        "vec = gym.make_vec('ragen/WebShop-v0', 2, vectorization_mode='async', num_products=60); vec.reset(seed=1)",
        "import os; os._exit(0) if os.fork() == 0 else os.wait()",  # a forked child with the parent's envs
    ],
    ids=["alive", "collected", "async-vector", "forked-child"],
)
def test_a_process_that_used_every_env_exits_without_close(extra):
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT.replace("{extra}", extra)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "played" in done.stdout
