"""Linear layers with pre-packed weights while a session samples (CPU, float32 or bfloat16): the same products up to
float rounding, faster.

A decode step multiplies a few dozen rows by every weight matrix of the model. At that size a plain ``F.linear``
spends much of its time re-laying out the weight for the CPU's vector units on every call; oneDNN can lay a weight out
once (``torch.ops.mkldnn._reorder_linear_weight``) and multiply by the packed copy afterwards
(``torch.ops.mkldnn._linear_pointwise``: what ``torch.compile``'s CPU backend uses for frozen linear weights). Any
number of rows multiplies by the packed copy, so a decode batch that shrinks as replies finish (27 rows, then 19, ...)
keeps the fast path. Measured on this project's 2-core CPU, one thread (docs/rollouts.md): a ``[13, 576] x [576,
1536]`` product 650 -> 261 us, the ``[8, 576] x [576, 49152]`` language-model head 26.4 -> 10.8 ms; in bfloat16 (this
CPU's AVX512-BF16) 1.2-1.5x too.

MKL's packed GEMM (``torch.ops.mkl._mkl_linear``, used here before) is as fast at exactly the row count it was packed
for and silently falls back to the plain product at every other one: at batch 8 and in every shrinking batch the
packs did nothing. oneDNN sums in another order than MKL's ``sgemm``: float32 results differ from ``F.linear``'s by
float rounding (about 1e-6 relative); bfloat16 results are the same (tests check both on the machine at hand). The
training pass never sees a packed product: the old-log-prob pass recomputes the rollout's log-probabilities.

:class:`PackedWeights` packs every float32 / bfloat16 ``nn.Linear`` of a model on the CPU when a session opens (the
weights are the live ones: a training step between sessions is picked up by the next pack) and gives the layers back
when it closes. A pack costs about as much as one decode step and holds a second copy of the weights while the session
is open. A call with gradients on (the packed product has no backward), under ``torch.autocast`` (autocast's dtype
rules apply there) or with an input of another dtype falls back to ``F.linear``; a model on another device, in
another dtype, or a ``torch`` built without oneDNN is not packed at all.

Packs kept between sessions (``keep=True``: a model in eval mode, as evaluation and benchmarks use it): the packed
copies stay with the model after a session closes and the next session reuses each one whose weight is unchanged (the
same tensor, storage and version counter: an optimizer step or ``load_state_dict`` writes in place and bumps it),
so a run of many short sessions packs once. A model in training mode (the trainer's policy between updates) keeps
nothing: its weights change every step, and a stale copy would only hold memory through the update.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

import torch

#: The row-count hint oneDNN lays a weight out for (any number of rows multiplies by the packed weight, at the same
#: speed for 8 or 32 rows: measured).
PACK_ROWS_HINT = 32
#: The weight dtypes packed: oneDNN's float32 and (where the CPU has it) bfloat16 products.
PACKED_DTYPES = (torch.float32, torch.bfloat16)

#: A weight as it was packed: the tensor, its storage address and its version counter.
Fingerprint = tuple[torch.Tensor, int, int]
#: Packs kept between sessions, per model: layer -> (the weight's fingerprint when packed, the packed copy).
_kept: WeakKeyDictionary[Any, dict[torch.nn.Linear, tuple[Fingerprint, torch.Tensor]]] = WeakKeyDictionary()


def can_pack(model: Any) -> bool:
    """Whether :class:`PackedWeights` speeds up ``model``: float32 (or, on a CPU with bfloat16 support, bfloat16)
    weights on a CPU and a ``torch`` with oneDNN."""
    try:
        parameter = next(model.parameters())
    except StopIteration:
        return False
    return (
        parameter.device.type == "cpu"
        and _packable(parameter.dtype)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def _packable(dtype: torch.dtype) -> bool:
    # bfloat16 only where oneDNN has bf16 kernels for this CPU (AVX512-BF16 / AMX).
    return dtype in PACKED_DTYPES and (dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedWeights:
    """Every float32 / bfloat16 ``nn.Linear`` of ``model`` multiplies by a oneDNN-packed copy of its weight until
    :meth:`restore`.

    The layers keep their parameters (gradients, state dicts and ``named_parameters`` see nothing new); only the
    instance's ``forward`` is replaced, and :meth:`restore` removes it again. ``keep``: leave the packed copies with
    the model for the next session (module docstring); ``packed`` counts the layers packed here (the rest reused)."""

    def __init__(self, model: Any, *, keep: bool = False) -> None:
        self.model, self.keep = model, keep
        self.layers: list[torch.nn.Linear] = []
        self.copies: dict[torch.nn.Linear, tuple[Fingerprint, torch.Tensor]] = {}
        self.packed = 0
        kept = _kept.pop(model, {})  # taken either way: a session that does not keep drops the model's old packs
        if not keep:
            kept = {}
        for module in model.modules():
            weight = module.weight if isinstance(module, torch.nn.Linear) else None
            if weight is not None and weight.device.type == "cpu" and _packable(weight.dtype) and not weight.is_meta:
                fingerprint = _fingerprint(module.weight)
                old = kept.get(module)
                if old is not None and old[0][0] is module.weight and old[0][1:] == fingerprint[1:]:
                    copy = old[1]
                else:
                    copy = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), PACK_ROWS_HINT)
                    self.packed += 1
                self.copies[module] = (fingerprint, copy)
                module.forward = _packed_forward(module, copy)  # type: ignore[method-assign]
                self.layers.append(module)

    def restore(self) -> None:
        """Give every layer its own ``forward`` back; the packed copies are dropped, or kept with ``keep``."""
        for module in self.layers:
            module.__dict__.pop("forward", None)
        if self.keep and self.copies:
            _kept[self.model] = self.copies
        self.layers, self.copies = [], {}


def _fingerprint(weight: torch.Tensor) -> Fingerprint:
    """What a packed copy was made from: the tensor itself (held, so that no new tensor can take its place unseen),
    its storage and its version (bumped by every in-place write)."""
    return weight, weight.data_ptr(), weight._version


def _packed_forward(module: torch.nn.Linear, packed: torch.Tensor) -> Any:
    bias = module.bias.detach() if module.bias is not None else None
    dtype = packed.dtype

    def forward(inputs: torch.Tensor) -> torch.Tensor:
        if inputs.dtype != dtype or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu"):
            return torch.nn.functional.linear(inputs, module.weight, module.bias)
        return torch.ops.mkldnn._linear_pointwise(inputs, packed, bias, "none", [None], "")

    return forward
