#!/usr/bin/env bash
# The hot paths of a training step (benchmarks/test_hot_paths.py, the `quick` ones) timed next to their reference
# computations, and their ratios held against the baselines saved in benchmarks/baselines/hot_paths.json
# (benchmarks/compare_hot_paths.py fails on a ratio more than 20 % over its baseline).
# Usage: bash scripts/check_hot_paths.sh [report.json]   (CI runs it after the main suite; 1.5-2 minutes on 2 cores)
# New baselines after a deliberate change: three reports of the same code, then
#   python benchmarks/compare_hot_paths.py a.json b.json c.json --update   (the median of their ratios)
#
# One attempt, no retry: each ratio is the median of 21 paired rounds (11 for decode) of CPU time over units of about
# a quarter second, which another job on the machine does not move by more than a few per cent (docs/performance.md,
# "The hot-path check under load": every ratio of 10 runs beside a two-process training sweep). A retry would only
# hide a flaky check; a real slowdown fails both attempts anyway. What the rounds cannot absorb is the host shifting a
# whole run (up to 18 % on 2026-11-29, "Saving baselines"): hence baselines from the median of three runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# One torch thread: the saved baselines are one-thread ratios (a padded batch and a packed row gain differently from
# more threads), and one thread is what a machine shared with other jobs reliably gives.
export OMP_NUM_THREADS=1
REPORT=${1:-$(mktemp --suffix=.json)}

$PY -m pytest -q -p no:cacheprovider benchmarks/test_hot_paths.py --benchmark-only -m quick \
  --benchmark-json="$REPORT"
$PY benchmarks/compare_hot_paths.py "$REPORT"
