"""What the two Sokoban level generators share: the backend of their search kernel, a base class, the room fields.

Each generator (:mod:`ragen_envs.sokoban.generator`, :mod:`ragen_envs.sokoban.reference_generator`) runs its search in
a kernel of :mod:`ragen_envs.sokoban.kernels` (with the room walk, the flood fill and the state lookup they share),
written in the subset of Python that numba compiles. With numba installed (the ``fast`` extra) the kernel is compiled
once and cached; without it the *same* functions run as plain Python on lists and make identical levels, only slower. :class:`KernelGenerator` holds the rest of what they share: the backend choice, the kernel with
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
from ragen_envs.sokoban.kernels import jit_helpers

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
        jit_helpers(self.backend)  # before the kernel's first call compiles it: it calls helpers numba must know
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
        self._tail = (*self._consts, *self._bufs)  # the kernel's last arguments, joined once (~0.4 us a call)

    def _build_arrays(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        """The kernel's constant arrays and its search buffers, as numpy arrays (the Python backend gets lists)."""
        raise NotImplementedError

    def generate(self, seed: int) -> Level:
        """The level of ``seed`` (the same seed gives the same level on every machine and backend)."""
        self._check_seed(seed)
        with self._lock:
            return self._generate_locked(int(seed))

    def _check_seed(self, seed: Any) -> None:
        bits = self.seed_bits
        check_arg(
            is_int(seed) and seed >= 0 and (bits is None or seed < 2**bits),
            "seed",
            seed,
            "an int >= 0" if bits is None else f"an int in 0..2**{bits}-1",
        )

    def _generate_locked(self, seed: int) -> Level:
        """The level of ``seed``; the caller holds the lock."""
        raise NotImplementedError

    def _run(self, *args: Any) -> int:
        """The kernel's status code on ``args`` followed by the constant arrays and the search buffers."""
        return int(self._kernel(*args, *self._tail))

    def _room(self) -> np.ndarray:
        """The ``(rows, cols)`` int8 room the kernel wrote (flat) into its first buffer, as a new array."""
        return np.array(self._bufs[0], dtype=np.int8).reshape(self.config.dim_room)

    def __reduce__(self) -> tuple[Any, ...]:
        # The lock and the compiled kernel cannot be pickled, and the buffers are scratch space: a pickled generator
        # is its class, configuration and backend, unpickled as that process's shared generator (same levels).
        return (_shared_instance, (type(self), self.config, self.backend))

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


def _shared_instance(cls: type[KernelGenerator], config: Any, backend: str) -> KernelGenerator:
    """Unpickles a generator as this process's shared one of its class, configuration and backend."""
    return cls.shared(config, backend=backend)


# ------------------------------------------------------------------------------ the first draw of np_random(seed)
# A fresh-level reset draws its level seed as ``np_random.integers(2**62)`` from gymnasium's ``np_random(seed)``, i.e.
# ``Generator(PCG64(SeedSequence(seed)))``; for that range numpy's Lemire sampler takes exactly one 64-bit output ``x``
# and returns ``x >> 2`` (``x * 2**62 >> 64``, never rejected). Building the SeedSequence and the PCG64 costs ~4 us,
# more than half a 6x6 level, so ``_pcg64_first_output`` computes ``x`` in one compiled call (~0.2 us): numpy's
# SeedSequence (numpy/random/bit_generator.pyx: ``mix_entropy`` with pool size 4, ``generate_state(4, uint64)``) and
# PCG64's seeding and first output (numpy/random/src/pcg64: ``pcg64_set_seed``, ``pcg_setseq_128_srandom_r``, the
# XSL-RR output), with 128-bit state as (high, low) uint64 pairs. Tested against numpy on thousands of seeds.
_U = np.uint64
_M32 = _U(0xFFFFFFFF)
_SS_INIT_A, _SS_MULT_A = _U(0x43B0D7E5), _U(0x931E8875)  # SeedSequence's hash constants
_SS_INIT_B, _SS_MULT_B = _U(0x8B51F9DD), _U(0x58F38DED)
_SS_MIX_L, _SS_MIX_R = _U(0xCA01F9DD), _U(0x4973F715)
_PCG_MUL_HI, _PCG_MUL_LO = _U(2549297995355413924), _U(4865540595714422341)  # PCG_DEFAULT_MULTIPLIER_128


def _pcg64_first_output(seed_lo, seed_hi):  # type: ignore[no-untyped-def]  # numba; seed = seed_hi << 32 | seed_lo
    # SeedSequence(seed): the entropy words (lo, hi) padded with zeros to the pool size, hashed and mixed.
    words = (_U(seed_lo), _U(seed_hi), _U(0), _U(0))
    pool = [_U(0), _U(0), _U(0), _U(0)]
    h = _SS_INIT_A
    for i in range(4):
        v = words[i] ^ h
        h = (h * _SS_MULT_A) & _M32
        v = (v * h) & _M32
        pool[i] = v ^ (v >> _U(16))
    for src in range(4):
        for dst in range(4):
            if src != dst:
                v = pool[src] ^ h
                h = (h * _SS_MULT_A) & _M32
                v = (v * h) & _M32
                v ^= v >> _U(16)
                r = (_SS_MIX_L * pool[dst] - _SS_MIX_R * v) & _M32
                pool[dst] = r ^ (r >> _U(16))
    # generate_state(4, uint64): eight 32-bit words, little-endian pairs -> seed (hi, lo), inc (hi, lo).
    out = [_U(0)] * 8
    h = _SS_INIT_B
    for i in range(8):
        v = pool[i % 4] ^ h
        h = (h * _SS_MULT_B) & _M32
        v = (v * h) & _M32
        out[i] = v ^ (v >> _U(16))
    s_hi, s_lo = out[0] | (out[1] << _U(32)), out[2] | (out[3] << _U(32))
    q_hi, q_lo = out[4] | (out[5] << _U(32)), out[6] | (out[7] << _U(32))
    # pcg_setseq_128_srandom_r: inc = seq << 1 | 1; state = 0; step; state += seed; step. Then random_r: step, output.
    # A step is state = state * multiplier + inc (mod 2**128), the low 64x64 product from 32-bit halves.
    inc_hi, inc_lo = (q_hi << _U(1)) | (q_lo >> _U(63)), (q_lo << _U(1)) | _U(1)
    x_hi, x_lo = _U(0), _U(0)
    for k in range(3):
        if k == 1:
            lo = x_lo + s_lo
            x_hi, x_lo = x_hi + s_hi + (_U(1) if lo < x_lo else _U(0)), lo
        a0, a1, b0, b1 = x_lo & _M32, x_lo >> _U(32), _PCG_MUL_LO & _M32, _PCG_MUL_LO >> _U(32)
        p00, p01, p10 = a0 * b0, a0 * b1, a1 * b0
        mid = (p00 >> _U(32)) + (p01 & _M32) + (p10 & _M32)
        lo = (p00 & _M32) | (mid << _U(32))
        hi = a1 * b1 + (p01 >> _U(32)) + (p10 >> _U(32)) + (mid >> _U(32)) + x_hi * _PCG_MUL_LO + x_lo * _PCG_MUL_HI
        x_lo = lo + inc_lo
        x_hi = hi + inc_hi + (_U(1) if x_lo < lo else _U(0))
    x, rot = x_hi ^ x_lo, x_hi >> _U(58)  # XSL-RR: xor-fold, rotate right by the top 6 bits
    return (x >> rot) | (x << ((_U(64) - rot) & _U(63)))


_first_output_fn: list[Callable[[int, int], Any] | None] = []  # [the compiled function, or None without numba]


def first_uint64(seed: int) -> int:
    """``int(numpy.random.PCG64(seed).random_raw())``: the first 64-bit output of gymnasium's ``np_random(seed)``
    (any int ``seed >= 0``); compiled when numba is installed and ``seed < 2**64``, else numpy's own."""
    if not _first_output_fn:
        fn = None
        if numba_available():
            try:
                fn = compiled_kernel(_pcg64_first_output)
                fn(1, 0)  # compile now: a failure falls back to numpy here, not in a reset
            except Exception:  # noqa: BLE001 -- a broken numba install must not break seeding
                fn = None
        _first_output_fn.append(fn)
    fn = _first_output_fn[0]
    if fn is None or seed >= 2**64:
        return int(np.random.PCG64(seed).random_raw())
    return int(fn(seed & 0xFFFFFFFF, seed >> 32))


class RoomConfig:
    """Base of the generators' (frozen dataclass) configurations: the room and random-walk fields they share,
    ``dim_room``, ``num_boxes``, ``p_change_directions`` and ``num_steps`` (documented by each configuration)."""

    dim_room: tuple[int, int]
    num_boxes: int
    p_change_directions: float
    num_steps: int | None

    @property
    def cells(self) -> int:
        """Cells of the room, walls included (the kernels' flat arrays)."""
        return self.dim_room[0] * self.dim_room[1]

    @property
    def interior(self) -> int:
        """Cells inside the border walls (where boxes, targets and the player can be)."""
        return (self.dim_room[0] - 2) * (self.dim_room[1] - 2)

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
