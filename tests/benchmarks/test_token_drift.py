"""``benchmarks/token_drift.py`` on the tiny test model: the token kinds split a conversation into its system turn,
the replies and the rest; a model scored against itself has drifted by exactly 0; a model whose weights moved has not;
GRPO's context advantage is the token-weighted mean of the group-normalised returns."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import token_drift as td

from ragen_trainer.config import load_config
from ragen_trainer.models import load_model_and_tokenizer
from ragen_trainer.rollout import ChatTokens
from ragen_trainer.trajectory import Trajectory

CONFIG = "env_id: ragen/FrozenLake-v0\nmax_new_tokens: 8\nmax_turns: 2\nmax_context_tokens: 1024\n"


@pytest.fixture()
def config_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    return str(path)


def test_a_model_against_itself_has_not_moved_and_a_changed_one_has(tmp_path, tiny_model_dir, config_file):
    moved = tmp_path / "moved"  # the same model with its weights moved a little
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir, dtype="float32", device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(moved)
    tokenizer.save_pretrained(moved)
    out = tmp_path / "drift.json"
    assert td.main([tiny_model_dir, tiny_model_dir, str(moved), "--labels", "same", "moved", "--config", config_file,
                    "--groups", "2", "--group-size", "2", "--no-progress", "--json", str(out),
                    "--md", str(tmp_path / "drift.md")]) == 0
    result = json.loads(out.read_text())
    assert result["episodes"]["count"] == 4 and result["settings"]["env"] == "ragen/FrozenLake-v0"
    assert 0.0 < result["episodes"]["context_share"] < 1.0
    same, changed = result["models"]
    for kind in ("reply", "context"):
        assert same["drift"][kind]["mean"] == pytest.approx(0.0, abs=1e-9)
        assert abs(changed["drift"][kind]["mean"]) > 1e-3
    assert "| moved |" in (tmp_path / "drift.md").read_text()


def test_token_kinds_split_system_replies_and_context(tiny_model_dir, config_file):
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir, dtype="float32", device="cpu")
    trajs = td.play(model, tokenizer, load_config(config_file).validate(), 1, 2, seed=3, progress=False)
    chat = ChatTokens(tokenizer)
    for traj in trajs:
        kinds = td.token_kinds(traj, chat)
        assert len(kinds) == len(traj.input_ids) - 1
        system = chat.system_turn_ids(traj.messages[0]["content"])
        assert (kinds[: len(system)] == td.UNSCORED).all() and (kinds[len(system):] != td.UNSCORED).all()
        ids = np.array(traj.input_ids[1:])
        for start, end in traj.turn_spans:  # a reply's ids are its kind REPLY, shifted by the prediction offset
            assert (kinds[start - 1:end - 1] == td.REPLY).all()
        context_text = tokenizer.decode(ids[kinds == td.CONTEXT].tolist())
        assert traj.messages[1]["content"].split("\n")[0] in context_text  # the first observation is context


def test_grpo_context_advantage_weights_each_episode_by_its_context_tokens():
    def traj(group, reward):
        return Trajectory(group_id=group, seed=group, env_id="x", messages=[], input_ids=[], loss_mask=[],
                          turn_spans=[], turn_rewards=[reward], success=reward > 0, replies=[], infos=[])

    trajs = [traj(0, 1.0), traj(0, 0.0)]  # A = +0.707, -0.707 (sample std of {1, 0})
    kinds = [np.array([td.CONTEXT] * 2 + [td.REPLY] * 2), np.array([td.CONTEXT] * 6 + [td.REPLY] * 2)]
    a = 0.5 / np.std([1.0, 0.0], ddof=1)
    assert td.grpo_context_advantage(trajs, kinds) == pytest.approx((2 * a - 6 * a) / 8, rel=1e-5)
