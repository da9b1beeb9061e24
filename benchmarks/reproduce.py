"""The RAGEN paper's experiments as the paper ran them: one command per figure or table, at the paper's scale or at a
fixed CPU scale, curves as JSON and PNG.

Every experiment is designed as the reference's ``train_all.sh`` (RAGEN ``3059df8``) and its configs run it: the
runs, what differs between them, and where each comes from (file and line) are in :data:`EXPERIMENTS`; every run
is a preset (``ragen_trainer.config.PRESETS``, ``reference: paper`` by default) plus the few fields it changes.

    python benchmarks/reproduce.py list                              # every experiment, its runs and sources
    python benchmarks/reproduce.py fig9-starpo-s --scale cpu         # one experiment, CPU scale
    python benchmarks/reproduce.py table4-generalization --scale paper --gpus 1
    python benchmarks/reproduce.py paper --gpus 8 --dry-run          # the whole set: configs and GPU-hour estimate
    python benchmarks/reproduce.py paper --gpus 8                    # ... and run it, in sequence, resumable

Scales.

* ``paper`` (default): the presets' values as the paper's runs used them (Qwen2.5-0.5B-Instruct, 8 initial states x
  16 rollouts, 200 steps, validation on 256 states every 10 steps at temperature 0.5, 400 tokens a reply, 500 on
  Bandit as ``config/_1_bandit.yaml``), each run's ``train_all.sh`` overrides on top. Runs train through
  ``ragen-trainer train`` in a subprocess (``accelerate launch --num_processes N`` with ``--gpus N > 1``), save a
  checkpoint every 10 steps and resume from it when the command is run again.
* ``cpu``: :data:`CPU_SCALE`, fixed (and written in ``docs/reproduction.md``) before any run: SmolLM2-135M, small
  batches and few steps, and the ``reply-format`` warm-up (:mod:`ragen_trainer.warmup`), without which that model
  earns the same format penalty on every rollout and nothing can be learned. Runs train in this process.

Runs and what they are. A run's identity is its whole resolved configuration: the
:class:`~ragen_trainer.config.StarPOConfig` after the preset, the scale, the run's changes and ``--model``, ``--seed``
and ``--engine`` (all fields but those that only place or report it, :data:`PLACEMENT_FIELDS`), plus the warm-up's
settings at the CPU scale (:func:`run_identity`). Its short hash names the run's folder
(``<runs>/<scale>/<env>/<run>-<hash>``, the identity written in its ``reproduce.json``), so another model or seed
trains in its own folder and never reads back another's; the experiment's JSON records each run's identity, and its
name carries ``--seed``, ``--model`` and ``--engine`` when they are not the defaults. The caches are keyed the same
way: the warm-up by its settings (:mod:`ragen_trainer.warmup`), ``splits.json`` by the run's identity and its final
model, and dropped when the run trains again.

A run that finished (its ``summary.json`` says so, and its ``metrics.jsonl`` holds every step) is read back, not
trained again; an interrupted one resumes from its checkpoint when the same command is run again (Ctrl-C: exit 130,
"interrupted; run the same command again to resume"; a failed run: exit 1). Runs shared by several experiments
(``ppo`` on Sokoban is in Figures 5, 8 and 9) train once. A damaged record is named with what is done about it: a torn
or odd ``summary.json`` trains the run again (from its newest checkpoint), a torn ``splits.json`` evaluates again, a
finished run whose ``metrics.jsonl`` is missing, empty or lacks steps stops the experiment (exit 3) before anything is
written, so the experiment's JSON and PNG are never replaced by empty curves.

Runs with generalisation splits are evaluated on them after training (:data:`SPLITS`: the final model, one rollout
per state at the validation temperature). Curves are EMA-smoothed as the paper's (its Appendix B.3 gives no
coefficient: :data:`EMA` is ours), the raw points drawn faintly beside them.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragen_trainer.cli import EXIT_INTERRUPTED, train_from_config
from ragen_trainer.config import load_config
from ragen_trainer.engines import SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.fileio import BoundedReadError, atomic_write_json, atomic_write_text, file_mode, read_text_bounded
from ragen_trainer.models import check_model_source, load_model_and_tokenizer
from ragen_trainer.monitor import read_metrics
from ragen_trainer.rollout import collect_rollouts
from ragen_trainer.trainer import VAL_SEED_BASE
from ragen_trainer.warmup import settings_key, warmup_model, warmup_settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: The paper's smoothing of training curves is an EMA (Appendix B.3, coefficient not given): value_t = EMA *
#: value_{t-1} + (1 - EMA) * raw_t.
EMA = 0.6

#: The paper's model (Section 3.2, Appendix B.2).
PAPER_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"

#: Exit statuses: a run failed; a record is damaged or a folder holds another run, and only the user can settle it
#: (nothing was written); interrupted (Ctrl-C), to be resumed by the same command.
EXIT_FAILED = 1
EXIT_REFUSED = 3
#: Config fields that only say where a run lives, how it reports and how often it checkpoints, not what it trains:
#: left out of its identity (a vLLM server that moved, or another checkpoint cadence, is the same run).
PLACEMENT_FIELDS = frozenset({"output_dir", "engine_url", "resume", "report_to", "logging_steps", "save_steps",
                              "save_total_limit", "allow_remote_engine", "dist_timeout_minutes"})
#: The run folder's record of its identity (written before it trains).
IDENTITY_RECORD = "reproduce.json"
#: Largest record of ours read back (``summary.json`` of a long run holds its validation history: some MB at most).
MAX_RECORD_BYTES = 64 << 20


class ReproduceError(Exception):
    """A run could not be trained or read back; the message says which, why and what was kept."""

    status = EXIT_FAILED


class RunFailed(ReproduceError):
    status = EXIT_FAILED


class RunInterrupted(ReproduceError):
    status = EXIT_INTERRUPTED


class RecordRefused(ReproduceError):
    status = EXIT_REFUSED


#: Per env: the env id and the paper-scale fields that its reference config file changes from ``config/base.yaml``.
ENVS: dict[str, tuple[str, dict[str, Any]]] = {
    "bandit": ("ragen/Bandit-v0", {"max_new_tokens": 500}),  # config/_1_bandit.yaml: response_length 500
    "sokoban": ("ragen/Sokoban-v0", {}),
    "frozenlake": ("ragen/FrozenLake-v0", {}),
}

#: Generalisation splits, evaluated on a run's final model: name -> (env id, env kwargs). The Bandit names are
#: ``train_all.sh``'s Section 5.1 (``custom_envs.BanditTest.env_config``); the Sokoban ones its
#: ``SOKOBAN_GENERALIZATION_CONFIG`` (``SimpleSokoban, LargerSokoban, SokobanDifferentGridVocab, FrozenLake``).
SPLITS: dict[str, tuple[str, dict[str, Any]]] = {
    "bandit-test": ("ragen/Bandit-v0", {"low_risk_name": "Trader", "high_risk_name": "Librarian"}),
    "bandit-rev-test": ("ragen/Bandit-v0", {"low_risk_name": "Librarian", "high_risk_name": "Trader"}),
    "sokoban": ("ragen/Sokoban-v0", {}),
    "sokoban-large": ("ragen/SokobanLarge-v0", {}),
    "sokoban-new-vocab": ("ragen/SokobanNewVocab-v0", {}),
    "frozenlake": ("ragen/FrozenLake-v0", {}),
}
#: ``SOKOBAN_GENERALIZATION_CONFIG``: 128 validation states of each of its four envs.
SOKOBAN_SPLITS = ("sokoban", "sokoban-large", "sokoban-new-vocab", "frozenlake")
SPLIT_STATES = {"paper": 128, "cpu": 16}
#: The Bandit generalisation runs' arm names (train_all.sh lines 53-77): paper label -> ((train low, train high),
#: test split, train_all.sh line, its experiment name). Table 4's "Bandit" is the intuitive mapping, the ambitious
#: profession the risky arm (Engineer, then Trader): train_all.sh's ``bandit-generalization-rev`` (line 66); its
#: "BanditRev" the reversed one (Teacher, then Librarian risky): ``bandit-generalization`` (line 53). ragen_envs'
#: ``ragen/BanditRev-v0`` (Phoenix and Dragon swapped) is another env, not the paper's BanditRev.
BANDIT_NAMES = {
    "bandit": (("Teacher", "Engineer"), "bandit-rev-test", 66, "bandit-generalization-rev"),
    "bandit-rev": (("Engineer", "Teacher"), "bandit-test", 53, "bandit-generalization"),
}


@dataclass(frozen=True)
class Run:
    """One training run: a preset on an env plus the fields it changes, and the ``train_all.sh`` line it follows."""

    name: str
    env: str
    preset: str
    changes: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    splits: tuple[str, ...] = ()
    """Generalisation splits evaluated on the final model (:data:`SPLITS`)."""

    @property
    def key(self) -> str:
        """Folder name: the same run in several experiments trains once."""
        return f"{self.env}/{self.name}"


@dataclass(frozen=True)
class Experiment:
    """One figure or table of the paper: its runs, what may differ between them, and what to draw."""

    name: str
    paper: str
    """Where in the paper (arXiv 2504.20073 v1, the PDF in RAGEN 3059df8)."""
    claim: str
    runs: Callable[[], list[Run]]
    varies: tuple[str, ...]
    """The config fields (``protocol.x`` for protocol settings) in which the runs differ; tests check that nothing
    else does (the run name, output folder and model aside)."""
    curves: dict[str, str]
    paper_numbers: str = ""
    credit: str = "paper"
    x: str = "step"
    """The curves' x axis: ``step`` (training steps) or ``updates`` (optimizer steps, for designs that change how many
    updates a step makes)."""
    """``paper`` or ``ragen`` (an extension of ours, not a result of the paper)."""


def _run(name: str, env: str, preset: str, source: str, **changes: Any) -> Run:
    splits = changes.pop("splits", ())
    return Run(name, env, preset, changes, source, tuple(splits))


# ------------------------------------------------------------------------------------------------- the experiments
def fig5_runs() -> list[Run]:
    return [_run(f"{algo}", env, algo, f"train_all.sh:{line} {env.replace('frozenlake', 'frozen_lake')}-{algo}")
            for env, lines in (("bandit", (9, 10)), ("sokoban", (11, 12)), ("frozenlake", (13, 14)))
            for algo, line in zip(("ppo", "grpo"), lines)]  # fmt: skip


def fig7_runs() -> list[Run]:
    lines = {0.25: (18, 19, 20, 21), 0.5: (26, 27, 28, 29), 0.75: (32, 33, 34, 35)}
    runs = []
    for env_index, env in enumerate(("sokoban", "frozenlake")):
        for algo_index, preset in enumerate(("starpo-s", "starpo-s-grpo")):
            short = "ppo" if preset == "starpo-s" else "grpo"
            for ratio in (1.0, 0.75, 0.5, 0.25):
                line = lines.get(ratio, (None,) * 4)[2 * env_index + algo_index]
                source = (f"train_all.sh:{line} rollout_filter_ratio={ratio}" if line else
                          "no train_all.sh run: the keep-all twin of its filter runs (its Figure 7 'All Rollouts' "
                          "line may be the $USE_BASE run, which also changes clip and KL)")  # fmt: skip
                name = "starpo-s" if (preset, ratio) == ("starpo-s", 0.25) else f"{short}-keep-{ratio}"
                runs.append(_run(name, env, preset, source, **({} if ratio == 0.25 else {"filter_ratio": ratio})))
    return runs


def fig8_runs() -> list[Run]:
    runs = []
    for env, lines in (("sokoban", (41, 42, 43)), ("frozenlake", (45, 46, 47))):
        runs.append(_run("ppo", env, "ppo", f"train_all.sh:{lines[0]} {env}-base-ppo"))
        runs.append(_run("ppo-cliphigh", env, "ppo", f"train_all.sh:{lines[1]} {env}-base-ppo-cliphigh",
                         clip_high=0.28))
        runs.append(_run("ppo-nokl", env, "ppo", f"train_all.sh:{lines[2]} {env}-base-ppo-nokl", kl_reward_coef=0.0))
    return runs


def fig9_runs() -> list[Run]:
    runs = []
    # StarPO-S's source per env: train_all.sh's filter-0.25 PPO line where there is one (Sokoban 18, FrozenLake 20);
    # no line runs it on Bandit: there it is config/_1_bandit.yaml over config/base.yaml as they stand.
    starpo_s = {"bandit": "config/_1_bandit.yaml over config/base.yaml as they stand (no train_all.sh line)",
                "sokoban": "train_all.sh:18 sokoban-ppo-rolloutfilter0.25",
                "frozenlake": "train_all.sh:20 frozen_lake-ppo with rollout_filter_ratio 0.25"}
    for env, line in (("bandit", 9), ("sokoban", 11), ("frozenlake", 13)):
        runs.append(_run("ppo", env, "ppo", f"train_all.sh:{line} (StarPO w/ PPO)"))
        runs.append(_run("starpo-s", env, "starpo-s", starpo_s[env]))
    return runs


def _sokoban_gen(name: str, source: str, **changes: Any) -> Run:
    return _run(name, "sokoban", "starpo-s", source, splits=SOKOBAN_SPLITS, **changes)


def table2_runs() -> list[Run]:
    shapes = ((4, 32), (8, 16), (16, 8), (32, 4), (64, 2), (128, 1))
    return [_sokoban_gen(f"p{p}-n{n}", f"train_all.sh:{127 + i} sokoban-prompt-diversity-{p}", env_groups=p, group_size=n)
            for i, (p, n) in enumerate(shapes)]  # fmt: skip


def table3_runs() -> list[Run]:
    # The per-turn cap and the episode budget scale together (max_actions_per_traj = 5 x cap), as train_all.sh.
    return [_sokoban_gen(f"actions-{k}", f"train_all.sh:{116 + k} sokoban-action-count-{k}",
                         protocol={"actions_per_turn": k, "max_actions_per_episode": 5 * k}) for k in range(1, 9)]


def fig10_runs() -> list[Run]:
    # Online-k: k times the groups, the kept k x 32 trajectories make k updates of 32 (distinct mini-batches), and
    # the validation every 10 updates; train_all.sh gives online-10 80 steps (800 updates), not 20.
    runs = [_sokoban_gen("online-1", "train_all.sh:128 (sokoban-prompt-diversity-8: the base shape)")]
    for k, steps, freq, line in ((2, 100, 5, 136), (5, 40, 2, 138), (10, 80, 1, 140)):
        runs.append(_sokoban_gen(f"online-{k}", f"train_all.sh:{line} sokoban-online-{k}", env_groups=8 * k,
                                 total_steps=steps, val_every=freq))
    return runs


def table4_runs() -> list[Run]:
    runs = []
    for label, ((low, high), split, line, reference_name) in BANDIT_NAMES.items():
        kwargs = {"low_risk_name": low, "high_risk_name": high}
        suffix = label.removeprefix("bandit")  # "" (Table 4's Bandit) or "-rev" (its BanditRev)
        label = {"bandit": "Bandit", "bandit-rev": "BanditRev"}[label]
        runs.append(_run(f"generalization{suffix}", "bandit", "starpo-s", f"train_all.sh:{line} {reference_name} "
                         f"(Table 4's {label})", env_kwargs=kwargs, splits=(split,)))
        runs.append(_run(f"generalization{suffix}-nothink", "bandit", "starpo-s-no-think", f"train_all.sh:{line + 6} "
                         f"{reference_name}-nothink (Table 4's {label})", env_kwargs=kwargs, splits=(split,)))
    runs.append(_sokoban_gen("generalization", "train_all.sh:96 sokoban-generalization-qwen2.5-0.5b-instruct"))
    runs.append(_run("generalization-nothink", "sokoban", "starpo-s-no-think",
                     "train_all.sh:82 sokoban-generalization-nothink", splits=SOKOBAN_SPLITS))
    return runs


def grounding_runs() -> list[Run]:
    """ragen's extension (the paper proposes reasoning-aware rewards as future work, Section 4.4)."""

    def wrapper(weight: float | None) -> dict[str, Any]:
        spec: dict[str, Any] = {"name": "grounding"}
        if weight is not None:
            spec["weight"] = weight
        return {"reward_wrappers": [spec]}

    return [_run("think-outcome", "frozenlake", "starpo-s", "ragen", env_kwargs=wrapper(0.0)),
            _run("think-grounding", "frozenlake", "starpo-s", "ragen", env_kwargs=wrapper(None))]  # fmt: skip


#: Curves drawn for every experiment unless it names its own: metric key -> panel title.
TRAINING_CURVES: dict[str, str] = {
    "val/success": "validation success",
    "reward/mean": "training reward",
    "reward/in_group_std": "in-group reward std",
    "policy/entropy": "entropy",
    "optim/grad_norm": "gradient norm",
}
LENGTH_CURVES: dict[str, str] = {
    "response/thinking_length": "thinking length (tokens per turn)",
    "response/length": "reply length (tokens)",
    "val/success": "validation success",
}
GROUNDING_CURVES: dict[str, str] = {
    "response/thinking_length": "thinking length (tokens per turn)",
    "grounding/supported_claims": "supported claims per turn",
    "grounding/contradicted_claims": "contradicted claims per turn",
    "val/success": "validation success",
}

EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment("fig5-echo-trap", "Figure 5, Figure 6 (Section 4.1)", "vanilla StarPO improves, then collapses; the "
               "PPO variant holds longer than GRPO (Bandit, Sokoban), collapse announced by the in-group reward std "
               "and entropy, then gradient-norm spikes", fig5_runs, ("preset",), TRAINING_CURVES,
               "GRPO collapses at about step 20 (Bandit) and 10 (Sokoban); PPO holds until about 100 and 50"),
    Experiment("fig7-filter", "Figure 7 (Section 4.2)", "keeping only the high-variance groups delays or removes the "
               "collapse (PPO), helps GRPO modestly, and halves the update time", fig7_runs,
               ("filter_ratio",), TRAINING_CURVES,
               "keep 75% moved the FrozenLake PPO collapse from step 100 to 140; keep 50% removed it"),
    Experiment("fig8-kl-cliphigh", "Figure 8 (Section 4.2)", "removing the KL term and clip-higher each raise the "
               "peak success and delay the collapse (PPO)", fig8_runs, ("clip_high", "kl_reward_coef"),
               TRAINING_CURVES, "curves only (Sokoban peak about 0.12, FrozenLake about 0.25)"),
    Experiment("fig9-starpo-s", "Figure 9 (Section 4.2)", "StarPO-S delays the collapse and ends higher than vanilla "
               "StarPO (PPO) on all three envs", fig9_runs, ("preset",), TRAINING_CURVES,
               "curves only (final success: Bandit about 1.0, Sokoban about 0.25, FrozenLake about 0.2)"),
    Experiment("table2-diversity", "Table 2 (Section 4.3)", "at a fixed 128 rollouts a step, more initial states "
               "with fewer rollouts each generalise better, as long as each state has several rollouts",
               table2_runs, ("env_groups", "group_size"), TRAINING_CURVES,
               "SingleSokoban / SokobanNewVocab / FrozenLake %, N=32: 21.09 / 20.22 / 17.97; 16: 20.31 / 21.48 / "
               "19.53; 8: 20.31 / 19.53 / 17.19; 4: 20.70 / 25.39 / 21.48; 2: 19.92 / 25.00 / 12.50; 1: 19.53 / "
               "22.27 / 12.50"),
    Experiment("table3-actions", "Table 3 (Section 4.3)", "5-6 actions per turn (with the episode budget scaled "
               "alongside) do best; 7 is worse", table3_runs,
               ("protocol.actions_per_turn", "protocol.max_actions_per_episode"), TRAINING_CURVES,
               "Sokoban / NewVocab / LargeSokoban / FrozenLake %, 1: 12.11 / 13.67 / 1.17 / 11.72; 2: 16.41 / 21.09 / "
               "3.52 / 18.36; 3: 19.53 / 19.53 / 1.95 / 20.88; 4: 26.95 / 26.95 / 5.08 / 20.70; 5: 28.13 / 25.78 / "
               "6.25 / 21.09; 6: 33.59 / 31.64 / 6.64 / 18.36; 7: 22.27 / 28.52 / 3.91 / 19.53"),
    Experiment("fig10-online", "Figure 10 (Section 4.3)", "fresher rollouts (Online-1) converge faster and "
               "generalise better than rollouts reused for k updates", fig10_runs,
               ("env_groups", "total_steps", "val_every"), TRAINING_CURVES,
               "curves only (Sokoban eval success about 0.25-0.3 for Online-1, lower for 5 and 10)", x="updates"),
    Experiment("table4-generalization", "Table 4 (Section 4.4)", "thinking helps Bandit generalise to unseen arm "
               "names; on Sokoban it has mixed or marginal effects", table4_runs,
               ("preset", "protocol.enable_think", "env_kwargs", "val_envs"), LENGTH_CURVES,
               "StarPO-S / no-think %: Bandit 100 / 81.25, BanditRev 67.58 / 56.25, FrozenLake 19.92 / 19.53, "
               "LargeSokoban 2.34 / 2.73, Sokoban 21.48 / 20.73, SokobanNewVocab 18.75 / 26.17"),
    Experiment("fig11-reasoning-length", "Figure 11 (Section 4.4)", "thinking length declines over training (longer "
               "on BanditRev)", table4_runs, ("preset", "protocol.enable_think", "env_kwargs", "val_envs"), LENGTH_CURVES,
               "curves only (Bandit: about 60 -> 20 tokens; Sokoban: about 250 -> 50)"),
    Experiment("grounding", "(not in the paper: Section 4.4 proposes reasoning-aware rewards as future work)",
               "ragen's extension: a reward for claims in <think> that the state supports keeps the thinking "
               "grounded where the outcome reward alone lets it drift", grounding_runs, ("env_kwargs",),
               GROUNDING_CURVES, credit="ragen"),
)}

#: What the paper reports that no command here reproduces, and why (docs/reproduction.md lists them too).
NOT_REPRODUCED: dict[str, str] = {
    "Table 1": "qualitative: example replies at steps 0 and 150 (read them from a run's rollouts)",
    "Appendix C (SFT vs RL)": "needs supervised fine-tuning on BFS trajectories, which ragen does not have",
    "Appendix D (LoRA)": "a hardware-footprint comparison (GPU memory, utilisation, power), not a training result; "
                         "`--set lora_rank=64 actor_lr=1e-5 critic_lr=1e-4` trains the LoRA variant",
    "Section 5.2 runs of train_all.sh (model sizes, base vs instruct, R1 distills)": "not in the paper's PDF",
}


# ------------------------------------------------------------------------------------------------------- scales
#: The CPU scale, fixed before any CPU run (docs/reproduction.md, "CPU scale"): per env, the fields over the preset
#: and the run's own changes. Runs that change the batch shape (Table 2, Figure 10) keep their ratios (see
#: :func:`cpu_changes`).
CPU_SCALE: dict[str, dict[str, Any]] = {
    "common": {"model": "smollm2", "total_steps": 6, "env_groups": 4, "group_size": 4, "actor_lr": 5e-5,
               "critic_lr": 5e-4, "ppo_mini_batch_size": 4, "micro_batch_size": 4, "val_every": 3, "val_groups": 16,
               "save_steps": 0, "max_new_tokens": 48},  # fmt: skip
    "bandit": {},
    "sokoban": {},
    "frozenlake": {},
}
#: The CPU scale's warm-up (:mod:`ragen_trainer.warmup`): the reference agent and its episodes, epochs, rate.
CPU_WARMUP: dict[str, Any] = {"agent": "random", "episodes": 16, "epochs": 3, "lr": 1e-4}
#: Runs the CPU set trains, in this order (one experiment per finding the machine's time allows; docs/reproduction.md
#: says which are not run and why).
CPU_SET: dict[str, tuple[str, ...]] = {
    "fig9-starpo-s": ("bandit/ppo", "bandit/starpo-s"),
    "table4-generalization": ("bandit/generalization", "bandit/generalization-nothink"),
    "table3-actions": ("sokoban/actions-1", "sokoban/actions-5"),
}


def cpu_changes(run: Run) -> dict[str, Any]:
    """The CPU scale's fields for ``run`` (before the run's own changes): runs that scale the batch (more groups,
    other group sizes) keep their shape relative to the paper's 8 x 16, in the CPU batch of 8 x 4."""
    out = {**CPU_SCALE["common"], **CPU_SCALE[run.env]}
    paper_groups, paper_size = 8, 16
    groups = run.changes.get("env_groups", paper_groups)
    size = run.changes.get("group_size", paper_size)
    if "env_groups" in run.changes or "group_size" in run.changes:
        # the paper's groups and group size scaled by the CPU base's (4 / 8 and 4 / 16); at least one each
        total = out["env_groups"] * out["group_size"] * (groups * size) // (paper_groups * paper_size)
        out["env_groups"] = max(1, out["env_groups"] * groups // paper_groups)
        out["group_size"] = max(1, total // out["env_groups"])
    if "total_steps" in run.changes:  # Online-k: the same number of updates as the base run
        out["total_steps"] = max(1, out["total_steps"] * run.changes["total_steps"] // 200)
    return out


def run_config(run: Run, scale: str, runs_dir: Path, *, model: str | None = None, seed: int = 0,
               engine: str = "hf", engine_url: str = "", allow_remote_engine: bool = False) -> Any:
    """The run's validated :class:`~ragen_trainer.config.StarPOConfig` at ``scale``: its preset, the env's paper
    settings, the scale's, then the run's own changes; its ``output_dir`` is ``<runs_dir>/<scale>/<env>/<run>-<id>``,
    ``<id>`` the short hash of :func:`run_identity`."""
    env_id, env_fields = ENVS[run.env]
    fields: dict[str, Any] = {"env_id": env_id, **env_fields, "seed": seed, "engine": engine, "engine_url": engine_url,
                              "allow_remote_engine": allow_remote_engine, "report_to": ["jsonl"],
                              "output_dir": str(runs_dir / scale / run.key)}  # fmt: skip
    if scale == "paper":
        fields.update({"model": model or PAPER_MODEL, "save_steps": 10, "save_total_limit": 1})
        changes = dict(run.changes)
    else:
        fields.update(cpu_changes(run))
        if model:
            fields["model"] = model
        changes = {k: v for k, v in run.changes.items() if k not in ("env_groups", "group_size", "total_steps")}
        if "val_every" in changes:  # Online-k validates every 10 updates: every 10/k steps, in CPU steps
            changes["val_every"] = max(1, fields["val_every"] // max(1, fields["env_groups"] // 4))
    # Every split validated during training, as the reference's configs do (config/_1_bandit.yaml's BanditTest,
    # train_all.sh's SOKOBAN_GENERALIZATION_CONFIG); the training env itself is val/success.
    fields["val_envs"] = [{"env_id": SPLITS[name][0], "name": name, "env_kwargs": SPLITS[name][1]}
                          for name in run.splits if SPLITS[name] != (env_id, {})]
    cfg = load_config(run.preset).replace(**{**fields, **changes}).validate()
    folder = runs_dir / scale / f"{run.key}-{identity_key(run_identity(cfg, scale))}"
    return cfg.replace(output_dir=str(folder)).validate()


def run_identity(cfg: Any, scale: str) -> dict[str, Any]:
    """What a run is: the scale, every config field but :data:`PLACEMENT_FIELDS`, and at the CPU scale the settings
    of the warm-up it starts from (:func:`warmup_plan`)."""
    config = {k: v for k, v in cfg.to_dict().items() if k not in PLACEMENT_FIELDS}
    return {"scale": scale, "config": config, "warmup": warmup_plan(cfg)[0] if scale == "cpu" else None}


def identity_key(identity: dict[str, Any]) -> str:
    """The short hash of an identity (:func:`run_identity`): the suffix of the run's folder name."""
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]


# ------------------------------------------------------------------------------------------------------ training
def note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr, flush=True)


def read_record(path: Path) -> tuple[Any, str | None]:
    """``(data, problem)`` of one of the small JSON records a run folder holds: ``(None, None)`` when the file is
    absent, ``(None, why)`` when it cannot be read or is not JSON, else ``(data, None)`` (any JSON value: the caller
    checks its shape)."""
    if not path.exists() and not path.is_symlink():
        return None, None
    try:
        return json.loads(read_text_bounded(path, MAX_RECORD_BYTES, path.name)), None
    except BoundedReadError as exc:
        return None, f"{path} is damaged ({exc})"
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror or exc})"
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        return None, f"{path} is damaged (not JSON: {exc})"


def read_summary(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(summary, problem)`` of the run in ``folder``: ``(None, None)`` when it has no ``summary.json``."""
    data, problem = read_record(folder / "summary.json")
    if problem or data is None:
        return None, problem
    if not isinstance(data, dict):
        return None, f"{folder / 'summary.json'} is damaged (a JSON {type(data).__name__}, not the trainer's summary)"
    return data, None


def finished(folder: Path) -> bool:
    """Whether the run in ``folder`` ended by itself (an interrupted run also writes a summary: it is trained again;
    a damaged summary counts as not finished)."""
    summary, _ = read_summary(folder)
    return summary is not None and not summary.get("interrupted", False) and not summary.get("save_error")


def run_status(run: Run, cfg: Any) -> tuple[bool, list[str]]:
    """``(finished, notes)`` of the run in ``cfg.output_dir``: whether it is read back, and what was found and what
    is done about it. A finished run's ``metrics.jsonl`` is checked here (:func:`read_run_metrics`), so a damaged
    one raises :class:`RecordRefused` before anything trains or is written."""
    folder = Path(cfg.output_dir)
    summary, problem = read_summary(folder)
    if problem:
        return False, [(f"{problem}: the run cannot be read back as finished; it trains again from its newest "
                        "checkpoint (from step 0 if it has none), and its final/ is replaced when it finishes")]
    if summary is None:
        return False, []
    steps = summary.get("steps")
    if summary.get("interrupted"):
        return False, [f"the run in {folder} was interrupted at step {steps}: it resumes from its newest checkpoint"]
    if summary.get("save_error"):
        return False, [(f"the run in {folder} stopped on a failed save ({summary['save_error']}): it resumes from "
                        "its newest checkpoint")]
    if not isinstance(steps, int) or steps < cfg.total_steps:
        return False, [f"the run in {folder} stopped at step {steps} of {cfg.total_steps}: it continues"]
    if run.splits and not (folder / "final").is_dir():
        return False, [(f"{folder / 'final'} is missing: the run trains again (from its newest checkpoint) so that "
                        "its splits can be evaluated on its final model")]
    read_run_metrics(folder, cfg)
    return True, []


def read_run_metrics(folder: Path, cfg: Any) -> list[dict[str, Any]]:
    """The metric rows of the finished run in ``folder``, one per logged step in order. :class:`RecordRefused`
    naming ``metrics.jsonl`` when it is missing, unreadable, empty or lacks any of the run's logged steps: its
    curves cannot be drawn, and the experiment's JSON and PNG must not be replaced by empty or partial ones."""
    path = folder / "metrics.jsonl"
    keep = (f"the experiment's JSON and PNG are left as they are. Restore the file, or move {folder} away to train "
            "the run again")
    if not path.is_file():
        raise RecordRefused(f"{path} is missing, but the run's summary says it finished: its curves cannot be drawn; "
                            f"{keep}")
    try:
        lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError as exc:
        raise RecordRefused(f"{path} cannot be read ({exc.strerror or exc}); {keep}") from None
    by_step: dict[int, dict[str, Any]] = {}
    for row in read_metrics(path):
        step = row.get("step")  # an int, or a float when the step's metrics carry it too
        if isinstance(step, (int, float)) and not isinstance(step, bool) and math.isfinite(step) and step == int(step):
            by_step[int(step)] = row  # a step logged twice (a resume): the later record
    unreadable = len(lines) - len(read_metrics(path, notes=True))
    expected = {s for s in range(1, cfg.total_steps + 1) if s % cfg.logging_steps == 0 or s == cfg.total_steps}
    missing = sorted(expected - set(by_step))
    if not lines:
        raise RecordRefused(f"{path} is empty, but the run's summary says it finished: its curves cannot be drawn; "
                            f"{keep}")
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
        why = f"{unreadable} of its {len(lines)} line(s) are not JSON records; " if unreadable else ""
        raise RecordRefused(f"{path} is damaged: {why}it lacks {len(missing)} of the run's {len(expected)} logged "
                            f"steps ({shown}); {keep}")
    if unreadable:
        note(f"{path}: {unreadable} line(s) are not JSON records and are skipped (every step is there)")
    return [by_step[s] for s in sorted(by_step)]


def claim_folder(folder: Path, run: Run, cfg: Any, scale: str) -> None:
    """Write (or check) the folder's identity record: :class:`RecordRefused` naming both identities when the folder
    holds another run (a folder copied or renamed by hand); a damaged record is rewritten, saying so."""
    identity = run_identity(cfg, scale)
    key = identity_key(identity)
    record = {"id": key, "run": run.key, "identity": identity}
    path = folder / IDENTITY_RECORD
    data, problem = read_record(path)
    if data is not None and not (isinstance(data, dict) and isinstance(data.get("id"), str)):
        problem = f"{path} is damaged (not an identity record)"
    if problem:
        note(f"{problem}: rewritten with this command's run {key} (the trainer still checks the folder's config.yaml "
             "against it)")
    elif data is not None:
        if data["id"] != key:
            changes = _differences(data.get("identity"), identity)
            raise RecordRefused(f"{folder} holds run {data['id']} ({data.get('run')}), not this command's run {key} "
                                f"({run.key}); they differ in {changes or 'fields this version cannot compare'}. "
                                "Nothing was trained or written; move that folder away")
        return
    else:
        _note_other_configurations(folder, run, identity)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record, default=str)


def _differences(old: Any, new: dict[str, Any]) -> str:
    """``field: old -> new`` of two identities, at most six."""
    if not isinstance(old, dict):
        return ""
    flat_old = {**{f"warmup.{k}": v for k, v in (old.get("warmup") or {}).items()}, **(old.get("config") or {}),
                "scale": old.get("scale")}  # fmt: skip
    flat_new = {**{f"warmup.{k}": v for k, v in (new.get("warmup") or {}).items()}, **new["config"],
                "scale": new["scale"]}  # fmt: skip
    diffs = [f"{k}: {flat_old.get(k, '(unset)')!r} -> {flat_new.get(k, '(unset)')!r}"
             for k in sorted(set(flat_old) | set(flat_new)) if flat_old.get(k, "(unset)") != flat_new.get(k, "(unset)")]
    return "; ".join(diffs[:6]) + ("; ..." if len(diffs) > 6 else "")


def _note_other_configurations(folder: Path, run: Run, identity: dict[str, Any]) -> None:
    """Before a new folder trains: name the other configurations of the same run beside it, and a folder of the
    layout before runs were keyed (never read back: its model and seed were not recorded)."""
    for other in sorted(folder.parent.glob(f"{run.name}-*")):
        data, _ = read_record(other / IDENTITY_RECORD)
        if other != folder and isinstance(data, dict) and data.get("run") == run.key:
            note(f"{other} is another configuration of {run.key} ({_differences(data.get('identity'), identity)}): "
                 f"this one trains in {folder}")
    legacy = folder.parent / run.name
    if legacy.is_dir() and ((legacy / "summary.json").exists() or (legacy / "metrics.jsonl").exists()):
        note(f"{legacy} holds a run from before runs were keyed by their configuration (its model and seed were not "
             f"recorded): it is not read back; this run trains in {folder}")


def warmup_plan(cfg: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The CPU scale's warm-up of ``cfg``: ``(settings, env kwargs)`` (:func:`ragen_trainer.warmup.warmup_settings`:
    the model, seed, env, protocol and :data:`CPU_WARMUP`)."""
    kwargs = {k: v for k, v in cfg.env_make_kwargs().items() if k != "reward_wrappers"}
    return warmup_settings(cfg.model, cfg.env_id, kwargs, seed=cfg.seed, **CPU_WARMUP), kwargs


def warm_model(cfg: Any, runs_dir: Path) -> str:
    """The CPU scale's warm-up of ``cfg.model`` on ``cfg``'s env and protocol, cached in ``<runs>/warmup/`` under
    the hash of its settings (model and seed included)."""
    settings, kwargs = warmup_plan(cfg)
    tag = f"{cfg.env_id.removeprefix('ragen/').removesuffix('-v0').lower()}-{settings_key(settings)}"
    return str(warmup_model(cfg.model, cfg.env_id, kwargs, runs_dir / "warmup" / tag, seed=cfg.seed, **CPU_WARMUP))


def run_trainer(command: list[str]) -> int:
    """Run the trainer's command in a process group of its own and return its exit status. Ctrl-C (SIGINT) and
    SIGTERM that reach this process are passed to that group once each, and this process goes on waiting: the
    trainer saves a checkpoint and exits 130 (``subprocess.call`` would kill it in the middle of that save)."""
    child = subprocess.Popen(command, process_group=0)

    def forward(signum: int, _frame: Any) -> None:
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:  # it has exited already
            pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def train(run: Run, cfg: Any, *, scale: str, gpus: int, runs_dir: Path) -> list[dict[str, Any]]:
    """Train ``run`` (or read it back if it finished); its metric rows, one per step. An unfinished run resumes from
    its checkpoint. :class:`RunInterrupted` after Ctrl-C, :class:`RunFailed` when the trainer failed."""
    folder = Path(cfg.output_dir)
    done, notes = run_status(run, cfg)
    for text in notes:
        note(text)
    claim_folder(folder, run, cfg, scale)
    if done:
        return read_run_metrics(folder, cfg)
    _, damaged = read_summary(folder)
    if damaged:  # kept for whoever wants to look; the trainer writes a new one when the run ends
        aside = folder / "summary.json.damaged"
        os.replace(folder / "summary.json", aside)
        note(f"moved the damaged summary to {aside}")
    splits = folder / "splits.json"
    if splits.exists():  # it scored the final model this training replaces
        note(f"dropping {splits}: it scored the model this run's training replaces")
        splits.unlink()
    if scale == "cpu":
        status = train_from_config(cfg.replace(model=warm_model(cfg, runs_dir)).validate())
    else:
        folder.mkdir(parents=True, exist_ok=True)
        config_path = folder.parent / f"{folder.name}.config.yaml"
        cfg.save(config_path)
        launch = ([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(gpus)]
                  if gpus > 1 else [sys.executable])  # fmt: skip
        status = run_trainer([*launch, "-m", "ragen_trainer.cli", "train", "--config", str(config_path)])
    if status == EXIT_INTERRUPTED:
        raise RunInterrupted(f"run {run.key} was interrupted (its checkpoint is in {folder})")
    if status != 0:
        raise RunFailed(f"run {run.key} failed with status {status}: the trainer's message above says why (its "
                        f"folder: {folder})")
    done, notes = run_status(run, cfg)
    if not done:
        raise RunFailed(f"run {run.key} ended without finishing its {cfg.total_steps} steps ({'; '.join(notes)})")
    return read_run_metrics(folder, cfg)


def final_validation(folder: Path) -> dict[str, float]:
    """The validation after the last step (``summary.json``'s ``final_validation``), ``{}`` when there is none."""
    summary, _ = read_summary(folder)
    value = (summary or {}).get("final_validation")
    return dict(value) if isinstance(value, dict) else {}


def model_fingerprint(folder: Path) -> str:
    """A short hash of a model folder's files (names, sizes, modification times): another training writes others."""
    digest = hashlib.sha256()
    if folder.is_dir():
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            info = path.stat()
            digest.update(f"{path.relative_to(folder)}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def evaluate_splits(run: Run, cfg: Any, states: int) -> dict[str, float]:
    """Success of the run's final model on each of its splits: ``states`` initial states (the validation seeds), one
    rollout each at the validation temperature, the run's protocol (thinking, actions) on the split's env.

    Cached in the run's ``splits.json``, keyed by the run's identity, its final model's files, the states and the
    splits: a cache of another model (the run trained again, by reproduce.py or by hand) or a damaged one is
    evaluated again, saying why."""
    folder = Path(cfg.output_dir)
    cache = folder / "splits.json"
    # the folder's name is the run and its identity's hash (run_config)
    key = {"run": folder.name, "model": model_fingerprint(folder / "final"), "states": states,
           "splits": list(run.splits)}
    data, problem = read_record(cache)
    if problem:
        note(f"{problem}: the splits are evaluated again")
    elif data is not None:
        if not isinstance(data, dict) or not isinstance(data.get("success"), dict):
            note(f"{cache} was written before split results were keyed by their run and model: evaluated again")
        elif {k: data.get(k) for k in key} != key:
            note(f"{cache} scored another model or setting ({', '.join(k for k in key if data.get(k) != key[k])} "
                 "differ): evaluated again")
        else:
            return {str(k): float(v) for k, v in data["success"].items()}
    model, tokenizer = load_model_and_tokenizer(str(folder / "final"))
    engine = HFEngine(model, tokenizer, batch_size=cfg.generation_batch_size)
    protocol = {k: v for k, v in cfg.protocol.items() if k in ("enable_think", "actions_per_turn",
                                                               "max_actions_per_episode")}  # fmt: skip
    out = {}
    for split in run.splits:
        env_id, kwargs = SPLITS[split]
        split_cfg = cfg.replace(env_id=env_id, env_kwargs=kwargs, protocol=protocol)
        # the run's own rollout settings, as its training validation plays them (one rollout per state: the
        # group randomness and the loss mask do not change a success)
        batch = collect_rollouts(engine, tokenizer, env_id, [VAL_SEED_BASE + i for i in range(states)], 1,
                                 settings=split_cfg.rollout_settings(), env_kwargs=split_cfg.env_make_kwargs(),
                                 sampling=SamplingParams(temperature=cfg.val_temperature, top_p=cfg.top_p,
                                                         max_new_tokens=cfg.max_new_tokens, seed=cfg.seed))  # fmt: skip
        out[split] = sum(t.success for t in batch.trajectories) / max(len(batch.trajectories), 1)
    atomic_write_json(cache, {**key, "success": out})
    return out


# -------------------------------------------------------------------------------------------------- curves, tables
def ema(values: list[Any], weight: float = EMA) -> list[float | None]:
    """The paper's EMA smoothing over the non-missing values (missing ones stay missing)."""
    out: list[float | None] = []
    last: float | None = None
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(None)
            continue
        last = float(v) if last is None else weight * last + (1 - weight) * float(v)
        out.append(last)
    return out


def curves(rows: list[dict[str, Any]], keys: dict[str, str], final: dict[str, float] | None = None) -> dict[str, Any]:
    """Per-step values of ``keys`` (raw and EMA-smoothed; validation metrics are not smoothed, as the paper's, and sit
    at the step they were measured at: the trainer validates before step ``s + 1`` and logs it in that row, and once
    more after the last step, ``final``), seconds per step, and the monitor's warnings."""
    steps = [int(r["step"]) for r in rows]
    out: dict[str, Any] = {"step": steps}
    for key in dict.fromkeys((*keys, "val/success", "reward/mean", "reward/in_group_std", "success_rate")):
        raw = [r.get(key) for r in rows]
        out[key] = raw
        out[key + ":ema"] = raw if key.startswith("val/") else ema(raw)
    points = [[s - 1, r["val/success"]] for s, r in zip(steps, rows) if r.get("val/success") is not None]
    if final and final.get("val/success") is not None:
        points.append([max(steps, default=0), final["val/success"]])
    out["val_points"] = points
    cumulative, total = {0: 0.0}, 0.0
    for step, row in zip(steps, rows):
        total += float(row.get("optim/updates") or 1.0)
        cumulative[step] = total
    out["updates"] = [cumulative[s] for s in steps]
    out["val_points_updates"] = [[cumulative.get(x, x), v] for x, v in points]
    times = [r.get("time") for r in rows]
    out["seconds_per_step"] = [b - a for a, b in zip(times, times[1:]) if a is not None and b is not None]
    out["warnings"] = [{"step": int(r["step"]), "messages": r["warnings"]} for r in rows if r.get("warnings")]
    return out


def plot(experiment: Experiment, results: dict[str, Any], path: Path, title: str) -> None:
    """One panel per curve, one line per run (EMA-smoothed, raw points faint), open triangles where the Echo Trap
    monitor warned."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = experiment.curves
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False)
    for key_run, data in results["runs"].items():
        warned = {w["step"] for w in data["warnings"]}
        for ax, (key, label) in zip(axes[0], panels.items()):
            xs = data[experiment.x]
            raw = [(s, v) for s, v in zip(xs, data[key]) if v is not None and math.isfinite(v)]
            smooth = [(s, v) for s, v in zip(xs, data[key + ":ema"]) if v is not None]
            if key == "val/success":  # measured before each step's update, and after the last: not smoothed
                points = data.get("val_points_updates" if experiment.x == "updates" else "val_points", [])
                raw = smooth = [tuple(p) for p in points] or raw
            if not raw:
                continue
            (line,) = ax.plot(*zip(*smooth), linewidth=1.4, label=key_run)
            ax.plot(*zip(*raw), linestyle="none", marker="o", markersize=2, alpha=0.35, color=line.get_color())
            marks = [(x, v) for (x, v), s in zip(smooth, data["step"]) if s in warned]
            if marks:
                ax.plot(*zip(*marks), linestyle="none", marker="^", markersize=7, markerfacecolor="none",
                        color=line.get_color())  # fmt: skip
            ax.set_title(label, fontsize=10)
            ax.set_xlabel("update (optimizer step)" if experiment.x == "updates" else "step")
    if axes[0][0].get_legend_handles_labels()[0]:  # a panel no run logged (no validation) has nothing to name
        axes[0][0].legend(fontsize=6)
    fig.suptitle(f"{title}  (lines: EMA {EMA}; dots: raw; ^ = Echo Trap monitor warning)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    # through a temporary file renamed over the old figure: an interrupted save leaves the old one whole
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110)
        os.chmod(tmp, file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)


def _mean(values: list[Any], part: slice) -> str:
    kept = [v for v in values[part] if v is not None]
    return f"{sum(kept) / len(kept):.3f}" if kept else "-"


def summary_table(results: dict[str, Any]) -> str:
    """Markdown: per run, validation success (first, best, last), training reward and in-group std (first 3 and
    last 3 steps), split successes, first monitor warning."""
    splits = sorted({s for data in results["runs"].values() for s in data.get("splits", {})})
    header = ("| run | val success (first, best, last) | reward first 3 -> last 3 | in-group std first 3 -> last 3 | "
              + "".join(f"{s} | " for s in splits) + "first warning |")
    lines = [header, "|---" * (5 + len(splits)) + "|"]
    for name, data in results["runs"].items():
        val = [v for _, v in data.get("val_points", [])] or [v for v in data["val/success"] if v is not None]
        reward = data.get("reward/mean", [])
        std = data["reward/in_group_std"]
        cells = [f"{val[0]:.3f}, {max(val):.3f}, {val[-1]:.3f}" if val else "-",
                 f"{_mean(reward, slice(0, 3))} -> {_mean(reward, slice(-3, None))}",
                 f"{_mean(std, slice(0, 3))} -> {_mean(std, slice(-3, None))}"]  # fmt: skip
        cells += [f"{data['splits'][s]:.3f}" if s in data.get("splits", {}) else "-" for s in splits]
        cells.append(str(data["warnings"][0]["step"]) if data["warnings"] else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- estimates, the set
#: Costs on one GPU at the paper's scale before any run of the set has measured its own: env -> (seconds of rollout
#: per trajectory, seconds of scoring and update per kept trajectory). From the paper's Figure 7 (right panel: total
#: time on Sokoban with PPO, about 15,000 s for 200 steps with all 128 rollouts kept, on H100s: 75 s a step), split
#: half rollout, half update (an assumption: the figure shows keeping 25% saves about half the time); FrozenLake as
#: Sokoban (five turns), Bandit a fifth (one turn). Replaced, per env, by the set's own measurements as soon as one
#: of its runs has logged steps (:func:`measured_costs`).
PRIOR_COSTS: dict[str, tuple[float, float]] = {"sokoban": (37.5 / 128, 37.5 / 128),
                                               "frozenlake": (37.5 / 128, 37.5 / 128),
                                               "bandit": (7.5 / 128, 7.5 / 128)}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def measured_costs(runs_dir: Path) -> dict[str, tuple[float, float, str]]:
    """Per env, (rollout seconds per trajectory, scoring and update seconds per kept trajectory, source): medians over
    the logged steps (``time/rollout``, ``time/scoring``, ``time/update``) of the paper-scale runs in ``runs_dir``."""
    import yaml

    out: dict[str, tuple[float, float, str]] = {}
    for env in ENVS:
        rollout, update, steps = [], [], 0
        for metrics in sorted((runs_dir / "paper" / env).glob("*/metrics.jsonl")):
            config = metrics.parent / "config.yaml"
            data = yaml.safe_load(config.read_text()) if config.is_file() else {}
            batch = int(data.get("env_groups", 8)) * int(data.get("group_size", 16))
            for row in read_metrics(metrics):
                kept = float(row.get("filter/kept_trajectories") or 0)
                if "time/rollout" in row and kept > 0:
                    rollout.append(row["time/rollout"] / batch)
                    update.append((row.get("time/scoring", 0.0) + row.get("time/update", 0.0)) / kept)
                    steps += 1
        if steps:
            out[env] = (_median(rollout), _median(update), f"measured: {steps} steps in {runs_dir / 'paper' / env}")
    return out


def estimate_hours(cfg: Any, env: str, costs: dict[str, tuple[float, float, str]]) -> tuple[float, str]:
    """GPU-hours of a run: its steps' rollouts and kept trajectories, and its validations' rollouts, at the env's
    per-trajectory costs (measured, else :data:`PRIOR_COSTS`). Returns (GPU-hours, where the costs come from)."""
    if env in costs:
        per_rollout, per_kept, source = costs[env]
    else:
        (per_rollout, per_kept), source = PRIOR_COSTS[env], "prior: the paper's Figure 7 total time (PRIOR_COSTS)"
    rollouts = cfg.env_groups * cfg.group_size
    kept = cfg.kept_groups * cfg.group_size if cfg.filter_ratio < 1 else rollouts
    validations = cfg.total_steps // cfg.val_every + 1 if cfg.val_every else 0
    seconds = cfg.total_steps * (rollouts * per_rollout + kept * per_kept * cfg.ppo_epochs)
    seconds += validations * cfg.val_groups * per_rollout
    return seconds / 3600.0, source


def paper_runs() -> list[tuple[Experiment, Run]]:
    """Every run of every experiment, each once, in the order of the paper."""
    seen: set[str] = set()
    out = []
    for experiment in EXPERIMENTS.values():
        for run in experiment.runs():
            if run.key not in seen:
                seen.add(run.key)
                out.append((experiment, run))
    return out


def print_plan(items: list[tuple[Experiment, Run]], args: argparse.Namespace) -> float:
    """Print each run's configuration and estimated GPU-hours; the total."""
    costs = measured_costs(Path(args.runs))
    total = 0.0
    for experiment, run in items:
        cfg = run_config(run, "paper", Path(args.runs), model=args.model, seed=args.seed, engine=args.engine,
                         engine_url=args.engine_url,
                         allow_remote_engine=args.allow_remote_engine)  # fmt: skip
        hours, source = estimate_hours(cfg, run.env, costs)
        total += hours
        state = f"done ({cfg.output_dir})" if finished(Path(cfg.output_dir)) else f"to run in {cfg.output_dir}"
        changed = {k: v for k, v in run.changes.items()}
        print(f"- {run.key} [{experiment.name}; {run.source}] preset {run.preset} (reference {cfg.reference}) "
              f"{changed or ''}: {cfg.env_groups}x{cfg.group_size}, {cfg.total_steps} steps, val {cfg.val_groups} "
              f"every {cfg.val_every}, {cfg.max_new_tokens} tokens; {hours:.1f} GPU-h [{source}]; {state}",
              flush=True)  # fmt: skip
    print(f"total: {total:.0f} GPU-hours; in sequence on {args.gpus} GPU(s) per run, about {total / args.gpus:.0f} "
          "hours if the runs scale perfectly over them", flush=True)
    return total


# -------------------------------------------------------------------------------------------------------- commands
def experiment_runs(experiment: Experiment, env: str | None = None) -> list[Run]:
    """The experiment's runs, all moved to ``env`` when given (its design on another env; the generalisation splits
    belong to the original env's design and are dropped)."""
    runs = experiment.runs()
    if env is None:
        return runs
    moved = {f"{env}/{r.name}": dataclasses.replace(r, env=env, splits=()) for r in runs}
    return list(moved.values())


def run_experiment(experiment: Experiment, args: argparse.Namespace, only: tuple[str, ...] | None = None) -> dict:
    """Train (or read back) the experiment's runs at ``args.scale``, evaluate their splits, write JSON and PNG.

    The finished runs' records are checked first: a damaged one stops the experiment (:class:`RecordRefused`) before
    anything trains or is written."""
    runs = [r for r in experiment_runs(experiment, getattr(args, "env", None)) if only is None or r.key in only
            or r.name in only]  # fmt: skip
    configs = {run.key: run_config(run, args.scale, Path(args.runs), model=args.model, seed=args.seed,
                                   engine=args.engine, engine_url=args.engine_url,
                                   allow_remote_engine=args.allow_remote_engine) for run in runs}  # fmt: skip
    for run in runs:
        run_status(run, configs[run.key])
    results: dict[str, Any] = {"experiment": experiment.name, "paper": experiment.paper, "claim": experiment.claim,
                               "credit": experiment.credit, "paper_numbers": experiment.paper_numbers,
                               "scale": args.scale, "options": {"model": args.model, "seed": args.seed,
                                                                "engine": args.engine},
                               "curves": experiment.curves, "ema": EMA, "runs": {}, "sources": {}, "seconds": {},
                               "identity": {}}  # fmt: skip
    for i, run in enumerate(runs, 1):
        cfg = configs[run.key]
        print(f"== [{i}/{len(runs)}] {experiment.name}: {run.key} ({run.preset} {run.changes or ''}; {run.source}) "
              f"in {cfg.output_dir}", flush=True)  # fmt: skip
        started = time.perf_counter()
        rows = train(run, cfg, scale=args.scale, gpus=args.gpus, runs_dir=Path(args.runs))
        data = curves(rows, experiment.curves, final_validation(Path(cfg.output_dir)))
        if run.splits:
            data["splits"] = evaluate_splits(run, cfg, SPLIT_STATES[args.scale])
        results["runs"][run.key] = data
        results["sources"][run.key] = run.source
        results["seconds"][run.key] = round(time.perf_counter() - started, 1)
        identity = run_identity(cfg, args.scale)
        results["identity"][run.key] = {"id": identity_key(identity), "folder": cfg.output_dir, **identity}
    out = Path(args.out)
    tag = results_tag(experiment, args)
    write_results(experiment, results, out / f"{tag}.json", out / f"{tag}.png",
                  f"{experiment.paper}, {args.scale} scale")  # fmt: skip
    print()
    print(summary_table(results))
    print(f"\nwrote {out / (tag + '.json')} and {out / (tag + '.png')}", flush=True)
    return results


def results_tag(experiment: Experiment, args: argparse.Namespace) -> str:
    """The results' file name (no suffix): the experiment and scale, then ``--env``, and ``--seed``, ``--model`` and
    ``--engine`` where they are not the defaults, so that another setting never writes over the default's files."""
    tag = f"{experiment.name}-{args.scale}" + (f"-{args.env}" if getattr(args, "env", None) else "")
    if args.seed != 0:
        tag += f"-seed{args.seed}"
    default_model = PAPER_MODEL if args.scale == "paper" else CPU_SCALE["common"]["model"]
    if args.model and args.model != default_model:
        slug = re.sub(r"[^A-Za-z0-9.]+", "_", args.model).strip("_.")[:48] or "model"
        tag += f"-model-{slug}-{hashlib.sha256(args.model.encode()).hexdigest()[:6]}"
    if args.engine != "hf":
        tag += f"-{args.engine}"
    return tag


def write_results(experiment: Experiment, results: dict[str, Any], json_path: Path, png_path: Path,
                  title: str) -> None:
    """The figure, then the JSON, each written whole (a temporary file renamed into place); refused
    (:class:`RecordRefused`, nothing written) when a run has no steps, so good curves are never replaced by empty
    ones."""
    empty = [key for key, data in results["runs"].items() if not data.get("step")]
    if empty:
        raise RecordRefused(f"run(s) {', '.join(empty)} have no training steps to draw: {json_path} and {png_path} "
                            "are left as they are")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    plot(experiment, results, png_path, title)
    atomic_write_text(json_path, json.dumps(results, indent=1, default=str))


def list_experiments() -> None:
    for experiment in EXPERIMENTS.values():
        credit = " [ragen's extension]" if experiment.credit == "ragen" else ""
        print(f"{experiment.name}: {experiment.paper}{credit}\n  {experiment.claim}")
        for run in experiment.runs():
            print(f"    {run.key:<36} {run.preset:<18} {run.changes or ''}  <- {run.source}")
    print("not reproduced: " + "; ".join(f"{k}: {v}" for k, v in NOT_REPRODUCED.items()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", choices=["list", "paper", "cpu", *EXPERIMENTS],
                        help="an experiment, 'paper' (every experiment at the paper's scale), 'cpu' (the CPU set, "
                             "docs/reproduction.md) or 'list'")  # fmt: skip
    parser.add_argument("--scale", choices=["paper", "cpu"], default="paper")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per run at the paper's scale (accelerate launch)")
    parser.add_argument("--dry-run", action="store_true", help="print the runs, configs and GPU-hours; train nothing")
    parser.add_argument("--model", default=None, help="model (default: the scale's: Qwen2.5-0.5B-Instruct / smollm2)")
    parser.add_argument("--engine", default="hf", choices=["hf", "hf-generate", "vllm"])
    parser.add_argument("--engine-url", default="", help="vLLM server URL for --engine vllm")
    parser.add_argument("--allow-remote-engine", action="store_true",
                        help="accept an --engine-url on another machine (its development endpoints have no "
                             "authentication: keep it on a private network; docs/training.md, Security)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", default="runs/reproduce", help="folder of the training runs (default %(default)s)")
    parser.add_argument("--out", default="docs/reproduction", help="folder for the JSON and PNG (default %(default)s)")
    parser.add_argument("--only", nargs="*", default=None, help="only these runs (name or env/name)")
    parser.add_argument("--env", choices=sorted(ENVS), default=None,
                        help="run the experiment's design on this env instead (every run moves there)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command; exit 0, 1 (a run failed), 2 (bad arguments), 3 (a damaged record or a folder of another run:
    nothing written), 130 (interrupted: the same command resumes)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.gpus < 1:
        parser.error(f"invalid --gpus {args.gpus}: expected an int >= 1")
    try:
        return _main(args, parser)
    except ReproduceError as exc:
        if isinstance(exc, RunInterrupted):
            print(f"reproduce.py: interrupted; run the same command again to resume ({exc}; finished runs are read "
                  "back, the others resume from their checkpoint)", file=sys.stderr)
        else:
            print(f"reproduce.py: {'failed' if exc.status == EXIT_FAILED else 'stopped'}: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print("reproduce.py: interrupted; run the same command again to resume (finished runs are read back, the "
              "others resume from their checkpoint)", file=sys.stderr)
        return EXIT_INTERRUPTED


def check_settings(items: list[tuple[Experiment, Run]], args: argparse.Namespace, parser: argparse.ArgumentParser,
                   scale: str) -> None:
    """Every run's config with this command's ``--model``, ``--seed`` and ``--engine``, before anything trains: a bad
    value is a usage error (exit 2) naming it, not a traceback after hours of other runs."""
    try:
        for _, run in items:
            run_config(run, scale, Path(args.runs), model=args.model, seed=args.seed, engine=args.engine,
                       engine_url=args.engine_url,
                         allow_remote_engine=args.allow_remote_engine)  # fmt: skip
        if args.model and not args.dry_run:
            check_model_source(args.model)
    except ValueError as exc:
        parser.error(str(exc).replace("invalid config field model=", "invalid --model ", 1))


def _main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.target == "list":
        list_experiments()
        return 0
    if args.target == "paper":
        args.scale = "paper"
        items = paper_runs()
        check_settings(items, args, parser, "paper")
        print(f"the paper's experiments at its scale: {len(items)} runs, {len(EXPERIMENTS)} experiments; runs in "
              f"{args.runs}/paper (resumable: finished runs are read back, others resume from their checkpoint)")
        print_plan(items, args)
        if args.dry_run:
            return 0
        for experiment in EXPERIMENTS.values():
            run_experiment(experiment, args)
        return 0
    if args.target == "cpu":
        args.scale = "cpu"
        check_settings([(EXPERIMENTS[name], run) for name, keys in CPU_SET.items()
                        for run in EXPERIMENTS[name].runs() if run.key in keys], args, parser, "cpu")  # fmt: skip
        for name, keys in CPU_SET.items():
            run_experiment(EXPERIMENTS[name], args, keys)
        return 0
    experiment = EXPERIMENTS[args.target]
    if args.only:
        known = {r.key for r in experiment_runs(experiment, args.env)} | {r.name for r in experiment.runs()}
        unknown = sorted(set(args.only) - known)
        if unknown:
            parser.error(f"unknown run(s) {unknown}; this experiment has {sorted(known)}")
    chosen = [r for r in experiment_runs(experiment, args.env) if not args.only or r.key in args.only
              or r.name in args.only]  # fmt: skip
    check_settings([(experiment, r) for r in chosen], args, parser, args.scale)
    if args.dry_run:
        if args.scale == "paper":
            print_plan([(experiment, r) for r in chosen], args)
        else:
            for run in chosen:
                cfg = run_config(run, "cpu", Path(args.runs), model=args.model, seed=args.seed, engine=args.engine,
                                 engine_url=args.engine_url,
                         allow_remote_engine=args.allow_remote_engine)  # fmt: skip
                print(f"- {run.key}: {cfg.env_groups}x{cfg.group_size}, {cfg.total_steps} steps, {cfg.max_new_tokens} "
                      f"tokens, {cfg.kept_groups * cfg.group_size // cfg.ppo_mini_batch_size} update(s) a step, "
                      f"validation every {cfg.val_every}; {'done' if finished(Path(cfg.output_dir)) else 'to run'} "
                      f"in {cfg.output_dir}")  # fmt: skip
        return 0
    run_experiment(experiment, args, tuple(args.only) if args.only else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
