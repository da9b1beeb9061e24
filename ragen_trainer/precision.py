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

bfloat16 is faster than float32 on a CPU only where the CPU multiplies bfloat16 itself (AVX-512 BF16, AMX, Arm's BF16
extension); elsewhere torch emulates them in software, and autocast makes a step slower (a Bandit step 7x slower on
an AVX2-only AMD EPYC: docs/performance.md). :func:`emulated_bf16_advice` says so when a run asks for it there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
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


#: CPU feature flags (``/proc/cpuinfo``) of bfloat16 products in hardware: x86's AVX-512 BF16 and AMX, Arm's BF16.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str] | None:
    """The CPU's feature flags: the first ``flags`` (x86) or ``Features`` (Arm) line of ``cpuinfo``; ``None`` where
    the file cannot be read (not Linux), so that callers say nothing rather than guess."""
    try:
        lines = Path(cpuinfo).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def emulated_bf16_advice(compute: torch.dtype, device: torch.device | str,
                         flags: frozenset[str] | None = None) -> str | None:
    """The warning for bfloat16 compute on a CPU without bfloat16 instructions (``flags``: :func:`cpu_flags` when not
    given), else ``None`` (float32 compute, a GPU, a CPU that has them, or flags that cannot be read)."""
    if compute != torch.bfloat16 or torch.device(device).type != "cpu":
        return None
    flags = cpu_flags() if flags is None else flags
    if flags is None or any(flag in flags for flag in NATIVE_BF16_FLAGS):
        return None
    return ("dtype='bfloat16' on a CPU without bfloat16 instructions (none of "
            f"{', '.join(NATIVE_BF16_FLAGS)} in /proc/cpuinfo): torch emulates its products in software, so autocast "
            "makes the training and scoring passes slower, not faster (a Bandit step 7x slower on an AVX2-only "
            "AMD EPYC, docs/performance.md); dtype='float32' (or 'auto') is faster here")


__all__ = ["DTYPES", "NATIVE_BF16_FLAGS", "Precision", "compute_dtype", "cpu_flags", "emulated_bf16_advice"]
