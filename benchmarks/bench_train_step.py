"""Where one StarPO training step spends its time, and how much backward time StarPO-S filtering saves.

Runs a few training steps of ``starpo-s`` twice, at keep ratio 0.25 and 1.0, on the same seeds and initial weights,
and prints the mean seconds per step of each phase side by side:

* generation (the engine), environment (``env.step``), tokenization (chat-template deltas) -- the rollout;
* scoring -- the no-grad forward for old log-probs and values over the *kept* trajectories;
* update -- forward and backward of the loss over the kept trajectories, split into its forward and backward parts.

Filtered groups are dropped before scoring, so scoring and update shrink with the keep ratio while the rollout does
not. The model is a random Llama of ``--hidden`` x ``--layers`` with the bundled SmolLM2 tokenizer (a real 49k
vocabulary and real prompt lengths); ``--model smollm2`` uses the real weights instead.

    python benchmarks/bench_train_step.py                         # FrozenLake, 8 x 8 rollouts, 3 steps each
    python benchmarks/bench_train_step.py --env ragen/Sokoban-v0 --steps 2 --model smollm2
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ragen_trainer.config import load_config
from ragen_trainer.models import load_model_and_tokenizer, load_tokenizer
from ragen_trainer.trainer import StarPOTrainer, TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PHASES = [
    ("time/generation", "generation"),
    ("time/environment", "environment"),
    ("time/tokenization", "tokenization"),
    ("time/scoring", "scoring (no-grad forward)"),
    ("time/forward_loss", "loss forward"),
    ("backward", "backward"),
    ("time/update", "update (forward + backward)"),
    ("step", "whole step"),
]


def build_model(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if args.model == "smollm2":
        return load_model_and_tokenizer("smollm2", device="cpu", dtype="float32")
    tok = load_tokenizer("smollm2")
    config = LlamaConfig(vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=8192, bos_token_id=None, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def run(keep: float, model: Any, tok: Any, args: argparse.Namespace, out: Path) -> dict[str, float]:
    cfg = load_config("starpo-s").replace(
        env_id=args.env, output_dir=str(out / f"keep-{keep}"), total_steps=args.steps, env_groups=args.groups,
        group_size=args.group_size, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
        max_context_tokens=4096, filter_ratio=keep, micro_batch_size=args.micro_batch, val_every=0, save_steps=0,
        resume=False, report_to=["jsonl"], actor_lr=1e-5, generation_batch_size=64,
        gradient_checkpointing=False,  # the documented figures were measured without it (the default is on)
        reference="latest",  # ... and with the replies-only loss mask and seq-mean loss of today's reference
    ).validate()
    step_times: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, trainer: Any, step: int) -> None:
            self.t = time.perf_counter()

        def on_step_end(self, trainer: Any, step: int, metrics: dict[str, float]) -> None:
            step_times.append(time.perf_counter() - self.t)
            self.t = time.perf_counter()

    trainer = StarPOTrainer(cfg, model, tok, callbacks=[Clock()])
    trainer.train()
    rows = trainer.history
    out_row = {}
    for key, _ in PHASES:
        if key == "backward":
            vals = [r.get("time/update", 0.0) - r.get("time/forward_loss", 0.0) for r in rows]
        elif key == "step":
            vals = step_times
        else:
            vals = [r.get(key, 0.0) for r in rows]
        out_row[key] = statistics.mean(vals) if vals else float("nan")
    out_row["kept"] = statistics.mean(r.get("filter/kept_trajectories", 0.0) for r in rows)
    out_row["tokens"] = statistics.mean(r.get("batch/model_tokens", 0.0) for r in rows)
    out_row["micro"] = trainer.n_micro
    return out_row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="ragen/FrozenLake-v0")
    p.add_argument("--model", default="random", help="random (a random Llama, SmolLM2 tokenizer) or smollm2")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--micro-batch", type=int, default=8)
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    base, tok = build_model(args)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        for keep in (0.25, 1.0):
            results[keep] = run(keep, copy.deepcopy(base), tok, args, Path(tmp))
    a, b = results[0.25], results[1.0]
    print(f"\n{args.env}, model={args.model} ({sum(x.numel() for x in base.parameters()) / 1e6:.1f}M params), "
          f"{args.groups} x {args.group_size} rollouts, max {args.max_turns} turns x {args.max_new_tokens} tokens, "
          f"mean of {args.steps} steps, {torch.get_num_threads()} CPU threads")
    print(f"{'phase':<30} {'keep 0.25 (s)':>14} {'keep 1.0 (s)':>13} {'1.0 / 0.25':>11}")
    print("-" * 71)
    for key, label in PHASES:
        ratio = b[key] / a[key] if a[key] > 0 else float("nan")
        print(f"{label:<30} {a[key]:>14.2f} {b[key]:>13.2f} {ratio:>10.2f}x")
    print(f"{'kept trajectories / step':<30} {a['kept']:>14.0f} {b['kept']:>13.0f}")
    print(f"{'trained model tokens / step':<30} {a['tokens']:>14.0f} {b['tokens']:>13.0f}")
    print(f"{'micro-batches / step':<30} {a['micro']:>14d} {b['micro']:>13d}")
    saved = b["backward"] - a["backward"]
    print(f"\nbackward time saved by filtering (keep 0.25 vs 1.0): {saved:.2f} s/step "
          f"({100 * saved / b['backward']:.0f}% of the unfiltered backward)" if b["backward"] > 0 else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
