"""Names and places of a run folder: what a run writes into its ``output_dir``, what a checkpoint folder holds, and
the small records (the marker, the trainer state) read back without loading a tensor.

A run folder::

    <output_dir>/config.yaml, metrics.jsonl, summary.json      the run's record
    <output_dir>/checkpoint-<step>/                             :data:`CHECKPOINT_MARKER`, the weights, the training state
    <output_dir>/final/                                         the trained policy, for serving
    <output_dir>/.saving-<name>/                                a save in progress (:data:`STAGING_PREFIX`)
    <output_dir>/broken-checkpoint-<step>/                      a checkpoint that failed verification
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ragen_trainer.fileio import atomic_write_text, read_json_object

#: The marker file the trainer writes into each checkpoint folder.
CHECKPOINT_MARKER = "ragen_checkpoint.json"
#: Folder names of the trainer's checkpoints (``checkpoint-<optimizer step>``), as ``transformers`` names them.
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
#: A save in progress is written to ``<output_dir>/.saving-checkpoint-N`` and renamed to ``checkpoint-N`` when whole;
#: a folder with this prefix is an unfinished save (the process was killed while saving).
STAGING_PREFIX = ".saving-"
#: A checkpoint that failed verification is renamed ``broken-checkpoint-N`` (kept for inspection, never loaded).
BROKEN_PREFIX = "broken-"

#: A folder being replaced by a save of the same step is moved to ``.replaced-<name>`` first (removed after).
REPLACED_PREFIX = ".replaced-"
#: Files of the trainer's state that a checkpoint needs to resume training (besides the model and the marker).
TRAINER_STATE_FILE = "trainer_state.json"
#: The optimizer's and the learning-rate schedule's states in a checkpoint (one process, or DDP).
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
#: The Echo Trap monitor's history, saved in every checkpoint folder.
MONITOR_FILE = "echo_trap_monitor.json"
#: Every process's random generators at a checkpoint (Python's, numpy's, torch's CPU and CUDA ones):
#: ``rng_state.json``, or ``rng_state_{rank}.json`` for each process of a distributed run. JSON because reading it must
#: run no code: the ``rng_state*.pth`` of older checkpoints were pickles (``torch.save``), which can run any code when
#: read, and are never read (:func:`legacy_rng_files`).
RNG_STATE_FILE = "rng_state.json"
#: Where ``engine: vllm`` with a server writes the policy's weights for the server to reload (``<output_dir>/...``).
VLLM_WEIGHTS_DIR = "vllm-weights"
#: What a run writes into its ``output_dir`` (names and name prefixes); ``--overwrite`` removes these and only these.
RUN_FILE_NAMES: tuple[str, ...] = ("config.yaml", "metrics.jsonl", "summary.json", "final", "tensorboard", "wandb",
                                   VLLM_WEIGHTS_DIR)
RUN_FILE_PREFIXES: tuple[str, ...] = ("checkpoint-", BROKEN_PREFIX + "checkpoint-", STAGING_PREFIX, REPLACED_PREFIX, ".tmp-")


def is_ragen_checkpoint(path: str | os.PathLike[str]) -> bool:
    """``True`` when ``path`` is a folder the ragen trainer saved: a model or adapter plus
    :data:`CHECKPOINT_MARKER`."""
    folder = Path(path)
    if not folder.is_dir() or not (folder / CHECKPOINT_MARKER).is_file():
        return False
    return (folder / "config.json").is_file() or (folder / "adapter_config.json").is_file()


def read_checkpoint_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON the trainer wrote into a checkpoint's marker (``{}`` when it is empty or unreadable)."""
    return read_json_object(Path(path) / CHECKPOINT_MARKER)


def write_checkpoint_marker(path: str | os.PathLike[str], info: dict[str, Any] | None = None) -> Path:
    """Write :data:`CHECKPOINT_MARKER` into ``path`` (after the model was saved there), atomically; returns the
    marker's path."""
    return atomic_write_text(Path(path) / CHECKPOINT_MARKER, json.dumps(info or {}, indent=2, default=str) + "\n")


def list_checkpoints(output_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """``(optimizer step, folder)`` of every ``checkpoint-N`` folder in ``output_dir``, oldest first."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = []
    for child in folder.iterdir():
        match = CHECKPOINT_PATTERN.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def checkpoint_step(folder: str | os.PathLike[str]) -> int:
    """The training step a checkpoint holds: its marker's ``step``, else the number in its name."""
    step = read_checkpoint_info(folder).get("step")
    if isinstance(step, int):
        return step
    match = CHECKPOINT_PATTERN.match(Path(folder).name)
    return int(match.group(1)) if match else 0


def newest_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    found = list_checkpoints(output_dir)
    return str(found[-1][1]) if found else None


def unfinished_saves(output_dir: str | os.PathLike[str]) -> list[Path]:
    """Folders of saves that never finished (``.saving-*``: the process died while writing them)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith(STAGING_PREFIX) and p.is_dir())


def staging_path(final: str | os.PathLike[str]) -> str:
    """Where a folder that will be published at ``final`` is written first."""
    final = os.fspath(final)
    return os.path.join(os.path.dirname(final) or ".", STAGING_PREFIX + os.path.basename(final))


def rng_state_name(rank: int | None = None) -> str:
    """The file name of a process's RNG state: ``rng_state.json`` (``rank`` ``None``: a run of one process) or
    ``rng_state_{rank}.json``."""
    return RNG_STATE_FILE if rank is None else f"rng_state_{rank}.json"


def rng_state_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The JSON RNG states in a checkpoint folder (:data:`RNG_STATE_FILE` and its per-process versions)."""
    return sorted(p for p in Path(folder).glob("rng_state*.json") if re.fullmatch(r"rng_state(_\d+)?\.json", p.name))


def legacy_rng_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The ``rng_state*.pth`` pickles of a checkpoint saved before :data:`RNG_STATE_FILE` (never unpickled)."""
    return sorted(Path(folder).glob("rng_state*.pth"))


def run_files(output_dir: str | Path) -> list[Path]:
    """The files and folders of a previous run in ``output_dir`` (anything else there is the user's and is kept)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name in RUN_FILE_NAMES or p.name.startswith(RUN_FILE_PREFIXES))


def holds_run(output_dir: str | Path) -> bool:
    """Whether ``output_dir`` holds a run's progress: a checkpoint (whole or not), a final model, a summary, or
    metrics. A lone ``config.yaml`` (a run stopped before its first step) is not progress."""
    folder = Path(output_dir)
    for path in run_files(folder):
        if path.name in ("config.yaml", "tensorboard", "wandb", VLLM_WEIGHTS_DIR) or path.name.startswith(".tmp-"):
            continue
        if path.name == "metrics.jsonl" and path.stat().st_size == 0:
            continue
        return True
    return False


def read_trainer_state(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``trainer_state.json`` of a checkpoint (``{}`` when unreadable: the checkpoint then fails verification)."""
    return read_json_object(Path(folder) / TRAINER_STATE_FILE)
