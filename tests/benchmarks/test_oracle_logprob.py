"""``benchmarks/oracle_logprob.py`` on the tiny test model: the prompts are the rollout's first prompts, every action's
continuation parses to that action, the oracle and its optimal set are the OracleAgent's / the env's, the batched
cached scorer equals an independent per-token log-softmax sum, the shares are a distribution, and a model biased
toward one action's text prefers it."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import gymnasium as gym
import pytest

torch = pytest.importorskip("torch")

from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import oracle_logprob as ol

from ragen_envs.parsing import parse_reply
from ragen_envs.protocol import find_protocol

FL, SOKOBAN = "ragen/FrozenLake-v0", "ragen/Sokoban-v0"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(tokenizer).eval()


@pytest.fixture(scope="module")
def fl_cases(tokenizer):
    return ol.build_cases(tokenizer, FL, 6)


def _independent_logps(model, prompt, continuation):
    """Per-token log p by hand: the whole sequence, no cache, no batch, log-softmax at each position."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + continuation])).logits[0].double()
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(continuation)]


def test_prompts_are_the_rollouts_first_prompts(tiny_model_dir, fl_cases):
    import bench_engines

    from ragen_trainer.config import load_config
    from ragen_trainer.engines import SamplingParams
    from ragen_trainer.engines.hf import HFEngine
    from ragen_trainer.models import load_model_and_tokenizer
    from ragen_trainer.rollout import collect_rollouts

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir, dtype="float32", device="cpu")
    cases, settings = ol.build_cases(tokenizer, FL, 3)
    assert settings["generation_prefix"] == "<think>" and settings["actions"] == ["Left", "Down", "Right", "Up"]
    seeds, prompts = bench_engines.first_turn_prompts(tokenizer, FL, 3)
    assert seeds == [0, 1, 2] and [c.prompt_ids for c in cases] == prompts
    batch = collect_rollouts(HFEngine(model, tokenizer, batch_size=3), tokenizer, FL, [0, 1, 2], 1,
                             settings=load_config().replace(reply_tokens="sampled").rollout_settings(),
                             sampling=SamplingParams(max_new_tokens=2, seed=0))  # fmt: skip
    for traj, case in zip(batch.trajectories, cases):
        assert traj.input_ids[: len(case.prompt_ids)] == case.prompt_ids
    prefix_ids = tokenizer("<think>", add_special_tokens=False)["input_ids"]
    assert all(c.prompt_ids[-len(prefix_ids) :] == prefix_ids for c in cases)


@pytest.mark.parametrize("env_id", [FL, SOKOBAN])
@pytest.mark.parametrize("think", ["empty", "oracle", "state"])
def test_every_continuation_parses_to_its_action(tokenizer, env_id, think):
    import gymnasium as gym

    cases, settings = ol.build_cases(tokenizer, env_id, 3, think)
    env = gym.make(env_id)
    protocol = find_protocol(env).settings
    env.close()
    prefix = settings["generation_prefix"]
    for case in cases:
        assert sorted(case.continuations) == sorted(case.actions) == sorted(settings["actions"])
        for action, ids in case.continuations.items():
            text = tokenizer.decode(ids)
            assert not text.startswith(prefix)  # the prefix is in the prompt, not doubled
            parsed = parse_reply(prefix + text, enable_think=protocol.enable_think, separator=protocol.action_sep)
            assert parsed.format_ok and parsed.actions == [action], (action, text)
            assert prefix + text == case.replies[action]
            k = case.first_action_tokens[action]
            assert k is not None and tokenizer.decode(ids[:k]).endswith("<answer>" + action)
            if think == "empty":
                assert text == f"</think><answer>{action}</answer>"
            else:
                assert case.think and text.startswith(case.think)


@pytest.mark.parametrize("env_id", [FL, SOKOBAN])
def test_the_oracle_action_is_the_oracle_agents_and_optimal(tokenizer, env_id):
    import gymnasium as gym

    from ragen_envs.sokoban.solver import solve_level
    from ragen_trainer.evaluation.agents import OracleAgent

    cases, _ = ol.build_cases(tokenizer, env_id, 6)
    env = gym.make(env_id)
    protocol = find_protocol(env)
    try:
        for case in cases:
            ctx = ol.first_turn_context(env, env_id, case.seed)
            reply = OracleAgent().reply(ctx).text
            first = parse_reply(reply, separator=protocol.action_sep).actions[0]
            assert case.oracle_action == first and first in case.optimal
            if env_id == FL:  # the optimal set is every action whose value ties the best one
                best = max(case.action_values)
                assert case.optimal == [a for a, q in zip(case.actions, case.action_values) if abs(q - best) < 1e-9]
                continue
            moves = solve_level(env.unwrapped.snapshot()).moves
            for action in case.actions:  # play the action in the real env, solve from where it leads
                ol.first_turn_context(env, env_id, case.seed)
                before = env.unwrapped.snapshot().player
                env.step(protocol.format_reply([action]))
                after = env.unwrapped.snapshot()
                solution = solve_level(after) if after.player != before else None
                optimal = solution is not None and solution.moves == moves - 1
                assert (action in case.optimal) == optimal, (case.seed, action)
    finally:
        env.close()


def test_batched_scores_equal_the_independent_log_softmax_sums(model, fl_cases):
    cases, _ = fl_cases
    scores = ol.score_cases(model, cases, batch_states=4)  # two batches: 4 + 2 states
    for case, score in zip(cases, scores):
        for action in case.actions:
            ref = _independent_logps(model, case.prompt_ids, case.continuations[action])
            assert len(score[action]) == len(ref)
            assert score[action] == pytest.approx(ref, abs=1e-4)
            assert ol.sequence_logprobs_full(model, case.prompt_ids, case.continuations[action]) == pytest.approx(
                ref, abs=1e-4
            )
    # batching does not change the numbers
    one = ol.score_cases(model, cases, batch_states=1)
    for a, b in zip(one, scores):
        for action in a:
            assert a[action] == pytest.approx(b[action], abs=1e-4)


def test_shares_are_a_distribution_and_the_metrics_follow(model, fl_cases):
    cases, _ = fl_cases
    rows = [ol.state_metrics(c, s) for c, s in zip(cases, ol.score_cases(model, cases))]
    for case, row in zip(cases, rows):
        assert sum(row["share"].values()) == pytest.approx(1.0, abs=1e-9)
        assert row["share_optimal"] == pytest.approx(sum(row["share"][a] for a in case.optimal))
        assert row["logp_oracle"] == max(row["logp"][a] for a in case.optimal)
        assert row["top1_optimal"] == float(max(row["logp"], key=row["logp"].get) in case.optimal)
        assert row["uniform_share"] == len(case.optimal) / 4
        assert row["format_mass"] == pytest.approx(sum(math.exp(v) for v in row["logp"].values()))
        assert 0 < row["share_optimal_first"] <= 1
    summary = ol.summarize(rows)
    assert summary["states"] == 6 and summary["share_optimal"] == pytest.approx(
        sum(r["share_optimal"] for r in rows) / 6
    )
    assert summary["uniform_pick_share"] == 0.25


def test_state_metrics_on_known_logprobs():
    case = ol.StateCase(seed=0, prompt_ids=[1], actions=["Left", "Down", "Right", "Up"], replies={},
                        continuations={}, first_action_tokens=dict.fromkeys(["Left", "Down", "Right", "Up"], 1),
                        oracle_action="Down", optimal=["Down", "Up"], action_values=[0, 1, 0, 1],
                        joint_tokenization=True)  # fmt: skip
    logps = {"Left": [-1.0, math.log(0.1)], "Down": [-1.0, math.log(0.2)], "Right": [-1.0, math.log(0.3)],
             "Up": [-1.0, math.log(0.4)]}  # fmt: skip
    row = ol.state_metrics(case, logps)
    assert row["share"]["Up"] == pytest.approx(0.4) and row["share_optimal"] == pytest.approx(0.6)
    assert row["share_oracle_pick"] == pytest.approx(0.2) and row["top1_optimal"] == 1.0
    assert row["logp_oracle"] == pytest.approx(-1.0 + math.log(0.4)) and row["uniform_share"] == 0.5
    assert row["share_optimal_first"] == pytest.approx(0.5)  # first tokens equal: indifferent


def test_a_model_biased_toward_one_action_text_prefers_it(model, fl_cases):
    cases, _ = fl_cases
    # Where the actions' continuations first differ (token k), Right's token gets +30 on the logits after every
    # occurrence of the token before it: the common positions shift alike for every action, so only Right gains.
    ids = cases[0].continuations
    k = next(i for i in range(min(map(len, ids.values()))) if len({tuple(v[: i + 1]) for v in ids.values()}) == 4)
    token, before = ids["Right"][k], ids["Right"][k - 1]
    assert k > 0 and all(v[k] != token and v[k - 1] == before for v in ids.values() if v is not ids["Right"])

    def bias(module, args, kwargs, output):
        after = (kwargs["input_ids"] == before).to(output.logits.dtype)  # (B, T)
        output.logits[..., token] += 30.0 * after
        return output

    handle = model.register_forward_hook(bias, with_kwargs=True)
    try:
        rows = [ol.state_metrics(c, s) for c, s in zip(cases, ol.score_cases(model, cases))]
    finally:
        handle.remove()
    for case, row in zip(cases, rows):
        assert row["share"]["Right"] > 0.99 and row["preferred"] == "Right"
        assert row["top1_optimal"] == float("Right" in case.optimal)
        assert row["share_optimal"] == pytest.approx(float("Right" in case.optimal), abs=0.01)


def test_own_thinking_checks_the_claims_and_the_first_move_a_model_writes(tokenizer, model, monkeypatch):
    from types import SimpleNamespace
    from typing import ClassVar

    cases, settings = ol.build_cases(tokenizer, FL, 8, "state")
    prefix = settings["generation_prefix"]

    class Writes:  # stands in for the engine: writes a given reply per prompt
        replies: ClassVar[list[str]] = []

        def __init__(self, *args, **kwargs):
            pass

        def generate(self, prompts, params):
            assert params.temperature == 0 and "</answer>" in params.stop
            return [SimpleNamespace(text=r[len(prefix):]) for r in self.replies]

    monkeypatch.setattr(ol, "HFEngine", Writes)
    # The true state in words, then an optimal move: every claim supported, every first move optimal.
    Writes.replies = [c.replies[c.optimal[0]] for c in cases]
    right = ol.own_thinking(model, tokenizer, FL, cases, 64)
    assert right["format_ok"] == right["all_claims_true"] == right["first_action_optimal"] == 1.0
    assert right["contradicted_per_state"] == 0 and right["supported_per_state"] >= 2
    # Every claim swapped for another state's and a non-optimal move: contradicted claims, no optimal move.
    wrong = []
    for i, c in enumerate(cases):
        other = next(o for o in cases[i + 1:] + cases[:i] if o.think != c.think)
        bad = next((a for a in c.actions if a not in c.optimal), None)
        wrong.append(other.replies[other.actions[0]].replace(other.actions[0], bad or c.optimal[0]))
    Writes.replies = wrong
    out = ol.own_thinking(model, tokenizer, FL, cases, 64)
    assert out["contradicted_per_state"] > 0 and out["all_claims_true"] < 1.0
    assert out["first_action_optimal"] <= sum(all(a in c.optimal for a in c.actions) for c in cases) / len(cases)
    Writes.replies = ["no tags at all"] * len(cases)
    assert ol.own_thinking(model, tokenizer, FL, cases, 64)["format_ok"] == 0.0


def test_cli_two_models_json_and_markdown(tmp_path, tiny_model_dir, capsys):
    out_json, out_md = tmp_path / "o.json", tmp_path / "o.md"
    argv = [tiny_model_dir, tiny_model_dir, "--labels", "a", "b", "--states", "3", "--json", str(out_json),
            "--md", str(out_md), "--threads", "1", "--no-progress", "--own-thinking", "4"]  # fmt: skip
    assert ol.main(argv) == 0
    result = json.loads(out_json.read_text(encoding="utf-8"))
    a, b = result["models"]
    assert (a["label"], b["label"]) == ("a", "b") and a["summary"] == b["summary"]  # deterministic
    assert len(a["states"]) == 3 and a["env"]["env"] == FL
    assert a["continuation_text"]["Left"] == "</think><answer>Left</answer>"
    md, out = out_md.read_text(encoding="utf-8"), capsys.readouterr().out
    for text in (md, out):
        assert "share(optimal)" in text and "uniform policy" in text and "most preferred" in text
    assert "| a | 3 |" in md and "| b | 3 |" in md
    assert "What each model writes itself" in md and a["own_thinking"]["states"] == 3


def test_cli_env_kwargs_reach_the_prompts_and_bad_ones_are_refused(tmp_path, tiny_model_dir, tokenizer, capsys):
    out_json = tmp_path / "o.json"
    argv = [tiny_model_dir, "--states", "2", "--json", str(out_json), "--threads", "1", "--no-progress",
            "--own-thinking", "2", "--env-kwargs", '{cell_separator: " "}']  # fmt: skip
    assert ol.main(argv) == 0
    result = json.loads(out_json.read_text(encoding="utf-8"))
    assert result["settings"]["env_kwargs"] == {"cell_separator": " "}
    spaced = gym.make(FL, cell_separator=" ")
    spaced.reset(seed=0)
    (plain,), _ = ol.build_cases(tokenizer, FL, 1)
    (wide,), _ = ol.build_cases(tokenizer, FL, 1, env_kwargs={"cell_separator": " "})
    assert spaced.unwrapped.state_text() in tokenizer.decode(wide.prompt_ids)  # the spaced grid is in the prompt
    assert spaced.unwrapped.state_text() not in tokenizer.decode(plain.prompt_ids)
    assert result["models"][0]["prompt_tokens"] == [len(wide.prompt_ids), result["models"][0]["prompt_tokens"][1]]
    stamp = out_json.stat().st_mtime_ns
    assert ol.main(argv + ["--resume"]) == 0 and out_json.stat().st_mtime_ns == stamp  # has run: skipped
    with pytest.raises(SystemExit):
        ol.main([tiny_model_dir, "--resume"])  # nothing to tell whether it ran
    for bad in ("{cell_separator: '|'}", "[1, 2]", "{nope: 1}"):
        with pytest.raises(SystemExit):
            ol.main([tiny_model_dir, "--states", "1", "--env-kwargs", bad])
        assert "--env-kwargs" in capsys.readouterr().err
