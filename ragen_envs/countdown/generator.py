"""ragen's own Countdown puzzles (``tasks="generated"``): random expression trees over random numbers, solvable by
construction."""

from __future__ import annotations

import random

import numpy as np


def generate_puzzle(
    rng: np.random.Generator,
    *,
    min_numbers: int = 3,
    max_numbers: int = 4,
    max_number: int = 100,
    max_target: int = 100,
    max_tries: int = 100_000,
) -> tuple[list[int], int, str]:
    """``(numbers, target, a_solution)``: a puzzle solvable by construction.

    Draw the numbers, then combine two random values with a random operator until one value is left; as in the TV
    game, intermediate results stay positive integers (``-`` takes the larger minus the smaller, ``/`` only divides
    evenly). Keep the puzzle if the result is a target in ``1..max_target`` that is not one of the numbers.
    """
    # One draw from the env's generator seeds a fast stdlib generator: same seed, same puzzle.
    fast = random.Random(int(rng.integers(2**63)))
    for _ in range(max_tries):
        count = fast.randint(min_numbers, max_numbers)
        numbers = [fast.randint(1, max_number) for _ in range(count)]
        items = [(n, str(n)) for n in numbers]
        while len(items) > 1:
            i, j = fast.sample(range(len(items)), 2)
            (a, ea), (b, eb) = items[i], items[j]
            if a < b:
                (a, ea), (b, eb) = (b, eb), (a, ea)
            ops = ["+", "*"]
            if a != b:
                ops.append("-")
            if b > 1 and a % b == 0:
                ops.append("/")
            op = fast.choice(ops)
            value = a + b if op == "+" else a * b if op == "*" else a - b if op == "-" else a // b
            items = [items[k] for k in range(len(items)) if k not in (i, j)] + [(value, f"({ea} {op} {eb})")]
        value, text = items[0]
        if 1 <= value <= max_target and value not in numbers:
            return numbers, value, text[1:-1]
    raise RuntimeError(f"no puzzle found in {max_tries} draws; widen max_target or max_number")
