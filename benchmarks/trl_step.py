"""One GRPO training step on the same work, through ragen-trainer and through TRL's ``GRPOTrainer``, side by side.

The work: one-turn ``ragen/Bandit-v0``, P initial states (env seeds) x N rollouts each, sampled with the same model,
the same prompts (token for token), the same ``max_new_tokens``, temperature 1, and one optimizer step over all
P x N completions with the same optimisation settings on both sides:

* GRPO advantages (group mean, divided by the group's std), no filtering, no critic;
* clipped policy loss (0.2 / 0.2), token-mean over the whole step's completion tokens (TRL's ``loss_type="dapo"``),
  entropy bonus 0.001, KL to the reference model ``--kl`` (default 0: no reference model on either side);
* full fine-tuning in float32, AdamW at the same constant learning rate, gradient clipping 1.0;
* micro-batches of ``--micro-batch`` completions accumulated into one optimizer step (ragen ``micro_batch_size``;
  TRL ``per_device_train_batch_size`` x ``gradient_accumulation_steps`` = P x N), one generate call for all P x N.

ragen-trainer runs the ``grpo`` preset (``filter_ratio`` 1.0, KL off unless ``--kl``) through
:class:`ragen_trainer.trainer.StarPOTrainer`, the way ``benchmarks/bench_train_step.py`` does, and its per-phase
times are the logged metrics ``time/generation``, ``time/environment``, ``time/scoring``, ``time/update``. TRL's
``GRPOTrainer`` gets a ``datasets.Dataset`` of the same first prompts (system prompt and first observation from
``env.reset(seed)``, rendered with the chat template plus the protocol's generation prefix ``<think>``), the same
seeds step by step, and a reward function that replays each completion in the env (``env.step(prefix +
completion)``, reward = the env's reward, rollout ``r`` of a group with the same env randomness as ragen's); its phases
are timed by wrapping ``_generate_single_turn`` (generation), ``_calculate_rewards`` (environment),
``_generate_and_score_completions`` (the rest of it: tokenising prompts, the old/ref log-prob forwards when needed,
advantages; "scoring") and ``training_step`` minus ``_prepare_inputs`` (forward + backward of the loss; "update").
"s / step" is the wall time of a whole optimizer step (``on_step_begin`` to ``on_step_end``) on both sides; what it
holds beyond the named phases (optimizer step, ragen's tokenisation and metrics) is "other".

Differences that are part of each trainer's step and are kept: ragen always runs a no-grad forward for the old
log-probs (its "scoring"); TRL skips it when the batch is used for a single update (``num_iterations`` 1), taking the
current log-probs as the old ones. With the protocol's ``stop_after_answer`` (replies end at ``</answer>``), TRL is
given the same stop string (``generation_kwargs={"stop_strings": ...}``, see
:func:`ragen_trainer.trl_integration.bind_tokenizer_for_stop_strings`).

Each side runs ``--warmup`` untimed steps first (default: 1 on a GPU, where the first step pays CUDA's one-off
costs; 0 on a CPU, where a step takes minutes), then ``--steps`` timed ones, from its own fresh copy of the model.

    python benchmarks/trl_step.py                              # Bandit, 4 x 8 rollouts, 64 tokens, 1 timed step
    python benchmarks/trl_step.py --groups 2 --group-size 4 --max-new-tokens 32 --micro-batch 4   # quick

Cost on a 2-core CPU (SmolLM2-135M, float32): the default 32 completions take about 6 minutes per side (generation
and the update dominate), the quick line above about 2 minutes per side; on a GPU seconds.

From another benchmark::

    from benchmarks.trl_step import run_trl_comparison, format_table
    rows = run_trl_comparison(groups=4, group_size=8, max_new_tokens=64)
    print(format_table(rows))
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ragen_envs  # noqa: F401  (registers the ragen/* ids)
from ragen_envs.driver import dynamics_seed
from ragen_trainer.config import load_config
from ragen_trainer.models import load_model_and_tokenizer
from ragen_trainer.trainer import StarPOTrainer, TrainerCallback, step_seeds
from ragen_trainer.trl_integration import (
    bind_tokenizer_for_stop_strings,
    checkpointing_arg,
    first_messages,
    render_prompt,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENV_ID = "ragen/Bandit-v0"

#: Row keys, in table order, with their column headers and formats.
COLUMNS: list[tuple[str, str, str]] = [
    ("path", "path", "{}"),
    ("completions", "completions", "{:d}"),
    ("generated_tokens", "gen tokens", "{:.0f}"),
    ("step_s", "s / step", "{:.2f}"),
    ("step_tokens_per_s", "gen tok/s (step)", "{:.1f}"),
    ("generation_s", "generation s", "{:.2f}"),
    ("generation_tokens_per_s", "gen tok/s (generate)", "{:.1f}"),
    ("environment_s", "env s", "{:.3f}"),
    ("scoring_s", "scoring s", "{:.2f}"),
    ("update_s", "update s", "{:.2f}"),
    ("other_s", "other s", "{:.2f}"),
    ("reward_mean", "reward", "{:.3f}"),
]


def _log(message: str) -> None:
    print(f"[trl_step {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------------------------------------- the work
def ragen_config(
    groups: int,
    group_size: int,
    max_new_tokens: int,
    steps: int,
    seed: int,
    learning_rate: float,
    micro_batch_size: int,
    kl: float,
    output_dir: str,
    stop_at_answer: bool | None,
) -> Any:
    """The ragen config of the comparison: the ``grpo`` preset, no filtering, no critic, KL ``kl`` in the loss only."""
    changes: dict[str, Any] = {
        "reference": "latest",  # TRL trains the replies only (env_mask): compare with ragen's replies-only loss mask
        "env_id": ENV_ID,
        "output_dir": output_dir,
        "total_steps": steps,
        "env_groups": groups,
        "group_size": group_size,
        "max_new_tokens": max_new_tokens,
        "filter_ratio": 1.0,
        "kl_coef": kl,
        "kl_reward_coef": 0.0,
        "kl_estimator": "k3",
        "clip_low": 0.2,
        "clip_high": 0.2,
        "actor_lr": learning_rate,
        "micro_batch_size": micro_batch_size,
        "generation_batch_size": groups * group_size,
        "val_every": 0,
        "save_steps": 0,
        "resume": False,
        "report_to": [],
        "seed": seed,
        "temperature": 1.0,
        "top_p": 1.0,
        "loss_agg_mode": "token-mean",
        "lr_scheduler_type": "constant",
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "lora_rank": 0,
        "ppo_epochs": 1,
        "ppo_mini_batch_size": groups * group_size,  # one optimizer step per batch, as GRPOTrainer's
        "group_randomness": "independent",  # as BanditReward below
        "reply_tokens": "sampled",  # TRL trains on the sampled ids
        "gradient_checkpointing": False,  # as the TRL side below
    }
    if stop_at_answer is not None:
        changes["protocol"] = {"stop_after_answer": stop_at_answer}
    cfg = load_config("grpo").replace(**changes).validate()
    if cfg.adv_estimator != "grpo" or cfg.use_critic:
        raise ValueError(f"the 'grpo' preset changed: adv_estimator={cfg.adv_estimator!r}, critic={cfg.critic!r}")
    return cfg


def stop_strings(cfg: Any) -> tuple[str, ...]:
    """The stop strings ragen's rollouts use for this config."""
    return cfg.protocol_settings().stop_strings


def first_prompts(cfg: Any, tokenizer: Any, steps: int) -> list[dict[str, Any]]:
    """One row per (step, initial state): the first prompt as text, exactly what ragen's rollouts feed the model.

    ragen's prompt ids are ``chat_template(system, first observation, add_generation_prompt)`` + the protocol's
    generation prefix, the two tokenised separately; TRL tokenises the row's text in one piece. ``prompt_ids`` keeps
    ragen's ids so the caller can check that both give the same tokens. The chat and its rendering are
    :mod:`ragen_trainer.trl_integration`'s (``first_messages``, ``render_prompt``).
    """
    import gymnasium as gym

    prefix = cfg.protocol_settings().generation_prefix
    env = gym.make(cfg.env_id, **cfg.env_make_kwargs())
    rows = []
    try:
        for step in range(steps):
            for seed in step_seeds(cfg, step):
                observation, info = env.reset(seed=seed)
                text, ids = render_prompt(first_messages(observation, info), tokenizer, prefix)
                rows.append({"prompt": text, "seed": int(seed), "step": step, "prompt_ids": ids})
    finally:
        env.close()
    return rows


class BanditReward:
    """TRL reward function: each completion is stepped in its own freshly reset env, as ragen's rollout would.

    Completions arrive group by group (TRL's ``RepeatSampler`` repeats each prompt ``num_generations`` times in a
    row), so the r-th completion of a seed in a batch is rollout r of that group: rollout 0 keeps the env's own
    randomness, rollout r > 0 resets with ``dynamics_seed(seed, r)`` (the episode driver's rule). Counts the
    completion tokens and the time spent in the env.
    """

    __name__ = "bandit_env_reward"

    def __init__(self, cfg: Any) -> None:
        import gymnasium as gym

        self.env = gym.make(cfg.env_id, **cfg.env_make_kwargs())
        self.prefix = cfg.protocol_settings().generation_prefix
        self.calls: list[dict[str, float]] = []

    def __call__(
        self,
        prompts: list[str],
        completions: list[Any],
        completion_ids: list[list[int]],
        seed: list[int],
        **kwargs: Any,
    ) -> list[float]:
        t0 = time.perf_counter()
        seen: dict[int, int] = defaultdict(int)
        rewards, successes = [], []
        for text, s in zip(completions, seed):
            if not isinstance(text, str):  # conversational completions: [{"role": "assistant", "content": ...}]
                text = text[-1]["content"]
            rollout = seen[s]
            seen[s] += 1
            options = {"dynamics_seed": dynamics_seed(s, rollout)} if rollout > 0 else None
            self.env.reset(seed=int(s), options=options)
            _, reward, _, _, info = self.env.step(self.prefix + text)
            rewards.append(float(reward))
            successes.append(float(bool(info.get("success", False))))
        self.calls.append(
            {
                "seconds": time.perf_counter() - t0,
                "completions": float(len(rewards)),
                "tokens": float(sum(len(ids) for ids in completion_ids)),
                "reward_sum": float(sum(rewards)),
                "success_sum": float(sum(successes)),
            }
        )
        return rewards


# ---------------------------------------------------------------------------------------------------------- timing
class _StepClock:
    """A ``TrainerCallback`` that times each optimizer step and prints progress."""

    def __init__(self, label: str, total: int, warmup: int, on_end: Callable[[], None] | None = None) -> None:
        from transformers import TrainerCallback

        clock = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                clock.t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                seconds = time.perf_counter() - clock.t0
                clock.seconds.append(seconds)
                if clock.on_end is not None:
                    clock.on_end()
                kind = "warm-up" if len(clock.seconds) <= clock.warmup else "timed"
                _log(f"{clock.label}: step {len(clock.seconds)}/{clock.total} ({kind}) {seconds:.1f} s")

        self.label, self.total, self.warmup, self.on_end = label, total, warmup, on_end
        self.t0 = 0.0
        self.seconds: list[float] = []
        self.callback = Callback()

    def ragen_callback(self) -> Any:
        """The same clock as a :class:`ragen_trainer.trainer.TrainerCallback` (a ragen step: rollout to update)."""
        clock = self

        class RagenCallback(TrainerCallback):
            def on_train_begin(self, trainer: Any, step: int) -> None:
                clock.t0 = time.perf_counter()

            def on_step_end(self, trainer: Any, step: int, metrics: dict[str, float]) -> None:
                seconds = time.perf_counter() - clock.t0
                clock.seconds.append(seconds)
                kind = "warm-up" if len(clock.seconds) <= clock.warmup else "timed"
                _log(f"{clock.label}: step {len(clock.seconds)}/{clock.total} ({kind}) {seconds:.1f} s")
                clock.t0 = time.perf_counter()

        return RagenCallback()


def _mean(values: list[float]) -> float:
    return statistics.mean(values) if values else float("nan")


def _row(path: str, completions: int, per_step: list[dict[str, float]]) -> dict[str, Any]:
    """A result row: the mean over the timed steps of each phase, and throughputs from those means."""
    keys = (
        "step_s",
        "generated_tokens",
        "generation_s",
        "environment_s",
        "scoring_s",
        "update_s",
        "reward_mean",
        "success_rate",
    )
    row: dict[str, Any] = {"path": path, "completions": completions, "steps": len(per_step)}
    row.update({k: _mean([s[k] for s in per_step]) for k in keys})
    row["other_s"] = row["step_s"] - sum(row[k] for k in ("generation_s", "environment_s", "scoring_s", "update_s"))
    row["step_tokens_per_s"] = row["generated_tokens"] / row["step_s"]
    row["generation_tokens_per_s"] = row["generated_tokens"] / row["generation_s"]
    return row


# ---------------------------------------------------------------------------------------------------------- ragen side
def run_ragen(cfg: Any, model: Any, tokenizer: Any, warmup: int) -> dict[str, Any]:
    """``cfg.total_steps`` steps of :class:`StarPOTrainer`; the row averages the steps after ``warmup``."""
    clock = _StepClock("ragen-trainer", cfg.total_steps, warmup)
    trainer = StarPOTrainer(cfg, model, tokenizer, callbacks=[clock.ragen_callback()])
    trainer.train()
    history = trainer.history
    if len(history) != cfg.total_steps or len(clock.seconds) != cfg.total_steps:
        raise RuntimeError(
            f"ragen-trainer logged {len(history)} steps and timed {len(clock.seconds)}, expected {cfg.total_steps}"
        )
    per_step = []
    for metrics, seconds in list(zip(history, clock.seconds))[warmup:]:
        per_step.append(
            {
                "step_s": seconds,
                "generated_tokens": metrics.get("batch/model_tokens", float("nan")),
                "generation_s": metrics.get("time/generation", 0.0),
                "environment_s": metrics.get("time/environment", 0.0),
                "scoring_s": metrics.get("time/scoring", 0.0),
                "update_s": metrics.get("time/update", 0.0),
                "reward_mean": metrics.get("reward/mean", float("nan")),
                "success_rate": metrics.get("success_rate", float("nan")),
            }
        )
    return _row("ragen-trainer (StarPOTrainer, grpo)", cfg.env_groups * cfg.group_size, per_step)


# ---------------------------------------------------------------------------------------------------------- TRL side
def _timed_grpo_trainer_class() -> type:
    """``trl.GRPOTrainer`` with wall clocks around its phases (see the module docstring); nothing else changes."""
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.phase: dict[str, float] = defaultdict(float)

        def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super()._generate_single_turn(*args, **kwargs)
            finally:
                self.phase["generation"] += time.perf_counter() - t0

        def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super()._calculate_rewards(*args, **kwargs)
            finally:
                self.phase["environment"] += time.perf_counter() - t0

        def _generate_and_score_completions(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super()._generate_and_score_completions(*args, **kwargs)
            finally:
                self.phase["generate_and_score"] += time.perf_counter() - t0

        def _prepare_inputs(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super()._prepare_inputs(*args, **kwargs)
            finally:
                self.phase["prepare"] += time.perf_counter() - t0

        def training_step(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super().training_step(*args, **kwargs)
            finally:
                self.phase["training_step"] += time.perf_counter() - t0

        def take_phases(self) -> dict[str, float]:
            out, self.phase = dict(self.phase), defaultdict(float)
            return out

    return TimedGRPOTrainer


def run_trl(cfg: Any, model: Any, tokenizer: Any, warmup: int, output_dir: str) -> dict[str, Any]:
    """The same ``cfg.total_steps`` steps through TRL's ``GRPOTrainer`` (transformers generation, CPU)."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig

    total = cfg.env_groups * cfg.group_size
    rows = first_prompts(cfg, tokenizer, cfg.total_steps)
    trl_ids = tokenizer([r["prompt"] for r in rows], add_special_tokens=True)["input_ids"]
    mismatched = sum(list(a) != b["prompt_ids"] for a, b in zip(trl_ids, rows))
    if mismatched:
        _log(f"note: {mismatched}/{len(rows)} TRL prompts tokenise differently from ragen's (prefix boundary merge)")
    dataset = Dataset.from_list([{"prompt": r["prompt"], "seed": r["seed"], "step": r["step"]} for r in rows])

    stops = stop_strings(cfg)
    generation_kwargs: dict[str, Any] = {"stop_strings": list(stops)} if stops else {}
    if stops:
        bind_tokenizer_for_stop_strings(model, tokenizer)
    args = GRPOConfig(
        output_dir=output_dir,
        max_steps=cfg.total_steps,
        num_generations=cfg.group_size,
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=total // cfg.micro_batch_size,
        max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=0,
        generation_kwargs=generation_kwargs or None,
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
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        fp16=False,
        **checkpointing_arg(False),  # off on both sides (both default to on): the same work, as documented
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=cfg.seed,
        dataloader_num_workers=0,
    )
    reward = BanditReward(cfg)
    trainer = _timed_grpo_trainer_class()(
        model=model, reward_funcs=[reward], args=args, train_dataset=dataset, processing_class=tokenizer
    )
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # it prints the raw end-of-training logs dict
    per_step: list[dict[str, float]] = []

    def on_step_end() -> None:
        phase = trainer.take_phases()
        calls, reward.calls = reward.calls, []
        n = sum(c["completions"] for c in calls)
        if n != total:
            raise RuntimeError(f"TRL step scored {n:.0f} completions, expected {total}")
        generation, environment = phase.get("generation", 0.0), phase.get("environment", 0.0)
        per_step.append(
            {
                "generated_tokens": sum(c["tokens"] for c in calls),
                "generation_s": generation,
                "environment_s": environment,
                "scoring_s": phase.get("generate_and_score", 0.0) - generation - environment,
                "update_s": phase.get("training_step", 0.0) - phase.get("prepare", 0.0),
                "reward_mean": sum(c["reward_sum"] for c in calls) / n,
                "success_rate": sum(c["success_sum"] for c in calls) / n,
            }
        )

    clock = _StepClock("TRL GRPOTrainer", cfg.total_steps, warmup, on_end=on_step_end)
    trainer.add_callback(clock.callback)
    trainer.train()
    if len(per_step) != cfg.total_steps:
        raise RuntimeError(f"TRL ran {len(per_step)} optimizer steps, expected {cfg.total_steps}")
    for record, seconds in zip(per_step, clock.seconds):
        record["step_s"] = seconds
    return _row(f"TRL {_trl_version()} GRPOTrainer (transformers generate)", total, per_step[warmup:])


def _trl_version() -> str:
    import trl

    return trl.__version__


# ---------------------------------------------------------------------------------------------------------- API
def run_trl_comparison(
    model_name: str = "smollm2",
    groups: int = 4,
    group_size: int = 8,
    max_new_tokens: int = 64,
    steps: int = 1,
    seed: int = 0,
    *,
    warmup: int | None = None,
    learning_rate: float = 1e-6,
    micro_batch_size: int = 8,
    kl: float = 0.0,
    stop_at_answer: bool | None = None,
) -> list[dict[str, Any]]:
    """Time ``steps`` GRPO optimizer steps (after ``warmup`` untimed ones) on ``groups`` x ``group_size`` Bandit
    rollouts through ragen-trainer, then through TRL's ``GRPOTrainer``, each from a fresh copy of ``model_name``.

    Args:
        model_name: what :func:`ragen_trainer.models.load_model_and_tokenizer` loads (float32, CPU or the GPU).
        groups, group_size: P initial states x N rollouts = the completions of one step (TRL ``num_generations`` N).
        max_new_tokens: per completion (TRL ``max_completion_length``).
        steps: timed optimizer steps per side (the row holds their means).
        seed: ragen's run seed (which picks the initial states) and TRL's ``seed``.
        warmup: untimed steps first, per side; ``None``: 1 on a GPU (CUDA context, kernel selection, allocator), 0
            on a CPU, where a step takes minutes and the first one's extra costs (AdamW's state) are below the noise.
        learning_rate: AdamW, constant, both sides.
        micro_batch_size: completions per forward/backward; must divide ``groups * group_size``.
        kl: KL-to-reference coefficient in the loss (k3), both sides; 0 loads no reference model.
        stop_at_answer: end replies at ``</answer>`` (the protocol's ``stop_after_answer``) on both sides; ``None``
            keeps the env protocol's own setting.

    Returns:
        Two dicts (ragen first, then TRL) with ``path``, ``completions``, ``generated_tokens`` (per step),
        ``step_s``, ``step_tokens_per_s``, ``generation_s``, ``generation_tokens_per_s``, ``environment_s``,
        ``scoring_s``, ``update_s``, ``other_s``, ``reward_mean``, ``success_rate``, ``steps`` (timed), and the run's
        settings (``model``, ``max_new_tokens``, ``stop_strings``, ``threads``, ``device``).
    """
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if warmup is None:
        warmup = 1 if device == "cuda" else 0
    checks = (
        ("groups", groups, 1),
        ("group_size", group_size, 2),
        ("max_new_tokens", max_new_tokens, 1),
        ("steps", steps, 1),
        ("warmup", warmup, 0),
        ("micro_batch_size", micro_batch_size, 1),
    )
    for name, value, low in checks:
        if not isinstance(value, int) or value < low:
            raise ValueError(f"invalid argument {name}={value!r}: expected an int >= {low}")
    total = groups * group_size
    if total % micro_batch_size:
        raise ValueError(
            f"invalid argument micro_batch_size={micro_batch_size}: expected a divisor of groups x "
            f"group_size = {total} (both sides must accumulate the same micro-batches)"
        )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    n_steps = warmup + steps
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-trl-step-") as tmp:
        cfg = ragen_config(
            groups,
            group_size,
            max_new_tokens,
            n_steps,
            seed,
            learning_rate,
            micro_batch_size,
            kl,
            str(Path(tmp) / "ragen"),
            stop_at_answer,
        )
        stops = stop_strings(cfg)
        _log(
            f"{ENV_ID}: {groups} x {group_size} rollouts, {max_new_tokens} new tokens, stop strings {list(stops)}, "
            f"{warmup} warm-up + {steps} timed step(s) per side, {torch.get_num_threads()} threads on {device}"
        )
        for side in ("ragen", "trl"):
            _log(f"loading {model_name} for the {side} side")
            model, tokenizer = load_model_and_tokenizer(model_name, device=device, dtype="float32")
            if side == "ragen":
                rows.append(run_ragen(cfg, model, tokenizer, warmup))
            else:
                rows.append(run_trl(cfg, model, tokenizer, warmup, str(Path(tmp) / "trl")))
            del model
    for row in rows:
        row.update(
            model=model_name,
            max_new_tokens=max_new_tokens,
            stop_strings=list(stops),
            warmup=warmup,
            threads=torch.get_num_threads(),
            device=device,
        )
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of :func:`run_trl_comparison`'s rows, one column per phase."""
    cells = [[header for _, header, _ in COLUMNS]]
    for row in rows:
        cells.append([fmt.format(row[key]) if row.get(key) is not None else "-" for key, _, fmt in COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = []
    for n, r in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="model for load_model_and_tokenizer (default: smollm2)")
    p.add_argument("--groups", type=int, default=4, help="P: initial states per step")
    p.add_argument("--group-size", type=int, default=8, help="N: rollouts per initial state")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=1, help="timed optimizer steps per side")
    p.add_argument(
        "--warmup", type=int, default=None, help="untimed steps first, per side (default: 1 on a GPU, 0 on a CPU)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--micro-batch", type=int, default=8, help="completions per forward/backward")
    p.add_argument("--kl", type=float, default=0.0, help="KL coefficient (k3, in the loss), both sides")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument(
        "--stop-at-answer",
        dest="stop_at_answer",
        action="store_true",
        default=None,
        help="end replies at </answer> on both sides",
    )
    stop.add_argument(
        "--no-stop-at-answer",
        dest="stop_at_answer",
        action="store_false",
        help="let replies run to end-of-turn or the token limit on both sides",
    )
    args = p.parse_args(argv)
    rows = run_trl_comparison(
        args.model,
        args.groups,
        args.group_size,
        args.max_new_tokens,
        args.steps,
        args.seed,
        warmup=args.warmup,
        learning_rate=args.lr,
        micro_batch_size=args.micro_batch,
        kl=args.kl,
        stop_at_answer=args.stop_at_answer,
    )
    first = rows[0]
    print(
        f"\n{ENV_ID}, model={first['model']}, {first['completions']} completions per step "
        f"({args.groups} x {args.group_size}), max {first['max_new_tokens']} new tokens, stop strings "
        f"{first['stop_strings']}, mean of {args.steps} timed step(s) after {first['warmup']} warm-up, "
        f"{first['threads']} threads on {first['device']}"
    )
    print(format_table(rows))
    print(
        "\nscoring: ragen's no-grad old-log-prob forward (TRL skips it for one update per batch) plus, for TRL, "
        "prompt tokenising and advantages; other: optimizer step and bookkeeping outside the named phases."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
