"""Advantages for StarPO's two backbones (RAGEN Sec. 3): GRPO's group-normalised return and PPO's GAE, plus the
reference code's bi-level GAE (turn level, then token level).

Tensors are laid out per *action position*: ``[B, T]`` where position ``t`` is a token of the conversation, and
``mask[b, t] == 1`` on the trained tokens (the config's ``loss_mask``): under ``replies`` exactly the model's own
tokens, and environment tokens are not actions: GAE skips them, so the value that bootstraps the last token of turn k
is the value at the first token of turn k+1 (whose state includes the environment's reply). Under ``after_system`` (the
paper's runs) every token after the system prompt is trained and GAE runs over all of them, as verl's does. Everything here runs under ``torch.no_grad``: advantages are targets.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


# ------------------------------------------------------------------------------------------------ GRPO
@torch.no_grad()
def grpo_advantages(
    returns: torch.Tensor, group_ids: Sequence[int] | torch.Tensor, *, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO outcome advantage (DeepSeekMath, Sec. 4.1.2; RAGEN Sec. 3, "GRPO backbone"):

        A_i = (R_i - mean_{j in G(i)} R_j) / (std_{j in G(i)} R_j + eps)

    over the rollouts G(i) that share i's initial state. ``std`` is the unbiased sample std (as the reference code,
    torch's default). ``norm_by_std=False`` only centres (Dr. GRPO). A group of one has no baseline: advantage 0.
    Returns one advantage per trajectory, ``[B]``; the trainer broadcasts it to every model token.
    """
    returns = returns.float()
    gids = torch.as_tensor(list(group_ids) if not isinstance(group_ids, torch.Tensor) else group_ids)
    adv = torch.zeros_like(returns)
    for g in torch.unique(gids):
        idx = (gids == g).nonzero(as_tuple=True)[0]
        r = returns[idx]
        if len(idx) < 2:
            continue
        centred = r - r.mean()
        adv[idx] = centred / (r.std() + eps) if norm_by_std else centred
    return adv


# ------------------------------------------------------------------------------------------------ GAE
@torch.no_grad()
def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE over the model's tokens (Schulman et al. 2016, eq. 16; RAGEN Sec. 3, "PPO backbone"):

        delta_t = r_t + gamma * V(s_{t'}) - V(s_t)          (t' = the next model token, V = 0 after the last)
        A_t     = delta_t + gamma * lam * A_{t'}
        R_t     = A_t + V(s_t)                              (the value target)

    Positions with ``mask == 0`` (prompt, environment text, padding) are skipped and get advantage and return 0.
    With the paper's gamma = lambda = 1, A_t = (sum of rewards from t on) - V(s_t).
    Returns ``(advantages, returns)``, both ``[B, T]``, not whitened (see :func:`masked_whiten`).
    """
    rewards, values, m = token_rewards.float(), values.float(), mask.float()
    batch, length = rewards.shape
    adv = torch.zeros_like(rewards)
    last_gae = torch.zeros(batch, dtype=rewards.dtype, device=rewards.device)
    next_value = torch.zeros_like(last_gae)
    for t in range(length - 1, -1, -1):
        on = m[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        gae = delta + gamma * lam * last_gae
        # Only model tokens advance the recursion; other positions leave the carried values untouched.
        last_gae = torch.where(on, gae, last_gae)
        next_value = torch.where(on, values[:, t], next_value)
        adv[:, t] = torch.where(on, gae, torch.zeros_like(gae))
    returns = (adv + values) * m
    return adv, returns


@torch.no_grad()
def bilevel_gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    turn_ends: Sequence[Sequence[int]],
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    turn_gamma: float = 0.95,
    turn_lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bi-level GAE of the reference code (RAGEN's ``compute_bi_level_gae_advantage_return``).

    High level, one step per turn k with its last token e_k (the agentic MDP):

        delta_k = r_{e_k} + turn_gamma * V(e_{k+1}) - V(e_k)        (V(e_{K+1}) = 0)
        A_k     = delta_k + turn_gamma * turn_lam * A_{k+1},   G_k = A_k + V(e_k)

    Low level, inside each turn (the token MDP): token GAE with ``gamma``/``lam`` whose only reward is G_k on the
    turn's last token and which does not bootstrap past it. Unlike the reference, turn ends are given explicitly
    rather than found as the positions of non-zero rewards, so a turn whose reward is 0 is still a turn.
    Returns ``(advantages, returns)``, ``[B, T]``, not whitened.
    """
    rewards, values, m = token_rewards.float(), values.float(), mask.float()
    adv = torch.zeros_like(rewards)
    ret = torch.zeros_like(rewards)
    for b, ends in enumerate(turn_ends):
        if not ends:
            continue
        # High level: over turn ends only.
        turn_returns = [0.0] * len(ends)
        last = 0.0
        for k in range(len(ends) - 1, -1, -1):
            next_v = float(values[b, ends[k + 1]]) if k + 1 < len(ends) else 0.0
            delta = float(rewards[b, ends[k]]) + turn_gamma * next_v - float(values[b, ends[k]])
            last = delta + turn_gamma * turn_lam * last
            turn_returns[k] = last + float(values[b, ends[k]])
        # Low level: token GAE inside each turn, the turn's return as the reward on its last token.
        positions = (m[b] > 0).nonzero(as_tuple=True)[0].tolist()
        end_set = {e: k for k, e in enumerate(ends)}
        last = 0.0
        next_v = 0.0
        for pos in reversed(positions):
            if pos in end_set:
                r, next_v, last = turn_returns[end_set[pos]], 0.0, 0.0
            else:
                r = 0.0
            delta = r + gamma * next_v - float(values[b, pos])
            last = delta + gamma * lam * last
            adv[b, pos] = last
            ret[b, pos] = last + float(values[b, pos])
            next_v = float(values[b, pos])
    return adv, ret


@torch.no_grad()
def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the masked entries (unbiased variance, as the reference); 0 elsewhere."""
    m = mask.float()
    n = m.sum()
    if n < 2:
        return x * m
    mean = (x * m).sum() / n
    var = (((x - mean) ** 2) * m).sum() / (n - 1)
    return (x - mean) * torch.rsqrt(var + eps) * m
