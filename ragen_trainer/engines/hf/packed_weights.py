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

*Float32 weights use MKL's pack where ``torch`` has MKL* (``torch.ops.mkl._mkl_reorder_linear_weight`` /
``_mkl_linear``, :data:`FLOAT32_PACKS`): at a decode step's row counts its product is faster than oneDNN's. The 210
products of SmolLM2's 30 layers take 40 against 62 ms at 8 rows, 34 against 55 at 1, 65 against 88 at 32, 131 against
153 at 64 (two threads, 2026-11-29, docs/rollouts.md); at prefill's hundreds of rows it is about 5 % slower (446
against 423 ms at 256), which costs a step less than decode gains. ``torch`` calls MKL's packed product only when the
rows equal the ``batch_size`` it is given and otherwise runs the plain product; MKL's pack of a weight does not depend
on the row count (the same size, and bit-identical products, whatever count it was made for: tested), so each call
passes its own row count and every product multiplies by the one pack. (Before 2026-11-28 the packs were MKL's with a
fixed count of 32, which silently fell back to the plain product at every other: batch 8 and every shrinking batch
never used them; from then until 2026-11-29 they were oneDNN's.) bfloat16 weights use oneDNN's (MKL has no bfloat16
pack). Each library sums in another order than ``F.linear``'s ``sgemm``: float32 results differ from ``F.linear``'s
by float rounding (about 1e-6 relative); bfloat16 results are the same (tests check both on the machine at hand). The
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

#: The row count a weight is packed for: oneDNN's layout hint (any number of rows multiplies by its pack, at the same
#: speed for 8 or 32 rows: measured); MKL's pack is the same whatever the count (module docstring).
PACK_ROWS_HINT = 32
#: The weight dtypes packed: float32 and (where the CPU has it) bfloat16.
PACKED_DTYPES = (torch.float32, torch.bfloat16)
#: Which library packs float32 weights: ``"mkl"`` (where ``torch`` has MKL's packed GEMM, else oneDNN) or ``"onednn"``
#: (module docstring). bfloat16 weights are always oneDNN's.
FLOAT32_PACKS = ("mkl", "onednn")

#: A weight as it was packed: the tensor, its storage address and its version counter.
Fingerprint = tuple[torch.Tensor, int, int]
#: Packs kept between sessions, per model: layer -> (the weight's fingerprint when packed, the packed copy, whether it is
#: MKL's).
_kept: WeakKeyDictionary[Any, dict[torch.nn.Linear, tuple[Fingerprint, torch.Tensor, bool]]] = WeakKeyDictionary()


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


def has_mkl_packs() -> bool:
    """Whether this ``torch`` has MKL's packed GEMM (float32)."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def _packable(dtype: torch.dtype) -> bool:
    # bfloat16 only where oneDNN has bf16 kernels for this CPU (AVX512-BF16 / AMX).
    return dtype in PACKED_DTYPES and (dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedWeights:
    """Every float32 / bfloat16 ``nn.Linear`` of ``model`` multiplies by a packed copy of its weight until
    :meth:`restore`: MKL's for float32 weights (``float32_packs="onednn"``: oneDNN's), oneDNN's for bfloat16.

    The layers keep their parameters (gradients, state dicts and ``named_parameters`` see nothing new); only the
    instance's ``forward`` is replaced, and :meth:`restore` removes it again. ``keep``: leave the packed copies with
    the model for the next session (module docstring); ``packed`` counts the layers packed here (the rest reused)."""

    def __init__(self, model: Any, *, keep: bool = False, float32_packs: str = "mkl") -> None:
        if float32_packs not in FLOAT32_PACKS:
            raise ValueError(f"invalid argument float32_packs={float32_packs!r}: expected one of {FLOAT32_PACKS}")
        self.model, self.keep = model, keep
        self.mkl = float32_packs == "mkl" and has_mkl_packs()
        self.layers: list[torch.nn.Linear] = []
        self.copies: dict[torch.nn.Linear, tuple[Fingerprint, torch.Tensor, bool]] = {}
        self.packed = 0
        kept = _kept.pop(model, {})  # taken either way: a session that does not keep drops the model's old packs
        if not keep:
            kept = {}
        for module in model.modules():
            weight = module.weight if isinstance(module, torch.nn.Linear) else None
            if weight is not None and weight.device.type == "cpu" and _packable(weight.dtype) and not weight.is_meta:
                fingerprint = _fingerprint(module.weight)
                old = kept.get(module)
                mkl = self.mkl and weight.dtype == torch.float32
                if old is not None and old[0][0] is module.weight and old[0][1:] == fingerprint[1:] and old[2] == mkl:
                    copy = old[1]
                else:
                    copy = _pack(module.weight.detach(), mkl)
                    self.packed += 1
                self.copies[module] = (fingerprint, copy, mkl)
                module.forward = (_mkl_forward if mkl else _onednn_forward)(module, copy)  # type: ignore[method-assign]
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


def _pack(weight: torch.Tensor, mkl: bool) -> torch.Tensor:
    if mkl:
        return torch.ops.mkl._mkl_reorder_linear_weight(weight, PACK_ROWS_HINT)
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS_HINT)


def _falls_back(module: torch.nn.Linear, inputs: torch.Tensor) -> bool:
    """A call the packed product cannot serve: gradients on (it has no backward), autocast (whose dtype rules apply)
    or an input of another dtype (``F.linear`` refuses it as it would unpacked)."""
    return inputs.dtype != module.weight.dtype or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu")


def _onednn_forward(module: torch.nn.Linear, packed: torch.Tensor) -> Any:
    bias = module.bias.detach() if module.bias is not None else None

    def forward(inputs: torch.Tensor) -> torch.Tensor:
        if _falls_back(module, inputs):
            return torch.nn.functional.linear(inputs, module.weight, module.bias)
        return torch.ops.mkldnn._linear_pointwise(inputs, packed, bias, "none", [None], "")

    return forward


def _mkl_forward(module: torch.nn.Linear, packed: torch.Tensor) -> Any:
    bias = module.bias.detach() if module.bias is not None else None
    weight = module.weight.detach()

    def forward(inputs: torch.Tensor) -> torch.Tensor:
        rows = inputs.numel() // inputs.shape[-1] if inputs.shape[-1] else 0
        if rows == 0 or _falls_back(module, inputs):
            return torch.nn.functional.linear(inputs, module.weight, module.bias)
        # ``rows`` as the pack's row count: torch runs MKL's packed product only when the two are equal, and the pack
        # serves any count (module docstring).
        out = torch.ops.mkl._mkl_linear(inputs.reshape(rows, -1).contiguous(), packed, weight, bias, rows)
        return out.reshape(*inputs.shape[:-1], out.shape[-1])

    return forward
