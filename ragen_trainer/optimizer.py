"""AdamW for a policy and its critic: two parameter groups, each clipped by its own gradient norm.

The reference trains the actor and the critic with two optimizers, each clipping its own gradients (verl's
``dp_actor._optimizer_step`` and ``dp_critic._optimizer_step``, ``grad_clip`` 1.0 each). Adam is per parameter, so one
AdamW with two groups, each with its learning rate, weight decay and ``max_grad_norm``, is the same thing. Clipping
happens inside :meth:`GroupClippedAdamW.step`, which is where every engine hands over the gradients:

* one process or DDP: the gradients are whole (DDP all-reduced them), the norm is local;
* DeepSpeed ZeRO: the optimizer holds this process's flat float32 partition of each group, so the squared norm is
  summed over the data-parallel group first (``reduce_group``). ZeRO-3 steps one sub-group at a time and empties the
  others: one sub-group per parameter group (``sub_group_size`` >= the largest group) keeps the norms per group.

The norms before clipping are kept in :attr:`GroupClippedAdamW.last_grad_norms` for the logs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist


class GroupClippedAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` whose parameter groups carry ``max_grad_norm`` (and a ``name``): before each step every
    group's gradients are scaled to at most that norm, as ``torch.nn.utils.clip_grad_norm_`` scales them
    (``max_norm / (norm + 1e-6)``, capped at 1)."""

    def __init__(self, params: Iterable[dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.reduce_group: Any = None
        """The process group to sum squared norms over when the parameters are partitioned (DeepSpeed ZeRO)."""
        self.partitioned = False
        self.last_grad_norms: dict[str, float] = {}
        """Per group name, the gradient norm before clipping at the last step."""

    @torch.no_grad()
    def clip_gradients(self) -> dict[str, float]:
        """Clip every group by its ``max_grad_norm``; returns the norms before clipping, by group name."""
        norms: dict[str, float] = {}
        for group in self.param_groups:
            if not group["params"]:  # ZeRO-3 empties the groups it is not stepping
                continue
            grads = [p.grad for p in group["params"] if p.grad is not None]
            device = group["params"][0].device
            squared = torch.zeros((), dtype=torch.float32, device=device)
            for grad in grads:
                squared += grad.float().pow(2).sum()
            if self.partitioned and dist.is_available() and dist.is_initialized():
                dist.all_reduce(squared, group=self.reduce_group)
            norm = squared.sqrt()
            norms[group.get("name", str(len(norms)))] = float(norm)
            coef = torch.clamp(group["max_grad_norm"] / (norm + 1e-6), max=1.0)
            for grad in grads:
                grad.mul_(coef.to(grad.dtype))
        return norms

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        self.last_grad_norms = {**self.last_grad_norms, **self.clip_gradients()}
        return super().step(closure)


__all__ = ["GroupClippedAdamW"]
