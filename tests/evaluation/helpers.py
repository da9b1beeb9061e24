"""Small suites for the evaluation tests."""

from __future__ import annotations

from typing import Any

from ragen_trainer.evaluation.suites import Suite, suite_from_dict


def small_suite(*entries: tuple[str, str, int], rollouts: int = 1, decoding: dict[str, Any] | None = None,
                **env_extra: Any) -> Suite:  # fmt: skip
    """A suite of ``(name, env_id, count)`` entries, seeds from 7000."""
    return suite_from_dict(
        {
            "name": "test",
            "version": 1,
            "decoding": decoding or {"temperature": 0.5, "top_p": 1.0, "max_new_tokens": 32, "seed": 0},
            "rollouts_per_state": rollouts,
            "envs": [{"name": n, "env_id": i, "seeds": {"start": 7000, "count": c}, **env_extra.get(n, {})}
                     for n, i, c in entries],
        }
    )
