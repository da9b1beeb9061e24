"""Advantages against hand computations: GRPO, token-level GAE over the loss mask, bi-level GAE."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer.advantages import bilevel_gae_advantages, gae_advantages, grpo_advantages, masked_whiten


def test_grpo_group_normalised_with_and_without_std():
    returns = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5])
    groups = [0, 0, 0, 0, 1, 1]
    adv = grpo_advantages(returns, groups)
    std = math.sqrt(4 * 0.25 / 3)  # unbiased std of [1, 0, 0, 1]
    expected = [0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std, 0.0, 0.0]
    assert adv.tolist() == pytest.approx(expected, rel=1e-5)
    centred = grpo_advantages(returns, groups, norm_by_std=False)
    assert centred.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0, 0.0])


def test_grpo_singleton_group_has_no_baseline():
    adv = grpo_advantages(torch.tensor([3.0, 1.0, 2.0]), [0, 1, 1])
    assert adv[0].item() == 0.0
    assert adv[1].item() < 0 < adv[2].item()


def test_gae_skips_environment_tokens_hand_computed():
    # positions 0 and 3 are prompt / environment tokens; model tokens at 1, 2 (turn 1) and 4 (turn 2)
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]])
    rewards = torch.tensor([[0.0, 0.0, 0.5, 0.0, 1.0]])
    values = torch.tensor([[9.0, 0.1, 0.2, 9.0, 0.4]])  # values at masked-out positions must not matter
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    a4 = 1.0 - 0.4
    a2 = (0.5 + 0.9 * 0.4 - 0.2) + 0.9 * 0.8 * a4
    a1 = (0.0 + 0.9 * 0.2 - 0.1) + 0.9 * 0.8 * a2
    assert adv[0].tolist() == pytest.approx([0.0, a1, a2, 0.0, a4], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([0.0, a1 + 0.1, a2 + 0.2, 0.0, a4 + 0.4], abs=1e-6)


def test_gae_gamma_lambda_one_is_reward_to_go_minus_value():
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(3, 12, generator=g) > 0.3).float()
    rewards = torch.randn(3, 12, generator=g) * mask
    values = torch.randn(3, 12, generator=g)
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    to_go = torch.flip(torch.cumsum(torch.flip(rewards, [1]), 1), [1])
    assert torch.allclose(adv, (to_go - values) * mask, atol=1e-5)
    assert torch.allclose(ret, to_go * mask, atol=1e-5)


def test_bilevel_gae_hand_computed():
    mask = torch.ones(1, 6)
    rewards = torch.tensor([[0.0, 0.0, 0.5, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]])
    adv, ret = bilevel_gae_advantages(rewards, values, mask, [[2, 5]], gamma=1.0, lam=1.0, turn_gamma=0.95)
    # turn level: G2 = 1.0 ; A1 = (0.5 + 0.95 * 0.6 - 0.3) + 0.95 * (1.0 - 0.6), G1 = A1 + 0.3
    g2 = 1.0
    g1 = (0.5 + 0.95 * 0.6 - 0.3) + 0.95 * (1.0 - 0.6) + 0.3
    # token level with gamma = lambda = 1: every token of turn k gets G_k - V(t)
    expected = [g1 - 0.1, g1 - 0.2, g1 - 0.3, g2 - 0.4, g2 - 0.5, g2 - 0.6]
    assert adv[0].tolist() == pytest.approx(expected, abs=1e-6)
    assert ret[0].tolist() == pytest.approx([g1, g1, g1, g2, g2, g2], abs=1e-6)


def test_bilevel_gae_counts_a_zero_reward_turn_and_token_discount():
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]])  # turn 1 earned 0: still a turn
    values = torch.zeros(1, 5)
    adv, _ = bilevel_gae_advantages(rewards, values, mask, [[1, 4]], gamma=0.5, lam=1.0, turn_gamma=0.9)
    # G2 = 1, G1 = 0 + 0.9 * V(e2) - 0 + 0.9 * A2 = 0.9; inside turns the token discount 0.5 applies
    assert adv[0].tolist() == pytest.approx([0.45, 0.9, 0.0, 0.5, 1.0])


def test_masked_whiten():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, -7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    w = masked_whiten(x, mask)
    vals = w[mask.bool()]
    assert vals.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert vals.std().item() == pytest.approx(1.0, abs=1e-4)
    assert w[0, 2].item() == 0.0 and w[1, 2].item() == 0.0
