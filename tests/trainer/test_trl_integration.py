"""ragen_trainer.trl_integration: TRL's GRPOTrainer on ragen envs.

Dataset rows are ragen's first prompts (messages and token ids); the reward functions give the env's rewards (the
driver's group randomness included); the rollout_func plays ragen's episodes and its env_mask is 0 exactly on the env's
messages; the StarPO-S filter keeps the right groups and masks the others out of TRL's loss; the environment_factory
adapter plays episodes as ragen's driver does, alone and inside TRL's tool loop; and the FrozenLake example trains
TRL's GRPOTrainer for two steps. Every model here is the tiny random Llama of conftest.py (CPU, seconds).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import os
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

import gymnasium as gym

from ragen_envs.driver import AgentReply, play_episodes, rollout_jobs
from ragen_envs.protocol import find_protocol
from ragen_trainer import trl_integration as ti
from ragen_trainer.engines import SamplingParams
from ragen_trainer.filtering import filter_groups
from ragen_trainer.rollout import collect_rollouts
from tests.trainer.conftest import latest_rollout

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ROOT = Path(__file__).resolve().parents[2]
FROZEN = "ragen/FrozenLake-v0"
BANDIT = "ragen/Bandit-v0"
#: Scripted FrozenLake replies: the text the model writes after the generation prefix "<think>".
REPLIES = ["left first</think><answer>Left</answer>", "then down</think><answer>Down || Right</answer>",
           "up</think><answer>Up</answer>"]  # fmt: skip
#: TRL's way of training (the sampled ids with their log-probs, only the replies trained), as these tests play it.
SAMPLED = latest_rollout(reply_tokens="sampled")


def _grpo_config(tmp_path: Path, **changes: Any) -> Any:
    from trl import GRPOConfig

    settings: dict[str, Any] = {
        "output_dir": str(tmp_path / "trl"), "max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 4,
        "max_completion_length": 8, "use_cpu": True, "bf16": False, "fp16": False, **ti.checkpointing_arg(False),
        "report_to": [], "logging_steps": 1, "save_strategy": "no", "disable_tqdm": True, "shuffle_dataset": False,
    }  # fmt: skip
    settings.update(changes)
    return GRPOConfig(**settings)


class _ScriptedAgent:
    """A turn-synchronous driver agent that replies ``replies[(group, rollout)][turn]`` and ends the episode (without
    a step) when its script is over."""

    def __init__(self, replies: dict[tuple[int, int], list[str]]) -> None:
        self.replies = replies

    def reply_batch(self, episodes: list[Any]) -> list[AgentReply]:
        out = []
        for e in episodes:
            script = self.replies[(e.group_id, e.rollout)]
            out.append(AgentReply(script[len(e.turns)]) if len(e.turns) < len(script) else AgentReply("", stop="end"))
        return out


def _runs(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """``ids`` cut into runs of equal mask value: ``[(mask, ids), ...]``."""
    runs: list[tuple[int, list[int]]] = []
    for token, m in zip(ids, mask):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(token)
        else:
            runs.append((m, [token]))
    return runs


# ---------------------------------------------------------------------------------------------------------- data
def test_dataset_rows_are_ragens_first_prompts(tiny_tokenizer, scripted_engine):
    seeds = [0, 3, 3, 11]
    ds = ti.initial_state_dataset(FROZEN, seeds)
    assert ds.column_names == ["prompt", *ti.SPEC_COLUMNS]
    assert ds["seed"] == seeds and set(ds["env_id"]) == {FROZEN} and set(ds["group_randomness"]) == {"shared"}
    settings = find_protocol(gym.make(FROZEN)).settings
    assert json.loads(ds[0]["protocol"]) == settings.to_dict() and ds[0]["env_kwargs"] == "{}"

    # ragen's own rollouts (episode driver + TokenAgent) from the same seeds: the same first chat, the same ids.
    ragen = collect_rollouts(scripted_engine(tiny_tokenizer, REPLIES[:1]), tiny_tokenizer, FROZEN, seeds, 1,
                             settings=SAMPLED, sampling=SamplingParams(max_new_tokens=16))  # fmt: skip
    for row, traj in zip(ds, ragen.trajectories):
        n = len(row["prompt"])
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert row["prompt"] == traj.messages[:n] and traj.messages[n]["role"] == "assistant"
        text, ids = ti.render_prompt(row["prompt"], tiny_tokenizer, settings.generation_prefix)
        assert ids == traj.input_ids[: traj.turn_spans[0][0]]  # the prompt ragen generated from, token for token
        assert text.endswith("<|im_start|>assistant\n<think>")
    assert ds[1]["prompt"] == ds[2]["prompt"] != ds[0]["prompt"]


def test_dataset_settings_round_trip_and_bad_input(tiny_tokenizer):
    ds = ti.initial_state_dataset(FROZEN, [1], env_kwargs={"max_turns": 2}, protocol={"enable_think": False})
    spec = ti.EpisodeSpec.from_row(ds[0])
    assert (spec.settings.max_turns, spec.settings.enable_think, spec.settings.generation_prefix) == (
        2,
        False,
        "<answer>",
    )
    observation, info = spec.make_env().reset(seed=1)
    assert ds[0]["prompt"] == ti.first_messages(observation, info)

    text = ti.initial_state_dataset(FROZEN, [1], tokenizer=tiny_tokenizer)[0]
    plain = ti.initial_state_dataset(FROZEN, [1])[0]
    assert text["messages"] == plain["prompt"]
    assert text["prompt"] == ti.render_prompt(plain["prompt"], tiny_tokenizer, "<think>")[0]
    assert ti.protocol_stop_strings(ti.initial_state_dataset(BANDIT, [0])) == ["</answer>"]

    with pytest.raises(ValueError, match="registered"):
        ti.initial_state_dataset("ragen/Nope-v0", [0])
    with pytest.raises(ValueError, match="seeds"):
        ti.initial_state_dataset(FROZEN, [])
    with pytest.raises(ValueError, match="given twice"):
        ti.initial_state_dataset(FROZEN, [0], env_kwargs={"max_turns": 2}, protocol={"max_turns": 3})
    with pytest.raises(ValueError, match="group_randomness"):
        ti.initial_state_dataset(FROZEN, [0], group_randomness="own")
    with pytest.raises(ValueError, match="missing column"):
        ti.EpisodeSpec.from_row({"prompt": [], "seed": 0})
    with pytest.raises(ValueError, match="not JSON"):
        ti.EpisodeSpec(FROZEN, 0, "{oops")


# ---------------------------------------------------------------------------------------------------------- rewards
def test_reward_functions_give_the_envs_rewards(tiny_tokenizer):
    # Bandit pays the risky arm by chance: with independent group randomness rollout r of a group sees its own draw
    # (seed 3: 1, 0, 0; seed 4: 0, 1, 0), so the replay must number the rollouts as ragen's driver does.
    seeds, group = [3, 4], 3
    ds = ti.initial_state_dataset(BANDIT, [s for s in seeds for _ in range(group)], group_randomness="independent")
    texts = ["ok</think><answer>Dragon</answer>"] * 5 + ["no tags at all"]
    replies = {(g, r): ["<think>" + texts[g * group + r]] for g in range(2) for r in range(group)}
    episodes = play_episodes(BANDIT, rollout_jobs(seeds, group, group_randomness="independent"),
                             _ScriptedAgent(replies), env_kwargs=ti.EpisodeSpec.from_row(ds[0]).make_kwargs())  # fmt: skip
    expected = [e.reward for e in episodes]
    assert expected == [1.0, 0.0, 0.0, 0.0, 1.0, -0.1]

    columns = {c: ds[c] for c in ti.SPEC_COLUMNS}
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    kwargs = dict(columns, ragen_prefix=["<think>"] * 6)
    assert ti.env_reward(ds["prompt"], completions, **kwargs) == expected
    assert ti.env_success(ds["prompt"], completions, **kwargs) == [float(e.success) for e in episodes]
    assert ti.env_format(ds["prompt"], completions, **kwargs) == [1.0] * 5 + [0.0]
    # Text prompts that end with the prefix (initial_state_dataset(tokenizer=...), a plain GRPOTrainer) score the same.
    text_ds = ti.initial_state_dataset(BANDIT, [s for s in seeds for _ in range(group)], tokenizer=tiny_tokenizer,
                                       group_randomness="independent")  # fmt: skip
    assert ti.env_reward(text_ds["prompt"], texts, **columns) == expected
    # Conversational prompts that no trainer prefixed: scored without the prefix, with a warning.
    ti._WARNED.clear()
    with pytest.warns(UserWarning, match="generation prefix"):
        assert ti.env_reward(ds["prompt"][:1], completions[:1], **{c: v[:1] for c, v in columns.items()}) == [-0.1]
    # Results of a rollout_func take precedence over a replay.
    assert ti.env_reward(["p"], ["c"], ragen_return=[0.7], ragen_success=[1.0], ragen_format=[0.5]) == [0.7]
    with pytest.raises(ValueError, match="missing"):
        ti.env_reward(["p"], ["c"], seed=[0])


# ---------------------------------------------------------------------------------------------------------- rollout
def test_rollout_func_plays_ragens_episodes_with_env_mask(tiny_tokenizer, scripted_engine):
    seeds, group = [1, 2], 2
    ds = ti.initial_state_dataset(FROZEN, seeds)
    specs = [ti.EpisodeSpec.from_row(row) for row in ds for _ in range(group)]
    prompts = [row["prompt"] for row in ds for _ in range(group)]
    sampling = SamplingParams(max_new_tokens=32, seed=0)
    out = ti.RagenRollout(SAMPLED).rollout(specs, scripted_engine(tiny_tokenizer, REPLIES), tiny_tokenizer, sampling,
                                    prompts)  # fmt: skip
    ragen = collect_rollouts(scripted_engine(tiny_tokenizer, REPLIES), tiny_tokenizer, FROZEN, seeds, group,
                             env_kwargs=specs[0].make_kwargs(), sampling=sampling, settings=SAMPLED)  # fmt: skip

    assert {"prompt_ids", "completion_ids", "logprobs", "env_mask", ti.RETURN_FIELD, ti.SUCCESS_FIELD,
            ti.FORMAT_FIELD, ti.TURNS_FIELD} == set(out)  # fmt: skip
    assert all(len(out[k]) == len(specs) for k in out)
    for i, traj in enumerate(ragen.trajectories):
        p, c, m = out["prompt_ids"][i], out["completion_ids"][i], out["env_mask"][i]
        assert p + c == traj.input_ids and len(m) == len(c) == len(out["logprobs"][i])
        assert m == traj.loss_mask[len(p) :] and m[0] == 1 and m[-1] == 1  # starts and ends with a reply
        assert p == ti.render_prompt(prompts[i], tiny_tokenizer, "<think>")[1]
        assert out[ti.RETURN_FIELD][i] == traj.reward and out[ti.TURNS_FIELD][i] == traj.num_turns == 5
        # env_mask is 1 exactly on the replies (the model's own end-of-turn token included) and 0 exactly on the
        # env's messages: each observation with the template's markers and the next generation prefix.
        runs = _runs(c, m)
        decode = lambda ids: tiny_tokenizer.decode(ids, skip_special_tokens=False)
        played = [REPLIES[min(t, len(REPLIES) - 1)] for t in range(traj.num_turns)]
        assert [decode(ids) for mask, ids in runs if mask == 1] == [r + "<|im_end|>" for r in played]
        observations = [msg["content"] for msg in traj.messages[3::2]][: traj.num_turns - 1]
        assert [decode(ids) for mask, ids in runs if mask == 0] == [
            f"\n<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n<think>" for obs in observations
        ]
        assert all(lp == 0.0 for lp, mask in zip(out["logprobs"][i], m) if mask == 0)

    # As TRL calls it: with a plain GRPOTrainer the prompts are looked up in the trainer's dataset.
    trainer = SimpleNamespace(
        processing_class=tiny_tokenizer, model=None, train_dataset=ds, eval_dataset=None, use_vllm=False,
        accelerator=SimpleNamespace(unwrap_model=lambda model: model, process_index=0), args=SimpleNamespace(seed=0),
        state=SimpleNamespace(global_step=0), temperature=1.0, top_p=1.0, top_k=0, max_completion_length=32,
    )  # fmt: skip
    rollout = ti.RagenRollout(SAMPLED, engine=scripted_engine(tiny_tokenizer, REPLIES))
    called = rollout(prompts, trainer)
    assert called["completion_ids"] == out["completion_ids"] and called["env_mask"] == out["env_mask"]
    with pytest.raises(ValueError, match="none of the trainer's datasets"):
        rollout([[{"role": "user", "content": "not a ragen prompt"}]], trainer)
    # RagenGRPOTrainer hands over the rows; a row whose prompt is not its env's first chat is refused.
    trainer.current_inputs = [dict(ds[0], prompt=ds[1]["prompt"])]
    with pytest.raises(ValueError, match="not the first chat"):
        rollout([ds[1]["prompt"]], trainer)
    trainer.use_vllm, trainer.current_inputs = True, None
    with pytest.raises(ValueError, match="use_vllm"):
        ti.RagenRollout(SAMPLED)(prompts, trainer)


def test_rollout_func_inside_grpo_trainer_trains_on_reply_tokens(tiny_model, tiny_tokenizer, scripted_engine, tmp_path):
    """A real GRPOTrainer step through RagenRollout: one rollout of the group answers well, the other writes garbage,
    so the advantages differ and the update moves the weights; TRL's loss counts exactly the env_mask = 1 tokens."""
    good = "go</think><answer>Left</answer>"

    def script(prompt: str, call: int, row: int) -> str:
        if "garbage" in prompt:
            return "garbage"
        return good if good in prompt or row % 2 == 0 else "garbage"

    class Capturing(ti.RagenRollout):
        def rollout(self, *args, **kwargs):
            self.out = super().rollout(*args, **kwargs)
            return self.out

    rollout = Capturing(SAMPLED, engine=scripted_engine(tiny_tokenizer, script))
    trainer = ti.RagenGRPOTrainer(
        model=tiny_model, reward_funcs=[ti.env_reward, ti.env_format], processing_class=tiny_tokenizer,
        args=_grpo_config(tmp_path, per_device_train_batch_size=2, max_completion_length=64, reward_weights=[1.0, 0.0]),
        train_dataset=ti.initial_state_dataset(FROZEN, [1]), rollout_func=rollout,
    )  # fmt: skip
    before = [p.detach().clone() for p in tiny_model.parameters()]
    trainer.train()
    log = trainer.state.log_history[0]
    assert sorted(rollout.out[ti.FORMAT_FIELD]) == [0.0, 1.0] and log["rewards/env_format/mean"] == 0.5
    assert log["reward"] == pytest.approx(sum(rollout.out[ti.RETURN_FIELD]) / 2) and log["reward_std"] > 0
    assert log["completions/mean_length"] == pytest.approx(sum(map(sum, rollout.out["env_mask"])) / 2)
    assert log["grad_norm"] > 0 and math.isfinite(log["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, tiny_model.parameters()))


# ---------------------------------------------------------------------------------------------------------- filter
def test_variance_filter_keeps_the_highest_std_groups():
    rewards = [0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 2.0]  # group stds: 0, 0.71, 0, 1.41
    keep, result = ti.variance_filter(rewards, 2, filter_ratio=0.5)
    assert result.kept == [3, 1] and keep == [False, False, True, True, False, False, True, True]
    groups = {g: rewards[2 * g : 2 * g + 2] for g in range(4)}
    assert result.kept == filter_groups(groups, 0.5).kept  # ragen's own decision
    assert ti.variance_filter(rewards, 2, filter_ratio=0.3)[1].kept == [3]  # floor: int(0.3 * 4) = 1
    assert ti.variance_filter(rewards, 2, filter_ratio=0.3, filter_round="ceil")[1].kept == [3, 1]
    assert ti.variance_filter(rewards, 2, filter_ratio=0.5, filter_mode="std_rev")[1].kept == [0, 2]  # ties: by id
    assert ti.variance_filter([math.nan, 1.0, 0.0, 5.0], 2, filter_ratio=0.5)[1].kept == [1]  # NaN: left out
    with pytest.raises(ValueError, match="multiple of num_generations"):
        ti.variance_filter([1.0, 2.0, 3.0], 2, filter_ratio=0.5)
    with pytest.raises(ValueError, match="keep_ratio"):
        ti.variance_filter(rewards, 2, filter_ratio=0.0)


def test_trainer_filter_masks_dropped_groups_out_of_the_loss():
    # Two groups of two rows. Weighted rewards (the second function has weight 0): group 0 = [0, 0] (std 0),
    # group 1 = [1, 0] (std 0.71): keep ratio 0.5 keeps group 1. Unweighted, group 0 ([0, 5]) would win.
    trainer = SimpleNamespace(
        _step_rewards=torch.tensor([[0.0, 0.0], [0.0, 5.0], [1.0, 0.0], [0.0, 0.0]]),
        reward_weights=torch.tensor([1.0, 0.0]), num_generations=2, filter_ratio=0.5, filter_mode="std",
        filter_round="floor", accelerator=SimpleNamespace(process_index=0, gather=lambda t: t),
        _metrics={"train": defaultdict(list)}, last_filter=None,
    )  # fmt: skip
    output = {"completion_mask": torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]]),
              "num_items_in_batch": torch.tensor(9)}  # fmt: skip
    ti.RagenGRPOTrainer._filter(trainer, output)
    assert output["tool_mask"].tolist() == [[0, 0, 0], [0, 0, 0], [1, 1, 1], [1, 1, 1]]
    assert int(output["num_items_in_batch"]) == 4  # recounted: the kept rows' completion tokens
    assert trainer.last_filter.kept == [1] and trainer._metrics["train"]["filter/kept_groups"] == [1.0]
    # An env_mask / tool_mask already there (multi-turn) is kept on the kept rows.
    output = {"completion_mask": torch.ones(4, 3, dtype=torch.long),
              "tool_mask": torch.tensor([[1, 0, 1]] * 4), "num_items_in_batch": torch.tensor(8)}  # fmt: skip
    ti.RagenGRPOTrainer._filter(trainer, output)
    assert output["tool_mask"].tolist() == [[0, 0, 0], [0, 0, 0], [1, 0, 1], [1, 0, 1]]
    assert int(output["num_items_in_batch"]) == 4


def test_trainer_one_turn_applies_ragens_prefix_and_env_rewards(tiny_model, tiny_tokenizer, tmp_path):
    ds = ti.initial_state_dataset(BANDIT, [0, 1])
    seen: dict[str, Any] = {}

    class Recording(ti.RagenGRPOTrainer):
        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            seen["prompt_ids"] = [list(p) for p in prompt_ids]
            return super()._generate_single_turn(prompt_ids, *args, **kwargs)

    def recorded_reward(prompts, completions, **kwargs):
        rewards = ti.env_reward(prompts, completions, **kwargs)
        seen.update(completions=completions, kwargs=kwargs, rewards=rewards)
        return rewards

    trainer = Recording(model=tiny_model, reward_funcs=[recorded_reward], args=_grpo_config(tmp_path),
                        train_dataset=ds, processing_class=tiny_tokenizer, filter_ratio=0.5)  # fmt: skip
    trainer.train()
    # The prompts TRL generated from are ragen's, generation prefix included, token for token.
    assert seen["prompt_ids"] == [ti.render_prompt(row["prompt"], tiny_tokenizer, "<think>")[1]
                                  for row in ds for _ in range(2)]  # fmt: skip
    assert seen["kwargs"][ti.PREFIX_FIELD] == ["<think>"] * 4
    # Each reward is the env's for prefix + completion, from a fresh reset with the row's seed.
    env = gym.make(BANDIT)
    expected = []
    for seed, completion in zip(seen["kwargs"]["seed"], seen["completions"]):
        env.reset(seed=seed)
        expected.append(env.step("<think>" + completion[0]["content"])[1])
    assert seen["rewards"] == expected
    assert trainer.last_filter is not None and len(trainer.last_filter.kept) == 1


# ---------------------------------------------------------------------------------------------------------- tools
def test_tool_env_plays_an_episode_as_ragens_driver():
    ds = ti.initial_state_dataset(FROZEN, [1])
    env = ti.ragen_environment_factory()()
    assert env.reset(**ds[0]) == ti.RagenToolEnv.TOOL_HINT  # the prompt already holds the observation
    actions = ["Left", "Down || Right", "<think>I go up</think><answer>Up</answer>", "Right", "Down", "Left"]
    observations = []
    while not env.done:
        observations.append(env.take_action(actions[env.turns]))
    replies = [a if "<answer>" in a else f"<think></think><answer>{a}</answer>" for a in actions]
    (episode,) = play_episodes(FROZEN, rollout_jobs([1]), _ScriptedAgent({(0, 0): replies}),
                               env_kwargs=ti.EpisodeSpec.from_row(ds[0]).make_kwargs())  # fmt: skip
    assert observations == [t.observation for t in episode.turns] and len(observations) == 5
    assert (env.get_reward(), env.success, env.turns, env.format_rate) == (episode.reward, episode.success, 5, 1.0)
    with pytest.raises(ValueError, match="has ended"):
        env.take_action("Left")
    # Without the observation in the prompt, reset returns it (then the hint).
    assert env.reset(**dict(ds[0], prompt=[])) == ds[0]["prompt"][-1]["content"] + ti.RagenToolEnv.TOOL_HINT
    # TRL exposes the public functions other than reset / get_reward as tools: exactly take_action, with a schema.
    tools = [name for name, _ in inspect.getmembers(ti.RagenToolEnv, predicate=inspect.isfunction)
             if not name.startswith("_") and name not in ("reset", "get_reward")]  # fmt: skip
    assert tools == ["take_action"]
    from transformers.utils import get_json_schema

    assert get_json_schema(env.take_action)["function"]["parameters"]["required"] == ["action"]
    with pytest.raises(ValueError, match="initial_state_dataset"):
        env.reset(prompt=[])
    with pytest.raises(ValueError, match="group_randomness"):
        env.reset(**ti.initial_state_dataset(FROZEN, [1], group_randomness="independent")[0])


def test_tool_env_inside_trls_tool_loop(tiny_tokenizer, tmp_path):
    """TRL's environment_factory loop with RagenToolEnv; the (random) model's tool calls are scripted."""
    from trl.chat_template_utils import qwen2_5_chat_template

    from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = qwen2_5_chat_template  # a tool-calling template TRL can parse
    calls = [
        '<tool_call>\n{"name": "take_action", "arguments": {"action": "Left"}}\n</tool_call>',
        '<tool_call>\n{"name": "take_action", "arguments": {"action": "Down || Right"}}\n</tool_call>',
        "done",
    ]

    class Scripted(ti.RagenGRPOTrainer):
        turn = 0

        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            ids = tokenizer(calls[min(self.turn, 2)], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            self.turn += 1
            return [list(ids) for _ in prompt_ids], None

    seeds = [0, 1]
    ds = ti.initial_state_dataset(FROZEN, seeds)
    trainer = Scripted(model=build_tiny_model(tokenizer), reward_funcs=[ti.env_success], train_dataset=ds,
                       args=_grpo_config(tmp_path, max_completion_length=2048), processing_class=tokenizer,
                       environment_factory=ti.RagenToolEnv)  # fmt: skip
    assert trainer.reward_func_names == ["env_success", "RagenToolEnv"]
    trainer.train()
    replies = ["<think></think><answer>Left</answer>", "<think></think><answer>Down || Right</answer>"]
    episodes = play_episodes(FROZEN, rollout_jobs(seeds, 2), _ScriptedAgent(defaultdict(lambda: replies)),
                             env_kwargs=ti.EpisodeSpec.from_row(ds[0]).make_kwargs())  # fmt: skip
    played = [(e.turns, e.get_reward(), e.success) for e in trainer.environments]
    assert played == [(len(e.turns), e.reward, e.success) for e in episodes]
    log = trainer.state.log_history[0]
    assert log["rewards/RagenToolEnv/mean"] == pytest.approx(sum(e.reward for e in episodes) / len(episodes))
    assert log["tools/call_frequency"] > 0


# ---------------------------------------------------------------------------------------------------------- example
def test_example_trains_trls_grpo_trainer_two_steps_on_frozenlake(tiny_model_dir, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("trl_grpo_frozenlake", ROOT / "examples" / "trl_grpo_frozenlake.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    argv = ["--model", str(tiny_model_dir), "--max-steps", "2", "--groups", "2", "--group-size", "2",
            "--max-new-tokens", "8", "--device", "cpu", "--output-dir", str(tmp_path / "out")]  # fmt: skip
    started = time.perf_counter()
    summary = example.train(example.build_parser().parse_args(argv))
    seconds = time.perf_counter() - started
    assert summary["steps"] == 2 and len(summary["losses"]) == 2
    assert all(math.isfinite(x) for x in summary["losses"]) and math.isfinite(summary["train_loss"])
    assert summary["kept_groups"] == [1.0, 1.0]  # filter 0.5 of 2 groups
    # TRL counts env_mask = 1 tokens only: at most 5 turns x 8 new tokens, not the observations in between.
    assert all(0 < n <= 5 * 8 for n in summary["model_tokens"])
    assert all(math.isfinite(r) for r in summary["rewards"])
    out = capsys.readouterr().out
    assert "=== TRL GRPOTrainer on ragen/FrozenLake-v0" in out and "loss per step" in out
    print(f"example: 2 steps, losses {summary['losses']}, {seconds:.1f} s")
    with pytest.raises(ValueError, match="group-size"):
        example.train(example.build_parser().parse_args(argv[:6] + ["--group-size", "1"]))
