"""``ragen-trainer``: train StarPO / StarPO-S (``train``), list the presets (``presets``), and -- implemented in
:mod:`ragen_trainer.evaluation.cli` -- evaluate (``eval``) and merge results (``leaderboard``).

    ragen-trainer train --config starpo-s --env ragen/Bandit-v0 --model smollm2 --output_dir runs/bandit
    ragen-trainer train --config configs/quick/bandit-smollm2-cpu.yaml --filter_ratio 0.5 --set actor_lr=1e-5
    accelerate launch --num_processes 8 -m ragen_trainer.cli train --config starpo-s --deepspeed ds_zero2.json

Every :class:`~ragen_trainer.config.StarPOConfig` field is a flag (``--<field> value``; dashes work too), and
``--set field=value`` (repeatable) does the same. The whole config is checked before any model loads (the fields,
the env built once with its kwargs, the model folder or cached hub id, files such as ``--deepspeed``, the output
folder): a bad value exits with status 2 and names the field and what it accepts. ``--dry-run`` prints the resolved
config. Ctrl-C saves a checkpoint and exits with status 130; running the same command again resumes from it. A
changed config in an output folder that holds a run is refused (status 2, the differing fields listed) unless
``--resume`` (continue with the new config) or ``--overwrite`` (delete the old run and start over).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import threading
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Any, get_type_hints

import ragen_envs  # noqa: F401  (registers the ragen/* ids)
from ragen_envs.settings import ProtocolSettings
from ragen_trainer.checkpoints.folders import RunConflictError, check_output_folder
from ragen_trainer.checkpoints.publish import CheckpointSaveError
from ragen_trainer.config import (
    CHOICES,
    CONFIG_GROUPS,
    PRESETS,
    StarPOConfig,
    apply_overrides,
    field_kinds,
    load_config,
    parse_overrides,
)
from ragen_trainer.evaluation import cli as eval_cli
from ragen_trainer.host_memory import peak_rss_bytes
from ragen_trainer.models import ModelLoadError, check_model_source, load_model_and_tokenizer
from ragen_trainer.plotting import plot_runs

#: Exit status after Ctrl-C (the shell's convention for SIGINT).
EXIT_INTERRUPTED = 130
#: Exit status of a bad command line or config (argparse's convention).
EXIT_USAGE = 2
#: ``--resume`` given without a value: continue the run in output_dir even though its config changed.
_FORCE_RESUME = "force"
#: Most seconds the env check may take (WebShop starts its embedded server).
ENV_CHECK_TIMEOUT = 120.0

#: How ``--help`` names the value a flag takes, by the field's parsed type.
_KIND_NAMES: dict[type, str] = {bool: "true/false", int: "int", float: "float", str: "text", list: "list",
                                dict: "YAML mapping"}


def _default_text(f: Any) -> str:
    if f.default is not MISSING:
        return repr(f.default)
    if f.default_factory is not MISSING:  # type: ignore[misc]
        return repr(f.default_factory())  # type: ignore[misc]
    return "required"


def add_train_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``train`` options: ``--config``, shortcuts, one flag per config field, ``--set``, ``--dry-run``."""
    parser.add_argument("--config", default="starpo-s",
                        help=f"a preset ({', '.join(PRESETS)}) or a YAML file (default: starpo-s)")
    parser.add_argument("--env", dest="env_shortcut", default=None, metavar="ENV_ID",
                        help="shortcut for --env_id (e.g. ragen/Sokoban-v0)")
    parser.add_argument("--set", dest="set_pairs", action="append", default=[], metavar="FIELD=VALUE",
                        help="override any config field (repeatable), e.g. --set filter_ratio=0.5")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved, validated config and exit")
    parser.add_argument("--overwrite", action="store_true",
                        help="the output folder holds a run: delete that run's checkpoints, metrics and summary and "
                             "start over (the same as --resume false)")
    kinds = field_kinds()
    by_name = {f.name: f for f in fields(StarPOConfig)}
    for banner, names in CONFIG_GROUPS.items():  # one group per part of the config, in the config's order
        group = parser.add_argument_group(banner)
        for name in names:
            _add_field_argument(group, by_name[name], kinds[name])
    protocol = parser.add_argument_group(
        "turn-protocol settings (fields of the config's `protocol`; default: the env id's reference values)")
    protocol_hints = get_type_hints(ProtocolSettings)
    for f in fields(ProtocolSettings):
        protocol.add_argument(*_flag_names(f.name), dest=f"field__{f.name}", default=None,
                              metavar=_KIND_NAMES.get(protocol_hints[f.name], "VALUE"), help=f.metadata.get("help", ""))
    return parser


def _flag_names(name: str) -> list[str]:
    """``--name``, and ``--name-with-dashes`` for a name with underscores (as HfArgumentParser accepts)."""
    return [f"--{name}", f"--{name.replace('_', '-')}"] if "_" in name else [f"--{name}"]


def _add_field_argument(group: argparse._ArgumentGroup, f: Field[Any], kind: type) -> None:
    """The flag of config field ``f`` (parsed type ``kind``): its help and its default as ``--help`` shows them."""
    if f.name == "resume":  # a bare --resume also says: continue even though the config changed
        group.add_argument(*_flag_names(f.name), dest=f"field__{f.name}", default=None, nargs="?",
                           const=_FORCE_RESUME, metavar="true/false",
                           help="--resume alone: continue the run in output_dir even if its config differs "
                                "from this one (fields listed as a warning). --resume true (the default): continue "
                                "a run whose config matches, refuse a changed one. --resume false: start over, "
                                "like --overwrite.")
        return
    extra = f"; one of {list(CHOICES[f.name])}" if f.name in CHOICES else ""
    # A list field takes its items as separate words, as HfArgumentParser does (--report_to jsonl tensorboard);
    # one word is still read as YAML or comma-separated text (--report_to jsonl,tensorboard).
    group.add_argument(*_flag_names(f.name), dest=f"field__{f.name}", default=None,
                       metavar=_KIND_NAMES.get(kind, "VALUE"), nargs="+" if kind is list else None,
                       help=f"{f.metadata.get('help', '')} (default: {_default_text(f)}{extra})")


def resolve_config(args: argparse.Namespace) -> StarPOConfig:
    """The config the ``train`` arguments describe: preset/YAML, then flags, then ``--set``; validated."""
    cfg = load_config(args.config)
    changes: dict[str, Any] = {}
    if args.env_shortcut:
        changes["env_id"] = args.env_shortcut
    for key, value in vars(args).items():
        if key.startswith("field__") and value is not None:
            if isinstance(value, list) and len(value) == 1:  # one word of a list field: parsed as text
                value = value[0]
            changes[key[len("field__"):]] = "true" if value == _FORCE_RESUME else value
    changes.update(parse_overrides(args.set_pairs))
    return apply_overrides(cfg, changes).validate()


def run_train(args: argparse.Namespace) -> int:
    force_resume = getattr(args, "field__resume", None) == _FORCE_RESUME
    overwrite = bool(getattr(args, "overwrite", False))
    try:
        if force_resume and overwrite:
            raise ValueError("invalid arguments --resume and --overwrite: choose one (--resume continues the run in "
                             "output_dir with this config, --overwrite deletes it and starts over)")
        cfg = resolve_config(args)
        if not args.dry_run:
            preflight(cfg, force_resume=force_resume, overwrite=overwrite)
    except ValueError as exc:
        print(f"ragen-trainer train: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        print(cfg.to_yaml(), end="")
        return 0
    return train_from_config(cfg, force_resume=force_resume, overwrite=overwrite)


# ------------------------------------------------------------------------------------------ checks before loading
def preflight(cfg: StarPOConfig, *, force_resume: bool = False, overwrite: bool = False) -> None:
    """Everything that can be checked about a validated config without loading a model; raise ``ValueError``
    naming the field and what it accepts. Takes a second or two (the env is built once; WebShop starts its server).

    Checked: the output folder (not a file, writable, and its run compatible: see
    :func:`ragen_trainer.checkpoints.folders.check_output_folder`), the model
    (:func:`ragen_trainer.models.check_model_source`), ``deepspeed`` (an existing JSON file, the package installed),
    ``report_to`` and LoRA packages, ``dtype`` against the hardware, and the env (``gymnasium.make(env_id,
    **env_make_kwargs)``, one ``reset``, ``close``).
    """
    check_output_dir(cfg.output_dir)
    check_output_folder(cfg, force_resume=force_resume, overwrite=overwrite)
    check_model_source(cfg.model)
    if cfg.deepspeed:
        check_deepspeed(cfg.deepspeed)
    packages = {"tensorboard": ("report_to", "tensorboard"), "wandb": ("report_to", "wandb")}
    for name in cfg.report_to:
        if name in packages:
            _need_package(packages[name][1], "report_to", cfg.report_to, f"the {name} package (pip install {name})")
    if cfg.lora_rank > 0:
        _need_package("peft", "lora_rank", cfg.lora_rank, "the peft package for LoRA (pip install peft), or 0")
    if cfg.dtype in ("float16", "bfloat16"):
        import torch

        if cfg.dtype == "float16" and not torch.cuda.is_available():
            raise ValueError(f"invalid config field dtype={cfg.dtype!r}: float16 training needs a CUDA GPU and none "
                             "is available; expected 'auto', 'float32' or 'bfloat16' here")
    check_env(cfg)


def check_output_dir(output_dir: str) -> None:
    """``output_dir`` is a folder, or can be created: not a file, and its nearest existing parent is writable."""
    path = Path(output_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"invalid config field output_dir={output_dir!r}: it is a file; expected a folder (new, or "
                         "holding a run to resume)")
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"invalid config field output_dir={output_dir!r}: {probe} is a file, so the folder cannot "
                         "be created")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"invalid config field output_dir={output_dir!r}: {probe} is not writable")


def check_deepspeed(path: str) -> None:
    """``deepspeed`` names an existing JSON file with an object in it, and the deepspeed package is installed."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"invalid config field deepspeed={path!r}: no such file; expected the path of a DeepSpeed "
                         "config JSON (see docs/training.md), or '' for none")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"invalid config field deepspeed={path!r}: not a JSON file ({str(exc)[:80]})") from None
    if not isinstance(data, dict):
        raise ValueError(  # noqa: TRY004  (a bad value of a field: every config error is a ValueError)
            f"invalid config field deepspeed={path!r}: expected a JSON object (a DeepSpeed config)")
    _need_package("deepspeed", "deepspeed", path, "the deepspeed package (pip install deepspeed), or '' for none")


def check_env(cfg: StarPOConfig, timeout: float = ENV_CHECK_TIMEOUT) -> None:
    """Build the env once as training will (``gymnasium.make(env_id, **env_make_kwargs())``), reset it, close it;
    a failure is a ``ValueError`` naming ``env_kwargs`` (or ``env_id``) and the env's own message."""
    import gymnasium as gym

    failure: list[BaseException] = []

    def build() -> None:
        try:
            env = gym.make(cfg.env_id, **cfg.env_make_kwargs())
            try:
                env.reset(seed=0)
            finally:
                env.close()
        except BaseException as exc:  # noqa: BLE001  (anything the env raises is reported, not a traceback)
            failure.append(exc)

    worker = threading.Thread(target=build, name="ragen-env-check", daemon=True)
    worker.start()
    worker.join(timeout)
    field = "env_kwargs" if cfg.env_kwargs else "env_id"
    value = cfg.env_kwargs if cfg.env_kwargs else cfg.env_id
    if worker.is_alive():
        raise ValueError(f"invalid config field {field}={value!r}: building {cfg.env_id} did not finish in "
                         f"{timeout:.0f} s")
    if failure:
        exc = failure[0]
        text = str(exc).split(" was raised from the environment creator")[0]
        raise ValueError(f"invalid config field {field}={value!r}: gymnasium.make({cfg.env_id!r}, ...) failed: "
                         f"{type(exc).__name__}: {text}; expected keyword arguments that {cfg.env_id} "
                         "accepts") from None


def _need_package(package: str, name: str, value: Any, allowed: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise ValueError(f"invalid config field {name}={value!r}: needs {allowed}, which is not installed")


def train_from_config(cfg: StarPOConfig, *, force_resume: bool = False, overwrite: bool = False) -> int:
    """Load the model, build the trainer, train; returns the exit status (0; 130 after Ctrl-C; 1 when the disk filled
    up during a save).

    ``force_resume`` / ``overwrite`` are ``--resume`` / ``--overwrite`` (see :meth:`StarPOTrainer.train`)."""
    # The training stack (torch, transformers, accelerate: seconds to import) loads when a run starts, so that
    # ``--help``, ``presets`` and a bad config answer at once. The only function-local import of the project in the
    # trainer (tests/test_layers.py allows it by name).
    from ragen_trainer.distributed import make_accelerator
    from ragen_trainer.precision import compute_dtype
    from ragen_trainer.trainer import StarPOTrainer

    try:  # first: the processes' state (DDP, DeepSpeed, gloo on CPUs) is made once, and the model's device comes from it
        state = make_accelerator(cfg)
    except ValueError as exc:
        print(f"ragen-trainer train: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    device = state.device
    note = cpu_scale_note(cfg) if device.type == "cpu" and state.is_main_process else None
    if note:
        print(note, file=sys.stderr)
    try:  # the trained weights are stored in master_dtype (float32: the reference's fp32 master weights)
        model, tokenizer = load_model_and_tokenizer(cfg.model, dtype=cfg.master_dtype, device=device,
                                                    lora=cfg.lora_settings())
    except ModelLoadError as exc:  # e.g. a cached hub id whose weights are missing: the check cannot see that
        print(f"ragen-trainer train: error: invalid config field model={cfg.model!r}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        if cfg.lora_rank > 0 and "target" in str(exc).lower():  # peft: a module name the model does not have
            print(f"ragen-trainer train: error: invalid config field lora_target_modules="
                  f"{cfg.lora_target_modules!r}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        raise
    ref_model = None
    if cfg.kl_coef > 0 or cfg.kl_reward_coef > 0:  # the frozen reference, as loaded even on resume; never updated
        ref_model, _ = load_model_and_tokenizer(cfg.model, dtype=compute_dtype(cfg.dtype, device), device=device)
    trainer = StarPOTrainer(cfg, model, tokenizer, ref_model=ref_model, accelerator=state)
    try:
        result = trainer.train(force_resume=force_resume, overwrite=overwrite)
    except (RunConflictError, ValueError) as exc:  # the output folder changed, or its checkpoint does not fit
        print(f"ragen-trainer train: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CheckpointSaveError as exc:
        print(f"ragen-trainer train: error: {exc}", file=sys.stderr)
        return 1
    if state.is_main_process:
        if result.finished_before:
            print(f"the run in {cfg.output_dir} already finished its {result.global_step} steps: nothing to do "
                  f"(model in {result.final_model}); pass a larger --total_steps to continue it, or --overwrite to "
                  "start over", file=sys.stderr)
        elif result.interrupted and result.checkpoint is None:
            print("interrupted before the first step finished: nothing to save; run the same command again to "
                  "start", file=sys.stderr)
        elif result.interrupted:
            print(f"interrupted at step {result.global_step}: checkpoint saved to {result.checkpoint}; run the same "
                  "command again to resume", file=sys.stderr)
        else:
            val = result.metrics.get("val/success")
            val_text = f", validation success {100 * val:.1f}%" if val is not None else ""
            print(f"done: {result.global_step} steps{val_text}, peak memory {peak_rss_bytes() / 1e9:.1f} GB; model "
                  f"in {result.final_model}; summary in {cfg.output_dir}/summary.json", file=sys.stderr)
    return EXIT_INTERRUPTED if result.interrupted else 0


#: Tokens a run may generate before a CPU user is pointed at the small CPU config (that config generates at most
#: 4 x 8 x 16 x 30 = 15,360; the paper's Bandit run 8 x 16 x 400 x 200 = 10.2 million).
CPU_TOKEN_BUDGET = 1_000_000
QUICK_CPU_CONFIG = "configs/quick/bandit-smollm2-cpu.yaml"


def cpu_scale_note(cfg: StarPOConfig) -> str | None:
    """A note for a run on a CPU that generates more than :data:`CPU_TOKEN_BUDGET` tokens (rollouts only, at most):
    the paper's settings are sized for GPUs, and the small CPU config is named. ``None`` for smaller runs."""
    turns = cfg.protocol_settings().max_turns
    tokens = cfg.env_groups * cfg.group_size * turns * cfg.max_new_tokens * cfg.total_steps
    if tokens <= CPU_TOKEN_BUDGET:
        return None
    return (f"note: no GPU. This run generates up to {tokens:,} tokens ({cfg.env_groups} x {cfg.group_size} rollouts x "
            f"{turns} turn(s) x {cfg.max_new_tokens} tokens x {cfg.total_steps} steps), plus validation: the paper's "
            f"scale, sized for GPUs, which takes hours on a CPU. A small run for a CPU (30 steps of 4 x 8 rollouts of "
            f"16 tokens): ragen-trainer train --config {QUICK_CPU_CONFIG}")  # fmt: skip


def run_presets(args: argparse.Namespace) -> int:
    width = max(len(n) for n in PRESETS)
    for name, (description, changes) in PRESETS.items():
        diff = ", ".join(f"{k}={v}" for k, v in changes.items()) or "(the defaults)"
        print(f"{name:<{width}}  {description}\n{'':<{width}}  {diff}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragen-trainer",
        description="StarPO / StarPO-S training of LLM agents on ragen's text envs (RAGEN, arXiv 2504.20073).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,presets,eval,leaderboard,plot}")
    train = sub.add_parser("train", help="train a model with StarPO / StarPO-S",
                           usage="ragen-trainer train [--config PRESET|YAML] [--env ENV_ID] [--model MODEL] "
                                 "[--<field> VALUE ...] [--set FIELD=VALUE ...] [--resume | --overwrite] [--dry-run]",
                           description="Train with StarPO / StarPO-S. The output folder gets config.yaml, "
                                       "metrics.jsonl, checkpoint-N/ (Hugging Face format), final/ and summary.json. "
                                       "Every StarPOConfig field is a flag, below in one group per part of the "
                                       "config (see docs/training.md).")
    add_train_arguments(train)
    train.set_defaults(func=run_train)
    presets = sub.add_parser("presets", help="list the named configs")
    presets.set_defaults(func=run_presets)

    ev = sub.add_parser("eval", help=eval_cli.EVAL_DESCRIPTION, description=eval_cli.EVAL_DESCRIPTION)
    eval_cli.add_eval_arguments(ev)
    ev.set_defaults(func=eval_cli.run_eval)
    lb = sub.add_parser("leaderboard", help=eval_cli.LEADERBOARD_DESCRIPTION,
                        description=eval_cli.LEADERBOARD_DESCRIPTION)
    eval_cli.add_leaderboard_arguments(lb)
    lb.set_defaults(func=eval_cli.run_leaderboard)
    plot = sub.add_parser("plot", help="draw training curves of runs (several seeds: mean and band)",
                          description=PLOT_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    plot.add_argument("runs", nargs="+", metavar="RUN",
                      help="a run folder (with metrics.jsonl), or a folder of run folders of one configuration (seeds)")
    plot.add_argument("-o", "--output", required=True, metavar="FILE", help="the figure: .png, .pdf or .svg")
    plot.add_argument("--labels", nargs="+", metavar="LABEL", help="one legend label per RUN (default: folder names)")
    plot.add_argument("--title", default=None, help="a title above the panels")
    plot.set_defaults(func=run_plot)
    return parser


PLOT_DESCRIPTION = """Draw the curves a researcher looks at first: training and validation success (every
validation split), mean reward and in-group reward std, reply entropy and gradient norm.

Each RUN is one configuration, in its own colour: a run folder, or a folder whose sub-folders are runs of the same
settings with different seeds (their mean is drawn, with a band of one standard deviation).

    ragen-trainer plot runs/starpo-s -o curves.png
    ragen-trainer plot runs/sweep/lr5e-05 runs/sweep/lr1e-05 -o lr.png --labels "lr 5e-5" "lr 1e-5"
"""


def run_plot(args: argparse.Namespace) -> int:
    """``ragen-trainer plot``: exit 0 with the figure's path, 2 with a message for bad arguments."""
    try:
        path = plot_runs(args.runs, args.output, labels=args.labels, title=args.title)
    except ValueError as exc:
        print(f"ragen-trainer plot: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({len(args.runs)} configuration(s))")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
