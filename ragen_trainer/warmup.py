"""A short supervised warm-up on reference agents' replies, before RL: the ``reply-format`` warm-up.

A model too small to close ``<think>...</think><answer>...</answer>`` within a CPU-sized reply budget (SmolLM2-135M
writes free text) earns the same format penalty on every rollout, so every group's reward std is 0 and RL has nothing
to learn from. This warm-up plays episodes with a reference agent (``random``: uniformly random valid actions in the
protocol's reply format, :class:`ragen_trainer.evaluation.agents.RandomAgent`), and fine-tunes the model for a few
epochs on those replies (cross-entropy on the replies' tokens only, the chat template's end-of-turn token included),
so that it answers in the format with actions that are valid but no better than chance. RL then starts from a policy
whose rollouts differ in outcome.

``--agent mixed`` imitates :class:`~ragen_trainer.evaluation.agents.MixedAgent` instead: the oracle's actions at
``--oracle-share`` of the turns (0.5 by default) and random valid ones at the others, under one thinking sentence, so
that the imitating policy's action could lean toward the right one in each state (the random warm-up's plays one
action in every state: docs/learning.md). Whether it does is measured, not assumed (``benchmarks/oracle_logprob.py``).

It is not part of the paper's method (the paper starts RL from Qwen2.5-0.5B-Instruct, which writes the format
already). ``benchmarks/reproduce.py`` uses it only at its CPU scale, where it says so; the warm-up's settings are
recorded beside the model (``ragen_warmup.json``). The random agent's thinking is a fixed sentence, so after the
warm-up the thinking starts short and templated: thinking-length curves at that scale start from it.

The output folder is a cache of one setting (:func:`warmup_settings`: the model, the env and its kwargs, the agent,
episodes, epochs, learning rate, batch size and seed). It is reused only when its record holds the same settings. A
new warm-up is written whole into a temporary folder beside it (weights, tokenizer, then the record last), which is
renamed into place: a kill at any moment leaves the old folder or the new one, never new weights under an old record
or weights without one. A folder whose record holds other settings, or a damaged record, is replaced, saying so; a
folder with files but no record is not a warm-up and is refused, never deleted.

    python -m ragen_trainer.warmup --env ragen/Sokoban-v0 --protocol '{enable_think: false}' --out runs/warm/sokoban
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from ragen_envs.core import check_arg
from ragen_envs.driver import play_episodes, rollout_jobs
from ragen_envs.registration import reference_settings
from ragen_trainer.config import MAX_SEED, StarPOConfig
from ragen_trainer.critic import chunked_token_logprobs
from ragen_trainer.evaluation.agents import STATE_THOUGHTS, MixedAgent, RandomAgent
from ragen_trainer.evaluation.metrics import env_family
from ragen_trainer.fileio import BoundedReadError, apply_umask, atomic_write_json, read_text_bounded
from ragen_trainer.models import (
    ModelLoadError,
    activation_checkpointing_on,
    check_model_source,
    disable_activation_checkpointing,
    enable_activation_checkpointing,
    load_model_and_tokenizer,
)
from ragen_trainer.rollout import ChatTokens
from ragen_trainer.safe_yaml import load_yaml

#: Reference agents whose replies the warm-up imitates: ``random`` (the ``reply-format`` warm-up: the format, actions
#: no better than chance) and ``mixed`` (:class:`MixedAgent`: the oracle's actions at ``oracle_share`` of the turns,
#: random ones at the others, so that the imitating policy's action can lean toward the right one in each state).
WARMUP_AGENTS: tuple[str, ...] = ("random", "mixed")
#: The ``mixed`` agent's default share of oracle turns.
DEFAULT_ORACLE_SHARE = 0.5
#: The ``mixed`` agent's default thinking (:attr:`MixedAgent.THINKS`): one fixed sentence.
DEFAULT_THINK = "fixed"
#: Seeds of the warm-up's episodes start here, far from training (``step_seeds``) and validation seeds.
WARMUP_SEED_BASE = 7_000_000
#: The record of a warm-up folder: its settings, losses and chat count. Written last: no record, no warm-up.
RECORD = "ragen_warmup.json"
#: Largest record read (a record is a few hundred bytes; anything far larger is not one).
MAX_RECORD_BYTES = 1 << 20
#: Most episodes and epochs accepted (each episode is one chat trained on every epoch; beyond these a CPU warm-up
#: would run for days, which is a typo more often than a plan).
MAX_EPISODES = 1_000_000
MAX_EPOCHS = 10_000


def reference_chats(env_id: str, env_kwargs: dict[str, Any], *, episodes: int, agent: str = "random",
                    seed: int = 0, oracle_share: float = DEFAULT_ORACLE_SHARE,
                    think: str = DEFAULT_THINK) -> list[list[dict[str, str]]]:
    """The chats of ``episodes`` episodes played by the reference ``agent``: system, user, assistant, ... up to the
    last reply (the final observation, which no model reads, left out)."""
    check_arg(agent in WARMUP_AGENTS, "agent", agent, f"one of {list(WARMUP_AGENTS)}")
    check_arg(isinstance(episodes, int) and episodes >= 1, "episodes", episodes, "an int >= 1")
    jobs = rollout_jobs([WARMUP_SEED_BASE + seed * 100_003 + i for i in range(episodes)], 1)
    teacher = RandomAgent(seed=seed) if agent == "random" else MixedAgent(oracle_share, seed=seed, think=think)
    played = play_episodes(env_id, jobs, teacher, env_kwargs=env_kwargs)
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
    check_arg(_finite_positive(lr), "lr", lr, "a finite number > 0")
    check_arg(isinstance(batch_size, int) and batch_size >= 1, "batch_size", batch_size, "an int >= 1")
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


def warmup_settings(model_name: str, env_id: str, env_kwargs: dict[str, Any], *, agent: str = "random",
                    episodes: int = 64, epochs: int = 2, lr: float = 1e-4, batch_size: int = 4,
                    seed: int = 0, oracle_share: float = DEFAULT_ORACLE_SHARE,
                    think: str = DEFAULT_THINK) -> dict[str, Any]:
    """Everything a warm-up's weights depend on, as its record holds them (plain JSON data); ``oracle_share`` only
    for the ``mixed`` agent (the ``random`` one does not read it), ``think`` only where it is not the default (so
    that the records, and the caches, of earlier mixed warm-ups stay valid)."""
    settings = {"model": model_name, "env_id": env_id, "env_kwargs": _plain(env_kwargs), "agent": agent,
                "episodes": episodes, "epochs": epochs, "lr": lr, "batch_size": batch_size, "seed": seed}
    if agent == "mixed":
        settings["oracle_share"] = float(oracle_share)
        if think != DEFAULT_THINK:
            settings["think"] = think
    return settings


def settings_key(settings: dict[str, Any]) -> str:
    """A short hash of ``settings`` (:func:`warmup_settings`): the name of their cache folder."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def check_warmup_args(*, agent: str, episodes: int, epochs: int, lr: float, batch_size: int, seed: int,
                      oracle_share: float = DEFAULT_ORACLE_SHARE, think: str = DEFAULT_THINK) -> None:
    """``ValueError`` naming the first bad setting and what is accepted (nothing is loaded or played)."""
    check_arg(agent in WARMUP_AGENTS, "agent", agent, f"one of {list(WARMUP_AGENTS)}")
    share_ok = isinstance(oracle_share, (int, float)) and not isinstance(oracle_share, bool)
    check_arg(share_ok and 0.0 <= oracle_share <= 1.0, "oracle_share", oracle_share, "a number in [0, 1]")
    check_arg(think in MixedAgent.THINKS, "think", think, f"one of {list(MixedAgent.THINKS)}")
    check_arg(think == DEFAULT_THINK or agent == "mixed", "think", think,
              f"{DEFAULT_THINK!r} with the {agent!r} agent (only the mixed agent's thinking can be chosen)")
    for name, value, most in (("episodes", episodes, MAX_EPISODES), ("epochs", epochs, MAX_EPOCHS)):
        check_arg(_is_int(value) and 1 <= value <= most, name, value, f"an int in 1..{most:,}")
    check_arg(_finite_positive(lr) and lr <= 1.0, "lr", lr, "a finite number in (0, 1], e.g. 1e-4")
    check_arg(_is_int(batch_size) and batch_size >= 1, "batch_size", batch_size, "an int >= 1")
    check_arg(_is_int(seed) and 0 <= seed <= MAX_SEED, "seed", seed, f"an int in 0..{MAX_SEED}")


def read_record(folder: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, problem)`` of a warm-up folder: ``(None, None)`` when it has no record, ``(None, why)`` when the
    record is damaged (not JSON, not an object, no settings, not a regular file), else ``(record, None)``."""
    path = Path(folder) / RECORD
    if not path.exists() and not path.is_symlink():
        return None, None
    try:
        data = json.loads(read_text_bounded(path, MAX_RECORD_BYTES, "warm-up record"))
    except (OSError, ValueError) as exc:  # BoundedReadError, JSONDecodeError and UnicodeDecodeError are ValueErrors
        why = exc.args[0] if isinstance(exc, BoundedReadError) else f"not JSON: {exc}"
        return None, f"{path} is damaged ({why})"
    if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
        return None, f"{path} is damaged (not a warm-up record: expected a JSON object with 'settings')"
    return data, None


def warmup_folder_action(out: Path, settings: dict[str, Any]) -> tuple[str, str | None]:
    """What to do with ``out`` for a warm-up of ``settings``: ``("reuse", None)``, ``("new", None)`` or
    ``("replace", why)``; ``ValueError`` when ``out`` is a file, or a folder with files but no warm-up record (not
    ours to delete)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(f"invalid argument out={str(out)!r}: it is a file or a link; expected a new folder, an empty "
                         "one, or a warm-up folder (one with a ragen_warmup.json)")  # fmt: skip
    if not out.exists() or not any(out.iterdir()):
        return "new", None
    record, problem = read_record(out)
    if problem:
        return "replace", f"{problem}: the warm-up is done again and the folder replaced"
    if record is None:
        raise ValueError(f"invalid argument out={str(out)!r}: the folder holds files but no warm-up record "
                         f"({RECORD}), so it is not a warm-up folder and is left alone; choose a new or empty folder, "
                         "or delete that one")  # fmt: skip
    if record["settings"] == settings:
        return "reuse", None
    old = record["settings"]
    changed = [f"{k}: {old.get(k, '(unset)')!r} -> {settings.get(k, '(unset)')!r}"
               for k in sorted(set(old) | set(settings)) if old.get(k, "(unset)") != settings.get(k, "(unset)")]
    return "replace", (f"{out} holds a warm-up of other settings ({'; '.join(changed)}): it is replaced by this "
                       "warm-up")


def warmup_model(model_name: str, env_id: str, env_kwargs: dict[str, Any], out_dir: str | Path, *,
                 agent: str = "random", episodes: int = 64, epochs: int = 2, lr: float = 1e-4, batch_size: int = 4,
                 seed: int = 0, oracle_share: float = DEFAULT_ORACLE_SHARE, think: str = DEFAULT_THINK,
                 progress: bool = True,
                 activation_checkpointing: bool = True) -> Path:
    """Warm ``model_name`` up on ``agent``'s replies in ``env_id`` and save it (Hugging Face folder, tokenizer and
    ``ragen_warmup.json`` with the settings) to ``out_dir``; a folder whose record holds these settings is reused.

    The settings are checked before anything loads (``ValueError`` naming the bad one). The new folder is written
    whole beside ``out_dir`` and renamed into place, the record written last (module docstring): an interrupted
    warm-up leaves ``out_dir`` as it was."""
    check_warmup_args(agent=agent, episodes=episodes, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
                      oracle_share=oracle_share, think=think)  # fmt: skip
    out = Path(out_dir)
    settings = warmup_settings(model_name, env_id, env_kwargs, agent=agent, episodes=episodes, epochs=epochs, lr=lr,
                               batch_size=batch_size, seed=seed, oracle_share=oracle_share, think=think)  # fmt: skip
    action, why = warmup_folder_action(out, settings)
    if action == "reuse":
        return out
    if why:
        print(f"warm-up: {why}", file=sys.stderr, flush=True)
    _remove_leftovers(out)
    torch.manual_seed(seed)
    model, tokenizer = load_model_and_tokenizer(model_name)
    chats = reference_chats(env_id, env_kwargs, episodes=episodes, agent=agent, seed=seed, oracle_share=oracle_share,
                            think=think)
    losses = supervised_warmup(model, tokenizer, chats, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
                               progress=progress, activation_checkpointing=activation_checkpointing)
    _install(out, model, tokenizer, {"settings": settings, "losses": losses, "chats": len(chats)})
    return out


def _install(out: Path, model: Any, tokenizer: Any, record: dict[str, Any]) -> None:
    """Write the warm-up into a temporary folder beside ``out`` (weights and tokenizer flushed to disk, then the
    record), and rename it into place; an old ``out`` is moved aside first and removed after."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}.", dir=out.parent))
    old: Path | None = None
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        apply_umask(tmp)  # save_pretrained and mkdtemp make private files; the folder gets the umask's modes
        _fsync_files(tmp)  # the weights reach the disk before the record that vouches for them
        atomic_write_json(tmp / RECORD, record)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".replaced-{out.name}.", dir=out.parent))
            os.replace(out, old / out.name)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists() and (old / out.name).exists():  # put the old warm-up back
            os.replace(old / out.name, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _fsync_files(folder: Path) -> None:
    for base, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(base, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _remove_leftovers(out: Path) -> None:
    """Temporary folders of an earlier warm-up into ``out`` that was killed (never renamed into place)."""
    if not out.parent.is_dir():
        return
    for path in out.parent.glob(f".tmp-{out.name}.*"):
        if path.is_dir() and not path.is_symlink():
            print(f"warm-up: removing {path}, left by a warm-up that was stopped before it finished", file=sys.stderr)
            shutil.rmtree(path, ignore_errors=True)
    for path in out.parent.glob(f".replaced-{out.name}.*"):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _plain(value: Any) -> Any:
    """JSON-able form of env kwargs (protocol settings objects become their dicts)."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ragen_trainer.warmup", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2",
                        help="'smollm2' (bundled), a model folder or a cached hub id (default %(default)s)")
    parser.add_argument("--env", required=True, help="a registered ragen env id, e.g. ragen/Sokoban-v0")
    parser.add_argument("--protocol", default="{}", help="protocol settings as YAML, e.g. '{enable_think: false}'")
    parser.add_argument("--env-kwargs", default="{}", help="env keyword arguments as YAML")
    parser.add_argument("--agent", default="random", choices=WARMUP_AGENTS,
                        help="whose replies are imitated: random valid actions, or the oracle's at --oracle-share of "
                             "the turns and random ones at the others (default %(default)s)")
    parser.add_argument("--oracle-share", type=float, default=DEFAULT_ORACLE_SHARE,
                        help="the mixed agent's share of oracle turns, in [0, 1] (default %(default)s)")
    parser.add_argument("--think", default=DEFAULT_THINK,
                        help=f"the mixed agent's thinking, one of {list(MixedAgent.THINKS)}: one fixed sentence, or "
                             "the turn's state in words (positions, where the goal lies; default %(default)s)")
    parser.add_argument("--episodes", type=int, default=64, help=f"1..{MAX_EPISODES:,} (default %(default)s)")
    parser.add_argument("--epochs", type=int, default=2, help=f"1..{MAX_EPOCHS:,} (default %(default)s)")
    parser.add_argument("--lr", type=float, default=1e-4, help="in (0, 1] (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=4, help="chats per optimizer step (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help=f"0..{MAX_SEED} (default %(default)s)")
    parser.add_argument("--out", required=True, help="the output folder: new, empty, or an earlier warm-up's")
    parser.add_argument("--no-activation-checkpointing", dest="activation_checkpointing", action="store_false",
                        help="keep every layer's activations (faster, far more memory on long chats)")
    return parser


def check_cli_args(args: argparse.Namespace) -> dict[str, Any]:
    """Every value of the command, checked before any model loads; the env's make kwargs. ``ValueError`` naming
    the bad value and what is accepted."""
    check_warmup_args(agent=args.agent, episodes=args.episodes, epochs=args.epochs, lr=args.lr,
                      batch_size=args.batch_size, seed=args.seed, oracle_share=args.oracle_share,
                      think=args.think)  # fmt: skip
    mappings = {}
    for flag, text in (("--protocol", args.protocol), ("--env-kwargs", args.env_kwargs)):
        value = load_yaml(text, f"invalid argument {flag}={text!r}")
        check_arg(value is None or isinstance(value, dict), flag, text, "a YAML mapping, e.g. '{enable_think: false}'")
        mappings[flag] = value or {}
    try:
        reference_settings(args.env)
    except ValueError as exc:
        raise ValueError(f"invalid argument --env={args.env!r}: {str(exc).split(': ', 1)[-1]}") from None
    cfg = StarPOConfig(env_id=args.env, protocol=mappings["--protocol"], env_kwargs=mappings["--env-kwargs"])
    try:
        kwargs = cfg.env_make_kwargs()  # an unknown or ill-typed protocol setting fails here, naming it
    except ValueError as exc:
        raise ValueError(f"invalid protocol settings (--protocol {args.protocol!r}, --env-kwargs {args.env_kwargs!r}): "
                         f"{str(exc).removeprefix('invalid config: ')}") from None
    try:  # the env kwargs are the env's to judge: make it once
        gym.make(args.env, **kwargs).close()
    except (TypeError, ValueError, KeyError, gym.error.Error) as exc:
        why = str(exc).split(" was raised from the environment creator")[0]  # gymnasium appends every kwarg
        raise ValueError(f"invalid argument --env-kwargs={args.env_kwargs!r}: {args.env} does not accept them "
                         f"({why})") from None
    if args.think != DEFAULT_THINK and env_family(args.env) not in STATE_THOUGHTS:
        raise ValueError(f"invalid argument --think={args.think!r}: {args.env} has no state thought; expected "
                         f"{DEFAULT_THINK!r}, or an env of {sorted(STATE_THOUGHTS)}")
    check_model_source(args.model)
    out = Path(args.out)
    warmup_folder_action(out, warmup_settings(args.model, args.env, kwargs, agent=args.agent, episodes=args.episodes,
                                              epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                                              seed=args.seed, oracle_share=args.oracle_share,
                                              think=args.think))  # fmt: skip
    try:  # the folder the warm-up is renamed into must exist and take files: found out now, not after training
        out.parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out.parent).close()
    except OSError as exc:
        raise ValueError(f"invalid argument --out={args.out!r}: its folder {str(out.parent)!r} cannot be created or "
                         f"written ({exc.strerror or exc}); expected a folder where files can be written") from None
    return kwargs


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        kwargs = check_cli_args(args)
    except ValueError as exc:
        message = str(exc).replace("invalid config field", "invalid argument")
        for name in ("agent", "episodes", "epochs", "lr", "batch_size", "seed", "oracle_share", "think", "model", "out"):  # as the flags
            message = message.replace(f"invalid argument {name}=", f"invalid argument --{name.replace('_', '-')}=")
        parser.error(message)
    try:
        out = warmup_model(args.model, args.env, kwargs, args.out, agent=args.agent, episodes=args.episodes,
                           epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, seed=args.seed,
                           oracle_share=args.oracle_share, think=args.think,
                           activation_checkpointing=args.activation_checkpointing)  # fmt: skip
    except ModelLoadError as exc:
        print(f"{parser.prog}: error: invalid argument --model={args.model!r}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the disk filled up, or the folder went away while the warm-up ran
        print(f"{parser.prog}: error: the warm-up could not be written to {args.out} ({exc.strerror or exc}); "
              f"{args.out} is as it was", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted: {args.out} is as it was (a warm-up is written whole or not at all); "
              "run the same command again to start it over", file=sys.stderr)
        return 130
    print(f"warmed-up model in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
