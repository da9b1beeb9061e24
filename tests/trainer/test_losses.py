"""Losses against hand computations on small tensors."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer.losses import agg_loss, entropy_from_logits, kl_penalty, policy_loss, row_normalizers, value_loss
from ragen_trainer.settings import LossSettings

#: The settings of these hand computations: a token mean over the trained tokens, dual clip 3, value clip 0.5.
SETTINGS = LossSettings(clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0, loss_agg_mode="token-mean",
                        loss_agg_micro_size=4, kl_estimator="k3", value_clip=0.5)


def _case():
    # token 0: A=+1, ratio 1.5 (clipped high); token 1: A=-2, ratio 0.5 (clipped low);
    # token 2: A=+1, ratio 1.1 (inside); token 3: masked out (must not count)
    ratio = torch.tensor([[1.5, 0.5, 1.1, 3.0]])
    old = torch.zeros(1, 4)
    logp = torch.log(ratio).requires_grad_(True)
    adv = torch.tensor([[1.0, -2.0, 1.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    return logp, old, adv, mask


def test_policy_loss_decoupled_clipping_by_hand():
    logp, old, adv, mask = _case()
    loss, stats = policy_loss(logp, old, adv, mask, SETTINGS)
    per_token = [-1.0 * 1.28, 2.0 * 0.8, -1.0 * 1.1]  # max(-A r, -A clip(r)) for each unmasked token
    assert loss.item() == pytest.approx(sum(per_token) / 3, rel=1e-6)
    assert stats["clipfrac"].item() == pytest.approx(2 / 3)
    assert stats["clipfrac_high"].item() == pytest.approx(1 / 3)
    assert stats["clipfrac_low"].item() == pytest.approx(1 / 3)
    loss.backward()
    # clipped tokens give no gradient; the unclipped one gives -A * ratio / n
    assert logp.grad[0, 0].item() == 0.0 and logp.grad[0, 1].item() == 0.0 and logp.grad[0, 3].item() == 0.0
    assert logp.grad[0, 2].item() == pytest.approx(-1.1 / 3, rel=1e-6)


def test_clip_higher_lets_positive_ratio_grow_further():
    logp, old, adv, mask = _case()
    sym, _ = policy_loss(logp, old, adv, mask, replace(SETTINGS, clip_high=0.2))
    asym, _ = policy_loss(logp, old, adv, mask, replace(SETTINGS, clip_high=0.28))
    assert asym.item() == pytest.approx(sym.item() - (1.28 - 1.2) / 3, rel=1e-6)
    wide, _ = policy_loss(logp, old, adv, mask, replace(SETTINGS, clip_high=0.6))  # 1.5 < 1.6: not clipped any more
    assert wide.item() == pytest.approx((-1.5 + 1.6 - 1.1) / 3, rel=1e-6)


def test_aggregation_modes_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2.0 + 4.0) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6.0 + 4.0) / 2)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_loss(loss, mask, "sum")


def test_micro_token_mean_by_hand():
    # 5 rows, micro-batches of 2: rows {0,1}, {2,3}, {4}; the mean of the three micro-batches' token means
    loss = torch.tensor([[1.0, 1.0], [3.0, 0.0], [2.0, 2.0], [4.0, 4.0], [5.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    want = ((1 + 1 + 3) / 3 + (2 + 2 + 4 + 4) / 4 + (5 + 7) / 2) / 3
    assert agg_loss(loss, mask, "micro-token-mean", micro_size=2).item() == pytest.approx(want)
    # one row per micro-batch is seq-mean-token-mean; one micro-batch of everything is token-mean
    assert agg_loss(loss, mask, "micro-token-mean", micro_size=1).item() == pytest.approx(
        agg_loss(loss, mask, "seq-mean-token-mean").item())
    assert agg_loss(loss, mask, "micro-token-mean", micro_size=5).item() == pytest.approx(
        agg_loss(loss, mask, "token-mean").item())
    with pytest.raises(ValueError, match="per-row"):
        agg_loss(loss, mask, "micro-token-mean", normalizer=3.0)
    with pytest.raises(ValueError, match="needs micro_size"):  # the size differs by reference: never assumed
        agg_loss(loss, mask, "micro-token-mean")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "micro-token-mean"])
def test_row_normalizers_make_any_split_add_up(mode):
    g = torch.Generator().manual_seed(3)
    loss = torch.rand(7, 6, generator=g)
    mask = (torch.rand(7, 6, generator=g) > 0.3).float()
    whole = agg_loss(loss, mask, mode, micro_size=3) if mode == "micro-token-mean" else agg_loss(loss, mask, mode)
    norms = row_normalizers(mask, mode, micro_size=3)
    for split in ([[0, 1, 2, 3, 4, 5, 6]], [[0], [1, 2], [3, 4, 5, 6]], [[6, 0], [2, 4], [1, 3, 5]]):
        total = sum(agg_loss(loss[rows], mask[rows], mode, norms[rows]) for rows in split)
        assert total.item() == pytest.approx(whole.item(), rel=1e-6), split
    # two processes: each divides by its share (world), the average over processes is the whole loss
    halves = [[0, 2, 4, 6], [1, 3, 5]]
    shared = row_normalizers(mask, mode, world=2, micro_size=3)
    mean = sum(agg_loss(loss[r], mask[r], mode, shared[r]) for r in halves) / 2
    assert mean.item() == pytest.approx(whole.item(), rel=1e-6)


def test_normalizer_makes_micro_batches_add_up():
    g = torch.Generator().manual_seed(1)
    loss = torch.rand(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.4).float()
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        whole = agg_loss(loss, mask, mode)
        norm = float(mask.sum()) if mode == "token-mean" else float((mask.sum(-1) > 0).sum())
        parts = agg_loss(loss[:2], mask[:2], mode, norm) + agg_loss(loss[2:], mask[2:], mode, norm)
        assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(1.0)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-1.0) + 1.0 - 1.0)
    assert kl_penalty(ref, ref, "k3").item() == 0.0
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_penalty(logp, ref, "k2")


def test_entropy_from_logits():
    ent = entropy_from_logits(torch.zeros(2, 4))
    assert ent.tolist() == pytest.approx([math.log(4)] * 2)
    peaked = entropy_from_logits(torch.tensor([[100.0, 0.0, 0.0]]))
    assert peaked.item() == pytest.approx(0.0, abs=1e-6)


def test_value_loss_clipping_by_hand():
    values = torch.tensor([[1.0, 0.1]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0]])
    mask = torch.ones(1, 2)
    loss, stats = value_loss(values, old, returns, mask, SETTINGS)
    # token 0: clipped value 0.5 -> max((1-2)^2, (0.5-2)^2) = 2.25; token 1 inside the clip range: (0.1-1)^2 = 0.81
    assert loss.item() == pytest.approx(0.5 * (2.25 + 0.81) / 2)
    assert stats["vf_clipfrac"].item() == pytest.approx(0.5)
    loss.backward()
    assert values.grad[0, 0].item() == 0.0  # the clipped term wins: no gradient to the value
    assert values.grad[0, 1].item() == pytest.approx(0.5 * 2 * (0.1 - 1.0) / 2)
