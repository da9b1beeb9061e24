"""Run a suite on an agent and produce one result (a JSON-serialisable dict, written by :func:`save_result`).

For each env of the suite, the episodes (every pinned seed x its rollouts) are played in batches of ``batch_size``
through the LLM-facing env: ``reset(seed=s)``, then turn after turn the agent's replies are stepped until every
episode of the batch has ended. Envs are made once per batch slot and reset for each episode (WebShop starts its
server once, not per episode).

The result holds::

    format, format_version    "ragen-eval-result", 1
    suite                     name, version, id, hash and the whole definition
    agent                     the agent's identity (name, kind, model path and hash, engine, decoding)
    versions                  python, ragen, gymnasium, numpy (+ torch, transformers for model agents)
    episodes                  one record per episode (see below)
    summary                   metrics.summarize(episodes): per env and overall
    timings                   wall-clock seconds; the only part that differs between two identical runs

An episode record: ``env, env_id, state_index, seed, rollout, system_prompt, observation`` (the first prompt),
``reset_info`` (the env's extra reset info, e.g. Sokoban's ``optimal_moves``), ``initial_state`` and per-turn
``state`` (the env's text state, for grid envs: the leaderboard draws them), ``turns``
(``reply, reply_tokens, think, actions, reward, reward_parts, format_ok, action_is_valid, invalid_actions,
dropped_actions, success, reason, observation, info_extra``), ``success, reward, terminated, truncated, final_view,
error``. Success is the env's own flag after the last turn, never inferred from the reward.
"""

from __future__ import annotations

import json
import platform
import sys
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import ragen_envs
from ragen_envs.core import INFO_KEYS
from ragen_trainer.evaluation.agents import Agent, AgentReply, TurnContext
from ragen_trainer.evaluation.metrics import summarize
from ragen_trainer.evaluation.suites import Suite, SuiteEnv
from ragen_trainer.rollout import dynamics_seed

RESULT_FORMAT = "ragen-eval-result"
RESULT_FORMAT_VERSION = 1
CHECKPOINT_FORMAT = "ragen-eval-checkpoint"

#: info keys the protocol itself adds; everything else outside INFO_KEYS is an env extra kept in ``info_extra``.
_PROTOCOL_INFO = {"reason", "turn", "actions_left", "invalid_actions", "dropped_actions", "system_prompt"}


# ------------------------------------------------------------------------------------------------------ helpers
def to_jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy of ``value`` (numpy scalars and arrays, tuples, sets; anything else as its ``repr``)."""
    if depth > 20:
        return repr(value)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if np.isfinite(f) else repr(f)
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


class _Episode:
    """One live episode: its env, chat, context and record."""

    def __init__(self, entry: SuiteEnv, env: gym.Env, state_index: int, seed: int, rollout: int) -> None:
        self.env = env
        self.grid = is_grid_env(env)
        self.done = False
        options = entry.options_for(state_index)
        if rollout > 0:  # further rollouts of a state: same initial state, their own env randomness (slips, payouts)
            options = {**(options or {}), "dynamics_seed": dynamics_seed(seed, rollout)}
        observation, info = env.reset(seed=seed, options=options)
        base = env.unwrapped
        self.ctx = TurnContext(
            env_name=entry.name,
            env_id=entry.env_id,
            seed=seed,
            rollout=rollout,
            messages=[{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": observation}],
            info=info,
            env=env,
        )
        self.record: dict[str, Any] = {
            "env": entry.name,
            "env_id": entry.env_id,
            "state_index": state_index,
            "seed": seed,
            "rollout": rollout,
            "system_prompt": info["system_prompt"],
            "observation": observation,
            "initial_state": base.state_text() if self.grid else None,
            "reset_info": to_jsonable({k: v for k, v in info.items() if k not in INFO_KEYS and k not in _PROTOCOL_INFO}),
            "turns": [],
            "success": False,
            "reward": 0.0,
            "terminated": False,
            "truncated": False,
            "final_view": None,
            "error": None,
        }

    def step(self, reply: AgentReply) -> None:
        observation, reward, terminated, truncated, info = self.env.step(reply.text)
        base = self.env.unwrapped
        turn = {
            "reply": reply.text,
            "reply_tokens": reply.tokens,
            "think": info.get("think", ""),
            "actions": list(info.get("actions", [])),
            "reward": float(reward),
            "reward_parts": to_jsonable(info.get("reward_parts", {})),
            "format_ok": bool(info.get("format_ok", False)),
            "action_is_valid": bool(info.get("action_is_valid", False)),
            "invalid_actions": to_jsonable(info.get("invalid_actions", [])),
            "dropped_actions": to_jsonable(info.get("dropped_actions", [])),
            "success": bool(info.get("success", False)),
            "reason": info.get("reason"),
            "observation": observation,
            "state": base.state_text() if self.grid else None,
            "info_extra": to_jsonable({k: v for k, v in info.items() if k not in INFO_KEYS and k not in _PROTOCOL_INFO}),
        }
        self.record["turns"].append(turn)
        self.record["reward"] += float(reward)
        self.record["success"] = turn["success"]
        self.ctx.info = info
        self.ctx.messages.append({"role": "assistant", "content": reply.text})
        self.ctx.messages.append({"role": "user", "content": observation})
        if terminated or truncated:
            self.record["terminated"], self.record["truncated"] = bool(terminated), bool(truncated)
            self.finish()

    def fail(self, message: str) -> None:
        self.record["error"] = message
        self.finish()

    def finish(self) -> None:
        self.done = True
        try:
            self.record["final_view"] = to_jsonable(self.env.unwrapped.state_view())
        except Exception as exc:  # a broken view must not lose the episode
            self.record["final_view"] = {"error": repr(exc)}


def _make_env(entry: SuiteEnv) -> gym.Env:
    try:
        return gym.make(entry.env_id, **entry.env_kwargs)
    except gym.error.Error as exc:
        raise ValueError(f"cannot make env {entry.env_id!r} of suite entry {entry.name!r}: {exc}") from exc


def run_env(
    entry: SuiteEnv, agent: Agent, *, batch_size: int = 16, progress: Any = None
) -> list[dict[str, Any]]:
    """Play every episode of one suite entry; returns the episode records in (state, rollout) order."""
    jobs = [(i, seed, r) for i, seed in enumerate(entry.seeds) for r in range(entry.rollouts_per_state)]
    pool: list[gym.Env] = []
    records: list[dict[str, Any]] = []
    begin = getattr(agent, "begin_env", None)
    if callable(begin):
        begin(entry)
    try:
        for start in range(0, len(jobs), batch_size):
            chunk = jobs[start : start + batch_size]
            while len(pool) < len(chunk):
                pool.append(_make_env(entry))
            episodes = [_Episode(entry, pool[k], *job) for k, job in enumerate(chunk)]
            # Each turn ends at least one episode's turn budget sooner; the protocol truncates at max_turns.
            for turn in range(10_000):
                live = [e for e in episodes if not e.done]
                if not live:
                    break
                if progress is not None and hasattr(progress, "set_postfix_str"):
                    progress.set_postfix_str(f"{entry.name} turn {turn + 1}, {len(live)} live")
                try:
                    replies = agent.reply_batch([e.ctx for e in live])
                    if len(replies) != len(live):
                        raise RuntimeError(f"agent returned {len(replies)} replies for {len(live)} episodes")
                except Exception:  # an agent failure ends these episodes with the error recorded, not the run
                    message = traceback.format_exc(limit=3)
                    for e in live:
                        e.fail(message)
                    if progress is not None:
                        progress.update(len(live))
                    continue
                for e, reply in zip(live, replies):
                    try:
                        e.step(reply if isinstance(reply, AgentReply) else AgentReply(str(reply)))
                    except Exception:
                        e.fail(traceback.format_exc(limit=3))
                if progress is not None:  # count episodes as they end, not at the end of the batch
                    progress.update(sum(1 for e in live if e.done))
            for e in episodes:
                if not e.done:
                    e.fail("episode did not end within 10000 turns")
                    if progress is not None:
                        progress.update(1)
                records.append(e.record)
    finally:
        for env in pool:
            env.close()
    return records


def _load_checkpoint(path: Path | None, suite: Suite, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The finished envs of an interrupted run of the same suite (hash) and agent (identity), if any."""
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if data.get("format") != CHECKPOINT_FORMAT or data.get("suite_hash") != suite.hash or data.get("agent") != identity:
        return None
    return data


def run_suite(
    suite: Suite,
    agent: Agent,
    *,
    batch_size: int = 16,
    progress: bool = True,
    checkpoint: str | Path | None = None,
) -> dict[str, Any]:
    """Evaluate ``agent`` on every env of ``suite``; returns the result dict (see the module docstring).

    With ``checkpoint``, the episodes of each finished env are saved there, and a later run of the same suite and
    agent resumes after the last finished env (every env's episodes depend only on the suite and the agent, so the
    result is the same as an uninterrupted run's); the file is removed when the run completes.
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
    bar = tqdm(total=suite.num_episodes, desc=f"{agent.identity().get('name')} on {suite.suite_id}", unit="ep",
               disable=not progress, file=sys.stderr, dynamic_ncols=True, initial=len(episodes))  # fmt: skip
    try:
        for entry in suite.envs:
            if entry.name in done_envs:
                continue
            bar.set_postfix_str(entry.name)
            t0 = time.perf_counter()
            episodes.extend(run_env(entry, agent, batch_size=batch_size, progress=bar))
            env_seconds[entry.name] = round(time.perf_counter() - t0, 3)
            if checkpoint_path is not None:
                save_result({"format": CHECKPOINT_FORMAT, "suite_hash": suite.hash, "agent": agent.identity(),
                             "env_seconds": env_seconds, "episodes": episodes}, checkpoint_path)  # fmt: skip
    finally:
        bar.close()
    order = {e.name: i for i, e in enumerate(suite.envs)}
    episodes.sort(key=lambda e: order[e["env"]])  # resumed or not, the suite's env order (stable within an env)
    if checkpoint_path is not None and checkpoint_path.is_file():
        checkpoint_path.unlink()
    identity = agent.identity()
    if identity.get("kind") == "model" and "decoding" not in identity:
        # The decoding the model ran with is the suite's, pinned; written here so the agent's entry is complete.
        decodings = {e.name: e.decoding for e in suite.envs}
        distinct = {json.dumps(d, sort_keys=True) for d in decodings.values()}
        identity["decoding"] = next(iter(decodings.values())) if len(distinct) == 1 else decodings
    return {
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


# ------------------------------------------------------------------------------------------------------ files
def save_result(result: dict[str, Any], path: str | Path) -> Path:
    """Write a result as JSON (UTF-8, stable key order) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return path


def load_result(path: str | Path) -> dict[str, Any]:
    """Read a result file; ``ValueError`` naming the file when it is not a ragen evaluation result."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ValueError(f"result file {str(path)!r} does not exist") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"result file {str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != RESULT_FORMAT:
        raise ValueError(f"{str(path)!r} is not a ragen evaluation result (expected format {RESULT_FORMAT!r})")
    if data.get("format_version") != RESULT_FORMAT_VERSION:
        raise ValueError(
            f"{str(path)!r} has result format version {data.get('format_version')!r}; this ragen reads "
            f"{RESULT_FORMAT_VERSION}"
        )
    for key in ("suite", "agent", "episodes"):
        if key not in data:
            raise ValueError(f"result file {str(path)!r} lacks the {key!r} key")
    return data


def without_timings(result: dict[str, Any]) -> dict[str, Any]:
    """The result less its ``timings``: what two runs of the same suite, agent and seeds must agree on."""
    return {k: v for k, v in result.items() if k != "timings"}


def summary_lines(result: dict[str, Any]) -> Iterable[str]:
    """A plain-text table of a result's summary (printed at the end of ``ragen-trainer eval``)."""
    envs = result["summary"]["envs"]
    header = f"{'env':<18}{'episodes':>9}{'success %':>16}{'partial %':>11}{'reward':>9}{'invalid %':>10}{'turns':>7}"
    yield header
    yield "-" * len(header)

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}"

    for name, s in envs.items():
        se = "" if s["success_rate_se"] is None else f" ± {100 * s['success_rate_se']:.1f}"
        yield (
            f"{name:<18}{s['episodes']:>9}{pct(s['success_rate']) + se:>16}{pct(s['partial_credit']):>11}"
            f"{s['mean_reward']:>9.3f}{pct(s['invalid_action_rate']):>10}{s['mean_turns']:>7.2f}"
        )
    overall = result["summary"]["overall"]
    score = "-" if overall["score"] is None else f"{overall['score']:.1f}"
    if overall.get("score_se") is not None:
        score += f" ± {overall['score_se']:.1f}"
    yield "-" * len(header)
    yield f"overall score (mean success % over {overall['envs']} envs): {score}"
