"""Whether a checkpoint or model folder is whole, checked without loading a tensor (milliseconds, whatever the model's
size), and what a ``torch.save`` pickle would import, found without unpickling it.

* :func:`checkpoint_problems`: what is wrong with a checkpoint folder (an empty list when it is whole);
  :func:`newest_good_checkpoint` the newest one that passes;
* :func:`model_folder_problems`: the same for the weights files of any local model folder;
* :func:`pickled_globals`: the Python objects a ``torch.save`` file names, read from its opcodes.
"""

from __future__ import annotations

import json
import os
import pickletools
import struct
import zipfile
from pathlib import Path
from typing import Any

from ragen_trainer.checkpoints.layout import (
    CHECKPOINT_MARKER,
    CHECKPOINT_PATTERN,
    OPTIMIZER_FILE,
    RNG_STATE_FILE,
    SCHEDULER_FILE,
    TRAINER_STATE_FILE,
    legacy_rng_files,
    list_checkpoints,
    rng_state_files,
)
from ragen_trainer.checkpoints.rng import read_rng_state
from ragen_trainer.fileio import read_json_object_checked

_SAFETENSORS_HEADER_LIMIT = 100 * 1024 * 1024


def checkpoint_problems(path: str | os.PathLike[str], *, training_state: bool = True) -> list[str]:
    """What is wrong with the checkpoint folder ``path``: an empty list when it is whole.

    Checked without loading any tensor (milliseconds, whatever the model's size): the marker
    (:data:`CHECKPOINT_MARKER`) and ``config.json`` / ``adapter_config.json`` are JSON objects; every weights file
    (``model.safetensors``, the shards of a sharded index, ``adapter_model.safetensors``, ``critic.safetensors`` when
    the marker names a critic) has a readable safetensors header and exactly the size that header announces (a
    truncated or half-copied file fails); with ``training_state`` (what resuming needs) also ``trainer_state.json``,
    the optimizer and scheduler states are complete torch files (or the folder holds a DeepSpeed state), and every
    process's RNG state is a valid :data:`RNG_STATE_FILE` (an older checkpoint's ``rng_state*.pth`` instead is checked
    whole, never read: the resume says it was not restored).
    """
    folder = Path(path)
    if not folder.is_dir():
        return [f"{folder} is not a folder"]
    problems: list[str] = []
    marker, why = read_json_object_checked(folder / CHECKPOINT_MARKER)
    if why:
        problems.append(why)
    deepspeed_state = (folder / "latest").is_file()
    if (folder / "adapter_config.json").is_file():
        _, why = read_json_object_checked(folder / "adapter_config.json")
        problems += [why] if why else []
        problems += _weights_problems(folder, "adapter_model", required=not deepspeed_state)
    elif (folder / "config.json").is_file():
        _, why = read_json_object_checked(folder / "config.json")
        problems += [why] if why else []
        problems += _weights_problems(folder, "model", required=not deepspeed_state)
    else:
        problems.append("config.json (or adapter_config.json) is missing")
    if marker is not None and marker.get("critic"):
        problems += _safetensors_problems(folder / "critic.safetensors")
    if training_state:
        state, why = read_json_object_checked(folder / TRAINER_STATE_FILE)
        if why:
            problems.append(why)
        elif not isinstance(state.get("global_step"), int):
            problems.append(f"{TRAINER_STATE_FILE} has no global_step")
        else:
            match = CHECKPOINT_PATTERN.match(folder.name)
            if match and int(match.group(1)) != state["global_step"]:
                problems.append(f"{TRAINER_STATE_FILE} is of step {state['global_step']}, not {match.group(1)}")
        if not deepspeed_state:
            for name in (OPTIMIZER_FILE, SCHEDULER_FILE):
                problems += _torch_file_problems(folder / name)
        rng = rng_state_files(folder)
        if rng:
            for file in rng:
                try:
                    read_rng_state(file)
                except ValueError as exc:
                    problems.append(str(exc).replace(f"{file}", file.name, 1))
        elif not deepspeed_state and not legacy_rng_files(folder):
            # an older checkpoint's rng_state*.pth stands in (checked whole, never read: resuming says so)
            problems.append(f"{RNG_STATE_FILE} is missing")
        for file in legacy_rng_files(folder) if not rng else []:
            problems += _torch_file_problems(file)
    return problems


def newest_good_checkpoint(
    output_dir: str | os.PathLike[str], *, training_state: bool = True
) -> tuple[Path | None, list[tuple[Path, list[str]]]]:
    """The newest checkpoint of ``output_dir`` that passes :func:`checkpoint_problems`, and the newer ones that did
    not, each with its problems (``(None, [...])`` when none is whole)."""
    bad: list[tuple[Path, list[str]]] = []
    for _, folder in reversed(list_checkpoints(output_dir)):
        problems = checkpoint_problems(folder, training_state=training_state)
        if not problems:
            return folder, bad
        bad.append((folder, problems))
    return None, bad


def model_folder_problems(folder: str | os.PathLike[str]) -> list[str]:
    """What is wrong with the weights files of a local model folder (a saved model, a checkpoint, a peft adapter), each
    naming its file: an empty list when every safetensors file there is whole (header readable, size as announced).
    A folder without weights files is not judged here (``from_pretrained`` says what it looked for)."""
    folder = Path(folder)
    problems: list[str] = []
    if (folder / "adapter_config.json").is_file():
        problems += _weights_problems(folder, "adapter_model", required=False)
    if (folder / "config.json").is_file():
        problems += _weights_problems(folder, "model", required=False)
    return problems


def _weights_problems(folder: Path, stem: str, *, required: bool) -> list[str]:
    single = folder / f"{stem}.safetensors"
    index = folder / f"{stem}.safetensors.index.json"
    if single.is_file():
        return _safetensors_problems(single)
    if index.is_file():
        data, why = read_json_object_checked(index)
        if why:
            return [why]
        shards = sorted(set((data.get("weight_map") or {}).values()))
        if not shards:
            return [f"{index.name} lists no weight files"]
        return [p for shard in shards for p in _safetensors_problems(folder / str(shard))]
    for name in (f"{stem}.bin", "pytorch_model.bin"):  # saved with safe_serialization=False
        if (folder / name).is_file():
            return _torch_file_problems(folder / name)
    return [f"{single.name} is missing"] if required else []


def _safetensors_problems(path: Path) -> list[str]:
    """A safetensors file: 8-byte little-endian header length, a JSON header, then exactly the announced bytes."""
    if not path.is_file():
        return [f"{path.name} is missing"]
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return [f"{path.name} is truncated ({size} bytes, no safetensors header)"]
            length = int.from_bytes(head, "little")
            if length > min(_SAFETENSORS_HEADER_LIMIT, size - 8):
                why = f"header of {length} bytes, file of {size}"
                return [f"{path.name} is truncated or not a safetensors file ({why})"]
            header = json.loads(fh.read(length).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return [f"{path.name} has an unreadable safetensors header ({str(exc)[:80]})"]
    if not isinstance(header, dict):
        return [f"{path.name} has an unreadable safetensors header"]
    end = 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return [f"{path.name} has an unreadable safetensors header (tensor {key!r})"]
        end = max(end, offsets[1])
    expected = 8 + length + end
    if size != expected:
        return [f"{path.name} is truncated ({size} of {expected} bytes)" if size < expected
                else f"{path.name} has {size - expected} bytes more than its header announces"]
    return _safe_open_problems(path)


def _safe_open_problems(path: Path) -> list[str]:
    """What the safetensors library itself says when opening ``path`` (it checks the header against the file: dtypes,
    shapes, offsets that cover the data exactly). Opening reads the header only, no tensor."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:  # the train extra is not installed: nothing here will load the file either
        return []
    try:
        with safe_open(str(path), framework="numpy") as handle:
            handle.keys()
    except (SafetensorError, OSError, ValueError) as exc:
        return [f"{path.name} is not a readable safetensors file ({str(exc)[:120]})"]
    return []


def _torch_file_problems(path: Path) -> list[str]:
    """A ``torch.save`` file (a zip archive): complete when its central directory, at the very end, is readable."""
    if not path.is_file():
        return [f"{path.name} is missing"]
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        return [f"{path.name} is truncated or not a torch file ({str(exc)[:60]})"]
    return []


def pickled_globals(path: str | os.PathLike[str]) -> list[tuple[str, str, str]]:
    """The Python objects a ``torch.save`` file would import when unpickled with ``weights_only=False``, found by
    reading its pickles' opcodes without running them: ``(entry, module, name)`` for each ``GLOBAL`` / ``INST`` /
    resolvable ``STACK_GLOBAL`` of every ``*.pkl`` in the zip archive, in order.

    Only what the opcodes themselves name can be imported by the unpickler, so a check of these names against an
    allowlist is complete, provided nothing can compute a name: a ``STACK_GLOBAL`` whose module and name are not
    plain strings pushed right before it, the extension registry (``EXT1/2/4``), an archive that is not a zip of
    torch's format (the legacy format holds several pickles in a row), a TorchScript archive (``torch.load`` runs it
    through ``torch.jit.load``) and a zip with two entries of one name (which one is read depends on the reader) are
    a ``ValueError`` saying which."""
    name = str(path)
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        raise ValueError(f"{name} is not a zip-format torch file ({str(exc)[:80]}); only torch.save's zip format is "
                         "read") from None
    found: list[tuple[str, str, str]] = []
    with archive:
        entries = archive.infolist()
        names = [e.filename for e in entries]
        if len(set(names)) != len(names):
            raise ValueError(f"{name} holds two zip entries of one name, which no torch.save writes")
        if any(n.endswith(("/constants.pkl", "/code/")) or "/code/" in n for n in names):
            raise ValueError(f"{name} is a TorchScript archive (code), not a torch.save file of data")
        pickles = [e for e in entries if e.filename.endswith(".pkl")]
        if not any(e.filename.endswith("data.pkl") for e in pickles):
            raise ValueError(f"{name} holds no data.pkl: not a torch.save file")
        for entry in pickles:
            try:
                found += [(entry.filename, m, n) for m, n in _opcode_globals(archive.read(entry))]
            except ValueError as exc:
                raise ValueError(f"{name} ({entry.filename}): {exc}") from None
            except (OSError, zipfile.BadZipFile, EOFError) as exc:
                raise ValueError(f"{name} ({entry.filename}) cannot be read ({str(exc)[:80]})") from None
    return found


class _PickleRefused(ValueError):
    pass


_STRING_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
_MEMO_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"}
_MEMO_GET_OPS = {"GET", "BINGET", "LONG_BINGET"}


def _opcode_globals(data: bytes) -> list[tuple[str, str]]:
    """``(module, name)`` of every import the pickle ``data`` asks for (see :func:`pickled_globals`)."""
    unknown = object()
    memo: dict[int, Any] = {}
    pushed: list[Any] = []  # the values the last opcodes pushed (strings known; anything else ``unknown``)
    out: list[tuple[str, str]] = []
    try:
        for opcode, arg, _ in pickletools.genops(data):
            op = opcode.name
            if op in ("GLOBAL", "INST"):
                module, _, attr = str(arg).partition(" ")
                out.append((module, attr))
                pushed.append(unknown)
            elif op == "STACK_GLOBAL":
                if len(pushed) < 2 or not all(isinstance(v, str) for v in pushed[-2:]):
                    raise _PickleRefused("a STACK_GLOBAL whose module or name is computed, which torch.save never "
                                         "writes")
                out.append((pushed[-2], pushed[-1]))
                pushed[-2:] = [unknown]
            elif op in ("EXT1", "EXT2", "EXT4"):
                raise _PickleRefused(f"an {op} opcode (an import through copyreg's extension registry)")
            elif op in _STRING_OPS:
                pushed.append(arg.decode("latin-1") if isinstance(arg, bytes) else arg)
            elif op in _MEMO_PUT_OPS:
                memo[len(memo) if op == "MEMOIZE" else int(arg)] = pushed[-1] if pushed else unknown
            elif op in _MEMO_GET_OPS:
                pushed.append(memo.get(int(arg), unknown))
            elif op not in ("FRAME", "PROTO"):
                pushed.append(unknown)  # anything else changes the stack: what was pushed before is not on top
            del pushed[:-2]
    except _PickleRefused:
        raise
    except (ValueError, EOFError, KeyError, IndexError, TypeError, struct.error) as exc:  # pickletools on garbage
        raise ValueError(f"not a readable pickle ({type(exc).__name__}: {str(exc)[:80]})") from None
    return out
