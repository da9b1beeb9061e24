"""Result files: contents, reproducibility, error capture and re-scoring from saved episodes."""

from __future__ import annotations

import json

import pytest

from ragen_trainer.evaluation.agents import Agent, OracleAgent, RandomAgent
from ragen_trainer.evaluation.rescore import rescore, rescore_file, summary_differences
from ragen_trainer.evaluation.runner import (
    RESULT_FORMAT,
    load_result,
    run_suite,
    save_result,
    summary_lines,
    without_timings,
)

from .helpers import small_suite

SUITE_ENTRIES = [("Bandit", "ragen/Bandit-v0", 6), ("FrozenLake", "ragen/FrozenLake-v0", 6),
                 ("Countdown", "ragen/Countdown-v0", 4)]  # fmt: skip


def test_same_suite_agent_and_seeds_give_the_same_result_file(tmp_path):
    suite = small_suite(*SUITE_ENTRIES, rollouts=2)
    first = save_result(run_suite(suite, RandomAgent(), progress=False), tmp_path / "a.json")
    second = save_result(run_suite(suite, RandomAgent(), progress=False), tmp_path / "b.json")
    a, b = load_result(first), load_result(second)
    assert "timings" in a and a["timings"]["wall_seconds"] >= 0
    assert json.dumps(without_timings(a), sort_keys=True) == json.dumps(without_timings(b), sort_keys=True)
    # and another agent seed gives another file
    other = run_suite(suite, RandomAgent(seed=5), progress=False)
    assert json.dumps(without_timings(other), sort_keys=True) != json.dumps(without_timings(a), sort_keys=True)


def test_result_holds_identity_versions_records_and_summary():
    suite = small_suite(*SUITE_ENTRIES)
    result = run_suite(suite, OracleAgent(), progress=False)
    assert result["format"] == RESULT_FORMAT
    assert result["suite"]["id"] == "test-v1" and result["suite"]["hash"] == suite.hash
    assert result["suite"]["definition"]["envs"][0]["name"] == "Bandit"
    assert result["agent"] == {"name": "oracle", "kind": "reference"}
    assert {"python", "ragen", "gymnasium", "numpy"} <= set(result["versions"])
    assert len(result["episodes"]) == 16
    lake = next(e for e in result["episodes"] if e["env"] == "FrozenLake")
    assert lake["initial_state"] and all(t["state"] for t in lake["turns"])  # grid env: text grids kept per turn
    assert lake["final_view"]["size"] == [4, 4]
    first = lake["turns"][0]
    assert {"reply", "actions", "reward", "reward_parts", "format_ok", "action_is_valid", "observation"} <= set(first)
    bandit = next(e for e in result["episodes"] if e["env"] == "Bandit")
    assert bandit["initial_state"] is None and bandit["turns"][0]["state"] is None  # not a grid env
    assert list(result["summary"]["envs"]) == ["Bandit", "FrozenLake", "Countdown"]
    table = "\n".join(summary_lines(result))
    assert "FrozenLake" in table and "overall score" in table
    json.dumps(result)  # JSON-serialisable as is


class _Crashing(Agent):
    name = "crashing"

    def reply(self, ctx):
        if ctx.seed % 2:
            raise RuntimeError("boom")
        return "<think>x</think><answer>1</answer>"


def test_an_agent_failure_is_recorded_per_episode_not_fatal():
    result = run_suite(small_suite(("Bandit", "ragen/Bandit-v0", 4)), _Crashing(), batch_size=1, progress=False)
    errors = [e["error"] for e in result["episodes"]]
    assert sum(e is not None for e in errors) == 2 and "boom" in next(e for e in errors if e)
    assert result["summary"]["envs"]["Bandit"]["errors"] == 2


def test_bad_env_ids_and_batch_sizes_raise_clear_errors():
    with pytest.raises(ValueError, match="entry 'X'.*not a registered ragen text env"):  # at load, before any episode
        run_suite(small_suite(("X", "ragen/NoSuchEnv-v0", 1)), RandomAgent(), progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        run_suite(small_suite(("Bandit", "ragen/Bandit-v0", 1)), RandomAgent(), batch_size=0, progress=False)


def test_rescoring_from_saved_episodes_reproduces_and_updates_the_summary(tmp_path):
    result = run_suite(small_suite(*SUITE_ENTRIES), RandomAgent(), progress=False)
    path = save_result(result, tmp_path / "r.json")
    new, differences = rescore_file(path)
    assert differences == [] and new["summary"] == load_result(path)["summary"]
    # Edit one saved episode (its last turn now succeeds): re-scoring picks it up, no model or env needed.
    edited = load_result(path)
    episode = next(e for e in edited["episodes"] if e["env"] == "Countdown" and not e["success"])
    episode["turns"][-1]["success"] = True
    rescored = rescore(edited)
    assert rescored["summary"]["envs"]["Countdown"]["success_rate"] == pytest.approx(
        result["summary"]["envs"]["Countdown"]["success_rate"] + 1 / 4
    )
    assert summary_differences(edited["summary"], rescored["summary"])


def test_load_result_rejects_other_files(tmp_path):
    other = tmp_path / "x.json"
    other.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="not a ragen evaluation result"):
        load_result(other)
    with pytest.raises(ValueError, match="does not exist"):
        load_result(tmp_path / "missing.json")


class _Interrupted(RandomAgent):
    """The random agent, stopped (as by Ctrl-C) when it reaches FrozenLake."""

    def reply(self, ctx):
        if ctx.env_name == "FrozenLake":
            raise KeyboardInterrupt
        return super().reply(ctx)


def test_an_interrupted_run_resumes_from_its_checkpoint_to_the_same_result(tmp_path):
    suite = small_suite(*SUITE_ENTRIES)
    checkpoint = tmp_path / "run.json.partial"
    with pytest.raises(KeyboardInterrupt):
        run_suite(suite, _Interrupted(), progress=False, checkpoint=checkpoint)
    saved = json.loads(checkpoint.read_text())
    assert {e["env"] for e in saved["episodes"]} == {"Bandit"}  # the finished env was kept
    resumed = run_suite(suite, RandomAgent(), progress=False, checkpoint=checkpoint)
    assert not checkpoint.exists()
    straight = run_suite(suite, RandomAgent(), progress=False)
    assert json.dumps(without_timings(resumed), sort_keys=True) == json.dumps(without_timings(straight), sort_keys=True)
    # a checkpoint of another agent (or suite) is ignored
    with pytest.raises(KeyboardInterrupt):
        run_suite(suite, _Interrupted(), progress=False, checkpoint=checkpoint)
    other = run_suite(suite, RandomAgent(seed=9), progress=False, checkpoint=checkpoint)
    fresh = run_suite(suite, RandomAgent(seed=9), progress=False)
    assert json.dumps(without_timings(other), sort_keys=True) == json.dumps(without_timings(fresh), sort_keys=True)
