"""Does StarPO really learn? Bandit success rate before and after training, on CPU, and StarPO vs StarPO-S.

Two models:

* ``--model tiny`` (default): a 2-layer random Llama built here, with a word-level tokenizer in which the arm names
  are single tokens and replies are one token long (``max_new_tokens=1``). A random model then picks an arm name by
  chance now and then (and otherwise writes an invalid reply, reward -0.1), so the reward has a signal to climb. It
  learns in a couple of minutes with a high learning rate.
* ``--model smollm2``: the bundled SmolLM2-135M-Instruct, thinking off, replies of ``--max-new-tokens`` tokens
  (default 2: "D"+"ragon" is a valid "Dragon"; the 135M model almost never writes a bare arm name, so this keeps
  the first valid replies within reach), full fine-tuning at ``--lr`` (default 5e-5).

Every run prints a per-step table and the start/end validation success (``val_groups`` fixed initial states, one
rollout each, temperature 0.5). ``--compare`` trains ``starpo`` and ``starpo-s`` from the same initial weights on
the same seeds and prints their curves side by side (success, in-group reward std, entropy, gradient norm), and saves
a plot (``--plot``, default ``results/bench_learning_<model>.png``).

    python benchmarks/bench_learning.py                      # tiny model, StarPO-S, ~2 min
    python benchmarks/bench_learning.py --compare            # tiny model, starpo vs starpo-s side by side
    python benchmarks/bench_learning.py --model smollm2 --steps 6 --groups 4 --group-size 8 --val-groups 32 \
        --micro-batch 8

Measured on a shared 2-core CPU (see the closing note of the issue): SmolLM2, 4 x 8 rollouts per step, lr 5e-5,
StarPO-S: validation success 6.2% before training, 100% after 12 steps (training success 9% -> 100% by step 4);
tiny model, 8 x 8 rollouts: see ``--compare``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ragen_trainer.config import load_config
from ragen_trainer.models import load_model_and_tokenizer
from ragen_trainer.trainer import StarPOTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WORDS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]", "Dragon", "Phoenix", "Arms", "Choose", "one",
         "system", "user", "assistant"]


def build_word_tokenizer() -> Any:
    """A word-level tokenizer: the arm names are single tokens, every other word is ``[UNK]``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  unk_token="[UNK]", additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHATML
    return tok


def build_tiny(seed: int = 0) -> tuple[Any, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_word_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def load(model_name: str, seed: int) -> tuple[Any, Any]:
    if model_name == "tiny":
        return build_tiny(seed)
    return load_model_and_tokenizer(model_name, device="cpu", dtype="float32")


def run(preset: str, model: Any, tok: Any, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    tiny = args.model == "tiny"
    cfg = load_config(preset).replace(
        reference="latest",  # the documented comparison ran at today's reference (replies-only loss mask)
        env_id="ragen/Bandit-v0", output_dir=str(out / preset), seed=args.seed, total_steps=args.steps,
        env_groups=args.groups, group_size=args.group_size, max_turns=1, enable_think=False,
        max_new_tokens=args.max_new_tokens or (1 if tiny else 2), max_context_tokens=1024,
        actor_lr=args.lr or (3e-3 if tiny else 5e-5), critic_lr=args.critic_lr or (3e-3 if tiny else 1e-3),
        micro_batch_size=args.micro_batch, generation_batch_size=64, val_every=args.val_every or args.steps,
        val_groups=args.val_groups, save_steps=0, resume=False, report_to=["jsonl"],
    ).validate()
    t0 = time.perf_counter()
    trainer = StarPOTrainer(cfg, model, tok)
    result = trainer.train()
    seconds = time.perf_counter() - t0
    val = trainer.val_history
    return {"preset": preset, "history": trainer.history, "val": val, "seconds": seconds,
            "start": val[0]["val/success"] if val else None, "end": val[-1]["val/success"] if val else None,
            "steps": result.global_step}


def print_table(runs: list[dict[str, Any]]) -> None:
    cols = [("success_rate", "succ"), ("reward/in_group_std", "grpstd"), ("policy/entropy", "entropy"),
            ("optim/grad_norm", "grad")]
    head = f"{'step':>4} | " + " | ".join(
        " ".join(f"{label:>7}" for _, label in cols) + f"  ({r['preset']})" for r in runs)
    print(head)
    print("-" * len(head))
    n = max(len(r["history"]) for r in runs)
    for i in range(n):
        cells = []
        for r in runs:
            row = r["history"][i] if i < len(r["history"]) else {}
            cells.append(" ".join(f"{row.get(k, float('nan')):7.3f}" for k, _ in cols) + " " * (len(r["preset"]) + 4))
        print(f"{i + 1:>4} | " + " | ".join(cells))
    print()
    print(f"{'run':<12} {'val success start':>18} {'val success end':>16} {'steps':>6} {'seconds':>8}")
    for r in runs:
        print(f"{r['preset']:<12} {100 * r['start']:>17.1f}% {100 * r['end']:>15.1f}% {r['steps']:>6} "
              f"{r['seconds']:>8.1f}")


def plot(runs: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("success_rate", "training success rate"), ("reward/in_group_std", "in-group reward std"),
            ("policy/entropy", "policy entropy"), ("optim/grad_norm", "gradient norm")]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, (key, label) in zip(axes, keys):
        for r in runs:
            xs = [int(h["step"]) for h in r["history"] if key in h]
            ys = [h[key] for h in r["history"] if key in h]
            ax.plot(xs, ys, marker="o", markersize=3, label=r["preset"])
        ax.set_title(label)
        ax.set_xlabel("step")
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny (built here) or smollm2 (bundled), or a model folder")
    p.add_argument("--preset", default="starpo-s", help="preset for a single run (default starpo-s)")
    p.add_argument("--compare", action="store_true", help="train starpo and starpo-s on the same seeds")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--groups", type=int, default=8, help="initial states per step (env_groups)")
    p.add_argument("--group-size", type=int, default=8, help="rollouts per initial state")
    p.add_argument("--max-new-tokens", type=int, default=0, help="0: 1 for tiny, 2 for smollm2")
    p.add_argument("--lr", type=float, default=0.0, help="actor lr (0: 3e-3 tiny, 5e-5 smollm2)")
    p.add_argument("--critic-lr", type=float, default=0.0)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--val-groups", type=int, default=64)
    p.add_argument("--val-every", type=int, default=0, help="0: only before and after training")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="", help="PNG path (default results/bench_learning_<model>.png)")
    p.add_argument("--json", default="", help="also write the runs as JSON here")
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    base_model, tok = load(args.model, args.seed)
    presets = ["starpo", "starpo-s"] if args.compare else [args.preset]
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-learning-") as tmp:
        for preset in presets:
            model = copy.deepcopy(base_model) if len(presets) > 1 else base_model
            runs.append(run(preset, model, tok, args, Path(tmp)))
    print(f"\nBandit, model={args.model}, {args.groups} initial states x {args.group_size} rollouts per step, "
          f"{args.steps} steps, seed {args.seed}")
    print_table(runs)
    name = Path(args.model).name if args.model not in ("tiny", "smollm2") else args.model
    path = Path(args.plot or f"results/bench_learning_{name}.png")
    plot(runs, path, f"Bandit, {name}: " + " vs ".join(r["preset"] for r in runs))
    print(f"plot saved to {path}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
