"""Deciding what to do with a run's ``output_dir``: a new run, the same run continued, or one started over.

* :func:`check_output_folder` compares the config with the folder's (a changed config is refused unless ``--resume``
  or ``--overwrite``); nothing is written there.
* :func:`plan_run_folder` then cleans the folder (what an unfinished save left; checkpoints that fail
  :func:`~ragen_trainer.checkpoints.verify.checkpoint_problems` are renamed ``broken-checkpoint-N``, with a warning)
  and chooses the checkpoint to resume from. Nothing of the run's record (``config.yaml``) is rewritten here: the
  trainer writes it once the resume has been loaded, so a failed resume leaves the folder as it was.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragen_trainer.checkpoints.layout import (
    BROKEN_PREFIX,
    holds_run,
    list_checkpoints,
    read_checkpoint_info,
    run_files,
    unfinished_saves,
)
from ragen_trainer.checkpoints.publish import free_name
from ragen_trainer.checkpoints.verify import checkpoint_problems, newest_good_checkpoint
from ragen_trainer.config import RESUME_SAFE_FIELDS, StarPOConfig, config_differences, short_repr
from ragen_trainer.safe_yaml import load_yaml_file

logger = logging.getLogger(__name__)

class RunConflictError(ValueError):
    """``output_dir`` holds a run that this config may not continue (:func:`check_output_folder` says why)."""


@dataclass
class FolderPlan:
    """What :func:`check_output_folder` decided for ``output_dir``."""

    action: str
    """``"new"`` (nothing to continue), ``"continue"`` (resume the run there), ``"overwrite"`` (remove the old run's
    files, then start over)."""
    differences: list[tuple[str, Any, Any]] = field(default_factory=list)
    """``(field, old value, new value)`` of the fields that changed (only with ``force_resume``)."""
    compared_with: str | None = None
    """The file the config was compared with."""


def check_output_folder(cfg: StarPOConfig, *, force_resume: bool = False, overwrite: bool = False) -> FolderPlan:
    """Decide what to do with ``cfg.output_dir``; raise :class:`RunConflictError` for a changed config.

    * nothing there (or only files that are not a run's): a new run;
    * ``overwrite`` (``--overwrite``), or ``cfg.resume`` false: start over (the caller removes :func:`run_files`);
    * a run whose config equals ``cfg`` in every field but :data:`RESUME_SAFE_FIELDS`: continue it;
    * a run with another config: ``RunConflictError`` listing the differing fields, unless ``force_resume``
      (``--resume``), which continues it with the new config.

    The folder's config is its ``config.yaml`` (the config of the last accepted run there), else the newest
    checkpoint's. Nothing is written here.
    """
    out = Path(cfg.output_dir)
    if force_resume and overwrite:
        raise ValueError("invalid arguments --resume and --overwrite: choose one (continue the run in output_dir, or "
                         "delete it and start over)")
    if out.exists() and not out.is_dir():
        raise ValueError(f"invalid config field output_dir={cfg.output_dir!r}: a file is in the way; expected a "
                         "folder (new or holding a run)")
    if not holds_run(out):
        return FolderPlan("new")
    if overwrite or not cfg.resume:
        return FolderPlan("overwrite")
    stored, source = _stored_config(out)
    if stored is None:
        return FolderPlan("continue")
    diffs = config_differences(stored, cfg)
    if diffs and not force_resume:
        lines = "\n".join(f"  {name}: {short_repr(old)} -> {short_repr(new)}" for name, old, new in diffs)
        raise RunConflictError(
            f"invalid config field output_dir={cfg.output_dir!r}: it holds a run with another config ({source}); "
            f"{len(diffs)} field(s) differ:\n{lines}\n"
            "Rerun with --resume to continue that run with the new config, with --overwrite to delete it and start "
            "over, or choose another --output_dir. (Fields that may change freely: "
            f"{', '.join(sorted(RESUME_SAFE_FIELDS))}.)"
        )
    return FolderPlan("continue", diffs, source)


def _stored_config(out: Path) -> tuple[dict[str, Any] | None, str | None]:
    path = out / "config.yaml"
    if path.is_file():
        try:
            data = load_yaml_file(path, "config file")
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict):
            return data, str(path)
    for _, folder in reversed(list_checkpoints(out)):
        info = read_checkpoint_info(folder).get("config")
        if isinstance(info, dict):
            return info, str(folder)
    return None, None



@dataclass
class RunFolder:
    """What :func:`plan_run_folder` decided for ``output_dir``."""

    plan: FolderPlan
    checkpoint: str | None
    """The checkpoint to resume from (``None``: the initial model)."""
    skipped: dict[str, list[str]] = field(default_factory=dict)
    """Checkpoints newer than ``checkpoint`` that failed verification (renamed ``broken-checkpoint-N``), each with
    what was wrong."""


def plan_run_folder(cfg: StarPOConfig, *, explicit: str | None, main: bool, force_resume: bool = False,
                    overwrite: bool = False) -> RunFolder:
    """Check ``cfg.output_dir`` against the config, clean it, and choose the checkpoint to resume from.

    Every process calls this (so all raise alike); only the ``main`` one changes files: it removes an old run
    (``overwrite``), leftovers of saves that never finished, and renames checkpoints that fail verification to
    ``broken-checkpoint-N``. ``explicit`` names a checkpoint folder to start from, which must verify.
    """
    out_dir = Path(cfg.output_dir)
    if explicit is not None:
        problems = checkpoint_problems(explicit)
        if problems:
            raise ValueError(f"invalid argument resume_from_checkpoint={explicit!r}: the checkpoint is not whole: "
                             f"{'; '.join(problems)}")
        plan = FolderPlan("continue")
    else:
        plan = check_output_folder(cfg, force_resume=force_resume, overwrite=overwrite)
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
                target = free_name(folder.parent / (BROKEN_PREFIX + folder.name))
                os.replace(folder, target)
                logger.warning("warning: checkpoint %s is not whole (%s): skipped, renamed to %s", folder,
                               "; ".join(problems), target.name)
            if bad:
                logger.warning("warning: resuming from %s instead", good if good is not None else
                               "the initial model (no whole checkpoint left)")
    if explicit is not None:
        checkpoint: str | None = explicit
    elif plan.action == "continue":
        good, _ = newest_good_checkpoint(out_dir)
        checkpoint = str(good) if good is not None else None
    else:
        checkpoint = None
    return RunFolder(plan=plan, checkpoint=checkpoint, skipped=skipped)
