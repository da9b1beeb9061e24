"""Countdown as a text env: combine the given numbers with ``+ - * /`` into an expression equal to the target.

Two independent choices, each with the reference's behaviour as the default:

* ``tasks`` -- which puzzles ``reset`` poses.

  - ``"reference"`` (default): a fixed list reproducing the reference's tasks. RAGEN's ``CountdownEnv`` loads the first
    ``max_instances`` (20,000) rows of TinyZero's ``Countdown-Tasks-3to4`` dataset, keeps the rows its ``has_solution``
    accepts, and ``reset(seed)`` poses row ``seed % len(kept)``. That dataset cannot be downloaded here, so
    :func:`generate_reference_tasks` regenerates its distribution with the procedure the dataset was made by (see
    :mod:`ragen_envs.countdown.dataset`);
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
``scripts/download_data.py`` (the dataset's URL). The dataset and generator sources are listed in
:mod:`ragen_envs.countdown.dataset`.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from ragen_envs.core import BaseTextEnv, StepOutcome, check_arg
from ragen_envs.countdown.dataset import REFERENCE_DATASET_ROWS, REFERENCE_MAX_INSTANCES, reference_tasks
from ragen_envs.countdown.expression import (
    MAX_DIGITS,
    ExpressionError,
    evaluate,
    evaluate_tokens,
    join_tokens,
    last_expression,
    tokenize,
    uses_numbers,
)
from ragen_envs.countdown.generator import generate_puzzle
from ragen_envs.countdown.reference_scoring import reference_score
from ragen_envs.grounding import MAX_THINK_CHARS

TASK_SOURCES = ("reference", "generated")
SCORINGS = ("reference", "strict")

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
            evaluate_tokens(tokens)
        except ExpressionError:
            return None
        return join_tokens(tokens)

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
            lhs = last_expression(m.group(1))
            if lhs is None:
                continue
            key = (join_tokens(lhs), m.group(2))
            if key in seen:
                continue
            seen.add(key)
            try:
                value = evaluate_tokens(lhs)
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


def _points(reward: float) -> str:
    """A reward as the reference prints it: its rewards are the ints 0 and 1 and the float ``format_score``."""
    return str(int(reward)) if reward in (0.0, 1.0) else str(reward)
