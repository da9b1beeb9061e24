"""Run a suite on an agent and produce one result (a JSON-serialisable dict, written by :func:`save_result`).

For each env of the suite, the episodes (every pinned seed x its rollouts) are played in batches of ``batch_size``
by the episode driver (:func:`ragen_envs.driver.play_episodes`, the same loop as training's rollouts): ``reset(seed=s)``,
then turn after turn the agent's replies are stepped until every episode of the batch has ended. Envs are made once
per batch slot and reset for each episode (WebShop starts its server once, not per episode).

The result holds::

    format, format_version    "ragen-eval-result", 1
    suite                     name, version, id, hash and the whole definition
    agent                     the agent's identity (name, kind, model path and hash, engine, decoding; for a model
                              also ``generation``, per env the effective generation settings, and its
                              ``generation_hash``)
    versions                  python, ragen, gymnasium, numpy (+ torch, transformers for model agents)
    episodes                  one record per episode (see below)
    summary                   metrics.summarize(episodes): per env and overall
    timings                   wall-clock seconds; the only part that differs between two identical runs

Files are written atomically (:mod:`ragen_trainer.fileio`: a crash mid-write leaves the previous file) and only after
they pass the schema of :mod:`ragen_trainer.evaluation.schema` (no NaN or infinity anywhere, rates in [0, 1], a summary
that re-scoring the episodes reproduces); :func:`load_result` checks the same schema when it reads one.

An episode record: ``env, env_id, state_index, seed, rollout, system_prompt, observation`` (the first prompt),
``reset_info`` (the env's extra reset info, e.g. Sokoban's ``optimal_moves``), ``initial_state`` and per-turn
``state`` (:func:`state_record`: the text grid of a grid env, the whole board of a text game; the leaderboard's
viewer replays them), ``turns``
(``reply, reply_tokens, think, actions, reward, reward_parts, format_ok, action_is_valid, invalid_actions,
dropped_actions, success, reason, observation, info_extra``), ``success, reward, terminated, truncated, final_view,
error`` and, for an episode whose reply the engine could not produce (a model endpoint that failed the request:
``ragen_trainer.engines.base.ENGINE_FAILURE``), ``error_kind: "engine"``. Success is the env's own flag after the last
turn, never inferred from the reward.

Engine failures. Such episodes count as unsuccessful, and the summary counts them (``engine_errors`` per env and
overall); a result where they are more than half of the episodes is ``engine_failed``
(:func:`ragen_trainer.evaluation.metrics.summarize`): a failed endpoint, not a model's score, which the leaderboard
does not rank. An env most of whose episodes failed on the engine is not kept in the checkpoint, so running the same
command again plays it again.
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import ragen_envs
from ragen_envs.driver import EnvSlots, Episode, EpisodeJob, Turn, env_extras, play_episodes
from ragen_envs.games.view import GameEnv
from ragen_trainer.engines.base import ENGINE_FAILURE
from ragen_trainer.evaluation.agents import Agent
from ragen_trainer.evaluation.metrics import engine_failed, outcome_rates, summarize
from ragen_trainer.evaluation.schema import (
    CHECKPOINT_FORMAT,
    RESULT_FORMAT,
    RESULT_FORMAT_VERSION,
    ResultFileError,
    read_json,
    validate_checkpoint,
    validate_result,
)
from ragen_trainer.evaluation.suites import Suite, SuiteEnv, generation_hash
from ragen_trainer.fileio import atomic_write_text


# ------------------------------------------------------------------------------------------------------ helpers
def to_jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy of ``value`` (numpy scalars and arrays, tuples, sets; anything else as its ``repr``).

    A non-finite float (NaN, +-infinity) becomes ``None``: JSON has no such number, and a string such as ``"nan"``
    would be read back as NaN by lenient readers (``float("nan")``). The result schema rejects ``None`` where a number
    is required, and a ``None`` score beside scored envs, so a NaN is never written as a score.
    """
    if depth > 20:
        return repr(value)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist(), depth + 1)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [to_jsonable(v, depth + 1) for v in items]
    return repr(value)


def package_versions(include_ml: bool = False) -> dict[str, str]:
    """Versions that can change a result: python, ragen, gymnasium, numpy (and torch, transformers for models)."""
    versions = {"python": platform.python_version(), "ragen": ragen_envs.__version__, "gymnasium": gym.__version__,
                "numpy": np.__version__}  # fmt: skip
    if include_ml:
        for name in ("torch", "transformers", "vllm"):
            module = sys.modules.get(name)
            if module is not None:
                versions[name] = str(getattr(module, "__version__", "unknown"))
    return versions


def is_grid_env(env: gym.Env) -> bool:
    return "rgb_array" in (getattr(env.unwrapped, "metadata", {}) or {}).get("render_modes", [])


def is_game_env(env: gym.Env) -> bool:
    """A text game's single-agent view (``ragen/TicTacToe-v0``, ...; :mod:`ragen_envs.games`)."""
    return isinstance(env.unwrapped, GameEnv)


def state_record(env: gym.Env | None) -> str | None:
    """The state a result keeps per turn, for the leaderboard's replays; ``None`` for envs whose observation says all.

    Grid envs: the text grid (the page draws it). Text games: the whole board as a spectator sees it (the core's
    ``render()``: the opponent's moves included, and in the negotiation both seats' private values, which the
    seat's own observation hides).
    """
    if env is None:
        return None
    if is_grid_env(env):
        return env.unwrapped.state_text()
    if is_game_env(env):
        return env.unwrapped.core.render()
    return None


def _turn_record(turn: Turn, state: str | None) -> dict[str, Any]:
    info = turn.info
    return {
        "reply": turn.reply,
        "reply_tokens": turn.tokens,
        "think": info.get("think", ""),
        "actions": list(info.get("actions", [])),
        "reward": float(turn.reward),
        "reward_parts": to_jsonable(info.get("reward_parts", {})),
        "format_ok": bool(info.get("format_ok", False)),
        "action_is_valid": bool(info.get("action_is_valid", False)),
        "invalid_actions": to_jsonable(info.get("invalid_actions", [])),
        "dropped_actions": to_jsonable(info.get("dropped_actions", [])),
        "success": bool(info.get("success", False)),
        "reason": info.get("reason"),
        "observation": turn.observation,
        "state": state,
        "info_extra": to_jsonable(env_extras(info)),
    }


def _episode_record(entry: SuiteEnv, episode: Episode, states: list[str | None], initial: str | None,
                    final_view: Any) -> dict[str, Any]:
    """The result file's record of one played episode (see the module docstring)."""
    error, kind = episode.error, None
    if error is None and episode.end_reason is not None:
        if episode.end_reason.startswith(ENGINE_FAILURE + ":"):  # the endpoint failed the reply, not the model
            error, kind = episode.end_reason, "engine"
        else:
            error = f"ended by the agent: {episode.end_reason}"
    return {
        "env": entry.name,
        "env_id": entry.env_id,
        "state_index": episode.job.tag,
        "seed": episode.seed,
        "rollout": episode.rollout,
        "system_prompt": episode.system_prompt,
        "observation": episode.first_observation if episode.messages else "",
        "initial_state": initial,
        "reset_info": to_jsonable(env_extras(episode.reset_info)),
        "turns": [_turn_record(t, s) for t, s in zip(episode.turns, states)],
        "success": bool(episode.turns[-1].info.get("success", False)) if episode.turns else False,
        "reward": episode.reward,
        "terminated": episode.terminated,
        "truncated": episode.truncated,
        "final_view": final_view,
        "error": error,
        **({"error_kind": kind} if kind is not None else {}),
    }


def _make_slots(entry: SuiteEnv) -> EnvSlots:
    slots = EnvSlots(entry.env_id, entry.make_kwargs())
    try:
        slots.get(0)  # fail here, naming the suite entry, rather than inside the first batch
    except gym.error.Error as exc:
        slots.close()
        raise ValueError(f"cannot make env {entry.env_id!r} of suite entry {entry.name!r}: {exc}") from exc
    return slots


def run_env(
    entry: SuiteEnv, agent: Agent, *, batch_size: int = 16, progress: Any = None
) -> list[dict[str, Any]]:
    """Play every episode of one suite entry through the episode driver; returns the episode records in (state,
    rollout) order."""
    jobs = [
        EpisodeJob(group_id=i, seed=seed, rollout=r, options=entry.options_for(i), tag=i)
        for i, seed in enumerate(entry.seeds)
        for r in range(entry.rollouts_per_state)
    ]
    begin = getattr(agent, "begin_env", None)
    if callable(begin):
        begin(entry)
    states: dict[int, list[str | None]] = {}
    initial: dict[int, str | None] = {}
    records: dict[int, dict[str, Any]] = {}  # id(episode) -> record (streaming agents end episodes out of order)

    def on_step(episode: Episode, _turn: Turn) -> None:
        states.setdefault(id(episode), []).append(state_record(episode.env))

    def on_batch_end(batch: list[Episode]) -> None:
        for episode in batch:
            try:
                final_view = to_jsonable(episode.env.unwrapped.state_view()) if episode.env is not None else None
            except Exception as exc:  # noqa: BLE001 - a broken view must not lose the episode
                final_view = {"error": repr(exc)}
            records[id(episode)] = _episode_record(entry, episode, states.pop(id(episode), []),
                                                   initial.pop(id(episode), None), final_view)

    def on_reset(episode: Episode) -> None:  # the leaderboard draws the initial grid (or board)
        initial[id(episode)] = state_record(episode.env)

    with _make_slots(entry) as slots:
        episodes = play_episodes(entry.env_id, jobs, agent, env_name=entry.name, batch_size=batch_size, envs=slots,
                                 on_error="record", progress=progress, on_reset=on_reset, on_step=on_step,
                                 on_batch_end=on_batch_end)  # fmt: skip
    return [records[id(episode)] for episode in episodes]


def _load_checkpoint(path: Path | None, suite: Suite, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The finished envs of an interrupted run of the same suite (hash) and agent (identity), if any; a checkpoint
    that fails its schema is ignored with a warning (the run starts afresh and overwrites it)."""
    if path is None or not (path.exists() or path.is_symlink()):
        return None
    try:
        data = read_json(path, "checkpoint")  # a FIFO or a device is refused by its type, unread
        problems = validate_checkpoint(data)
        if problems:
            raise ResultFileError(path, problems, "checkpoint")
    except ResultFileError as exc:
        print(f"warning: ignoring {exc}", file=sys.stderr)
        return None
    if data["suite_hash"] != suite.hash or data["agent"] != identity:
        return None
    return data


def run_suite(
    suite: Suite,
    agent: Agent,
    *,
    batch_size: int = 16,
    progress: bool = True,
    checkpoint: str | Path | None = None,
    output: str | Path | None = None,
) -> dict[str, Any]:
    """Evaluate ``agent`` on every env of ``suite``; returns the result dict (see the module docstring).

    With ``checkpoint``, the episodes of each finished env are saved there, and a later run of the same suite and
    agent resumes after the last finished env (every env's episodes depend only on the suite and the agent, so the
    result is the same as an uninterrupted run's); the file is removed when the run completes, unless an env was
    mostly failed by the engine (a model endpoint down): such an env is never kept in the checkpoint, which then stays
    for the next run to resume after the envs that did play. With ``output``, the result is saved there
    (:func:`save_result`) before the checkpoint is removed, so no crash loses both.
    """
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"invalid argument batch_size={batch_size!r}: expected an int >= 1")
    from tqdm.auto import tqdm

    started = time.time()
    checkpoint_path = Path(checkpoint) if checkpoint is not None else None
    resumed = _load_checkpoint(checkpoint_path, suite, agent.identity())
    env_seconds: dict[str, float] = dict(resumed["env_seconds"]) if resumed else {}
    done_envs = set(env_seconds)
    episodes: list[dict[str, Any]] = [e for e in resumed["episodes"] if e["env"] in done_envs] if resumed else []
    if resumed:
        print(f"resuming from {checkpoint_path}: {sorted(done_envs)} already done", file=sys.stderr)
    failed_envs: set[str] = set()  # envs the engine mostly failed: kept out of the checkpoint
    bar = tqdm(total=suite.num_episodes, desc=f"{agent.identity().get('name')} on {suite.suite_id}", unit="ep",
               disable=not progress, file=sys.stderr, dynamic_ncols=True, initial=len(episodes))  # fmt: skip
    try:
        for entry in suite.envs:
            if entry.name in done_envs:
                continue
            bar.set_postfix_str(entry.name)
            t0 = time.perf_counter()
            played = run_env(entry, agent, batch_size=batch_size, progress=bar)
            episodes.extend(played)
            env_seconds[entry.name] = round(time.perf_counter() - t0, 3)
            failed = [e for e in played if e.get("error_kind") == "engine"]
            if engine_failed(len(failed), len(played)):  # kept out of the checkpoint: the next run plays it again
                failed_envs.add(entry.name)
                print(f"\nwarning: {len(failed)} of {len(played)} episodes of {entry.name} failed on the engine, not "
                      f"on the model; the first: {failed[0]['error']}", file=sys.stderr)  # fmt: skip
            elif checkpoint_path is not None:
                save_result({"format": CHECKPOINT_FORMAT, "suite_hash": suite.hash, "agent": agent.identity(),
                             "env_seconds": {k: v for k, v in env_seconds.items() if k not in failed_envs},
                             "episodes": [e for e in episodes if e["env"] not in failed_envs]},
                            checkpoint_path)  # fmt: skip
    finally:
        bar.close()
    order = {e.name: i for i, e in enumerate(suite.envs)}
    episodes.sort(key=lambda e: order[e["env"]])  # resumed or not, the suite's env order (stable within an env)
    identity = agent.identity()
    if identity.get("kind") == "model" and "decoding" not in identity:
        # The decoding the model ran with is the suite's, pinned; written here so the agent's entry is complete.
        decodings = {e.name: e.decoding for e in suite.envs}
        distinct = {json.dumps(d, sort_keys=True) for d in decodings.values()}
        identity["decoding"] = next(iter(decodings.values())) if len(distinct) == 1 else decodings
    settings = getattr(agent, "generation_settings", None)
    if identity.get("kind") == "model" and callable(settings):
        # What every env was effectively generated with (generation prefix, stop strings, thinking, decoding):
        # the suite hash cannot tell a prefixed run from an unprefixed one, this hash can (see the leaderboard).
        identity["generation"] = to_jsonable(settings(suite.envs))
        identity["generation_hash"] = generation_hash(identity["generation"])
    result = {
        "format": RESULT_FORMAT,
        "format_version": RESULT_FORMAT_VERSION,
        "suite": suite.identity(),
        "agent": identity,
        "versions": package_versions(include_ml=identity.get("kind") == "model"),
        "episodes": episodes,
        "summary": summarize(episodes, [e.name for e in suite.envs]),
        "timings": {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "wall_seconds": round(time.time() - started, 3),
            "env_seconds": env_seconds,
            "batch_size": batch_size,
        },
    }
    if output is not None:
        save_result(result, output)
    if checkpoint_path is not None and checkpoint_path.is_file() and not failed_envs:
        checkpoint_path.unlink()  # else it keeps the envs that did play, for the next run to resume after
    return result


# ------------------------------------------------------------------------------------------------------ files
def save_result(result: dict[str, Any], path: str | Path) -> Path:
    """Write a result (or a ``.partial`` checkpoint) as JSON (UTF-8, stable key order), atomically; returns the path.

    What is written is checked against the schema first (:mod:`ragen_trainer.evaluation.schema`): a result that fails
    it (a NaN anywhere, a rate outside [0, 1], a summary that its episodes do not reproduce) is never written, and
    :class:`~ragen_trainer.evaluation.schema.ResultFileError` (a ``ValueError``) names the path, the field and what is
    wrong; the previous file, if any, is left as it was.
    """
    path = Path(path)
    checkpoint = isinstance(result, dict) and result.get("format") == CHECKPOINT_FORMAT
    validate = validate_checkpoint if checkpoint else validate_result
    what = "checkpoint" if checkpoint else "result file"
    try:
        text = json.dumps(result, ensure_ascii=False, indent=1, allow_nan=False)
    except ValueError as exc:  # a NaN or an infinity: the schema names where
        problems = validate(result) or [("", f"not JSON-serialisable: {exc}")]
        raise ResultFileError(path, problems, f"refusing to write {what}") from None
    except TypeError as exc:
        raise ResultFileError(path, [("", f"not JSON-serialisable: {exc}")], f"refusing to write {what}") from None
    problems = validate(json.loads(text))  # exactly what the file will hold
    if problems:
        raise ResultFileError(path, problems, f"refusing to write {what}")
    return atomic_write_text(path, text + "\n")


def load_result(path: str | Path, *, consistency: bool = True) -> dict[str, Any]:
    """Read a result file and check it against the schema; returns the parsed JSON.

    :class:`~ragen_trainer.evaluation.schema.ResultFileError` (a ``ValueError``) names the file, the field (its path
    inside the JSON) and what is wrong, for a file that is missing, not JSON, not a ragen evaluation result, or fails
    the schema. ``consistency=False`` checks types and ranges only, not that the summary agrees with the episodes
    (what ``--rescore`` recomputes).
    """
    data = read_json(path)
    problems = validate_result(data, consistency=consistency)
    if problems:
        raise ResultFileError(path, problems)
    return data


def without_timings(result: dict[str, Any]) -> dict[str, Any]:
    """The result less its ``timings``: what two runs of the same suite, agent and seeds must agree on."""
    return {k: v for k, v in result.items() if k != "timings"}


def summary_lines(result: dict[str, Any]) -> Iterable[str]:
    """A plain-text table of a result's summary (printed at the end of ``ragen-trainer eval``)."""
    envs = result["summary"]["envs"]
    width = max([18, *(len(name) + 2 for name in envs)])  # the games suite's names are longer than 16 characters
    header = (
        f"{'env':<{width}}{'episodes':>9}{'success %':>16}{'partial %':>11}{'reward':>9}{'invalid %':>10}{'turns':>7}"
    )
    yield header
    yield "-" * len(header)

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}"

    for name, s in envs.items():
        se = "" if s["success_rate_se"] is None else f" ± {100 * s['success_rate_se']:.1f}"
        yield (
            f"{name:<{width}}{s['episodes']:>9}{pct(s['success_rate']) + se:>16}{pct(s['partial_credit']):>11}"
            f"{s['mean_reward']:>9.3f}{pct(s['invalid_action_rate']):>10}{s['mean_turns']:>7.2f}"
        )
    games = [(name, outcome_rates(s), s) for name, s in envs.items() if outcome_rates(s)]
    if games:
        yield "-" * len(header)
        yield "games: outcome % ± standard error (an episode without an outcome counts as a loss / no deal), game score"
        for name, rates, s in games:
            cells = [f"{word} {pct(rate)}" + ("" if se is None else f" ± {100 * se:.1f}") for word, rate, se in rates]
            yield f"{name:<{width}}" + "  ".join(cells) + f"  score {s['mean_score']:.3f}"
    overall = result["summary"]["overall"]
    score = "-" if overall["score"] is None else f"{overall['score']:.1f}"
    if overall.get("score_se") is not None:
        score += f" ± {overall['score_se']:.1f}"
    yield "-" * len(header)
    yield f"overall score (mean success % over {overall['envs']} envs): {score}"
