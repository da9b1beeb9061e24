"""Every turn-protocol setting reaches the env that plays the episode, from each place a user can set it (a
``ragen-trainer train`` flag, a YAML config, an evaluation suite, ``ragen-trainer eval --protocol``), and training
and evaluation play the same episodes for the same seeds and the same scripted model."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from typing import Any

import pytest

import ragen_envs
from ragen_envs.driver import AgentReply, play_episodes, rollout_jobs
from ragen_envs.settings import ProtocolSettings
from ragen_trainer.cli import add_train_arguments, resolve_config
from ragen_trainer.config import load_config
from ragen_trainer.engines import SamplingParams
from ragen_trainer.evaluation.agents import Agent, ModelAgent
from ragen_trainer.evaluation.cli import main as eval_cli
from ragen_trainer.evaluation.runner import load_result, run_suite
from ragen_trainer.evaluation.suites import suite_from_dict
from ragen_trainer.rollout import collect_rollouts

ENV_ID = "ragen/FrozenLake-v0"

#: A value other than FrozenLake's reference one for every field, as a flag / YAML / JSON would write it.
CHANGED: dict[str, Any] = {
    "max_turns": 3,
    "actions_per_turn": 2,
    "max_actions_per_episode": 7,
    "action_sep": ";",
    "enable_think": False,
    "bare_answers": True,
    "lenient_actions": True,
    "format_penalty": -0.5,
    "length_hint": 77,
    "prompt_layout": "ragen",
    "reply_prefix": "Answer: ",
    "max_reply_chars": 5000,
    "max_observation_chars": 9000,
    "stop_after_answer": False,
}


def test_the_table_covers_every_field_and_changes_it():
    reference = ragen_envs.reference_settings(ENV_ID)
    assert set(CHANGED) == {f.name for f in fields(ProtocolSettings)}
    assert all(getattr(reference, k) != v for k, v in CHANGED.items())


class _Probe(Agent):
    """An agent that records the settings of the env each episode is played in, then stops the episode."""

    name = "probe"

    def __init__(self) -> None:
        self.seen: list[ProtocolSettings] = []

    def reply_batch(self, episodes):
        self.seen.extend(e.protocol.settings for e in episodes)
        return [AgentReply("", stop="probe") for _ in episodes]


def _played_settings(env_id: str, env_kwargs: dict[str, Any]) -> ProtocolSettings:
    probe = _Probe()
    play_episodes(env_id, rollout_jobs([0]), probe, env_kwargs=env_kwargs)
    return probe.seen[0]


def _flag(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_a_train_flag_reaches_the_env(name):
    parser = add_train_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--env", ENV_ID, f"--{name}", _flag(CHANGED[name])])
    cfg = resolve_config(args)
    # The trainer makes its envs with exactly these kwargs (StarPOTrainer._collect -> collect_rollouts).
    assert getattr(_played_settings(cfg.env_id, cfg.env_make_kwargs()), name) == CHANGED[name]


def test_a_yaml_config_reaches_the_env(tmp_path):
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"env_id": ENV_ID, "protocol": CHANGED}))
    cfg = load_config(path).validate()
    assert _played_settings(cfg.env_id, cfg.env_make_kwargs()) == ProtocolSettings(**CHANGED)


def test_a_suite_reaches_the_env_and_its_hash():
    base = {"name": "flow", "version": 1, "envs": [{"name": "Lake", "env_id": ENV_ID, "seeds": [0]}]}
    changed = json.loads(json.dumps(base))
    changed["envs"][0]["protocol"] = CHANGED
    suite = suite_from_dict(changed)
    probe = _Probe()
    run_suite(suite, probe, progress=False)
    assert probe.seen == [ProtocolSettings(**CHANGED)]
    assert suite.hash != suite_from_dict(base).hash
    for name, value in CHANGED.items():  # each field on its own changes the hash
        one = json.loads(json.dumps(base))
        one["envs"][0]["protocol"] = {name: value}
        assert suite_from_dict(one).hash != suite_from_dict(base).hash, name


def test_eval_protocol_flags_reach_the_env_and_the_result(tmp_path):
    suite = {"name": "flow", "version": 1, "envs": [{"name": "Lake", "env_id": ENV_ID, "seeds": [0, 1]}]}
    path = tmp_path / "flow-v1.json"
    path.write_text(json.dumps(suite))
    out = tmp_path / "r.json"
    pairs = [arg for k, v in CHANGED.items() for arg in ("--protocol", f"{k}={_flag(v)}")]
    assert eval_cli(["eval", "--agent", "random", "--suite", str(path), "--no-progress", "-o", str(out), *pairs]) == 0
    result = load_result(out)
    assert result["suite"]["definition"]["envs"][0]["protocol"] == ProtocolSettings(**CHANGED).to_dict()
    first = result["episodes"][0]
    assert "Max response length: 77 words (tokens)." in first["observation"]  # the env played with them
    assert first["system_prompt"].startswith("You're a helpful assistant. You are solving")  # the ragen layout


def test_a_conflict_between_two_places_names_both(tmp_path):
    parser = add_train_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--env", ENV_ID, "--max_turns", "3", "--set", "env_kwargs={max_turns: 4}"])
    with pytest.raises(ValueError, match="config field protocol.*config field env_kwargs"):
        resolve_config(args)
    suite = {"name": "x", "version": 1, "protocol": {"max_turns": 2},
             "envs": [{"name": "Lake", "env_id": ENV_ID, "seeds": [0], "protocol": {"max_turns": 3}}]}  # fmt: skip
    with pytest.raises(ValueError, match="suite x protocol.*env 'Lake' protocol"):
        suite_from_dict(suite)
    path = tmp_path / "x-v1.json"
    path.write_text(json.dumps({**suite, "protocol": {}}))
    code = eval_cli(["eval", "--agent", "random", "--suite", str(path), "--protocol", "reply_prefix=a",
                     "--reply-prefix", "b", "-o", str(tmp_path / "o.json")])  # fmt: skip
    assert code == 2


# ------------------------------------------------------------------------------------------ one driver
def _lake_reply(prompt_text: str, call: int, row: int) -> str:
    """A deterministic 'model': a fixed move sequence by turn (valid and invalid answers mixed)."""
    return ["<think>go</think><answer>Right || Down</answer>", "<think>hm</think><answer>Jump</answer>",
            "<think>go</think><answer>Down || Right || Down</answer>"][min(call, 2)]  # fmt: skip


@pytest.mark.parametrize("env_id", ["ragen/FrozenLake-v0", "ragen/Bandit-v0", "ragen/Countdown-v0"])
def test_training_and_evaluation_play_identical_episodes(env_id, tiny_tokenizer, scripted_engine):
    seeds = [11, 12, 13, 14]
    train = collect_rollouts(scripted_engine(tiny_tokenizer, _lake_reply), tiny_tokenizer, env_id, seeds, 1,
                             settings=load_config("starpo-s").rollout_settings(),
                             sampling=SamplingParams(max_new_tokens=64, seed=0))  # fmt: skip
    suite = suite_from_dict({"name": "same", "version": 1, "envs": [{"name": "E", "env_id": env_id, "seeds": seeds}],
                             "decoding": {"max_new_tokens": 64}})  # fmt: skip
    evaluation = run_suite(suite, ModelAgent(scripted_engine(tiny_tokenizer, _lake_reply), name="s"), progress=False)
    assert len(train.trajectories) == len(evaluation["episodes"]) == len(seeds)
    for traj, episode in zip(train.trajectories, evaluation["episodes"]):
        assert traj.seed == episode["seed"]
        assert traj.messages[0]["content"] == episode["system_prompt"]
        assert traj.messages[1]["content"] == episode["observation"]
        assert traj.replies == [t["reply"] for t in episode["turns"]]
        assert [m["content"] for m in traj.messages[3::2]] == [t["observation"] for t in episode["turns"]]
        assert traj.turn_rewards == [t["reward"] for t in episode["turns"]]
        assert traj.success == episode["success"]
        assert [i.get("actions") for i in traj.infos] == [t["actions"] for t in episode["turns"]]
