"""A checkpoint's training state, written and read back: what resuming needs besides the weights.

:func:`write_training_state` writes the optimizer's and the schedule's states (``torch.save`` of tensors and plain
data), the step and the histories (``trainer_state.json``), the Echo Trap monitor's state and, for every process,
its random generators (:mod:`~ragen_trainer.checkpoints.rng`). :func:`read_training_state` reads and checks every one
of those files before anything is loaded (a refused file leaves the trainer as it was): torch files go through
torch's restricted unpickler, never a pickle that names code. :func:`load_policy_weights` loads a checkpoint's
weights into a model in place.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ragen_trainer.checkpoints.layout import (
    MONITOR_FILE,
    OPTIMIZER_FILE,
    RNG_STATE_FILE,
    SCHEDULER_FILE,
    TRAINER_STATE_FILE,
    legacy_rng_files,
    read_trainer_state,
    rng_state_name,
)
from ragen_trainer.checkpoints.rng import capture_rng_state, read_rng_state
from ragen_trainer.fileio import atomic_write_json

logger = logging.getLogger(__name__)


@dataclass
class SavedTrainingState:
    """What :func:`read_training_state` read from a checkpoint, checked, ready to load."""

    trainer_state: dict[str, Any]
    """``trainer_state.json``: ``global_step``, ``optimizer_steps``, ``world_size``, ``val_history``, ..."""
    scheduler: Any
    """The learning-rate schedule's state dict."""
    optimizer: Any | None
    """The optimizer's state dict (``None`` under DeepSpeed, which restores its own partitions)."""
    rng: tuple[dict[str, Any], str] | None
    """This process's RNG state and its file (``None``: none to restore, with a warning)."""
    monitor: dict[str, Any] | None
    """The Echo Trap monitor's state (``None``: the checkpoint holds none)."""


def write_training_state(folder: str | os.PathLike[str], *, trainer_state: dict[str, Any],
                         monitor_state: dict[str, Any], scheduler_state: Any, optimizer_state: Any | None) -> None:
    """The main process's part of a checkpoint's training state (``optimizer_state`` ``None``: DeepSpeed saved its
    own). JSON where it can be: only the optimizer's and schedule's tensors go through ``torch.save``."""
    folder = os.fspath(folder)
    if optimizer_state is not None:
        torch.save(optimizer_state, os.path.join(folder, OPTIMIZER_FILE))
    torch.save(scheduler_state, os.path.join(folder, SCHEDULER_FILE))
    atomic_write_json(os.path.join(folder, TRAINER_STATE_FILE), trainer_state, indent=1)
    # The Echo Trap monitor judges trends (a std cliff against its recent peak): a resumed run needs them.
    atomic_write_json(os.path.join(folder, MONITOR_FILE), monitor_state, indent=None)


def write_rng_state(folder: str | os.PathLike[str], rank: int | None) -> None:
    """This process's random generators (``rank`` ``None``: a run of one process). JSON, not ``torch.save``: a
    pickle in the run folder would run code when a resume reads it."""
    atomic_write_json(os.path.join(os.fspath(folder), rng_state_name(rank)), capture_rng_state(), indent=None)


def read_training_state(folder: str | os.PathLike[str], *, optimizer: bool, rank: int,
                        main: bool) -> SavedTrainingState:
    """Read and check every training-state file of checkpoint ``folder`` (the optimizer's only with ``optimizer``;
    process ``rank``'s RNG state); a ``ValueError`` naming the file for anything refused."""
    folder = os.fspath(folder)
    state = read_trainer_state(folder)
    scheduler = load_plain_torch_file(os.path.join(folder, SCHEDULER_FILE))
    optimizer_state = load_plain_torch_file(os.path.join(folder, OPTIMIZER_FILE)) if optimizer else None
    rng = read_checkpoint_rng_state(folder, rank, warn=main)
    monitor_file = Path(folder) / MONITOR_FILE
    monitor = None
    if monitor_file.is_file():
        try:  # JSON the trainer wrote: a damaged one is a message naming it, not a traceback
            monitor = json.loads(monitor_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{monitor_file} is not the Echo Trap monitor's state ({type(exc).__name__}: "
                             f"{str(exc)[:120]}); resume from another checkpoint") from None
    return SavedTrainingState(state, scheduler, optimizer_state, rng, monitor)


def read_checkpoint_rng_state(folder: str | os.PathLike[str], rank: int, *,
                              warn: bool = True) -> tuple[dict[str, Any], str] | None:
    """Process ``rank``'s RNG state in checkpoint ``folder``, read and checked, with its file; ``None`` (with a
    warning) for a checkpoint of an older ragen, whose ``rng_state*.pth`` pickles are never read, or one without
    any."""
    own = Path(folder) / rng_state_name(rank)
    path = own if own.is_file() else Path(folder) / RNG_STATE_FILE
    if path.is_file():
        return read_rng_state(path), str(path)
    legacy = legacy_rng_files(folder)
    if legacy and warn:
        logger.warning(
            "%s: the RNG state was not restored: this checkpoint keeps it in %s, a pickle (torch.save), a format "
            "that can run code when read, which ragen no longer reads. The weights, optimizer and schedule are "
            "loaded; the random streams (sampling, shuffles) continue from this run's seed instead of where "
            "they stood, so the resumed run is not bit-for-bit the uninterrupted one. The next checkpoint "
            "stores it as %s.", folder, ", ".join(p.name for p in legacy), RNG_STATE_FILE)
    elif not legacy:  # checkpoint_problems refuses this unless DeepSpeed's state stands in (as before: tolerated)
        logger.warning("%s holds no RNG state (%s): the random streams continue from this run's seed",
                       folder, RNG_STATE_FILE)
    return None

def load_policy_weights(model: Any, folder: str | os.PathLike[str]) -> None:
    """Load the policy weights of a checkpoint folder into ``model`` in place: a peft adapter
    (``adapter_model.safetensors``) into a peft model, else ``model.safetensors`` (or its shards). The critic
    (``ragen_critic.*``, saved apart) and tied output embeddings may be absent; any other missing or unexpected
    weight is a ``ValueError`` naming a few of them."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if (folder / "adapter_config.json").is_file():
        from peft import set_peft_model_state_dict

        state = load_file(str(folder / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(model, state)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise ValueError(f"the adapter in {folder} does not fit the model: unexpected weights {unexpected[:5]}")
        return
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        state = {k: v for shard in shards for k, v in load_file(str(folder / shard)).items()}
    else:
        state = load_file(str(folder / "model.safetensors"))
    own = model.state_dict()
    wrong = [f"{k} {tuple(v.shape)} (the model's: {tuple(own[k].shape)})" for k, v in state.items()
             if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if wrong:
        raise ValueError(f"the weights in {folder} do not fit the model: {len(wrong)} of another shape, e.g. "
                         f"{wrong[0]} (a checkpoint of another model?)")
    result = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    if isinstance(getattr(model, "_tied_weights_keys", None), dict):
        tied = set(model._tied_weights_keys)
    missing = [k for k in result.missing_keys if "ragen_critic" not in k and k not in tied
               and not (k.endswith("lm_head.weight") and getattr(model.config, "tie_word_embeddings", False))]
    if missing or result.unexpected_keys:
        raise ValueError(f"the weights in {folder} do not fit the model: missing {missing[:5]}, unexpected "
                         f"{list(result.unexpected_keys)[:5]} (a checkpoint of another model?)")


def load_plain_torch_file(path: str) -> Any:
    """A ``torch.save`` file of tensors and plain containers (the optimizer's or the schedule's state), read with
    torch's restricted unpickler (``weights_only=True``), so that a crafted file cannot run code. Anything else --
    a pickle that names other Python objects, a damaged file -- is a ``ValueError`` naming the file and what it
    holds, not torch's traceback (whose advice, to allowlist the object, is the wrong one for a file handed over)."""
    refused = ("it is not loaded, since such a file can run code when read. Delete this checkpoint if you did not "
               "make it, or resume from another checkpoint")
    try:  # names the objects (torch.load's own error names only the first)
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except (ValueError, RuntimeError, OSError, EOFError, pickle.UnpicklingError):
        unsafe = []  # a pickle this scan cannot follow: torch.load below refuses it or reads it safely
    if unsafe:
        raise ValueError(f"{path} holds something other than tensors and plain data: it names the Python object(s) "
                         f"{', '.join(sorted(unsafe)[:5])}, which ragen never saves there; {refused}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = next((line for line in lines if "WeightsUnpickler error" in line), lines[0] if lines else "")
        raise ValueError(f"{path} holds something other than tensors and plain data ({reason[:200]}); "
                         f"{refused}") from None
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path} is not a readable torch file ({first}); resume from another checkpoint") from None


def load_state_into(target: Any, state: Any, path: str) -> None:
    """``target.load_state_dict(state)`` (an optimizer or a schedule), with a ``ValueError`` naming ``path`` when the
    state does not fit it."""
    try:
        target.load_state_dict(state)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RuntimeError) as exc:
        raise ValueError(f"{path} does not fit this run ({type(exc).__name__}: {str(exc)[:160]}); resume from "
                         "another checkpoint, or start a new run from its weights with --model") from None
