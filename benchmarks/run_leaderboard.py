"""Evaluate the reference agents (random = floor, oracle = ceiling) and optionally a model on a suite, then build the
leaderboard (Markdown + HTML) from their result files and any others given.

    python benchmarks/run_leaderboard.py --suite quick-v2                      # random + oracle, seconds
    python benchmarks/run_leaderboard.py --suite quick-v2 --model smollm2      # + the bundled SmolLM2 (CPU: long)
    python benchmarks/run_leaderboard.py --suite paper-v2 --results results/my-model.json

Writes ``<out>/<agent>__<suite>.json`` per agent, ``<out>/leaderboard.md`` and ``<out>/leaderboard.html``, and prints
the table plus the time each agent took.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's packages, also without an install

from ragen_trainer.evaluation.agents import ModelAgent, OracleAgent, RandomAgent
from ragen_trainer.evaluation.leaderboard import build_leaderboard
from ragen_trainer.evaluation.runner import run_suite, save_result
from ragen_trainer.evaluation.suites import load_suite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="quick-v2", help="suite id or JSON file (default quick-v2)")
    parser.add_argument("--envs", default=None, help="comma-separated env names (default: all of the suite)")
    parser.add_argument("--max-states", type=int, default=None, help="only the first N seeds per env")
    parser.add_argument("--model", default=None, help="also evaluate this model (smollm2 = the bundled one)")
    parser.add_argument("--engine", default="hf", choices=("hf", "hf-generate", "vllm", "openai"))
    parser.add_argument("--base-url", default=None, help="endpoint for --engine openai")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--results", nargs="*", default=[], help="more result files to put on the board")
    parser.add_argument("--out", default="results", help="output folder (default results/)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    try:
        suite = load_suite(args.suite).select(args.envs.split(",") if args.envs else None, args.max_states)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    agents = [RandomAgent(), OracleAgent()]
    if args.model:
        agents.append(ModelAgent.load(args.model, engine=args.engine, base_url=args.base_url, device=args.device,
                                      batch_size=args.batch_size))  # fmt: skip
    paths, timings = [], []
    for agent in agents:
        start = time.perf_counter()
        result = run_suite(suite, agent, batch_size=args.batch_size, progress=not args.no_progress)
        agent.close()
        name = f"{agent.name}__{suite.suite_id}".replace("/", "-").replace("+", "-")
        paths.append(save_result(result, out / f"{name}.json"))
        timings.append((agent.name, len(result["episodes"]), time.perf_counter() - start, result["summary"]["overall"]))
    markdown, _ = build_leaderboard(paths + [Path(p) for p in args.results], markdown_path=out / "leaderboard.md",
                                    html_path=out / "leaderboard.html")  # fmt: skip
    print(markdown)
    print(f"{'agent':<28}{'episodes':>9}{'seconds':>10}{'score':>9}")
    for name, episodes, seconds, overall in timings:
        print(f"{name:<28}{episodes:>9}{seconds:>10.1f}{overall['score']:>9.1f}")
    print(f"wrote {len(paths)} result file(s), {out / 'leaderboard.md'} and {out / 'leaderboard.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
