"""Metrics and standard errors on hand-made episode records (no env, no model)."""

from __future__ import annotations

import math

import pytest

from ragen_trainer.evaluation.metrics import (
    clustered_mean_and_se,
    env_family,
    mean_and_se,
    partial_credit,
    pass_at_k,
    pass_at_k_ks,
    summarize,
    summarize_env,
)


def turn(success=False, reward=0.0, valid=True, fmt=True, actions=("Up",), reply="<think>a b c</think><answer>Up</answer>",
         think="a b c", tokens=None, extra=None):  # fmt: skip
    return {"success": success, "reward": reward, "action_is_valid": valid, "format_ok": fmt, "actions": list(actions),
            "reply": reply, "think": think, "reply_tokens": tokens, "info_extra": extra or {}}  # fmt: skip


def episode(env="Sokoban", env_id="ragen/Sokoban-v0", seed=0, rollout=0, turns=(), final_view=None):
    return {"env": env, "env_id": env_id, "seed": seed, "rollout": rollout, "turns": list(turns),
            "final_view": final_view or {}}  # fmt: skip


def test_mean_and_se_match_the_textbook_formula():
    mean, se = mean_and_se([1, 0, 1, 1])
    assert mean == 0.75
    # sample std (ddof=1) / sqrt(n) == sqrt(p (1 - p) / (n - 1)) for 0/1 data
    assert se == pytest.approx(math.sqrt(0.75 * 0.25 / 3))
    assert mean_and_se([]) == (None, None)
    assert mean_and_se([0.3]) == (0.3, None)


def test_clustered_se_averages_rollouts_of_one_state_first():
    # state 0: two successes; state 1: one of two -> per-state means 1.0 and 0.5
    mean, se = clustered_mean_and_se([1, 1, 0, 1], [0, 0, 1, 1])
    assert mean == 0.75
    assert se == pytest.approx(0.25)  # std([1, .5], ddof=1) / sqrt(2)
    # rollouts of a state that agree are not independent evidence: naive pooling would claim a smaller error
    mean, se = clustered_mean_and_se([1, 1, 0, 0], [0, 0, 1, 1])
    assert se == pytest.approx(0.5)
    naive = mean_and_se([1, 1, 0, 0])[1]
    assert naive == pytest.approx(math.sqrt(0.25 / 3)) and naive < se
    with pytest.raises(ValueError, match="same length"):
        clustered_mean_and_se([1, 0], [0])


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_unbiased_estimator(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
            assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k_ks(n)[-1] == n


def test_pass_at_k_rejects_bad_arguments():
    with pytest.raises(ValueError, match="pass@k"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="pass@k"):
        pass_at_k(4, 1, 0)


def test_env_summary_on_hand_made_records():
    episodes = [
        # solved in two turns; second turn names an invalid action
        episode(seed=1, turns=[turn(reward=-0.1, actions=("Up", "Left"), tokens=10),
                               turn(success=True, reward=10.9, valid=False, tokens=20)],
                final_view={"boxes_on_target": 1, "num_boxes": 1}),
        # malformed reply, then gives up: no success, one of two boxes placed
        episode(seed=2, turns=[turn(reward=-0.1, valid=False, fmt=False, actions=(), think="", tokens=30)],
                final_view={"boxes_on_target": 1, "num_boxes": 2}),
    ]
    s = summarize_env(episodes)
    assert s["episodes"] == 2 and s["states"] == 2 and s["rollouts_per_state"] == 1
    assert s["success_rate"] == 0.5
    assert s["success_rate_se"] == pytest.approx(0.5)  # std([1, 0], ddof=1) / sqrt(2)
    assert s["partial_credit"] == pytest.approx(0.75)  # (1/1 + 1/2) / 2: reported apart from success
    assert s["mean_reward"] == pytest.approx((10.8 - 0.1) / 2)
    assert s["invalid_action_rate"] == pytest.approx(2 / 3)
    assert s["format_error_rate"] == pytest.approx(1 / 3)
    assert s["mean_actions"] == pytest.approx(1.5)  # 3 actions, then 0
    assert s["mean_turns"] == pytest.approx(1.5)
    assert s["mean_reply_tokens"] == pytest.approx(20.0)
    assert s["mean_think_words"] == pytest.approx(2.0)  # 3 + 3 + 0 words over 3 turns
    assert "pass_at_k" not in s  # one rollout per state


def test_success_is_the_env_flag_not_the_reward_and_partial_credit_stays_apart():
    # A WebShop purchase with reward 0.8 is partial credit, not a success.
    bought = episode(env="WebShop", env_id="ragen/WebShop-v0", turns=[turn(reward=-0.1), turn(reward=0.8)])
    for t, env_reward in zip(bought["turns"], (0.0, 0.8)):
        t["reward_parts"] = {"env": env_reward, "format_penalty": t["reward"] - env_reward}
    assert partial_credit(bought) == pytest.approx(0.8)
    s = summarize_env([bought])
    assert s["success_rate"] == 0.0 and s["partial_credit"] == pytest.approx(0.8)
    # envs without partial credit use success itself
    bandit = episode(env="Bandit", env_id="ragen/Bandit-v0", turns=[turn(success=True, reward=0.0)])
    assert partial_credit(bandit) == 1.0


def test_pass_at_k_in_summaries_with_several_rollouts():
    episodes = [episode(seed=s, rollout=r, turns=[turn(success=ok)])
                for s, outcomes in ((0, [1, 0, 0, 0]), (1, [0, 0, 0, 0])) for r, ok in enumerate(outcomes)]  # fmt: skip
    s = summarize_env(episodes)
    assert s["rollouts_per_state"] == 4
    assert s["pass_at_k"]["1"] == pytest.approx((0.25 + 0.0) / 2)
    assert s["pass_at_k"]["2"] == pytest.approx((0.5 + 0.0) / 2)
    assert s["pass_at_k"]["4"] == pytest.approx((1.0 + 0.0) / 2)


def test_overall_score_is_the_unweighted_mean_of_env_success_rates():
    eps = [episode(env="A", env_id="ragen/Bandit-v0", seed=i, turns=[turn(success=i < 3)]) for i in range(4)]
    eps += [episode(env="B", env_id="ragen/Countdown-v0", seed=i, turns=[turn(success=i < 1)]) for i in range(8)]
    summary = summarize(eps, ["B", "A"])
    assert list(summary["envs"]) == ["B", "A"]
    a, b = summary["envs"]["A"], summary["envs"]["B"]
    overall = summary["overall"]
    assert overall["score"] == pytest.approx(100 * (0.75 + 0.125) / 2)  # not the pooled 4/12
    assert overall["score_se"] == pytest.approx(100 * math.hypot(a["success_rate_se"], b["success_rate_se"]) / 2)
    assert overall["episodes"] == 12 and overall["envs"] == 2


def test_env_family_groups_variants():
    assert env_family("ragen/SokobanNewVocab-v0") == "Sokoban"
    assert env_family("ragen/BanditTest-v0") == "Bandit"
    assert env_family("ragen/WebShop-v0") == "WebShop"
