"""Every process's random generators in a checkpoint, as JSON (:data:`~ragen_trainer.checkpoints.layout.RNG_STATE_FILE`):
written by :func:`capture_rng_state`, read and checked by :func:`read_rng_state`, set by :func:`set_rng_state`.

JSON because reading it must run no code: the ``rng_state*.pth`` of older checkpoints were pickles (``torch.save``),
which can run any code when read, and are never read. Reading and checking a file needs no torch (the verification of
a checkpoint runs without it); capturing and setting the generators import it when called.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import random
from typing import Any

import numpy as np

from ragen_trainer.fileio import read_text_bounded

#: The ``format`` value of :data:`RNG_STATE_FILE`.
RNG_STATE_FORMAT = "ragen-rng-state-1"
_RNG_STATE_MAX_BYTES = 4 * 1024 * 1024
_MT_WORDS = 624  # the Mersenne Twister's state, in 32-bit words (Python's random and numpy's legacy RandomState)


def capture_rng_state() -> dict[str, Any]:
    """This process's random generators as JSON-ready data (:data:`~ragen_trainer.checkpoints.layout.RNG_STATE_FILE`): Python's
    and numpy's Mersenne Twisters as lists of words, torch's generator states as base64 of their bytes."""
    import torch  # only here and in set_rng_state: reading a checkpoint's files needs no torch
    version, internal, gauss = random.getstate()
    bit_generator, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "format": RNG_STATE_FORMAT,
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {"bit_generator": bit_generator, "key": [int(k) for k in key], "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch_cpu": _b64(torch.random.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [_b64(s) for s in torch.cuda.random.get_rng_state_all()]
    return state


def _b64(tensor: Any) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def _byte_tensor(raw: bytes) -> Any:
    import torch

    return torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)


def read_rng_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The RNG state of :data:`RNG_STATE_FILE` ``path``, checked and decoded, ready to set:

    ``python``: the tuple of ``random.setstate``; ``numpy``: the tuple of ``numpy.random.set_state``; ``torch_cpu``:
    the bytes of torch's CPU generator state; ``cuda``: a list of bytes, one per GPU (absent when saved without one).
    A ``ValueError`` naming the file and what is wrong for anything else: the file is JSON and its values are data,
    so a damaged or crafted file can give wrong random numbers at worst, never run code."""
    name = str(path)
    try:
        data = json.loads(read_text_bounded(path, _RNG_STATE_MAX_BYTES, "RNG state file"))
    except FileNotFoundError:
        raise ValueError(f"{name} is missing") from None
    except (OSError, ValueError) as exc:  # unreadable, too large, not UTF-8, not JSON
        raise ValueError(f"{name} is not a readable RNG state ({str(exc)[:120]})") from None

    def bad(why: str) -> ValueError:
        return ValueError(f"{name} is not a ragen RNG state ({why}); expected the JSON the trainer writes "
                          f"(format {RNG_STATE_FORMAT!r})")

    if not isinstance(data, dict) or data.get("format") != RNG_STATE_FORMAT:
        found = data.get("format") if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise bad(f"format {found!r}")

    def words(value: Any, count: int, what: str) -> list[int]:
        if not (isinstance(value, list) and len(value) == count
                and all(type(v) is int and 0 <= v < 2**32 for v in value)):
            raise bad(f"{what} must be a list of {count} integers in 0..2**32-1")
        return value

    def number(value: Any, what: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise bad(f"{what} must be a finite number")
        return float(value)

    def raw(value: Any, what: str) -> bytes:
        if not isinstance(value, str):
            raise bad(f"{what} must be base64 text")
        try:
            return base64.b64decode(value.encode("ascii"), validate=True)
        except (ValueError, UnicodeEncodeError):
            raise bad(f"{what} is not valid base64") from None

    py, npy = data.get("python"), data.get("numpy")
    if not isinstance(py, dict) or not isinstance(npy, dict):
        raise bad("'python' and 'numpy' must be objects")
    internal = words(py.get("state"), _MT_WORDS + 1, "python.state")
    if internal[-1] > _MT_WORDS or type(py.get("version")) is not int:
        raise bad("python.state must end with a position in 0..624, and python.version be an integer")
    gauss = None if py.get("gauss") is None else number(py.get("gauss"), "python.gauss")
    key = words(npy.get("key"), _MT_WORDS, "numpy.key")
    pos, has_gauss = npy.get("pos"), npy.get("has_gauss")
    if npy.get("bit_generator") != "MT19937" or type(pos) is not int or not 0 <= pos <= _MT_WORDS \
            or has_gauss not in (0, 1) or isinstance(has_gauss, bool):  # fmt: skip
        raise bad("numpy needs bit_generator 'MT19937', pos in 0..624 and has_gauss 0 or 1")
    cached = number(npy.get("cached_gaussian"), "numpy.cached_gaussian")
    state: dict[str, Any] = {
        "python": (py["version"], tuple(internal), gauss),
        "numpy": ("MT19937", key, pos, has_gauss, cached),
        "torch_cpu": raw(data.get("torch_cpu"), "torch_cpu"),
    }
    if data.get("cuda") is not None:
        if not isinstance(data["cuda"], list):
            raise bad("cuda must be a list (one state per GPU)")
        state["cuda"] = [raw(v, f"cuda[{i}]") for i, v in enumerate(data["cuda"])]
    return state


def set_rng_state(state: dict[str, Any], path: str = "the RNG state") -> None:
    """Set the generators from :func:`read_rng_state`'s ``state`` (read from ``path``); a state
    the generators refuse (a damaged file of the right shape) is a ``ValueError`` naming ``path``."""
    import torch

    saved = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
    try:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.random.set_rng_state(_byte_tensor(state["torch_cpu"]))
    except (ValueError, TypeError, RuntimeError) as exc:
        random.setstate(saved[0])  # all or nothing: the generators stay as they were
        np.random.set_state(saved[1])
        torch.random.set_rng_state(saved[2])
        raise ValueError(f"{path} holds an RNG state the generators refuse ({str(exc)[:120]})") from None
    if "cuda" in state and torch.cuda.is_available():
        with contextlib.suppress(RuntimeError):  # another GPU count than when saved
            torch.cuda.random.set_rng_state_all([_byte_tensor(s) for s in state["cuda"]])
