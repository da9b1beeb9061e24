"""Train TRL's own ``GRPOTrainer`` on multi-turn ``ragen/FrozenLake-v0`` through ``ragen_trainer.trl_integration``.

Each step, TRL takes ``--groups`` initial states (env seeds, ragen's step seeds) and plays ``--group-size`` episodes
from each with the model it is training: :class:`~ragen_trainer.trl_integration.RagenRollout` (TRL's
``rollout_func``) plays whole FrozenLake episodes (up to 5 turns) through ragen's episode driver and hands TRL the
token ids with ``env_mask`` (the env's messages are masked out of the loss). The reward is the episode's return
(:func:`~ragen_trainer.trl_integration.env_reward`); the success and format rates are logged at weight 0.
:class:`~ragen_trainer.trl_integration.RagenGRPOTrainer` keeps the top ``--filter-ratio`` groups by in-group reward
std (StarPO-S) and masks the rest out of the loss. Progress is TRL's own logging (one line per step); a summary
follows at the end.

    python examples/trl_grpo_frozenlake.py --max-steps 2 --groups 2 --group-size 2 --max-new-tokens 32   # a look
    python examples/trl_grpo_frozenlake.py --model Qwen/Qwen2.5-0.5B-Instruct --max-steps 200          # a GPU run

Cost, measured on a 2-core CPU shared with other work (one torch thread, the bundled SmolLM2-135M): one step of
1 x 2 episodes with 24 tokens per turn took 90 s, so the defaults (4 x 4 episodes, 64 tokens per turn) take many
minutes per step there; real runs belong on a GPU.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragen_trainer.filtering import KEEP_RATIO_RANGE, valid_keep_ratio
from ragen_trainer.settings import DEFAULT_MAX_CONTEXT_TOKENS, RolloutSettings

ENV_ID = "ragen/FrozenLake-v0"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2",
                   help="model for ragen_trainer.models.load_model_and_tokenizer: 'smollm2' (the bundled "
                        "SmolLM2-135M-Instruct, default), a Hugging Face id or a local folder")  # fmt: skip
    p.add_argument("--max-steps", type=int, default=10, help="optimizer steps (default: 10)")
    p.add_argument("--groups", type=int, default=4, help="initial states per step (default: 4)")
    p.add_argument("--group-size", type=int, default=4, help="episodes per initial state, TRL's num_generations")
    p.add_argument("--max-new-tokens", type=int, default=64, help="most tokens per reply, per turn (default: 64)")
    p.add_argument("--max-context-tokens", type=int, default=DEFAULT_MAX_CONTEXT_TOKENS,
                   help=f"most tokens of a whole episode (default: {DEFAULT_MAX_CONTEXT_TOKENS})")  # fmt: skip
    p.add_argument("--filter-ratio", type=float, default=0.5,
                   help="StarPO-S: fraction of groups kept by reward std (1.0: no filter; default 0.5)")  # fmt: skip
    p.add_argument("--lr", type=float, default=1e-6, help="AdamW learning rate (default: 1e-6, ragen's)")
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (default: 0, no reference model)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--micro-batch", type=int, default=None,
                   help="episodes per forward/backward (default: all of a step's)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="run seed: picks the initial states and TRL's seed")
    p.add_argument("--device", default="auto", help="'auto' (cuda when available), 'cpu' or 'cuda'")
    p.add_argument("--dtype", default="float32", help="'float32' (default), 'bfloat16' or 'auto'")
    p.add_argument("--output-dir", default=None, help="TRL's output_dir (default: a temporary folder; nothing saved)")
    return p


def _check(args: argparse.Namespace) -> None:
    for name, low in (("max_steps", 1), ("groups", 1), ("group_size", 2), ("max_new_tokens", 1)):
        value = getattr(args, name)
        if not isinstance(value, int) or value < low:
            raise ValueError(f"invalid argument --{name.replace('_', '-')}={value!r}: expected an int >= {low}")
    if not valid_keep_ratio(args.filter_ratio):
        raise ValueError(f"invalid argument --filter-ratio={args.filter_ratio!r}: expected {KEEP_RATIO_RANGE}")
    total = args.groups * args.group_size
    if args.micro_batch is not None and (args.micro_batch < 1 or total % args.micro_batch):
        raise ValueError(f"invalid argument --micro-batch={args.micro_batch!r}: expected a divisor of groups x "
                         f"group-size = {total}")  # fmt: skip


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Run the training; returns the summary (also printed)."""
    _check(args)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL 1.16
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from trl import GRPOConfig

    from ragen_trainer.models import load_model_and_tokenizer
    from ragen_trainer.trainer import TRAIN_SEED_STRIDE
    from ragen_trainer.trl_integration import (
        RagenGRPOTrainer,
        RagenRollout,
        checkpointing_arg,
        env_format,
        env_reward,
        env_success,
        initial_state_dataset,
    )

    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    model, tokenizer = load_model_and_tokenizer(args.model, device=device, dtype=args.dtype)
    # ragen's step seeds (ragen_trainer.trainer.step_seeds): step s plays seeds [base + s * groups, ...).
    seeds = [TRAIN_SEED_STRIDE * args.seed + i for i in range(args.max_steps * args.groups)]
    # TRL's way of training: the sampled ids with their log-probs, the env's messages masked out of the loss
    settings = RolloutSettings(loss_mask="replies", reply_tokens="sampled", max_context_tokens=args.max_context_tokens,
                               group_randomness="shared")
    dataset = initial_state_dataset(ENV_ID, seeds, group_randomness=settings.group_randomness)
    total = args.groups * args.group_size
    micro = args.micro_batch or total
    bf16 = str(model.dtype) == "torch.bfloat16"
    with tempfile.TemporaryDirectory(prefix="trl-frozenlake-") as tmp:
        config = GRPOConfig(
            output_dir=args.output_dir or tmp,
            max_steps=args.max_steps,
            num_generations=args.group_size,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=total // micro,
            max_completion_length=args.max_new_tokens,  # RagenRollout: tokens per reply, per turn
            temperature=args.temperature,
            top_p=1.0,
            top_k=0,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            beta=args.beta,
            loss_type="dapo",  # a token mean over the step, as ragen's token-mean
            reward_weights=[1.0, 0.0, 0.0],  # train on the return; log success and format
            shuffle_dataset=False,  # keep ragen's step order of initial states
            **checkpointing_arg(False),  # TRL's default is on; ragen's is off
            bf16=bf16,
            fp16=False,
            use_cpu=device == "cpu",
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            seed=args.seed,
        )
        trainer = RagenGRPOTrainer(
            model=model,
            reward_funcs=[env_reward, env_success, env_format],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=RagenRollout(settings),
            filter_ratio=args.filter_ratio,
        )
        started = time.perf_counter()
        result = trainer.train()
        seconds = time.perf_counter() - started
    logs = [entry for entry in trainer.state.log_history if "loss" in entry and "train_runtime" not in entry]
    losses = [float(entry["loss"]) for entry in logs]
    rewards = [float(entry.get("reward", math.nan)) for entry in logs]
    successes = [float(entry.get("rewards/env_success/mean", math.nan)) for entry in logs]
    summary = {
        "env_id": ENV_ID,
        "model": args.model,
        "steps": int(trainer.state.global_step),
        "episodes_per_step": total,
        "seconds": seconds,
        "train_loss": float(result.training_loss),
        "losses": losses,
        "rewards": rewards,
        "success_rates": successes,
        "kept_groups": [float(e["filter/kept_groups"]) for e in logs if "filter/kept_groups" in e],
        # TRL counts only env_mask = 1 tokens here: the model's reply tokens of an episode, all turns together.
        "model_tokens": [float(e.get("completions/mean_length", math.nan)) for e in logs],
    }
    _print_summary(summary)
    return summary


def _print_summary(s: dict[str, Any]) -> None:
    def fmt(values: list[float]) -> str:
        return ", ".join(f"{v:.4g}" for v in values) or "-"

    print(
        f"\n=== TRL GRPOTrainer on {s['env_id']} ({s['model']}) ===\n"
        f"steps            {s['steps']} ({s['episodes_per_step']} episodes each), {s['seconds']:.1f} s\n"
        f"loss per step    {fmt(s['losses'])} (mean {s['train_loss']:.4g})\n"
        f"reward per step  {fmt(s['rewards'])}\n"
        f"success per step {fmt(s['success_rates'])}\n"
        f"model tokens     {fmt(s['model_tokens'])} (per episode, all turns)\n"
        f"groups kept      {fmt(s['kept_groups'])}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    train(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
