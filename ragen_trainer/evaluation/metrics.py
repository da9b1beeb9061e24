"""Metrics of an evaluation, computed from the saved per-episode records alone (so any result can be re-scored).

Definitions (also in ``docs/leaderboard.md``)
---------------------------------------------
* **success** of an episode: the env's own ``info["success"]`` after its last turn (Sokoban solved, FrozenLake goal
  reached, high-risk arm chosen, Countdown equation correct, WebShop purchase reward exactly 1). Nothing else counts.
* **partial credit** of an episode, in ``[0, 1]``, reported *separately* and never mixed into success: the WebShop
  purchase reward ``R``, the share of Sokoban boxes left on targets; envs without a notion of partial credit use the
  success itself (0 or 1).
* **success rate** of an env and its **standard error**: episodes are grouped by initial state (the ``k`` rollouts of
  one seed are not independent), the rate is the mean of the per-state success means, and the standard error is the
  sample standard deviation (``ddof=1``) of those per-state means divided by ``sqrt(number of states)``. With one
  rollout per state this is the usual ``sqrt(p (1 - p) / (n - 1))``. Mean reward and partial credit use the same rule.
* **pass@k** (when a state has ``n > 1`` rollouts, ``c`` of them successful): the unbiased estimator
  ``1 - C(n - c, k) / C(n, k)`` (Chen et al., 2021) averaged over states, for ``k`` = 1, 2, 4, ... and ``n``.
* **invalid-action rate**: the share of turns whose reply was malformed or named an action the env does not know
  (``info["action_is_valid"]`` is false); the **format-error rate** counts only malformed replies.
* **mean actions / turns**: actions executed and turns taken per episode; **reply / thinking length**: mean characters
  per reply, tokens per reply where the agent reports them, and words inside ``<think>`` per turn.
* **overall score**: the unweighted mean of the per-env success rates, in percent (each env counts once, whatever its
  number of episodes); its standard error is ``sqrt(sum(se_i^2)) / number of envs`` (the envs are independent).
  ``overall_partial`` is the same mean over partial credit.
* **game outcomes** (the text games of :mod:`ragen_envs.games`, by env family: :data:`GAME_OUTCOMES`): the share of
  episodes whose final turn's ``info["outcome"]`` is each of the game's outcome words (``win_rate``, ``draw_rate``,
  ``loss_rate`` for TicTacToe, ConnectFour and the Prisoner's Dilemma, whose outcome compares the two totals;
  ``deal_rate``, ``no_deal_rate`` for the negotiation), each with the clustered standard error of success. An episode
  that ended without an outcome (truncated by the turn budget, the single-agent views' forfeit, or cut by an agent or
  env error) counts as the game's worst word (a loss, no deal) -- only the game itself can report a win -- and
  ``no_outcome`` says how many did. ``mean_score`` (± ``mean_score_se``) is the mean of the game's own ``score`` of
  the seat after the last turn (the sum of its game rewards, format penalties excluded; 0 without a turn).
* **engine errors**: episodes whose reply the engine could not produce (``error_kind == "engine"``: a model endpoint
  that failed the request after its retries, or answered no completion). They count as unsuccessful like any episode,
  ``engine_errors`` counts them per env and overall, and a result where they are more than
  :data:`ENGINE_FAILED_SHARE` of the episodes is ``engine_failed``: its score measures the endpoint, not the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ragen_envs.games import GAMES

#: Above this share of episodes failed by the engine, a result is ``engine_failed`` (not a model's score).
ENGINE_FAILED_SHARE = 0.5


# ---------------------------------------------------------------------------------------------------- estimators
def mean_and_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and standard error of the mean (sample std with ``ddof=1`` over ``sqrt(n)``); ``None`` where undefined."""
    n = len(values)
    if n == 0:
        return None, None
    arr = np.asarray(values, dtype=float)
    mean = float(arr.mean())
    if n == 1:
        return mean, None
    return mean, float(arr.std(ddof=1) / math.sqrt(n))


def clustered_mean_and_se(values: Sequence[float], clusters: Sequence[Any]) -> tuple[float | None, float | None]:
    """Mean and standard error of ``values`` grouped by ``clusters`` (e.g. the seed of the initial state).

    Each cluster is averaged first; the estimate is the mean of the cluster means and its standard error the standard
    error of that mean, which stays honest when the rollouts of one state are correlated.
    """
    if len(values) != len(clusters):
        raise ValueError(f"values ({len(values)}) and clusters ({len(clusters)}) must have the same length")
    groups: dict[Any, list[float]] = {}
    for value, key in zip(values, clusters):
        groups.setdefault(key, []).append(float(value))
    return mean_and_se([sum(g) / len(g) for g in groups.values()])


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one state with ``n`` samples of which ``c`` succeeded: ``1 - C(n-c, k) / C(n, k)``."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"invalid pass@k arguments n={n}, c={c}, k={k}: need 0 <= c <= n and 1 <= k <= n")
    if n - c < k:
        return 1.0
    # prod_{i=n-c+1}^{n} (1 - k / i), the numerically stable form of C(n-c, k) / C(n, k)
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_ks(n: int) -> list[int]:
    """The ``k`` values reported for ``n`` rollouts per state: powers of two below ``n``, and ``n``."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


# ---------------------------------------------------------------------------------------------------- partial credit
def _sokoban_credit(episode: dict[str, Any]) -> float | None:
    view = episode.get("final_view") or {}
    on, total = view.get("boxes_on_target"), view.get("num_boxes")
    if isinstance(on, (int, float)) and isinstance(total, (int, float)) and total > 0:
        return float(on) / float(total)
    return None


def _webshop_credit(episode: dict[str, Any]) -> float | None:
    # The purchase reward R in [0, 1] (the unit of the WebShop score): the env part of the rewards (only "buy now"
    # earns any), format penalties excluded; 0 when nothing was bought.
    turns = episode.get("turns") or []
    if not turns:
        return None
    return float(sum(float((t.get("reward_parts") or {}).get("env", 0.0)) for t in turns))


#: Env family (the id without ``ragen/`` and ``-vN``, with variant suffixes removed) -> partial-credit extractor.
PARTIAL_CREDIT: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "Sokoban": _sokoban_credit,
    "WebShop": _webshop_credit,
}


def env_family(env_id: str) -> str:
    """``"ragen/SokobanLarge-v0"`` -> ``"Sokoban"``; ``"ragen/BanditTest-v0"`` -> ``"Bandit"``."""
    base = env_id.split("/")[-1].rsplit("-v", 1)[0]
    for family in ("Sokoban", "Bandit", "FrozenLake", "Countdown", "WebShop"):
        if base.startswith(family):
            return family
    return base


def partial_credit(episode: dict[str, Any]) -> float:
    """The episode's partial credit in ``[0, 1]`` (see the module docstring); success (0/1) where the env has none."""
    extractor = PARTIAL_CREDIT.get(env_family(episode.get("env_id", "")))
    value = extractor(episode) if extractor is not None else None
    if value is None:
        value = 1.0 if episode_success(episode) else 0.0
    return float(min(1.0, max(0.0, value)))


# ---------------------------------------------------------------------------------------------------- game outcomes
#: Game env family (``"TicTacToe"``) -> the words its final ``info["outcome"]`` takes, best first: the game core's
#: ``outcomes``, what its ``outcome()`` returns. The last word is also what an episode that ended without one counts as
#: (see the module docstring).
GAME_OUTCOMES: dict[str, tuple[str, ...]] = {
    env_family(entry.env_id): tuple(entry.core.outcomes) for entry in GAMES.values()
}


def outcome_rate_key(word: str) -> str:
    """The summary key of an outcome word's rate: ``"win"`` -> ``"win_rate"``, ``"no deal"`` -> ``"no_deal_rate"``
    (its standard error: the key + ``"_se"``)."""
    return word.replace(" ", "_") + "_rate"


def game_outcomes(env_id: str) -> tuple[str, ...] | None:
    """The outcome words of a game env (:data:`GAME_OUTCOMES`), ``None`` for an env that is not a game."""
    return GAME_OUTCOMES.get(env_family(env_id))


def outcome_rates(env_summary: dict[str, Any]) -> list[tuple[str, float, float | None]]:
    """``[(word, rate, standard error)]`` of a game env's summary, its game's words in order; ``[]`` for other envs
    (what the tables show: only where a summary has them, so other envs' tables stay as they were)."""
    for words in dict.fromkeys(GAME_OUTCOMES.values()):
        keys = [outcome_rate_key(w) for w in words]
        if all(env_summary.get(k) is not None for k in keys):
            return [(w, float(env_summary[k]), env_summary.get(k + "_se")) for w, k in zip(words, keys)]
    return []


def _final_extra(episode: dict[str, Any]) -> dict[str, Any]:
    turns = episode.get("turns") or []
    extra = turns[-1].get("info_extra") if turns else None
    return extra if isinstance(extra, dict) else {}


def episode_outcome(episode: dict[str, Any]) -> str | None:
    """The game's outcome word after the episode's last turn (``info["outcome"]``), ``None`` when it has none."""
    outcome = _final_extra(episode).get("outcome")
    return outcome if isinstance(outcome, str) else None


def episode_game_score(episode: dict[str, Any]) -> float:
    """The game's own score of the seat after the last turn (``info["score"]``; format penalties are not in it)."""
    score = _final_extra(episode).get("score")
    return float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else 0.0


def summarize_game(episodes: list[dict[str, Any]], words: Sequence[str]) -> dict[str, Any]:
    """Outcome rates (± clustered standard errors), ``no_outcome`` and the mean game score of one game env's episodes.

    The rates of ``words`` sum to 1: an episode without one of them counts as the last (worst) word.
    """
    states = [int(e["seed"]) for e in episodes]
    outcomes = [episode_outcome(e) for e in episodes]
    counted = [o if o in words else words[-1] for o in outcomes]
    summary: dict[str, Any] = {}
    for word in words:
        key = outcome_rate_key(word)
        summary[key], summary[key + "_se"] = clustered_mean_and_se([float(o == word) for o in counted], states)
    summary["no_outcome"] = sum(1 for o in outcomes if o not in words)
    summary["mean_score"], summary["mean_score_se"] = clustered_mean_and_se(
        [episode_game_score(e) for e in episodes], states
    )
    return summary


# ---------------------------------------------------------------------------------------------------- per episode
def episode_success(episode: dict[str, Any]) -> bool:
    """Success as the env reported it after the last turn (never inferred from the reward)."""
    turns = episode.get("turns") or []
    return bool(turns[-1].get("success", False)) if turns else False


def episode_reward(episode: dict[str, Any]) -> float:
    """The episode's return: the sum of its turn rewards (format penalties included)."""
    return float(sum(float(t.get("reward", 0.0)) for t in episode.get("turns") or []))


def _think_words(turn: dict[str, Any]) -> int:
    return len((turn.get("think") or "").split())


# ---------------------------------------------------------------------------------------------------- summaries
def _rate(numer: int, denom: int) -> float | None:
    return numer / denom if denom else None


def summarize_env(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """All metrics of one env's episodes (see the module docstring)."""
    states = [int(e["seed"]) for e in episodes]
    successes = [1.0 if episode_success(e) else 0.0 for e in episodes]
    rewards = [episode_reward(e) for e in episodes]
    credits = [partial_credit(e) for e in episodes]
    sr, sr_se = clustered_mean_and_se(successes, states)
    mr, mr_se = clustered_mean_and_se(rewards, states)
    pc, pc_se = clustered_mean_and_se(credits, states)

    turns = [t for e in episodes for t in (e.get("turns") or [])]
    n_turns = len(turns)
    reply_tokens = [t["reply_tokens"] for t in turns if isinstance(t.get("reply_tokens"), int)]
    per_state: dict[int, list[float]] = {}
    for seed, s in zip(states, successes):
        per_state.setdefault(seed, []).append(s)
    rollouts = sorted({len(v) for v in per_state.values()})

    summary: dict[str, Any] = {
        "episodes": len(episodes),
        "states": len(per_state),
        "rollouts_per_state": rollouts[0] if len(rollouts) == 1 else rollouts,
        "success_rate": sr,
        "success_rate_se": sr_se,
        "partial_credit": pc,
        "partial_credit_se": pc_se,
        "mean_reward": mr,
        "mean_reward_se": mr_se,
        "invalid_action_rate": _rate(sum(1 for t in turns if not t.get("action_is_valid", False)), n_turns),
        "format_error_rate": _rate(sum(1 for t in turns if not t.get("format_ok", False)), n_turns),
        "mean_actions": float(np.mean([sum(len(t.get("actions") or []) for t in e.get("turns") or []) for e in episodes]))
        if episodes
        else None,
        "mean_turns": float(np.mean([len(e.get("turns") or []) for e in episodes])) if episodes else None,
        "mean_reply_chars": float(np.mean([len(t.get("reply") or "") for t in turns])) if turns else None,
        "mean_reply_tokens": float(np.mean(reply_tokens)) if reply_tokens else None,
        "mean_think_words": float(np.mean([_think_words(t) for t in turns])) if turns else None,
        "errors": sum(1 for e in episodes if e.get("error")),
        "engine_errors": sum(1 for e in episodes if e.get("error_kind") == "engine"),
    }
    words = game_outcomes(episodes[0].get("env_id", "")) if episodes else None
    if words:  # only game envs: the summaries of every other env keep exactly their keys
        summary.update(summarize_game(episodes, words))
    # pass@k needs the same number of rollouts n > 1 for every state.
    if len(rollouts) == 1 and rollouts[0] > 1:
        n = rollouts[0]
        summary["pass_at_k"] = {
            str(k): float(np.mean([pass_at_k(n, int(sum(v)), k) for v in per_state.values()])) for k in pass_at_k_ks(n)
        }
    return summary


def summarize(episodes: Iterable[dict[str, Any]], env_order: Sequence[str] | None = None) -> dict[str, Any]:
    """Per-env summaries (in ``env_order``, default: first appearance) and the overall score."""
    by_env: dict[str, list[dict[str, Any]]] = {}
    for episode in episodes:
        by_env.setdefault(episode["env"], []).append(episode)
    order = [n for n in (env_order or []) if n in by_env] + [n for n in by_env if n not in (env_order or [])]
    envs = {name: summarize_env(by_env[name]) for name in order}
    rates = [s["success_rate"] for s in envs.values() if s["success_rate"] is not None]
    ses = [s["success_rate_se"] for s in envs.values()]
    credits = [s["partial_credit"] for s in envs.values() if s["partial_credit"] is not None]
    credit_ses = [s["partial_credit_se"] for s in envs.values()]
    overall: dict[str, Any] = {
        "score": 100.0 * float(np.mean(rates)) if rates else None,
        "score_se": 100.0 * math.sqrt(sum(se * se for se in ses)) / len(ses) if ses and None not in ses else None,
        "partial": 100.0 * float(np.mean(credits)) if credits else None,
        "partial_se": 100.0 * math.sqrt(sum(se * se for se in credit_ses)) / len(credit_ses)
        if credit_ses and None not in credit_ses
        else None,
        "envs": len(envs),
        "episodes": sum(s["episodes"] for s in envs.values()),
        "engine_errors": sum(s["engine_errors"] for s in envs.values()),
        "definition": "unweighted mean over envs of the success rate, in percent; se = sqrt(sum se_i^2) / n_envs",
    }
    overall["engine_failed"] = engine_failed(overall["engine_errors"], overall["episodes"])
    return {"envs": envs, "overall": overall}


def engine_failed(engine_errors: int, episodes: int) -> bool:
    """More than :data:`ENGINE_FAILED_SHARE` of the episodes failed on the engine (see the module docstring)."""
    return episodes > 0 and engine_errors > ENGINE_FAILED_SHARE * episodes
