"""``ragen-trainer``: train StarPO / StarPO-S (``train``), list the presets (``presets``), and -- implemented in
:mod:`ragen_trainer.evaluation.cli` -- evaluate (``eval``) and merge results (``leaderboard``).

    ragen-trainer train --config starpo-s --env ragen/Bandit-v0 --model smollm2 --output_dir runs/bandit
    ragen-trainer train --config configs/sokoban/starpo-s.yaml --filter_ratio 0.5 --set actor_lr=1e-5
    accelerate launch --num_processes 8 -m ragen_trainer.cli train --config starpo-s --deepspeed ds_zero2.json

Every :class:`~ragen_trainer.config.StarPOConfig` field is a flag (``--<field> value``; dashes work too), and
``--set field=value`` (repeatable) does the same. The config is resolved and validated before any model loads: a
bad value exits with status 2 and names the field and the allowed values. ``--dry-run`` prints the resolved config.
Ctrl-C saves a checkpoint and exits with status 130; running the same command again resumes from it.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields
from typing import Any, get_type_hints

from ragen_envs.settings import ProtocolSettings
from ragen_trainer.config import CHOICES, PRESETS, StarPOConfig, apply_overrides, load_config, parse_overrides

#: Exit status after Ctrl-C (the shell's convention for SIGINT).
EXIT_INTERRUPTED = 130

# The evaluation engineer's module provides these (see ragen_trainer/evaluation/cli.py); the trainer's CLI only
# dispatches to them, so `eval` and `leaderboard` evolve without touching this file.
_EVAL_HOOKS = ("add_eval_arguments", "run_eval", "add_leaderboard_arguments", "run_leaderboard")


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
    group = parser.add_argument_group("config fields (every StarPOConfig field; see docs/training.md)")
    hints = get_type_hints(StarPOConfig)
    kind_name = {bool: "true/false", int: "int", float: "float", str: "text", list: "list", dict: "YAML mapping"}
    for f in fields(StarPOConfig):
        kind = hints[f.name]
        extra = f"; one of {list(CHOICES[f.name])}" if f.name in CHOICES else ""
        names = [f"--{f.name}"]
        if "_" in f.name:
            names.append(f"--{f.name.replace('_', '-')}")
        group.add_argument(*names, dest=f"field__{f.name}", default=None, metavar=kind_name.get(kind, "VALUE"),
                           help=f"{f.metadata.get('help', '')} (default: {_default_text(f)}{extra})")
    protocol = parser.add_argument_group(
        "turn-protocol settings (fields of the config's `protocol`; default: the env id's reference values)")
    protocol_hints = get_type_hints(ProtocolSettings)
    for f in fields(ProtocolSettings):
        names = [f"--{f.name}"]
        if "_" in f.name:
            names.append(f"--{f.name.replace('_', '-')}")
        protocol.add_argument(*names, dest=f"field__{f.name}", default=None,
                              metavar=kind_name.get(protocol_hints[f.name], "VALUE"), help=f.metadata.get("help", ""))
    return parser


def resolve_config(args: argparse.Namespace) -> StarPOConfig:
    """The config the ``train`` arguments describe: preset/YAML, then flags, then ``--set``; validated."""
    cfg = load_config(args.config)
    changes: dict[str, Any] = {}
    if args.env_shortcut:
        changes["env_id"] = args.env_shortcut
    for key, value in vars(args).items():
        if key.startswith("field__") and value is not None:
            changes[key[len("field__"):]] = value
    changes.update(parse_overrides(args.set_pairs))
    return apply_overrides(cfg, changes).validate()


def run_train(args: argparse.Namespace) -> int:
    try:
        cfg = resolve_config(args)
    except ValueError as exc:
        print(f"ragen-trainer train: error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(cfg.to_yaml(), end="")
        return 0
    return train_from_config(cfg)


def train_from_config(cfg: StarPOConfig) -> int:
    """Load the model, build the trainer, train; returns the exit status (0, or 130 after Ctrl-C)."""
    from accelerate import PartialState

    from ragen_trainer.models import load_model_and_tokenizer
    from ragen_trainer.trainer import StarPOTrainer

    state = PartialState()
    device = state.device
    model, tokenizer = load_model_and_tokenizer(cfg.model, dtype=cfg.dtype, device=device, lora=cfg.lora_settings())
    ref_model = None
    if cfg.kl_coef > 0 or cfg.kl_reward_coef > 0:  # the reference is the model as loaded, even on resume
        ref_model, _ = load_model_and_tokenizer(cfg.model, dtype=cfg.dtype, device=device)
    engine = None
    if cfg.engine == "vllm":
        from ragen_trainer.engines import VLLMEngine

        engine = VLLMEngine(cfg.model, tokenizer, mode="server", base_url=cfg.engine_url)
    trainer = StarPOTrainer(cfg, model, tokenizer, engine=engine, ref_model=ref_model)
    result = trainer.train()
    if state.is_main_process:
        if result.interrupted:
            where = result.checkpoint or "(no step had finished: nothing to save)"
            print(f"interrupted at step {result.global_step}: checkpoint saved to {where}; run the same command "
                  f"again to resume", file=sys.stderr)
        else:
            val = result.metrics.get("val/success")
            val_text = f", validation success {100 * val:.1f}%" if val is not None else ""
            print(f"done: {result.global_step} steps{val_text}; model in {result.final_model}; "
                  f"summary in {cfg.output_dir}/summary.json", file=sys.stderr)
    return EXIT_INTERRUPTED if result.interrupted else 0


def run_presets(args: argparse.Namespace) -> int:
    width = max(len(n) for n in PRESETS)
    for name, (description, changes) in PRESETS.items():
        diff = ", ".join(f"{k}={v}" for k, v in changes.items()) or "(the defaults)"
        print(f"{name:<{width}}  {description}\n{'':<{width}}  {diff}")
    return 0


def _evaluation_module() -> Any:
    try:
        from ragen_trainer.evaluation import cli as eval_cli
    except ImportError:
        return None
    return eval_cli if all(hasattr(eval_cli, name) for name in _EVAL_HOOKS) else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragen-trainer",
        description="StarPO / StarPO-S training of LLM agents on ragen's text envs (RAGEN, arXiv 2504.20073).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,presets,eval,leaderboard}")
    train = sub.add_parser("train", help="train a model with StarPO / StarPO-S",
                           usage="ragen-trainer train [--config PRESET|YAML] [--env ENV_ID] [--model MODEL] "
                                 "[--<field> VALUE ...] [--set FIELD=VALUE ...] [--dry-run]",
                           description="Train with StarPO / StarPO-S. The output folder gets config.yaml, "
                                       "metrics.jsonl, checkpoint-N/ (Hugging Face format), final/ and summary.json.")
    add_train_arguments(train)
    train.set_defaults(func=run_train)
    presets = sub.add_parser("presets", help="list the named configs")
    presets.set_defaults(func=run_presets)

    eval_cli = _evaluation_module()
    if eval_cli is not None:
        ev = sub.add_parser("eval", help=getattr(eval_cli, "EVAL_DESCRIPTION", "evaluate an agent"),
                            description=getattr(eval_cli, "EVAL_DESCRIPTION", None))
        eval_cli.add_eval_arguments(ev)
        ev.set_defaults(func=eval_cli.run_eval)
        lb = sub.add_parser("leaderboard", help=getattr(eval_cli, "LEADERBOARD_DESCRIPTION", "merge results"),
                            description=getattr(eval_cli, "LEADERBOARD_DESCRIPTION", None))
        eval_cli.add_leaderboard_arguments(lb)
        lb.set_defaults(func=eval_cli.run_leaderboard)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
