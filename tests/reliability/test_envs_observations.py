"""Observations always lie inside ``observation_space``, whatever the reply, and no exception escapes.

The bound: the LLM-facing env cuts every observation to ``ProtocolSettings.max_observation_chars`` (default
``ragen_envs.spaces.MAX_OBSERVATION_CHARS``, 1,000,000) and its ``observation_space`` is ``UnicodeText`` of that
length; an unwrapped env cuts its state text to ``MAX_OBSERVATION_CHARS``, its own space's bound. Invalid actions are
named briefly (a 40-character preview each) in ``info["reason"]``. Fuzzed here: replies of every kind (1 MB and
longer, non-``str`` values, unicode, nested and unclosed tags) on every id, wrapped and unwrapped, and with a short
observation bound.
"""

from __future__ import annotations

import math

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragen_envs  # noqa: F401
from ragen_envs.core import CUT_MARKER
from ragen_envs.registration import ENV_IDS
from ragen_envs.spaces import MAX_OBSERVATION_CHARS, UnicodeText

WEBSHOP = {"num_products": 60}
FRAGMENTS = [
    "<think>", "</think>", "<answer>", "</answer>", "<answer><answer>", "<think><answer></think></answer>", "||",
    " || ", "\n", "", "Up", "left", "DOWN", "Right", "north", "Dragon", "Phoenix", "Trader", "Librarian", "1 + 2",
    "(3 * 4) - 5", "10 / 0", "search[shirt]", "search[red shoes]", "click[back to search]", "click[next >]",
    "click[< prev]", "click[buy now]", "click[description]", "search[", "click[]", "√", "中文", "🙂", "\x00", "\ud800",
    "<|im_end|>",
]  # fmt: skip
NOT_TEXT = [None, b"<think>t</think><answer>Up</answer>", 0, -1, 1.5, float("nan"), [], ["Up"], ("Up",), {"a": 1}]

big = st.builds(
    lambda unit, n, tagged: f"<think>t</think><answer>{unit * n}</answer>" if tagged else unit * n,
    st.sampled_from(["Up || ", "x", "√", "search[a] || ", "1 + ", "<answer>", "</think>", "中文🙂"]),
    st.one_of(st.integers(0, 50), st.integers(150_000, 1_100_000)),
    st.booleans(),
)  # up to several MB: beyond max_reply_chars (1,000,000), cut before parsing
replies = st.one_of(
    st.text(max_size=300),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12)), max_size=30).map("".join),
    st.builds(
        lambda think, answer: f"<think>{think}</think><answer>{answer}</answer>",
        st.text(max_size=100),
        st.lists(st.sampled_from(FRAGMENTS), max_size=6).map(" || ".join),
    ),
    big,
    st.sampled_from(NOT_TEXT),
)

_ENVS: dict[tuple[str, str], gym.Env] = {}


def _env(env_id: str, variant: str) -> gym.Env:
    """One env per id and variant for the whole module (WebShop builds a catalog)."""
    key = (env_id, variant)
    if key not in _ENVS:
        kwargs = dict(WEBSHOP) if "WebShop" in env_id else {}
        if variant == "short":
            kwargs["max_observation_chars"] = 256
        env = gym.make(env_id, **kwargs)
        _ENVS[key] = env.unwrapped if variant == "unwrapped" else env
        _ENVS[key].reset(seed=0)
    return _ENVS[key]


@pytest.fixture(scope="module", autouse=True)
def _close_envs():
    yield
    for env in _ENVS.values():
        env.close()
    _ENVS.clear()


def check_step(env: gym.Env, reply: object) -> None:
    obs, reward, terminated, truncated, info = env.step(reply)  # type: ignore[arg-type]
    space = env.observation_space
    assert isinstance(space, UnicodeText) and space.contains(obs), (type(obs), len(obs) if isinstance(obs, str) else 0)
    assert isinstance(reward, float) and math.isfinite(reward)
    reason = info.get("reason")
    if reason is not None:
        assert isinstance(reason, str)
        # invalid actions are named by short previews: the reason is not the reply
        assert len(reason) <= 600 + len(env.unwrapped.describe_actions()), len(reason)
    if terminated or truncated:
        obs, _ = env.reset()
        assert space.contains(obs)


@pytest.mark.parametrize("variant", ["wrapped", "short", "unwrapped"])
@pytest.mark.parametrize("env_id", list(ENV_IDS))
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(reply=replies)
def test_any_reply_gives_an_observation_inside_the_space(env_id, variant, reply):
    check_step(_env(env_id, variant), reply)


@pytest.mark.parametrize("env_id", list(ENV_IDS))
def test_every_kind_of_reply_in_one_episode(env_id):
    """The same kinds, deterministically: each non-text value, the longest replies, then the episode's end."""
    for variant in ("wrapped", "short", "unwrapped"):
        env = _env(env_id, variant)
        env.reset(seed=1)
        for reply in [*NOT_TEXT, "x" * 2_000_000, "<think>t</think><answer>" + "Up || " * 200_000 + "</answer>"]:
            check_step(env, reply)
        for _ in range(12):  # past every turn cap: steps after the end are answered too
            check_step(env, "<think>t</think><answer>Up</answer>")


def test_an_unwrapped_state_that_echoes_a_huge_action_is_cut_to_the_space():
    env = _env("ragen/Countdown-v0", "unwrapped")
    env.reset(seed=2)
    obs, *_ = env.step("1 + " * 300_000 + "1")  # Countdown shows the answer in its state
    assert len(obs) == MAX_OBSERVATION_CHARS and CUT_MARKER in obs
    assert obs.startswith("Numbers: [")  # the head and the tail are kept


def test_the_protocol_space_follows_max_observation_chars():
    env = gym.make("ragen/Sokoban-v0", max_observation_chars=300)
    assert env.observation_space == UnicodeText(300)
    obs, _ = env.reset(seed=0)
    assert len(obs) == 300 and CUT_MARKER in obs
    assert gym.make("ragen/Sokoban-v0").observation_space == UnicodeText(MAX_OBSERVATION_CHARS)
