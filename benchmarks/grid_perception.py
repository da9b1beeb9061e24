"""Can the model read a FrozenLake grid? Fine-tune it to say where the player is, measure it on boards it never saw.

Why. The FrozenLake search (docs/learning.md) found every warmed-up SmolLM2-135M policy blind to the board: even a
warm-up whose thinking names the player's cell writes the same cell in every state. This isolates perception from
acting: the question is only "where is P?", with the answer ``(row, col)`` (0 at the top-left, as the env's prompts
count), so nothing but reading the grid can get it right.

Tasks (``--task``): ``player`` asks only "where is P?" (the answer ``(row, col)``); ``state`` asks for the state in the
words of the ``mixed`` warm-up's state thought (:data:`ragen_trainer.evaluation.agents.STATE_THOUGHTS`: the player's
and the goal's cells, where the goal lies, which moves lead into a hole), the perception that thought needs. With
``--save DIR`` the fine-tuned model (of the last rendering) is saved there: a *perception stage* that
``python -m ragen_trainer.warmup --model DIR`` can start from.

What is measured, per ``--rendering``:

* ``reference``: the grid as the env shows it (one row per line, one symbol per cell, ``P__O``): the tokenizer merges
  runs of ``_`` (``__``, ``___``), so a cell's column is not a token position;
* ``spaced``: the same rows with a space between cells (``P _ _ O``): one token per cell.

For each: the model before training and after SFT (:func:`ragen_trainer.warmup.supervised_warmup`, the warm-up's own
loss and optimizer) on ``--train`` boards (``reset(seed=s)`` of ``ragen/FrozenLake-v0``, seeds from 1,000,000), scored
greedy on ``--test`` other boards (seeds 0 ..): the share of exact cells, of right rows and of right columns (chance:
1/16, 1/4, 1/4 on 4x4 boards), with Wilson 95 % intervals on the exact share; for ``state`` the player's cell is
the first ``(row, col)`` of the answer, and the share of answers equal to the whole true thought is reported too.

    python benchmarks/grid_perception.py --train 512 --test 128 --epochs 2
    python benchmarks/grid_perception.py --renderings reference --train 2048    # more examples
    python benchmarks/grid_perception.py --task state --renderings spaced --train 1024 --save runs/perception
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gymnasium as gym
import torch

import ragen_envs  # noqa: F401  (registers the ragen/* ids)
from benchmarks.learn_multiturn import wilson
from ragen_trainer.engines.base import SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.evaluation.agents import STATE_THOUGHTS
from ragen_trainer.models import load_model_and_tokenizer
from ragen_trainer.rollout import ChatTokens
from ragen_trainer.warmup import supervised_warmup

ENV_ID = "ragen/FrozenLake-v0"
#: Rendering -> FrozenLake's ``cell_separator`` that writes it (the env's own option, so that a model trained here
#: sees the grid as the env with that option shows it).
RENDERINGS: dict[str, str] = {"reference": "", "spaced": " "}
QUESTIONS = {
    "player": "Where is the player P? Answer with its cell as (row, col), counting from 0 at the top-left.",
    "state": ("Describe the state: your cell and the goal's as (row, col), counting from 0 at the top-left, where the "
              "goal lies from you, and which moves lead into a hole."),
}
TRAIN_SEED_BASE = 1_000_000
_CELL = re.compile(r"\(\s*(\d+)\s*,\s*(\d+)\s*\)")


Board = tuple[list[str], tuple[int, int], str]


def board(seed: int) -> Board:
    """The grid rows, the player's cell and the state thought of ``reset(seed=seed)``."""
    env = gym.make(ENV_ID)
    try:
        env.reset(seed=seed)
        view = env.unwrapped.state_view()
        thought = STATE_THOUGHTS["FrozenLake"](env.unwrapped)
        return list(view["grid"]), (int(view["player"][0]), int(view["player"][1])), thought
    finally:
        env.close()


def answer(b: Board, task: str) -> str:
    """The training target of board ``b`` for ``task``."""
    _, cell, thought = b
    return thought if task == "state" else f"({cell[0]}, {cell[1]})"


def render(rows: list[str], rendering: str) -> str:
    if rendering not in RENDERINGS:
        raise ValueError(f"rendering {rendering!r}: expected one of {list(RENDERINGS)}")
    return "\n".join(RENDERINGS[rendering].join(row) for row in rows)


def question(rows: list[str], rendering: str, task: str = "player") -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{render(rows, rendering)}\n{QUESTIONS[task]}"}]


def parse_cell(text: str) -> tuple[int, int] | None:
    found = _CELL.search(text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def score(model: Any, tokenizer: Any, boards: list[Board], rendering: str, task: str = "player") -> dict[str, Any]:
    """Greedy answers on ``boards``: shares of exact cells, right rows and right columns (and whole thoughts)."""
    chat = ChatTokens(tokenizer)
    prompts = [chat.prompt_ids(question(rows, rendering, task)) for rows, _, _ in boards]
    model.eval()
    tokens = 10 if task == "player" else 96
    results = HFEngine(model, tokenizer, batch_size=32).generate(prompts, SamplingParams(temperature=0, max_new_tokens=tokens))
    pairs = [(parse_cell(r.text), truth) for r, (_, truth, _) in zip(results, boards)]
    n = len(boards)
    exact = sum(cell == truth for cell, truth in pairs)
    return {
        "whole_answer": sum(r.text.strip() == answer(b, task) for r, b in zip(results, boards)) / n,
        "exact": exact / n,
        "exact_ci": list(wilson(exact, n)),
        "row": sum(cell is not None and cell[0] == truth[0] for cell, truth in pairs) / n,
        "col": sum(cell is not None and cell[1] == truth[1] for cell, truth in pairs) / n,
        "answered": sum(cell is not None for cell, _ in pairs) / n,
        "distinct_answers": len({cell for cell, _ in pairs}),
        "examples": [r.text for r in results[:3]],
    }


def run(model_name: str | None, rendering: str, *, train: int, test: int, epochs: int, lr: float, batch_size: int,
        task: str = "player", save: str = "", seed: int = 0, progress: bool = True) -> dict[str, Any]:  # fmt: skip
    """One rendering: the model scored before and after SFT on ``train`` boards (saved to ``save`` when given)."""
    model, tokenizer = load_model_and_tokenizer(model_name, dtype="float32", device="cpu")
    held_out = [board(s) for s in range(test)]
    before = score(model, tokenizer, held_out, rendering, task)
    train_boards = [board(TRAIN_SEED_BASE + i) for i in range(train)]
    chats = [question(b[0], rendering, task) + [{"role": "assistant", "content": answer(b, task)}] for b in train_boards]
    started = time.perf_counter()
    losses = supervised_warmup(model, tokenizer, chats, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
                               progress=progress, activation_checkpointing=False)  # fmt: skip
    train_seconds = round(time.perf_counter() - started, 1)
    after = score(model, tokenizer, held_out, rendering, task)
    if save:
        model.save_pretrained(save)
        tokenizer.save_pretrained(save)
    return {"rendering": rendering, "task": task, "before": before, "after": after, "losses": losses,
            "train_seconds": train_seconds}


def table(results: list[dict[str, Any]], train: int, test: int, task: str = "player") -> str:
    what = "Where is P?" if task == "player" else "The state in words (task state): the player's cell"
    lines = [(f"{what} {test} held-out FrozenLake boards, after SFT on {train} others (chance: exact 0.062, "
              "row 0.25, col 0.25)"), "",
             "| rendering | model | exact (95 % CI) | row | col | whole answer | distinct answers | train s |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in results:
        for name in ("before", "after"):
            s = r[name]
            lo, hi = s["exact_ci"]
            lines.append(f"| {r['rendering']} | {name} | {s['exact']:.3f} ({lo:.2f}-{hi:.2f}) | {s['row']:.3f} | "
                         f"{s['col']:.3f} | {s['whole_answer']:.3f} | {s['distinct_answers']} | "
                         f"{r['train_seconds'] if name == 'after' else '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model folder or id (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--renderings", nargs="+", choices=RENDERINGS, default=list(RENDERINGS))
    p.add_argument("--task", choices=sorted(QUESTIONS), default="player",
                   help="player: where is P?; state: the state thought (default player)")
    p.add_argument("--save", default="", help="save the fine-tuned model (of the last rendering) to this folder")
    p.add_argument("--resume", action="store_true",
                   help="do nothing when --save already holds a saved model (a finished perception stage)")
    p.add_argument("--seed", type=int, default=0, help="the SFT's shuffling seed (default 0)")
    p.add_argument("--train", type=int, default=512, help="training boards (default 512)")
    p.add_argument("--test", type=int, default=128, help="held-out boards (default 128)")
    p.add_argument("--epochs", type=int, default=2, help="SFT epochs (default 2)")
    p.add_argument("--lr", type=float, default=1e-4, help="SFT learning rate (default 1e-4, the warm-up's)")
    p.add_argument("--batch-size", type=int, default=8, help="boards per optimizer step (default 8)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument("--md", default="", help="write the table here")
    args = p.parse_args(argv)
    for name in ("train", "test", "epochs", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.resume and not args.save:
        p.error("--resume needs --save")
    if args.resume and (Path(args.save) / "config.json").is_file():
        print(f"{args.save} already holds a saved model: the perception stage is done", file=sys.stderr)
        return 0
    torch.set_num_threads(args.threads)
    results = []
    for rendering in args.renderings:
        result = run(args.model, rendering, train=args.train, test=args.test, epochs=args.epochs, lr=args.lr,
                     batch_size=args.batch_size, task=args.task, seed=args.seed,
                     save=args.save if rendering == args.renderings[-1] else "")  # fmt: skip
        results.append(result)
        print(f"{rendering}: exact {result['before']['exact']:.3f} -> {result['after']['exact']:.3f} "
              f"({result['train_seconds']:.0f} s of SFT)", file=sys.stderr, flush=True)
    text = table(results, args.train, args.test, args.task)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "results": results}, indent=1), encoding="utf-8")
    if args.md:
        Path(args.md).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
