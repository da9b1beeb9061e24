#!/usr/bin/env bash
# The hot paths of a training step (benchmarks/test_hot_paths.py, the `quick` ones) timed next to their reference
# computations, and their ratios held against the baselines saved in benchmarks/baselines/hot_paths.json
# (benchmarks/compare_hot_paths.py fails on a ratio more than 20 % over its baseline). A machine shared with other jobs
# can slow one path of a pair more than the other, so a failed comparison is measured once more before it counts.
# Usage: bash scripts/check_hot_paths.sh [report.json]   (CI runs it after the main suite; about a minute)
# New baselines after a deliberate change: python benchmarks/compare_hot_paths.py report.json --update
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# One torch thread: the saved baselines are one-thread ratios (a padded batch and a packed row gain differently from
# more threads), and one thread is what a machine shared with other jobs reliably gives.
export OMP_NUM_THREADS=1
REPORT=${1:-$(mktemp --suffix=.json)}

measure_and_compare() {
  $PY -m pytest -q -p no:cacheprovider benchmarks/test_hot_paths.py --benchmark-only -m quick \
    --benchmark-json="$REPORT" && $PY benchmarks/compare_hot_paths.py "$REPORT"
}

if ! measure_and_compare; then
  echo "==> hot paths: a ratio is over its baseline; measuring once more (the machine may have been busy)"
  measure_and_compare
fi
