"""A Countdown solver: an expression over the numbers that reaches the target, or ``None`` when none does.

:func:`solve_countdown` finds a solution of any puzzle (the oracle of tests, the demo and the leaderboard); it solves
every reference task.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction


def solve_countdown(numbers: Sequence[int], target: int, *, use_all: bool = True) -> str | None:
    """An expression over ``numbers`` equal to ``target`` (each number once if ``use_all``), or ``None`` if none exists.

    Exhaustive search over pairs of the remaining values (exact Fractions), memoised on the multiset of values; a few
    milliseconds for 4 numbers.
    """
    goal = Fraction(target)
    dead: set[tuple[Fraction, ...]] = set()

    def search(items: list[tuple[Fraction, str]]) -> str | None:
        if not use_all:
            for value, text in items:
                if value == goal:
                    return text
        if len(items) == 1:
            return items[0][1] if items[0][0] == goal else None
        key = tuple(sorted(v for v, _ in items))
        if key in dead:
            return None
        for i in range(len(items)):
            for j in range(len(items)):
                if i == j:
                    continue
                (a, ea), (b, eb) = items[i], items[j]
                rest = [items[k] for k in range(len(items)) if k not in (i, j)]
                candidates = [(a - b, f"({ea} - {eb})")]
                if i < j:  # commutative operators once per pair
                    candidates += [(a + b, f"({ea} + {eb})"), (a * b, f"({ea} * {eb})")]
                if b != 0:
                    candidates.append((a / b, f"({ea} / {eb})"))
                for value, text in candidates:
                    found = search(rest + [(value, text)])
                    if found is not None:
                        return found
        dead.add(key)
        return None

    found = search([(Fraction(n), str(n)) for n in numbers])
    if found is not None and found.startswith("(") and found.endswith(")") and _outer_parens(found):
        found = found[1:-1]
    return found


def _outer_parens(text: str) -> bool:
    """Whether the first '(' of ``text`` closes at its last character."""
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return i == len(text) - 1
    return False
