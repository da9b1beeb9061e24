"""Throughput of every offline ragen env, single process: raw env steps/s and protocol turns/s.

* raw steps/s: ``env.unwrapped.step(action)`` with one valid action string per step (the env's own dynamics, text
  observation and info dict), resetting with a new seed whenever an episode ends;
* protocol turns/s: ``TurnProtocol.step(reply)`` with a whole model reply (``<think>..</think><answer>a||b</answer>``),
  parsing, executing its actions and writing the next prompt, resetting when the episode ends. The replies are a fixed
  mix of well-formed ones (75 %) and malformed ones (25 %), as early training produces.

Targets (issue 2): FrozenLake >= 50,000 raw steps/s and >= 20,000 protocol turns/s on one core. Rates are given per
CPU second of the benchmark process (what one core does, even on a shared machine) and per wall second; the exit
status is 1 when a target is missed.

    python benchmarks/bench_envs.py            # all offline envs, ~1 s each
    python benchmarks/bench_envs.py --seconds 3 --env FrozenLake
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable

import gymnasium as gym

import ragen_envs  # noqa: F401  (registers the ids)
from ragen_envs.protocol import TurnProtocol

TARGETS = {"ragen/FrozenLake-v0": (50_000, 20_000)}


def _actions_for(env_id: str, base) -> list[str]:  # type: ignore[no-untyped-def]
    if "Countdown" in env_id:
        return ["(1 + 2) * 3", "10 - 4 / 2", "((7))", "5 * 5 - 1"]
    if base.action_names:
        return [a for a in base.action_names]
    return ["noop"]


def _replies_for(actions: list[str]) -> list[str]:
    a, b = actions[0], actions[-1]
    good = [
        f"<think>I should move {a} first, then {b}.</think><answer>{a} || {b}</answer>",
        f"<think>One step is enough here.</think><answer>{b}</answer>",
        f"<think>Let me try this.</think><answer>{a.lower()}</answer>",
    ]
    bad = ["I think the answer is Left."]
    return good + bad


def _rate(run: Callable[[], int], seconds: float) -> tuple[float, float]:
    """``(per CPU second, per wall second)``: CPU time is what "on one core" means on a shared, loaded machine."""
    run()  # warm up (first map, caches)
    run_until = time.perf_counter() + seconds
    count, wall0, cpu0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() < run_until:
        count += run()
    return count / max(time.process_time() - cpu0, 1e-9), count / (time.perf_counter() - wall0)


def _bench_steps(env: gym.Env, inputs: list[str], seconds: float) -> tuple[float, float]:
    """Steps/s of ``env`` fed ``inputs`` in turn, resetting with a new seed whenever an episode ends."""
    env.reset(seed=0)
    state = {"seed": 0, "i": 0}

    def run() -> int:  # 1000 steps per call keeps the clock reads out of the measurement
        step = env.step
        i = state["i"]
        for _ in range(1000):
            _, _, terminated, truncated, _ = step(inputs[i % len(inputs)])
            i += 1
            if terminated or truncated:
                state["seed"] += 1
                env.reset(seed=state["seed"])
        state["i"] = i
        return 1000

    return _rate(run, seconds)


def bench_raw(env_id: str, seconds: float) -> tuple[float, float]:
    env = gym.make(env_id).unwrapped
    return _bench_steps(env, _actions_for(env_id, env), seconds)


def bench_protocol(env_id: str, seconds: float) -> tuple[float, float]:
    base = gym.make(env_id).unwrapped
    env = TurnProtocol(base, ragen_envs.reference_settings(env_id))  # the id's own protocol settings
    return _bench_steps(env, _replies_for(_actions_for(env_id, base)), seconds)


def offline_env_ids() -> list[str]:
    ids = []
    for env_id, spec in ragen_envs.ENV_IDS.items():
        if "WebShop" in env_id:
            continue  # needs a running server: not a single-process benchmark
        if importlib.util.find_spec(spec.env_cls.partition(":")[0]) is None:
            continue
        ids.append(env_id)
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="measuring time per env and mode")
    parser.add_argument("--env", default="", help="only ids containing this text")
    args = parser.parse_args(argv)
    rows = []
    ids = [i for i in offline_env_ids() if args.env.lower() in i.lower()]
    for n, env_id in enumerate(ids, 1):
        print(f"[{n}/{len(ids)}] {env_id} ...", file=sys.stderr, flush=True)
        try:
            raw = bench_raw(env_id, args.seconds)
            turns = bench_protocol(env_id, args.seconds)
        except Exception as exc:  # a broken env must not hide the others' figures
            print(f"    failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        rows.append((env_id, raw, turns))
    ok = True
    header = (
        f"{'env':<26} {'raw steps/s':>12} {'turns/s':>10} {'raw (wall)':>11} {'turns (wall)':>13}  "
        "target raw / turns (CPU)"
    )
    print(header)
    print("-" * len(header))
    for env_id, raw, turns in rows:
        target = TARGETS.get(env_id)
        note = ""
        if target is not None:
            passed = raw[0] >= target[0] and turns[0] >= target[1]
            ok = ok and passed
            note = f"{target[0]:,} / {target[1]:,} {'PASS' if passed else 'MISS'}"
        print(f"{env_id:<26} {raw[0]:>12,.0f} {turns[0]:>10,.0f} {raw[1]:>11,.0f} {turns[1]:>13,.0f}  {note}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    print(
        f"\nsingle process; rates per CPU second of this process (and per wall second); {args.seconds:g} s per figure;"
        f"\nPython {sys.version.split()[0]}, gymnasium {gym.__version__}; "
        f"load average {load:.1f} on {os.cpu_count()} cores"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
