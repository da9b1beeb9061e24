"""Mixed precision as the reference trains: float32 master weights and optimizer state, bfloat16 (or float16) compute.

verl, which the reference trains with, keeps the FSDP-sharded parameters and AdamW's moments in float32 and runs the
forward and backward passes in bfloat16 (``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32, buffer_dtype=fp32)``
in ``verl/workers/fsdp_workers.py``). That split matters at the paper's learning rates: an AdamW step of
``actor_lr=1e-6`` moves a weight by about 1e-6, far below the spacing of bfloat16 numbers near a typical weight
(~0.05 * 2**-8 = 2e-4), so a model whose weights *are* bfloat16 rounds almost every update away.

Two settings say what is stored and what is computed (:class:`~ragen_trainer.config.StarPOConfig`):

* ``dtype`` -- the **compute** dtype: the training forward and backward passes (and the scoring pass) run under
  ``torch.autocast`` in it. ``auto`` is bfloat16 on a GPU that supports it (as the reference), float32 elsewhere.
* ``master_dtype`` -- the **stored** dtype of the trained weights and their optimizer state: ``float32`` (the
  reference's), or ``bfloat16`` for pure bfloat16 training (half the memory, and most small updates lost:
  :meth:`StarPOConfig.validate <ragen_trainer.config.StarPOConfig.validate>` warns when it is chosen).

Checkpoints hold the master weights, so a resumed run continues from exactly what was trained. The frozen reference
model (KL) is never updated, so it is kept in the compute dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

#: Names of the dtypes the config accepts.
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def compute_dtype(name: str, device: torch.device | str) -> torch.dtype:
    """The compute dtype a config's ``dtype`` names on ``device``: ``auto`` is bfloat16 on a CUDA GPU that supports
    it (the reference's), float32 anywhere else (a CPU computes faster in float32 unless asked)."""
    if name == "auto":
        dev = torch.device(device)
        return torch.bfloat16 if dev.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    return DTYPES[name]


@dataclass(frozen=True)
class Precision:
    """What is stored (``master``) and what is computed (``compute``) on ``device``."""

    master: torch.dtype
    compute: torch.dtype
    device: torch.device

    @classmethod
    def from_config(cls, config: Any, device: torch.device | str) -> Precision:
        """The precision of a :class:`~ragen_trainer.config.StarPOConfig` (``dtype`` and ``master_dtype``)."""
        return cls(master=DTYPES[config.master_dtype], compute=compute_dtype(config.dtype, device),
                   device=torch.device(device))

    @property
    def mixed(self) -> bool:
        """Whether the compute dtype differs from the stored one (autocast is on)."""
        return self.compute != self.master

    @property
    def accelerate_name(self) -> str:
        """``accelerate``'s ``mixed_precision`` for this precision: ``no``, ``bf16`` or ``fp16`` (float16 needs its
        gradient scaler, which accelerate runs in ``backward`` and ``clip_grad_norm_``)."""
        if not self.mixed:
            return "no"
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}[self.compute]

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Run the body's matrix products in the compute dtype (a no-op when nothing is mixed)."""
        if not self.mixed:
            yield
            return
        with torch.autocast(device_type=self.device.type, dtype=self.compute):
            yield


__all__ = ["DTYPES", "Precision", "compute_dtype"]
