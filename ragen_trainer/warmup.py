"""A short supervised warm-up on reference agents' replies, before RL: the ``reply-format`` warm-up.

A model too small to close ``<think>...</think><answer>...</answer>`` within a CPU-sized reply budget (SmolLM2-135M
writes free text) earns the same format penalty on every rollout, so every group's reward std is 0 and RL has nothing
to learn from. This warm-up plays episodes with a reference agent (``random``: uniformly random valid actions in the
protocol's reply format, :class:`ragen_trainer.evaluation.agents.RandomAgent`), and fine-tunes the model for a few
epochs on those replies (cross-entropy on the replies' tokens only, the chat template's end-of-turn token included),
so that it answers in the format with actions that are valid but no better than chance. RL then starts from a policy
whose rollouts differ in outcome.

It is not part of the paper's method (the paper starts RL from Qwen2.5-0.5B-Instruct, which writes the format
already). ``benchmarks/reproduce.py`` uses it only at its CPU scale, where it says so; the warm-up's settings are
recorded beside the model (``ragen_warmup.json``). The random agent's thinking is a fixed sentence, so after the
warm-up the thinking starts short and templated: thinking-length curves at that scale start from it.

    python -m ragen_trainer.warmup --env ragen/Sokoban-v0 --protocol '{enable_think: false}' --out runs/warm/sokoban
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ragen_envs.core import check_arg
from ragen_envs.driver import play_episodes, rollout_jobs
from ragen_trainer.config import StarPOConfig
from ragen_trainer.evaluation.agents import RandomAgent
from ragen_trainer.critic import chunked_token_logprobs
from ragen_trainer.fileio import atomic_write_json
from ragen_trainer.models import (
    activation_checkpointing_on,
    disable_activation_checkpointing,
    enable_activation_checkpointing,
    load_model_and_tokenizer,
)
from ragen_trainer.rollout import ChatTokens

#: Reference agents whose replies the warm-up imitates.
WARMUP_AGENTS: tuple[str, ...] = ("random",)
#: Seeds of the warm-up's episodes start here, far from training (``step_seeds``) and validation seeds.
WARMUP_SEED_BASE = 7_000_000


def reference_chats(env_id: str, env_kwargs: dict[str, Any], *, episodes: int, agent: str = "random",
                    seed: int = 0) -> list[list[dict[str, str]]]:
    """The chats of ``episodes`` episodes played by the reference ``agent``: system, user, assistant, ... up to the
    last reply (the final observation, which no model reads, left out)."""
    check_arg(agent in WARMUP_AGENTS, "agent", agent, f"one of {list(WARMUP_AGENTS)}")
    check_arg(isinstance(episodes, int) and episodes >= 1, "episodes", episodes, "an int >= 1")
    jobs = rollout_jobs([WARMUP_SEED_BASE + seed * 100_003 + i for i in range(episodes)], 1)
    played = play_episodes(env_id, jobs, RandomAgent(seed=seed), env_kwargs=env_kwargs)
    chats = []
    for episode in played:
        last = max((i for i, m in enumerate(episode.messages) if m["role"] == "assistant"), default=-1)
        if last >= 0:
            chats.append([dict(m) for m in episode.messages[: last + 1]])
    return chats


def tokenize_chat(chat: ChatTokens, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """``(input_ids, labels_mask)`` of a whole chat: every assistant message's tokens and the template's end-of-turn
    token after it are 1, everything else 0. Each reply's span is found by rendering the chat up to its generation
    prompt and up to its end, as the training rollouts build their prompts."""
    messages = chat.chat_messages(messages)
    full = chat.encode(chat._render(messages, False))
    mask = [0] * len(full)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(chat.encode(chat._render(messages[:i], True)))
        end = len(chat.encode(chat._render(messages[: i + 1], False)))
        end_of_turn = len(chat.end_of_turn_ids())
        closing = len(chat.closing_ids(chat.end_of_turn_ids())) if end_of_turn else 0
        for j in range(start, min(end - closing, len(full))):
            mask[j] = 1
    return full, mask


def supervised_warmup(model: Any, tokenizer: Any, chats: list[list[dict[str, str]]], *, epochs: int = 2,
                      lr: float = 1e-4, batch_size: int = 4, seed: int = 0, progress: bool = True,
                      activation_checkpointing: bool = True) -> list[float]:
    """Fine-tune ``model`` in place on the assistant tokens of ``chats`` (AdamW, ``epochs`` passes, shuffled); the
    mean loss of each epoch.

    The loss is the mean cross-entropy of the assistant tokens, as ``labels`` would give it, computed without the
    full-vocabulary logits of every position: only the trained positions go through the LM head, in chunks
    recomputed in the backward pass (:func:`ragen_trainer.critic.chunked_token_logprobs`). With
    ``activation_checkpointing`` (the default) the transformer's layers recompute their activations in the backward
    pass too: a multi-turn chat of ~1,300 tokens otherwise keeps gigabytes of activations per batch."""
    check_arg(isinstance(epochs, int) and epochs >= 1, "epochs", epochs, "an int >= 1")
    check_arg(lr > 0, "lr", lr, "a number > 0")
    chat = ChatTokens(tokenizer)
    examples = [tokenize_chat(chat, messages) for messages in chats]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    device = next(model.parameters()).device
    rng = random.Random(seed)
    switch_checkpointing = activation_checkpointing and not activation_checkpointing_on(model)
    if switch_checkpointing:
        enable_activation_checkpointing(model)
    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    vocab = lm_head.weight.shape[0]
    model.train()
    losses = []
    for epoch in range(epochs):
        order = list(range(len(examples)))
        rng.shuffle(order)
        total, count, started = 0.0, 0, time.perf_counter()
        for start in range(0, len(order), batch_size):
            rows = [examples[i] for i in order[start : start + batch_size]]
            width = max(len(ids) for ids, _ in rows)
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            attn = torch.zeros((len(rows), width), dtype=torch.long)
            labels = torch.full((len(rows), width), -100, dtype=torch.long)
            for r, (row_ids, row_mask) in enumerate(rows):
                ids[r, : len(row_ids)] = torch.tensor(row_ids)
                attn[r, : len(row_ids)] = 1
                labels[r, : len(row_ids)] = torch.tensor([t if m else -100 for t, m in zip(row_ids, row_mask)])
            hidden = decoder(input_ids=ids.to(device), attention_mask=attn.to(device), use_cache=False).last_hidden_state
            targets = labels[:, 1:].to(device)  # position t predicts token t + 1
            trained = targets != -100
            logp, _ = chunked_token_logprobs(hidden[:, :-1][trained], lm_head, targets[trained], vocab=vocab)
            loss = -logp.mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            total, count = total + loss.item(), count + 1
        losses.append(total / max(count, 1))
        if progress:
            print(f"warm-up epoch {epoch + 1}/{epochs}: loss {losses[-1]:.4f} ({time.perf_counter() - started:.0f} s)",
                  file=sys.stderr, flush=True)
    if switch_checkpointing:
        disable_activation_checkpointing(model)
    model.eval()
    return losses


def warmup_model(model_name: str, env_id: str, env_kwargs: dict[str, Any], out_dir: str | Path, *,
                 agent: str = "random", episodes: int = 64, epochs: int = 2, lr: float = 1e-4, seed: int = 0,
                 progress: bool = True, activation_checkpointing: bool = True) -> Path:
    """Warm ``model_name`` up on ``agent``'s replies in ``env_id`` and save it (Hugging Face folder, tokenizer and
    ``ragen_warmup.json`` with the settings) to ``out_dir``; a folder that already holds this warm-up is reused."""
    out = Path(out_dir)
    settings = {"model": model_name, "env_id": env_id, "env_kwargs": _plain(env_kwargs), "agent": agent,
                "episodes": episodes, "epochs": epochs, "lr": lr, "seed": seed}  # fmt: skip
    record = out / "ragen_warmup.json"
    if record.is_file() and json.loads(record.read_text()).get("settings") == settings:
        return out
    torch.manual_seed(seed)
    model, tokenizer = load_model_and_tokenizer(model_name)
    chats = reference_chats(env_id, env_kwargs, episodes=episodes, agent=agent, seed=seed)
    losses = supervised_warmup(model, tokenizer, chats, epochs=epochs, lr=lr, seed=seed, progress=progress,
                               activation_checkpointing=activation_checkpointing)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    atomic_write_json(record, {"settings": settings, "losses": losses, "chats": len(chats)})
    return out


def _plain(value: Any) -> Any:
    """JSON-able form of env kwargs (protocol settings objects become their dicts)."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    import yaml

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--env", required=True, help="env id, e.g. ragen/Sokoban-v0")
    parser.add_argument("--protocol", default="{}", help="protocol settings as YAML, e.g. '{enable_think: false}'")
    parser.add_argument("--env-kwargs", default="{}", help="env keyword arguments as YAML")
    parser.add_argument("--agent", default="random", choices=WARMUP_AGENTS)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--no-activation-checkpointing", dest="activation_checkpointing", action="store_false",
                        help="keep every layer's activations (faster, far more memory on long chats)")
    args = parser.parse_args(argv)
    cfg = StarPOConfig(env_id=args.env, protocol=yaml.safe_load(args.protocol) or {},
                       env_kwargs=yaml.safe_load(args.env_kwargs) or {})  # fmt: skip
    out = warmup_model(args.model, args.env, cfg.env_make_kwargs(), args.out, agent=args.agent,
                       episodes=args.episodes, epochs=args.epochs, lr=args.lr, seed=args.seed,
                       activation_checkpointing=args.activation_checkpointing)  # fmt: skip
    print(f"warmed-up model in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
