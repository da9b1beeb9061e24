"""StarPO / StarPO-S (RAGEN, arXiv 2504.20073): one training loop, driven by ``accelerate``.

One training step (the paper's Algorithm 1; StarPO-S's parts switched by the config) reads top to bottom in
:meth:`StarPOTrainer.train_step`:

1. **Rollout** -- P initial states (env seeds) x N rollouts each, multi-turn, with the current policy
   (:func:`ragen_trainer.rollout.collect_rollouts`). With several processes each rolls out its share of the groups and
   the trajectories are gathered, so every process holds the same batch.
2. **Filter** (StarPO-S, Sec. 4.1) -- keep the top ``filter_ratio`` of groups by in-group reward std
   (:mod:`ragen_trainer.filtering`). Dropped groups cost no forward and no backward pass.
3. **Score** -- one no-grad forward over the kept trajectories for the old log-probs (the policy that generated the
   rollouts), the reference log-probs (when a KL is set) and the critic's values.
4. **Advantages** -- GAE, GRPO or bi-level GAE (:func:`ragen_trainer.update.compute_advantages`).
5. **Update** -- PPO as the reference runs it (verl's ``dp_actor.update_policy``): ``ppo_epochs`` passes over the kept
   batch, split in order into mini-batches of ``ppo_mini_batch_size``; each mini-batch is one optimizer step against
   the step-3 log-probs (from the second update on the ratio moves and clipping engages). A mini-batch runs as
   micro-batches whose losses are normalised by the whole mini-batch's count, so their gradients add up to the
   mini-batch's; the policy's and the critic's gradients are clipped each by its own norm.

Every count is taken from the batch in hand: ``optim/updates = ppo_epochs * ceil(kept / ppo_mini_batch_size)``, also
when a step keeps more trajectories than ``env_groups x group_size / filter`` suggests (self-play trains both seats).

What comes from where: ``accelerate`` runs the processes (DDP; DeepSpeed ZeRO through its plugin, see
:mod:`ragen_trainer.distributed`), the float16 gradient scaler and the collectives; ``transformers`` gives the model, the learning-rate schedules
and ``save_pretrained``; TRL's ``unwrap_model_for_generation`` gathers ZeRO-3 weights for generation. The loop, the
update's math, the checkpoints (whole or absent, SIGINT-safe, verified on resume) and the logs are ragen's.

Multi-process rules: every collective (gathering trajectories and scores, reducing metrics) is called on every process
in the same order; only the main process writes files; every process runs the same number of forward passes per
update (a process with nothing to train gets a zero-weight micro-batch, so DDP's all-reduce and ZeRO-3's gathers meet).
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
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from tqdm.auto import tqdm
from transformers import get_scheduler, set_seed
from trl.models.utils import prepare_deepspeed, unwrap_model_for_generation

from ragen_trainer.checkpoints.folders import RunFolder, plan_run_folder
from ragen_trainer.checkpoints.layout import (
    MONITOR_FILE,
    OPTIMIZER_FILE,
    SCHEDULER_FILE,
    checkpoint_step,
    newest_checkpoint,
    staging_path,
    write_checkpoint_marker,
)
from ragen_trainer.checkpoints.publish import (
    CheckpointSaveError,
    SignalGuard,
    disk_full_message,
    folder_size,
    is_disk_full,
    publish_folder,
    rotate_checkpoints,
)
from ragen_trainer.checkpoints.rng import set_rng_state
from ragen_trainer.checkpoints.state import (
    load_policy_weights,
    load_state_into,
    read_training_state,
    write_rng_state,
    write_training_state,
)
from ragen_trainer.checkpoints.verify import checkpoint_problems
from ragen_trainer.config import StarPOConfig
from ragen_trainer.critic import (
    CRITIC_ATTR,
    PolicyWithCritic,
    attach_critic,
    load_critic,
    policy_copy,
    save_critic,
    split_state_dict,
)
from ragen_trainer.distributed import (
    full_state_dict,
    is_deepspeed,
    load_engine_state,
    make_accelerator,
    save_engine_state,
    zero_stage,
)
from ragen_trainer.engines.base import SamplingParams
from ragen_trainer.engines.factory import make_training_engine, training_engine_choice
from ragen_trainer.fileio import atomic_write_json
from ragen_trainer.filtering import filter_groups
from ragen_trainer.host_memory import peak_rss_bytes, return_freed_memory
from ragen_trainer.model_card import serving_settings, serving_tokenizer, write_serving_files
from ragen_trainer.models import base_model_name, enable_activation_checkpointing, quiet_progress_bars
from ragen_trainer.monitor import EchoTrapMonitor, MetricsLogger, rollout_metrics, truncate_metrics
from ragen_trainer.optimizer import GroupClippedAdamW
from ragen_trainer.packing import PackedBatch, pack, use_packed_attention
from ragen_trainer.precision import Precision, emulated_bf16_advice
from ragen_trainer.rollout import collect_rollouts
from ragen_trainer.selfplay import OpponentPool, selfplay_metrics
from ragen_trainer.trajectory import RolloutBatch, Trajectory
from ragen_trainer.update import (
    TrainingBatch,
    UpdateStats,
    action_mask,
    compute_advantages,
    micro_batches,
    ppo_loss,
    token_logprobs,
    token_values,
    update_count,
)

#: Validation initial states come from their own seed range, never drawn for training.
VAL_SEED_BASE = 1_000_000_000
#: Training seeds of step s are ``TRAIN_SEED_STRIDE * seed + s * env_groups + g``.
TRAIN_SEED_STRIDE = 10_000_019
#: The metric each optimizer group's gradient norm (before clipping) is logged under.
GRAD_NORM_KEYS = {"policy": "optim/grad_norm", "critic": "critic/grad_norm"}
#: A phase (the update) that took longer than this (seconds) in the previous step, or has not been timed yet in this
#: run, is announced with a line before it starts: a CPU run's first update can take minutes without a row.
LONG_PHASE_S = 10.0

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
    finished_before: bool = False
    """The run in ``output_dir`` had already finished all ``total_steps``: nothing was trained or rewritten."""


class TrainerCallback:
    """Hooks into a :class:`StarPOTrainer` run; override the ones you need (all are no-ops)."""

    def on_train_begin(self, trainer: StarPOTrainer, step: int) -> None:
        """Before the first step of this run (``step``: the step it starts at, > 0 after a resume)."""

    def on_update_end(self, trainer: StarPOTrainer, step: int, update: int) -> None:
        """After optimizer step ``update`` (0-based, within training step ``step``)."""

    def on_step_end(self, trainer: StarPOTrainer, step: int, metrics: dict[str, float]) -> None:
        """After training step ``step`` (1-based: the number of finished steps) and its logging and saving."""


def console_line(text: str) -> None:
    """One line on stderr (where the step table goes) that does not collide with a live tqdm bar."""
    with tqdm.external_write_mode(file=sys.stderr):
        print(text, file=sys.stderr, flush=True)


def step_seeds(config: StarPOConfig, step: int) -> list[int]:
    """The env seeds (initial states) of training step ``step``: the same on every process and on resume."""
    return [TRAIN_SEED_STRIDE * config.seed + step * config.env_groups + g for g in range(config.env_groups)]


class StarPOTrainer:
    """StarPO / StarPO-S trainer (see the module docstring for the step).

    Args:
        config: the run's :class:`~ragen_trainer.config.StarPOConfig` (validated here).
        model: the policy, a ``transformers`` causal LM, in ``config.master_dtype`` (a critic is attached to it when
            the config asks for one).
        tokenizer: its tokenizer, with a chat template.
        engine: the generation engine for rollouts; default an :class:`~ragen_trainer.engines.hf.HFEngine` on the
            policy itself (on-policy by construction). Other engines (vLLM) get the new weights through
            ``engine.update_weights(policy)`` before every rollout.
        ref_model: the frozen reference policy for the KL terms; default a copy of ``model`` made before training.
        callbacks: :class:`TrainerCallback` objects.

    Subclasses change one part of the step by overriding its hook: :meth:`rollout`, :meth:`filter`, :meth:`score`,
    :meth:`compute_advantages`, :meth:`compute_loss`.
    """

    def __init__(
        self,
        config: StarPOConfig,
        model: Any,
        tokenizer: Any,
        *,
        engine: Any = None,
        ref_model: Any = None,
        callbacks: list[TrainerCallback] | None = None,
        accelerator: Accelerator | None = None,
    ) -> None:
        self.cfg = cfg = config.validate()
        # The run's protocol, resolved once (the env id's reference values, then the config's): this object travels
        # to every env the run makes (self.env_kwargs). Its fields are recorded in config.yaml and every checkpoint.
        self.protocol = cfg.protocol_settings()
        self.env_kwargs = cfg.env_make_kwargs(self.protocol)
        # Validation splits (the paper validated every split during training): resolved from the protocol *changes*,
        # before they are replaced by the training env's whole resolved protocol below.
        self.val_splits: dict[str, tuple[str, dict[str, Any]]] = {
            name: (env_id, kwargs) for name, env_id, kwargs in map(cfg.validation_split, cfg.val_envs)}
        cfg.protocol = self.protocol.to_dict()
        if getattr(tokenizer, "pad_token_id", None) is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer
        self.callbacks = list(callbacks or [])
        set_seed(cfg.seed)

        self.accelerator = accelerator or make_accelerator(cfg)
        self.precision = Precision.from_config(cfg, self.accelerator.device)
        advice = emulated_bf16_advice(self.precision.compute, self.accelerator.device)
        if advice:
            logger.warning(advice)
        self.deepspeed = is_deepspeed(self.accelerator)

        # The reference policy is copied before a critic is attached (the copy must not carry one).
        if (cfg.kl_coef > 0 or cfg.kl_reward_coef > 0) and ref_model is None:
            ref_model = policy_copy(model)
        if cfg.use_critic:
            attach_critic(model, cfg.critic)
        use_packed_attention(model)  # packed micro-batches: no padding, each group's prefix once (ragen_trainer.packing)
        if cfg.gradient_checkpointing:  # verl's default: the same gradients in a fraction of the activations' memory
            enable_activation_checkpointing(model)
        model.train()
        if cfg.release_freed_memory:
            return_freed_memory()

        self.adamw = self._make_optimizer(model)
        # The schedule advances once per training step, as verl's actor_lr_scheduler (warm-up in training steps).
        self.scheduler = get_scheduler(cfg.lr_scheduler_type, self.adamw, num_warmup_steps=cfg.warmup_steps,
                                       num_training_steps=cfg.total_steps)
        self.model, self.optimizer = self.accelerator.prepare(model, self.adamw)
        self.adamw.partitioned = self.deepspeed  # ZeRO hands the optimizer this process's partition of each group

        self.ref_model = None
        if ref_model is not None:
            ref_model.eval().requires_grad_(False)
            ref_model = ref_model.to(device=self.accelerator.device, dtype=self.precision.compute)
            use_packed_attention(ref_model)
            # Under ZeRO-3 the frozen reference is sharded too (TRL's helper wraps it in an inference engine).
            self.ref_model = prepare_deepspeed(ref_model, self.accelerator) if self._zero3 else ref_model

        if engine is None:
            engine = make_training_engine(cfg, self.policy, tokenizer)
            if self.is_main_process:
                name, why = training_engine_choice(cfg, self.policy)
                console_line(f"generation engine: {name} ({why})")
        self.engine = engine

        self.history: list[dict[str, float]] = []
        self.val_history: list[dict[str, float]] = []
        self.monitor = EchoTrapMonitor()
        self.global_step = 0  # finished training steps
        self.optimizer_steps = 0
        self._logger: MetricsLogger | None = None
        self._opponents: OpponentPool | None = None
        self._unlogged: dict[str, float] = {}  # metrics of steps between two logged ones
        self._signals = SignalGuard()

    # ------------------------------------------------------------------------------------------------- properties
    @property
    def policy(self) -> Any:
        """The policy model itself (the module the engine generates with; unwrapped from DDP)."""
        return self.accelerator.unwrap_model(self.model)

    @property
    def _zero3(self) -> bool:
        return zero_stage(self.accelerator) == 3

    @property
    def is_main_process(self) -> bool:
        return self.accelerator.is_main_process

    def _make_optimizer(self, model: Any) -> GroupClippedAdamW:
        """AdamW with two parameter groups, each clipped by its own gradient norm: the policy at ``actor_lr``, the
        critic at ``critic_lr`` (the reference's two optimizers, with the same betas and epsilon)."""
        cfg = self.cfg
        actor = [p for n, p in model.named_parameters() if p.requires_grad and CRITIC_ATTR not in n]
        critic = [p for n, p in model.named_parameters() if p.requires_grad and CRITIC_ATTR in n]
        groups = [{"params": actor, "lr": cfg.actor_lr, "weight_decay": cfg.weight_decay,
                   "max_grad_norm": cfg.max_grad_norm, "name": "policy"}]
        if critic:
            groups.append({"params": critic, "lr": cfg.critic_lr, "weight_decay": cfg.weight_decay,
                           "max_grad_norm": cfg.critic_max_grad_norm, "name": "critic"})
        device = next(model.parameters()).device
        # torch's fused AdamW (one kernel for all tensors of a group), except on DeepSpeed's flat partitions
        fused = device.type in ("cpu", "cuda") and not self.deepspeed
        return GroupClippedAdamW(groups, betas=(0.9, 0.999), eps=1e-8, fused=fused)

    # ------------------------------------------------------------------------------------------------- the run
    def train(self, resume_from_checkpoint: str | bool | None = None, *, force_resume: bool = False,
              overwrite: bool = False) -> TrainResult:
        """Train ``total_steps`` steps; Ctrl-C (or SIGTERM) saves a checkpoint first and returns ``interrupted``.

        What happens with ``output_dir`` (:func:`ragen_trainer.checkpoints.folders.check_output_folder`): a run there whose config
        matches is continued from its newest checkpoint that verifies (newer broken ones are skipped with a warning);
        a changed config raises :class:`~ragen_trainer.checkpoints.folders.RunConflictError` unless ``force_resume`` (continue with
        the new config) or ``overwrite`` (delete the old run and start over; also what ``config.resume=False`` and
        ``resume_from_checkpoint=False`` mean). A run that already finished all its steps is left as it is.
        ``resume_from_checkpoint`` may name a checkpoint folder, which must verify. ``summary.json`` holds the result.
        """
        cfg = self.cfg
        explicit = os.fspath(resume_from_checkpoint) if isinstance(resume_from_checkpoint, (str, os.PathLike)) \
            else None  # fmt: skip
        folder = plan_run_folder(cfg, explicit=explicit, main=self.is_main_process, force_resume=force_resume,
                                 overwrite=overwrite or resume_from_checkpoint is False)
        self.accelerator.wait_for_everyone()
        finished = self._finished_run(folder)
        if finished is not None:
            return finished
        start = self._resume(folder.checkpoint) if folder.checkpoint else 0
        if self.is_main_process:  # the run's record, written once the resume has been checked and loaded
            cfg.save(Path(cfg.output_dir) / "config.yaml")
            dropped = truncate_metrics(Path(cfg.output_dir) / "metrics.jsonl", start)
            if dropped:
                logger.info("metrics.jsonl: dropped %d line(s) after step %d (they are trained again)", dropped, start)
        self.accelerator.wait_for_everyone()

        previous_sigterm = _catch_sigterm()
        interrupted, save_error, final_dir = False, None, None
        final_metrics: dict[str, float] = {}
        t0 = time.perf_counter()
        self._update_seconds = None  # not timed yet in this run: the first update is announced (train_step)
        try:
            # transformers' bars of a save or a reload would land inside the step table: a line of ours instead
            with quiet_progress_bars():
                for callback in self.callbacks:
                    callback.on_train_begin(self, start)
                for step in range(start, cfg.total_steps):
                    metrics = self.train_step(step)
                    self.global_step = step + 1
                    self._log(metrics)
                    if cfg.save_steps and (self.global_step % cfg.save_steps == 0
                                           or self.global_step == cfg.total_steps):
                        saved = self.save_checkpoint()
                        if self.is_main_process and "console" in cfg.report_to:
                            size = folder_size(saved)
                            console_line(f"saved {saved} ({size / 1e9:.1f} GB)" if size >= 1e8
                                         else f"saved {saved} ({size / 1e6:.1f} MB)")
                    for callback in self.callbacks:
                        callback.on_step_end(self, self.global_step, metrics)
                if cfg.val_every:
                    final_metrics = self.validate(self.global_step)
                with self._signals.hold(stop_after=False):  # the run is complete: a signal now only waits
                    final_dir = self.save_final(str(Path(cfg.output_dir) / "final"))
        except KeyboardInterrupt:
            interrupted, final_metrics = True, {}
            with self._signals.hold(stop_after=False):  # a second Ctrl-C waits for this save
                self._save_interrupted()
        except CheckpointSaveError as exc:
            save_error = str(exc)
        finally:
            _restore_sigterm(previous_sigterm)
        result = TrainResult(
            global_step=self.global_step,
            interrupted=interrupted,
            checkpoint=newest_checkpoint(cfg.output_dir),
            final_model=final_dir,
            metrics=final_metrics,
            history=self.history,
            resumed_from=folder.checkpoint,
            skipped_checkpoints=folder.skipped,
        )
        if self.is_main_process:
            with self._signals.hold(stop_after=False):
                self._write_summary(result, time.perf_counter() - t0, save_error)
        if save_error is not None:
            raise CheckpointSaveError(save_error)
        return result

    def train_step(self, step: int) -> dict[str, float]:
        """One StarPO step on the policy (``step``: finished steps so far); returns the step's metrics."""
        cfg = self.cfg
        metrics: dict[str, float] = {}
        timings: dict[str, float] = defaultdict(float)
        if cfg.val_every and step % cfg.val_every == 0:
            metrics.update(self.validate(step))

        # 1. Rollout: P initial states x N rollouts with the current policy.
        t0 = time.perf_counter()
        rolled = self.rollout(step)
        trajs = rolled.trajectories
        timings.update({f"time/{k}": v for k, v in rolled.timings.items()})
        timings["time/rollout"] = time.perf_counter() - t0
        metrics.update(self._rollout_metrics(trajs))
        metrics.update(rolled.metrics)

        # 2. StarPO-S filter: keep the groups with the most reward variance; the others are never scored or trained.
        kept, filter_stats = self.filter(trajs)
        metrics.update(filter_stats)

        # 3. Score: the old log-probs (the policy that made the rollouts) -- unless the step makes one update, whose
        #    own forward gives them exactly -- the reference log-probs (KL) and the critic's values (GAE).
        updates = update_count(len(kept), cfg.ppo_mini_batch_size, cfg.ppo_epochs)
        logprob_pass = cfg.old_logprob_pass == "always" or updates > 1 or cfg.kl_reward_coef > 0
        t0 = time.perf_counter()
        scores = self.score(kept, logprobs=logprob_pass)
        timings["time/scoring"] = time.perf_counter() - t0
        metrics["score/old_logprob_pass"] = float(logprob_pass)

        # 4. Advantages over the kept batch.
        batch, adv_metrics = self.compute_advantages(kept, scores)
        metrics.update(adv_metrics)

        # 5. PPO: ppo_epochs passes over the kept batch, one optimizer step per mini-batch.
        t0 = time.perf_counter()
        stats = UpdateStats()
        mini_batches = batch.mini_batches(cfg.ppo_mini_batch_size)
        bar = self._update_progress(step, len(kept), updates)
        try:
            for epoch in range(cfg.ppo_epochs):
                for index, members in enumerate(mini_batches):
                    self.update(batch, members, stats, timings)
                    if bar is not None:
                        bar.update(1)
                    for callback in self.callbacks:
                        callback.on_update_end(self, step, epoch * len(mini_batches) + index)
        finally:
            if bar is not None:
                bar.close()
        self.scheduler.step()
        timings["time/update"] = self._update_seconds = time.perf_counter() - t0
        metrics.update(stats.reduce(self.accelerator, updates))
        metrics["optim/updates"] = float(updates)
        metrics["optim/lr"] = float(self.optimizer.param_groups[0]["lr"])
        metrics["memory/peak_rss_gb"] = peak_rss_bytes() / 1e9
        metrics.update(timings)
        return metrics

    def _update_progress(self, step: int, trajectories: int, updates: int) -> Any:
        """Announce a long update (see :data:`LONG_PHASE_S`) with a line on the console and, when it makes several
        optimizer steps, a transient bar over them (returned; ``None`` otherwise). Main process, console only."""
        if not (self.is_main_process and "console" in self.cfg.report_to):
            return None
        last = getattr(self, "_update_seconds", None)  # the previous step's update (None: not timed in this run)
        if last is not None and last < LONG_PHASE_S:
            return None
        took = "" if last is None else f"; the last one took {last:.0f} s"
        console_line(f"step {step + 1}/{self.cfg.total_steps}: updating the policy on {trajectories} trajectories "
                     f"({updates} optimizer step{'s' if updates != 1 else ''}{took}) ...")
        if updates < 2:
            return None
        return tqdm(total=updates, desc=f"step {step + 1} update", unit="optimizer step", leave=False)

    # ------------------------------------------------------------------------------------------------- 1. rollout
    def rollout(self, step: int) -> RolloutBatch:
        """The step's trajectories (P x N; a self-play step: P x N per seat), with the rollout's timings and the
        collector's own metrics."""
        cfg = self.cfg
        return self._collect(step_seeds(cfg, step), cfg.group_size, cfg.temperature,
                             sampling_seed=cfg.seed * 7919 + step, selfplay=bool(cfg.opponent_pool), step=step)

    def _collect(self, seeds: list[int], group_size: int, temperature: float, *, sampling_seed: int, step: int,
                 selfplay: bool = False, env: tuple[str, dict[str, Any]] | None = None) -> RolloutBatch:
        """Roll out ``seeds`` x ``group_size``: this process's share of the groups, then gathered everywhere.
        ``selfplay``: games against the opponent pool (training steps of a self-play run; validation plays the
        single-agent view). ``env``: another env id and its make kwargs (a validation split) instead of the run's."""
        cfg = self.cfg
        env_id, env_kwargs = env if env is not None else (cfg.env_id, self.env_kwargs)
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        local = list(range(rank, len(seeds), world))
        params = SamplingParams(temperature=temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                                seed=(sampling_seed * 131 + rank) % (2**31))
        common = {"settings": cfg.rollout_settings(), "sampling": params, "env_kwargs": env_kwargs,
                  "progress": self.is_main_process}
        batch = RolloutBatch([])
        with self._generation_model() as unwrapped:
            self._sync_engine(unwrapped)  # every process takes part (ZeRO-3 gathers), even with no groups of its own
            if local:
                if selfplay:  # groups 2g + seat (ragen_trainer.selfplay)
                    batch = self._opponent_pool().play(self.engine, self.tokenizer, cfg.env_id, seeds, local,
                                                       group_size, step, unwrapped, **common)
                else:
                    batch = collect_rollouts(self.engine, self.tokenizer, env_id, [seeds[g] for g in local],
                                             group_size, **common)  # fmt: skip
                for t in batch.trajectories:  # local group index -> global group index
                    t.group_id = (2 * local[t.group_id // 2] + t.group_id % 2) if selfplay else local[t.group_id]
        if world > 1:
            batch.trajectories = gather_object(batch.trajectories)
            batch.trajectories.sort(key=lambda t: t.group_id)  # stable: rollouts keep their order inside a group
        return batch

    @contextlib.contextmanager
    def _generation_model(self) -> Iterator[Any]:
        """The policy to generate with: the unwrapped module, its ZeRO-3 shards gathered for the duration (TRL's
        ``unwrap_model_for_generation``). Engines generate in eval mode, where activation checkpointing is off."""
        if self._zero3:
            with unwrap_model_for_generation(self.model, self.accelerator) as unwrapped:
                yield unwrapped
        else:
            yield self.policy

    def _opponent_pool(self) -> OpponentPool:
        """The self-play run's opponent pool, made on first use."""
        if self._opponents is None:
            cfg = self.cfg
            self._opponents = OpponentPool(cfg.opponent_pool, snapshot_every=cfg.opponent_snapshot_every,
                                           size=cfg.opponent_pool_size, seed=cfg.seed, tokenizer=self.tokenizer,
                                           batch_size=cfg.generation_batch_size)  # fmt: skip
        return self._opponents

    def _sync_engine(self, unwrapped: Any) -> None:
        """Give the engine the current weights. An in-process engine (hf, vLLM colocate) gets them on every
        process; a vLLM *server* is shared, so only the main process pushes, and everyone waits for the push."""
        # What the engine says it can (GenerationEngine's capability attributes; an engine of the user's own that
        # does not subclass it gets the defaults: weights copied, one engine per process).
        by_reference = getattr(self.engine, "weights_by_reference", False)
        shared = getattr(self.engine, "shared_across_processes", False)
        if by_reference:
            self.engine.update_weights(unwrapped)
        elif not shared or self.is_main_process:
            self.engine.update_weights(PolicyView(unwrapped))
        if shared and self.accelerator.num_processes > 1:
            self.accelerator.wait_for_everyone()

    def _rollout_metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        metrics = {k: float(v) for k, v in rollout_metrics(RolloutBatch(trajs), self.tokenizer).items()
                   if isinstance(v, (int, float))}  # fmt: skip
        metrics.update(selfplay_metrics(trajs))  # per seat and opponent (empty unless self-play)
        return metrics

    # ------------------------------------------------------------------------------------------------- 2. filter
    def filter(self, trajs: list[Trajectory]) -> tuple[list[Trajectory], dict[str, float]]:
        """StarPO-S: the trajectories of the ``filter_ratio`` groups with the highest in-group reward std (``std``)
        or the lowest (``std_rev``), in batch order; and the filter's metrics."""
        cfg = self.cfg
        groups: dict[int, list[float]] = defaultdict(list)
        for t in trajs:
            groups[t.group_id].append(t.reward)
        result = filter_groups(groups, cfg.filter_ratio, cfg.filter_mode, cfg.filter_round)
        kept_ids = set(result.kept)
        kept = [t for t in trajs if t.group_id in kept_ids]
        if any(t.eval_only for t in kept):
            raise ValueError("the engine returned text-only (eval_only) trajectories; train with engine hf or vllm")
        stats = dict(result.stats)
        stats["filter/kept_ratio"] = len(result.kept) / max(len(groups), 1)
        stats["filter/kept_trajectories"] = float(len(kept))
        return kept, stats

    # ------------------------------------------------------------------------------------------------- 3. score
    @torch.no_grad()
    def score(self, kept: list[Trajectory], *, logprobs: bool = True) -> dict[str, list[list[float]]]:
        """Old log-probs (with ``logprobs``), reference log-probs and values of the kept trajectories (per action
        position), computed in the compute dtype as the update's forward, so the first update's ratio is exactly 1.
        Nothing to score (no log-probs asked, no reference model, no critic): no pass at all."""
        if not (logprobs or self.ref_model is not None or self.cfg.use_critic):
            return {}
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        size = self.cfg.micro_batch_size
        mine = [int(i) for i in np.array_split(np.arange(len(kept)), world)[rank]]  # contiguous: groups stay together
        passes = max(1, math.ceil(len(kept) / (world * size)))  # the same on every process (ZeRO-3 gathers meet)
        out: dict[int, dict[str, list[float]]] = {}
        policy = PolicyWithCritic(self.model)
        reference = PolicyWithCritic(self.ref_model) if self.ref_model is not None else None
        self.model.eval()
        try:
            for p in range(passes):
                chunk = mine[p * size:(p + 1) * size]
                rows = chunk or [0]  # a pass with nothing of ours still runs (its result is dropped)
                trajs = [kept[i] for i in rows]
                mask = action_mask(trajs, max(len(t.input_ids) for t in trajs) - 1)
                packed = pack(trajs, mask, share_prefixes=self.cfg.share_prefixes).to(self.accelerator.device)
                mask = mask.to(self.accelerator.device)
                with self.precision.autocast():
                    logp = values = None
                    if logprobs:
                        logp, _, values = token_logprobs(policy, packed, mask, temperature=self.cfg.temperature,
                                                         entropy=False, values=self.cfg.use_critic)
                    elif self.cfg.use_critic:
                        values = token_values(policy, packed, mask)
                    ref = None
                    if reference is not None:
                        ref, _, _ = token_logprobs(reference, packed, mask, temperature=self.cfg.temperature,
                                                   entropy=False, values=False)
                for row, i in enumerate(chunk):
                    n = len(kept[i].input_ids) - 1
                    out[i] = {}
                    if logp is not None:
                        out[i]["old_logprobs"] = logp[row, :n].float().cpu().tolist()
                    if ref is not None:
                        out[i]["ref_logprobs"] = ref[row, :n].float().cpu().tolist()
                    if values is not None:
                        out[i]["values"] = values[row, :n].float().cpu().tolist()
        finally:
            self.model.train()
        items = list(out.items())
        if world > 1:
            items = gather_object(items)
        merged = dict(items)
        keys = ("old_logprobs", "ref_logprobs", "values")
        return {k: [merged[i][k] for i in range(len(kept))] for k in keys if kept and k in merged[0]}

    # ------------------------------------------------------------------------------------------------- 4. advantages
    def compute_advantages(self, kept: list[Trajectory], scores: dict[str, list[list[float]]]
                           ) -> tuple[TrainingBatch, dict[str, float]]:
        """GAE / GRPO / bi-level GAE advantages of the kept batch (:func:`ragen_trainer.update.compute_advantages`)."""
        return compute_advantages(self.cfg, kept, scores)

    # ------------------------------------------------------------------------------------------------- 5. update
    def update(self, batch: TrainingBatch, members: list[int], stats: UpdateStats,
               timings: dict[str, float]) -> None:
        """One optimizer step on the mini-batch ``members``: its micro-batches' gradients accumulated (DDP syncs on
        the last), the policy and the critic clipped each by its own norm, then AdamW."""
        cfg = self.cfg
        micros = micro_batches(batch, members, micro_batch_size=cfg.micro_batch_size,
                               rank=self.accelerator.process_index, world=self.accelerator.num_processes,
                               agg_mode=cfg.loss_agg_mode, micro_size=cfg.loss_agg_micro_size,
                               share_prefixes=cfg.share_prefixes)
        for i, micro in enumerate(micros):
            last = i == len(micros) - 1
            t0 = time.perf_counter()
            with self._no_sync(not last):
                micro = {k: v.to(self.accelerator.device) if isinstance(v, (torch.Tensor, PackedBatch)) else v
                         for k, v in micro.items()}
                with self.precision.autocast():
                    loss, micro_stats = self.compute_loss(self.model, micro)
                self._backward(loss, last)
            stats.add(micro_stats)
            timings["time/forward_loss"] += time.perf_counter() - t0
        if not self.deepspeed:  # DeepSpeed's engine stepped in the last backward
            self.optimizer.step()  # clips the policy and the critic each by its own norm, then AdamW
            self.optimizer.zero_grad(set_to_none=True)
        stats.add({f"mean:{GRAD_NORM_KEYS[name]}": norm for name, norm in self.adamw.last_grad_norms.items()})
        self.optimizer_steps += 1

    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        """Accumulate a micro-batch's gradients. Under DeepSpeed the engine is told where the mini-batch ends (its
        last micro-batch reduces the gradients and steps), since ragen's mini-batches vary in size."""
        if self.deepspeed:
            self.model.set_gradient_accumulation_boundary(last)
            self.model.backward(loss)
            if last:
                self.model.step()
        else:
            self.accelerator.backward(loss)

    def compute_loss(self, model: Any, micro: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one micro-batch and its statistics (:func:`ragen_trainer.update.ppo_loss`)."""
        return ppo_loss(self.cfg, PolicyWithCritic(model), micro)

    def _no_sync(self, skip: bool) -> Any:
        """DDP's ``no_sync`` on every micro-batch but a mini-batch's last (the gradients are all-reduced once)."""
        return self.accelerator.no_sync(self.model) if skip and self.accelerator.num_processes > 1 \
            else contextlib.nullcontext()  # fmt: skip

    # ------------------------------------------------------------------------------------------------- validation
    def validate(self, step: int | None = None) -> dict[str, float]:
        """Success and reward on ``val_groups`` fixed initial states, one rollout each at ``val_temperature``: the
        training env as ``val/success``, ..., and each split of ``val_envs`` as ``val/<Name>/success``, ... (the
        paper validated every split during training)."""
        cfg = self.cfg
        step = self.global_step if step is None else step
        seeds = [VAL_SEED_BASE + i for i in range(cfg.val_groups)]
        t0 = time.perf_counter()
        out: dict[str, float] = {}
        for name, env in [("", None), *self.val_splits.items()]:
            trajs = self._collect(seeds, 1, cfg.val_temperature, sampling_seed=VAL_SEED_BASE + step, step=step,
                                  env=env).trajectories
            n = max(len(trajs), 1)
            prefix = f"val/{name}/" if name else "val/"
            out[prefix + "success"] = sum(bool(t.success) for t in trajs) / n
            out[prefix + "reward"] = sum(t.reward for t in trajs) / n
            out[prefix + "turns"] = sum(t.num_turns for t in trajs) / n
        out["time/validation"] = time.perf_counter() - t0
        self.val_history.append({"step": float(step), **out})
        return out

    # ------------------------------------------------------------------------------------------------- logging
    def _log(self, metrics: dict[str, float]) -> None:
        """Record a finished step's metrics (history on every process; files and console on the main one)."""
        step = self.global_step
        row = {"step": float(step), **metrics}
        self.history.append(row)
        if not self.is_main_process:
            return
        if step % self.cfg.logging_steps and step != self.cfg.total_steps:
            self._unlogged.update(row)  # e.g. a validation between two logged steps reaches the next row
            return
        row, self._unlogged = {**self._unlogged, **row}, {}
        warnings = self.monitor.update(step, row)
        if warnings:
            row["echo_trap/warnings"] = float(len(warnings))
        self.metrics_logger.log(step, row, warnings)

    @property
    def metrics_logger(self) -> MetricsLogger:
        if self._logger is None:
            reps = self.cfg.report_to
            self._logger = MetricsLogger(self.cfg.output_dir, tensorboard="tensorboard" in reps,
                                         wandb="wandb" in reps, console="console" in reps,
                                         run_name=Path(self.cfg.output_dir).name, config=self.cfg.to_dict(),
                                         total_steps=self.cfg.total_steps)
        return self._logger

    def _earlier_segments(self, result: TrainResult) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """A resumed run's earlier segments, as its ``summary.json`` holds them before this one replaces it (each
        ``{resumed_from, steps, wall_seconds, interrupted}``; a summary written before segments were kept counts as
        one), and that summary's ``last_metrics``: a segment stopped before its first step keeps the run's record
        instead of blanking it. Nothing for a run that starts from scratch, or without a readable summary."""
        if result.resumed_from is None:
            return [], {}
        try:
            earlier = json.loads((Path(self.cfg.output_dir) / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return [], {}
        if not isinstance(earlier, dict):
            return [], {}
        segments = earlier.get("segments")
        if not (isinstance(segments, list) and all(isinstance(s, dict) for s in segments)):
            segments = [{key: earlier.get(key) for key in ("resumed_from", "steps", "wall_seconds", "interrupted")}]
        last = earlier.get("last_metrics")
        return segments, last if isinstance(last, dict) else {}

    def _write_summary(self, result: TrainResult, seconds: float, save_error: str | None) -> None:
        cfg = self.cfg
        earlier, earlier_last = self._earlier_segments(result)
        segments = [*earlier, {"resumed_from": result.resumed_from, "steps": result.global_step,
                               "wall_seconds": round(seconds, 2), "interrupted": result.interrupted}]
        walls = [s.get("wall_seconds") for s in segments]
        summary = {
            "env_id": cfg.env_id,
            "model": cfg.model,
            "steps": result.global_step,
            "total_steps": cfg.total_steps,
            "interrupted": result.interrupted,
            "checkpoint": result.checkpoint,
            "final_model": result.final_model,
            "resumed_from": result.resumed_from,
            "skipped_checkpoints": result.skipped_checkpoints,
            "save_error": save_error,
            "wall_seconds": round(seconds, 2),
            "peak_rss_gb": round(peak_rss_bytes() / 1e9, 3),
            "final_validation": result.metrics,
            "validation": self.val_history,
            "last_metrics": self.history[-1] if self.history else earlier_last,
            # Every segment of a resumed run (the fields above describe the last one); the total where each is known.
            "segments": segments,
            "total_wall_seconds": round(sum(walls), 2) if all(isinstance(w, (int, float)) for w in walls) else None,
        }
        atomic_write_json(Path(cfg.output_dir) / "summary.json", _finite(summary), indent=2, default=float)
        if self._logger is not None:
            self._logger.close()

    # ------------------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> str:
        """``checkpoint-<step>``, written whole or not at all: everything goes to ``.saving-checkpoint-<step>``, is
        flushed to disk and verified, then renamed into place. SIGINT / SIGTERM wait for the save (a second Ctrl-C
        does not break it); the run stops right after it. A full disk raises :class:`CheckpointSaveError`, with the
        previous checkpoints kept."""
        final = os.path.join(self.cfg.output_dir, f"checkpoint-{self.global_step}")
        with self._signals.hold():
            self._write_folder(final, kind="checkpoint")
        if self.is_main_process:
            rotate_checkpoints(self.cfg.output_dir, self.cfg.save_total_limit)
        return final

    def save_final(self, final_dir: str) -> str:
        """The trained policy to ``final/``, written aside and renamed into place like a checkpoint: the folder to
        serve (weights, tokenizer, generation settings, model card), without optimizer, critic or trainer state."""
        self._write_folder(final_dir, kind="final")
        return final_dir

    def _write_folder(self, final: str, *, kind: str) -> None:
        staging = staging_path(final)
        main = self.is_main_process
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        try:
            self.save_model(staging, kind=kind)
            if kind == "checkpoint":
                self._save_training_state(staging)
            self.accelerator.wait_for_everyone()
            if main:
                if kind == "checkpoint":
                    problems = checkpoint_problems(staging)
                    if problems:
                        raise OSError(f"the checkpoint written to {staging} does not verify: {'; '.join(problems)}")
                publish_folder(staging, final)
        except BaseException as exc:
            needed = folder_size(staging) if main else None
            if main:  # nothing half-written stays behind (a kill -9 leaves .saving-*, removed by the next run)
                shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, Exception) and is_disk_full(exc):
                what = f"checkpoint-{self.global_step}" if kind == "checkpoint" else "the final model"
                raise CheckpointSaveError(disk_full_message(what, final, needed)) from exc
            raise
        self.accelerator.wait_for_everyone()

    def save_model(self, output_dir: str, *, kind: str = "checkpoint") -> None:
        """The policy in Hugging Face format (``from_pretrained`` loads it; the master weights, float32 by default),
        with what it needs at generation time (:mod:`ragen_trainer.model_card`: the chat template writing the
        protocol's generation prefix, ``generation_config.json``, a model card). A checkpoint adds the critic
        (``critic.safetensors``); ``final/`` is for serving and holds none of the training state."""
        state_dict = full_state_dict(self.accelerator, self.model)  # the master weights (a collective under ZeRO-3)
        if not self.is_main_process:
            return
        unwrapped = self.policy
        policy_state, critic_state = split_state_dict(state_dict)
        os.makedirs(output_dir, exist_ok=True)
        unwrapped.save_pretrained(output_dir, state_dict=policy_state, is_main_process=True)
        if critic_state and kind == "checkpoint":
            save_critic(critic_state, output_dir)
        serving = serving_settings(self.cfg)
        with serving_tokenizer(self.tokenizer, serving):  # the live tokenizer keeps its plain template
            self.tokenizer.save_pretrained(output_dir)
        self.cfg.save(os.path.join(output_dir, "ragen_config.yaml"))
        base_model = base_model_name(self.cfg.model)
        write_serving_files(output_dir, model=unwrapped, tokenizer=self.tokenizer, config=self.cfg, settings=serving,
                            base_model=base_model, step=self.global_step, kind=kind,
                            validation=_finite(self.val_history))
        write_checkpoint_marker(output_dir, {
            "step": self.global_step,
            "optimizer_steps": self.optimizer_steps,
            "kind": kind,
            "env_id": self.cfg.env_id,
            "model": self.cfg.model,
            "base_model": base_model,
            "critic": self.cfg.critic if critic_state and kind == "checkpoint" else None,
            "master_dtype": self.cfg.master_dtype,
            "protocol": dict(self.cfg.protocol),  # the turn protocol it was trained under, generation prefix included
            "serving": serving.to_dict(),  # what the saved chat template / generation_config.json carry
            "config": self.cfg.to_dict(),
        })

    def _save_training_state(self, folder: str) -> None:
        """What resuming needs besides the weights: the optimizer, the schedule, every process's RNG, the step and
        the histories (validation, Echo Trap monitor); written by :mod:`ragen_trainer.checkpoints.state`."""
        if self.deepspeed:  # the partitioned optimizer state, every process its own part
            save_engine_state(self.model, folder)
        if self.is_main_process:
            write_training_state(folder, trainer_state=_finite({
                "global_step": self.global_step,
                "optimizer_steps": self.optimizer_steps,
                "world_size": self.accelerator.num_processes,
                "deepspeed_stage": zero_stage(self.accelerator) if self.deepspeed else None,
                "val_history": self.val_history,
            }), monitor_state=_finite(self.monitor.state_dict()), scheduler_state=self.scheduler.state_dict(),
                optimizer_state=None if self.deepspeed else self.adamw.state_dict())
        self.accelerator.wait_for_everyone()
        write_rng_state(folder, self.accelerator.process_index if self.accelerator.num_processes > 1 else None)

    def _resume(self, checkpoint: str) -> int:
        """Load a checkpoint's weights, critic, optimizer, schedule, RNG and histories; returns its step."""
        self.load_checkpoint(checkpoint)
        logger.info("resuming from %s (step %d)", checkpoint, self.global_step)
        if self.is_main_process:  # on the console whatever the logging level: a resume must never be silent
            console_line(f"resuming {self.cfg.output_dir} from {Path(checkpoint).name} (step {self.global_step} of "
                         f"{self.cfg.total_steps})")
        return self.global_step

    def load_checkpoint(self, folder: str) -> None:
        """Load ``folder`` (a ``checkpoint-N`` that verifies) into this trainer."""
        saved_with_deepspeed = (Path(folder) / "latest").is_file()
        if saved_with_deepspeed != self.deepspeed:
            raise ValueError(f"the checkpoint {folder} was saved {'with' if saved_with_deepspeed else 'without'} "
                             f"DeepSpeed, and this run is {'with' if self.deepspeed else 'without'} it: its optimizer "
                             "state cannot be read; resume it as it was trained (or start a new run from its weights "
                             "with --model)")
        # Every file is read and checked before anything is loaded into the model: a refused file leaves it as it was.
        saved = read_training_state(folder, optimizer=not self.deepspeed, rank=self.accelerator.process_index,
                                    main=self.is_main_process)
        state = saved.trainer_state
        if self.deepspeed:  # DeepSpeed restores the module (master weights included) and its optimizer partitions
            load_engine_state(self.accelerator, self.model, folder, int(state.get("world_size") or 0))
        else:
            policy = self.policy
            load_policy_weights(policy, folder)
            load_critic(policy, folder)
            load_state_into(self.adamw, saved.optimizer, os.path.join(folder, OPTIMIZER_FILE))
        load_state_into(self.scheduler, saved.scheduler, os.path.join(folder, SCHEDULER_FILE))
        if saved.rng is not None:
            set_rng_state(*saved.rng)  # last: a refused file above leaves the generators as they were
        self.global_step = int(state.get("global_step", checkpoint_step(folder)))
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
        self.val_history = list(state.get("val_history", []))
        if saved.monitor is not None:
            try:
                self.monitor.load_state_dict(saved.monitor)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise ValueError(f"{Path(folder) / MONITOR_FILE} is not the Echo Trap monitor's state "
                                 f"({type(exc).__name__}: {str(exc)[:120]}); resume from another checkpoint") from None

    def _save_interrupted(self) -> None:
        """After Ctrl-C: a checkpoint of the last finished step (unless one exists, or no step finished)."""
        if self.global_step == 0:
            return
        folder = os.path.join(self.cfg.output_dir, f"checkpoint-{self.global_step}")
        if os.path.isdir(folder) and not checkpoint_problems(folder):  # the signal came during this step's save
            return
        try:
            self.save_checkpoint()
        except KeyboardInterrupt:  # pragma: no cover - signals are held during the save
            pass

    def _finished_run(self, folder: RunFolder) -> TrainResult | None:
        """A run whose ``total_steps`` all finished (its final model and summary written, and its newest checkpoint,
        if any, at that step): left untouched."""
        out = Path(self.cfg.output_dir)
        if folder.plan.action != "continue" or folder.skipped or not (out / "final").is_dir():
            return None
        try:
            summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(summary, dict):  # damaged (e.g. `[]`): not a finished run's record; the run continues
            logger.warning("%s holds no run summary (a JSON %s): the run continues from its newest checkpoint",
                           out / "summary.json", type(summary).__name__)
            return None
        steps = summary.get("steps")
        if summary.get("interrupted") or not isinstance(steps, int) or steps < self.cfg.total_steps:
            return None
        if folder.checkpoint is not None and checkpoint_step(folder.checkpoint) != steps:
            return None
        logger.warning("the run in %s is finished (%d of %d steps; final model in %s): nothing to train. Pass a "
                       "larger --total_steps to continue it, or --overwrite to start over.", out, steps,
                       self.cfg.total_steps, out / "final")
        return TrainResult(global_step=steps, interrupted=False, checkpoint=newest_checkpoint(out),
                           final_model=str(out / "final"), metrics=dict(summary.get("final_validation") or {}),
                           resumed_from=None, finished_before=True)


class PolicyView:
    """The policy without its critic, for engines that copy weights (vLLM): ``state_dict`` and ``parameters`` skip
    the ``ragen_critic.`` entries, everything else is the model's."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {k: v for k, v in self._model.state_dict(*args, **kwargs).items() if CRITIC_ATTR not in k}

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        return ((n, p) for n, p in self._model.named_parameters(*args, **kwargs) if CRITIC_ATTR not in n)

    def parameters(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        return (p for _, p in self.named_parameters(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def _catch_sigterm() -> Any:
    """SIGTERM (a scheduler's stop) is handled like Ctrl-C: save, then exit cleanly. Returns the previous handler."""
    try:
        return signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    except ValueError:  # not the main thread
        return None


def _restore_sigterm(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


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
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _finite(dataclasses.asdict(value))
    return value


__all__ = [
    "PolicyView",
    "StarPOTrainer",
    "TrainResult",
    "TrainerCallback",
    "peak_rss_bytes",
    "step_seeds",
]
