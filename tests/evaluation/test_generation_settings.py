"""What a model was effectively generated with is recorded and hashed, and the leaderboard never ranks a run with
the generation prefix against one without it (no model, no server: scripted chat engines)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ragen_trainer.engines.base import GenerationResult
from ragen_trainer.evaluation.agents import Agent, ModelAgent, OracleAgent
from ragen_trainer.evaluation.leaderboard import build_board, markdown_table
from ragen_trainer.evaluation.runner import load_result, run_suite, save_result
from ragen_trainer.evaluation.schema import ResultFileError
from ragen_trainer.evaluation.suites import generation_hash

from .helpers import small_suite

NO_THINK = {"Bandit": {"protocol": {"enable_think": False}}}


class ChatEngine:
    """An OpenAI-like chat engine that answers every conversation with ``text`` (what a server returns)."""

    supports_token_ids = False
    tokenizer = None
    name = "openai"

    def __init__(self, text: str) -> None:
        self.text = text
        self.calls = 0

    def generate(self, prompts: list[list[int]], params: Any) -> list[GenerationResult]:
        raise NotImplementedError

    def generate_chat(self, messages_batch: list[list[dict[str, str]]], params: Any) -> list[GenerationResult]:
        self.calls += 1
        return [GenerationResult(token_ids=[], text=self.text) for _ in messages_batch]

    def close(self) -> None:
        pass


class _FakeTokenEngine(ChatEngine):
    supports_token_ids = True
    tokenizer = object()


def _suite(**decoding: Any):
    return small_suite(("Bandit", "ragen/Bandit-v0", 4), decoding={"temperature": 0.0, "top_p": 1.0,
                                                                   "max_new_tokens": 8, "seed": 0, **decoding},
                       **NO_THINK)  # fmt: skip


def _success(result: dict[str, Any]) -> float:
    return result["summary"]["envs"]["Bandit"]["success_rate"]


def test_a_vllm_like_server_needs_prepend_and_its_generation_is_recorded():
    suite = _suite()
    # The server's chat template pre-wrote <answer>; the server returns only the model's continuation.
    bare = run_suite(suite, ModelAgent(ChatEngine("Dragon</answer>"), name="served"), progress=False)
    assert _success(bare) == 0.0  # the env cannot parse "Dragon</answer>"
    assert bare["agent"]["generation"]["Bandit"]["generation_prefix"] is None
    fixed = run_suite(suite, ModelAgent(ChatEngine("Dragon</answer>"), name="served", prepend="<answer>"),
                      progress=False)  # fmt: skip
    assert _success(fixed) == 1.0
    assert all(t["reply"] == "<answer>Dragon</answer>" for e in fixed["episodes"] for t in e["turns"])
    assert fixed["agent"]["prepend"] == "<answer>"
    generation = fixed["agent"]["generation"]["Bandit"]
    assert generation == {"generation_prefix": "<answer>", "stop_strings": ["</answer>"], "enable_think": False,
                          "decoding": {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 8, "seed": 0}}
    assert fixed["agent"]["generation_hash"] == generation_hash(fixed["agent"]["generation"])
    assert fixed["agent"]["generation_hash"] != bare["agent"]["generation_hash"]


def test_the_served_template_prefix_must_be_the_suites():
    agent = ModelAgent(ChatEngine("Dragon</answer>"), name="served", template_prefix="<answer>")
    think_suite = small_suite(("Bandit", "ragen/Bandit-v0", 2))  # the reference protocol: thinking on, <think>
    with pytest.raises(ValueError, match=r"pre-writes '<answer>'.*generation prefix '<think>'.*enable_think=false"):
        run_suite(think_suite, agent, progress=False)
    with pytest.raises(ValueError, match=r"prepend is '<answer>'.*'<think>'"):
        run_suite(think_suite, ModelAgent(ChatEngine("x"), name="v", prepend="<answer>"), progress=False)
    # With the matching protocol it plays, and transformers serve returns the prefix itself (no prepend).
    served = run_suite(_suite(), ModelAgent(ChatEngine("<answer>Dragon</answer>"), name="served",
                                            template_prefix="<answer>"), progress=False)  # fmt: skip
    assert _success(served) == 1.0 and served["agent"]["template_prefix"] == "<answer>"
    assert served["agent"]["generation"]["Bandit"]["generation_prefix"] == "<answer>"


def test_prepend_is_refused_where_it_cannot_apply():
    with pytest.raises(ValueError, match="only for a chat engine"):
        ModelAgent(_FakeTokenEngine("x"), name="t", prepend="<answer>")
    with pytest.raises(ValueError, match="non-empty str"):
        ModelAgent(ChatEngine("x"), name="t", prepend="")
    with pytest.raises(ValueError, match="only with engine='openai'"):
        ModelAgent.load("smollm2", engine="hf", prepend="<answer>")


def test_multi_turn_envs_also_record_history_and_context():
    suite = small_suite(("FrozenLake", "ragen/FrozenLake-v0", 1), decoding={"temperature": 0.0, "max_new_tokens": 8})
    result = run_suite(suite, ModelAgent(ChatEngine("<answer>Left</answer>"), name="m"), progress=False)
    generation = result["agent"]["generation"]["FrozenLake"]
    assert generation["history"] == "replies as returned" and generation["max_context_tokens"] is None


def test_a_tampered_generation_hash_is_refused(tmp_path):
    result = run_suite(_suite(), ModelAgent(ChatEngine("<answer>Dragon</answer>"), name="m"), progress=False)
    path = save_result(result, tmp_path / "r.json")
    data = json.loads(path.read_text())
    data["agent"]["generation"]["Bandit"]["generation_prefix"] = "<answer>"  # claims a prefix it did not have
    path.write_text(json.dumps(data))
    with pytest.raises(ResultFileError, match="generation_hash"):
        load_result(path)
    data["agent"].pop("generation_hash")
    path.write_text(json.dumps(data))
    with pytest.raises(ResultFileError, match="come together"):
        load_result(path)


class _OldModel(Agent):
    """A model result as written before the generation hash: kind model, no generation_settings."""

    name = "old"
    kind = "model"

    def reply(self, ctx):
        return "<answer>Dragon</answer>"


def test_leaderboard_separates_generation_settings_and_references_join_every_table():
    suite = _suite()
    with_prefix = run_suite(suite, ModelAgent(ChatEngine("Dragon</answer>"), name="vllm", prepend="<answer>"),
                            progress=False)  # fmt: skip
    also = run_suite(suite, ModelAgent(ChatEngine("<answer>Dragon</answer>"), name="serve",
                                       template_prefix="<answer>"), progress=False)  # fmt: skip
    without = run_suite(suite, ModelAgent(ChatEngine("Dragon</answer>"), name="bare"), progress=False)
    old = run_suite(suite, _OldModel(), progress=False)
    oracle = run_suite(suite, OracleAgent(), progress=False)
    board = build_board([with_prefix, also, without, old, oracle])
    tables = {tuple(sorted(r["label"] for r in g["rows"])) for g in board}
    assert tables == {("oracle", "serve", "vllm"), ("bare", "oracle"), ("old", "oracle")}
    text = markdown_table(board)
    # Escaped for Markdown, where a bare <answer> is an HTML tag that renderers drop: it shows as <answer>.
    assert "prefix '\\<answer\\>'" in text and "no prefix" in text and "generation: not recorded" in text
    assert text.count("### Suite") == 3
    only_references = build_board([oracle])
    assert len(only_references) == 1 and "reference agents only" in markdown_table(only_references)
