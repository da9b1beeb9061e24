#!/usr/bin/env bash
# The main job, offline on a CPU in about 15 minutes (run scripts/setup.sh first):
#   1. every env played by scripted agents (ragen-demo);
#   2. StarPO-S on Bandit with the bundled SmolLM2-135M-Instruct;
#   3. the model before and after training, and the random / oracle reference agents, on the seed-pinned
#      bandit-bare-v2 suite (Bandit and its generalisation splits BanditTest and BanditRev);
#   4. a leaderboard (Markdown + HTML) of those four results.
# Everything lands in $RAGEN_OUT (default runs/quickstart, one folder per seed: runs/quickstart/seed0, ...).
# RAGEN_SEED chooses the training seed (default 0), RAGEN_STEPS the training steps (default 40).
#
# The training settings come from the Bandit sweep (docs/learning.md): at actor_lr 5e-5 StarPO-S falls into the Echo
# Trap on every seed (all replies the safe arm by step 6); at 5e-6 it learns to pick the high-expected-value arm.
set -euo pipefail
cd "$(dirname "$0")/.."

SEED=${RAGEN_SEED:-0}
OUT=${RAGEN_OUT:-runs/quickstart/seed$SEED}
STEPS=${RAGEN_STEPS:-40}
LR=5e-6
SUITE=bandit-bare-v2
RESULTS="$OUT/results"
mkdir -p "$RESULTS"
start=$(date +%s)

echo "== [1/4] every env, played by scripted agents"
ragen-demo --quiet --episodes 3

echo "== [2/4] StarPO-S on ragen/Bandit-v0 with the bundled SmolLM2-135M-Instruct ($STEPS steps, seed $SEED, CPU)"
# Validated during training on Bandit and on BanditTest (unseen arm names), as the paper's Bandit runs.
ragen-trainer train --config starpo-s --env ragen/Bandit-v0 --model smollm2 --seed "$SEED" \
  --enable_think false --max_new_tokens 8 \
  --env_groups 4 --group_size 8 --actor_lr "$LR" --micro_batch_size 8 \
  --total_steps "$STEPS" --val_every 5 --val_groups 64 --val_envs '[ragen/BanditTest-v0]' \
  --save_steps 5 --save_total_limit 1 --output_dir "$OUT/train"
ragen-trainer plot "$OUT/train" -o "$OUT/curves.png" --title "StarPO-S on Bandit, seed $SEED"

echo "== [3/4] evaluation on $SUITE: reference agents, SmolLM2 before and after training"
ragen-trainer eval --suite "$SUITE" --agent random -o "$RESULTS/random.json"
ragen-trainer eval --suite "$SUITE" --agent oracle -o "$RESULTS/oracle.json"
ragen-trainer eval --suite "$SUITE" --model smollm2 --threads 2 --name "SmolLM2-135M-Instruct" \
  -o "$RESULTS/smollm2.json"
ragen-trainer eval --suite "$SUITE" --model "$OUT/train/final" --threads 2 --name "SmolLM2 + StarPO-S ($STEPS steps, seed $SEED)" \
  -o "$RESULTS/smollm2-starpo-s.json"

echo "== [4/4] leaderboard"
# `ragen-trainer leaderboard` prints the Markdown table itself (and writes it to leaderboard.md): shown once.
ragen-trainer leaderboard "$RESULTS" --markdown "$OUT/leaderboard.md" --html "$OUT/leaderboard.html"

echo
echo "done in $(( $(date +%s) - start )) s: training run in $OUT/train (summary.json, metrics.jsonl, final/), curves in"
echo "$OUT/curves.png,"
echo "results in $RESULTS, leaderboard in $OUT/leaderboard.md and $OUT/leaderboard.html"
