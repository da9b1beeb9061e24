"""PPO as the reference updates: mini-batches against the rollout policy's log-probs, dual clip, per-model clipping.

The reference (verl's ``dp_actor.update_policy`` under RAGEN) splits each kept batch into ``ppo_mini_batch_size``
mini-batches, one optimizer step each, all against the log-probs computed before the first of them. Only from the
second mini-batch on can the ratio move away from 1, so these tests use several mini-batches and a high learning rate.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from ragen_envs.driver import play_episodes, rollout_jobs
from ragen_trainer.config import load_config
from ragen_trainer.filtering import filter_groups, num_kept
from ragen_trainer.losses import policy_loss
from ragen_trainer.trainer import StarPOTrainer
from ragen_trainer.update import update_count
from tests.trainer.conftest import ScriptedEngine, build_tiny_model

#: Bandit replies that differ inside a group, so every group has a reward spread and non-zero advantages.
_REPLIES = ["<answer>Dragon</answer>", "<answer>Phoenix</answer>", "<answer>Dragon</answer>", "<answer>Phoenix</answer>"]


def _engine(tokenizer):
    return ScriptedEngine(tokenizer, lambda prompt, call, row: _REPLIES[row % len(_REPLIES)])


def _config(tmp_path, name, preset="grpo", **changes):
    base = {
        "env_id": "ragen/Bandit-v0", "env_groups": 2, "group_size": 4, "max_new_tokens": 8, "max_context_tokens": 1024,
        "enable_think": False, "reply_prefix": "", "total_steps": 1, "save_steps": 0, "val_every": 0,
        "micro_batch_size": 2, "ppo_mini_batch_size": 2, "actor_lr": 3e-2, "critic_lr": 3e-2, "entropy_coef": 0.0,
        "kl_coef": 0.0, "filter_ratio": 1.0, "report_to": ["jsonl"], "output_dir": str(tmp_path / name),
    }  # fmt: skip
    base.update(changes)
    return load_config(preset).replace(**base).validate()


def _train(tmp_path, tokenizer, name, **changes):
    torch.manual_seed(0)
    model = build_tiny_model(tokenizer)
    cfg = _config(tmp_path, name, **changes)
    trainer = StarPOTrainer(cfg, model, tokenizer, engine=_engine(tokenizer))
    trainer.train()
    lines = (tmp_path / name / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(x) for x in lines if '"note"' not in x]
    params = {k: v.detach().clone() for k, v in model.state_dict().items() if "ragen_critic" not in k}
    return rows[-1], params


def test_mini_batches_move_the_ratio_and_clipping_engages(tmp_path, tiny_tokenizer):
    cfg = _config(tmp_path, "plan")
    assert update_count(8, cfg.ppo_mini_batch_size, cfg.ppo_epochs) == 4  # 8 trajectories / 2 per mini-batch
    row, _ = _train(tmp_path, tiny_tokenizer, "clip")
    assert row["optim/updates"] == 4
    assert row["policy/clipfrac"] > 0, row
    assert row["policy/clipfrac_low"] + row["policy/clipfrac_high"] > 0
    assert row["policy/ratio_min"] < 1.0 < row["policy/ratio_max"]
    assert row["policy/approx_kl"] != 0.0


def test_one_mini_batch_keeps_the_ratio_at_one(tmp_path, tiny_tokenizer):
    """The reference's StarPO-S shape: the kept batch fits one mini-batch, so the only update sees ratio 1."""
    row, _ = _train(tmp_path, tiny_tokenizer, "one", ppo_mini_batch_size=8)
    assert row["optim/updates"] == 1
    assert row["policy/clipfrac"] == 0.0
    assert row["policy/ratio_min"] == pytest.approx(1.0, abs=1e-4)
    assert row["policy/ratio_max"] == pytest.approx(1.0, abs=1e-4)


def test_clip_higher_changes_the_update(tmp_path, tiny_tokenizer):
    _, symmetric = _train(tmp_path, tiny_tokenizer, "sym", clip_high=0.2)
    _, higher = _train(tmp_path, tiny_tokenizer, "high", clip_high=0.28)
    _, symmetric_again = _train(tmp_path, tiny_tokenizer, "sym2", clip_high=0.2)
    assert all(torch.equal(symmetric[k], symmetric_again[k]) for k in symmetric)  # the runs are deterministic
    assert any(not torch.allclose(symmetric[k], higher[k]) for k in symmetric)


def test_ppo_epochs_repeat_the_mini_batches(tmp_path, tiny_tokenizer):
    row, _ = _train(tmp_path, tiny_tokenizer, "epochs", ppo_mini_batch_size=4, ppo_epochs=2)
    assert row["optim/updates"] == 4  # 2 mini-batches x 2 passes


def test_critic_gradients_are_clipped_by_their_own_norm(tmp_path, tiny_tokenizer):
    cfg = _config(tmp_path, "critic", preset="starpo-s", filter_ratio=1.0, max_grad_norm=1e-3, critic_max_grad_norm=1e3)
    trainer = StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer, engine=_engine(tiny_tokenizer))
    actor = [p for n, p in trainer.model.named_parameters() if "ragen_critic" not in n and p.requires_grad]
    critic = [p for n, p in trainer.model.named_parameters() if "ragen_critic" in n and p.requires_grad]
    assert actor and critic
    for p in actor + critic:
        p.grad = torch.ones_like(p)
    critic_before = [p.grad.clone() for p in critic]
    norms = trainer.adamw.clip_gradients()  # what the optimizer's step does first
    assert norms["policy"] > 1.0 and norms["critic"] > 0
    assert float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in actor]))) == pytest.approx(1e-3, rel=1e-3)
    # a joint clip would have scaled the critic's gradients down with the policy's
    assert all(torch.equal(p.grad, g) for p, g in zip(critic, critic_before))


def test_value_model_run_logs_both_gradient_norms(tmp_path, tiny_tokenizer):
    row, _ = _train(tmp_path, tiny_tokenizer, "ppo", preset="starpo-s", filter_ratio=1.0)
    assert row["optim/grad_norm"] > 0 and row["critic/grad_norm"] > 0
    assert 0.0 <= row["critic/vf_clipfrac"] <= 1.0


def test_dual_clip_bounds_negative_advantage_losses():
    logp = torch.log(torch.tensor([[10.0, 10.0, 0.5]]))
    old = torch.zeros(1, 3)
    adv = torch.tensor([[-1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3)
    # the later reference's clipping (0.2 / 0.28, dual clip 3) with a token mean over the three tokens
    settings = load_config("starpo-s").replace(reference="latest", loss_agg_mode="token-mean").loss_settings()
    assert (settings.clip_low, settings.clip_high, settings.clip_ratio_c) == (0.2, 0.28, 3.0)
    loss, stats = policy_loss(logp, old, adv, mask, settings)
    # token 0: ratio 10, A < 0 -> min(max(10, 1.28), 3) = 3; token 1: ratio 10, A > 0 -> -1.28;
    # token 2: ratio 0.5, A < 0 -> max(0.5, 0.8) = 0.8 (the lower clip)
    assert float(loss) == pytest.approx((3.0 - 1.28 + 0.8) / 3)
    assert float(stats["clipfrac_dual"]) == pytest.approx(1 / 3)
    assert float(stats["ratio_min"]) == pytest.approx(0.5) and float(stats["ratio_max"]) == pytest.approx(10.0)
    unbounded, _ = policy_loss(logp, old, adv, mask, replace(settings, clip_ratio_c=1e9))
    assert float(unbounded) == pytest.approx((10.0 - 1.28 + 0.8) / 3)
    # clip_ratio_c 0: no dual clip at all (the paper-era actor, RAGEN 3059df8 dp_actor.compute_policy_loss)
    off, off_stats = policy_loss(logp, old, adv, mask, replace(settings, clip_ratio_c=0.0))
    assert float(off) == pytest.approx((10.0 - 1.28 + 0.8) / 3) and float(off_stats["clipfrac_dual"]) == 0.0


def test_micro_token_mean_does_not_depend_on_the_memory_micro_batch(tmp_path, tiny_tokenizer):
    """The paper's loss (token mean of each micro-batch of 4, averaged) is a property of the mini-batch: the memory
    knob micro_batch_size changes how it is computed, not what it is; seq-mean-token-mean is another loss."""
    common = dict(ppo_mini_batch_size=8, loss_agg_mode="micro-token-mean", loss_agg_micro_size=4)
    row_one, one = _train(tmp_path, tiny_tokenizer, "m1", micro_batch_size=1, **common)
    row_three, three = _train(tmp_path, tiny_tokenizer, "m3", micro_batch_size=3, **common)
    for key in ("loss/policy", "policy/entropy", "optim/grad_norm"):
        assert row_one[key] == pytest.approx(row_three[key], rel=1e-5), key
    # Adam's first step is about lr x sign(gradient): float noise may flip a near-zero gradient, hence lr / 30
    assert all(torch.allclose(one[k], three[k], atol=1e-3) for k in one)
    row_seq, _ = _train(tmp_path, tiny_tokenizer, "seq", micro_batch_size=1,
                        **{**common, "loss_agg_mode": "seq-mean-token-mean"})  # fmt: skip
    assert row_seq["optim/grad_norm"] != pytest.approx(row_one["optim/grad_norm"], rel=1e-3)


def test_kept_group_count_floors_like_the_reference_and_keeps_one():
    assert num_kept(8, 0.25) == 2
    assert num_kept(10, 0.29) == 2 and num_kept(10, 0.29, "ceil") == 3  # int(2.9) as the reference's topk
    assert num_kept(3, 0.25) == 1  # int(0.75) = 0 groups in the reference; ragen keeps one
    assert num_kept(5, 1.0) == 5
    with pytest.raises(ValueError, match="rounding"):
        num_kept(4, 0.5, "round")


def test_filter_keeps_the_floor_count_of_the_highest_std_groups():
    groups = {0: [0, 1], 1: [0, 0], 2: [1, 1], 3: [0, 3]}
    assert filter_groups(groups, 0.6).kept == [3, 0]  # int(0.6 x 4) = 2
    assert filter_groups(groups, 0.6, rounding="ceil").kept == [3, 0, 1]


def test_group_rollouts_share_the_env_randomness_by_default():
    class AlwaysDragon:
        def reply_batch(self, episodes):
            return ["<answer>Dragon</answer>"] * len(episodes)

    def rewards(randomness):
        jobs = rollout_jobs([5], 16, group_randomness=randomness)
        episodes = play_episodes("ragen/Bandit-v0", jobs, AlwaysDragon(), env_kwargs={"enable_think": False})
        return [sum(t.reward for t in e.turns) for e in episodes]

    shared = rewards("shared")
    assert len(set(shared)) == 1  # the same payout draw for every rollout of the group
    assert len(set(rewards("independent"))) == 2  # each rollout draws its own (0 or 1)
    assert all("dynamics_seed" not in (j.options or {}) for j in rollout_jobs([5], 3))
    assert [bool(j.options) for j in rollout_jobs([5], 3, group_randomness="independent")] == [False, True, True]
    with pytest.raises(ValueError, match="group_randomness"):
        rollout_jobs([5], 3, group_randomness="same")
