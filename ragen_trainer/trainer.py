"""StarPO / StarPO-S on the Hugging Face ``Trainer`` (the base every TRL trainer builds on).

One training step, top to bottom (the paper's Algorithm 1, with StarPO-S's parts switched by the config):

1. **Rollout** -- P initial states (env seeds) x N rollouts each, multi-turn, with the current policy
   (:func:`ragen_trainer.rollout.collect_rollouts`). With several processes each one rolls out its share of the
   groups and the trajectories are gathered, so every process holds the same batch.
2. **Filter** (StarPO-S) -- keep the top ``filter_ratio`` of groups by in-group reward std
   (:mod:`ragen_trainer.filtering`). Filtered groups are dropped *here*: no scoring forward, no backward.
3. **Score** -- one no-grad forward over the kept trajectories (sharded over processes) for the old log-probs (the
   policy that generated the rollouts, before any update of this step), the reference log-probs (when a KL
   coefficient is set) and the critic's values.
4. **Advantages** -- GRPO, GAE or bi-level GAE (:mod:`ragen_trainer.advantages`) over the kept batch.
5. **Update** -- PPO as the reference runs it (verl's ``dp_actor.update_policy``): the kept trajectories are split, in
   order, into mini-batches of ``ppo_mini_batch_size``; each mini-batch is one optimizer step, ``ppo_epochs`` passes
   over them, every step against the step-3 log-probs, so from the second update on the ratio moves and clipping
   engages. A mini-batch runs as micro-batches through ``Trainer``'s gradient-accumulation loop; the loss
   (:mod:`ragen_trainer.losses`) is clipped PPO with decoupled and dual clipping, entropy bonus, optional KL, and the
   clipped value loss, normalised by the mini-batch's token (or sequence) count so micro-batches and processes add
   up exactly. The policy's and the critic's gradients are clipped each by its own norm.

Why ``transformers.Trainer`` and not ``trl.GRPOTrainer``: GRPOTrainer's step is built around one prompt -> one
completion with scalar rewards from reward functions, a prompt dataset fed through its ``RepeatSampler``, and a
fused LM head that returns log-probs but no hidden states; multi-turn groups, group filtering before scoring, and a
critic would each need most of its methods replaced. The parts TRL adds on top of ``Trainer`` that we need are
reused directly (``unwrap_model_for_generation`` for ZeRO-3 generation, ``prepare_deepspeed`` for the reference
model), and everything that makes ``accelerate launch``, DDP and DeepSpeed work comes from ``Trainer`` unchanged.

Checkpoints and faults: ``checkpoint-N`` is written to ``.saving-checkpoint-N``, flushed, verified and renamed into
place, so it is whole or absent; SIGINT / SIGTERM during a save wait for it. On start, :meth:`StarPOTrainer.train`
checks the output folder (a changed config is refused unless ``force_resume`` / ``overwrite``), removes unfinished
saves, skips checkpoints that fail :func:`ragen_trainer.models.checkpoint_problems` (renamed
``broken-checkpoint-N``, with a warning), resumes from the newest whole one, and cuts ``metrics.jsonl`` back to its
step so no step is logged twice.

Multi-process rules kept here: every collective (gather of trajectories and scores, metric reduction) is called on
every process in the same order; only the main process writes files; every process runs the same number of
micro-batches per step (a process with nothing to train gets a zero-weight micro-batch, so DDP's all-reduce meets).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import ExportableState, PrinterCallback, ProgressCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from ragen_trainer.advantages import bilevel_gae_advantages, gae_advantages, grpo_advantages, masked_whiten
from ragen_trainer.config import FolderPlan, StarPOConfig, check_output_folder, run_files
from ragen_trainer.critic import (
    CRITIC_ATTR,
    attach_critic,
    install_policy_forward,
    load_critic,
    policy_copy,
    save_critic,
    split_state_dict,
)
from ragen_trainer.fileio import atomic_write_json
from ragen_trainer.filtering import filter_groups
from ragen_trainer.losses import agg_loss, entropy_from_logits, kl_penalty, policy_loss, row_normalizers, value_loss
from ragen_trainer.rollout import placed_rewards
from ragen_trainer.trajectory import Trajectory

#: Validation initial states come from their own seed range, never drawn for training.
VAL_SEED_BASE = 1_000_000_000
#: Training seeds of step s are ``TRAIN_SEED_STRIDE * seed + s * env_groups + g``.
TRAIN_SEED_STRIDE = 10_000_019
#: The Echo Trap monitor's history, saved in every checkpoint folder.
MONITOR_FILE = "echo_trap_monitor.json"

logger = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What :meth:`StarPOTrainer.train` returns (and ``summary.json`` holds)."""

    global_step: int
    interrupted: bool
    checkpoint: str | None
    final_model: str | None
    metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    resumed_from: str | None = None
    """The checkpoint this run started from (``None``: from the initial model)."""
    skipped_checkpoints: dict[str, list[str]] = field(default_factory=dict)
    """Checkpoints newer than ``resumed_from`` that failed verification (renamed ``broken-checkpoint-N``), each
    with what was wrong."""


class _StepDataset(Dataset):
    """One item per micro-batch of one optimizer step: the data is the env, not a dataset, so items are placeholders
    that only drive ``Trainer``'s loop (one epoch = one step; ``max_steps`` sets the length)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, int]:
        return {"index": index}


def _identity_collator(features: list[dict[str, int]]) -> list[dict[str, int]]:
    return features


class _QuietProgress(ProgressCallback):
    """The step progress bar without the raw ``logs`` dicts (the metrics logger prints a table instead)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        return None


def mini_batch_count(config: StarPOConfig) -> int:
    """PPO mini-batches per pass: the kept trajectories split into ``ppo_mini_batch_size`` (the last may be smaller)."""
    return max(1, math.ceil(config.kept_groups * config.group_size / config.ppo_mini_batch_size))


def updates_per_step(config: StarPOConfig) -> int:
    """Optimizer steps per training step: one per mini-batch, ``ppo_epochs`` passes."""
    return config.ppo_epochs * mini_batch_count(config)


def micro_batch_count(config: StarPOConfig, world_size: int) -> int:
    """Micro-batches per optimizer step on each process: the largest mini-batch split into ``micro_batch_size``."""
    largest = min(config.kept_groups * config.group_size, config.ppo_mini_batch_size)
    return max(1, math.ceil(largest / (world_size * config.micro_batch_size)))


def build_training_arguments(config: StarPOConfig, world_size: int, **overrides: Any) -> TrainingArguments:
    """The ``transformers.TrainingArguments`` a :class:`StarPOConfig` implies (``overrides`` win)."""
    ppo = updates_per_step(config)
    kwargs: dict[str, Any] = dict(
        output_dir=config.output_dir,
        max_steps=config.total_steps * ppo,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=micro_batch_count(config, world_size),
        learning_rate=config.actor_lr,
        weight_decay=config.weight_decay,
        warmup_steps=config.warmup_steps,
        lr_scheduler_type=config.lr_scheduler_type,
        max_grad_norm=config.max_grad_norm,
        logging_steps=config.logging_steps * ppo,
        logging_strategy="steps",
        save_strategy="steps" if config.save_steps > 0 else "no",
        save_steps=max(1, config.save_steps * ppo),
        save_total_limit=config.save_total_limit or None,
        seed=config.seed,
        report_to="none",  # ragen's MetricsLogger writes JSONL / TensorBoard / wandb itself
        remove_unused_columns=False,
        dataloader_num_workers=0,
        deepspeed=config.deepspeed or None,
        include_num_input_tokens_seen="no",
        use_cpu=not torch.cuda.is_available(),
        bf16=config.dtype == "bfloat16" or (config.dtype == "auto" and torch.cuda.is_available()
                                            and torch.cuda.is_bf16_supported()),
        fp16=config.dtype == "float16",
        disable_tqdm=False,
    )
    if config.gradient_checkpointing:
        # transformers renamed the argument activation_checkpointing (the old name warns there): pass the one it has.
        # Non-reentrant checkpointing needs no input that requires grad (a LoRA model's embeddings are frozen).
        fields = {f.name for f in dataclasses.fields(TrainingArguments)}
        name = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
        kwargs[name] = True
        kwargs[f"{name}_kwargs"] = {"use_reentrant": False}
    kwargs.update(overrides)
    return TrainingArguments(**kwargs)


def _pad(rows: list[list[float]] | list[list[int]], width: int, value: float, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def _turn_ends(traj: Trajectory) -> list[int]:
    """Action positions (``input_ids`` index - 1) of the last token of each reply."""
    return [end - 2 for start, end in traj.turn_spans if end - start >= 1 and end >= 2]


class StarPOTrainer(Trainer):
    """StarPO / StarPO-S trainer. See the module docstring for the step.

    Args:
        config: the run's :class:`~ragen_trainer.config.StarPOConfig` (validated here).
        model: the policy, a ``transformers`` causal LM (a critic is attached to it when the config asks for one).
        tokenizer: its tokenizer, with a chat template.
        engine: the generation engine for rollouts; default an :class:`~ragen_trainer.engines.hf.HFEngine` on the
            policy itself (on-policy by construction). A vLLM engine gets the new weights through
            ``engine.update_weights(model)`` before every rollout.
        ref_model: the frozen reference policy for the KL term; default a copy of ``model`` made before training.
        callbacks: extra ``TrainerCallback`` objects.
        training_args: overrides of the ``TrainingArguments`` built from the config.
    """

    # compute_loss already normalises by the whole batch (see _loss_normalizers): Trainer must not divide again.
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        config: StarPOConfig,
        model: Any,
        tokenizer: Any,
        *,
        engine: Any = None,
        ref_model: Any = None,
        callbacks: list[TrainerCallback] | None = None,
        training_args: dict[str, Any] | None = None,
    ) -> None:
        from accelerate import PartialState

        self.cfg = config.validate()
        # Record the run's whole protocol (the env's reference values included) in config.yaml and every checkpoint.
        self.cfg.protocol = self.cfg.protocol_settings().to_dict()
        if getattr(tokenizer, "pad_token_id", None) is None:
            tokenizer.pad_token = tokenizer.eos_token
        world = PartialState().num_processes
        self.n_micro = micro_batch_count(config, world)
        self.n_mini = mini_batch_count(config)
        self.n_updates = updates_per_step(config)

        # The reference policy is copied before a critic is attached (the copy must not carry one).
        if (config.kl_coef > 0 or config.kl_reward_coef > 0) and ref_model is None:
            ref_model = policy_copy(model)
        if config.use_critic:
            attach_critic(model, config.critic)
        install_policy_forward(model)
        if ref_model is not None:
            install_policy_forward(ref_model)

        args = build_training_arguments(config, world, **(training_args or {}))
        super().__init__(
            model=model,
            args=args,
            train_dataset=_StepDataset(self.n_micro * args.per_device_train_batch_size * world),
            processing_class=tokenizer,
            data_collator=_identity_collator,
            callbacks=callbacks,
        )
        self.remove_callback(PrinterCallback)
        self.remove_callback(ProgressCallback)
        self.add_callback(_QuietProgress)
        self.tokenizer = tokenizer

        self.ref_model = None
        if ref_model is not None:
            ref_model.eval().requires_grad_(False)
            if self.is_deepspeed_enabled:
                from trl.models.utils import prepare_deepspeed

                self.ref_model = prepare_deepspeed(ref_model, self.accelerator)
            else:
                self.ref_model = ref_model.to(self.accelerator.device)

        if engine is None:
            from ragen_trainer.engines.hf import HFEngine
            from ragen_trainer.engines.hf_generate import GenerateEngine

            engine_cls = GenerateEngine if config.engine == "hf-generate" else HFEngine
            engine = engine_cls(model, tokenizer, batch_size=config.generation_batch_size)
        self.engine = engine

        self._buffer: list[list[dict[str, Any]]] | None = None  # [mini-batch][micro-batch]
        self._micro = 0
        self._grad_norms: dict[str, list[float]] = defaultdict(list)  # per update, since the last log
        self._step_stats: dict[str, list[float]] = defaultdict(list)
        self._pending: dict[str, float] = {}
        self._timings: dict[str, float] = defaultdict(float)
        self.history: list[dict[str, float]] = []
        self.val_history: list[dict[str, float]] = []
        self._monitor = None
        self._logger = None
        self._opponents: Any = None  # self-play's OpponentPool, made at the first self-play step
        self._last_logged_step = -1
        self._defer_depth = 0  # > 0 while a save runs with SIGINT / SIGTERM held back
        self._deferred_signals: list[int] = []
        self._saving_final = False  # True while final/ is written (see _save)

    # ------------------------------------------------------------------------------------------ optimizer
    def create_optimizer(self, model: Any = None) -> Any:
        """AdamW with two parameter groups: the policy at ``actor_lr``, the critic at ``critic_lr``."""
        if self.optimizer is not None:
            return self.optimizer
        net = self.model
        actor = [p for n, p in net.named_parameters() if p.requires_grad and CRITIC_ATTR not in n]
        critic = [p for n, p in net.named_parameters() if p.requires_grad and CRITIC_ATTR in n]
        groups = [{"params": actor, "lr": self.cfg.actor_lr, "weight_decay": self.cfg.weight_decay}]
        if critic:
            groups.append({"params": critic, "lr": self.cfg.critic_lr, "weight_decay": self.cfg.weight_decay})
        optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(self.args, net)
        optimizer_kwargs = {k: v for k, v in optimizer_kwargs.items() if k not in ("lr", "weight_decay")}
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer

    # ------------------------------------------------------------------------------------------ the step
    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        t0 = time.perf_counter()
        self._prepare_seconds = 0.0
        loss = super().training_step(model, inputs, num_items_in_batch)
        # forward + backward of the loss only (the rollout, done inside _prepare_inputs, is timed on its own)
        update = time.perf_counter() - t0 - self._prepare_seconds
        self._timings["time/update"] = self._timings.get("time/update", 0.0) + update
        self._micro += 1
        if self._micro % (self.n_micro * self.n_updates) == 0:
            self._finish_step_stats()
        return loss

    def _prepare_inputs(self, inputs: Any) -> dict[str, Any]:
        position = self._micro % (self.n_micro * self.n_updates)  # micro-batch index within the training step
        if position == 0 and (self._buffer is None or self.state.global_step % self.n_updates == 0):
            t0 = time.perf_counter()
            self._buffer = self._rollout_step()
            self._prepare_seconds = time.perf_counter() - t0
        assert self._buffer is not None
        update, micro = divmod(position, self.n_micro)
        mini = update % self.n_mini  # pass (epoch) update // n_mini goes over the same mini-batches again
        return {k: (v.to(self.accelerator.device) if isinstance(v, torch.Tensor) else v)
                for k, v in self._buffer[mini][micro].items()}

    def _clip_grad_norm(self, model: Any) -> Any:
        """Clip the policy's and the critic's gradients each by its own norm (the reference's two optimizers, each
        with ``grad_clip``); returns the policy's norm before clipping. Under DeepSpeed, one joint clip."""
        if self.is_deepspeed_enabled:
            norm = super()._clip_grad_norm(model)
        else:
            actor, critic = [], []
            for name, param in model.named_parameters():
                if param.requires_grad:
                    (critic if CRITIC_ATTR in name else actor).append(param)
            norm = self.accelerator.clip_grad_norm_(actor, self.cfg.max_grad_norm)
            if critic:
                critic_norm = self.accelerator.clip_grad_norm_(critic, self.cfg.critic_max_grad_norm)
                self._grad_norms["critic/grad_norm"].append(float(critic_norm))
        self._grad_norms["optim/grad_norm"].append(float(norm))
        return norm

    def _rollout_step(self) -> list[list[dict[str, Any]]]:
        cfg = self.cfg
        step = self.state.global_step // self.n_updates
        if cfg.val_every and step % cfg.val_every == 0:
            self._pending.update(self.validate(step))

        t0 = time.perf_counter()
        seeds = step_seeds(cfg, step)
        trajs, timings = self._collect(seeds, cfg.group_size, cfg.temperature, sampling_seed=cfg.seed * 7919 + step,
                                       selfplay=bool(cfg.opponent_pool))  # fmt: skip
        self._timings.update({f"time/{k}": v for k, v in timings.items()})
        self._timings["time/rollout"] = time.perf_counter() - t0
        metrics = self._rollout_metrics(trajs)

        # StarPO-S filtering: before any scoring, so dropped groups cost neither forward nor backward passes.
        groups: dict[int, list[float]] = defaultdict(list)
        for t in trajs:
            groups[t.group_id].append(t.reward)
        result = filter_groups(groups, cfg.filter_ratio, cfg.filter_mode, cfg.filter_round)
        kept_ids = set(result.kept)
        kept = [t for t in trajs if t.group_id in kept_ids]
        if any(t.eval_only for t in kept):
            raise ValueError("the engine returned text-only (eval_only) trajectories; train with engine hf or vllm")
        metrics.update(result.stats)
        metrics["filter/kept_ratio"] = len(result.kept) / max(len(groups), 1)
        metrics["filter/kept_trajectories"] = float(len(kept))

        t1 = time.perf_counter()
        scores = self._score(kept)
        self._timings["time/scoring"] = time.perf_counter() - t1
        batch = self._advantages(kept, scores)
        metrics.update(batch.pop("metrics"))
        metrics["optim/updates"] = float(self.n_updates)
        self._pending.update(metrics)
        return self._mini_batches(batch)

    # ------------------------------------------------------------------------------------------ 1. rollout
    def _collect(self, seeds: list[int], group_size: int, temperature: float, *, sampling_seed: int,
                 selfplay: bool = False) -> tuple[list[Trajectory], dict[str, float]]:
        """Roll out ``seeds`` x ``group_size``: this process's share of the groups, then gathered everywhere.
        ``selfplay``: games against the opponent pool (training steps of a self-play run; validation plays the
        single-agent view)."""
        from trl.models.utils import unwrap_model_for_generation

        from ragen_trainer.engines.base import SamplingParams
        from ragen_trainer.rollout import collect_rollouts

        cfg = self.cfg
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        local = list(range(rank, len(seeds), world))
        env_kwargs = cfg.env_make_kwargs()  # the env's arguments and exactly the run's protocol settings
        params = SamplingParams(
            temperature=temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            seed=(sampling_seed * 131 + rank) % (2**31),
        )
        model = self.model_wrapped if self.model_wrapped is not None else self.model
        timings: dict[str, float] = {}
        trajs: list[Trajectory] = []
        if local:
            with unwrap_model_for_generation(model, self.accelerator) as unwrapped:
                self._sync_engine(unwrapped)
                common = dict(env_kwargs=env_kwargs, sampling=params, max_context_tokens=cfg.max_context_tokens,
                              group_randomness=cfg.group_randomness, reply_tokens=cfg.reply_tokens,
                              loss_mask=cfg.loss_mask, progress=self.accelerator.is_main_process)  # fmt: skip
                if selfplay:  # groups 2g + seat (ragen_trainer.selfplay)
                    batch = self._collect_selfplay(unwrapped, seeds, local, group_size, common)
                else:
                    batch = collect_rollouts(self.engine, self.tokenizer, cfg.env_id, [seeds[g] for g in local],
                                             group_size, **common)  # fmt: skip
            for t in batch.trajectories:  # local group index -> global group index
                t.group_id = (2 * local[t.group_id // 2] + t.group_id % 2) if selfplay else local[t.group_id]
            trajs, timings = batch.trajectories, dict(batch.timings)
        else:
            with unwrap_model_for_generation(model, self.accelerator) as unwrapped:
                self._sync_engine(unwrapped)  # take part in ZeRO-3's gather even with no groups of our own
        if world > 1:
            from accelerate.utils import gather_object

            trajs = gather_object(trajs)
            trajs.sort(key=lambda t: t.group_id)  # stable: rollouts keep their order inside a group
        return trajs, timings

    def _collect_selfplay(self, unwrapped: Any, seeds: list[int], local: list[int], group_size: int,
                          common: dict[str, Any]) -> Any:  # fmt: skip
        """Self-play rollouts of this process's groups: each group's opponent drawn from the pool (the draw covers
        all groups, so it is the same on every process), a snapshot of the policy taken when one is due."""
        from ragen_trainer.selfplay import OpponentPool, collect_selfplay_rollouts

        cfg = self.cfg
        step = self.state.global_step // self.n_updates
        if self._opponents is None:
            self._opponents = OpponentPool(cfg.opponent_pool, snapshot_every=cfg.opponent_snapshot_every,
                                           size=cfg.opponent_pool_size, seed=cfg.seed, tokenizer=self.tokenizer,
                                           batch_size=cfg.generation_batch_size)  # fmt: skip
        kinds = self._opponents.kinds(step, len(seeds))
        self._opponents.observe(step, unwrapped)  # a snapshot of the policy when one is due (``past`` in the pool)
        past_engine = None
        if "past" in kinds:
            past_engine, taken = self._opponents.past_engine(step)
            self._pending["selfplay/past_snapshot_step"] = float(taken)
        return collect_selfplay_rollouts(self.engine, self.tokenizer, cfg.env_id, [seeds[g] for g in local],
                                         group_size, [kinds[g] for g in local], past_engine=past_engine,
                                         **common)  # fmt: skip

    def _sync_engine(self, unwrapped: Any) -> None:
        """Give the engine the current weights. An in-process engine (hf, vLLM colocate) gets them on every
        process; a vLLM *server* is shared, so only the main process pushes, and everyone waits for the push."""
        server = getattr(self.engine, "mode", None) == "server"
        if getattr(self.engine, "name", "") in ("hf", "hf-generate"):
            self.engine.update_weights(unwrapped)
        elif not server or self.accelerator.is_main_process:
            self.engine.update_weights(_PolicyView(unwrapped))
        if server and self.accelerator.num_processes > 1:
            self.accelerator.wait_for_everyone()

    def _rollout_metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        from ragen_trainer.monitor import rollout_metrics
        from ragen_trainer.selfplay import selfplay_metrics
        from ragen_trainer.trajectory import RolloutBatch

        metrics = {k: float(v) for k, v in rollout_metrics(RolloutBatch(trajs), self.tokenizer).items()
                   if isinstance(v, (int, float))}  # fmt: skip
        metrics.update(selfplay_metrics(trajs))  # per seat and opponent (empty unless self-play)
        return metrics

    # ------------------------------------------------------------------------------------------ 3. score
    @torch.no_grad()
    def _score(self, kept: list[Trajectory]) -> dict[str, list[list[float]]]:
        """Old log-probs, reference log-probs and values of the kept trajectories (per action position)."""
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        mine = list(range(rank, len(kept), world))
        out: dict[int, dict[str, list[float]]] = {}
        model = self.model_wrapped if self.model_wrapped is not None else self.model
        was_training = model.training
        model.eval()
        try:
            size = self.cfg.micro_batch_size
            for start in range(0, max(len(mine), 1), size):
                chunk = mine[start : start + size]
                if not chunk:
                    break
                trajs = [kept[i] for i in chunk]
                ids, attn = self._pack(trajs)
                mask = _pad([list(t.loss_mask[1:]) for t in trajs], ids.shape[1] - 1, 0, torch.long)
                ids, attn, mask = (x.to(self.accelerator.device) for x in (ids, attn, mask))
                logp, _, values = self._forward(model, ids, attn, entropy=False, values=self.cfg.use_critic, mask=mask)
                ref = None
                if self.ref_model is not None:
                    ref, _, _ = self._forward(self.ref_model, ids, attn, entropy=False, values=False, mask=mask)
                for row, i in enumerate(chunk):
                    n = len(kept[i].input_ids) - 1
                    out[i] = {"old_logprobs": logp[row, :n].float().cpu().tolist()}
                    if ref is not None:
                        out[i]["ref_logprobs"] = ref[row, :n].float().cpu().tolist()
                    if values is not None:
                        out[i]["values"] = values[row, :n].float().cpu().tolist()
        finally:
            if was_training:
                model.train()
        items = list(out.items())
        if world > 1:
            from accelerate.utils import gather_object

            items = gather_object(items)
        merged = dict(items)
        keys = ("old_logprobs", "ref_logprobs", "values")
        return {k: [merged[i][k] for i in range(len(kept))] for k in keys if kept and k in merged[0]}

    def _pack(self, trajs: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(t.input_ids) for t in trajs)
        pad = self.tokenizer.pad_token_id
        ids = _pad([list(t.input_ids) for t in trajs], width, pad, torch.long)
        attn = _pad([[1] * len(t.input_ids) for t in trajs], width, 0, torch.long)
        return ids, attn

    def _forward(self, model: Any, ids: torch.Tensor, attn: torch.Tensor, *, entropy: bool, values: bool,
                 mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Per action position (token t+1 given tokens <= t): log-prob at the sampling temperature, entropy, value.

        Only the positions in ``mask`` (the model's own tokens) go through the LM head and the softmax, so prompt and
        environment tokens never cost a ``[tokens, vocab]`` tensor."""
        sel = mask.bool()
        logits_mask = torch.zeros_like(ids, dtype=torch.bool)
        logits_mask[:, :-1] = sel
        kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": attn, "logits_mask": logits_mask}
        if values:
            kwargs["return_values"] = True
        out = model(**kwargs)
        targets = ids[:, 1:]
        chosen = out["selected_logits"].float() / self.cfg.temperature
        logp_sel = torch.log_softmax(chosen, dim=-1).gather(-1, targets[sel].unsqueeze(-1)).squeeze(-1)
        logp = torch.zeros(targets.shape, dtype=logp_sel.dtype, device=logp_sel.device).masked_scatter(sel, logp_sel)
        ent = None
        if entropy:
            ent_sel = entropy_from_logits(chosen)
            ent = torch.zeros(targets.shape, dtype=ent_sel.dtype, device=ent_sel.device).masked_scatter(sel, ent_sel)
        vals = out["values"][:, :-1].float() if values else None
        return logp, ent, vals

    # ------------------------------------------------------------------------------------------ 4. advantages
    def _advantages(self, kept: list[Trajectory], scores: dict[str, list[list[float]]]) -> dict[str, Any]:
        cfg = self.cfg
        width = max(len(t.input_ids) for t in kept) - 1
        mask = _pad([list(t.loss_mask[1:]) for t in kept], width, 0, torch.float32)
        ends = [_turn_ends(t) for t in kept]
        # Token rewards on action positions (input position - 1); rollout.placed_rewards puts them on reply tokens.
        rewards = _pad([placed_rewards(t, cfg.reward_placement)[1:] for t in kept], width, 0.0, torch.float32)
        kl_penalty_tokens = torch.zeros_like(mask)
        if cfg.kl_reward_coef > 0 and scores.get("ref_logprobs") is not None:
            # In-reward KL (the reference code's, as in RLHF): r_t <- r_t - beta * (log pi_old(a_t) - log pi_ref(a_t))
            # on every model token, before the advantage, so the critic and GRPO both see the penalised return.
            old = _pad(scores["old_logprobs"], width, 0.0, torch.float32)
            ref = _pad(scores["ref_logprobs"], width, 0.0, torch.float32)
            kl_penalty_tokens = cfg.kl_reward_coef * (old - ref) * mask
            rewards = rewards - kl_penalty_tokens
        values = None
        if cfg.adv_estimator == "grpo":
            returns_traj = torch.tensor([t.reward for t in kept], dtype=torch.float32) - kl_penalty_tokens.sum(dim=1)
            adv_traj = grpo_advantages(returns_traj, [t.group_id for t in kept], norm_by_std=cfg.grpo_norm_by_std)
            advantages = adv_traj[:, None] * mask
            returns = torch.zeros_like(mask)
        else:
            values = _pad(scores["values"], width, 0.0, torch.float32) * mask
            if cfg.adv_estimator == "gae":
                advantages, returns = gae_advantages(rewards, values, mask, gamma=cfg.gamma, lam=cfg.lam)
            else:
                advantages, returns = bilevel_gae_advantages(rewards, values, mask, ends, gamma=cfg.gamma,
                                                             lam=cfg.lam, turn_gamma=cfg.turn_gamma,
                                                             turn_lam=cfg.turn_lam)
            if cfg.whiten_advantages:
                advantages = masked_whiten(advantages, mask)
        n_tok = float(mask.sum())
        metrics = {
            "adv/mean": float((advantages * mask).sum() / max(n_tok, 1.0)),
            "adv/abs_mean": float((advantages.abs() * mask).sum() / max(n_tok, 1.0)),
            "batch/model_tokens": n_tok,
            "reward/kl_penalty": float(kl_penalty_tokens.sum() / max(len(kept), 1)),
        }
        if values is not None:
            metrics["critic/values_mean"] = float((values * mask).sum() / max(n_tok, 1.0))
            metrics["critic/returns_mean"] = float((returns * mask).sum() / max(n_tok, 1.0))
        return {
            "kept": kept,
            "mask": mask,
            "advantages": advantages,
            "returns": returns,
            "values": values,
            "old_logprobs": scores["old_logprobs"],
            "ref_logprobs": scores.get("ref_logprobs"),
            "metrics": metrics,
        }

    # ------------------------------------------------------------------------------------------ 5. mini-batches
    def _mini_batches(self, batch: dict[str, Any]) -> list[list[dict[str, Any]]]:
        """The kept trajectories in order, split into ``n_mini`` PPO mini-batches (verl's ``batch.split``, no shuffle),
        each into this process's ``n_micro`` micro-batches."""
        kept: list[Trajectory] = batch["kept"]
        size = self.cfg.ppo_mini_batch_size
        return [self._micro_batches(batch, list(range(start, min(start + size, len(kept)))))
                for start in range(0, size * self.n_mini, size)]

    def _micro_batches(self, batch: dict[str, Any], members: list[int]) -> list[dict[str, Any]]:
        kept: list[Trajectory] = batch["kept"]
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        mine = members[rank::world]
        # Per-row denominators over the whole mini-batch (losses.row_normalizers), each process's divided by its share:
        # DDP averages over processes, so the summed gradient is that of the mini-batch's loss under loss_agg_mode.
        norms = row_normalizers(batch["mask"][members], self.cfg.loss_agg_mode, world=world,
                                micro_size=self.cfg.loss_agg_micro_size)  # fmt: skip
        norm_of = {member: norms[k] for k, member in enumerate(members)}
        chunks = [list(c) for c in np.array_split(np.array(mine, dtype=np.int64), self.n_micro)]
        out = []
        for chunk in chunks:
            weight = 1.0
            if not chunk:  # nothing left for this micro-batch: a zero-weight one keeps DDP's collectives in step
                chunk, weight = [mine[0] if mine else members[0] if members else 0], 0.0
            trajs = [kept[i] for i in chunk]
            ids, attn = self._pack(trajs)
            w = ids.shape[1] - 1

            def rows(t: torch.Tensor | None, _chunk: list[int] = chunk, _w: int = w) -> torch.Tensor | None:
                return None if t is None else t[_chunk, :_w].clone()

            mb = {
                "input_ids": ids,
                "attention_mask": attn,
                "mask": rows(batch["mask"]) * weight,
                "advantages": rows(batch["advantages"]),
                "returns": rows(batch["returns"]),
                "old_values": rows(batch["values"]),
                "old_logprobs": _pad([batch["old_logprobs"][i] for i in chunk], w, 0.0, torch.float32),
                "ref_logprobs": None if batch["ref_logprobs"] is None
                else _pad([batch["ref_logprobs"][i] for i in chunk], w, 0.0, torch.float32),
                "normalizer": torch.stack([norm_of.get(i, norms.new_ones(())) for i in chunk]).clamp(min=1e-8),
            }
            out.append(mb)
        return out

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> torch.Tensor:
        cfg = self.cfg
        t0 = time.perf_counter()
        mask = inputs["mask"]
        norm = inputs["normalizer"]
        logp, ent, values = self._forward(model, inputs["input_ids"], inputs["attention_mask"], entropy=True,
                                          values=cfg.use_critic, mask=mask > 0)
        pg, pg_stats = policy_loss(logp, inputs["old_logprobs"], inputs["advantages"], mask, clip_low=cfg.clip_low,
                                   clip_high=cfg.clip_high, clip_ratio_c=cfg.clip_ratio_c, agg_mode=cfg.loss_agg_mode,
                                   normalizer=norm)
        ent_loss = agg_loss(ent, mask, cfg.loss_agg_mode, norm)
        loss = pg - cfg.entropy_coef * ent_loss
        stats = {"loss/policy": pg.detach(), "policy/entropy": ent_loss.detach()}
        if inputs.get("ref_logprobs") is not None and cfg.kl_coef > 0:
            kl = agg_loss(kl_penalty(logp, inputs["ref_logprobs"], cfg.kl_estimator), mask, cfg.loss_agg_mode, norm)
            loss = loss + cfg.kl_coef * kl
            stats["policy/kl"] = kl.detach()
        if values is not None:
            vf, vf_stats = value_loss(values, inputs["old_values"], inputs["returns"], mask, clip=cfg.value_clip,
                                      agg_mode=cfg.loss_agg_mode, normalizer=norm)
            loss = loss + cfg.value_loss_coef * vf
            stats["loss/value"] = vf.detach()
            self._step_stats["tok:critic/vf_clipfrac"].append(float(vf_stats["vf_clipfrac"]) * float(mask.sum()))
        # Sums over micro-batches give each update's value (losses are pre-normalised), averaged over the step's
        # updates; fractions and the mean ratio are token-weighted over all of them; min / max over all of them.
        n_tok = float(mask.sum())
        for k, v in stats.items():
            self._step_stats["sum:" + k].append(float(v))
        for k in ("clipfrac", "clipfrac_high", "clipfrac_low", "clipfrac_dual", "approx_kl", "ratio_mean"):
            self._step_stats["tok:policy/" + k].append(float(pg_stats[k]) * n_tok)
        if n_tok > 0:
            self._step_stats["min:policy/ratio_min"].append(float(pg_stats["ratio_min"]))
            self._step_stats["max:policy/ratio_max"].append(float(pg_stats["ratio_max"]))
        self._step_stats["tokens"].append(n_tok)
        self._timings["time/forward_loss"] = self._timings.get("time/forward_loss", 0.0) + time.perf_counter() - t0
        return loss

    def _finish_step_stats(self) -> None:
        """Reduce this step's loss statistics over micro-batches, updates and processes into the pending metrics."""
        stats = self._step_stats
        keys = sorted(k for k in stats if k.split(":", 1)[0] in ("sum", "tok"))
        local = torch.tensor([sum(stats[k]) for k in keys] + [sum(stats["tokens"])], dtype=torch.float64,
                             device=self.accelerator.device)
        world = self.accelerator.num_processes
        total = self.accelerator.reduce(local, reduction="sum") if world > 1 else local
        tokens = float(total[-1])
        for i, k in enumerate(keys):
            kind, name = k.split(":", 1)
            # sum: each process holds its share of a global mean (normalised by global count / world), per update
            value = float(total[i]) / world / self.n_updates if kind == "sum" else float(total[i]) / max(tokens, 1.0)
            self._pending[name] = value
        # Every process computes the same keys, so the gathers below meet; an empty list stands for "no token".
        extremes = torch.tensor([min(stats["min:policy/ratio_min"], default=math.inf),
                                 max(stats["max:policy/ratio_max"], default=-math.inf)], dtype=torch.float64,
                                device=self.accelerator.device)  # fmt: skip
        if world > 1:
            extremes = self.accelerator.gather(extremes).view(world, 2)
            extremes = torch.stack([extremes[:, 0].min(), extremes[:, 1].max()])
        if math.isfinite(float(extremes[0])):
            self._pending["policy/ratio_min"] = float(extremes[0])
            self._pending["policy/ratio_max"] = float(extremes[1])
        self._step_stats = defaultdict(list)

    # ------------------------------------------------------------------------------------------ validation
    def validate(self, step: int | None = None) -> dict[str, float]:
        """Success and reward on ``val_groups`` fixed initial states, one rollout each at ``val_temperature``."""
        cfg = self.cfg
        seeds = [VAL_SEED_BASE + i for i in range(cfg.val_groups)]
        t0 = time.perf_counter()
        trajs, _ = self._collect(seeds, 1, cfg.val_temperature, sampling_seed=VAL_SEED_BASE + (step or 0))
        n = max(len(trajs), 1)
        out = {
            "val/success": sum(bool(t.success) for t in trajs) / n,
            "val/reward": sum(t.reward for t in trajs) / n,
            "val/turns": sum(t.num_turns for t in trajs) / n,
            "time/validation": time.perf_counter() - t0,
        }
        self.val_history.append({"step": float(step if step is not None else self.state.global_step), **out})
        return out

    # ------------------------------------------------------------------------------------------ logging
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs or "grad_norm" in logs:
            step = self.state.global_step // self.n_updates
            metrics: dict[str, float] = {"step": float(step)}
            metrics.update(self._pending)
            # gradient norms before clipping, averaged over the updates since the last log (Trainer's is the last one)
            for name, norms in self._grad_norms.items():
                metrics[name] = sum(norms) / len(norms)
            self._grad_norms = defaultdict(list)
            if logs.get("grad_norm") is not None and "optim/grad_norm" not in metrics:
                metrics["optim/grad_norm"] = float(logs["grad_norm"])
            if logs.get("learning_rate") is not None:
                metrics["optim/lr"] = float(logs["learning_rate"])
            self._emit(step, metrics)
        super().log(logs, start_time)

    def _emit(self, step: int, metrics: dict[str, float]) -> None:
        """Record one step's metrics (history on every process; files and console on the main one)."""
        metrics.update(self._timings)
        self._pending, self._timings = {}, defaultdict(float)
        self._last_logged_step = step
        self.history.append(metrics)
        if self.accelerator.is_main_process:
            warnings = self._echo_monitor().update(step, metrics)
            if warnings:
                metrics["echo_trap/warnings"] = float(len(warnings))
            self._metrics_logger().log(step, metrics, warnings)

    def _echo_monitor(self) -> Any:
        if self._monitor is None:
            from ragen_trainer.monitor import EchoTrapMonitor

            self._monitor = EchoTrapMonitor()
        return self._monitor

    def _metrics_logger(self) -> Any:
        if self._logger is None:
            from ragen_trainer.monitor import MetricsLogger

            reps = self.cfg.report_to
            self._logger = MetricsLogger(self.cfg.output_dir, tensorboard="tensorboard" in reps,
                                         wandb="wandb" in reps, console="console" in reps,
                                         run_name=Path(self.cfg.output_dir).name, config=self.cfg.to_dict(),
                                         total_steps=self.cfg.total_steps)
        return self._logger

    # ------------------------------------------------------------------------------------------ checkpoints
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Save the policy in Hugging Face format (``from_pretrained`` loads it), with what it needs at generation time
        (:mod:`ragen_trainer.model_card`: the chat template pre-writing the protocol's generation prefix, a response
        template, ``generation_config.json`` with the validation decoding and the protocol, ``README.md``).

        A ``checkpoint-N`` also gets what resuming needs: the critic (``critic.safetensors``), the Echo Trap monitor's
        history and ``training_args.bin`` (the optimizer, scheduler and RNG come from ``_save_checkpoint_atomic``).
        ``final/`` is for serving and holds none of it: the critic only ever scores training rollouts, and the last
        ``checkpoint-N`` (written at the last step whenever ``save_steps`` > 0) keeps it for resuming.
        """
        from ragen_trainer.model_card import serving_settings, serving_tokenizer, write_serving_files
        from ragen_trainer.models import base_model_name, write_checkpoint_marker

        output_dir = output_dir or self.args.output_dir
        unwrapped = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        if state_dict is None:
            state_dict = unwrapped.state_dict()
        policy_state, critic_state = split_state_dict(state_dict)
        if not self.args.should_save:
            return
        final = self._saving_final
        os.makedirs(output_dir, exist_ok=True)
        unwrapped.save_pretrained(output_dir, state_dict=policy_state, is_main_process=True)
        if critic_state and not final:
            save_critic(critic_state, output_dir)
        serving = serving_settings(self.cfg)
        if self.processing_class is not None:
            with serving_tokenizer(self.processing_class, serving):  # the live tokenizer keeps its plain template
                self.processing_class.save_pretrained(output_dir)
        if not final:
            torch.save(self.args, os.path.join(output_dir, "training_args.bin"))
            # The Echo Trap monitor judges trends (a std cliff against its recent peak): a resumed run needs its history.
            atomic_write_json(os.path.join(output_dir, MONITOR_FILE), _finite(self._echo_monitor().state_dict()),
                              indent=None)
        self.cfg.save(os.path.join(output_dir, "ragen_config.yaml"))
        step = self.state.global_step // self.n_updates
        base_model = base_model_name(self.cfg.model)
        write_serving_files(output_dir, model=unwrapped, tokenizer=self.processing_class, config=self.cfg,
                            settings=serving, base_model=base_model, step=step,
                            kind="final" if final else "checkpoint", validation=_finite(self.val_history))
        write_checkpoint_marker(output_dir, {
            "step": step,
            "optimizer_steps": self.state.global_step,
            "kind": "final" if final else "checkpoint",
            "env_id": self.cfg.env_id,
            "model": self.cfg.model,
            "base_model": base_model,
            "critic": self.cfg.critic if critic_state and not final else None,
            "protocol": dict(self.cfg.protocol),  # the turn protocol it was trained under, generation prefix included
            "serving": serving.to_dict(),  # what the saved chat template / generation_config.json carry
            "config": self.cfg.to_dict(),
        })

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """``checkpoint-N`` written whole or not at all: everything goes to ``.saving-checkpoint-N``, is flushed to
        disk and verified, then renamed into place (a rename is atomic). SIGINT / SIGTERM wait for the save to
        finish (a second Ctrl-C does not break it); the run stops right after it."""
        with self._signals_held():
            self._save_checkpoint_atomic()

    def _save_checkpoint_atomic(self) -> None:
        from ragen_trainer.models import STAGING_PREFIX, checkpoint_problems

        self.store_flos()
        run_dir = self.args.output_dir
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        final = os.path.join(run_dir, name)
        staging = os.path.join(run_dir, STAGING_PREFIX + name)
        main = self.args.should_save
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        try:
            self.save_model(staging, _internal_call=True)
            if not self.args.save_only_model:
                self._save_optimizer_and_scheduler(staging)
                self._save_scaler(staging)
                self._save_rng_state(staging)
            if main:
                for cb in [c for c in self.callback_handler.callbacks + [self.control]
                           if isinstance(c, ExportableState)]:
                    cb_name, cb_state = cb.__class__.__name__, cb.state()
                    if isinstance(self.state.stateful_callbacks.get(cb_name), list):
                        self.state.stateful_callbacks[cb_name].append(cb_state)
                    else:
                        self.state.stateful_callbacks[cb_name] = cb_state
                self.state.save_to_json(os.path.join(staging, "trainer_state.json"))
            self.accelerator.wait_for_everyone()
            if main:
                _fsync_tree(staging)
                problems = checkpoint_problems(staging)
                if problems:
                    raise OSError(f"the checkpoint written to {staging} does not verify: {'; '.join(problems)}")
                _replace_folder(staging, final)
        except BaseException:
            if main:  # nothing half-written stays behind (a kill -9 leaves .saving-*, removed by the next run)
                shutil.rmtree(staging, ignore_errors=True)
            raise
        self.accelerator.wait_for_everyone()
        if main:
            rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)

    def _save_final(self, final_dir: str) -> None:
        """The trained policy to ``final/``, like a checkpoint: written aside, then renamed into place. It is the
        folder to serve (see :meth:`_save`): weights, tokenizer, generation settings and model card, and no optimizer,
        scheduler, critic or trainer state."""
        from ragen_trainer.models import STAGING_PREFIX

        staging = os.path.join(os.path.dirname(final_dir) or ".", STAGING_PREFIX + os.path.basename(final_dir))
        main = self.args.should_save
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        try:
            self._saving_final = True  # _save writes a serving folder: no critic, no training state
            try:
                self.save_model(staging)
            finally:
                self._saving_final = False
            self.accelerator.wait_for_everyone()
            if main:
                _fsync_tree(staging)
                _replace_folder(staging, final_dir)
        except BaseException:
            if main:
                shutil.rmtree(staging, ignore_errors=True)
            raise
        self.accelerator.wait_for_everyone()

    @contextlib.contextmanager
    def _signals_held(self, *, stop_after: bool = True) -> Any:
        """Hold SIGINT and SIGTERM back while the body runs (a save): each one received prints that the save is
        finishing; with ``stop_after``, ``KeyboardInterrupt`` is raised once the body is done, so the run stops as
        the signal asked. Nested uses share the outermost one."""
        if self._defer_depth > 0 or threading.current_thread() is not threading.main_thread():
            self._defer_depth += 1
            try:
                yield
            finally:
                self._defer_depth -= 1
            return

        def hold(signum: int, frame: Any) -> None:
            self._deferred_signals.append(signum)
            name = signal.Signals(signum).name
            print(f"\n{name} received while a checkpoint is being saved: waiting for the save to "
                  "finish, then stopping (a kill -9 now would lose only this save, not the earlier checkpoints)",
                  file=sys.stderr, flush=True)

        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                previous[sig] = signal.signal(sig, hold)
            except (ValueError, OSError):  # pragma: no cover - not settable here
                pass
        self._defer_depth += 1
        try:
            yield
        finally:
            self._defer_depth -= 1
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        received, self._deferred_signals = self._deferred_signals, []
        if stop_after and received:
            raise KeyboardInterrupt(f"signal {received[0]} during a checkpoint save")

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        load_critic(self.accelerator.unwrap_model(model if model is not None else self.model), resume_from_checkpoint)
        monitor_state = Path(resume_from_checkpoint) / MONITOR_FILE
        if monitor_state.is_file():
            self._echo_monitor().load_state_dict(json.loads(monitor_state.read_text(encoding="utf-8")))

    # ------------------------------------------------------------------------------------------ the output folder
    def _prepare_output_dir(self, resume_from_checkpoint: str | bool | None, *, force_resume: bool,
                            overwrite: bool) -> tuple[str | None, dict[str, list[str]]]:
        """Check the output folder against the config, clean it, and choose the checkpoint to resume from.

        Every process checks (so all raise alike); the main process removes an old run (``--overwrite``), leftovers
        of saves that never finished, and renames checkpoints that fail verification to ``broken-checkpoint-N``
        (with a warning naming each and why), then cuts ``metrics.jsonl`` back to the resumed step. Returns the
        checkpoint (or ``None``) and the skipped ones with their problems.
        """
        from ragen_trainer.models import BROKEN_PREFIX, checkpoint_problems, newest_good_checkpoint, unfinished_saves
        from ragen_trainer.monitor import truncate_metrics

        cfg = self.cfg
        out_dir = Path(cfg.output_dir)
        explicit = resume_from_checkpoint if isinstance(resume_from_checkpoint, (str, os.PathLike)) else None
        if explicit is not None:
            problems = checkpoint_problems(explicit)
            if problems:
                raise ValueError(f"invalid argument resume_from_checkpoint={str(explicit)!r}: the checkpoint is not "
                                 f"whole: {'; '.join(problems)}")
            plan = FolderPlan("continue")
        elif resume_from_checkpoint is False:
            plan = check_output_folder(cfg, overwrite=True)
        else:
            plan = check_output_folder(cfg, force_resume=force_resume, overwrite=overwrite)
        main = self.accelerator.is_main_process
        skipped: dict[str, list[str]] = {}
        if main:
            out_dir.mkdir(parents=True, exist_ok=True)
            if plan.action == "overwrite":
                old = run_files(out_dir)
                for path in old:
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
                logger.warning("starting over in %s: removed the previous run's %s", out_dir,
                               ", ".join(p.name for p in old) or "files")
            for folder in unfinished_saves(out_dir):
                logger.warning("warning: removing %s, a checkpoint save that never finished (the run was killed while "
                               "saving it)", folder)
                shutil.rmtree(folder, ignore_errors=True)
            if plan.differences:
                logger.warning("warning: continuing the run in %s with a changed config (--resume): %s", out_dir,
                               ", ".join(f"{n} {o!r} -> {v!r}" for n, o, v in plan.differences))
            if explicit is None and plan.action == "continue":
                good, bad = newest_good_checkpoint(out_dir)
                for folder, problems in bad:
                    skipped[folder.name] = problems
                    target = _free_name(folder.parent / (BROKEN_PREFIX + folder.name))
                    os.replace(folder, target)
                    logger.warning("warning: checkpoint %s is not whole (%s): skipped, renamed to %s", folder,
                                   "; ".join(problems), target.name)
                if bad:
                    logger.warning("warning: resuming from %s instead", good if good is not None else
                                   "the initial model (no whole checkpoint left)")
            cfg.save(out_dir / "config.yaml")
        self.accelerator.wait_for_everyone()
        if explicit is not None:
            checkpoint: str | None = str(explicit)
        elif plan.action == "continue":
            good, _ = newest_good_checkpoint(out_dir)
            checkpoint = str(good) if good is not None else None
        else:
            checkpoint = None
        if main:
            resumed_step = _checkpoint_step(checkpoint, self.n_updates) if checkpoint else 0
            dropped = truncate_metrics(out_dir / "metrics.jsonl", resumed_step)
            if dropped:
                logger.info("metrics.jsonl: dropped %d line(s) after step %d (they are trained again)", dropped,
                            resumed_step)
        self.accelerator.wait_for_everyone()
        return checkpoint, skipped

    # ------------------------------------------------------------------------------------------ train
    def train(  # type: ignore[override]
        self, resume_from_checkpoint: str | bool | None = None, *, force_resume: bool = False,
        overwrite: bool = False, **kwargs: Any,
    ) -> TrainResult:
        """Train; Ctrl-C (or SIGTERM) saves a checkpoint first and returns with ``interrupted=True``.

        What happens with ``output_dir`` (see :func:`ragen_trainer.config.check_output_folder`): a run there whose
        config matches is continued from its newest checkpoint that verifies (newer broken ones are skipped with a
        warning); a changed config raises :class:`~ragen_trainer.config.RunConflictError` unless ``force_resume``
        (continue with the new config) or ``overwrite`` (delete the old run, start over; also what
        ``config.resume=False`` and ``resume_from_checkpoint=False`` mean). ``resume_from_checkpoint`` may also name
        a checkpoint folder, which must verify. Returns a :class:`TrainResult`; ``summary.json`` holds the same.
        """
        cfg = self.cfg
        out_dir = Path(cfg.output_dir)
        if resume_from_checkpoint is True:
            resume_from_checkpoint = None
        resume_from_checkpoint, skipped = self._prepare_output_dir(resume_from_checkpoint, force_resume=force_resume,
                                                                   overwrite=overwrite)

        # SIGTERM (a scheduler's stop) is handled like Ctrl-C: save, then exit cleanly.
        previous = None
        try:
            previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        except ValueError:  # not the main thread
            previous = None
        interrupted = False
        checkpoint = None
        final_dir = None
        final_metrics: dict[str, float] = {}
        t0 = time.perf_counter()
        try:
            try:
                super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
                if cfg.val_every:
                    final_metrics = self.validate(self.state.global_step // self.n_updates)
                with self._signals_held(stop_after=False):  # the run is complete: a signal now only waits
                    final_dir = str(out_dir / "final")
                    self._save_final(final_dir)
            except KeyboardInterrupt:
                interrupted, final_dir, final_metrics = True, None, {}
                with self._signals_held(stop_after=False):  # a second Ctrl-C waits for this save
                    checkpoint = self._save_interrupted()
            if not interrupted:
                checkpoint = self._last_checkpoint()
            result = TrainResult(
                global_step=self.state.global_step // self.n_updates,
                interrupted=interrupted,
                checkpoint=checkpoint,
                final_model=final_dir,
                metrics=final_metrics,
                history=self.history,
                resumed_from=resume_from_checkpoint,
                skipped_checkpoints=skipped,
            )
            if self.accelerator.is_main_process:
                with self._signals_held(stop_after=False):
                    self._write_summary(result, time.perf_counter() - t0)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        return result

    def _write_summary(self, result: TrainResult, seconds: float) -> None:
        cfg = self.cfg
        summary = {
            "env_id": cfg.env_id,
            "model": cfg.model,
            "steps": result.global_step,
            "interrupted": result.interrupted,
            "checkpoint": result.checkpoint,
            "final_model": result.final_model,
            "resumed_from": result.resumed_from,
            "skipped_checkpoints": result.skipped_checkpoints,
            "wall_seconds": round(seconds, 2),
            "final_validation": result.metrics,
            "validation": self.val_history,
            "last_metrics": self.history[-1] if self.history else {},
        }
        atomic_write_json(Path(cfg.output_dir) / "summary.json", _finite(summary), indent=2, default=float)
        if self._logger is not None:
            self._logger.close()

    def _last_checkpoint(self) -> str | None:
        from ragen_trainer.models import list_checkpoints

        found = list_checkpoints(self.cfg.output_dir)
        return str(found[-1][1]) if found else None

    def _save_interrupted(self) -> str | None:
        """Save a full checkpoint (weights, optimizer, scheduler, RNG, trainer state) at the last finished step."""
        from ragen_trainer.models import checkpoint_problems

        if self.optimizer is None or self.state.global_step == 0:  # no step finished: the weights are the initial ones
            return None
        step = self.state.global_step // self.n_updates
        if step > self._last_logged_step and self._pending:  # the finished step's metrics, before they are lost
            self._emit(step, {"step": float(step), **self._pending})
        self._buffer = None
        folder = os.path.join(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if os.path.isdir(folder) and not checkpoint_problems(folder):  # the signal came during this step's save
            return folder
        self._save_checkpoint(self.model, trial=None)
        return folder


class _PolicyView:
    """The policy without its critic, for engines that copy weights (vLLM): ``state_dict`` and ``parameters`` skip
    the ``ragen_critic.`` entries, everything else is the model's."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {k: v for k, v in self._model.state_dict(*args, **kwargs).items() if CRITIC_ATTR not in k}

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:
        return ((n, p) for n, p in self._model.named_parameters(*args, **kwargs) if CRITIC_ATTR not in n)

    def parameters(self, *args: Any, **kwargs: Any) -> Any:
        return (p for _, p in self.named_parameters(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _fsync_tree(folder: str) -> None:
    """Flush every file under ``folder`` and the folders themselves to disk (before the rename that publishes it)."""
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(root)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _replace_folder(staging: str, final: str) -> None:
    """Put the finished folder ``staging`` at ``final``: one rename; an existing ``final`` (the same step saved
    again) is moved aside first and removed after."""
    from ragen_trainer.models import STAGING_PREFIX

    parent = os.path.dirname(final) or "."
    old = None
    if os.path.exists(final):
        old = os.path.join(parent, ".replaced-" + os.path.basename(final))
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(staging, final)
    _fsync_dir(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    assert not os.path.basename(final).startswith(STAGING_PREFIX)


def _free_name(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``, ... : the first that does not exist."""
    candidate, n = path, 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def _checkpoint_step(folder: str, updates: int) -> int:
    """The training step a checkpoint holds (its marker's ``step``; else the optimizer step in its name)."""
    from ragen_trainer.models import CHECKPOINT_PATTERN, read_checkpoint_info

    step = read_checkpoint_info(folder).get("step")
    if isinstance(step, int):
        return step
    match = CHECKPOINT_PATTERN.match(Path(folder).name)
    return int(match.group(1)) // max(updates, 1) if match else 0


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        return _finite(value.item())
    return value


def step_seeds(config: StarPOConfig, step: int) -> list[int]:
    """The env seeds (initial states) of training step ``step``: the same on every process and on resume."""
    return [TRAIN_SEED_STRIDE * config.seed + step * config.env_groups + g for g in range(config.env_groups)]


__all__ = [
    "StarPOTrainer",
    "TrainResult",
    "build_training_arguments",
    "micro_batch_count",
    "mini_batch_count",
    "step_seeds",
    "updates_per_step",
]
