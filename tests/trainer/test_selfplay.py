"""Self-play training (``ragen_trainer.selfplay``): the opponent pool, rollouts where the policy plays seats (grouped
by initial state and seat, each seat credited with its own return), per-seat metrics, and short runs of the trainer
with a tiny model against itself, its past snapshots and fixed opponents."""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("pettingzoo")

from ragen_trainer.config import load_config
from ragen_trainer.engines.base import SamplingParams
from ragen_trainer.selfplay import OpponentPool, collect_selfplay_rollouts, learner_seat, selfplay_metrics
from ragen_trainer.trainer import StarPOTrainer
from tests.trainer.conftest import ScriptedEngine, build_tiny_model, latest_rollout
from tests.trainer.test_trainer import params_of, read_metrics

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=8, seed=0)
GAME_KWARGS = {"enable_think": False, "reply_prefix": ""}  # the scripted engine writes whole replies
#: The rollout settings of the games below: the later reference's (only the replies trained), cleaned replies.
SETTINGS = latest_rollout()


def legal_tictactoe_move(prompt: str, call: int, row: int) -> str:
    """A scripted policy: a random empty cell of the board in the prompt's last state."""
    cells = re.findall(r"Empty cells: ([0-9, ]+)\.", prompt)[-1].split(", ")
    return f"<answer>{cells[int(np.random.default_rng([call, row]).integers(len(cells)))]}</answer>"


def test_self_games_train_both_seats_grouped_by_state_and_seat(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, legal_tictactoe_move)
    batch = collect_selfplay_rollouts(engine, tiny_tokenizer, "ragen/TicTacToe-v0", [10, 11], 3, ["self", "self"],
                                      settings=SETTINGS, env_kwargs=GAME_KWARGS, sampling=SAMPLING)  # fmt: skip
    assert len(batch) == 2 * 2 * 3  # 2 states x 3 games x 2 seats
    assert sorted(batch.groups()) == [0, 1, 2, 3]
    for group_id, trajs in batch.groups().items():
        assert len(trajs) == 3 and {t.tags["seat"] for t in trajs} == {group_id % 2}
        assert {t.seed for t in trajs} == {[10, 11][group_id // 2]}
    for traj in batch.trajectories:
        assert traj.tags["opponent"] == "self" and traj.tags["game"] == "tictactoe"
        assert sum(traj.loss_mask) > 0 and len(traj.turn_spans) == traj.num_turns
        assert traj.reward == pytest.approx(traj.infos[-1]["score"])  # legal moves only: the return is the score
    # The two seats of one game: one won what the other lost, or both drew.
    for first, second in zip(batch.groups()[0], batch.groups()[1]):
        assert first.reward + second.reward == pytest.approx(1.0)


def test_fixed_opponent_games_train_only_the_learner_seat_by_seed(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, legal_tictactoe_move)
    seeds = [20, 21, 22]
    batch = collect_selfplay_rollouts(engine, tiny_tokenizer, "ragen/TicTacToe-v0", seeds, 2,
                                      ["random", "perfect", "random"], settings=SETTINGS, env_kwargs=GAME_KWARGS,
                                      sampling=SAMPLING)  # fmt: skip
    assert len(batch) == 3 * 2
    for traj in batch.trajectories:
        g = traj.group_id // 2
        assert traj.group_id % 2 == traj.tags["seat"] == learner_seat({}, seeds[g]) == seeds[g] % 2
        assert traj.tags["opponent"] == ["random", "perfect", "random"][g]
    perfect = [t for t in batch.trajectories if t.tags["opponent"] == "perfect"]
    assert all(t.infos[-1]["outcome"] in ("draw", "loss") for t in perfect)  # nobody beats the perfect player
    fixed_seat = collect_selfplay_rollouts(engine, tiny_tokenizer, "ragen/TicTacToe-v0", seeds, 1, ["rule"] * 3,
                                           env_kwargs={**GAME_KWARGS, "seat": "second", "opponent": "perfect"},
                                           settings=SETTINGS, sampling=SAMPLING)  # fmt: skip
    assert {t.tags["seat"] for t in fixed_seat.trajectories} == {1}


def test_selfplay_metrics_per_seat_and_opponent(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, legal_tictactoe_move)
    batch = collect_selfplay_rollouts(engine, tiny_tokenizer, "ragen/TicTacToe-v0", [0, 1, 2, 3], 2,
                                      ["self", "random", "perfect", "self"], settings=SETTINGS, env_kwargs=GAME_KWARGS,
                                      sampling=SAMPLING)  # fmt: skip
    metrics = selfplay_metrics(batch.trajectories)
    for bucket in ("first", "second", "vs_self", "vs_random", "vs_perfect"):
        games = metrics[f"selfplay/{bucket}/games"]
        rates = [metrics[f"selfplay/{bucket}/{w}"] for w in ("win", "draw", "loss")]
        assert games > 0 and sum(rates) == pytest.approx(1.0) and metrics[f"selfplay/{bucket}/invalid_rate"] == 0
    assert metrics["selfplay/vs_self/games"] == 2 * 2 * 2  # both seats of 2 groups x 2 games
    assert metrics["selfplay/vs_self/win"] == metrics["selfplay/vs_self/loss"]  # every self game's win is a loss
    assert metrics["selfplay/vs_perfect/win"] == 0
    assert selfplay_metrics([]) == {}


def test_opponent_pool_draws_are_seeded_and_snapshots_are_kept_on_schedule(tiny_tokenizer):
    pool = OpponentPool(["self", "past", "random"], snapshot_every=2, size=2, seed=3, tokenizer=tiny_tokenizer,
                        batch_size=4)  # fmt: skip
    assert pool.kinds(5, 16) == pool.kinds(5, 16) and set(pool.kinds(5, 64)) == {"self", "past", "random"}
    model = build_tiny_model(tiny_tokenizer)
    for step in range(6):
        pool.observe(step, model)
    assert [s for s, _ in pool.snapshots] == [2, 4]  # taken at 0, 2, 4; the oldest dropped
    engine, taken = pool.past_engine(0)
    assert taken in (2, 4) and engine.model is not model
    # The snapshot holds the weights of its step, not the live policy's.
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    name, live = next(iter(model.named_parameters()))
    assert not torch.equal(dict(engine.model.named_parameters())[name], live)


def small_selfplay_config(tmp_path, **changes):
    base = dict(
        env_id="ragen/TicTacToe-v0", opponent_pool=["self", "past", "random"], opponent_snapshot_every=1,
        env_groups=4, group_size=2, max_new_tokens=8, max_context_tokens=2048, total_steps=2, save_steps=0,
        val_every=0, micro_batch_size=2, generation_batch_size=8, actor_lr=1e-3, critic_lr=1e-3, report_to=["jsonl"],
        output_dir=str(tmp_path / "run"), **GAME_KWARGS,
    )  # fmt: skip
    base.update(changes)
    return load_config("starpo-s").replace(**base).validate()


def test_short_selfplay_run_updates_the_policy_and_logs_per_seat_metrics(tmp_path, tiny_tokenizer, monkeypatch):
    import ragen_trainer.selfplay as selfplay_module

    calls = []
    real = selfplay_module.collect_selfplay_rollouts
    monkeypatch.setattr(selfplay_module, "collect_selfplay_rollouts",
                        lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    model = build_tiny_model(tiny_tokenizer)
    before = params_of(model)
    cfg = small_selfplay_config(tmp_path, val_every=1, val_groups=3)
    trainer = StarPOTrainer(cfg, model, tiny_tokenizer, engine=ScriptedEngine(tiny_tokenizer, legal_tictactoe_move))
    result = trainer.train()
    assert result.global_step == 2
    # Training steps play self-play games; validation plays the single-agent view (not through self-play).
    assert len(calls) == 2 and all(len(seeds) == cfg.env_groups for seeds in calls)
    assert len(trainer.val_history) >= 2
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 2
    kinds = set()
    for row in rows:
        assert row["selfplay/first/games"] + row["selfplay/second/games"] > 0
        kinds |= {k.split("/")[1] for k in row if k.startswith("selfplay/vs_")}
        assert "val/success" in row  # validation: the single-agent view against its opponent
        # the pool reports the snapshot its "past" games faced (taken at step 0 or 1: one every step)
        assert ("selfplay/past_snapshot_step" in row) == ("selfplay/vs_past/games" in row)
        assert row.get("selfplay/past_snapshot_step", 0) in (0, 1)
    assert kinds <= {"vs_self", "vs_past", "vs_random"} and len(kinds) >= 2
    changed = [k for k, v in model.state_dict().items() if k in before and not torch.equal(v, before[k])]
    assert changed, "self-play training did not change the weights"


def test_selfplay_run_with_the_tiny_model_generating(tmp_path, tiny_tokenizer):
    """The policy really generates (HF engine, random tiny model): its replies are mostly invalid, games end by
    forfeit, and the run completes."""
    cfg = small_selfplay_config(tmp_path, opponent_pool=["self", "past"], env_groups=2, total_steps=1)
    result = StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer).train()
    assert result.global_step == 1
    (row,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert row["selfplay/first/games"] > 0 and 0.0 <= row["selfplay/first/invalid_rate"] <= 1.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"env_id": "ragen/Bandit-v0"}, "a game id"),
        ({"opponent_pool": ["grandmaster"]}, "opponent_pool"),
        ({"opponent_snapshot_every": 0}, "opponent_snapshot_every"),
        ({"opponent_pool_size": 0}, "opponent_pool_size"),
    ],
)
def test_bad_selfplay_config_names_the_field(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        small_selfplay_config(tmp_path, **changes)
