"""A tiny StarPO-S run for the distributed tests, launched as one process or under ``accelerate launch``.

    python tests/distributed/tiny_run.py OUT --steps 2 [--deepspeed ds.json] [--dtype bfloat16] [--save_steps 1]

The rollouts come from a scripted engine whose replies depend on nothing but the prompt, and every rollout has its
own env randomness (Bandit payouts), so the batch is the same whatever the number of processes: two processes must
train the same weights as one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ragen_trainer.config import load_config
from ragen_trainer.trainer import StarPOTrainer
from tests.trainer.conftest import ScriptedEngine, build_tiny_model, build_tiny_tokenizer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--save_steps", type=int, default=0)
    parser.add_argument("--deepspeed", default="")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--preset", default="starpo-s")
    args = parser.parse_args()
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    cfg = load_config(args.preset).replace(
        env_id="ragen/Bandit-v0", env_groups=4, group_size=2, max_turns=1, max_new_tokens=8, max_context_tokens=1024,
        enable_think=False, reply_prefix="", total_steps=args.steps, save_steps=args.save_steps, val_every=0,
        micro_batch_size=1, ppo_mini_batch_size=4, generation_batch_size=8, actor_lr=1e-3, critic_lr=2e-3,
        max_grad_norm=0.5, critic_max_grad_norm=0.2, filter_ratio=1.0, group_randomness="independent",
        report_to=["jsonl"], output_dir=args.out, deepspeed=args.deepspeed, dtype=args.dtype,
    ).validate()  # fmt: skip
    engine = ScriptedEngine(tokenizer, lambda prompt, call, row: "<answer>Dragon</answer>")
    result = StarPOTrainer(cfg, model, tokenizer, engine=engine).train()
    print(f"RESULT steps={result.global_step} interrupted={result.interrupted}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
