"""The ``ragen-trainer eval`` and ``ragen-trainer leaderboard`` subcommands.

``ragen_trainer.cli`` adds them with :func:`add_eval_arguments` / :func:`add_leaderboard_arguments` and calls
:func:`run_eval` / :func:`run_leaderboard` (each returns the exit code). ``python -m ragen_trainer.evaluation.cli``
runs them without the trainer's CLI::

    ragen-trainer eval --suite quick-v2 --agent oracle -o results/oracle.json
    ragen-trainer eval --suite quick-v2 --model smollm2 -o results/smollm2.json
    ragen-trainer eval --rescore results/smollm2.json
    ragen-trainer leaderboard results/*.json --markdown results/leaderboard.md --html results/leaderboard.html

Bad result files (not JSON, not a result, failing the result schema) are reported with the file, the field and what is
wrong: ``eval --rescore FILE`` and ``leaderboard FILE`` (one file) exit 2; ``leaderboard`` given a folder or several
files skips them with a warning and builds the board from the others (exit 2 only when none is left).

``eval`` exits 0, or 2 for bad arguments, 1 when most episodes failed on the engine (a model endpoint that failed the
requests: the result is written, marked ``engine_failed``, and the leaderboard does not rank it), 130 after Ctrl-C.
Ctrl-C stops within a second or so even while requests hang (they are aborted) and keeps the envs that finished in
``OUTPUT.partial`` (running the same command again resumes after them); a second Ctrl-C exits at once.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ragen_envs.settings import FIELD_NAMES, ProtocolSettings, merge_settings
from ragen_trainer.config import parse_value
from ragen_trainer.evaluation.agents import ModelAgent, OracleAgent, RandomAgent
from ragen_trainer.evaluation.leaderboard import build_leaderboard
from ragen_trainer.evaluation.rescore import main as rescore_main
from ragen_trainer.evaluation.runner import run_suite, summary_lines
from ragen_trainer.evaluation.schema import ResultFileWarning
from ragen_trainer.evaluation.suites import load_suite

#: Exit statuses of ``eval`` besides 0 and 2 (bad arguments or files): most episodes failed on the engine (a model
#: endpoint down); interrupted by Ctrl-C (the finished envs kept for the next run).
EXIT_ENGINE_FAILED = 1
EXIT_INTERRUPTED = 130

EVAL_DESCRIPTION = "Evaluate an agent (a model or a reference agent) on a seed-pinned suite; write one JSON result."
LEADERBOARD_DESCRIPTION = "Merge result files into a Markdown table and a self-contained HTML leaderboard."


def add_eval_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``eval`` options to ``parser`` (a subparser of ``ragen-trainer``)."""
    parser.add_argument("--suite", default="paper-v2",
                        help="suite id (paper-v2, quick-v2, bandit-bare-v2, games-v1), name (its latest version) or a suite "
                             "JSON file (default: paper-v2, the paper's validation protocol)")  # fmt: skip
    parser.add_argument("--agent", choices=("model", "random", "oracle"), default="model",
                        help="what to evaluate: a model (default), or a reference agent: random (floor) or oracle "
                             "(ceiling)")  # fmt: skip
    parser.add_argument("--model", default=None,
                        help="Hugging Face id, local folder or ragen-trainer checkpoint folder (default: the bundled "
                             "SmolLM2-135M-Instruct); with --engine openai, the served model's name")  # fmt: skip
    parser.add_argument("--engine", choices=("auto", "hf", "hf-generate", "vllm", "openai"), default="auto",
                        help="generation engine for --agent model (default auto: hf on a CPU, vllm on a GPU where "
                             "vLLM is installed, else hf; the choice is printed)")  # fmt: skip
    parser.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (with --engine openai)")
    parser.add_argument("--prepend", default=None, metavar="TEXT",
                        help="with --engine openai: put TEXT before every reply, for a server that renders a ragen "
                             "checkpoint's chat template (it pre-writes the generation prefix, e.g. '<answer>') but "
                             "returns only the model's continuation (vLLM); not for transformers serve, which returns "
                             "the prefix itself")  # fmt: skip
    parser.add_argument("--api-key", default=None,
                        help="API key for --engine openai (default: the OPENAI_API_KEY environment variable)")
    parser.add_argument("--request-timeout", type=float, default=None, metavar="SECONDS",
                        help="with --engine openai: seconds one request may take in all, from connecting to the "
                             "answer's last byte (not per read; default 120)")  # fmt: skip
    parser.add_argument("--max-retries", type=int, default=None, metavar="N",
                        help="with --engine openai: retries of a request after a transient failure (5xx, 429, a "
                             "reset or cut connection, the timeout; default 3)")  # fmt: skip
    parser.add_argument("--retry-backoff", type=float, default=None, metavar="SECONDS",
                        help="with --engine openai: wait before the first retry, doubled for each next one up to 30 s "
                             "or the server's Retry-After (default 1)")  # fmt: skip
    parser.add_argument("--give-up-after", type=int, default=None, metavar="N",
                        help="with --engine openai: after N replies in a row failed, fail the remaining requests "
                             "without sending them (the endpoint is down; default 8, 0 = never)")  # fmt: skip
    parser.add_argument("--device", default="auto", help="device for the hf engine: auto, cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default="auto", help="weights dtype for the hf engine: auto, float32, bfloat16")
    parser.add_argument("--batch-size", type=int, default=16, help="episodes played (and generated) at once")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (hf engine on CPU; 1 is fastest on a busy machine)")
    parser.add_argument("--protocol", dest="protocol_pairs", action="append", default=[], metavar="FIELD=VALUE",
                        help="change a turn-protocol setting of every env of the suite (repeatable), e.g. "
                             "--protocol max_turns=3; the suite then gets its own hash and a +variant id")
    parser.add_argument("--reply-prefix", default=None,
                        help="shortcut for --protocol reply_prefix=TEXT: the text after the chat template's generation "
                             "prompt that the model continues from ('auto' = <think> or <answer> by enable_think, the "
                             "reference's generation prefix; '' = none); default: the suite's")
    parser.add_argument("--name", default=None, help="the agent's name on the leaderboard (default: from the model)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random agent (default 0)")
    parser.add_argument("--envs", default=None,
                        help="comma-separated env names of the suite to run (default: all); a subset gets its own "
                             "suite hash")  # fmt: skip
    parser.add_argument("--max-states", type=int, default=None,
                        help="only the first N seeds of each env (a subset, with its own suite hash)")
    parser.add_argument("-o", "--output", default=None,
                        help="result file (default: results/<agent>__<suite>.json)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--rescore", metavar="RESULT", default=None,
                        help="re-score a saved result file from its episodes (no model, no env) and exit; with -o, "
                             "write the re-scored file")  # fmt: skip
    return parser


def add_leaderboard_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``leaderboard`` options to ``parser``."""
    parser.add_argument("results", nargs="+", help="result files of ragen-trainer eval, or folders holding them")
    parser.add_argument("--markdown", default="results/leaderboard.md", help="Markdown output (default %(default)s)")
    parser.add_argument("--html", default="results/leaderboard.html", help="HTML output (default %(default)s)")
    parser.add_argument("--title", default="ragen leaderboard", help="page title")
    parser.add_argument("--replays", type=int, default=8,
                        help="episodes per env and run kept in the page's trajectory viewer (default 8)")
    return parser


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "agent"


def _build_agent(args: argparse.Namespace) -> Any:
    if args.agent == "random":
        return RandomAgent(seed=args.seed)
    if args.agent == "oracle":
        return OracleAgent()
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"invalid argument --threads={args.threads}: expected an int >= 1")
        import torch

        torch.set_num_threads(args.threads)
    return ModelAgent.load(
        args.model,
        engine=args.engine,
        name=args.name,
        batch_size=args.batch_size,
        device=args.device,
        dtype=args.dtype,
        base_url=args.base_url,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
        prepend=getattr(args, "prepend", None),
        engine_kwargs=request_policy(args),
    )


#: ``eval`` flag -> (OpenAIEngine argument, check, what is accepted).
_REQUEST_FLAGS: dict[str, tuple[str, Any, str]] = {
    "request_timeout": ("timeout", lambda v: math.isfinite(v) and v > 0, "a number of seconds > 0"),
    "max_retries": ("max_retries", lambda v: v >= 0, "an int >= 0"),
    "retry_backoff": ("backoff", lambda v: math.isfinite(v) and v >= 0, "a number of seconds >= 0"),
    "give_up_after": ("give_up_after", lambda v: v >= 0, "an int >= 0 (0 = never)"),
}


def request_policy(args: argparse.Namespace) -> dict[str, Any]:
    """The OpenAIEngine arguments of ``--request-timeout``, ``--max-retries``, ``--retry-backoff`` and
    ``--give-up-after`` (those given); ``ValueError`` naming the flag for a bad value or a non-openai engine."""
    out: dict[str, Any] = {}
    for flag, (name, ok, accepted) in _REQUEST_FLAGS.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        option = "--" + flag.replace("_", "-")
        if args.agent != "model" or args.engine != "openai":
            raise ValueError(f"invalid argument {option}={value}: only with --engine openai (a model endpoint)")
        if not ok(value):
            raise ValueError(f"invalid argument {option}={value}: expected {accepted}")
        out[name] = value
    return out


@contextlib.contextmanager
def second_interrupt_exits(note: Callable[[], str]) -> Iterator[None]:
    """Ctrl-C raises ``KeyboardInterrupt`` as usual (the run stops and keeps what finished); a second Ctrl-C while
    the first is being handled prints ``note()`` and exits at once with status 130, whatever is still running.
    Outside the main thread (where signals cannot be handled) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed = []

    def on_sigint(signum: int, frame: Any) -> None:
        pressed.append(signum)
        if len(pressed) > 1:
            os.write(2, f"\ninterrupted again: stopping now. {note()}\n".encode("utf-8", errors="replace"))
            os._exit(EXIT_INTERRUPTED)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def protocol_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The protocol changes of ``--protocol FIELD=VALUE`` and ``--reply-prefix`` (values parsed by field type); the
    same field given twice with different values is an error naming both."""
    from typing import get_type_hints

    hints = get_type_hints(ProtocolSettings)
    sources: list[tuple[str, dict[str, Any]]] = []
    for pair in args.protocol_pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or key not in FIELD_NAMES:
            raise ValueError(f"invalid argument --protocol {pair!r}: expected FIELD=VALUE with FIELD one of "
                             f"{list(FIELD_NAMES)}")  # fmt: skip
        value = text if hints[key] is str else parse_value(key, text.strip(), hints[key])
        sources.append((f"--protocol {pair}", {key: value}))
    if args.reply_prefix is not None:
        sources.append((f"--reply-prefix {args.reply_prefix!r}", {"reply_prefix": args.reply_prefix}))
    merge_settings(ProtocolSettings(), sources)  # raises on a conflict or a bad value
    changes: dict[str, Any] = {}
    for _, change in sources:
        changes.update(change)
    return changes


def run_eval(args: argparse.Namespace) -> int:
    """``ragen-trainer eval``: run the suite, write the result, print the summary table. Returns the exit code."""
    if args.rescore:
        return rescore_main([args.rescore] + (["-o", args.output] if args.output else []))
    try:
        if args.batch_size < 1:
            raise ValueError(f"invalid argument --batch-size={args.batch_size}: expected an int >= 1")
        suite = load_suite(args.suite)
        envs = [e.strip() for e in args.envs.split(",") if e.strip()] if args.envs else None
        suite = suite.select(envs, args.max_states).with_protocol(protocol_overrides(args))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        request_policy(args)  # bad values, or flags for another engine, before any model loads
        agent = _build_agent(args)
    except (ValueError, OSError, ImportError) as exc:
        print(f"error: cannot build the agent: {exc}", file=sys.stderr)
        return 2
    if args.agent != "model" and args.name:
        agent.name = args.name
    output = Path(args.output or f"results/{_slug(agent.name)}__{_slug(suite.suite_id)}.json")
    # Finished envs are kept next to the output, so an interrupted run resumes where it stopped.
    checkpoint = output.with_name(output.name + ".partial")
    print(f"evaluating {agent.name} on {suite.suite_id} (hash {suite.hash}): {len(suite.envs)} envs, "
          f"{suite.num_episodes} episodes", file=sys.stderr)  # fmt: skip
    with second_interrupt_exits(lambda: _kept_note(checkpoint)):
        try:
            # The result is written (atomically, schema-checked) before the checkpoint is removed.
            result = run_suite(suite, agent, batch_size=args.batch_size, progress=not args.no_progress,
                               checkpoint=checkpoint, output=output)  # fmt: skip
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"\ninterrupted: {_kept_note(checkpoint)}", file=sys.stderr)
            return EXIT_INTERRUPTED
        finally:
            agent.close()
    print("\n".join(summary_lines(result)))
    overall = result["summary"]["overall"]
    errors = sum(s["errors"] for s in result["summary"]["envs"].values())
    if errors:
        first = next(e["error"] for e in result["episodes"] if e.get("error"))
        print(f"warning: {errors} episode(s) ended with an error; the first:\n{first}", file=sys.stderr)
    print(f"result written to {output} ({result['timings']['wall_seconds']:.1f} s)")
    if overall.get("engine_errors") and not overall.get("engine_failed"):
        again = f" {_kept_note(checkpoint)}" if checkpoint.is_file() else ""
        print(f"warning: {overall['engine_errors']} of {overall['episodes']} episodes failed on the engine (the model "
              f"endpoint), not on the model, and count as unsuccessful.{again}", file=sys.stderr)  # fmt: skip
    if overall.get("engine_failed"):
        print(f"error: {overall['engine_errors']} of {overall['episodes']} episodes failed on the engine (the model "
              f"endpoint failed the requests), not on the model: the result is marked engine_failed and the "
              f"leaderboard does not rank it. {_kept_note(checkpoint)}", file=sys.stderr)  # fmt: skip
        return EXIT_ENGINE_FAILED
    return 0


def _kept_note(checkpoint: Path) -> str:
    """What an interrupted or failed run leaves for the next one."""
    if checkpoint.is_file():
        return (f"the envs that finished are kept in {checkpoint}; run the same command again to resume after "
                "them")
    return "no env had finished, nothing is kept; run the same command again to start over"


def _expand(paths: list[str]) -> list[Path]:
    """Files as given; folders contribute every ``*.json`` file they hold (each is checked when it is read: one that is
    not a valid ragen evaluation result is skipped with a warning naming it)."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        out.extend(sorted(path.glob("*.json")) if path.is_dir() else [path])
    return out


def run_leaderboard(args: argparse.Namespace) -> int:
    """``ragen-trainer leaderboard``: merge result files, write the Markdown and HTML pages. Returns the exit code.

    One file asked for by name that is bad exits 2 with the file, the field and what is wrong; from a folder or a list
    of files, bad ones are skipped with a warning on stderr (exit 2 only when no valid file is left)."""
    keep = _expand(args.results)
    single = len(args.results) == 1 and not Path(args.results[0]).is_dir()
    on_bad = "raise" if single else "warn"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResultFileWarning)
        try:
            markdown, _ = build_leaderboard(keep, markdown_path=args.markdown, html_path=args.html, title=args.title,
                                            replays_per_env=args.replays, on_bad=on_bad)  # fmt: skip
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    skipped = [w for w in caught if issubclass(w.category, ResultFileWarning)]
    for w in caught:
        if w in skipped:
            print(f"warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    print(markdown)
    note = f" ({len(skipped)} bad file(s) skipped, see the warnings)" if skipped else ""
    print(f"wrote {args.markdown} and {args.html} from {len(keep) - len(skipped)} result file(s){note}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m ragen_trainer.evaluation.cli {eval,leaderboard} ...``"""
    parser = argparse.ArgumentParser(prog="python -m ragen_trainer.evaluation.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    add_eval_arguments(sub.add_parser("eval", help=EVAL_DESCRIPTION, description=EVAL_DESCRIPTION))
    add_leaderboard_arguments(
        sub.add_parser("leaderboard", help=LEADERBOARD_DESCRIPTION, description=LEADERBOARD_DESCRIPTION)
    )
    args = parser.parse_args(argv)
    return run_eval(args) if args.command == "eval" else run_leaderboard(args)


if __name__ == "__main__":
    sys.exit(main())
