"""Hold the hot paths' ratios (``benchmarks/test_hot_paths.py``) against the baselines saved in the repository.

    python -m pytest benchmarks/test_hot_paths.py --benchmark-only -m quick --benchmark-json=hot.json
    python benchmarks/compare_hot_paths.py hot.json            # exit 1 when a ratio is over 1.2 x its baseline
    python benchmarks/compare_hot_paths.py hot.json --update   # write hot.json's ratios as the new baselines
    python benchmarks/compare_hot_paths.py a.json b.json c.json --update   # or the median of several reports'

``bash scripts/check_hot_paths.sh`` runs the first two (CI runs it after the main suite); after a deliberate change
of speed, ``bash scripts/check_hot_paths.sh hot.json`` and then ``--update`` with that report save new baselines
(commit benchmarks/baselines/hot_paths.json with the change, and say why in its message).

A group's ratio is the median, over its paired rounds, of ragen's CPU time per call over the reference path's in the
same round (``benchmarks/test_hot_paths.py`` says why each part: long timed units, rounds that time both paths back
to back, the median, CPU time), so a slower or busier machine slows both and leaves the ratio alone; a change that
makes ragen's path slower than it was, relative to the same work done plainly, moves it. Prints a table of every
group, with the spread of its rounds' ratios (the middle half: 25th to 75th percentile).

What the rounds cannot absorb is a shift of a whole run: on a shared host the same code's scoring ratio measured
0.192-0.228 in nine runs of one morning (docs/performance.md, "Saving baselines"), so one run's ratio is a poor
baseline. Given several reports, each group's ratio is the median of the reports' own ratios; save baselines from at
least three runs of the same code.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

BASELINES = Path(__file__).resolve().parent / "baselines" / "hot_paths.json"
#: A ratio more than this much over its baseline fails the comparison.
TOLERANCE = 0.20


def ratios(report: dict) -> dict[str, dict[str, float]]:
    """Per benchmark group: the median of its rounds' ratios (``ratio``), the medians of ragen's and the reference's
    times per call (``ragen``, ``reference``, seconds), the 25th and 75th percentiles of the ratios (``low``,
    ``high``) and the number of rounds. Benchmarks without paired rounds (``extra_info["ratios"]``) are left out."""
    out: dict[str, dict[str, float]] = {}
    for bench in report.get("benchmarks", []):
        info = bench.get("extra_info") or {}
        rounds = [float(r) for r in info.get("ratios") or [] if isinstance(r, (int, float)) and math.isfinite(r)]
        if not rounds:
            continue
        low, _, high = statistics.quantiles(rounds, n=4) if len(rounds) > 1 else (rounds[0],) * 3
        out[bench.get("group") or bench["name"]] = {
            "ratio": statistics.median(rounds), "low": low, "high": high, "rounds": len(rounds),
            "ragen": statistics.median(info.get("ragen_s") or [math.nan]),
            "reference": statistics.median(info.get("reference_s") or [math.nan]),
        }
    return out


def combined(rows: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Several reports' :func:`ratios` as one: per group present in every report, the median of the reports' ratios
    and times, the lowest 25th and highest 75th percentile, the rounds added up (one report: itself)."""
    if len(rows) == 1:
        return rows[0]
    groups = [g for g in rows[0] if all(g in r for r in rows[1:])]
    return {g: {"ratio": statistics.median(r[g]["ratio"] for r in rows),
                "low": min(r[g]["low"] for r in rows), "high": max(r[g]["high"] for r in rows),
                "rounds": sum(r[g]["rounds"] for r in rows),
                "ragen": statistics.median(r[g]["ragen"] for r in rows),
                "reference": statistics.median(r[g]["reference"] for r in rows)} for g in groups}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", metavar="report",
                        help="the JSON pytest-benchmark wrote (--benchmark-json); several: the median of their ratios")
    parser.add_argument("--baselines", default=str(BASELINES), help="the saved baselines (default: %(default)s)")
    parser.add_argument("--update", action="store_true", help="save this report's ratios as the baselines")
    args = parser.parse_args(argv)
    per_report = []
    for report in args.reports:
        try:
            rows = ratios(json.loads(Path(report).read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            print(f"compare_hot_paths: error: cannot read {report}: {exc}", file=sys.stderr)
            return 2
        except (AttributeError, KeyError, TypeError) as exc:  # JSON, but not shaped as pytest-benchmark writes it
            print(f"compare_hot_paths: error: {report} is not a pytest-benchmark report: {exc!r}", file=sys.stderr)
            return 2
        if not rows:
            print(f"compare_hot_paths: error: {report} holds no paired rounds of ragen and reference (a report of "
                  "benchmarks/test_hot_paths.py, written with --benchmark-json)", file=sys.stderr)
            return 2
        per_report.append(rows)
    current = combined(per_report)
    if not current:
        print(f"compare_hot_paths: error: no benchmark group is in all of {', '.join(args.reports)}", file=sys.stderr)
        return 2
    saved_path = Path(args.baselines)
    try:
        saved = json.loads(saved_path.read_text(encoding="utf-8")) if saved_path.is_file() else {}
    except (OSError, ValueError) as exc:
        print(f"compare_hot_paths: error: cannot read the baselines {saved_path}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(saved, dict) or not all(isinstance(v, (int, float)) and v > 0 for v in saved.values()):
        print(f"compare_hot_paths: error: the baselines {saved_path} are not a JSON object of positive ratios",
              file=sys.stderr)
        return 2
    if args.update:
        merged = {**saved, **{g: round(v["ratio"], 4) for g, v in current.items()}}
        saved_path.parent.mkdir(parents=True, exist_ok=True)
        saved_path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        print(f"saved {len(current)} baseline ratio(s) from {len(per_report)} report(s) to {saved_path}")
        return 0
    print(f"{'group':<10} {'ragen s':>9} {'reference s':>12} {'rounds':>6} {'ratio':>7} {'middle half':>13} "
          f"{'baseline':>9} {'change':>8}  verdict")
    failed = []
    for group, row in sorted(current.items()):
        base = saved.get(group)
        change = row["ratio"] / base - 1 if base else None
        verdict = "no baseline" if change is None else ("REGRESSION" if change > TOLERANCE else "ok")
        if verdict == "REGRESSION":
            failed.append(group)
        base_text = f"{base:9.3f}" if base is not None else f"{'-':>9}"
        change_text = f"{change:+8.1%}" if change is not None else f"{'-':>8}"
        spread = f"{row['low']:.3f}-{row['high']:.3f}"
        print(f"{group:<10} {row['ragen']:9.4f} {row['reference']:12.4f} {row['rounds']:6d} {row['ratio']:7.3f} "
              f"{spread:>13} {base_text} {change_text}  {verdict}")
    if failed:
        print(f"regression of more than {TOLERANCE:.0%} in: {', '.join(failed)}", file=sys.stderr)
        return 1
    if any(group not in saved for group in current):
        print(f"no regression over {TOLERANCE:.0%} among the ratios with a baseline; save the missing ones with "
              "--update")
    else:
        print(f"every ratio within {TOLERANCE:.0%} of its baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
