"""The trainer end to end on CPU with a tiny random model: short runs on Bandit and FrozenLake, the loss mask,
filtering (dropped groups never reach the loss), checkpoints in Hugging Face format, resume, and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from transformers import AutoModelForCausalLM

from ragen_trainer.config import load_config
from ragen_trainer.critic import CRITIC_FILE, get_critic
from ragen_trainer.trainer import StarPOTrainer, TrainerCallback
from ragen_trainer.update import micro_batches
from tests.trainer.conftest import ScriptedEngine, build_tiny_model


def small_config(tmp_path, preset="starpo-s", **changes):
    base = dict(
        env_groups=2, group_size=2, max_turns=2, max_new_tokens=8, max_context_tokens=1024, enable_think=False,
        total_steps=2, save_steps=1, val_every=0, micro_batch_size=2, generation_batch_size=8,
        actor_lr=1e-3, critic_lr=1e-3, report_to=["jsonl"], output_dir=str(tmp_path / "run"),
        reply_prefix="",  # the scripted engines below write whole replies (bare actions or tags included)
        bare_answers=True,  # ... and bare actions are answers (ragen's lenient option; the reference wants <answer>)
    )
    base.update(changes)
    return load_config(preset).replace(**base).validate()


def read_metrics(path):
    return [json.loads(line) for line in open(path, encoding="utf-8") if '"note"' not in line]


def params_of(model):
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if "ragen_critic" not in k}


def test_full_run_bandit_starpo_s_with_hf_engine(tmp_path, tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer)
    before = params_of(model)
    cfg = small_config(tmp_path, val_every=1, val_groups=2)
    result = StarPOTrainer(cfg, model, tiny_tokenizer).train()
    out = tmp_path / "run"
    assert result.global_step == 2 and not result.interrupted
    for name in ("config.yaml", "metrics.jsonl", "summary.json"):
        assert (out / name).is_file(), name
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("policy/entropy", "optim/grad_norm", "reward/in_group_std", "filter/kept_groups", "loss/value",
                "time/generation", "time/scoring", "time/update", "val/success"):
        assert key in rows[0], key
    assert rows[0]["filter/kept_groups"] == 1  # keep 0.25 of 2 groups -> 1
    for step in (1, 2):
        ckpt = out / f"checkpoint-{step}"
        for name in ("config.json", "model.safetensors", CRITIC_FILE, "ragen_checkpoint.json", "optimizer.pt",
                     "trainer_state.json", "tokenizer.json"):
            assert (ckpt / name).is_file(), f"{ckpt.name}/{name}"
    final = AutoModelForCausalLM.from_pretrained(out / "final")  # plain Hugging Face format
    changed = [k for k, v in final.state_dict().items() if k in before and not torch.equal(v, before[k])]
    assert changed, "training did not change the weights"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["interrupted"] is False and "val/success" in summary["final_validation"]


@pytest.mark.parametrize("prefix", ["auto", ""])
def test_reply_prefix_reaches_training_and_validation_rollouts(tmp_path, tiny_tokenizer, prefix):
    engine = ScriptedEngine(tiny_tokenizer, lambda prompt, call, row: "Dragon</answer>")
    cfg = small_config(tmp_path, total_steps=1, max_turns=1, val_every=1, val_groups=2, save_steps=0,
                       reply_prefix=prefix)  # fmt: skip
    trainer = StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer, engine=engine)
    trainer.train()
    answer_ids = list(tiny_tokenizer("<answer>", add_special_tokens=False)["input_ids"])
    prompts = [p for call in engine.prompts for p in call]
    assert len(prompts) == 2 * 2 + 2 * 2  # training (2 groups x 2) and validation before and after (2 each)
    ends_with_tag = [p[-len(answer_ids) :] == answer_ids for p in prompts]
    assert all(ends_with_tag) if prefix == "auto" else not any(ends_with_tag)
    if prefix == "auto":  # enable_think=False: the env got "<answer>Dragon</answer>", the winning arm
        rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
        assert rows[0]["val/success"] == 1.0 and trainer.val_history[-1]["val/success"] == 1.0


def _frozenlake_reply(prompt_text, call, row):
    return ["Right || Down", "Down || Right", "Left", "nonsense"][(row + call) % 4]


def test_full_run_frozenlake_grpo_multi_turn_with_kl(tmp_path, tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer)
    engine = ScriptedEngine(tiny_tokenizer, _frozenlake_reply)
    cfg = small_config(tmp_path, "grpo", env_id="ragen/FrozenLake-v0", max_turns=3, env_groups=2, group_size=3,
                       max_new_tokens=12)
    assert cfg.kl_coef > 0 and not cfg.use_critic
    trainer = StarPOTrainer(cfg, model, tiny_tokenizer, engine=engine)
    assert trainer.ref_model is not None and get_critic(model) is None
    result = trainer.train()
    assert result.global_step == 2
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert all("policy/kl" in r for r in rows)
    assert max(r["episode/num_turns"] for r in rows) > 1  # multi-turn episodes were trained
    assert (tmp_path / "run" / "checkpoint-2" / "model.safetensors").is_file()
    assert not (tmp_path / "run" / "checkpoint-2" / CRITIC_FILE).exists()


def test_in_reward_kl_is_subtracted_from_the_rewards_when_asked(tmp_path, tiny_tokenizer):
    # The in-reward KL: vanilla PPO's 0.001 at the paper's commit (applied whenever the KL loss is off); today's
    # reference has it off everywhere (use_kl_in_reward), and StarPO-S has none at either.
    assert load_config("starpo").kl_reward_coef == 0.001 and load_config("starpo-s").kl_reward_coef == 0.0
    assert load_config("starpo").replace(reference="latest").kl_reward_coef == 0.0
    model = build_tiny_model(tiny_tokenizer)
    engine = ScriptedEngine(tiny_tokenizer, ["Phoenix", "Dragon"])
    cfg = small_config(tmp_path, "starpo", kl_reward_coef=0.5, max_turns=2)
    trainer = StarPOTrainer(cfg, model, tiny_tokenizer, engine=engine)
    assert trainer.ref_model is not None
    trainer.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    penalties = [r["reward/kl_penalty"] for r in rows if "reward/kl_penalty" in r]
    assert penalties[0] == pytest.approx(0.0, abs=1e-6)  # step 1: the policy is still the reference
    assert penalties[-1] != pytest.approx(0.0, abs=1e-6)  # after an update it has moved away from it
    no_kl = small_config(tmp_path / "b", "starpo-s")
    assert no_kl.kl_reward_coef == 0 and StarPOTrainer(no_kl, build_tiny_model(tiny_tokenizer), tiny_tokenizer,
                                                       engine=engine).ref_model is None


def test_loss_mask_and_advantages_only_on_model_tokens(tmp_path, tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer)
    engine = ScriptedEngine(tiny_tokenizer, ["Phoenix", "Dragon"])
    cfg = small_config(tmp_path, "starpo-s-bilevel", filter_ratio=1.0, max_turns=2, loss_mask="replies")
    trainer = StarPOTrainer(cfg, model, tiny_tokenizer, engine=engine)
    kept, _ = trainer.filter(trainer.rollout(0).trajectories)
    batch, _ = trainer.compute_advantages(kept, trainer.score(kept))
    minis = batch.mini_batches(cfg.ppo_mini_batch_size)
    assert minis == [[0, 1, 2, 3]]  # 4 kept trajectories, mini-batches of 32
    micro = micro_batches(batch, minis[0], micro_batch_size=cfg.micro_batch_size, rank=0, world=1,
                          agg_mode=cfg.loss_agg_mode, micro_size=cfg.loss_agg_micro_size)
    assert len(micro) == 2  # micro-batches of 2
    eos = tiny_tokenizer.eos_token_id
    for mb in micro:
        mask, adv = mb["mask"], mb["advantages"]
        # the packed row trains exactly the positions of the mask, each predicting the model's own next token
        assert int(mb["packed"].gather.numel()) == int((mask > 0).sum())
        for row, i in enumerate(mb["rows"]):
            ids = torch.tensor(batch.kept[i].input_ids)
            trained = ids[1:][mask[row][: len(ids) - 1] > 0].tolist()
            text = tiny_tokenizer.decode([t for t in trained if t != eos])
            assert text in ("Phoenix", "PhoenixDragon", "Dragon")  # only the model's replies
            assert trained.count(eos) >= 1  # each reply's own end-of-turn token is trained
            assert torch.all(adv[row][mask[row] == 0] == 0)
            assert torch.all(mb["returns"][row][mask[row] == 0] == 0)
        # the old log-probs were recomputed by the trainer, not the engine's placeholder -1.0
        assert not torch.allclose(mb["old_logprobs"][mask > 0], torch.full_like(mb["old_logprobs"][mask > 0], -1.0))


def test_after_system_mask_trains_the_environment_text_too(tmp_path, tiny_tokenizer):
    """The paper's runs (loss_mask after_system, the default): every token after the system prompt is trained, the
    template's closing newline included (the reference's last token, where its reward sits)."""
    engine = ScriptedEngine(tiny_tokenizer, ["Phoenix", "Dragon"])
    cfg = small_config(tmp_path, "starpo-s", filter_ratio=1.0, max_turns=2)
    assert cfg.loss_mask == "after_system"
    trainer = StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer, engine=engine)
    kept, _ = trainer.filter(trainer.rollout(0).trajectories)
    batch, _ = trainer.compute_advantages(kept, trainer.score(kept))
    micro = micro_batches(batch, batch.mini_batches(cfg.ppo_mini_batch_size)[0], micro_batch_size=cfg.micro_batch_size,
                          rank=0, world=1, agg_mode=cfg.loss_agg_mode, micro_size=cfg.loss_agg_micro_size)
    for mb in micro:
        mask, adv = mb["mask"], mb["advantages"]
        assert int(mb["packed"].gather.numel()) == int((mask > 0).sum())
        for row, i in enumerate(mb["rows"]):
            ids = torch.tensor(batch.kept[i].input_ids)
            on = mask[row][: len(ids) - 1] > 0
            trained = tiny_tokenizer.decode(ids[1:][on].tolist())
            assert "Phoenix" in trained and "State:" in trained and "user" in trained  # replies, env text, headers
            assert "helpful assistant" not in trained  # the system turn is not
            assert trained.endswith("<|im_end|>\n")  # the closing newline, as the reference's last token
            assert torch.all(adv[row][mask[row] == 0] == 0)  # advantages only where trained


def _group_reply(prompt_text, call, row):
    # 4 groups x 2 rollouts; group 1 is the only one whose rollouts disagree (reward 0.1 vs -0.1)
    return {0: "Phoenix", 1: "Phoenix" if row % 2 == 0 else "not an arm", 2: "not an arm", 3: "Phoenix"}[row // 2]


class CountingTrainer(StarPOTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_rows = []  # (rows in the micro-batch, rows with trained tokens)
        self.seeds_seen = []

    def compute_loss(self, model, micro):
        self.loss_rows.append((len(micro["rows"]), int((micro["mask"].sum(-1) > 0).sum())))
        return super().compute_loss(model, micro)


@pytest.mark.parametrize("ratio,expected_rows,expected_micro", [(0.25, 2, 1), (1.0, 8, 4)])
def test_filtered_groups_never_reach_the_backward_pass(tmp_path, tiny_tokenizer, ratio, expected_rows, expected_micro):
    model = build_tiny_model(tiny_tokenizer)
    engine = ScriptedEngine(tiny_tokenizer, _group_reply)
    cfg = small_config(tmp_path, filter_ratio=ratio, env_groups=4, group_size=2, max_turns=1, total_steps=1,
                       save_steps=0)
    trainer = CountingTrainer(cfg, model, tiny_tokenizer, engine=engine)
    trainer.train()
    assert len(trainer.loss_rows) == expected_micro
    assert sum(r for r, _ in trainer.loss_rows) == expected_rows
    row = trainer.history[-1]
    assert row["filter/kept_trajectories"] == expected_rows
    if ratio < 1.0:
        assert row["filter/std_mean_kept"] > 0 and row["filter/threshold"] > 0  # the varied group was kept


class StopAt(TrainerCallback):
    """Simulates Ctrl-C: sends SIGINT to this process after the given training step."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, trainer, step, metrics):
        if step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_saves_then_resume_continues(tmp_path, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["Dragon"])
    cfg = small_config(tmp_path, total_steps=3, save_steps=0)
    first = StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer, engine=engine,
                          callbacks=[StopAt(1)])
    result = first.train()
    out = tmp_path / "run"
    assert result.interrupted and result.global_step == 1
    assert result.checkpoint == str(out / "checkpoint-1")
    assert (out / "checkpoint-1" / "model.safetensors").is_file()
    assert (out / "checkpoint-1" / CRITIC_FILE).is_file()
    assert json.loads((out / "summary.json").read_text())["interrupted"] is True
    assert not (out / "final").exists()
    saved_critic = {k: v.clone() for k, v in get_critic(first.policy).state_dict().items()}

    second = StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer, seed=5), tiny_tokenizer, engine=engine)
    second.load_checkpoint(str(out / "checkpoint-1"))
    for k, v in get_critic(second.policy).state_dict().items():
        assert torch.equal(v, saved_critic[k]), k  # the critic comes back with the policy
    result = second.train()  # resumes from checkpoint-1 (config.resume)
    assert not result.interrupted and result.global_step == 3
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]
    assert (out / "final" / "config.json").is_file()


def test_a_segment_stopped_before_its_first_step_keeps_the_runs_record(tmp_path, tiny_tokenizer, monkeypatch):
    engine = ScriptedEngine(tiny_tokenizer, ["Dragon"])
    cfg = small_config(tmp_path, total_steps=3, save_steps=0)
    StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer, engine=engine, callbacks=[StopAt(1)]).train()
    out = tmp_path / "run"
    first = json.loads((out / "summary.json").read_text())
    assert first["segments"] == [{"resumed_from": None, "steps": 1, "wall_seconds": first["wall_seconds"],
                                  "interrupted": True}]
    assert first["last_metrics"]["step"] == 1

    stopped = StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer, engine=engine)

    def interrupt(step):
        raise KeyboardInterrupt  # stopped while its first step ran (a session's end)

    monkeypatch.setattr(stopped, "train_step", interrupt)
    assert stopped.train().interrupted
    second = json.loads((out / "summary.json").read_text())
    assert second["resumed_from"] == str(out / "checkpoint-1") and second["steps"] == 1
    assert second["last_metrics"] == first["last_metrics"]  # not blanked by a segment that trained nothing
    assert [s["resumed_from"] for s in second["segments"]] == [None, str(out / "checkpoint-1")]

    StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer, engine=engine).train()
    third = json.loads((out / "summary.json").read_text())
    assert [s["steps"] for s in third["segments"]] == [1, 1, 3] and third["last_metrics"]["step"] == 3
    assert third["total_wall_seconds"] == pytest.approx(sum(s["wall_seconds"] for s in third["segments"]), abs=0.03)


def test_resume_from_periodic_checkpoint_restores_optimizer_state(tmp_path, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["Phoenix"])
    cfg = small_config(tmp_path, "starpo-s-grpo", total_steps=1, save_steps=1)
    StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer, engine=engine).train()
    policy_ckpt = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoint-1").state_dict()

    resumed = StarPOTrainer(cfg.replace(total_steps=2), build_tiny_model(tiny_tokenizer, seed=3), tiny_tokenizer,
                            engine=engine)
    seen = {}

    class Peek(TrainerCallback):
        def on_train_begin(self, trainer, step):
            seen["step"] = step
            seen["weights"] = {k: v.detach().cpu().clone() for k, v in trainer.policy.state_dict().items()}

    resumed.callbacks.append(Peek())
    result = resumed.train()
    assert result.global_step == 2
    # Adam's step counter continues from checkpoint-1 (1 step) rather than restarting: 1 + 1 = 2
    steps = {int(st["step"]) for st in resumed.optimizer.state.values() if "step" in st}
    assert steps == {2}
    # the policy the resumed run started from is checkpoint-1's, not the fresh seed-3 model
    for k, v in policy_ckpt.items():
        if k in seen["weights"]:
            assert torch.equal(seen["weights"][k], v), k
    # the Echo Trap monitor carries on with the history of step 1 instead of starting blind
    saved = json.loads((tmp_path / "run" / "checkpoint-1" / "echo_trap_monitor.json").read_text())
    assert len(saved["std"]) == 1
    assert len(resumed.monitor.state_dict()["std"]) == 2


def test_separate_value_model_and_several_ppo_epochs(tmp_path, tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer)
    engine = ScriptedEngine(tiny_tokenizer, lambda text, call, row: ["Dragon", "Phoenix", "x"][row % 3])
    cfg = small_config(tmp_path, "starpo-s", total_steps=2, ppo_epochs=2, save_steps=2,
                       filter_ratio=1.0, group_size=3)
    trainer = StarPOTrainer(cfg, model, tiny_tokenizer, engine=engine)
    critic = get_critic(model)
    assert critic.kind == "value_model"
    backbone_before = {k: v.clone() for k, v in critic.state_dict().items()}
    calls = []
    original = trainer.rollout
    trainer.rollout = lambda step: calls.append(step) or original(step)
    result = trainer.train()
    assert result.global_step == 2 and trainer.optimizer_steps == 4  # 2 steps x 2 epochs of updates
    assert calls == [0, 1]  # one rollout per step, reused by the second epoch
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]  # one row per step (logged after its last epoch)
    assert any(r.get("policy/approx_kl", 0.0) != 0.0 for r in rows)  # the second epoch is off-policy
    assert any(not torch.equal(v, backbone_before[k]) for k, v in get_critic(model).state_dict().items())
    from safetensors.torch import load_file

    # The critic is kept for resuming (checkpoint-N, here the last step's), not in final/, which is for serving.
    assert not (tmp_path / "run" / "final" / CRITIC_FILE).exists()
    saved = load_file(str(tmp_path / "run" / "checkpoint-2" / CRITIC_FILE))
    assert any(k.startswith("backbone.") for k in saved) and any(k.startswith("head.") for k in saved)


@pytest.mark.parametrize("preset", ["starpo-s", "starpo-s-grpo"])
def test_gradient_checkpointing_is_on_by_default_and_gives_the_same_update(tmp_path, tiny_tokenizer, preset):
    assert load_config(preset).gradient_checkpointing  # the reference's default (verl)
    updated = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = build_tiny_model(tiny_tokenizer)
        engine = ScriptedEngine(tiny_tokenizer, lambda text, call, row: ["Dragon", "Phoenix", "x"][row % 3])
        cfg = small_config(tmp_path / str(checkpointing), preset, total_steps=1, save_steps=0, filter_ratio=1.0,
                           group_size=3, gradient_checkpointing=checkpointing)  # fmt: skip
        trainer = StarPOTrainer(cfg, model, tiny_tokenizer, engine=engine)
        trainer.train()
        layers = model.get_decoder().layers
        assert all(layer.gradient_checkpointing == checkpointing for layer in layers)  # on for the update
        updated[checkpointing] = params_of(model)
    for name, value in updated[True].items():
        torch.testing.assert_close(value, updated[False][name], rtol=1e-4, atol=1e-6, msg=name)
