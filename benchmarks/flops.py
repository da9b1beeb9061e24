"""Model FLOPs of a training update, counted from what the model was given, and the machine's measured matmul peak.

:class:`UpdateFlops` hooks a causal LM's ``forward`` (and a separate value model's) and, for every call made with
gradients on (the update's forward passes; scoring and generation run without them), counts what the call computes,
forward and backward:

    FLOPs = 6 * N * T  +  12 * layers * d_attn * P  +  6 * d * V * H

* ``N``: the non-embedding parameters of the transformer (every parameter of the decoder but its input embeddings:
  the layers' projections, MLPs and norms); ``T``: the token positions run through it. 2 FLOPs per parameter per token
  forward, 4 backward (the gradients of the inputs and of the weights), as Kaplan et al. count.
* ``P``: the query-key pairs attention computes in each layer, only the ones the mask allows (causal; ragen's packed
  rows: a trajectory's own tokens attend to its group's prefix and causally to themselves); ``d_attn``: heads x head
  size. ``Q K^T`` and ``A V`` are ``2 * d_attn`` FLOPs per pair each, forward; the backward twice that.
* ``H``: the positions whose logits the LM head computes, ``d x V`` (hidden size x vocabulary) each: ragen's only at
  trained positions (:class:`ragen_trainer.critic.PolicyWithCritic` runs the model's forward with its LM head on no
  position, then the head on the packed layout's ``select``, :func:`ragen_trainer.critic.chunked_token_logprobs`);
  TRL's fused LM head on a CPU every position of every row (``trl.trainer.utils.add_fused_lm_head`` scores only the
  labelled ones where Triton runs).
* A separate value model (ragen's ``critic: value_model``) adds its own ``6 * N * T`` and attention on the same tokens.

These are *model* FLOPs: work the model needs, not what the hardware executed. A padded batch's padding positions
count in ``T`` (the linear layers run on them) but not in ``P``; a forward recomputed by activation checkpointing in
the backward pass (``gradient_checkpointing``, and the LM-head chunks ragen recomputes) is **not** counted, so with
checkpointing on the hardware did about 8/6 of these FLOPs. Elementwise work (norms, activations, softmax, the
optimizer) is left out, as in every MFU count.

:func:`matmul_peak` measures the machine's matrix-product rate (float32 by default) on the current torch threads (the fastest of a
few ``n x n`` products): the ceiling the update's FLOP rate is held against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ragen_trainer.critic import CRITIC_ATTR, ValueModel
from ragen_trainer.packing import LAYOUT_KWARG, PackedBatch


@dataclass(frozen=True)
class ModelDims:
    """The sizes the FLOP formula needs (see the module docstring)."""

    non_embedding_params: int
    layers: int
    attention_width: int
    """heads x head size: the width of ``Q K^T`` and ``A V``."""
    hidden: int
    vocab: int

    @classmethod
    def of(cls, decoder: torch.nn.Module, config: Any, vocab: int, module: torch.nn.Module | None = None) -> ModelDims:
        """The dims of a transformers decoder (the backbone: embeddings, layers, final norm) with ``config``;
        ``module`` (default the decoder) is what holds the parameters counted, the decoder's embeddings left out."""
        embeddings = decoder.get_input_embeddings().weight.numel()
        params = sum(p.numel() for p in (module or decoder).parameters()) - embeddings
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        return cls(params, int(config.num_hidden_layers), heads * head_dim, int(config.hidden_size), vocab)

    def flops(self, tokens: int, pairs: int, head_positions: int) -> int:
        """Forward + backward model FLOPs of ``tokens`` positions, ``pairs`` attended pairs per layer and
        ``head_positions`` LM-head positions."""
        return (6 * self.non_embedding_params * tokens + 12 * self.layers * self.attention_width * pairs
                + 6 * self.hidden * self.vocab * head_positions)


def _text_config(model: torch.nn.Module) -> Any:
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def policy_dims(model: torch.nn.Module) -> ModelDims:
    """The dims of a causal LM (its decoder and its LM head)."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    return ModelDims.of(model.get_decoder(), _text_config(model), vocab)


def packed_pairs(layout: PackedBatch) -> int:
    """Query-key pairs of a packed row: each block attends to its prefix and causally to itself."""
    pairs = 0
    for block in layout.blocks:
        n, p = block.end - block.start, block.prefix_end - block.prefix_start
        pairs += n * p + n * (n + 1) // 2
    return pairs


def padded_pairs(attention_mask: torch.Tensor | None, batch: int, length: int) -> int:
    """Causal query-key pairs of a padded batch's real tokens (a row's real tokens are contiguous: left-padded
    prompts, right-padded completions)."""
    if attention_mask is None:
        return batch * length * (length + 1) // 2
    real = attention_mask.sum(dim=-1).tolist()
    return int(sum(n * (n + 1) // 2 for n in real))


def _lm_head_positions(kwargs: dict[str, Any], batch: int, length: int) -> int:
    """Positions the LM head computes in this call (see the module docstring)."""
    keep = kwargs.get("logits_to_keep")
    if isinstance(keep, torch.Tensor):  # positions by index
        layout = kwargs.get(LAYOUT_KWARG)
        if keep.numel() == 0 and isinstance(layout, PackedBatch):  # ragen's policy: its own head on the trained ones
            return int(layout.select.sum())
        return batch * keep.numel()
    if kwargs.get("fused_lm_head"):  # TRL's fused LM head
        labels = kwargs["labels"]
        if _trl_scores_labelled_only(labels.device):
            return int((labels[:, 1:] != -100).sum())
        return batch * (length - 1)
    keep = keep or 0
    return batch * (keep if isinstance(keep, int) and keep > 0 else length)


def _tokens_and_pairs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int] | None:
    """Token positions and attended pairs of a forward call with gradients on; ``None`` for a call not counted."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    if not torch.is_grad_enabled() or ids is None:
        return None
    batch, length = int(ids.shape[0]), int(ids.shape[1])
    layout = kwargs.get(LAYOUT_KWARG)
    pairs = packed_pairs(layout) if isinstance(layout, PackedBatch) else padded_pairs(
        kwargs.get("attention_mask"), batch, length)
    return batch * length, pairs


def _trl_scores_labelled_only(device: torch.device) -> bool:
    """Whether TRL's fused LM head projects only the labelled positions on ``device`` (where Triton runs)."""
    from trl.trainer import utils

    use_triton = getattr(utils, "_use_triton", None)
    return bool(use_triton(device)) if use_triton is not None else device.type == "cuda"


class UpdateFlops:
    """Counts the model FLOPs of ``model``'s forward calls made with gradients on (see the module docstring).

    ``take()`` returns the counts since the last call and starts again; ``close()`` removes the hook.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.dims = policy_dims(model)
        critic = getattr(model, CRITIC_ATTR, None)
        self.critic_dims = None
        if isinstance(critic, ValueModel):
            self.critic_dims = ModelDims.of(critic.backbone, _text_config(model), 0, module=critic)  # + value head
        self._model = model
        self._handles = [model.register_forward_pre_hook(self._count, with_kwargs=True)]
        if self.critic_dims is not None:  # a separate value model runs alone, on the policy's inputs
            self._handles.append(critic.register_forward_pre_hook(self._count_critic, with_kwargs=True))
        self._reset()

    def _reset(self) -> None:
        self.calls = self.tokens = self.pairs = self.head_positions = self.flops = 0

    def _count(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        shape = _tokens_and_pairs(args, kwargs)
        if shape is None:
            return
        tokens, pairs = shape
        ids = kwargs.get("input_ids", args[0] if args else None)
        head = _lm_head_positions(kwargs, int(ids.shape[0]), int(ids.shape[1]))
        self.calls += 1
        self.tokens += tokens
        self.pairs += pairs
        self.head_positions += head
        self.flops += self.dims.flops(tokens, pairs, head)

    def _count_critic(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The value model's own backbone and head on the tokens the policy's call counted."""
        shape = _tokens_and_pairs(args, kwargs)
        if shape is not None:
            self.flops += self.critic_dims.flops(*shape, 0)

    def take(self) -> dict[str, int]:
        """The counts since the last ``take``: ``calls``, ``tokens``, ``pairs``, ``head_positions``, ``flops``."""
        out = {"calls": self.calls, "tokens": self.tokens, "pairs": self.pairs,
               "head_positions": self.head_positions, "flops": self.flops}
        self._reset()
        return out

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def matmul_peak(n: int = 2048, repeats: int = 5, dtype: torch.dtype = torch.float32,
                max_product_s: float = 0.2) -> float:
    """The machine's matmul rate in ``dtype`` in GFLOP/s on the current torch threads: the fastest of ``repeats``
    square products after one warm-up (``2 n^3`` FLOPs each). bfloat16 runs on other units than float32 where
    the CPU has them (AVX-512 BF16, AMX), so each compute dtype has its own peak. The size doubles from 256 up to
    ``n`` while one product takes under ``max_product_s``: where the CPU emulates a dtype (bfloat16 without AVX-512
    BF16 runs at about 1 GFLOP/s on one AVX2 core, 30x below float32) the peak is read off a smaller product in
    seconds instead of a 2048-square one in minutes."""
    torch.mm(torch.randn(64, 64, dtype=dtype), torch.randn(64, 64, dtype=dtype))  # the library's first-call set-up
    size = min(256, n)
    while True:
        a = torch.randn(size, size, dtype=dtype)
        b = torch.randn(size, size, dtype=dtype)
        out = torch.empty(size, size, dtype=dtype)
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)  # also the warm-up
        if size >= n or time.perf_counter() - t0 >= max_product_s:
            break
        size = min(2 * size, n)
    n = size
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


__all__ = ["ModelDims", "UpdateFlops", "matmul_peak", "packed_pairs", "padded_pairs", "policy_dims"]
