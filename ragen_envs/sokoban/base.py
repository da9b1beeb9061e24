"""What the two Sokoban level generators share: the backend of their search kernel, a base class, the room fields.

Each generator (:mod:`ragen_envs.sokoban.generator`, :mod:`ragen_envs.sokoban.reference_generator`) runs its search in
one flat kernel written in the subset of Python that numba compiles. With numba installed (the ``fast`` extra) the
kernel is compiled once and cached; without it the *same* function runs as plain Python on lists and makes identical
levels, only slower. :class:`KernelGenerator` holds the rest of what they share: the backend choice, the kernel with
its constant arrays and reusable search buffers, the lock that guards those buffers, the seed check, and one shared
instance per configuration and backend. :class:`RoomConfig` checks the room and random-walk fields that both
configurations take.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ragen_envs.core import check_arg

if TYPE_CHECKING:
    from typing_extensions import Self

    from ragen_envs.sokoban.generator import Level

BACKENDS = ("auto", "numba", "python")


def numba_available() -> bool:
    """Whether numba can be imported (the optional ``fast`` extra)."""
    try:
        import numba  # noqa: F401
    except Exception:  # noqa: BLE001 -- a broken numba install must not break level generation
        return False
    return True


def resolve_backend(backend: str = "auto") -> str:
    """``"numba"`` or ``"python"``: ``auto`` picks numba when installed, unless ``RAGEN_SOKOBAN_BACKEND=python``."""
    check_arg(backend in BACKENDS, "backend", backend, "'auto', 'numba' or 'python'")
    if backend == "auto":
        backend = os.environ.get("RAGEN_SOKOBAN_BACKEND", "auto").strip().lower() or "auto"
        if backend not in BACKENDS:
            raise ValueError(
                f"invalid environment variable RAGEN_SOKOBAN_BACKEND={backend!r}: expected 'auto', 'numba' or 'python'"
            )
        if backend == "auto":
            return "numba" if numba_available() else "python"
    if backend == "numba" and not numba_available():
        raise ValueError("invalid argument backend='numba': numba is not installed (pip install 'ragen[fast]')")
    return backend


_COMPILED: dict[Callable[..., int], Callable[..., int]] = {}


def compiled_kernel(kernel: Callable[..., int]) -> Callable[..., int]:
    """``kernel`` compiled by numba, once per process."""
    fn = _COMPILED.get(kernel)
    if fn is None:
        import numba

        # cache=True stores the machine code next to the kernel's file (or in numba's user cache), so only the first
        # process on a machine pays the compile time (~2 s).
        fn = _COMPILED[kernel] = numba.njit(cache=True, nogil=True)(kernel)
    return fn


def table_size(states: int) -> int:
    """Slots of an open-addressing hash table for ``states`` states: the smallest power of two >= ``2 * states``."""
    size = 1
    while size < 2 * states:
        size *= 2
    return size


def is_int(value: Any) -> bool:
    """An int (numpy's included), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


_SHARED: dict[tuple[type, Any, str], Any] = {}
_SHARED_LOCK = threading.Lock()


class KernelGenerator:
    """Base of a generator whose ``generate(seed)`` runs one search kernel on reusable buffers; deterministic.

    A subclass sets :attr:`kernel` (the plain-Python kernel, as a ``staticmethod``), :attr:`config_type` and
    :attr:`version`, builds the kernel's arrays in :meth:`_build_arrays` and makes a level under the lock in
    :meth:`_generate_locked`, calling the kernel through :meth:`_run`.

    Args:
        config: the level family (default: ``config_type()``).
        backend: ``"auto"`` (numba when installed), ``"numba"`` or ``"python"``; both make identical levels.
    """

    kernel: ClassVar[Callable[..., int]]
    config_type: ClassVar[type]
    #: Bumped whenever the levels a seed makes change (level pools are cached under it).
    version: ClassVar[int]
    #: Seeds are ints in ``0 .. 2**seed_bits - 1``; ``None``: any int >= 0.
    seed_bits: ClassVar[int | None] = None

    def __init__(self, config: Any = None, *, backend: str = "auto") -> None:
        self.config = config or self.config_type()
        self.backend = resolve_backend(backend)
        consts, bufs = self._build_arrays()
        self._lock = threading.Lock()  # the search buffers are reused: one generation at a time per generator
        if self.backend == "numba":
            self._kernel = compiled_kernel(type(self).kernel)
            self._consts: tuple[Any, ...] = consts
            self._bufs: tuple[Any, ...] = bufs
        else:
            # Plain Python indexes lists several times faster than numpy arrays.
            self._kernel = type(self).kernel
            self._consts = tuple(a.tolist() for a in consts)
            self._bufs = tuple(a.tolist() for a in bufs)

    def _build_arrays(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        """The kernel's constant arrays and its search buffers, as numpy arrays (the Python backend gets lists)."""
        raise NotImplementedError

    def generate(self, seed: int) -> Level:
        """The level of ``seed`` (the same seed gives the same level on every machine and backend)."""
        bits = self.seed_bits
        check_arg(
            is_int(seed) and seed >= 0 and (bits is None or seed < 2**bits),
            "seed",
            seed,
            "an int >= 0" if bits is None else f"an int in 0..2**{bits}-1",
        )
        with self._lock:
            return self._generate_locked(int(seed))

    def _generate_locked(self, seed: int) -> Level:
        """The level of ``seed``; the caller holds the lock."""
        raise NotImplementedError

    def _run(self, *args: Any) -> int:
        """The kernel's status code on ``args`` followed by the constant arrays and the search buffers."""
        return int(self._kernel(*args, *self._consts, *self._bufs))

    def _room(self) -> np.ndarray:
        """The ``(rows, cols)`` int8 room the kernel wrote (flat) into its first buffer, as a new array."""
        return np.array(self._bufs[0], dtype=np.int8).reshape(self.config.dim_room)

    @classmethod
    def shared(cls, config: Any = None, *, backend: str = "auto") -> Self:
        """One generator per class, configuration and backend in this process, so that many envs share one set of
        search buffers instead of holding one each."""
        config = config or cls.config_type()
        key = (cls, config, resolve_backend(backend))
        with _SHARED_LOCK:
            gen = _SHARED.get(key)
            if gen is None:
                gen = _SHARED[key] = cls(config, backend=key[2])
        return gen


class RoomConfig:
    """Base of the generators' (frozen dataclass) configurations: the room and random-walk fields they share,
    ``dim_room``, ``num_boxes``, ``p_change_directions`` and ``num_steps`` (documented by each configuration)."""

    dim_room: tuple[int, int]
    num_boxes: int
    p_change_directions: float
    num_steps: int | None

    def _check_room(self) -> None:
        """Check these fields (naming the argument in the error) and store the ints as plain ints."""
        dim = self.dim_room
        check_arg(
            isinstance(dim, (tuple, list)) and len(dim) == 2 and all(is_int(v) for v in dim) and 4 <= min(dim)
            and max(dim) <= 64,
            "dim_room",
            dim,
            "(rows, cols), two ints in 4..64 (the border rows and columns are walls)",
        )  # fmt: skip
        object.__setattr__(self, "dim_room", (int(dim[0]), int(dim[1])))
        interior = (dim[0] - 2) * (dim[1] - 2)
        check_arg(
            is_int(self.num_boxes) and 1 <= self.num_boxes <= interior - 2,
            "num_boxes",
            self.num_boxes,
            f"an int in 1..{interior - 2} for dim_room={self.dim_room} (room for the boxes and the player)",
        )
        object.__setattr__(self, "num_boxes", int(self.num_boxes))
        check_arg(
            isinstance(self.p_change_directions, (int, float))
            and not isinstance(self.p_change_directions, bool)
            and 0.0 <= self.p_change_directions <= 1.0,
            "p_change_directions",
            self.p_change_directions,
            "a probability in [0, 1]",
        )
        check_arg(
            self.num_steps is None or (is_int(self.num_steps) and 1 <= self.num_steps <= 100_000),
            "num_steps",
            self.num_steps,
            "None or an int in 1..100000",
        )
        if self.num_steps is not None:
            object.__setattr__(self, "num_steps", int(self.num_steps))

    def _room_key(self) -> str:
        """The part of the configuration's cache key that names these fields, e.g. ``6x6_b1_p0.35_w20``."""
        rows, cols = self.dim_room
        return f"{rows}x{cols}_b{self.num_boxes}_p{self.p_change_directions:g}_w{self.walk_steps}"

    @property
    def walk_steps(self) -> int:
        """The random walk's steps: ``num_steps``, or gym-sokoban's ``int(1.7 * (rows + cols))``."""
        return self.num_steps if self.num_steps is not None else int(1.7 * (self.dim_room[0] + self.dim_room[1]))
