"""HFEngine's sampler: one token per row from the model's last logits, with its log-probability.

Each request has its own ``torch.Generator`` seeded from its ``seed`` (or from torch's global RNG when ``None``):
a reply does not depend on which other requests share its batch, so replies are reproducible under continuous
batching. Log-probabilities are ``log_softmax(logits / temperature)`` of the sampled token before top-k / top-p (the
quantity TRL's trainers compute for the old policy; temperature 1 when greedy), as the ``hf-generate`` engine records
them.
"""

from __future__ import annotations

from typing import Any

import torch

from ragen_trainer.engines.base import SamplingParams

#: Vocabulary entries per block of :func:`inverse_cdf_sample`.
CDF_BLOCK = 256


class Sampler:
    """Samples with ``params``; records log-probabilities when ``compute_logprobs``."""

    def __init__(self, params: SamplingParams, *, compute_logprobs: bool) -> None:
        self.params = params
        self.compute_logprobs = compute_logprobs

    def sample(self, logits: Any, generators: list[Any]) -> tuple[list[int], list[float] | None]:
        """One token per row of ``logits`` ``[rows, vocab]`` (row ``i`` drawing from ``generators[i]``), and each
        token's log-probability (``None`` when not recorded)."""
        params = self.params
        logits = logits.float()
        scaled = logits / params.temperature if params.temperature > 0 and params.temperature != 1.0 else logits
        logp = torch.log_softmax(scaled, dim=-1) if self.compute_logprobs else None
        if params.greedy:
            chosen = logits.argmax(dim=-1)
        else:
            unfiltered = params.top_k == 0 and params.top_p >= 1.0
            if logp is not None and unfiltered:
                probs = logp.exp()  # the sampling distribution is the one the log-probs are taken from
            else:
                probs = torch.softmax(top_k_top_p(logits / params.temperature, params.top_k, params.top_p), dim=-1)
            chosen = inverse_cdf_sample(probs, generators)
        picked = logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).tolist() if logp is not None else None
        return [int(token) for token in chosen.tolist()], picked


def row_generator(seed: int | None, device: Any) -> Any:
    """The random stream of one request: seeded with ``seed``, or with a draw from torch's global RNG when ``None``
    (``torch.manual_seed`` then reproduces it)."""
    generator = torch.Generator(device=device)
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    generator.manual_seed(int(seed))
    return generator


def inverse_cdf_sample(probs: Any, generators: list[Any]) -> Any:
    """One token per row of ``probs`` ``[rows, vocab]``, row ``i`` drawing its uniform number from ``generators[i]``.

    Inverse-CDF sampling, batched and exact (in float64): the token is the first whose cumulative probability exceeds
    ``u`` times the total. ``torch.multinomial`` per row costs ~1 ms each on a 49k vocabulary, and a float64 cumsum
    over the whole vocabulary is a long sequential scan; instead the vocabulary is cut into blocks of
    :data:`CDF_BLOCK`: block sums find the block, and a cumsum inside that block alone finds the token.
    """
    rows, vocab = probs.shape
    uniforms = torch.stack([torch.rand((), generator=g, device=probs.device) for g in generators]).double()
    blocks = -(-vocab // CDF_BLOCK)
    padded = torch.nn.functional.pad(probs, (0, blocks * CDF_BLOCK - vocab)).view(rows, blocks, CDF_BLOCK)
    cumulative = padded.sum(-1, dtype=torch.float64).cumsum(-1)  # [rows, blocks]
    targets = (uniforms * cumulative[:, -1]).unsqueeze(-1)
    block = torch.searchsorted(cumulative, targets, right=True).squeeze(-1).clamp_(max=blocks - 1)
    before = cumulative.gather(-1, (block - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1) * (block > 0)
    inside = padded[torch.arange(rows, device=probs.device), block]  # [rows, block size]
    offset = torch.searchsorted(inside.double().cumsum(-1) + before.unsqueeze(-1), targets, right=True).squeeze(-1)
    # Rounding can leave the target past the block's last partial sum: take the block's last token that can be drawn
    # (never a zero-probability one, such as a token top-k / top-p filtered out).
    columns = torch.arange(CDF_BLOCK, device=probs.device)
    last = torch.where(inside > 0, columns, -1).amax(-1)
    offset = torch.where(offset >= CDF_BLOCK, last, offset)
    return (block * CDF_BLOCK + offset).clamp_(max=vocab - 1)


def top_k_top_p(logits: Any, top_k: int, top_p: float) -> Any:
    """Top-k then top-p (nucleus) filtering of ``[rows, vocab]`` logits (``-inf`` outside), as ``transformers`` does."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False, dim=-1)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1 - top_p)
        drop_sorted[:, -1] = False  # always keep the most likely token
        logits = logits.masked_fill(drop_sorted.scatter(1, order, drop_sorted), float("-inf"))
    return logits
