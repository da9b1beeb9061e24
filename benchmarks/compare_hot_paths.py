"""Hold the hot paths' ratios (``benchmarks/test_hot_paths.py``) against the baselines saved in the repository.

    python -m pytest benchmarks/test_hot_paths.py --benchmark-only -m quick --benchmark-json=hot.json
    python benchmarks/compare_hot_paths.py hot.json            # exit 1 when a ratio is over 1.2 x its baseline
    python benchmarks/compare_hot_paths.py hot.json --update   # write hot.json's ratios as the new baselines

``bash scripts/check_hot_paths.sh`` runs the first two (CI runs it after the main suite); after a deliberate change
of speed, ``bash scripts/check_hot_paths.sh hot.json`` and then ``--update`` with that report save new baselines
(commit benchmarks/baselines/hot_paths.json with the change, and say why in its message).

A ratio is ragen's time over the reference path's time of the same group, both measured in the same run, in turns
(the fastest round of each), so a slower or busier machine slows both and leaves the ratio alone; a change that makes
ragen's path slower than it was, relative to the same work done plainly, moves it. Prints a table of every group.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BASELINES = Path(__file__).resolve().parent / "baselines" / "hot_paths.json"
#: A ratio more than this much over its baseline fails the comparison.
TOLERANCE = 0.20


def ratios(report: dict) -> dict[str, dict[str, float]]:
    """Per benchmark group: ragen's and the reference's fastest round (seconds) and their ratio. ragen's rounds are
    the benchmark's own; the reference's, timed in turn with them, are in its ``extra_info["reference_s"]``."""
    out: dict[str, dict[str, float]] = {}
    for bench in report.get("benchmarks", []):
        reference = (bench.get("extra_info") or {}).get("reference_s")
        if not reference:
            continue
        ragen, fastest = float(bench["stats"]["min"]), float(min(reference))
        if fastest > 0:
            out[bench.get("group") or bench["name"]] = {"ragen": ragen, "reference": fastest, "ratio": ragen / fastest}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", help="the JSON pytest-benchmark wrote (--benchmark-json)")
    parser.add_argument("--baselines", default=str(BASELINES), help="the saved baselines (default: %(default)s)")
    parser.add_argument("--update", action="store_true", help="save this report's ratios as the baselines")
    args = parser.parse_args(argv)
    try:
        current = ratios(json.loads(Path(args.report).read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        print(f"compare_hot_paths: error: cannot read {args.report}: {exc}", file=sys.stderr)
        return 2
    if not current:
        print(f"compare_hot_paths: error: {args.report} holds no ragen/reference pair", file=sys.stderr)
        return 2
    saved_path = Path(args.baselines)
    saved = json.loads(saved_path.read_text(encoding="utf-8")) if saved_path.is_file() else {}
    if args.update:
        merged = {**saved, **{g: round(v["ratio"], 4) for g, v in current.items()}}
        saved_path.parent.mkdir(parents=True, exist_ok=True)
        saved_path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        print(f"saved {len(current)} baseline ratio(s) to {saved_path}")
        return 0
    print(f"{'group':<10} {'ragen s':>9} {'reference s':>12} {'ratio':>7} {'baseline':>9} {'change':>8}  verdict")
    failed = []
    for group, row in sorted(current.items()):
        base = saved.get(group)
        change = row["ratio"] / base - 1 if base else None
        verdict = "no baseline" if change is None else ("REGRESSION" if change > TOLERANCE else "ok")
        if verdict == "REGRESSION":
            failed.append(group)
        base_text = f"{base:9.3f}" if base is not None else f"{'-':>9}"
        change_text = f"{change:+8.1%}" if change is not None else f"{'-':>8}"
        print(f"{group:<10} {row['ragen']:9.4f} {row['reference']:12.4f} {row['ratio']:7.3f} {base_text} "
              f"{change_text}  {verdict}")
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
