"""The losses of StarPO / StarPO-S: clipped policy loss with decoupled clipping, KL to a reference, entropy bonus,
clipped value loss, and how token losses are averaged.

All per-token tensors are ``[B, T]`` with a ``mask`` that is 1 on the trained tokens (the config's ``loss_mask``).
Every aggregate takes an optional ``normalizer``: when a batch is split into micro-batches (and over processes),
passing the whole batch's token (or sequence) count makes the micro-batch losses sum to exactly the loss of the whole
batch. :func:`row_normalizers` computes it per row for every mode, so one code path serves all of them.

The settings that differ between ragen's two references (dual clip, aggregation, KL estimator) have no default here:
:func:`policy_loss` and :func:`value_loss` take the run's :class:`~ragen_trainer.settings.LossSettings` whole
(``StarPOConfig.loss_settings()``), and the lower-level functions take the mode, micro-batch size or estimator as an
argument, so calling them directly never picks a reference silently.
"""

from __future__ import annotations

import torch

from ragen_trainer.settings import LossSettings

AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "micro-token-mean")


def row_normalizers(mask: torch.Tensor, mode: str, *, micro_size: int, world: int = 1) -> torch.Tensor:
    """Per-row denominators that make ``agg_loss(..., normalizer=row_normalizers(...)[rows])`` summed over any split
    of one PPO mini-batch (micro-batches, processes) equal the mini-batch's loss under ``mode``.

    ``mask`` is the whole mini-batch's ``[B, T]`` trained-token mask, rows in the mini-batch's order. Each process
    divides by its share (``world``): data-parallel training averages the processes' gradients, so the sum comes back.

    * ``token-mean``: every row gets the mini-batch's token count;
    * ``seq-mean-token-mean`` / ``seq-mean-token-sum``: every row gets the count of rows that have a trained token;
    * ``micro-token-mean`` (the paper's runs: verl ``797f999``'s ``dp_actor.update_policy`` with
      ``micro_batch_size_per_gpu: 4``): the rows are cut, in order, into micro-batches of ``micro_size``; a row gets
      its micro-batch's token count times the number of micro-batches, so the loss is the mean over micro-batches of
      each micro-batch's token mean. The reference divides by its configured accumulation count
      (``ppo_mini_batch_size // micro_batch_size_per_gpu``) even for a short last mini-batch; here the count is the
      mini-batch's own (the same whenever the mini-batch is full, as in all of ``train_all.sh``'s runs).

    Returns a float ``[B]`` tensor (a row without a trained token gets the same denominator as its neighbours; its
    numerator is 0 anyway).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"invalid argument loss_agg_mode={mode!r}: expected one of {list(AGG_MODES)}")
    if not (isinstance(micro_size, int) and micro_size >= 1):
        raise ValueError(f"invalid argument micro_size={micro_size!r}: expected an int >= 1")
    m = mask.float()
    rows = m.shape[0]
    per_row = m.sum(-1)
    if mode == "token-mean":
        out = per_row.sum().clamp(min=1.0).expand(rows).clone()
    elif mode == "micro-token-mean":
        n_micro = max(1, -(-rows // micro_size))
        out = torch.empty(rows, dtype=torch.float32, device=mask.device)
        for start in range(0, rows, micro_size):
            tokens = per_row[start : start + micro_size].sum().clamp(min=1.0)
            out[start : start + micro_size] = tokens * n_micro
    else:
        out = (per_row > 0).float().sum().clamp(min=1.0).expand(rows).clone()
    return out / world


def agg_loss(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    normalizer: float | torch.Tensor | None = None,
    micro_size: int | None = None,
) -> torch.Tensor:
    """Reduce per-token ``loss`` over ``mask``.

    * ``token-mean``: sum over all trained tokens / number of trained tokens (DAPO's choice);
    * ``seq-mean-token-mean``: mean over sequences of each sequence's token mean (the original GRPO; the later
      reference's effective aggregation: verl's ``token-mean`` over micro-batches of one sequence each, divided by the
      gradient-accumulation count);
    * ``seq-mean-token-sum``: mean over sequences of each sequence's token sum (Dr. GRPO style);
    * ``micro-token-mean``: the rows cut in order into micro-batches of ``micro_size``, the mean over micro-batches of
      each micro-batch's token mean (the paper's runs: verl's token mean over micro-batches of 4 sequences, each
      divided by the accumulation count).

    ``normalizer`` replaces the denominator: a number (token count for ``token-mean``, sequence count for the
    ``seq-mean`` modes; ``micro-token-mean`` needs per-row values), or a ``[B]`` tensor of per-row denominators
    (:func:`row_normalizers`), which works for every mode: the loss is then ``sum over rows of row numerator / row
    denominator``, the numerator being the row's token sum (``token-mean``, ``micro-token-mean``,
    ``seq-mean-token-sum``) or its token mean (``seq-mean-token-mean``).

    ``micro_size`` (the config's ``loss_agg_micro_size``, which differs between the references) is needed only by
    ``micro-token-mean`` without a ``normalizer``; that case without it is a ``ValueError``.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"invalid argument loss_agg_mode={mode!r}: expected one of {list(AGG_MODES)}")
    m = mask.to(loss.dtype)
    if isinstance(normalizer, torch.Tensor) and normalizer.dim() > 0:
        sums = (loss * m).sum(-1)
        if mode == "seq-mean-token-mean":
            sums = sums / m.sum(-1).clamp(min=1.0)
        return (sums / normalizer.to(sums)).sum()
    if mode == "micro-token-mean":
        if normalizer is not None:
            raise ValueError("loss_agg_mode='micro-token-mean' needs per-row normalizers (row_normalizers), not a "
                             "single number")
        if micro_size is None:
            raise ValueError("loss_agg_mode='micro-token-mean' without normalizers needs micro_size (the config's "
                             "loss_agg_micro_size)")
        return agg_loss(loss, mask, mode, row_normalizers(mask, mode, micro_size=micro_size))
    if mode == "token-mean":
        denom = m.sum().clamp(min=1.0) if normalizer is None else normalizer
        return (loss * m).sum() / denom
    if mode == "seq-mean-token-mean":
        per_seq = (loss * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    else:  # seq-mean-token-sum
        per_seq = (loss * m).sum(-1)
    has_tokens = (m.sum(-1) > 0).to(loss.dtype)
    denom = has_tokens.sum().clamp(min=1.0) if normalizer is None else normalizer
    return (per_seq * has_tokens).sum() / denom


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    *,
    normalizer: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate (Schulman et al. 2017, eq. 7) with decoupled clipping (DAPO's clip-higher; StarPO-S)
    and dual clipping (Ye et al. 2020, the later reference's ``clip_ratio_c``; ``clip_ratio_c=0`` turns it off, as in
    the paper-era actor, RAGEN ``3059df8`` ``ragen/workers/actor/dp_actor.py`` ``compute_policy_loss``):

        ratio_t = exp(log pi(a_t|s_t) - log pi_old(a_t|s_t))
        L_t     = -min(ratio_t * A_t, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A_t)
        L_t     = min(L_t, -clip_ratio_c * A_t)            where A_t < 0  (a huge ratio cannot blow the loss up)

    ``settings`` gives ``clip_low``, ``clip_high``, ``clip_ratio_c`` and the aggregation (``loss_agg_mode``,
    ``loss_agg_micro_size``; ``normalizer`` as :func:`agg_loss`'s).

    Returns the aggregated loss and detached stats, each over the mask: ``clipfrac`` (tokens whose clipped term was
    taken), ``clipfrac_high`` (ratio above ``1 + clip_high`` with A > 0), ``clipfrac_low`` (ratio below
    ``1 - clip_low`` with A < 0), ``clipfrac_dual`` (A < 0 and the dual bound taken), ``approx_kl`` (token mean of
    ``old - new`` log-probs), ``ratio_mean``, ``ratio_min``, ``ratio_max``.
    """
    clip_low, clip_high, clip_ratio_c = settings.clip_low, settings.clip_high, settings.clip_ratio_c
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual_on = clip_ratio_c > 0
    dual_bound = -advantages * clip_ratio_c
    if dual_on:
        per_token = torch.where(advantages < 0, torch.minimum(per_token, dual_bound), per_token)
    loss = agg_loss(per_token, mask, settings.loss_agg_mode, normalizer, settings.loss_agg_micro_size)
    with torch.no_grad():
        m = mask.float()
        n = m.sum().clamp(min=1.0)
        on = mask > 0
        high = ((ratio > 1.0 + clip_high) & (advantages > 0)).float()
        low = ((ratio < 1.0 - clip_low) & (advantages < 0)).float()
        dual = ((torch.maximum(unclipped, clipped) > dual_bound) & (advantages < 0)).float() * float(dual_on)
        picked = ratio[on] if bool(on.any()) else ratio.new_ones(1)
        stats = {
            "clipfrac": ((clipped > unclipped).float() * m).sum() / n,
            "clipfrac_high": (high * m).sum() / n,
            "clipfrac_low": (low * m).sum() / n,
            "clipfrac_dual": (dual * m).sum() / n,
            "approx_kl": (-log_ratio * m).sum() / n,
            "ratio_mean": (ratio * m).sum() / n,
            "ratio_min": picked.min(),
            "ratio_max": picked.max(),
        }
    return loss, stats


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL Divergence"):

    * ``k1``: ``log pi - log pi_ref`` (unbiased, high variance, can be negative);
    * ``k3``: ``exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1`` (unbiased, >= 0; the reference's
      ``low_var_kl``, clamped to [-10, 10] as there).
    """
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k3":
        delta = torch.clamp(ref_logprobs - logprobs, -20.0, 20.0)
        return torch.clamp(torch.exp(delta) - delta - 1.0, -10.0, 10.0)
    raise ValueError(f"invalid argument kl_estimator={estimator!r}: expected 'k1' or 'k3'")


def entropy_from_logits(logits: torch.Tensor, log_z: torch.Tensor | None = None) -> torch.Tensor:
    """Per-position entropy of the categorical distribution ``softmax(logits)``: ``logsumexp(z) - sum(p * z)``.
    ``log_z``, when the caller already has ``logsumexp(logits)``, saves computing it again."""
    logits = logits.float()
    if log_z is None:
        log_z = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    # a dot product per position: no [positions, vocab] product tensor written and read back
    return log_z - torch.linalg.vecdot(probs, logits)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    *,
    normalizer: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (PPO2 / the reference's critic), with ``clip`` = ``settings.value_clip`` and the
    aggregation of ``settings`` (``normalizer`` as :func:`agg_loss`'s):

        V_clip = V_old + clip(V - V_old, -clip, clip)
        L_t    = 0.5 * max((V - R)^2, (V_clip - R)^2)

    Returns the aggregated loss and stats (``vf_clipfrac``: share of tokens where the clipped term was larger).
    """
    clip = settings.value_clip
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (clipped - returns) ** 2
    per_token = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
    loss = agg_loss(per_token, mask, settings.loss_agg_mode, normalizer, settings.loss_agg_micro_size)
    m = mask.float()
    with torch.no_grad():
        stats = {"vf_clipfrac": ((loss_clipped > loss_unclipped).float() * m).sum() / m.sum().clamp(min=1.0)}
    return loss, stats
