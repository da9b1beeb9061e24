"""One training step through ragen-trainer and through TRL's ``GRPOTrainer`` on the same work, side by side in one run.

Four workloads, each run through both trainers (``--workloads`` picks some):

* ``bandit-grpo``: GRPO on one-turn ``ragen/Bandit-v0`` -- group-normalised advantages, no filter, clip 0.2 / 0.2;
* ``bandit-starpo-s``: the StarPO-S parts on Bandit -- ragen's ``starpo-s-grpo`` preset (keep the 25 % of groups with
  the highest in-group reward std, clip 0.2 / 0.28, no KL) against ``RagenGRPOTrainer(filter_ratio=0.25,
  filter_mode="std")`` with ``epsilon_high=0.28``, ``beta=0``. StarPO-S proper trains a critic (PPO / GAE); TRL has
  none, so this pair compares the StarPO-S parts on the GRPO backbone (ragen's ``starpo-s-grpo``), critic left out on
  both sides;
* ``frozenlake-grpo``, ``frozenlake-starpo-s``: the same two on multi-turn ``ragen/FrozenLake-v0`` (``--turns`` turns),
  TRL playing the episodes through :class:`ragen_trainer.trl_integration.RagenRollout` as its ``rollout_func``
  (ragen's episode driver and ``HFEngine`` on TRL's live model; ``env_mask`` keeps the env's text out of the loss).

The same work on both sides: the same model (``--model``, float32 weights, from a fresh copy per side), the same
compute dtype (``--dtype``: float32, or bfloat16 autocast over the float32 weights -- ragen ``dtype: bfloat16`` with
``master_dtype: float32``, TRL ``bf16=True``), the same initial states
step by step (ragen's step seeds; TRL's dataset in that order, not shuffled), the same prompts (chat template +
generation prefix, ``RagenGRPOTrainer``), temperature 1, the same ``max_new_tokens`` per reply and stop strings, replies
only trained (ragen pinned to ``reference: latest``, TRL's ``env_mask``), a token mean over the step's reply tokens
(ragen ``token-mean``, TRL ``loss_type="dapo"``), entropy bonus ``entropy_coef`` (ragen's 0.001), no KL (no reference
model), AdamW at the same constant learning rate without weight decay, gradient clipping 1.0, one optimizer step per
training step over ``--micro-batch`` completions at a time (TRL ``per_device_train_batch_size`` x
``gradient_accumulation_steps``), activation checkpointing off on both sides (``--gradient-checkpointing`` turns it on
on both). The samples differ (each trainer draws its own), so the token counts differ a little; they are printed.

What each trainer does with that work is its own, and is what is measured: ragen packs each micro-batch into one row
without padding with each group's prompt once (``ragen_trainer.packing``), takes the old log-probs from the update's
own forward when a step makes one update (no scoring pass; so does TRL with ``num_iterations=1``), and drops filtered
groups before the update; TRL pads, computes every completion, and masks the filtered groups out of its loss.

Phases per timed step: *rollout* (ragen ``time/rollout``; TRL ``_generate`` + ``_calculate_rewards``: generation, env
steps, tokenising), *scoring* (ragen ``time/scoring``; TRL the rest of ``_generate_and_score_completions``: padding,
advantages, any log-prob pass), *fwd+bwd* (ragen ``time/forward_loss``; TRL ``training_step`` minus
``_prepare_inputs``), *optimizer* (the optimizer's ``step`` by its step hooks: ragen's includes gradient clipping, TRL's
clipping runs before it, in *other*) and *other* (the rest of the step: bookkeeping, metrics). A step is timed from its
start to its end (ragen: the end of the last step to ``on_step_end``; TRL: ``on_step_begin`` to ``on_step_end``).

The update's FLOPs: model FLOPs of the forward and backward passes run with gradients on (``benchmarks/flops.py``)::

    FLOPs = 6 * N * T  +  12 * layers * d_attn * P  +  6 * d * V * H

``N`` non-embedding parameters, ``T`` token positions through the transformer (padding included: it is computed), ``P``
attended query-key pairs per layer (causal, real tokens only), ``H`` LM-head positions (ragen: trained positions; TRL's
fused head on a CPU: every position), ``d`` hidden size, ``V`` vocabulary. Forwards recomputed by activation
checkpointing are not counted (model FLOPs, not hardware FLOPs). GFLOP/s = FLOPs / fwd+bwd seconds, held against the
matmul peak in the compute dtype (``--dtype``) measured by each side's process just before its steps (``--threads`` threads, the fastest of five
2048 x 2048 products; the run's first and last such measurements are printed too).

Each side runs in its own process (its own peak RSS, nothing shared), ``--warmup`` untimed steps first (default 1:
the first step pays one-off costs, AdamW's state allocation among them), then ``--steps`` timed ones; ``--repeats N``
runs the pair N times, alternating which side goes first, and keeps each side's fastest run (on a shared machine the
slow runs are other tenants' load).

Sizes (the quick defaults take a few minutes per side on a 2-core CPU with SmolLM2-135M)::

    --bandit-groups 4 --bandit-group-size 8 --bandit-tokens 64        Bandit: 4 x 8 rollouts, 64 tokens a reply
    --frozenlake-groups 2 --frozenlake-group-size 4 --turns 3 --frozenlake-tokens 32
                                                                       FrozenLake: 2 x 4 episodes, 3 turns, 32 tokens
    --micro-batch 8 (Bandit) / --frozenlake-micro-batch 4              completions per forward / backward

    python benchmarks/bench_step.py                                   # all four workloads, both trainers
    python benchmarks/bench_step.py --workloads bandit-grpo --repeats 2 --json step.json
    python benchmarks/bench_step.py --workloads bandit-grpo --dtype float32 bfloat16   # bf16 autocast's effect
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ragen_trainer.host_memory import peak_rss_bytes  # noqa: E402  (light: no torch)

#: Algorithm -> (ragen preset, the settings both sides get from it).
ALGORITHMS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {"filter_ratio": 1.0, "clip_low": 0.2, "clip_high": 0.2}),
    "starpo-s": ("starpo-s-grpo", {}),  # the preset's own: keep 0.25 by std, clip 0.2 / 0.28
}
ENVS = {"bandit": "ragen/Bandit-v0", "frozenlake": "ragen/FrozenLake-v0"}
WORKLOADS = [f"{env}-{algo}" for env in ENVS for algo in ALGORITHMS]
SIDES = ("ragen", "trl")
SIDE_NAMES = {"ragen": "ragen-trainer", "trl": "TRL GRPOTrainer"}


@dataclass(frozen=True)
class Workload:
    """One row pair of the benchmark: an env, an algorithm and the step's sizes."""

    name: str
    env_id: str
    algorithm: str
    groups: int
    group_size: int
    max_new_tokens: int
    micro_batch_size: int
    max_turns: int | None = None
    """Turns per episode (``None``: the env's own)."""

    @property
    def completions(self) -> int:
        return self.groups * self.group_size


@dataclass(frozen=True)
class Settings:
    """What both sides share beyond the workload."""

    model: str = "smollm2"
    steps: int = 1
    warmup: int = 1
    seed: int = 0
    learning_rate: float = 1e-6
    gradient_checkpointing: bool = False
    threads: int = 2
    dtype: str = "float32"
    """Compute dtype of the update and scoring (``float32``, or ``bfloat16`` autocast over float32 weights)."""


def _log(message: str) -> None:
    print(f"[bench_step {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------------------------------------- the work
def ragen_config(work: Workload, settings: Settings, output_dir: str) -> Any:
    """The ragen config of ``work``: its algorithm's preset as today's reference trains it, with the settings both
    sides share (see the module docstring). TRL's side reads its settings from this config too."""
    from ragen_trainer.config import load_config

    preset, algorithm_changes = ALGORITHMS[work.algorithm]
    total = work.completions
    changes: dict[str, Any] = {
        "reference": "latest",  # TRL trains the replies only (env_mask): compare with ragen's replies-only loss mask
        "env_id": work.env_id,
        "output_dir": output_dir,
        "total_steps": settings.warmup + settings.steps,
        "env_groups": work.groups,
        "group_size": work.group_size,
        "max_new_tokens": work.max_new_tokens,
        "kl_coef": 0.0,  # no reference model on either side
        "kl_reward_coef": 0.0,
        "actor_lr": settings.learning_rate,
        "micro_batch_size": work.micro_batch_size,
        "generation_batch_size": total,
        "val_every": 0,
        "save_steps": 0,
        "resume": False,
        "report_to": [],
        "seed": settings.seed,
        "temperature": 1.0,
        "top_p": 1.0,
        "loss_agg_mode": "token-mean",
        "lr_scheduler_type": "constant",
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "lora_rank": 0,
        "ppo_epochs": 1,
        "ppo_mini_batch_size": total,  # one optimizer step per batch, as GRPOTrainer's
        "reply_tokens": "sampled",  # TRL trains on the sampled ids
        "gradient_checkpointing": settings.gradient_checkpointing,
        "dtype": settings.dtype,  # compute dtype; master_dtype stays float32 (the weights and AdamW's state)
        **algorithm_changes,
    }
    if work.max_turns is not None:
        changes["max_turns"] = work.max_turns
    cfg = load_config(preset).replace(**changes).validate()
    if cfg.adv_estimator != "grpo" or cfg.use_critic or cfg.kl_coef or cfg.filter_mode != "std":
        raise ValueError(f"the {preset!r} preset changed: adv_estimator={cfg.adv_estimator!r}, critic={cfg.critic!r}, "
                         f"kl_coef={cfg.kl_coef}, filter_mode={cfg.filter_mode!r}")  # fmt: skip
    return cfg


class _OptimizerClock:
    """Wall time inside an optimizer's ``step``, timed around the instance's ``step`` (not by step hooks: ragen's
    optimizer subclasses AdamW and calls its ``step``, and once a plain AdamW exists in the process torch hooks that
    one too, so the hooks would run twice per step)."""

    def __init__(self, optimizer: Any) -> None:
        self.seconds = 0.0
        step = optimizer.step

        @functools.wraps(step)  # keeps the marks torch's LR scheduler put on the step it wrapped
        def timed_step(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return step(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        optimizer.step = timed_step

    def take(self) -> float:
        out, self.seconds = self.seconds, 0.0
        return out


def _peak_rss_gb() -> float:
    return peak_rss_bytes() / 1e9


# ---------------------------------------------------------------------------------------------------------- ragen side
def run_ragen(work: Workload, settings: Settings, tmp: str) -> list[dict[str, Any]]:
    """Train ``warmup + steps`` steps with :class:`StarPOTrainer`; one record per step."""
    import torch
    from flops import UpdateFlops

    from ragen_trainer.models import load_model_and_tokenizer
    from ragen_trainer.trainer import StarPOTrainer, TrainerCallback

    cfg = ragen_config(work, settings, str(Path(tmp) / "ragen"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_model_and_tokenizer(settings.model, device=device, dtype="float32")
    records: list[dict[str, Any]] = []
    probe: dict[str, Any] = {}

    class Clock(TrainerCallback):
        def on_train_begin(self, trainer: Any, step: int) -> None:
            probe["t0"] = time.perf_counter()

        def on_step_end(self, trainer: Any, step: int, metrics: dict[str, float]) -> None:
            seconds = time.perf_counter() - probe["t0"]
            fwd_bwd = metrics.get("time/forward_loss", 0.0)
            records.append({
                "step_s": seconds,
                "generated_tokens": metrics.get("response/tokens_per_trajectory", float("nan")) * work.completions,
                "rollout_s": metrics.get("time/rollout", 0.0),
                "scoring_s": metrics.get("time/scoring", 0.0),
                "fwd_bwd_s": fwd_bwd,
                "optimizer_s": probe["optimizer"].take(),
                "trained_completions": metrics.get("filter/kept_trajectories", float(work.completions)),
                "reward_mean": metrics.get("reward/mean", float("nan")),
                **probe["flops"].take(),
            })  # fmt: skip
            _log(f"ragen {work.name}: step {len(records)}/{cfg.total_steps} {seconds:.1f} s")
            probe["t0"] = time.perf_counter()

    trainer = StarPOTrainer(cfg, model, tokenizer, callbacks=[Clock()])
    probe["flops"] = UpdateFlops(trainer.model)
    probe["optimizer"] = _OptimizerClock(trainer.adamw)
    trainer.train()
    return records


# ---------------------------------------------------------------------------------------------------------- TRL side
def _timed_trainer_class() -> type:
    """:class:`RagenGRPOTrainer` (TRL's ``GRPOTrainer`` + ragen's prefix, rows and filter) with wall clocks around
    its phases (see the module docstring); nothing else changes."""
    from ragen_trainer.trl_integration import RagenGRPOTrainer

    def timed(name: str, phase: str) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return getattr(super(TimedTrainer, self), name)(*args, **kwargs)
            finally:
                self.phase[phase] += time.perf_counter() - t0

        return method

    class TimedTrainer(RagenGRPOTrainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.phase: dict[str, float] = defaultdict(float)

        _generate = timed("_generate", "generate")
        _calculate_rewards = timed("_calculate_rewards", "rewards")
        _generate_and_score_completions = timed("_generate_and_score_completions", "generate_and_score")
        _prepare_inputs = timed("_prepare_inputs", "prepare")
        training_step = timed("training_step", "training_step")

        def take_phases(self) -> dict[str, float]:
            out, self.phase = dict(self.phase), defaultdict(float)
            return out

    return TimedTrainer


def run_trl(work: Workload, settings: Settings, tmp: str) -> list[dict[str, Any]]:
    """The same steps through TRL's ``GRPOTrainer`` (:class:`RagenGRPOTrainer`); one record per step."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL 1.16
    import torch
    from flops import UpdateFlops
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig

    from ragen_trainer.models import load_model_and_tokenizer
    from ragen_trainer.trainer import step_seeds
    from ragen_trainer.trl_integration import (
        RagenRollout,
        bind_tokenizer_for_stop_strings,
        checkpointing_arg,
        env_reward,
        initial_state_dataset,
        protocol_stop_strings,
    )

    cfg = ragen_config(work, settings, str(Path(tmp) / "ragen-config"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_model_and_tokenizer(settings.model, device=device, dtype="float32")
    env_kwargs = cfg.env_make_kwargs()
    protocol = env_kwargs.pop("protocol")
    seeds = [s for step in range(cfg.total_steps) for s in step_seeds(cfg, step)]
    dataset = initial_state_dataset(cfg.env_id, seeds, env_kwargs=env_kwargs, protocol=protocol,
                                    group_randomness=cfg.group_randomness)  # fmt: skip
    multi_turn = protocol.max_turns > 1
    generation_kwargs = None
    if not multi_turn:  # one-turn: TRL generates itself, with the protocol's stop strings
        stops = protocol_stop_strings(dataset)
        if stops:
            bind_tokenizer_for_stop_strings(model, tokenizer)
            generation_kwargs = {"stop_strings": stops}
    total = work.completions
    args = GRPOConfig(
        output_dir=str(Path(tmp) / "trl"),
        max_steps=cfg.total_steps,
        num_generations=cfg.group_size,
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=total // cfg.micro_batch_size,
        max_completion_length=cfg.max_new_tokens,  # one-turn: the reply; RagenRollout: each turn's reply
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=0,
        generation_kwargs=generation_kwargs,
        learning_rate=cfg.actor_lr,
        lr_scheduler_type="constant",
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        beta=cfg.kl_coef,
        epsilon=cfg.clip_low,
        epsilon_high=cfg.clip_high,
        loss_type="dapo",  # token-mean over the whole accumulated batch, as ragen's token-mean
        scale_rewards="group" if cfg.grpo_norm_by_std else "none",
        entropy_coef=cfg.entropy_coef,
        num_iterations=1,
        shuffle_dataset=False,  # the dataset is already in ragen's step order
        use_vllm=False,
        use_cpu=device == "cpu",
        bf16=settings.dtype == "bfloat16",  # accelerate's autocast over the float32 weights, as ragen's
        fp16=False,
        **checkpointing_arg(cfg.gradient_checkpointing),
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=cfg.seed,
        dataloader_num_workers=0,
    )
    rollout = RagenRollout(cfg.rollout_settings()) if multi_turn else None
    trainer = _timed_trainer_class()(model=model, reward_funcs=[env_reward], args=args, train_dataset=dataset,
                                     processing_class=tokenizer, rollout_func=rollout,
                                     filter_ratio=cfg.filter_ratio, filter_mode=cfg.filter_mode,
                                     filter_round=cfg.filter_round)  # fmt: skip
    trainer.remove_callback(PrinterCallback)  # it prints the raw end-of-training logs dict
    flops = UpdateFlops(model)
    records: list[dict[str, Any]] = []
    probe: dict[str, Any] = {}

    class Clock(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kw: Any) -> None:
            inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's wrapper holds torch's
            probe["optimizer"] = _OptimizerClock(inner)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            probe["t0"] = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            seconds = time.perf_counter() - probe["t0"]
            phase = trainer.take_phases()
            metrics = trainer._metrics["train"]
            rollout_s = phase.get("generate", 0.0) + phase.get("rewards", 0.0)
            kept = trainer.last_filter.kept if trainer.last_filter is not None and cfg.filter_ratio < 1 else None
            records.append({
                "step_s": seconds,
                "generated_tokens": metrics["completions/mean_length"][-1] * total,
                "rollout_s": rollout_s,
                "scoring_s": phase.get("generate_and_score", 0.0) - rollout_s,
                "fwd_bwd_s": phase.get("training_step", 0.0) - phase.get("prepare", 0.0),
                "optimizer_s": probe["optimizer"].take(),
                "trained_completions": float(total if kept is None else len(kept) * cfg.group_size),
                "reward_mean": metrics["reward"][-1],
                **flops.take(),
            })  # fmt: skip
            _log(f"TRL {work.name}: step {len(records)}/{cfg.total_steps} {seconds:.1f} s")

    trainer.add_callback(Clock())
    trainer.train()
    if len(records) != cfg.total_steps:
        raise RuntimeError(f"TRL ran {len(records)} optimizer steps, expected {cfg.total_steps}")
    return records


# ---------------------------------------------------------------------------------------------------------- one side
def run_side(side: str, work: Workload, settings: Settings) -> dict[str, Any]:
    """One side of one workload in this process: the mean of its timed steps, its peak RSS and the matmul peak
    measured just before it."""
    import torch
    from flops import matmul_peak

    torch.set_num_threads(settings.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    peak = matmul_peak(dtype=getattr(torch, settings.dtype))
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        records = (run_ragen if side == "ragen" else run_trl)(work, settings, tmp)
    timed = records[settings.warmup:]
    row: dict[str, Any] = {"workload": work.name, "side": side, "steps": len(timed)}
    for key in timed[0]:
        row[key] = statistics.mean(r[key] for r in timed)
    row["other_s"] = row["step_s"] - sum(row[k] for k in ("rollout_s", "scoring_s", "fwd_bwd_s", "optimizer_s"))
    row["gflops"] = row["flops"] / 1e9
    row["gflops_per_s"] = row["gflops"] / row["fwd_bwd_s"] if row["fwd_bwd_s"] > 0 else float("nan")
    row["matmul_peak_gflops_per_s"] = peak
    row["peak_fraction"] = row["gflops_per_s"] / peak
    row["peak_rss_gb"] = _peak_rss_gb()
    row["threads"] = torch.get_num_threads()
    row["dtype"] = settings.dtype
    return row


def _run_worker(side: str, work: Workload, settings: Settings) -> dict[str, Any]:
    """:func:`run_side` in a fresh process (its own peak RSS; nothing left over from the other side)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        result = handle.name
    spec = json.dumps({"side": side, "work": asdict(work), "settings": asdict(settings)})
    env = {**os.environ, "OMP_NUM_THREADS": str(settings.threads)}
    try:
        subprocess.run([sys.executable, __file__, "--worker", spec, "--worker-result", result], check=True, env=env)
        return json.loads(Path(result).read_text(encoding="utf-8"))
    finally:
        Path(result).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------------- the run
def run_benchmark(works: list[Workload], settings: Settings, repeats: int = 1,
                  dtypes: list[str] | None = None, sides: tuple[str, ...] = SIDES) -> dict[str, Any]:
    """Both sides (or ``sides``) of every workload in every compute dtype (``dtypes``, default
    ``[settings.dtype]``), ``repeats`` times (alternating the order), each (dtype, side)'s fastest run kept. Returns
    ``{"rows": [...], "matmul_peak": {dtype: {"start", "end"}}, "settings": ..., "versions": ...}``."""
    import torch
    from flops import matmul_peak

    dtypes = dtypes or [settings.dtype]
    torch.set_num_threads(settings.threads)
    peaks = {d: {"start": matmul_peak(dtype=getattr(torch, d))} for d in dtypes}
    _log(", ".join(f"{d} matmul peak {p['start']:.0f} GFLOP/s" for d, p in peaks.items())
         + f" on {settings.threads} threads; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    order = [(dtype, side) for dtype in dtypes for side in sides]
    rows: list[dict[str, Any]] = []
    for work in works:
        best: dict[tuple[str, str], dict[str, Any]] = {}
        runs: dict[tuple[str, str], list[float]] = defaultdict(list)
        for repeat in range(repeats):
            for key in order if repeat % 2 == 0 else order[::-1]:
                dtype, side = key
                _log(f"{work.name}: {side}, {dtype} (run {repeat + 1}/{repeats}), load average "
                     f"{os.getloadavg()[0]:.2f}")  # fmt: skip
                row = _run_worker(side, work, replace(settings, dtype=dtype))
                row["load_average"] = os.getloadavg()[0]
                runs[key].append(row["step_s"])
                if key not in best or row["step_s"] < best[key]["step_s"]:
                    best[key] = row
        for key in order:
            best[key]["runs_s"] = runs[key]
            rows.append(best[key])
        print(format_tables([best[k] for k in order]), flush=True)
    for d, p in peaks.items():
        p["end"] = matmul_peak(dtype=getattr(torch, d))
    return {"rows": rows, "matmul_peak": peaks, "settings": asdict(settings), "dtypes": dtypes,
            "workloads": [asdict(w) for w in works], "versions": versions(), "repeats": repeats}  # fmt: skip


def versions() -> dict[str, str]:
    """The versions that decide these timings."""
    import platform
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "trl", "accelerate", "numpy"):
        out[name] = version(name)
    return out


STEP_COLUMNS: list[tuple[str, str, str]] = [
    ("workload", "workload", "{}"),
    ("side", "trainer", "{}"),
    ("dtype", "compute", "{}"),
    ("generated_tokens", "gen tokens", "{:.0f}"),
    ("trained_completions", "trained", "{:.0f}"),
    ("step_s", "s / step", "{:.2f}"),
    ("rollout_s", "rollout s", "{:.2f}"),
    ("scoring_s", "scoring s", "{:.2f}"),
    ("fwd_bwd_s", "fwd+bwd s", "{:.2f}"),
    ("optimizer_s", "optimizer s", "{:.2f}"),
    ("other_s", "other s", "{:.2f}"),
    ("reward_mean", "reward", "{:.3f}"),
    ("peak_rss_gb", "peak RSS GB", "{:.2f}"),
]
FLOP_COLUMNS: list[tuple[str, str, str]] = [
    ("workload", "workload", "{}"),
    ("side", "trainer", "{}"),
    ("dtype", "compute", "{}"),
    ("tokens", "tokens T", "{:.0f}"),
    ("pairs", "attn pairs P", "{:.0f}"),
    ("head_positions", "LM-head H", "{:.0f}"),
    ("gflops", "GFLOP", "{:.1f}"),
    ("fwd_bwd_s", "fwd+bwd s", "{:.2f}"),
    ("gflops_per_s", "GFLOP/s", "{:.1f}"),
    ("matmul_peak_gflops_per_s", "matmul peak", "{:.0f}"),
    ("peak_fraction", "of peak", "{:.1%}"),
]


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    cells = [[header for _, header, _ in columns]]
    for row in rows:
        cells.append([fmt.format(row[key]) if row.get(key) is not None else "-" for key, _, fmt in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = []
    for n, r in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_tables(rows: list[dict[str, Any]]) -> str:
    """The step table (phases, peak RSS), the update's FLOP table, ragen's step time as a fraction of TRL's in each
    compute dtype, and bfloat16's step time as a fraction of float32's for each side that ran both."""
    ratios = []
    by_key: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for row in rows:
        by_key[(row["workload"], row.get("dtype", "float32"))][row["side"]] = row
    for (name, dtype), sides in by_key.items():
        if set(sides) == set(SIDES):
            r, t = sides["ragen"], sides["trl"]
            ratios.append(f"{name} ({dtype}): ragen / TRL step time {r['step_s'] / t['step_s']:.2f} "
                          f"({t['step_s'] / r['step_s']:.2f}x faster), fwd+bwd {r['fwd_bwd_s'] / t['fwd_bwd_s']:.2f}")
    for (name, dtype), sides in by_key.items():
        base = by_key.get((name, "float32"), {})
        for side, row in sides.items() if dtype != "float32" else ():
            if side in base:
                ratios.append(f"{name} {side}: {dtype} / float32 step time {row['step_s'] / base[side]['step_s']:.2f}, "
                              f"fwd+bwd {row['fwd_bwd_s'] / base[side]['fwd_bwd_s']:.2f}")  # fmt: skip
    return "\n\n".join([_table(rows, STEP_COLUMNS), _table(rows, FLOP_COLUMNS), "\n".join(ratios)])


def build_workloads(args: argparse.Namespace) -> list[Workload]:
    works = []
    for name in args.workloads:
        env, algorithm = name.split("-", 1)
        if env == "bandit":
            works.append(Workload(name, ENVS[env], algorithm, args.bandit_groups, args.bandit_group_size,
                                  args.bandit_tokens, args.micro_batch))  # fmt: skip
        else:
            works.append(Workload(name, ENVS[env], algorithm, args.frozenlake_groups, args.frozenlake_group_size,
                                  args.frozenlake_tokens, args.frozenlake_micro_batch, args.turns))  # fmt: skip
    for work in works:
        if work.completions % work.micro_batch_size:
            raise ValueError(f"invalid micro-batch {work.micro_batch_size} for {work.name}: expected a divisor of "
                             f"groups x group size = {work.completions} (both sides accumulate the same "
                             "micro-batches)")  # fmt: skip
    return works


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    positive = _positive_int
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=WORKLOADS, help="default: all four")
    p.add_argument("--model", default="smollm2", help="model for load_model_and_tokenizer (default: smollm2)")
    p.add_argument("--bandit-groups", type=positive, default=4, help="Bandit initial states per step (default 4)")
    p.add_argument("--bandit-group-size", type=_group_size, default=8, help="Bandit rollouts per state (default 8)")
    p.add_argument("--bandit-tokens", type=positive, default=64, help="Bandit: most tokens of a reply (default 64)")
    p.add_argument("--micro-batch", type=positive, default=8, help="Bandit completions per forward (default 8)")
    p.add_argument("--frozenlake-groups", type=positive, default=2, help="FrozenLake initial states (default 2)")
    p.add_argument("--frozenlake-group-size", type=_group_size, default=4,
                   help="FrozenLake episodes per state (default 4)")  # fmt: skip
    p.add_argument("--turns", type=positive, default=3, help="FrozenLake turns per episode (default 3)")
    p.add_argument("--frozenlake-tokens", type=positive, default=32,
                   help="FrozenLake: most tokens of a reply, per turn (default 32)")  # fmt: skip
    p.add_argument("--frozenlake-micro-batch", type=positive, default=4,
                   help="FrozenLake episodes per forward (default 4)")  # fmt: skip
    p.add_argument("--steps", type=positive, default=1, help="timed steps per side (default 1)")
    p.add_argument("--warmup", type=_non_negative_int, default=1, help="untimed steps first, per side (default 1)")
    p.add_argument("--repeats", type=positive, default=1, help="runs per side; the fastest is kept (default 1)")
    p.add_argument("--seed", type=_non_negative_int, default=0)
    p.add_argument("--lr", type=float, default=1e-6, help="AdamW learning rate, both sides (default 1e-6)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="activation checkpointing on both sides")
    p.add_argument("--threads", type=positive, default=int(os.environ.get("OMP_NUM_THREADS") or 2),
                   help="torch threads of every process (default: OMP_NUM_THREADS, else 2)")  # fmt: skip
    p.add_argument("--dtype", nargs="+", choices=("float32", "bfloat16"), default=["float32"],
                   help="compute dtype(s) of both sides' update and scoring: float32, or bfloat16 autocast over the "
                        "float32 weights; two run each workload in both, side by side (default float32)")  # fmt: skip
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES),
                   help="the trainers timed (default both; 'ragen' alone to compare compute dtypes on one machine "
                        "without TRL's slower steps)")
    p.add_argument("--json", default="", help="also write the results to this JSON file")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-result", default=None, help=argparse.SUPPRESS)
    return p


def _int_at_least(minimum: int, why: str = "") -> Any:
    """An argparse type: an int ``>= minimum`` (``why`` says why, in the error)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an int >= {minimum}{why}, got {text}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)
_group_size = _int_at_least(2, " (GRPO needs two rollouts per group)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        row = run_side(spec["side"], Workload(**spec["work"]), Settings(**spec["settings"]))
        Path(args.worker_result).write_text(json.dumps(row), encoding="utf-8")
        return 0
    try:
        works = build_workloads(args)
    except ValueError as exc:
        build_parser().error(str(exc))
    settings = Settings(model=args.model, steps=args.steps, warmup=args.warmup, seed=args.seed,
                        learning_rate=args.lr, gradient_checkpointing=args.gradient_checkpointing,
                        threads=args.threads, dtype=args.dtype[0])  # fmt: skip
    sides = tuple(dict.fromkeys(args.sides))  # each once, in the order given
    started = time.perf_counter()
    result = run_benchmark(works, settings, args.repeats, dtypes=args.dtype, sides=sides)
    peak = result["matmul_peak"]
    print(f"\n== One training step, {' vs '.join(SIDE_NAMES[s] for s in sides)}, same work ({settings.model}, float32 weights, "
          f"{' and '.join(args.dtype)} compute, {settings.threads} threads; mean of {settings.steps} timed step(s) "
          f"after {settings.warmup} warm-up; {'fastest of ' + str(args.repeats) + ' runs' if args.repeats > 1 else 'one run'} "
          f"per side; activation checkpointing {'on' if settings.gradient_checkpointing else 'off'})")  # fmt: skip
    print("versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()))
    for dtype, peak in result["matmul_peak"].items():
        print(f"{dtype} matmul peak: {peak['start']:.0f} GFLOP/s at the start, {peak['end']:.0f} at the end "
              f"(each row: its own process's, just before its steps)")  # fmt: skip
    print()
    print(format_tables(result["rows"]))
    print("\nFLOPs = 6 N T + 12 layers d_attn P + 6 d V H (model FLOPs of the update's forward and backward; "
          "recomputed forwards not counted); GFLOP/s over fwd+bwd seconds.")
    print(f"done in {time.perf_counter() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
