#!/usr/bin/env bash
# Check the declared lower bounds of transformers and TRL (pyproject.toml, the `train` extra): install exactly those
# versions into a throwaway virtual environment layered over the packages of the Python that has the project ($PYTHON,
# default python3: the system Python or the venv that scripts/setup.sh filled), and run the tests that
# touch their APIs (model and tokenizer loading from the bundled GGUF, the trainer, checkpoints and serving files,
# the config parsers, the TRL integration, HFEngine's attention and cache hooks and its recorded replies). Run by CI
# after the main tests; needs `bash scripts/setup.sh` first.
#
#   bash scripts/check_lower_bounds.sh              # venv in .venv-lower-bounds (reused when it is there)
#   bash scripts/check_lower_bounds.sh --setup-only # only build the venv and install the pins
#
# How the layering works: `python -m venv --system-site-packages` would sit on the *base* interpreter, which inside a
# venv is not where the project's packages are: pip then saw no torch, pulled a CUDA torch (5.7 GB of nvidia wheels)
# for transformers' and TRL's dependencies, and the tests stopped at "No module named 'gymnasium'". Instead the
# throwaway venv gets a .pth file that adds the project interpreter's site-packages folders (their own .pth files,
# the editable install of ragen among them, processed too) *after* its own, so the pinned transformers and TRL win
# and everything else -- torch included -- is the project's. And pip gets torch==<the installed version> as a
# constraint: it can never replace the project's torch by another build (a CUDA one on a CPU machine).
#
# Why these two: they are the APIs ragen leans on most (Trainer hooks, GGUF conversion, chat templates, TRL's
# GRPOTrainer hooks), and both move fast. Measured when the bounds were set: transformers 5.17 and earlier read the
# bundled SmolLM2's GGUF with the wrong eos token (<|im_start|>), and before 5.3 Trainer has no `_clip_grad_norm`
# hook; TRL 1.7 and earlier fail the integration's GRPOTrainer tests.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${LOWER_BOUNDS_VENV:-.venv-lower-bounds}

# The pins, read from pyproject.toml: "transformers>=5.18" -> "transformers==5.18".
mapfile -t PINS < <($PY - <<'EOF'
import re, tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["train"]
for req in extra:
    m = re.fullmatch(r"(transformers|trl)>=([0-9.]+)", req.replace(" ", ""))
    if m:
        print(f"{m[1]}=={m[2]}")
EOF
)
if [[ ${#PINS[@]} -ne 2 ]]; then
  echo "check_lower_bounds: expected lower bounds for transformers and trl in pyproject.toml's train extra, found: ${PINS[*]:-none}" >&2
  exit 2
fi

# The project interpreter: its environment (sys.prefix: a venv's folder, not the base interpreter its python links
# to), its torch, and its site-packages folders (a venv's own, plus the base's when it was made with
# --system-site-packages, plus the user's when enabled).
mapfile -t PROJECT < <($PY - <<'EOF'
import os, site, sys
from importlib.metadata import PackageNotFoundError, version
print(os.path.realpath(sys.prefix))
try:
    print(version("torch"))
except PackageNotFoundError:
    print("")
folders = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
print(os.pathsep.join(f for f in dict.fromkeys(folders) if os.path.isdir(f)))
EOF
)
PROJECT_ENV=${PROJECT[0]}
TORCH_VERSION=${PROJECT[1]}
SITE_FOLDERS=${PROJECT[2]}
if [[ -z $TORCH_VERSION ]]; then
  echo "check_lower_bounds: $PY (environment $PROJECT_ENV) has no torch: run bash scripts/setup.sh first (with" \
    "the same python3, or PYTHON=...), so that the lowest transformers and TRL are tested over the project's own" \
    "packages" >&2
  exit 2
fi

echo "==> lower bounds: ${PINS[*]} (venv $VENV over $PROJECT_ENV: $($PY --version), torch $TORCH_VERSION)"
# A venv made for another environment, or the old way (over the base interpreter: it may hold a torch of its own),
# is made again. Only a venv is ever removed.
if [[ ! -x $VENV/bin/python || "$(cat "$VENV/.ragen-project-env" 2>/dev/null)" != "$PROJECT_ENV" ]]; then
  if [[ -e $VENV && ! -f $VENV/pyvenv.cfg ]]; then
    echo "check_lower_bounds: $VENV exists and is not a virtual environment (no pyvenv.cfg): remove it or set" \
      "LOWER_BOUNDS_VENV to another folder" >&2
    exit 2
  fi
  rm -rf "$VENV"
  $PY -m venv "$VENV"
  echo "$PROJECT_ENV" > "$VENV/.ragen-project-env"
fi
VENV_SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# An `import` line of a .pth file runs at start-up: site.addsitedir appends each folder after the venv's own and reads
# its .pth files (a plain path line would do neither). Rewritten every time: it follows $PYTHON.
"$VENV/bin/python" - "$VENV_SITE/_ragen_project_packages.pth" "$SITE_FOLDERS" <<'EOF'
import os, sys
folders = [f for f in sys.argv[2].split(os.pathsep) if f]
with open(sys.argv[1], "w", encoding="utf-8") as fh:
    fh.write("import site; " + "; ".join(f"site.addsitedir({f!r})" for f in folders) + "\n")
EOF
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
# jmespath too: TRL 1.8's GRPOTrainer imports it for tool calls (tests/trainer/test_trl_integration.py runs one) without
# declaring it, and later TRL releases, the ones the project's own environment has, do not need it. A system Python
# may have it by chance (boto3 depends on it); a fresh venv has not.
# pip, without the "Location ... is ignored" lines that extra local indexes print for every package (as vllm_lane.sh)
"$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" "${PINS[@]}" jmespath 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }  # pipefail: pip's failure still stops
"$VENV/bin/python" - "${PINS[@]}" <<'EOF'
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    got = version(name)
    norm = lambda v: [int(x) for x in v.split(".")] + [0] * (3 - len(v.split(".")))  # noqa: E731 (5.18 == 5.18.0)
    assert norm(got) == norm(want), f"{name}: installed {got}, wanted {want}"
    print(f"    {name} {got}")
import torch
print(f"    torch {torch.__version__} (the project's: {torch.__file__})")
EOF
if [[ ${1:-} == --setup-only ]]; then
  exit 0
fi

# -m "" also runs the slow test of these files: the bundled SmolLM2 converted from its GGUF with these versions.
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "" \
  tests/trainer/test_models.py \
  tests/trainer/test_config_parsers.py \
  tests/trainer/test_trl_integration.py \
  tests/trainer/test_trainer.py \
  tests/trainer/test_ppo_updates.py \
  tests/trainer/test_hf_engine_cache.py \
  tests/trainer/test_hf_engine_reference.py \
  tests/trainer/test_direct_decode.py \
  tests/trainer/test_hf_transformers_api.py \
  tests/trainer/test_critic.py \
  tests/trainer/test_checkpoint_portability.py \
  tests/trainer/test_serving_files.py \
  tests/evaluation/test_generation_settings.py
echo "==> lower bounds ${PINS[*]}: tests passed"
