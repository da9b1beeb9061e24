"""Countdown as a text env: combine the given numbers with ``+ - * /`` into an expression equal to the target.

Puzzles are generated procedurally and are solvable by construction: 3 or 4 numbers are drawn, combined by a random
expression tree that uses each of them once (with positive integer intermediate results, as in the TV game), and the
puzzle is kept only when that expression's value is a target in range that is not one of the numbers.
:func:`solve_countdown` finds a solution of any puzzle (an oracle for tests and the leaderboard's reference agent).

The answer is checked exactly and safely: a small tokenizer and recursive-descent parser evaluate it over
:class:`fractions.Fraction` (so ``6 / 4 * 2 == 3`` exactly); model text is never passed to ``eval``. Like the
reference (TinyZero's checker), every given number must be used exactly once (``use_all_numbers=True``); with
``use_all_numbers=False`` each may be used at most once.

Action space: ``UnicodeText``; a valid action is an arithmetic expression of non-negative integers, the binary
operators ``+ - * /`` (also ``×`` and ``÷``) and parentheses, optionally followed by ``= <number>`` (ignored). Unary
minus, decimals, powers and anything else make the action invalid (the protocol's format penalty applies).

Observation: ``Numbers: [a, b, c]`` and ``Target: t``; after an answer, the answer and its value.

Rewards (reference): ``1.0`` when the expression uses the numbers as required and equals the target; ``format_score``
(0.1) for any other well-formed expression (wrong value, wrong numbers, division by zero); an invalid action earns 0
(and the protocol's -0.1 format penalty).

Episode end: terminated by the first well-formed answer (single turn). Through the protocol: 1 action per turn and per
episode; up to 5 turns, so a malformed reply spends a turn, as with the reference's global turn cap.

Arguments:
    min_numbers / max_numbers: how many numbers a puzzle has (each drawn per seed; default 3 and 4).
    max_number: the numbers are drawn from 1..max_number (default 100).
    max_target: targets lie in 1..max_target (default 100).
    use_all_numbers: every number must be used exactly once (reference) or at most once.
    format_score: reward of a well-formed but wrong answer (reference 0.1).
    Reset options ``{"numbers": [...], "target": t}`` pose a fixed puzzle instead of a generated one.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from ragen_envs.core import BaseTextEnv, StepOutcome, check_arg
from ragen_envs.grounding import MAX_THINK_CHARS

#: Longest expression (characters) the checker parses; longer text is not a valid answer.
MAX_EXPRESSION_CHARS = 256
#: Deepest parenthesis nesting the checker accepts.
MAX_DEPTH = 32
#: Largest integer literal (digits) the checker accepts.
MAX_DIGITS = 12

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


# "<expression> = <number>", where the number is not itself the start of an expression ("2 + 2 = 2 * 2" is no claim).
_CLAIM = re.compile(r"([0-9+\-*/×÷() \t]{3,120})=\s*(\d{1,12}(?:/\d{1,12})?)(?![\d(]|\.\d|\s*[+\-*/×÷])")


class CountdownEnv(BaseTextEnv):
    """Reach the target with the given numbers and ``+ - * /``. See the module docstring."""

    default_actions_per_turn = 1
    default_max_actions_per_episode = 1
    default_max_turns = 5
    max_action_chars = 512

    def __init__(
        self,
        *,
        min_numbers: int = 3,
        max_numbers: int = 4,
        max_number: int = 100,
        max_target: int = 100,
        use_all_numbers: bool = True,
        format_score: float = 0.1,
        render_mode: str | None = None,
    ) -> None:
        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        check_arg(is_int(min_numbers) and 2 <= min_numbers <= 6, "min_numbers", min_numbers, "an int in 2..6")
        check_arg(
            is_int(max_numbers) and min_numbers <= max_numbers <= 6,
            "max_numbers",
            max_numbers,
            f"an int in {min_numbers}..6 (>= min_numbers)",
        )
        check_arg(is_int(max_number) and 2 <= max_number <= 10_000, "max_number", max_number, "an int in 2..10000")
        check_arg(is_int(max_target) and 2 <= max_target <= 1_000_000, "max_target", max_target, "an int in 2..1000000")
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
        self.min_numbers, self.max_numbers = min_numbers, max_numbers
        self.max_number, self.max_target = max_number, max_target
        self.use_all_numbers = use_all_numbers
        self.format_score = float(format_score)
        self.numbers: list[int] = []
        self.target = 0
        self._answer: str | None = None
        self._value: Fraction | None = None
        self._solved = False

    @property
    def instructions(self) -> str:
        rule = "each number exactly once" if self.use_all_numbers else "each number at most once"
        return (
            "You are solving a Countdown puzzle: combine the given numbers into an arithmetic expression that equals "
            f"the target. Use the operations +, -, *, / and parentheses, and {rule}. The answer is the expression "
            "alone, for example <answer>(1 + 2) * 3</answer>.\n"
            f"Reward: 1 for a correct expression, {self.format_score:g} for a well-formed but wrong one."
        )

    def describe_actions(self) -> str:
        return f"one arithmetic expression over the numbers {self.numbers} with + - * / and parentheses"

    def _reset_state(self, options: dict[str, Any] | None) -> None:
        if options and "numbers" in options:
            numbers, target = options.get("numbers"), options.get("target")
            check_arg(
                isinstance(numbers, (list, tuple))
                and 1 <= len(numbers) <= 8
                and all(isinstance(n, (int, np.integer)) and 0 <= n < 10**MAX_DIGITS for n in numbers),
                "options['numbers']",
                numbers,
                "a list of 1..8 non-negative ints",
            )
            check_arg(isinstance(target, (int, np.integer)), "options['target']", target, "an int")
            self.numbers, self.target = [int(n) for n in numbers], int(target)  # type: ignore[union-attr, arg-type]
        else:
            self.numbers, self.target, _ = generate_puzzle(
                self.np_random,
                min_numbers=self.min_numbers,
                max_numbers=self.max_numbers,
                max_number=self.max_number,
                max_target=self.max_target,
            )
        self._answer, self._value, self._solved = None, None, False

    def parse_action(self, text: str) -> str | None:
        """The expression in canonical spacing (``(3 + 5) * 2``), or ``None`` when ``text`` is not one."""
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
        value, used = evaluate(action)
        numbers_ok = uses_numbers(used, self.numbers, use_all=self.use_all_numbers)
        self._answer, self._value = action, value
        self._solved = numbers_ok and value is not None and value == self.target
        reward = 1.0 if self._solved else self.format_score
        return StepOutcome(
            reward=reward,
            terminated=True,
            effective=True,
            success=self._solved,
            extra={"numbers_ok": numbers_ok, "value": None if value is None else str(value)},
        )

    def is_success(self) -> bool:
        return self._solved

    def state_text(self) -> str:
        text = f"Numbers: [{', '.join(map(str, self.numbers))}]\nTarget: {self.target}"
        if self._answer is not None:
            value = "undefined (division by zero)" if self._value is None else str(self._value)
            verdict = "correct" if self._solved else "wrong"
            text += f"\nYour answer: {self._answer} = {value} ({verdict})"
        return text

    def state_view(self) -> dict[str, Any]:
        return {
            "numbers": list(self.numbers),
            "target": self.target,
            "answer": self._answer,
            "value": None if self._value is None else str(self._value),
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
