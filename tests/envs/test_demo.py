"""ragen-demo / python -m ragen_envs: plays every offline env and prints a summary."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ragen_envs import demo


def test_demo_plays_every_registered_env(capsys):
    """Every id the README lists, the paper's envs and the four text games (WebShop has its own test)."""
    from ragen_envs.registration import ENV_IDS, GAME_IDS

    assert demo.main(["--quiet", "--episodes", "2", "--no-webshop"]) == 0
    out = capsys.readouterr().out
    played = {line.split("] ", 1)[1].split(":", 1)[0] for line in out.splitlines() if line.startswith("[")}
    assert played == {i for i in [*ENV_IDS, *GAME_IDS] if "WebShop" not in i}
    assert "summary" in out and "skipped ragen/WebShop-v0: --no-webshop given" in out and "failed" not in out


def test_demo_plays_a_game_by_its_name(capsys):
    assert demo.main(["--env", "TicTacToe", "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "ragen/TicTacToe-v0" in out and "perfect player" in out and "--- reply 1 ---" in out
    assert demo.main(["--env", "Negotiation", "--episodes", "2", "--quiet"]) == 0
    assert "ragen/Negotiation-v0" in capsys.readouterr().out


def test_demo_plays_webshop_on_an_embedded_server_or_skips_it(capsys):
    assert demo.main(["--env", "webshop", "--episodes", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "ragen/WebShop-v0" in out and "rule" in out and "failed" not in out
    assert demo.main(["--env", "webshop", "--no-webshop"]) == 2  # nothing left to play


def test_demo_shows_an_episode_and_the_scripted_agents_succeed(capsys):
    assert demo.main(["--env", "countdown", "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert "--- system prompt ---" in out and "Countdown puzzle" in out and "--- reply 1 ---" in out
    assert "100%" in out  # the solver agent solves every puzzle
    assert demo.main(["--env", "Bandit-v0", "--episodes", "5", "--quiet"]) == 0
    assert "100%" in capsys.readouterr().out  # always pulls the high-risk arm


def test_demo_agents_follow_the_protocol():
    from ragen_envs.driver import play_episodes, rollout_jobs

    def first_turn(env_id, policy, **kwargs):
        episode = play_episodes(env_id, rollout_jobs([3]), _OneTurn(policy), env_kwargs=kwargs)[0]
        return episode.turns[0].info

    info = first_turn("ragen/FrozenLake-v0", demo.frozen_lake_agent)
    assert info["format_ok"] and info["action_is_valid"] and info["reason"] is None
    info = first_turn("ragen/FrozenLake-v0", demo.frozen_lake_agent, reward_wrappers=["grounding"])
    assert (
        info["reward_details"]["grounding"]["supported"] >= 2
        and info["reward_details"]["grounding"]["contradicted"] == 0
    )
    info = first_turn("ragen/FrozenLake-v0", demo.random_agent, actions_per_turn=3)
    assert info["format_ok"] and 1 <= len(info["actions"]) <= 3


class _OneTurn(demo.ScriptedAgent):
    """Plays one turn, then ends the episode (the test reads the first turn's info)."""

    def reply_batch(self, episodes):
        from ragen_envs.driver import AgentReply

        return [AgentReply("", stop="test done") if e.turns else r
                for e, r in zip(episodes, super().reply_batch(episodes))]  # fmt: skip


def test_demo_webshop_agent_buys():
    pytest.importorskip("bm25s")
    from ragen_envs.driver import play_episodes, rollout_jobs

    episodes = play_episodes("ragen/WebShop-v0", rollout_jobs([0, 1, 2, 3]), demo.ScriptedAgent(demo.webshop_agent))
    assert all(e.terminated for e in episodes)  # every episode ends with a purchase, within the 9 turns
    assert sum(e.success for e in episodes) >= 2


def test_demo_rejects_unknown_env(capsys):
    assert demo.main(["--env", "NoSuchEnv"]) == 2
    assert "no env matches" in capsys.readouterr().err


def test_python_dash_m_entry_point():
    result = subprocess.run(
        [sys.executable, "-m", "ragen_envs", "--quiet", "--episodes", "1", "--env", "FrozenLake"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "ragen/FrozenLake-v0" in result.stdout
