"""Countdown as a text env: combine the given numbers with ``+ - * /`` into an expression equal to the target.

Two independent choices, each with the reference's behaviour as the default:

* ``tasks`` -- which puzzles ``reset`` poses.

  - ``"reference"`` (default): a fixed list reproducing the reference's tasks. RAGEN's ``CountdownEnv`` loads the first
    ``max_instances`` (20,000) rows of TinyZero's ``Countdown-Tasks-3to4`` dataset, keeps the rows its ``has_solution``
    accepts, and ``reset(seed)`` poses row ``seed % len(kept)``. That dataset cannot be downloaded here, so
    :func:`generate_reference_tasks` regenerates its distribution with the procedure the dataset was made by (below);
    :func:`has_solution` and the indexing are the reference's. With the defaults, 10,561 of the 20,000 rows are kept:
    7,049 with 3 numbers and 3,512 with 4 (66.7% / 33.3%; the 20,000 rows have 9,897 / 10,103, and only +/- solvable
    rows pass the filter). ``reset()`` without a seed draws an index from the env's generator (the reference
    requires a seed).
  - ``"generated"``: ragen's own generator (:func:`generate_puzzle`): ``min_numbers``..``max_numbers`` numbers in
    ``1..max_number`` combined by a random expression tree with positive integer intermediate results, kept when its
    value is a target in ``1..max_target`` that is not one of the numbers; any seed gives a new puzzle.

* ``scoring`` -- how the answer is scored.

  - ``"reference"`` (default): RAGEN's ``compute_reward``. 0 unless the integers in the answer (every run of digits,
    regex ``\\d+``) are, sorted, exactly the sorted numbers; then 1.0 when the answer evaluates to the target within
    1e-5, else ``format_score`` (0.1), also when it cannot be evaluated (syntax error, division by zero, a name...).
    Any non-empty answer is a valid action (the reference has no action lookup), so ``2 + 5 - 3 = 4`` is valid and
    scores 0 (four integers for three numbers). The reference evaluates with
    ``eval(answer, {"__builtins__": None}, {})``; ragen never executes model text: :func:`safe_eval` walks the parsed
    expression (``ast.parse(answer, mode="eval")``) and evaluates only numeric constants (int, float, complex, bool),
    ``+ - * / // % **`` and unary ``+ -``, with Python's own arithmetic, so it gives ``eval``'s value (or error) on
    every such expression. Anything else (names, calls, attributes, comparisons, bitwise operators, ``~``, ``not``,
    conditional expressions, strings, tuples...) is an evaluation error, as are answers longer than
    :data:`MAX_ANSWER_CHARS` characters, trees deeper than :data:`MAX_EVAL_DEPTH` and integer ``*`` / ``**`` results
    over :data:`MAX_INT_BITS` bits: 0.1 when the numbers match, as for the reference's evaluation errors. (Where
    ``eval`` would evaluate these, e.g. ``(2).__add__(5) - 3``, the reference may give 1.0; ragen gives 0.1.)
  - ``"strict"``: ragen's own checker: a tokenizer and recursive-descent parser evaluate the answer exactly over
    :class:`fractions.Fraction` (``6 / 4 * 2 == 3``); non-negative integers, binary ``+ - * /`` (also ``×`` ``÷``) and
    parentheses, optionally followed by ``= <number>`` (ignored). Unary minus, decimals, powers and anything else make
    the action invalid (the protocol's format penalty applies). 1.0 when the numbers are used as required
    (``use_all_numbers``: each exactly once, or at most once) and the value is the target; ``format_score`` for any
    other well-formed answer (wrong value, wrong numbers, division by zero).

:func:`solve_countdown` finds a solution of any puzzle (the oracle of tests, the demo and the leaderboard); it solves
every reference task.

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

Action space: ``UnicodeText``; see ``scoring`` for what is a valid action.

Observation: ``Numbers: [a, b, c]`` and ``Target: t``; after an answer, the answer and its value.
:meth:`CountdownEnv.reference_state_text` is the reference's rendering: ``Target: 4, nums: [3, 5, 2]``, then
``Your answer get <reward> points.`` after the answer.

Rewards: as ``scoring`` says; an empty or unparseable reply earns 0 from the env and the protocol's format penalty.

Episode end: terminated by the first valid answer (one action per episode).

Arguments:
    tasks: ``"reference"`` (default) or ``"generated"``, as above.
    scoring: ``"reference"`` (default) or ``"strict"``, as above.
    max_instances: ``tasks="reference"`` only: how many dataset rows are read before filtering (the reference's
        ``max_instances``; default 20,000, at most 490,364). The rows are a prefix of one fixed stream.
    min_numbers / max_numbers: ``tasks="generated"`` only: how many numbers a puzzle has (default 3 and 4).
    max_number: ``tasks="generated"`` only: the numbers are drawn from 1..max_number (default 100).
    max_target: ``tasks="generated"`` only: targets lie in 1..max_target (default 100).
    use_all_numbers: ``scoring="strict"`` only: every number exactly once (default ``True``) or at most once.
    format_score: reward of a valid but wrong answer (reference 0.1), under either scoring.
    render_mode: ``None`` or ``"ansi"``.
    Reset options ``{"numbers": [...], "target": t}`` pose a fixed puzzle instead of the task list's.

Sources: RAGEN (https://github.com/RAGEN-AI/RAGEN): ``ragen/env/countdown/env.py`` (``check_format``,
``check_correctness``, ``has_solution``, ``CountdownEnv.reset/step/compute_reward``), ``ragen/env/countdown/config.py``
(``max_instances=20000``, ``score=1``, ``format_score=0.1``), ``config/envs.yaml`` (``env_instruction``),
``scripts/download_data.py`` (the dataset's URL). The dataset and generator sources are listed above.
"""

from __future__ import annotations

import ast
import functools
import itertools
import math
import operator
import random
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, ClassVar, NamedTuple

import numpy as np

from ragen_envs.core import BaseTextEnv, StepOutcome, check_arg
from ragen_envs.grounding import MAX_THINK_CHARS

#: Longest expression (characters) the strict checker parses; longer text is not a valid answer.
MAX_EXPRESSION_CHARS = 256
#: Deepest parenthesis nesting the strict checker accepts.
MAX_DEPTH = 32
#: Largest integer literal (digits) the strict checker accepts; also the bound on ``options["numbers"]``.
MAX_DIGITS = 12

#: Longest answer (characters, after leading spaces and tabs) the reference scoring evaluates; a longer one is an
#: evaluation error. The reference caps a reply at 100 tokens (``max_tokens``), far below this.
MAX_ANSWER_CHARS = 1024
#: Deepest expression tree (operators nested in operators) :func:`safe_eval` evaluates.
MAX_EVAL_DEPTH = 100
#: Largest integer (bits) a ``*`` or ``**`` of :func:`safe_eval` may produce (about 3,000 decimal digits).
MAX_INT_BITS = 10_000
#: The reference's tolerance: an answer is correct when ``abs(value - target) < 1e-5``.
REFERENCE_TOLERANCE = 1e-5
#: Rows the reference reads from the dataset (``CountdownEnvConfig.max_instances``).
REFERENCE_MAX_INSTANCES = 20_000
#: Rows of ``Countdown-Tasks-3to4``: the most :func:`generate_reference_tasks` serves.
REFERENCE_DATASET_ROWS = 490_364
#: Seed of the reference task stream (the seed of APR's ``create_prob.sh``).
REFERENCE_TASK_SEED = 42

TASK_SOURCES = ("reference", "generated")
SCORINGS = ("reference", "strict")


# ---------------------------------------------------------------------------------------------- strict checker
_OPS = {"+", "-", "*", "/"}
_OP_ALIASES = {"×": "*", "÷": "/", "x": "*", "X": "*"}
_TOKEN = re.compile(r"\s*(?:(\d+)|([+\-*/×÷xX()]))")


class ExpressionError(ValueError):
    """The text is not an arithmetic expression this checker accepts."""


def tokenize(text: str) -> list[str]:
    """Split ``text`` into integer literals, operators and parentheses; :class:`ExpressionError` on anything else."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens: list[str] = []
    pos, end = 0, len(text.rstrip())
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ExpressionError(f"unexpected character {text[pos:].lstrip()[:1]!r}")
        number, op = m.groups()
        if number is not None:
            if len(number) > MAX_DIGITS:
                raise ExpressionError(f"number with more than {MAX_DIGITS} digits")
            tokens.append(number)
        else:
            tokens.append(_OP_ALIASES.get(op, op))
        pos = m.end()
    if not tokens:
        raise ExpressionError("empty expression")
    return tokens


class _Parser:
    """Recursive descent over ``expr := term (('+'|'-') term)*``, ``term := atom (('*'|'/') atom)*``,
    ``atom := INT | '(' expr ')'``; evaluates exactly with Fractions and records the integers used."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.i = 0
        self.numbers: list[int] = []
        self.division_by_zero = False

    def parse(self) -> Fraction | None:
        value = self.expr(0)
        if self.i != len(self.tokens):
            raise ExpressionError(f"unexpected {self.tokens[self.i]!r}")
        return None if self.division_by_zero else value

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.tokens[self.i]
            self.i += 1
            rhs = self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Fraction:
        value = self.atom(depth)
        while self.peek() in ("*", "/"):
            op = self.tokens[self.i]
            self.i += 1
            rhs = self.atom(depth)
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                self.division_by_zero = True  # keep parsing: the text is well-formed, its value undefined
                value = Fraction(0)
            else:
                value = value / rhs
        return value

    def atom(self, depth: int) -> Fraction:
        token = self.peek()
        if token is None:
            raise ExpressionError("expression ends early")
        self.i += 1
        if token == "(":
            if depth >= MAX_DEPTH:
                raise ExpressionError(f"parentheses nested deeper than {MAX_DEPTH}")
            value = self.expr(depth + 1)
            if self.peek() != ")":
                raise ExpressionError("unclosed parenthesis")
            self.i += 1
            return value
        if token.isdigit():
            self.numbers.append(int(token))
            return Fraction(int(token))
        raise ExpressionError(f"unexpected {token!r}")


def evaluate(text: str) -> tuple[Fraction | None, list[int]]:
    """Exact value of an arithmetic expression (``None`` on division by zero) and the integers it uses, in order.

    Raises :class:`ExpressionError` when ``text`` is not a well-formed expression. Nothing is executed.

    >>> evaluate("(6 / 4) * 2")
    (Fraction(3, 1), [6, 4, 2])
    """
    parser = _Parser(tokenize(text))
    return parser.parse(), parser.numbers


def uses_numbers(used: Sequence[int], given: Sequence[int], *, use_all: bool = True) -> bool:
    """Whether ``used`` is the multiset ``given`` (``use_all``) or a sub-multiset of it."""
    need, have = Counter(used), Counter(given)
    if use_all:
        return need == have
    return all(have[n] >= k for n, k in need.items())


# ---------------------------------------------------------------------------------------------- solver
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


# ---------------------------------------------------------------------------------------------- ragen's puzzles
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


# ---------------------------------------------------------------------------------------------- reference scoring
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
    except Exception as exc:  # SyntaxError, ValueError (null bytes), RecursionError, MemoryError
        raise EvaluationError(f"not an expression ({type(exc).__name__})") from None
    try:
        return _eval_node(tree.body, 0)
    except EvaluationError:
        raise
    except Exception as exc:  # ZeroDivisionError, OverflowError, TypeError, ValueError: eval's own errors
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
            if isinstance(node.op, ast.Pow) and right > 0 and abs(left) > 1:
                if right > MAX_INT_BITS or right * abs(left).bit_length() > MAX_INT_BITS:
                    raise EvaluationError(f"power over {MAX_INT_BITS} bits")
        return _BINARY_OPS[type(node.op)](left, right)  # type: ignore[no-any-return]
    raise EvaluationError(f"{type(node).__name__} is not evaluated")


_DIGIT_RUN = re.compile(r"\d+")
_SIGNIFICANT_DIGITS = 18  # every allowed number has fewer (options["numbers"] < 10**MAX_DIGITS)


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


def reference_score(
    answer: str, numbers: Sequence[int], target: int, *, format_score: float = 0.1
) -> ReferenceVerdict:
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
    except Exception as exc:  # e.g. OverflowError from abs() of a huge complex: the reference's except clause
        return ReferenceVerdict(format_score, True, False, value, f"{type(exc).__name__}: {exc}")
    return ReferenceVerdict(1.0 if correct else format_score, True, correct, value, None)


def _points(reward: float) -> str:
    """A reward as the reference prints it: its rewards are the ints 0 and 1 and the float ``format_score``."""
    return str(int(reward)) if reward in (0.0, 1.0) else str(reward)


# ---------------------------------------------------------------------------------------------- reference tasks
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


@functools.lru_cache(maxsize=None)
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


# ---------------------------------------------------------------------------------------------- the env
# "<expression> = <number>", where the number is not itself the start of an expression ("2 + 2 = 2 * 2" is no claim).
_CLAIM = re.compile(r"([0-9+\-*/×÷() \t]{3,120})=\s*(\d{1,12}(?:/\d{1,12})?)(?![\d(]|\.\d|\s*[+\-*/×÷])")

class CountdownEnv(BaseTextEnv):
    """Reach the target with the given numbers and ``+ - * /``. See the module docstring."""

    max_action_chars = 512
    #: RAGEN ``config/envs.yaml`` ``custom_envs.Countdown.env_instruction``, verbatim.
    reference_instruction: ClassVar[str] = (
        "You are solving the Countdown puzzle. You should use the num list to create an equation that equals the "
        "target. Example answer format: <think> To find an equation using [3, 5, 2] to get 4. Let's check 2 + 5 = 7, "
        "7 - 3 = 4. So the answer is 2 + 5 - 3 = 4. </think><answer>2 + 5 - 3</answer>"
    )

    def __init__(
        self,
        *,
        tasks: str = "reference",
        scoring: str = "reference",
        max_instances: int | None = None,
        min_numbers: int | None = None,
        max_numbers: int | None = None,
        max_number: int | None = None,
        max_target: int | None = None,
        use_all_numbers: bool | None = None,
        format_score: float = 0.1,
        render_mode: str | None = None,
    ) -> None:
        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        check_arg(tasks in TASK_SOURCES, "tasks", tasks, f"one of {TASK_SOURCES}")
        check_arg(scoring in SCORINGS, "scoring", scoring, f"one of {SCORINGS}")
        generator_args = {
            "min_numbers": min_numbers,
            "max_numbers": max_numbers,
            "max_number": max_number,
            "max_target": max_target,
        }
        if tasks == "reference":
            for name, value in generator_args.items():
                check_arg(value is None, name, value, "None: it applies to tasks='generated' only")
            max_instances = REFERENCE_MAX_INSTANCES if max_instances is None else max_instances
            check_arg(
                is_int(max_instances) and 1 <= max_instances <= REFERENCE_DATASET_ROWS,
                "max_instances",
                max_instances,
                f"an int in 1..{REFERENCE_DATASET_ROWS} (the reference reads 20000 rows)",
            )
        else:
            check_arg(
                max_instances is None, "max_instances", max_instances, "None: it applies to tasks='reference' only"
            )
            min_numbers = 3 if min_numbers is None else min_numbers
            max_numbers = 4 if max_numbers is None else max_numbers
            max_number = 100 if max_number is None else max_number
            max_target = 100 if max_target is None else max_target
            check_arg(is_int(min_numbers) and 2 <= min_numbers <= 6, "min_numbers", min_numbers, "an int in 2..6")
            check_arg(
                is_int(max_numbers) and min_numbers <= max_numbers <= 6,
                "max_numbers",
                max_numbers,
                f"an int in {min_numbers}..6 (>= min_numbers)",
            )
            check_arg(is_int(max_number) and 2 <= max_number <= 10_000, "max_number", max_number, "an int in 2..10000")
            check_arg(
                is_int(max_target) and 2 <= max_target <= 1_000_000, "max_target", max_target, "an int in 2..1000000"
            )
        if scoring == "reference":
            check_arg(
                use_all_numbers is None or use_all_numbers is True,
                "use_all_numbers",
                use_all_numbers,
                "None or True: scoring='reference' requires every number exactly once (scoring='strict' allows False)",
            )
            use_all_numbers = True
        else:
            use_all_numbers = True if use_all_numbers is None else use_all_numbers
            check_arg(isinstance(use_all_numbers, bool), "use_all_numbers", use_all_numbers, "True or False")
        check_arg(
            isinstance(format_score, (int, float))
            and not isinstance(format_score, bool)
            and math.isfinite(format_score),
            "format_score",
            format_score,
            "a finite number (the reference uses 0.1)",
        )
        super().__init__(render_mode=render_mode)
        self.tasks, self.scoring = tasks, scoring
        self.max_instances: int | None = max_instances
        self.min_numbers, self.max_numbers = min_numbers, max_numbers
        self.max_number, self.max_target = max_number, max_target
        self.use_all_numbers: bool = use_all_numbers
        self.format_score = float(format_score)
        self.numbers: list[int] = []
        self.target = 0
        self.task_index: int | None = None
        self._seed: int | None = None
        self._answer: str | None = None
        self._value: Any = None
        self._numbers_ok = False
        self._reward = 0.0
        self._solved = False

    @property
    def instructions(self) -> str:
        if self.scoring == "reference":
            return (
                "You are solving a Countdown puzzle: combine the given numbers into an arithmetic expression that "
                "equals the target. Use the operations +, -, *, / and parentheses, and each number exactly once. The "
                "answer is the expression alone, without '= target', for example <answer>(1 + 2) * 3</answer>.\n"
                f"Reward: 1 for a correct expression, {self.format_score:g} for one that uses exactly the given "
                "numbers but misses the target, 0 otherwise."
            )
        rule = "each number exactly once" if self.use_all_numbers else "each number at most once"
        return (
            "You are solving a Countdown puzzle: combine the given numbers into an arithmetic expression that equals "
            f"the target. Use the operations +, -, *, / and parentheses, and {rule}. The answer is the expression "
            "alone, for example <answer>(1 + 2) * 3</answer>.\n"
            f"Reward: 1 for a correct expression, {self.format_score:g} for a well-formed but wrong one."
        )

    def describe_actions(self) -> str:
        return f"one arithmetic expression over the numbers {self.numbers} with + - * / and parentheses"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._seed = None if seed is None else int(seed)  # the reference task list is indexed by the seed itself
        return super().reset(seed=seed, options=options)

    def _reset_state(self, options: dict[str, Any] | None) -> None:
        self.task_index = None
        if options and "numbers" in options:
            numbers, target = options.get("numbers"), options.get("target")
            check_arg(
                isinstance(numbers, (list, tuple))
                and 1 <= len(numbers) <= 8
                and all(
                    isinstance(n, (int, np.integer)) and not isinstance(n, bool) and 0 <= n < 10**MAX_DIGITS
                    for n in numbers
                ),
                "options['numbers']",
                numbers,
                "a list of 1..8 non-negative ints",
            )
            check_arg(
                isinstance(target, (int, np.integer)) and not isinstance(target, bool),
                "options['target']",
                target,
                "an int",
            )
            self.numbers, self.target = [int(n) for n in numbers], int(target)  # type: ignore[union-attr, arg-type]
        elif self.tasks == "reference":
            table = reference_tasks(self.max_instances)  # type: ignore[arg-type]
            # RAGEN CountdownEnv.reset: self.index = seed % len(self.data)
            index = self._seed % len(table) if self._seed is not None else int(self.np_random.integers(len(table)))
            target, nums = table[index]
            self.task_index, self.numbers, self.target = index, list(nums), target
        else:
            self.numbers, self.target, _ = generate_puzzle(
                self.np_random,
                min_numbers=self.min_numbers,  # type: ignore[arg-type]
                max_numbers=self.max_numbers,  # type: ignore[arg-type]
                max_number=self.max_number,  # type: ignore[arg-type]
                max_target=self.max_target,  # type: ignore[arg-type]
            )
        self._answer, self._value, self._numbers_ok, self._reward, self._solved = None, None, False, 0.0, False

    def parse_action(self, text: str) -> str | None:
        """Reference scoring: the answer stripped, ``None`` when empty. Strict scoring: the expression in canonical
        spacing (``(3 + 5) * 2``), or ``None`` when ``text`` is not one."""
        if self.scoring == "reference":
            return text.strip() or None
        expression = text.strip().strip("\"'`").strip()
        if "=" in expression:  # "expr = 24" is accepted; the claimed value is ignored
            expression, _, rhs = expression.partition("=")
            if not re.fullmatch(r"\s*\d{1,12}\s*", rhs):
                return None
        try:
            tokens = tokenize(expression)
            _Parser(tokens).parse()
        except ExpressionError:
            return None
        return _join(tokens)

    def _apply_action(self, action: str) -> StepOutcome:
        if self._answer is not None:  # already answered: nothing changes
            return StepOutcome(terminated=True, success=self._solved)
        self._answer = action
        if self.scoring == "reference":
            verdict = reference_score(action, self.numbers, self.target, format_score=self.format_score)
            self._value, self._numbers_ok, self._solved = verdict.value, verdict.numbers_ok, verdict.correct
            reward = verdict.reward
            extra: dict[str, Any] = {
                "numbers_ok": verdict.numbers_ok,
                "value": None if verdict.value is None else _value_text(verdict.value),
                "evaluation_error": verdict.error,
            }
            effective = reward > 0  # the reference's action_is_effective
        else:
            value, used = evaluate(action)
            self._numbers_ok = uses_numbers(used, self.numbers, use_all=self.use_all_numbers)
            self._value = value
            self._solved = self._numbers_ok and value is not None and value == self.target
            reward = 1.0 if self._solved else self.format_score
            extra = {"numbers_ok": self._numbers_ok, "value": None if value is None else str(value)}
            effective = True
        self._reward = reward
        return StepOutcome(reward=reward, terminated=True, effective=effective, success=self._solved, extra=extra)

    def is_success(self) -> bool:
        return self._solved

    def state_text(self) -> str:
        text = f"Numbers: [{', '.join(map(str, self.numbers))}]\nTarget: {self.target}"
        if self._answer is None:
            return text
        verdict = "correct" if self._solved else "wrong"
        if self.scoring == "strict":
            value = "undefined (division by zero)" if self._value is None else str(self._value)
            return text + f"\nYour answer: {self._answer} = {value} ({verdict})"
        if not self._numbers_ok:
            return text + f"\nYour answer: {self._answer} (it does not use exactly the given numbers: {verdict})"
        value = "cannot be evaluated" if self._value is None else _value_text(self._value)
        return text + f"\nYour answer: {self._answer} = {value} ({verdict})"

    def reference_state_text(self) -> str:
        """The reference's rendering: ``Target: 4, nums: [3, 5, 2]``; after the answer ``Your answer get 1 points.``"""
        if self._answer is None:
            return f"Target: {self.target}, nums: {list(self.numbers)}"
        return f"Your answer get {_points(self._reward)} points."

    def state_view(self) -> dict[str, Any]:
        return {
            "numbers": list(self.numbers),
            "target": self.target,
            "task_index": self.task_index,
            "answer": self._answer,
            "value": None if self._value is None else _value_text(self._value),
            "solved": self._solved,
        }

    def check_reasoning(self, think: str, view_before: dict[str, Any], actions: list[str]) -> dict[str, int]:
        """Check arithmetic claims ``<expression> = <number>`` in the thinking exactly (``25 - 5 = 20``,
        ``(6 + 4) * 3 = 30``, ``6 / 4 = 3/2``); each distinct claim counts once."""
        supported = contradicted = 0
        seen: set[tuple[str, str]] = set()
        for m in _CLAIM.finditer(think[:MAX_THINK_CHARS]):
            lhs = _last_expression(m.group(1))
            if lhs is None:
                continue
            key = (_join(lhs), m.group(2))
            if key in seen:
                continue
            seen.add(key)
            try:
                value = _Parser(lhs).parse()
            except ExpressionError:
                continue
            try:
                claimed: Fraction | None = Fraction(m.group(2))
            except ZeroDivisionError:  # "= 3/0" claims an undefined value: never true
                claimed = None
            if value is not None and claimed is not None and value == claimed:
                supported += 1
            else:
                contradicted += 1
        return {"supported": supported, "contradicted": contradicted}


def _value_text(value: Any) -> str:
    """A value for info and state text: ``str`` of a Fraction or number, long integers cut."""
    text = str(value)
    return text if len(text) <= 80 else f"{text[:40]}...({len(text)} characters)"


def _join(tokens: list[str]) -> str:
    out = ""
    for t in tokens:
        if t in _OPS:
            out += f" {t} "
        else:
            out += t
    return out


def _last_expression(text: str) -> list[str] | None:
    """Tokens of the longest well-formed expression that ends ``text`` and contains an operator, or ``None``."""
    try:
        tokens = tokenize(text)
    except ExpressionError:
        return None
    for start in range(len(tokens)):  # shortest suffix trimming first: "so 3 + 5" -> "3 + 5"
        suffix = tokens[start:]
        if not any(t in _OPS for t in suffix):
            return None
        try:
            _Parser(suffix).parse()
        except ExpressionError:
            continue
        return suffix
    return None
