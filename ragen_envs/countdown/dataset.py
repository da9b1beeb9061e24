"""The reference's Countdown tasks: ``Countdown-Tasks-3to4`` regenerated (:func:`generate_reference_tasks`) and
filtered by RAGEN's ``has_solution`` (:func:`reference_tasks`); ``tasks="reference"`` poses them.

How ``Countdown-Tasks-3to4`` was made, and what :func:`generate_reference_tasks` reproduces
----------------------------------------------------------------------------------------------------
The dataset (https://huggingface.co/datasets/Jiayi-Pan/Countdown-Tasks-3to4, by Jiayi Pan, TinyZero's author; columns
``target``, ``nums``; 490,364 rows, the first ``{'target': 98, 'nums': [44, 19, 35]}``) records no generation procedure,
and TinyZero (https://github.com/Jiayi-Pan/TinyZero, ``examples/data_preprocess/countdown.py``) only downloads it. Its
name, columns and the rows quoted in public code (3 or 4 numbers in 1..99, a target in 10..100, always reachable;
e.g. the Mini-R1 tutorial, https://www.philschmid.de/mini-deepseek-r1) fit the Countdown generator of Stream-of-Search
(Gandhi et al. 2024, https://github.com/kanishkg/stream-of-search, ``src/countdown.py`` ``CountDown.generate``,
``src/countdown_generate.py``), which Jiayi Pan's later APR code reuses unchanged
(https://github.com/Parallel-Reasoning/APR, ``src/data/countdown.py``, ``src/data/generate_problems.py``). That
generator is taken as the dataset's procedure:

1. the count of numbers is ``random.randint(min_range, start_range)``: uniform over {3, 4} ("3to4");
2. the target is ``random.choice(range(10, max_target + 1))`` with ``max_target=100``: uniform over 10..100;
3. the numbers are ``random.randint(1, max_target - 1)`` each (uniform over 1..99, in draw order), redrawn until the
   generator's depth-first search finds a solution: the target reached using every number once, combining two values
   at a time by ``a + b``, ``a * b``, larger minus smaller, or larger divided by smaller when it divides evenly (so
   every intermediate result is a non-negative integer).

:func:`generate_reference_tasks` draws from exactly this distribution (the same rejection sampler, run on batches of
candidates with the search vectorised in numpy), from a fixed seed (:data:`REFERENCE_TASK_SEED`) through numpy's
PCG64 bit generator, whose raw stream numpy keeps stable across versions. Assumed where the sources leave it open: the
targets are all of 10..100 (APR's ``generate_problems.py``; Stream-of-Search's own script holds 10% of the targets out
for validation); the rows are not deduplicated (why the dataset has 490,364 rows, not a round number, is not
recorded). The random stream itself cannot be the dataset's, so the tasks are the same *distribution*, not the same
rows: ``seed`` *i* poses a different puzzle than the reference's row *i*.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import numpy as np

from ragen_envs.core import check_arg

#: Rows the reference reads from the dataset (``CountdownEnvConfig.max_instances``).
REFERENCE_MAX_INSTANCES = 20_000
#: Rows of ``Countdown-Tasks-3to4``: the most :func:`generate_reference_tasks` serves.
REFERENCE_DATASET_ROWS = 490_364
#: Seed of the reference task stream (the seed of APR's ``create_prob.sh``).
REFERENCE_TASK_SEED = 42


def has_solution(nums: Sequence[int], target: int) -> bool:
    """The reference's filter (RAGEN ``has_solution``): some choice of signs makes ``±n1 ±n2 ±n3 ±n4 == target``,
    the numbers padded to four with zeros. (Despite its docstring it tries only ``+`` and ``-``.)"""
    padded = list(nums) + [0] * (4 - len(nums))
    return any(
        sum(sign * n for sign, n in zip(signs, padded)) == target for signs in itertools.product((1, -1), repeat=4)
    )


def _combine_all(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """Every value Stream-of-Search's ``combine_nums`` makes of two values, element-wise (-1 marks "no value").

    ``a + b``, ``a * b``, larger minus smaller, and larger divided by smaller when the smaller is not 0 and divides
    it: non-negative integers only.
    """
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    invalid = lo < 0  # an operand without a value
    divisor = np.where(lo > 0, lo, 1)
    quotient = np.where((lo > 0) & (hi % divisor == 0), hi // divisor, -1)
    return [np.where(invalid, -1, value) for value in (a + b, a * b, hi - lo, quotient)]


def _reaches(values: list[np.ndarray], target: np.ndarray) -> np.ndarray:
    """Element-wise: can Stream-of-Search's search (``CountDown.search``) reach ``target`` using every value once?"""
    if len(values) == 1:
        return values[0] == target  # type: ignore[no-any-return]
    found = np.zeros(target.shape, dtype=bool)
    for i, j in itertools.combinations(range(len(values)), 2):
        rest = [values[k] for k in range(len(values)) if k != i and k != j]
        for combined in _combine_all(values[i], values[j]):
            found |= _reaches([*rest, combined], target)
    return found


_BLOCK = 5_000  # rows per independently seeded block: a longer list extends a shorter one
_CANDIDATES = {3: 40, 4: 4}  # candidate draws per row per round (3 numbers reach a target far less often)


def _draw(bits: np.random.PCG64, n: int, low: int, high: int) -> np.ndarray:
    """``n`` integers uniform over ``low..high`` from the raw 64-bit stream (bias below 1e-17)."""
    raw = bits.random_raw(n)
    return (raw % np.uint64(high - low + 1)).astype(np.int64) + low  # type: ignore[no-any-return]


def _generate_block(block: int, seed: int) -> list[tuple[int, tuple[int, ...]]]:
    bits = np.random.PCG64(np.random.SeedSequence([seed, block]))
    sizes = _draw(bits, _BLOCK, 3, 4)  # random.randint(min_range=3, start_range=4)
    targets = _draw(bits, _BLOCK, 10, 100)  # random.choice(range(10, max_target + 1))
    nums = np.zeros((_BLOCK, 4), dtype=np.int64)
    for size, k in _CANDIDATES.items():
        pending = np.flatnonzero(sizes == size)
        while pending.size:
            # k draws of random.randint(1, max_target - 1) per number, per pending row; the first that reaches the
            # target is the row's (CountDown.generate's rejection loop)
            candidates = _draw(bits, pending.size * k * size, 1, 99).astype(np.int32).reshape(pending.size, k, size)
            goal = np.repeat(targets[pending], k).reshape(pending.size, k).astype(np.int32)
            ok = _reaches([candidates[..., i] for i in range(size)], goal)
            done = ok.any(axis=1)
            nums[pending[done], :size] = candidates[done, ok[done].argmax(axis=1)]
            pending = pending[~done]
    return [(int(t), tuple(int(n) for n in row[:s])) for t, row, s in zip(targets, nums, sizes)]


@functools.cache
def _reference_block(block: int, seed: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    return tuple(_generate_block(block, seed))


def generate_reference_tasks(
    count: int = REFERENCE_MAX_INSTANCES, *, seed: int = REFERENCE_TASK_SEED
) -> list[tuple[int, tuple[int, ...]]]:
    """The first ``count`` rows ``(target, nums)`` of the regenerated ``Countdown-Tasks-3to4`` (module docstring).

    Deterministic; a prefix of any longer list. About 1 s for 20,000 rows, cached per process.
    """
    check_arg(
        isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= REFERENCE_DATASET_ROWS,
        "count",
        count,
        f"an int in 1..{REFERENCE_DATASET_ROWS}",
    )
    rows: list[tuple[int, tuple[int, ...]]] = []
    for block in range(-(-count // _BLOCK)):
        rows.extend(_reference_block(block, seed))
    return rows[:count]


@functools.lru_cache(maxsize=8)
def reference_tasks(max_instances: int = REFERENCE_MAX_INSTANCES) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The reference's task list: the first ``max_instances`` rows, filtered by :func:`has_solution`, in order.

    ``reset(seed)`` poses ``reference_tasks()[seed % len(reference_tasks())]``.
    """
    return tuple((t, nums) for t, nums in generate_reference_tasks(max_instances) if has_solution(nums, t))
