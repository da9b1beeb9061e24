"""Countdown for LLM agents: combine the given numbers with ``+ - * /`` into an expression equal to the target.

:class:`~ragen_envs.countdown.env.CountdownEnv` (``ragen/Countdown-v0``) poses the reference's tasks or ragen's own
puzzles and scores answers as the reference does or with ragen's exact checker; its module docstring describes both
choices. One module per job:

* :mod:`~ragen_envs.countdown.env`: the env;
* :mod:`~ragen_envs.countdown.dataset`: the reference's task list (``Countdown-Tasks-3to4`` regenerated, filtered as
  RAGEN filters it);
* :mod:`~ragen_envs.countdown.generator`: ragen's own puzzles;
* :mod:`~ragen_envs.countdown.reference_scoring`: RAGEN's ``compute_reward``, with :func:`safe_eval` in place of
  ``eval``;
* :mod:`~ragen_envs.countdown.expression`: ragen's exact checker (strict scoring, the reasoning check);
* :mod:`~ragen_envs.countdown.solver`: :func:`solve_countdown`, a solution of any puzzle.

Every name below is importable from this package.

    from ragen_envs.countdown import CountdownEnv, solve_countdown
"""

from __future__ import annotations

from ragen_envs.countdown.dataset import (
    REFERENCE_DATASET_ROWS,
    REFERENCE_MAX_INSTANCES,
    REFERENCE_TASK_SEED,
    generate_reference_tasks,
    has_solution,
    reference_tasks,
)
from ragen_envs.countdown.env import SCORINGS, TASK_SOURCES, CountdownEnv
from ragen_envs.countdown.expression import (
    MAX_DEPTH,
    MAX_DIGITS,
    MAX_EXPRESSION_CHARS,
    ExpressionError,
    evaluate,
    tokenize,
    uses_numbers,
)
from ragen_envs.countdown.generator import generate_puzzle
from ragen_envs.countdown.reference_scoring import (
    MAX_ANSWER_CHARS,
    MAX_EVAL_DEPTH,
    MAX_INT_BITS,
    REFERENCE_TOLERANCE,
    EvaluationError,
    ReferenceVerdict,
    reference_numbers_match,
    reference_score,
    safe_eval,
)
from ragen_envs.countdown.solver import solve_countdown

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_DEPTH",
    "MAX_DIGITS",
    "MAX_EVAL_DEPTH",
    "MAX_EXPRESSION_CHARS",
    "MAX_INT_BITS",
    "REFERENCE_DATASET_ROWS",
    "REFERENCE_MAX_INSTANCES",
    "REFERENCE_TASK_SEED",
    "REFERENCE_TOLERANCE",
    "SCORINGS",
    "TASK_SOURCES",
    "CountdownEnv",
    "EvaluationError",
    "ExpressionError",
    "ReferenceVerdict",
    "evaluate",
    "generate_puzzle",
    "generate_reference_tasks",
    "has_solution",
    "reference_numbers_match",
    "reference_score",
    "reference_tasks",
    "safe_eval",
    "solve_countdown",
    "tokenize",
    "uses_numbers",
]
