#!/usr/bin/env bash
# Check the declared lower bounds of transformers and TRL (pyproject.toml, the `train` extra): install exactly those
# versions into a throwaway virtual environment layered over the current Python's packages, and run the tests that
# touch their APIs (model and tokenizer loading from the bundled GGUF, the trainer, checkpoints and serving files,
# the config parsers, the TRL integration, HFEngine's attention and cache hooks and its recorded replies). Run by CI
# after the main tests; needs `bash scripts/setup.sh` first.
#
#   bash scripts/check_lower_bounds.sh            # venv in .venv-lower-bounds (reused when it is there)
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

echo "==> lower bounds: ${PINS[*]} (venv $VENV over $($PY --version))"
if [[ ! -x $VENV/bin/python ]]; then
  $PY -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -m pip install -q "${PINS[@]}"
"$VENV/bin/python" - "${PINS[@]}" <<'EOF'
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    got = version(name)
    norm = lambda v: [int(x) for x in v.split(".")] + [0] * (3 - len(v.split(".")))  # noqa: E731 (5.18 == 5.18.0)
    assert norm(got) == norm(want), f"{name}: installed {got}, wanted {want}"
    print(f"    {name} {got}")
EOF

# -m "" also runs the slow test of these files: the bundled SmolLM2 converted from its GGUF with these versions.
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "" \
  tests/trainer/test_models.py \
  tests/trainer/test_config_parsers.py \
  tests/trainer/test_trl_integration.py \
  tests/trainer/test_trainer.py \
  tests/trainer/test_ppo_updates.py \
  tests/trainer/test_hf_engine_cache.py \
  tests/trainer/test_hf_engine_reference.py \
  tests/trainer/test_hf_transformers_api.py \
  tests/trainer/test_checkpoint_portability.py \
  tests/trainer/test_serving_files.py \
  tests/evaluation/test_generation_settings.py
echo "==> lower bounds ${PINS[*]}: tests passed"
