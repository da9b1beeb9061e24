"""One trained ragen checkpoint, three ways to run it, one result: a plain ``transformers.pipeline``, ``transformers
serve`` + ragen's ``openai`` engine, and ragen's own evaluation (``ragen-trainer eval``'s ``hf`` engine) play the same
episodes; the table says how often each succeeds, how many of its replies are identical to the ``hf`` eval's, and how
long it took.

    python benchmarks/serving_agreement.py CHECKPOINT [--env ragen/Bandit-v0] [--episodes 16] [--sample]
        [--upgrade DIR] [--no-serve] [--json PATH] [--device auto] [--dtype float32]

``CHECKPOINT`` is a folder written by ``ragen-trainer train`` (its ``final/``, or a ``checkpoint-N``).

The three paths:

1. **pipeline**: ``transformers.pipeline("text-generation", model=CHECKPOINT)`` gets the env's chat (system prompt and
   observation, as ``env.reset(seed)`` gives them) and its assistant message's content goes to ``env.step`` as it is:
   nothing ragen-specific. The checkpoint's chat template pre-writes the generation prefix (``<answer>``) and its
   response template returns it, cut after the first stop string (:mod:`ragen_trainer.model_card`). Episodes of
   several turns go on with the reply and the next observation appended to the chat;
2. **served**: ``transformers serve`` on 127.0.0.1 (a free port, a subprocess, each request loading the folder it
   names), evaluated by ragen's runner through its ``openai`` engine with the model named by its folder path;
3. **hf eval**: ``ModelAgent.load(CHECKPOINT, engine="hf")`` and the runner: what ``ragen-trainer eval`` does. The
   reference the other two are compared with.

All three play ``--env`` on seeds 1000000.. (the shipped suites' first seeds) with the protocol the checkpoint was
trained with (its ``ragen_config.yaml``; for another env than the trained one only the settings that shape the prompt
and the reply format are carried over, the env keeps its own turn and action budgets) and the run's ``max_new_tokens``.

* Decoding: greedy by default, the only decoding under which different implementations must give identical replies.
  ``--sample`` uses the checkpoint's validation temperature / top_p: then the paths agree only in distribution.
* Several turns: ragen's ``hf`` engine keeps earlier replies *cleaned* in the conversation (as training did), the chat
  paths keep them as returned; where a reply's cleaned form differs from it, later turns can differ legitimately.
* A folder saved before ragen wrote its serving files (no prefix in its chat template) is reported as such: through a
  pipeline or a server its replies lack the prefix. ``--upgrade DIR`` writes a copy with those files to ``DIR``
  (:func:`ragen_trainer.model_card.write_serving_folder`, weights untouched) and compares that copy instead.
* ``--dtype float32`` (default) on every path: mixed-precision kernels can flip a greedy token between batched and
  unbatched generation, which is not what this check is after.

Exit status: 0 when every path ran (whether or not they agree: the table says that), 1 when a path crashed (named,
with why), 2 for a folder that is not a usable ragen checkpoint or a bad argument.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
import traceback
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's ragen, whatever is installed

import ragen_envs  # noqa: F401  (registers the ragen/* ids)
from ragen_trainer import models
from ragen_trainer.checkpoints.layout import CHECKPOINT_MARKER, is_ragen_checkpoint
from ragen_trainer.checkpoints.verify import checkpoint_problems
from ragen_trainer.config import load_config
from ragen_trainer.engines.local_server import serve_missing, transformers_serve
from ragen_trainer.evaluation.agents import ModelAgent
from ragen_trainer.evaluation.runner import run_suite
from ragen_trainer.evaluation.suites import suite_from_dict
from ragen_trainer.model_card import serving_settings, write_serving_folder

DEFAULT_ENV = "ragen/Bandit-v0"
FIRST_SEED = 1_000_000  # the shipped suites' first seeds
#: Protocol settings carried over to an env other than the trained one: those that shape the prompt and the reply
#: format (so the generation prefix and stop strings are the trained ones); turn and action budgets stay the env's.
CARRIED_SETTINGS = ("enable_think", "reply_prefix", "stop_after_answer", "prompt_layout", "bare_answers",
                    "lenient_actions", "action_sep")  # fmt: skip
MAX_TURNS_GUARD = 100  # a pipeline episode that never ends is a bug in the env, not something to wait for
SERVE_REQUEST_TIMEOUT_S = 600.0  # one request of a 135M model on a busy CPU can take a while
MAX_BATCH = 16  # ragen-trainer eval's default --batch-size

PIPELINE, SERVED, HF_EVAL = "pipeline", "served", "hf eval"
PATH_LABELS = {
    PIPELINE: "pipeline (transformers.pipeline)",
    SERVED: "served (transformers serve + openai engine)",
    HF_EVAL: "hf eval (ragen-trainer eval)",
}


class CheckpointError(ValueError):
    """The folder is not a ragen checkpoint this script can compare."""


@dataclass
class Outcome:
    """One episode as a path played it."""

    seed: int
    replies: list[str]
    success: bool


@dataclass
class PathRun:
    """What one path gave: its episodes (in seed order), the seconds it took (loading included), or why it crashed."""

    name: str
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.skipped is None


@dataclass(frozen=True)
class Plan:
    """The episodes all paths play and how they decode."""

    folder: Path
    suite: Any  # ragen_trainer.evaluation.suites.Suite, one env
    seeds: list[int]
    sample: bool
    temperature: float
    top_p: float
    max_new_tokens: int
    prefix: str | None
    device: str
    dtype: str

    @property
    def entry(self) -> Any:
        return self.suite.envs[0]

    @property
    def batch_size(self) -> int:
        return min(MAX_BATCH, len(self.seeds))


# ---------------------------------------------------------------------------------------------------- the checkpoint
def check_checkpoint(folder: Path) -> None:
    """Raise :class:`CheckpointError` saying what is missing when ``folder`` is not a ragen checkpoint to compare."""
    if not folder.exists():
        raise CheckpointError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is a file: expected a checkpoint folder written by `ragen-trainer train` "
                              "(its final/ or a checkpoint-N)")
    if not is_ragen_checkpoint(folder):
        raise CheckpointError(f"{folder} is not a ragen checkpoint: it needs {CHECKPOINT_MARKER} next to "
                              "config.json (or adapter_config.json), as `ragen-trainer train` writes into final/ and "
                              "checkpoint-N")
    if not (folder / "ragen_config.yaml").is_file():
        raise CheckpointError(f"{folder} has no ragen_config.yaml: the run's config says which protocol and decoding "
                              "the model was trained with, and this check plays exactly those")
    problems = checkpoint_problems(folder, training_state=False)
    if problems:
        raise CheckpointError(f"{folder} is damaged: " + "; ".join(problems))


def prepare_folder(folder: Path, upgrade: str | None, say: Callable[[str], None]) -> tuple[Path, str | None]:
    """The folder to compare and the generation prefix its chat template pre-writes; an old-style folder (no prefix)
    is reported, and with ``upgrade`` replaced by a copy that has the serving files."""
    prefix = models.saved_template_prefix(folder)
    if prefix is not None:
        return folder, prefix
    say(f"note: {folder}'s chat template does not pre-write the generation prefix (saved before ragen wrote its "
        "serving files): a pipeline or a server gets the prefix neither in its prompt nor in its reply.")
    if not upgrade:
        say("      compare a copy with the serving files instead: --upgrade DIR")
        return folder, None
    copy = write_serving_folder(folder, upgrade)  # ValueError when DIR exists
    prefix = models.saved_template_prefix(copy)
    say(f"wrote a copy with the serving files to {copy} (prefix {prefix!r}); comparing that one")
    return copy, prefix


def make_plan(folder: Path, prefix: str | None, args: argparse.Namespace) -> Plan:
    """The one-env suite of ``args.env`` on the seeds, with the checkpoint's protocol and decoding."""
    serving = serving_settings(load_config(str(folder / "ragen_config.yaml")))
    protocol = dict(serving.protocol)
    if args.env != serving.env_id:
        protocol = {k: v for k, v in protocol.items() if k in CARRIED_SETTINGS}
    sample = bool(args.sample) and serving.temperature > 0  # a greedy validation has no temperature to sample at
    temperature = serving.temperature if sample else 0.0
    seeds = list(range(FIRST_SEED, FIRST_SEED + args.episodes))
    suite = suite_from_dict({
        "name": "serving-agreement", "version": 1,
        "decoding": {"temperature": temperature, "top_p": serving.top_p, "max_new_tokens": serving.max_new_tokens,
                     "seed": 0},
        "envs": [{"name": args.env.split("/")[-1], "env_id": args.env, "seeds": seeds, "protocol": protocol}],
    })  # fmt: skip
    device = str(models.resolve_device(args.device))
    dtype = str(models.resolve_dtype(args.dtype, device)).replace("torch.", "")
    return Plan(folder=folder.resolve(), suite=suite, seeds=seeds, sample=sample, temperature=temperature,
                top_p=serving.top_p, max_new_tokens=serving.max_new_tokens, prefix=prefix, device=device,
                dtype=dtype)  # fmt: skip


# ---------------------------------------------------------------------------------------------------- 1. pipeline
def play_pipeline(plan: Plan, progress: bool) -> list[Outcome]:
    """Every episode through a plain ``transformers.pipeline``: the env's chat in, the assistant content to the env."""
    import gymnasium as gym
    import torch
    from tqdm.auto import tqdm
    from transformers import pipeline, set_seed

    entry = plan.entry
    pipe = pipeline("text-generation", model=str(plan.folder), device=plan.device, dtype=getattr(torch, plan.dtype))
    decoding: dict[str, Any] = (
        {"do_sample": True, "temperature": plan.temperature, "top_p": plan.top_p} if plan.sample else {"do_sample": False}
    )
    outcomes = []
    try:
        for index, seed in enumerate(tqdm(plan.seeds, desc="pipeline", unit="ep", disable=not progress,
                                          file=sys.stderr, dynamic_ncols=True)):  # fmt: skip
            env = gym.make(entry.env_id, **entry.make_kwargs())  # exactly the runner's env and protocol
            try:
                observation, info = env.reset(seed=seed, options=entry.options_for(index))
                system = str(info.get("system_prompt") or "")
                messages = ([{"role": "system", "content": system}] if system else []) + [
                    {"role": "user", "content": observation}
                ]
                replies: list[str] = []
                success = False
                for turn in range(MAX_TURNS_GUARD):
                    if plan.sample:  # reproducible per episode and turn, like ragen's seeded calls (not the same draws)
                        set_seed(zlib.crc32(f"{seed}|{turn}".encode()))
                    out = pipe(messages, max_new_tokens=plan.max_new_tokens, **decoding)[0]["generated_text"][-1]
                    reply = out["content"] if isinstance(out, dict) else str(out)
                    observation, _, terminated, truncated, info = env.step(reply)
                    replies.append(reply)
                    success = bool(info.get("success", False))
                    if terminated or truncated:
                        break
                    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": observation}]
                else:
                    raise RuntimeError(f"seed {seed}: the episode did not end within {MAX_TURNS_GUARD} turns")
            finally:
                env.close()
            outcomes.append(Outcome(seed, replies, success))
    finally:
        del pipe
        gc.collect()
    return outcomes


# ---------------------------------------------------------------------------------------------------- 2. served
def play_served(plan: Plan, progress: bool) -> list[Outcome]:
    """Every episode through ragen's runner and ``openai`` engine against ``transformers serve``."""
    with tempfile.TemporaryDirectory(prefix="ragen-serve-") as work, \
            transformers_serve(work, device=plan.device, dtype=plan.dtype) as server:  # fmt: skip
        url = server.url
        # transformers serve keeps stop strings in the text (restore_stop=False) and seeds torch globally per request,
        # so requests go one at a time. The model is named by its folder: ModelAgent reads the template's prefix there.
        agent = ModelAgent.load(str(plan.folder), engine="openai", base_url=url,
                                engine_kwargs={"restore_stop": False, "concurrency": 1, "max_retries": 0,
                                               "timeout": SERVE_REQUEST_TIMEOUT_S})  # fmt: skip
        try:
            result = run_suite(plan.suite, agent, batch_size=plan.batch_size, progress=progress)
        finally:
            agent.close()
    return outcomes_of(result, plan.seeds)


# ---------------------------------------------------------------------------------------------------- 3. hf eval
def play_hf_eval(plan: Plan, progress: bool) -> list[Outcome]:
    """Every episode as ``ragen-trainer eval`` plays it: ``ModelAgent.load(engine="hf")`` and the runner."""
    agent = ModelAgent.load(str(plan.folder), engine="hf", batch_size=plan.batch_size, device=plan.device,
                            dtype=plan.dtype)  # fmt: skip
    try:
        result = run_suite(plan.suite, agent, batch_size=plan.batch_size, progress=progress)
    finally:
        agent.close()
        del agent
        gc.collect()
    return outcomes_of(result, plan.seeds)


def outcomes_of(result: dict[str, Any], seeds: Sequence[int]) -> list[Outcome]:
    """The runner's episodes in seed order; raises when one ended in an error (the runner records errors rather than
    raising, so an engine that failed every request would otherwise look like a model that failed every episode)."""
    by_seed = {e["seed"]: e for e in result["episodes"]}
    errors = [(s, by_seed[s]["error"]) for s in seeds
              if by_seed[s]["error"] and not str(by_seed[s]["error"]).startswith("ended by the agent")]  # fmt: skip
    if errors:
        seed, error = errors[0]
        raise RuntimeError(f"{len(errors)} / {len(seeds)} episodes ended in an error; the first (seed {seed}):\n"
                           f"{str(error).strip()}")
    return [Outcome(s, [t["reply"] for t in by_seed[s]["turns"]], bool(by_seed[s]["success"])) for s in seeds]


# ---------------------------------------------------------------------------------------------------- comparison
def identical_replies(outcomes: Sequence[Outcome], reference: Sequence[Outcome]) -> tuple[int, int]:
    """(replies identical to the reference's, replies compared): turn by turn, a turn only one of them played counts
    as different."""
    same = total = 0
    for mine, theirs in zip(outcomes, reference):
        total += max(len(mine.replies), len(theirs.replies))
        same += sum(a == b for a, b in zip(mine.replies, theirs.replies))
    return same, total


def first_differences(outcomes: Sequence[Outcome], reference: Sequence[Outcome], limit: int = 3) -> list[str]:
    """Up to ``limit`` lines naming a seed and turn where the replies differ, both replies quoted."""
    lines = []
    for mine, theirs in zip(outcomes, reference):
        for turn in range(max(len(mine.replies), len(theirs.replies))):
            a = mine.replies[turn] if turn < len(mine.replies) else None
            b = theirs.replies[turn] if turn < len(theirs.replies) else None
            if a != b:
                lines.append(f"seed {mine.seed} turn {turn + 1}: {json.dumps(a)[:80]} vs hf eval {json.dumps(b)[:80]}")
                break
        if len(lines) >= limit:
            break
    return lines


def rows(runs: Sequence[PathRun]) -> list[dict[str, Any]]:
    """One JSON-ready row per path, the identical-reply counts against the hf eval (``None`` where it cannot say)."""
    reference = next((r for r in runs if r.name == HF_EVAL and r.ok), None)
    out = []
    for run in runs:
        n = len(run.outcomes)
        k = sum(o.success for o in run.outcomes)
        same, compared = identical_replies(run.outcomes, reference.outcomes) if run.ok and reference else (None, None)
        out.append({
            "path": run.name, "label": PATH_LABELS[run.name],
            "status": "ok" if run.ok else ("skipped" if run.skipped else "crashed"),
            "episodes": n if run.ok else None, "successes": k if run.ok else None,
            "success_pct": round(100.0 * k / n, 1) if run.ok and n else None,
            "identical_replies": same, "compared_replies": compared,
            "seconds": round(run.seconds, 2) if run.ok else None,
            "error": run.error, "skipped": run.skipped,
        })  # fmt: skip
    return out


def all_agree(table: Sequence[dict[str, Any]]) -> bool:
    """Every path that ran gave the hf eval's replies, all of them, and its successes."""
    ran = [r for r in table if r["status"] == "ok"]
    reference = next((r for r in ran if r["path"] == HF_EVAL), None)
    if reference is None or any(r["status"] == "crashed" for r in table):
        return False
    return all(r["identical_replies"] == r["compared_replies"] and r["successes"] == reference["successes"]
               for r in ran)  # fmt: skip


def markdown(table: Sequence[dict[str, Any]]) -> str:
    lines = ["| path | success (k / n, %) | replies identical to the hf eval (k / n) | seconds |",
             "|---|---|---|---|"]  # fmt: skip
    for row in table:
        if row["status"] == "ok":
            success = f"{row['successes']} / {row['episodes']} ({row['success_pct']:.1f}%)"
            same = "—" if row["identical_replies"] is None else f"{row['identical_replies']} / {row['compared_replies']}"
            lines.append(f"| {row['label']} | {success} | {same} | {row['seconds']:.1f} |")
        else:
            why = f"skipped ({row['skipped']})" if row["status"] == "skipped" else "crashed"
            lines.append(f"| {row['label']} | {why} | — | — |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a folder written by `ragen-trainer train` (final/ or checkpoint-N)")
    parser.add_argument("--env", default=DEFAULT_ENV, help=f"the ragen env played (default {DEFAULT_ENV})")
    parser.add_argument("--episodes", type=int, default=16, help="episodes per path, seeds 1000000.. (default 16)")
    parser.add_argument("--sample", action="store_true", help="sample at the validation temperature (not greedy)")
    parser.add_argument("--upgrade", metavar="DIR", default=None,
                        help="for a folder without the serving files: write a copy with them to DIR and compare it")
    parser.add_argument("--no-serve", action="store_true", help="skip the transformers serve path")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the table as JSON to PATH")
    parser.add_argument("--device", default="auto", help="'auto' (cuda when available), 'cpu', 'cuda:N'")
    parser.add_argument("--dtype", default="float32", help="model dtype on every path (default float32)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes {args.episodes}: expected an int >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the three paths, print the table; 0 when all ran, 1 when one crashed, 2 for a bad checkpoint or argument."""
    args = parse_args(argv)

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    import gymnasium as gym

    if args.env not in gym.registry:
        ragen_ids = sorted(k for k in gym.registry if k.startswith("ragen/"))
        say(f"error: --env {args.env!r} is not a registered env; ragen's: {', '.join(ragen_ids)}")
        return 2
    try:
        folder = Path(args.checkpoint).expanduser()
        check_checkpoint(folder)
        folder, prefix = prepare_folder(folder, args.upgrade, say)
        plan = make_plan(folder, prefix, args)
    except ValueError as exc:  # CheckpointError, write_serving_folder's refusals, a config or protocol that is wrong
        say(f"error: {exc}")
        return 2

    decoding = (f"sampled (temperature {plan.temperature}, top_p {plan.top_p})" if plan.sample else "greedy")
    if args.sample and not plan.sample:
        say("note: the checkpoint validated greedily (temperature 0): --sample has no temperature to use; greedy")
    say(f"checkpoint {plan.folder} | env {plan.entry.env_id} | prefix in template {plan.prefix!r} | {decoding} | "
        f"max_new_tokens {plan.max_new_tokens} | {len(plan.seeds)} episodes | {plan.device}, {plan.dtype}")

    paths: list[tuple[str, Callable[[Plan, bool], list[Outcome]]]] = [(PIPELINE, play_pipeline),
                                                                       (SERVED, play_served), (HF_EVAL, play_hf_eval)]
    runs = []
    for name, play in paths:
        run = PathRun(name)
        runs.append(run)
        if name == SERVED:
            run.skipped = "--no-serve" if args.no_serve else serve_missing()
            if run.skipped:
                say(f"{PATH_LABELS[name]}: skipped ({run.skipped})")
                continue
        say(f"-- {PATH_LABELS[name]}")
        started = time.perf_counter()
        try:
            run.outcomes = play(plan, not args.no_progress)
        except Exception as exc:  # noqa: BLE001 - one path crashing must not hide the others' results
            run.error = f"{type(exc).__name__}: {exc}"
            say(f"{PATH_LABELS[name]} crashed:\n{traceback.format_exc(limit=4)}")
        run.seconds = time.perf_counter() - started

    table = rows(runs)
    agree = all_agree(table)
    print(f"\n{plan.entry.env_id}, {len(plan.seeds)} episodes, {decoding}, checkpoint {plan.folder}\n")
    print(markdown(table))
    reference = next((r for r in runs if r.name == HF_EVAL and r.ok), None)
    for run in runs:
        if reference is not None and run.ok and run is not reference:
            for line in first_differences(run.outcomes, reference.outcomes):
                print(f"  {run.name} differs: {line}")
    crashed = [r for r in runs if r.error]
    if agree:
        print("\nAll paths agree: the same replies as the hf eval, every one, and the same successes.")
    elif crashed:
        print("\nCannot say whether all paths agree: " + ", ".join(r.name for r in crashed) + " crashed.")
    else:
        print("\nThe paths do NOT all agree" + (" (expected with --sample: sampled replies agree only in "
                                                "distribution; compare the success rates)" if plan.sample else "")
              + ".")
    for run in crashed:
        print(f"{PATH_LABELS[run.name]} crashed: {run.error}")
    if args.json:
        report = {
            "checkpoint": str(plan.folder), "env_id": plan.entry.env_id, "episodes": len(plan.seeds),
            "seeds": plan.seeds, "generation_prefix": plan.prefix,
            "decoding": {"sample": plan.sample, "temperature": plan.temperature, "top_p": plan.top_p,
                         "max_new_tokens": plan.max_new_tokens},
            "device": plan.device, "dtype": plan.dtype, "rows": table, "all_agree": agree,
        }  # fmt: skip
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
