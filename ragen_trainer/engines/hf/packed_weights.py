"""Linear layers with pre-packed weights while a session samples (CPU, float32): the same products, faster.

A decode step multiplies a few dozen rows by every weight matrix of the model. At that size a plain ``F.linear``
spends much of its time re-laying out the weight for the CPU's vector units on every call; MKL can lay a weight out
once (``cblas_sgemm_pack``) and multiply by the packed copy afterwards, which ``torch`` exposes as
``torch.ops.mkl._mkl_reorder_linear_weight`` / ``torch.ops.mkl._mkl_linear`` (what ``torch.compile``'s CPU backend
uses for frozen linear weights). Measured on this project's 2-core CPU, one thread: a ``[32, 576] x [576, 1536]``
product 577 -> 398 us, the ``[32, 576] x [576, 49152]`` language-model head 26.9 -> 19.7 ms; the results are the
same floats as ``F.linear``'s (both run MKL's sgemm; tests check it on the machine at hand).

:class:`PackedWeights` packs every float32 ``nn.Linear`` of a model on the CPU when a session opens (the weights
are the live ones: a training step between sessions is picked up by the next pack) and gives the layers back when it
closes. A pack costs about as much as one decode step and holds a second copy of the weights while the session is
open. A call with gradients on (the packed product has no backward) or under ``torch.autocast`` (autocast's dtype
rules apply there) falls back to ``F.linear``; a model that is not float32 on a CPU, or a ``torch`` built without
MKL, is not packed at all.
"""

from __future__ import annotations

from typing import Any

import torch

#: The batch-size hint MKL packs for (any number of rows multiplies correctly by the packed weight).
PACK_ROWS_HINT = 32


def can_pack(model: Any) -> bool:
    """Whether :class:`PackedWeights` speeds up ``model``: float32 weights on a CPU and a ``torch`` with MKL."""
    try:
        parameter = next(model.parameters())
    except StopIteration:
        return False
    return (
        parameter.device.type == "cpu"
        and parameter.dtype == torch.float32
        and torch.backends.mkl.is_available()
        and hasattr(torch.ops.mkl, "_mkl_linear")
    )


class PackedWeights:
    """Every float32 ``nn.Linear`` of ``model`` multiplies by an MKL-packed copy of its weight until :meth:`restore`.

    The layers keep their parameters (gradients, state dicts and ``named_parameters`` see nothing new); only the
    instance's ``forward`` is replaced, and :meth:`restore` removes it again."""

    def __init__(self, model: Any) -> None:
        self.layers: list[torch.nn.Linear] = []
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.weight.dtype == torch.float32 and not module.weight.is_meta:
                module.forward = _packed_forward(module)  # type: ignore[method-assign]
                self.layers.append(module)

    def restore(self) -> None:
        """Give every layer its own ``forward`` back and drop the packed copies."""
        for module in self.layers:
            module.__dict__.pop("forward", None)
        self.layers = []


def _packed_forward(module: torch.nn.Linear) -> Any:
    weight = module.weight.detach()
    bias = module.bias.detach() if module.bias is not None else None
    packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, PACK_ROWS_HINT)

    def forward(inputs: torch.Tensor) -> torch.Tensor:
        if inputs.dtype != torch.float32 or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu"):
            return torch.nn.functional.linear(inputs, module.weight, module.bias)
        return torch.ops.mkl._mkl_linear(inputs, packed, weight, bias, PACK_ROWS_HINT)

    return forward
