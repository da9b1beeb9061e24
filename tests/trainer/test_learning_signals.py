"""What a researcher watches during training: the replies' own entropy (beside the trained tokens'), every
validation split during training (the paper's protocol), and ``ragen-trainer plot``."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from ragen_trainer.cli import main as cli_main
from ragen_trainer.config import load_config
from ragen_trainer.critic import PolicyWithCritic
from ragen_trainer.monitor import KEY_CONTEXT_LOG_RATIO, KEY_ENTROPY, KEY_REPLY_ENTROPY, EchoTrapMonitor
from ragen_trainer.plotting import find_configurations, load_records, mean_band, plot_runs, series, validation_splits
from ragen_trainer.trainer import StarPOTrainer
from ragen_trainer.update import context_advantage_metrics, micro_batches, ppo_loss
from tests.trainer.conftest import ScriptedEngine, build_tiny_model
from tests.trainer.test_trainer import read_metrics, small_config


# ------------------------------------------------------------------------------------------------ reply entropy
def test_reply_mask_covers_exactly_the_reply_tokens_under_the_paper_mask(tmp_path, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["Phoenix", "Dragon"])
    cfg = small_config(tmp_path, filter_ratio=1.0, max_turns=1)
    assert cfg.loss_mask == "after_system"
    trainer = StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer, engine=engine)
    kept, _ = trainer.filter(trainer.rollout(0).trajectories)
    batch, _ = trainer.compute_advantages(kept, trainer.score(kept))
    for mb in micro_batches(batch, list(range(len(batch))), micro_batch_size=8, rank=0, world=1,
                            agg_mode=cfg.loss_agg_mode, micro_size=cfg.loss_agg_micro_size):
        replies, mask = mb["reply_mask"], mb["mask"]
        assert torch.all(replies <= mask)  # a subset of the trained positions
        assert replies.sum() < mask.sum()  # the paper's mask trains the env text too; the replies are fewer
        for row, i in enumerate(mb["rows"]):
            ids = torch.tensor(batch.kept[i].input_ids)
            on = replies[row][: len(ids) - 1] > 0
            text = tiny_tokenizer.decode(ids[1:][on].tolist())
            assert text.replace("<|im_end|>", "").strip() in ("Phoenix", "Dragon"), text


def test_reply_entropy_is_the_entropy_of_the_reply_tokens_only(tmp_path, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["Phoenix", "Dragon"])
    cfg = small_config(tmp_path, filter_ratio=1.0, max_turns=1, critic="value_head")
    trainer = StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer, engine=engine)
    kept, _ = trainer.filter(trainer.rollout(0).trajectories)
    batch, _ = trainer.compute_advantages(kept, trainer.score(kept))
    micro = micro_batches(batch, list(range(len(batch))), micro_batch_size=8, rank=0, world=1,
                          agg_mode="token-mean", micro_size=1)[0]
    _, stats = ppo_loss(cfg, PolicyWithCritic(trainer.model), micro)
    # the same number from the model's full logits, over the reply positions
    ids = [t.input_ids for t in batch.kept]
    expected_num, expected_den = 0.0, 0.0
    with torch.no_grad():
        for row, seq in enumerate(ids):
            logits = trainer.policy(input_ids=torch.tensor([seq])).logits[0, :-1].float() / cfg.temperature
            ent = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
            sel = micro["reply_mask"][row][: len(seq) - 1] > 0
            expected_num += float(ent[sel].sum())
            expected_den += float(sel.sum())
    assert stats["reply_tokens"] == expected_den
    assert stats["reply:policy/reply_entropy"] / stats["reply_tokens"] == pytest.approx(
        expected_num / expected_den, rel=1e-4)


def test_training_logs_reply_entropy_and_the_monitor_watches_it(tmp_path, tiny_tokenizer):
    cfg = small_config(tmp_path, filter_ratio=1.0)
    StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer,
                  engine=ScriptedEngine(tiny_tokenizer, ["Phoenix", "Dragon"])).train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    for row in rows:
        assert math.isfinite(row[KEY_REPLY_ENTROPY]) and row[KEY_REPLY_ENTROPY] >= 0
        assert row[KEY_REPLY_ENTROPY] != row[KEY_ENTROPY]  # another set of tokens than the trained ones


def test_monitor_sees_collapsing_replies_that_the_trained_token_entropy_hides():
    """The issue's measurement: under after_system the trained-token entropy stayed at 2.7 while the replies
    collapsed (reply entropy 2.8 -> 0.27): the monitor must warn from the replies' entropy."""
    monitor = EchoTrapMonitor()
    warnings = []
    for step in range(1, 9):
        collapsed = step >= 5
        metrics = {"reward/in_group_std": 0.01 if collapsed else 0.3, KEY_ENTROPY: 2.7,
                   KEY_REPLY_ENTROPY: 0.27 if collapsed else 2.8, "optim/grad_norm": 1.0}
        warnings += monitor.update(step, metrics)
    assert any("warning signs" in w for w in warnings)
    assert monitor.cliff_step == 5
    # Without the reply entropy (runs logged before it existed) the trained tokens' one is used: no warning here.
    old = EchoTrapMonitor()
    for step in range(1, 9):
        collapsed = step >= 5
        assert old.update(step, {"reward/in_group_std": 0.01 if collapsed else 0.3, KEY_ENTROPY: 2.7,
                                 "optim/grad_norm": 1.0}) == []


# ------------------------------------------------------------------------- the environment's text, trained
def test_context_advantage_is_negative_when_the_failing_episode_is_the_longer_one():
    """GRPO broadcasts a trajectory's advantage over every trained token: under the paper's after_system mask the
    longer, failing episode puts more observation tokens under its negative advantage."""
    # row 0: succeeded (A = +1), 2 reply + 2 context positions; row 1: failed (A = -1), 2 reply + 6 context positions
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1, 0, 0]], dtype=torch.float32)
    replies = torch.tensor([[0, 0, 1, 1, 0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    advantages = torch.tensor([[1.0], [-1.0]]) * mask
    out = context_advantage_metrics(advantages, mask, replies)
    assert out["adv/reply_mean"] == pytest.approx(0.0)  # two reply tokens each: the replies' push cancels
    assert out["adv/context_mean"] == pytest.approx((2 * 1.0 + 6 * -1.0) / 8)  # -0.5: the observations pushed down
    assert out["batch/context_token_share"] == pytest.approx(8 / 12)
    # Only the replies trained (loss_mask="replies"): nothing else to report.
    assert set(context_advantage_metrics(advantages * replies, replies, replies)) == {"adv/reply_mean"}


@pytest.mark.parametrize("loss_mask", ["after_system", "replies"])
def test_grpo_logs_the_log_ratio_to_the_reference_apart_for_replies_and_context(tmp_path, tiny_tokenizer, loss_mask):
    cfg = small_config(tmp_path, preset="grpo", filter_ratio=1.0, loss_mask=loss_mask, total_steps=3)
    assert cfg.kl_coef > 0  # the vanilla preset's KL loss: reference log-probs are scored
    StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer,
                  engine=ScriptedEngine(tiny_tokenizer, ["Phoenix", "Dragon", "Tiger"])).train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    # step 1: the policy is the reference, so both log-ratios are 0; it moves after the first update
    assert rows[0]["policy/log_ratio_replies"] == pytest.approx(0.0, abs=1e-5)
    assert abs(rows[-1]["policy/log_ratio_replies"]) > 1e-6
    for row in rows:
        assert math.isfinite(row["adv/reply_mean"])
        if loss_mask == "after_system":
            assert 0.0 < row["batch/context_token_share"] < 1.0
            assert math.isfinite(row["adv/context_mean"]) and math.isfinite(row["policy/log_ratio_context"])
        else:
            assert "adv/context_mean" not in row and "policy/log_ratio_context" not in row
    if loss_mask == "after_system":
        assert rows[0]["policy/log_ratio_context"] == pytest.approx(0.0, abs=1e-5)
        assert abs(rows[-1]["policy/log_ratio_context"]) > 1e-6


def test_monitor_warns_when_the_policy_unlearns_its_observations():
    """Vanilla GRPO seed 0 on FrozenLake (its log-ratio over the trained tokens: -1.1 at step 17, -2.0 at step 25, its
    replies stopped parsing at step 27): the warning comes before the collapse, once per cooldown."""
    monitor = EchoTrapMonitor()
    drift = {1: 0.0, 5: -0.1, 9: -0.4, 13: -0.8, 17: -1.1, 21: -1.7, 25: -2.0}
    warned = {}
    for step in range(1, 27):
        ratio = next(v for k, v in sorted(drift.items(), reverse=True) if k <= step)
        for message in monitor.update(step, {"reward/in_group_std": 0.3, KEY_REPLY_ENTROPY: 0.23,
                                             "optim/grad_norm": 1.5, KEY_CONTEXT_LOG_RATIO: ratio}):
            warned[step] = message
    assert sorted(warned) == [17, 22]  # crossing -1.0 at step 17, again after the 5-step cooldown
    assert "unlearning its observations" in warned[17] and "1.1 nats" in warned[17]
    # PPO's stayed near +0.1; and a run without a reference logs nothing to judge
    quiet = EchoTrapMonitor()
    assert all(quiet.update(s, {KEY_CONTEXT_LOG_RATIO: 0.14, "optim/grad_norm": 1.0}) == [] for s in range(1, 30))
    assert all(quiet.update(s, {"optim/grad_norm": 1.0}) == [] for s in range(30, 40))


# ------------------------------------------------------------------------------------------- validation splits
def test_every_split_is_validated_during_training(tmp_path, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["Dragon", "Librarian", "Phoenix"])
    cfg = small_config(tmp_path, max_turns=1, val_every=1, val_groups=3, val_envs=["ragen/BanditTest-v0"])
    trainer = StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer, engine=engine)
    assert trainer.val_splits["BanditTest"][1]["protocol"].enable_think is False  # the run's protocol change
    result = trainer.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    for key in ("val/success", "val/BanditTest/success", "val/BanditTest/reward", "val/BanditTest/turns"):
        assert key in rows[0], key
        assert key in result.metrics, key
    assert all(0.0 <= rows[0][k] <= 1.0 for k in ("val/success", "val/BanditTest/success"))


def test_val_envs_are_checked_before_any_model_loads():
    with pytest.raises(ValueError, match="val_envs.*ragen/Nope-v0"):
        load_config("starpo-s").replace(val_envs=["ragen/Nope-v0"]).validate()
    with pytest.raises(ValueError, match="distinct"):
        load_config("starpo-s").replace(val_envs=["ragen/BanditTest-v0", "ragen/BanditTest-v0"]).validate()
    for bad in ({"env": "ragen/Bandit-v0"}, {"env_id": "ragen/Bandit-v0", "name": "a b"}, 3,
                {"env_id": "ragen/Bandit-v0", "env_kwargs": [1]}):
        with pytest.raises(ValueError, match="val_envs.*expected"):
            load_config("starpo-s").replace(val_envs=[bad]).validate()
    cfg = load_config("starpo-s").replace(val_envs=["ragen/SokobanLarge-v0", "ragen/FrozenLake-v0"],
                                          env_id="ragen/Sokoban-v0", protocol={"enable_think": False}).validate()
    # each split keeps its own reference protocol (FrozenLake's 5 actions a turn), the run's changes on top
    name, env_id, kwargs = cfg.validation_split("ragen/FrozenLake-v0")
    assert (name, env_id) == ("FrozenLake", "ragen/FrozenLake-v0")
    assert kwargs["protocol"].actions_per_turn == 5 and kwargs["protocol"].enable_think is False
    # a variant: the paper's BanditTest of its generalisation runs, other arm names
    variant = {"env_id": "ragen/Bandit-v0", "name": "bandit-test", "env_kwargs": {"low_risk_name": "Trader",
                                                                                 "high_risk_name": "Librarian"}}
    name, env_id, kwargs = load_config("starpo-s").replace(val_envs=[variant]).validate().validation_split(variant)
    assert name == "bandit-test" and kwargs["high_risk_name"] == "Librarian"


# ------------------------------------------------------------------------------------------------------ plot
def _fake_run(folder, values, val=None, final=None, extra=None):
    folder.mkdir(parents=True)
    with open(folder / "metrics.jsonl", "w", encoding="utf-8") as fh:
        for step, value in enumerate(values, start=1):
            row = {"step": step, "success_rate": value, "reward/mean": value, "reward/in_group_std": 0.1,
                   "policy/reply_entropy": 1.0 - value, "optim/grad_norm": 1.0, **(extra or {})}
            if val and step in val:
                row.update(val[step])
            fh.write(json.dumps(row) + "\n")
    if final is not None:
        (folder / "summary.json").write_text(json.dumps({"steps": len(values), "final_validation": final}))


def test_plot_groups_seeds_places_validations_and_draws_a_png(tmp_path, monkeypatch):
    for seed, offset in enumerate((0.0, 0.2)):
        _fake_run(tmp_path / "a" / f"seed{seed}", [0.1 + offset, 0.3 + offset, 0.5 + offset],
                  val={1: {"val/success": 0.1, "val/BanditTest/success": 0.0}},
                  final={"val/success": 0.9, "val/BanditTest/success": 0.5})
    _fake_run(tmp_path / "b", [0.0, 0.0, 0.0])
    configs = find_configurations([tmp_path / "a", tmp_path / "b"])
    assert [len(c.runs) for c in configs] == [2, 1] and configs[0].label == "a (2 seeds)"
    assert validation_splits(configs) == ["", "BanditTest"]
    steps, means, stds = mean_band([series(r, ("success_rate",)) for r in configs[0].records])
    assert steps == [1, 2, 3] and means == pytest.approx([0.2, 0.4, 0.6]) and stds[0] == pytest.approx(0.1414, 1e-3)
    # the validation logged with step 1 measured the policy before any update (step 0); the final one, step 3
    val = series(load_records(tmp_path / "a" / "seed0"), ("val/success",))
    assert val == {0: 0.1, 3: 0.9}
    out = tmp_path / "fig" / "curves.png"
    assert cli_main(["plot", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out), "--title", "t"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    # a panel is drawn only when some run logged its metric: 5 without the format errors and the log-ratio, 7 with
    import matplotlib.pyplot as plt

    drawn, real_subplots = [], plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda rows, cols, **kw: drawn.append(rows * cols) or real_subplots(
        rows, cols, **kw))
    plot_runs([tmp_path / "b"], tmp_path / "b.png")
    _fake_run(tmp_path / "c", [0.1, 0.2], extra={"actions/format_error_rate": 0.5, "policy/log_ratio_context": -1.5})
    plot_runs([tmp_path / "c"], tmp_path / "c.png")
    assert drawn == [6, 9]  # 5 panels in a 2 x 3 grid; 7 in 3 x 3


@pytest.mark.parametrize("case", ["missing", "empty", "torn", "suffix", "labels"])
def test_plot_bad_arguments_give_a_message(tmp_path, capsys, case):
    run = tmp_path / "run"
    args = [str(run), "-o", str(tmp_path / "x.png")]
    if case == "empty":
        run.mkdir()
        (run / "metrics.jsonl").write_text("")
    elif case == "torn":
        run.mkdir()
        (run / "metrics.jsonl").write_text('{"step": 1, "succ')
    elif case == "suffix":
        _fake_run(run, [0.1])
        args[-1] = str(tmp_path / "x.gif")
    elif case == "labels":
        _fake_run(run, [0.1])
        args += ["--labels", "a", "b"]
    assert cli_main(["plot", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ragen-trainer plot: ") and "Traceback" not in err
    assert not (tmp_path / "x.png").exists()
