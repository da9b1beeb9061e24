"""The training loop's counts come from the batch in hand: every kept trajectory is trained exactly once per PPO
epoch, whatever the step kept (self-play's two seats per initial state, groups of uneven size, a kept count that is
not a multiple of the mini-batch), and ``optim/updates = ppo_epochs * ceil(kept / ppo_mini_batch_size)``."""

from __future__ import annotations

import math
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pettingzoo")

from ragen_trainer.config import load_config
from ragen_trainer.trainer import StarPOTrainer
from ragen_trainer.trajectory import Trajectory
from ragen_trainer.update import TrainingBatch, micro_batches, reply_mask
from tests.trainer.conftest import ScriptedEngine, build_tiny_model
from tests.trainer.test_selfplay import GAME_KWARGS, legal_tictactoe_move
from tests.trainer.test_trainer import read_metrics


class RecordingTrainer(StarPOTrainer):
    """Counts, per training step, how often each kept trajectory reaches a loss with a non-zero weight."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trained: list[Counter] = []
        self.kept_sizes: list[int] = []

    def compute_advantages(self, kept, scores):
        self.kept_sizes.append(len(kept))
        self.trained.append(Counter())
        return super().compute_advantages(kept, scores)

    def update(self, batch: TrainingBatch, members, stats, timings):
        rows = [i for micro in micro_batches(batch, members, micro_batch_size=self.cfg.micro_batch_size, rank=0,
                                             world=1, agg_mode=self.cfg.loss_agg_mode,
                                             micro_size=self.cfg.loss_agg_micro_size)
                for i in micro["rows"] if micro["mask"].sum() > 0]
        self.trained[-1].update(id(batch.kept[i]) for i in rows)
        self.trained_rows = getattr(self, "trained_rows", 0) + len(rows)
        return super().update(batch, members, stats, timings)


def _config(tmp_path, **changes):
    base = dict(
        env_id="ragen/TicTacToe-v0", env_groups=4, group_size=4, max_new_tokens=8, max_context_tokens=2048,
        total_steps=1, save_steps=0, val_every=0, micro_batch_size=3, generation_batch_size=8, actor_lr=1e-3,
        critic_lr=1e-3, report_to=["jsonl"], output_dir=str(tmp_path / "run"), filter_ratio=1.0,
        ppo_mini_batch_size=8, **GAME_KWARGS,
    )  # fmt: skip
    base.update(changes)
    return load_config("starpo-s").replace(**base).validate()


@pytest.mark.parametrize("pool,mini,epochs", [
    (["self"], 8, 1),  # the case: 4 states x 4 games x 2 seats = 32 kept, before: 16 of them never trained
    (["self", "random"], 5, 2),  # one seat or two per state (uneven), 5 does not divide the kept count
])
def test_every_kept_trajectory_is_trained_once_per_epoch(tmp_path, tiny_tokenizer, pool, mini, epochs):
    cfg = _config(tmp_path, opponent_pool=pool, ppo_mini_batch_size=mini, ppo_epochs=epochs)
    trainer = RecordingTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer,
                               engine=ScriptedEngine(tiny_tokenizer, legal_tictactoe_move))
    trainer.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 1
    for step, row in enumerate(rows):
        kept = trainer.kept_sizes[step]
        assert row["filter/kept_trajectories"] == kept
        assert row["optim/updates"] == epochs * math.ceil(kept / mini)
        counts = trainer.trained[step]
        assert len(counts) == kept and set(counts.values()) == {epochs}, counts
    if pool == ["self"]:
        assert trainer.kept_sizes == [32]
    assert trainer.optimizer_steps == sum(r["optim/updates"] for r in rows)


def test_micro_batches_cover_a_mini_batch_and_keep_processes_in_step():
    """Four processes, seven rows: each process gets the same number of micro-batches; the rows are dealt out once,
    and a process with no row left gets a zero-weight micro-batch."""
    kept = [_trajectory(n) for n in (5, 6, 7, 8, 9, 10, 11)]
    width = max(len(t.input_ids) for t in kept) - 1
    zeros = torch.zeros(len(kept), width)
    mask = torch.stack([torch.tensor([float(x) for x in t.loss_mask[1:]] + [0.0] * (width - len(t.loss_mask) + 1))
                        for t in kept])
    batch = TrainingBatch(kept=kept, mask=mask, replies=reply_mask(kept, width) * mask, advantages=zeros,
                          returns=zeros, values=None, old_logprobs=zeros, ref_logprobs=None)
    seen = []
    counts = set()
    for rank in range(4):
        micros = micro_batches(batch, list(range(7)), micro_batch_size=1, rank=rank, world=4, agg_mode="token-mean",
                               micro_size=1)
        counts.add(len(micros))
        seen += [i for m in micros if m["mask"].sum() > 0 for i in m["rows"]]
        for m in micros:  # the batch's reply positions, sliced to the micro-batch (zero where its weight is)
            trajs = [kept[i] for i in m["rows"]]
            own = reply_mask(trajs, max(len(t.input_ids) for t in trajs) - 1) * m["mask"]
            assert torch.equal(m["reply_mask"], own) and (m["reply_mask"].sum() > 0) == (m["mask"].sum() > 0)
    assert counts == {2} and sorted(seen) == list(range(7))


def _trajectory(length: int) -> Trajectory:
    """A trajectory of ``length`` tokens whose last three are the model's."""
    mask = [0] * (length - 3) + [1] * 3
    return Trajectory(group_id=0, seed=0, env_id="ragen/Bandit-v0", messages=[], input_ids=list(range(1, length + 1)),
                      loss_mask=mask, turn_spans=[(length - 3, length)], turn_rewards=[1.0], success=True,
                      replies=["x"], infos=[{}])
