"""ragen's exact arithmetic checker for Countdown answers (``scoring="strict"`` and the check of the arithmetic claims
in a reply's thinking).

A tokenizer and a recursive-descent parser evaluate an expression exactly over :class:`fractions.Fraction`
(``6 / 4 * 2 == 3``): non-negative integer literals, binary ``+ - * /`` (also ``×`` ``÷``, ``x`` ``X``) and
parentheses. Nothing is executed; anything else is an :class:`ExpressionError`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

#: Longest expression (characters) the strict checker parses; longer text is not a valid answer.
MAX_EXPRESSION_CHARS = 256
#: Deepest parenthesis nesting the strict checker accepts.
MAX_DEPTH = 32
#: Largest integer literal (digits) the strict checker accepts; also the bound on ``options["numbers"]``.
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


def evaluate_tokens(tokens: list[str]) -> Fraction | None:
    """The exact value of an already tokenized expression (``None`` on division by zero); :class:`ExpressionError`
    when the tokens are not a well-formed expression."""
    return _Parser(tokens).parse()


def join_tokens(tokens: list[str]) -> str:
    """The tokens as one expression in canonical spacing (``(3 + 5) * 2``)."""
    out = ""
    for t in tokens:
        if t in _OPS:
            out += f" {t} "
        else:
            out += t
    return out


def last_expression(text: str) -> list[str] | None:
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
            evaluate_tokens(suffix)
        except ExpressionError:
            continue
        return suffix
    return None
