"""Re-score a result file from its saved episodes alone: no model, no env, no network.

The episode records keep every turn's reply, actions, rewards, flags and the final state view, so a summary can be
recomputed whenever the metrics change (a new metric, a fixed standard error) and checked against the stored one::

    python -m ragen_trainer.evaluation.rescore results/oracle.json            # prints the table, checks the summary
    python -m ragen_trainer.evaluation.rescore results/oracle.json -o new.json  # writes the re-scored result

The file must pass the result schema's type and range checks (:mod:`ragen_trainer.evaluation.schema`: valid JSON,
no NaN, rates in [0, 1], ...); otherwise the exit code is 2 and the message names the field. What re-scoring recomputes
(the summary, each episode's ``success`` and ``reward``) is compared with what the file stores: a file that disagrees
(a hand-edited score, a summary from other metrics) is reported field by field and exits 2, unless ``-o`` asked for
the re-scored file, which is then written (atomically, after passing the whole schema) and the exit code is 0.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from pathlib import Path
from typing import Any

from ragen_trainer.evaluation.metrics import episode_reward, episode_success, summarize
from ragen_trainer.evaluation.runner import load_result, save_result, summary_lines
from ragen_trainer.evaluation.schema import ResultFileError, validate_result


def rescore(result: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``result`` whose per-episode ``success``/``reward`` and ``summary`` are recomputed from the turns."""
    out = copy.deepcopy(result)
    for episode in out["episodes"]:
        episode["success"] = episode_success(episode)
        episode["reward"] = episode_reward(episode)
    order = [e["name"] for e in out.get("suite", {}).get("definition", {}).get("envs", [])]
    out["summary"] = summarize(out["episodes"], order)
    return out


def summary_differences(a: Any, b: Any, path: str = "summary", tol: float = 1e-9) -> list[str]:
    """Where two summaries disagree (numbers compared with a tolerance), as ``"path: a != b"`` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                out.append(f"{path}.{key}: only in {'stored' if key in a else 'rescored'}")
            else:
                out.extend(summary_differences(a[key], b[key], f"{path}.{key}", tol))
        return out
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return [] if math.isclose(a, b, rel_tol=tol, abs_tol=tol) else [f"{path}: {a} != {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def episode_differences(stored: dict[str, Any], rescored: dict[str, Any], tol: float = 1e-9) -> list[str]:
    """Episodes whose stored ``success`` or ``reward`` differ from the re-scored ones, as ``"path: a != b"`` lines."""
    out: list[str] = []
    for i, (a, b) in enumerate(zip(stored["episodes"], rescored["episodes"])):
        for key in ("success", "reward"):
            out.extend(summary_differences(a.get(key), b[key], f"episodes[{i}].{key}", tol))
    return out


def rescore_file(path: str | Path, out: str | Path | None = None) -> tuple[dict[str, Any], list[str]]:
    """Re-score one file; write it to ``out`` if given. Returns the new result and the differences to the stored one.

    ``ValueError`` (:class:`~ragen_trainer.evaluation.schema.ResultFileError`) names the field when the file fails the
    schema's type and range checks, or when even the re-scored result fails the schema (episodes that do not match
    the suite definition: re-scoring cannot fix those).
    """
    return _rescore_loaded(path, load_result(path, consistency=False), out)


def _rescore_loaded(
    path: str | Path, result: dict[str, Any], out: str | Path | None
) -> tuple[dict[str, Any], list[str]]:
    new = rescore(result)
    differences = episode_differences(result, new) + summary_differences(result.get("summary", {}), new["summary"])
    problems = validate_result(new)
    if problems:
        raise ResultFileError(path, problems)
    if out is not None:
        save_result(new, out)
    return new, differences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragen_trainer.evaluation.rescore", description=__doc__.split("\n")[0])
    parser.add_argument("result", help="a result file written by ragen-trainer eval")
    parser.add_argument("-o", "--output", help="write the re-scored result here")
    args = parser.parse_args(argv)
    try:
        result = load_result(args.result, consistency=False)
        stored_problems = validate_result(result)  # what the leaderboard would say about the file as it is
        new, differences = _rescore_loaded(args.result, result, args.output)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(summary_lines(new)))
    if differences:
        print(f"\nthe stored result differs from the re-scored one in {len(differences)} place(s):")
        print("\n".join("  " + d for d in differences[:20]))
    else:
        print("\nthe stored summary matches the re-scored one")
    if stored_problems and args.output is None:
        print(f"error: result file {args.result!r} disagrees with its own episodes: "
              + "; ".join(f"{field}: {message}" for field, message in stored_problems[:5])
              + "\nthe leaderboard skips it; write the re-scored result with -o", file=sys.stderr)  # fmt: skip
        return 2
    if args.output is not None:
        print(f"re-scored result written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
