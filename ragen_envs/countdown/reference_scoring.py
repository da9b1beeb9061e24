"""The reference's Countdown scoring (``scoring="reference"``, RAGEN's ``compute_reward``), never executing the answer.

RAGEN scores 0 unless the integers in the answer (every run of digits, regex ``\\d+``) are, sorted, exactly the sorted
numbers (``check_format``, :func:`reference_numbers_match`); then 1.0 when the answer evaluates to the target within
1e-5 (``check_correctness``), else ``format_score``, also when it cannot be evaluated. RAGEN evaluates with
``eval(answer, {"__builtins__": None}, {})``; :func:`safe_eval` walks the parsed expression instead and gives ``eval``'s
value (or error) on every expression of numbers and arithmetic (see :func:`safe_eval`).
"""

from __future__ import annotations

import ast
import operator
import re
import unicodedata
from collections.abc import Sequence
from typing import Any, NamedTuple

#: Longest answer (characters, after leading spaces and tabs) the reference scoring evaluates; a longer one is an
#: evaluation error. The reference caps a reply at 100 tokens (``max_tokens``), far below this.
MAX_ANSWER_CHARS = 1024
#: Deepest expression tree (operators nested in operators) :func:`safe_eval` evaluates.
MAX_EVAL_DEPTH = 100
#: Largest integer (bits) a ``*`` or ``**`` of :func:`safe_eval` may produce (about 3,000 decimal digits).
MAX_INT_BITS = 10_000
#: The reference's tolerance: an answer is correct when ``abs(value - target) < 1e-5``.
REFERENCE_TOLERANCE = 1e-5


class EvaluationError(ValueError):
    """:func:`safe_eval` cannot evaluate the text (where the reference's ``eval`` raises, or past ragen's bounds)."""


_BINARY_OPS: dict[type[ast.operator], Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPS: dict[type[ast.unaryop], Any] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_NUMBER_TYPES = (int, float, complex)  # bool is an int


def safe_eval(text: str) -> int | float | complex:
    """The value Python's ``eval`` gives ``text``, computed without executing it; :class:`EvaluationError` otherwise.

    Only numeric constants, ``+ - * / // % **`` and unary ``+ -`` are evaluated (with Python's own operators, so the
    value, its type and its errors are ``eval``'s); anything else, text over :data:`MAX_ANSWER_CHARS`, trees deeper
    than :data:`MAX_EVAL_DEPTH` and integer products or powers over :data:`MAX_INT_BITS` bits raise. Never raises
    anything but :class:`EvaluationError`.

    >>> safe_eval("(6 / 4) * 2"), safe_eval("-3 + 2 ** 3"), safe_eval("7 // 2")
    (3.0, 5, 3)
    """
    if not isinstance(text, str):
        raise EvaluationError(f"not text: {type(text).__name__}")
    source = text.lstrip(" \t")  # eval() skips leading spaces and tabs; ast.parse would call them an indent
    if len(source) > MAX_ANSWER_CHARS:
        raise EvaluationError(f"longer than {MAX_ANSWER_CHARS} characters")
    try:
        tree = ast.parse(source, mode="eval")
    except Exception as exc:  # noqa: BLE001 -- SyntaxError, ValueError (null bytes), RecursionError, MemoryError
        raise EvaluationError(f"not an expression ({type(exc).__name__})") from None
    try:
        return _eval_node(tree.body, 0)
    except EvaluationError:
        raise
    except Exception as exc:  # noqa: BLE001 -- ZeroDivisionError, OverflowError, TypeError, ValueError: eval's own
        raise EvaluationError(f"{type(exc).__name__}: {exc}") from None


def _eval_node(node: ast.AST, depth: int) -> int | float | complex:
    if depth > MAX_EVAL_DEPTH:
        raise EvaluationError(f"expression nested deeper than {MAX_EVAL_DEPTH}")
    if isinstance(node, ast.Constant):
        if isinstance(node.value, _NUMBER_TYPES):
            return node.value  # type: ignore[no-any-return]
        raise EvaluationError(f"{type(node.value).__name__} constant")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
        return _UNARY_OPS[type(node.op)](_eval_node(node.operand, depth + 1))  # type: ignore[no-any-return]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
        left = _eval_node(node.left, depth + 1)
        right = _eval_node(node.right, depth + 1)
        if isinstance(left, int) and isinstance(right, int):  # bounds on the only operations that can blow up
            if isinstance(node.op, ast.Mult) and abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS:
                raise EvaluationError(f"product over {MAX_INT_BITS} bits")
            if (
                isinstance(node.op, ast.Pow)
                and right > 0
                and abs(left) > 1
                and (right > MAX_INT_BITS or right * abs(left).bit_length() > MAX_INT_BITS)
            ):
                raise EvaluationError(f"power over {MAX_INT_BITS} bits")
        return _BINARY_OPS[type(node.op)](left, right)  # type: ignore[no-any-return]
    raise EvaluationError(f"{type(node).__name__} is not evaluated")


_DIGIT_RUN = re.compile(r"\d+")
_SIGNIFICANT_DIGITS = 18  # every allowed number has fewer (options["numbers"] < 10**expression.MAX_DIGITS)


def _digit_run_value(run: str) -> int | None:
    """``int(run)`` for a run of (any script's) decimal digits; ``None`` when it is too large to be a given number."""
    if len(run) <= _SIGNIFICANT_DIGITS:
        return int(run)
    start = len(run) - len(run.lstrip("0"))
    while start < len(run) and unicodedata.decimal(run[start], 1) == 0:  # zeros of other scripts
        start += 1
    significant = run[start:]
    if len(significant) > _SIGNIFICANT_DIGITS:
        return None
    return int(significant) if significant else 0


def reference_numbers_match(text: str, numbers: Sequence[int]) -> bool:
    """The reference's ``check_format``: the integers in ``text`` (runs of digits), sorted, are the sorted ``numbers``.

    Linear in ``text`` and stops at the first run too many.
    """
    want = sorted(int(n) for n in numbers)
    found: list[int] = []
    for match in _DIGIT_RUN.finditer(text):
        if len(found) == len(want):
            return False
        value = _digit_run_value(match.group())
        if value is None:
            return False
        found.append(value)
    return sorted(found) == want


class ReferenceVerdict(NamedTuple):
    """How the reference scoring judged one answer."""

    reward: float
    numbers_ok: bool  # check_format: exactly the given numbers
    correct: bool  # check_correctness: evaluates to the target within REFERENCE_TOLERANCE
    value: int | float | complex | None  # the answer's value (None: not evaluated, or evaluation error)
    error: str | None  # why the answer could not be evaluated


def reference_score(answer: str, numbers: Sequence[int], target: int, *, format_score: float = 0.1) -> ReferenceVerdict:
    """RAGEN's ``compute_reward``: 0 unless the answer uses exactly ``numbers``; then 1.0 if it evaluates to ``target``
    within 1e-5, else ``format_score`` (also when it cannot be evaluated)."""
    if not reference_numbers_match(answer, numbers):
        return ReferenceVerdict(0.0, False, False, None, None)
    try:
        value = safe_eval(answer)
    except EvaluationError as exc:
        return ReferenceVerdict(format_score, True, False, None, str(exc))
    try:
        correct = bool(abs(value - target) < REFERENCE_TOLERANCE)
    except Exception as exc:  # noqa: BLE001 -- e.g. OverflowError from abs() of a huge complex: the reference's except
        return ReferenceVerdict(format_score, True, False, value, f"{type(exc).__name__}: {exc}")
    return ReferenceVerdict(1.0 if correct else format_score, True, correct, value, None)
