"""Reward parts and the grounding wrapper's claim counts reach the per-step rollout metrics: from the env's ``info``
through the trajectory (:attr:`Trajectory.reward_parts`, :attr:`Trajectory.reward_details`) to
:func:`ragen_trainer.monitor.rollout_metrics`; and a wrapper at ``weight: 0`` measures without changing the reward."""

from __future__ import annotations

import pytest

from ragen_trainer.monitor import (
    KEY_CONTRADICTED_CLAIMS,
    KEY_SUPPORTED_CLAIMS,
    claim_metrics,
    reward_part_metrics,
    rollout_metrics,
)
from ragen_trainer.trajectory import RolloutBatch, Trajectory

# Bandit's training arms: Dragon is the risky one, Phoenix the safe one. One true claim, one false one.
ONE_TRUE_ONE_FALSE = "<think>The Dragon is risky. The Phoenix is risky too.</think><answer>Dragon</answer>"


def _traj(group_id: int, turns: list[tuple[dict[str, float], dict]]) -> Trajectory:
    """A trajectory whose turns carry the given ``reward_parts`` and ``reward_details`` (nothing else matters)."""
    infos = [{"format_ok": True, "reward_parts": parts, "reward_details": details} for parts, details in turns]
    n = len(turns)
    return Trajectory(
        group_id=group_id,
        seed=group_id,
        env_id="ragen/FrozenLake-v0",
        messages=[],
        input_ids=[5] * (4 * n),
        loss_mask=[1, 1, 0, 0] * n,
        turn_spans=[(4 * i, 4 * i + 2) for i in range(n)],
        turn_rewards=[sum(parts.values()) for parts, _ in turns],
        success=False,
        replies=["r"] * n,
        infos=infos,
    )


def test_parts_are_summed_per_trajectory_and_claims_averaged_per_turn():
    grounded = {"supported": 2, "contradicted": 0}
    batch = [
        # two turns: the parts add up within the trajectory
        _traj(0, [({"env": 0.0, "format_penalty": -0.1, "grounding": 0.1}, {"grounding": grounded}),
                  ({"env": 1.0, "format_penalty": 0.0, "grounding": -0.2},
                   {"grounding": {"supported": 0, "contradicted": 2}, "thinking_length": {"words": 3}})]),
        # one turn without thinking: 0 claims, counted in the per-turn mean
        _traj(1, [({"env": 0.0, "format_penalty": 0.0, "grounding": 0.0},
                   {"grounding": {"supported": 0, "contradicted": 0}})]),
    ]  # fmt: skip
    assert batch[0].reward_parts[1] == {"env": 1.0, "format_penalty": 0.0, "grounding": -0.2}
    assert batch[0].reward_details[0] == {"grounding": grounded}
    parts = reward_part_metrics(batch)
    assert parts == pytest.approx(
        {"reward/part/env": 0.5, "reward/part/format_penalty": -0.05, "reward/part/grounding": -0.05}
    )
    # the parts add up to the mean reward
    assert sum(parts.values()) == pytest.approx(rollout_metrics(RolloutBatch(batch))["reward/mean"])
    claims = claim_metrics(batch)
    assert claims == pytest.approx({KEY_SUPPORTED_CLAIMS: 2 / 3, KEY_CONTRADICTED_CLAIMS: 2 / 3})
    # details without claim counts (another wrapper, a step after the end) are not claims
    assert "thinking_length/supported_claims" not in claims
    skipped = _traj(2, [({"env": 0.0}, {"grounding": {"skipped": "the episode has ended"}})])
    assert claim_metrics([skipped]) == {}
    assert reward_part_metrics([]) == {} and claim_metrics([]) == {}


def _bandit_metrics(tokenizer, engine_factory, wrappers):
    from ragen_trainer.engines import SamplingParams
    from ragen_trainer.rollout import collect_rollouts
    from tests.trainer.conftest import latest_rollout

    engine = engine_factory(tokenizer, [ONE_TRUE_ONE_FALSE])
    env_kwargs = {"reply_prefix": "", **({"reward_wrappers": wrappers} if wrappers else {})}
    batch = collect_rollouts(engine, tokenizer, "ragen/Bandit-v0", [0, 1, 2], 2, settings=latest_rollout(),
                             sampling=SamplingParams(), env_kwargs=env_kwargs)  # fmt: skip
    return batch, rollout_metrics(batch, tokenizer)


def test_grounding_counts_and_parts_reach_rollout_metrics_and_weight_zero_only_measures(tiny_tokenizer,
                                                                                       scripted_engine):  # fmt: skip
    _, plain = _bandit_metrics(tiny_tokenizer, scripted_engine, None)
    batch, measured = _bandit_metrics(tiny_tokenizer, scripted_engine, [{"name": "grounding", "weight": 0.0}])
    _, rewarded = _bandit_metrics(tiny_tokenizer, scripted_engine, ["grounding"])

    # the trajectory keeps each turn's parts and the wrapper's details
    assert batch.trajectories[0].reward_details[0]["grounding"] == {"supported": 1, "contradicted": 1}
    assert set(batch.trajectories[0].reward_parts[0]) == {"env", "format_penalty", "grounding"}

    # weight 0: the claims are counted, the reward is the one without the wrapper
    assert measured[KEY_SUPPORTED_CLAIMS] == 1.0 and measured[KEY_CONTRADICTED_CLAIMS] == 1.0
    assert measured["reward/part/grounding"] == 0.0
    assert measured["reward/mean"] == pytest.approx(plain["reward/mean"])
    assert KEY_SUPPORTED_CLAIMS not in plain and "reward/part/grounding" not in plain

    # default weight 1: +0.05 for the true claim, -0.1 for the false one, on top of the same env reward (the group
    # shares the seed, so the same payouts)
    assert rewarded[KEY_SUPPORTED_CLAIMS] == 1.0 and rewarded[KEY_CONTRADICTED_CLAIMS] == 1.0
    assert rewarded["reward/part/grounding"] == pytest.approx(-0.05)
    assert rewarded["reward/part/env"] == pytest.approx(measured["reward/part/env"])
    assert rewarded["reward/mean"] == pytest.approx(measured["reward/mean"] - 0.05)
    parts = [v for k, v in rewarded.items() if k.startswith("reward/part/")]
    assert sum(parts) == pytest.approx(rewarded["reward/mean"])
