"""Countdown: solvable generated puzzles, the exact and safe checker, rewards, the solver, reasoning checks."""

from __future__ import annotations

from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest

import ragen_envs  # noqa: F401
from ragen_envs.countdown import (
    MAX_DEPTH,
    CountdownEnv,
    ExpressionError,
    evaluate,
    generate_puzzle,
    solve_countdown,
    tokenize,
    uses_numbers,
)


def reply(answer: str) -> str:
    return f"<think>let me compute</think><answer>{answer}</answer>"


def test_evaluate_is_exact_and_follows_precedence():
    assert evaluate("(6 / 4) * 2") == (Fraction(3), [6, 4, 2])
    assert evaluate("1 + 2 * 3") == (Fraction(7), [1, 2, 3])
    assert evaluate("(1 + 2) * 3") == (Fraction(9), [1, 2, 3])
    assert evaluate("10 - 4 - 3") == (Fraction(3), [10, 4, 3])  # left-associative
    assert evaluate("8 / 4 / 2") == (Fraction(1), [8, 4, 2])
    assert evaluate("1 / 3 + 1 / 3 + 1 / 3")[0] == 1  # no floating point error
    assert evaluate("3 × 4 ÷ 6")[0] == 2
    assert evaluate("5 / (3 - 3)") == (None, [5, 3, 3])  # division by zero: well-formed, no value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "-3 + 5",  # unary minus is not a Countdown operation
        "3 ** 2",
        "2.5 * 4",
        "(1 + 2",
        "1 + 2)",
        "1 2",
        "abs(3)",
        "__import__('os').system('echo pwned')",
        "open('/etc/passwd').read()",
        "1 + 2; 3",
        "9" * 13,
        "(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1),
        "1+" * 200 + "1",
    ],
)
def test_checker_rejects_what_is_not_an_expression(text):
    with pytest.raises(ExpressionError):
        evaluate(text)


def test_tokenizer_output_and_nesting_limit():
    assert tokenize(" (12+3)x4 ") == ["(", "12", "+", "3", ")", "*", "4"]
    deep = "(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH
    assert evaluate(deep)[0] == 1


def test_uses_numbers():
    assert uses_numbers([3, 5, 3], [5, 3, 3])
    assert not uses_numbers([3, 5], [5, 3, 3])
    assert uses_numbers([3, 5], [5, 3, 3], use_all=False)
    assert not uses_numbers([3, 3, 3], [5, 3, 3], use_all=False)


def test_generated_puzzles_are_solvable_and_in_range():
    rng = np.random.default_rng(0)
    sizes = set()
    for _ in range(300):
        numbers, target, solution = generate_puzzle(rng)
        sizes.add(len(numbers))
        assert 3 <= len(numbers) <= 4 and all(1 <= n <= 100 for n in numbers)
        assert 1 <= target <= 100 and target not in numbers
        value, used = evaluate(solution)
        assert value == target and uses_numbers(used, numbers)
    assert sizes == {3, 4}


def test_solver_finds_solutions_and_reports_impossible_puzzles():
    rng = np.random.default_rng(1)
    for _ in range(100):
        numbers, target, _ = generate_puzzle(rng)
        found = solve_countdown(numbers, target)
        assert found is not None
        value, used = evaluate(found)
        assert value == target and uses_numbers(used, numbers)
    assert solve_countdown([1, 1, 1], 100) is None
    assert solve_countdown([2, 3], 1) in ("3 - 2",)
    assert solve_countdown([3, 8, 50], 8, use_all=False) == "8"
    found = solve_countdown([1, 5, 5, 5], 24)  # needs a fraction: 5 * (5 - 1 / 5)
    assert found is not None and evaluate(found)[0] == 24


def test_same_seed_same_puzzle_and_reset_options():
    env = CountdownEnv()
    env.reset(seed=11)
    first = env.state_view()
    env.reset(seed=11)
    assert env.state_view() == first
    env.reset(seed=12)
    assert env.state_view() != first
    obs, _ = env.reset(options={"numbers": [2, 3, 4], "target": 24})
    assert obs == "Numbers: [2, 3, 4]\nTarget: 24"
    with pytest.raises(ValueError, match="numbers"):
        env.reset(options={"numbers": "2 3 4", "target": 24})


def test_rewards_through_the_protocol():
    env = gym.make("ragen/Countdown-v0")
    env.reset(options={"numbers": [2, 3, 4], "target": 24})
    _, reward, terminated, _, info = env.step(reply("2 * 3 * 4"))
    assert reward == 1.0 and terminated and info["success"] and info["numbers_ok"] and info["value"] == "24"
    assert info["actions"] == ["2 * 3 * 4"]

    env.reset(options={"numbers": [2, 3, 4], "target": 24})
    _, reward, terminated, _, info = env.step(reply("(2 + 3) * 4"))  # wrong value: format score
    assert reward == pytest.approx(0.1) and terminated and not info["success"]

    env.reset(options={"numbers": [2, 3, 4], "target": 24})
    _, reward, _, _, info = env.step(reply("6 * 4"))  # right value, wrong numbers
    assert reward == pytest.approx(0.1) and not info["numbers_ok"] and not info["success"]

    env.reset(options={"numbers": [2, 3, 4], "target": 8})
    _, reward, _, _, info = env.step(reply("2 * 4"))  # 3 unused: the reference requires every number
    assert reward == pytest.approx(0.1)

    env.reset(options={"numbers": [2, 3, 4], "target": 24})
    _, reward, terminated, _, info = env.step(reply("2 * 3 * 4 = 24"))
    assert reward == 1.0

    env.reset(options={"numbers": [2, 3, 4], "target": 24})
    _, reward, terminated, truncated, info = env.step(reply("twenty four"))
    assert reward == pytest.approx(-0.1) and not terminated and not truncated
    assert "arithmetic expression" in info["reason"]


def test_at_most_once_variant_and_format_score():
    env = gym.make("ragen/Countdown-v0", use_all_numbers=False, format_score=0.0)
    env.reset(options={"numbers": [2, 3, 4], "target": 8})
    assert env.step(reply("2 * 4"))[1] == 1.0
    env.reset(options={"numbers": [2, 3, 4], "target": 8})
    assert env.step(reply("2 * 2 * 2"))[1] == 0.0
    assert "at most once" in env.unwrapped.instructions


def test_division_by_zero_answer_is_well_formed_but_wrong():
    env = CountdownEnv()
    env.reset(options={"numbers": [5, 3, 3], "target": 5})
    _, reward, terminated, _, info = env.step("5 / (3 - 3)")
    assert reward == pytest.approx(0.1) and terminated and info["value"] is None
    assert "division by zero" in env.state_text()


def test_check_reasoning_verifies_arithmetic_claims_exactly():
    env = CountdownEnv()
    env.reset(seed=0)
    check = lambda t: env.check_reasoning(t, env.state_view(), [])  # noqa: E731
    assert check("25 - 5 = 20, then (6 + 4) * 3 = 30. Also 6/4 = 3/2.") == {"supported": 3, "contradicted": 0}
    assert check("First 7 * 8 = 54, so 54 + 2 = 56.") == {"supported": 1, "contradicted": 1}
    assert check("I think 3 + 3 = 6. I think 3 + 3 = 6.") == {"supported": 1, "contradicted": 0}
    assert check("The target is 24 = answer.") == {"supported": 0, "contradicted": 0}
    assert check("2 + 2 = 2 * 2, and 1+1=1+1") == {"supported": 0, "contradicted": 0}  # identities, not values
    assert check("So 6 / 4 = 3/2.") == {"supported": 1, "contradicted": 0}
    assert check("") == {"supported": 0, "contradicted": 0}


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"min_numbers": 1}, "min_numbers"),
        ({"max_numbers": 2}, "max_numbers"),
        ({"max_number": 1}, "max_number"),
        ({"max_target": 0}, "max_target"),
        ({"use_all_numbers": 1}, "use_all_numbers"),
        ({"format_score": None}, "format_score"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=f"invalid argument {name}="):
        gym.make("ragen/Countdown-v0", **kwargs)
