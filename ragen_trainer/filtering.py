"""StarPO-S variance-based trajectory filtering (RAGEN Sec. 4.1).

Each training step samples P initial states with N rollouts each. A group whose N rollouts all earned the same
reward teaches nothing (GRPO advantages are 0) and, in the Echo Trap, low-variance groups are the templated,
collapsed ones. StarPO-S ranks the groups by the standard deviation of their rollouts' rewards and keeps the top
fraction ``keep_ratio`` (``std``; ``std_rev`` keeps the lowest instead, the paper's control). Filtered groups are
dropped before any scoring forward pass and never reach the backward pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

FILTER_MODES: tuple[str, ...] = ("std", "std_rev")
FILTER_ROUNDING: tuple[str, ...] = ("floor", "ceil")
#: The keep ratio of StarPO-S (the paper's runs: RAGEN 3059df8 ``rollout_filter_ratio: 0.25``), the one default of
#: ragen's trainer (``StarPOConfig.filter_ratio``), the TRL adapter (``RagenGRPOTrainer``) and :func:`filter_groups`.
DEFAULT_FILTER_RATIO = 0.25
#: What a keep ratio may be, as error messages say it (:func:`valid_keep_ratio` is the check).
KEEP_RATIO_RANGE = "a number in (0, 1] (1.0 keeps every group: no filtering)"


def valid_keep_ratio(value: object) -> bool:
    """The one range check of a keep ratio (``filter_ratio``): a real number in (0, 1]."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 < value <= 1.0


@dataclass
class FilterResult:
    """Which groups survive, and why."""

    kept: list[int]
    """Group ids kept, in rank order (most informative first)."""
    dropped: list[int]
    stds: dict[int, float]
    """In-group reward std of every group."""
    stats: dict[str, float] = field(default_factory=dict)
    """``filter/std_mean_all``, ``filter/std_mean_kept``, ``filter/zero_std_frac``, ``filter/kept_groups``,
    ``filter/threshold`` (the std of the last kept group)."""


def in_group_std(rewards: Sequence[float]) -> float:
    """Unbiased sample std of one group's returns (0 for a group of one), as the reference's ``torch.std``."""
    r = np.asarray(list(rewards), dtype=np.float64)
    return float(r.std(ddof=1)) if r.size >= 2 else 0.0


def num_kept(num_groups: int, keep_ratio: float, rounding: str = "floor") -> int:
    """How many of ``num_groups`` groups ``keep_ratio`` keeps, at least 1 and at most all.

    ``floor``: ``int(ratio * P)``, the reference's ``topk(int(rollout_filter_ratio * num_groups))`` with the same float
    arithmetic (which would keep no group when ``ratio * P < 1``; ragen keeps one); ``ceil``: ``ceil(ratio * P)``.
    """
    if not valid_keep_ratio(keep_ratio):
        raise ValueError(f"invalid argument keep_ratio={keep_ratio!r}: expected {KEEP_RATIO_RANGE}")
    if rounding not in FILTER_ROUNDING:
        raise ValueError(f"invalid argument rounding={rounding!r}: expected one of {list(FILTER_ROUNDING)}")
    count = int(keep_ratio * num_groups) if rounding == "floor" else math.ceil(num_groups * keep_ratio - 1e-9)
    return max(1, min(num_groups, count))


def filter_groups(
    group_rewards: Mapping[int, Sequence[float]],
    keep_ratio: float = DEFAULT_FILTER_RATIO,
    mode: str = "std",
    rounding: str = "floor",
) -> FilterResult:
    """Keep the top ``keep_ratio`` of groups by in-group reward std (``std``) or the bottom (``std_rev``).

    Ties are broken by group id (lower first), so the choice is deterministic and the same on every process.
    ``keep_ratio = 1`` keeps every group.
    """
    if mode not in FILTER_MODES:
        raise ValueError(f"invalid argument mode={mode!r}: expected one of {list(FILTER_MODES)}")
    if not group_rewards:
        raise ValueError("invalid argument group_rewards={}: expected at least one group")
    stds = {int(g): in_group_std(r) for g, r in group_rewards.items()}
    sign = -1.0 if mode == "std" else 1.0
    order = sorted(stds, key=lambda g: (sign * stds[g], g))
    k = num_kept(len(order), keep_ratio, rounding)
    kept, dropped = order[:k], order[k:]
    all_std = np.array([stds[g] for g in order])
    kept_std = np.array([stds[g] for g in kept])
    stats = {
        "filter/std_mean_all": float(all_std.mean()),
        "filter/std_mean_kept": float(kept_std.mean()),
        "filter/zero_std_frac": float((all_std == 0).mean()),
        "filter/kept_groups": float(k),
        "filter/threshold": float(stds[kept[-1]]),
    }
    return FilterResult(kept=kept, dropped=dropped, stds=stds, stats=stats)
