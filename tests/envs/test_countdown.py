"""Countdown: the reference's tasks and scoring (the defaults), ragen's generated puzzles and strict checker (options),
the safe evaluator, the solver, reasoning checks."""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import time
from collections import Counter
from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.seeding import np_random

import ragen_envs  # noqa: F401
from ragen_envs.countdown import (
    MAX_ANSWER_CHARS,
    MAX_DEPTH,
    REFERENCE_MAX_INSTANCES,
    CountdownEnv,
    EvaluationError,
    ExpressionError,
    evaluate,
    generate_puzzle,
    generate_reference_tasks,
    has_solution,
    reference_numbers_match,
    reference_score,
    reference_tasks,
    safe_eval,
    solve_countdown,
    tokenize,
    uses_numbers,
)
from ragen_envs.countdown.dataset import _reaches

#: Today's behaviour before the reference became the default: ragen's generator and strict checker.
OLD = {"tasks": "generated", "scoring": "strict"}


def reply(answer: str) -> str:
    return f"<think>let me compute</think><answer>{answer}</answer>"


def sos_search(target: int, nums: list[int]) -> bool:
    """Stream-of-Search's ``CountDown.search`` with its ``combine_nums``, transcribed: can ``target`` be reached?"""
    if len(nums) == 1:
        return nums[0] == target
    for i, j in itertools.combinations(range(len(nums)), 2):
        rest = [nums[k] for k in range(len(nums)) if k not in (i, j)]
        a, b = nums[i], nums[j]
        results = [a + b, a * b]
        if a <= b:
            results.append(b - a)
            if a != 0 and b % a == 0:
                results.append(b // a)
        else:
            results.append(a - b)
            if b != 0 and a % b == 0:
                results.append(a // b)
        if any(sos_search(target, rest + [r]) for r in results):
            return True
    return False


# ------------------------------------------------------------------------------------------------- reference tasks
def test_reference_task_list_is_fixed_sized_and_mixed_as_the_dataset():
    rows = generate_reference_tasks()
    assert len(rows) == REFERENCE_MAX_INSTANCES == 20_000
    assert rows[:3] == [(60, (59, 95, 94)), (39, (91, 70, 27, 3)), (19, (3, 36, 7))]  # pinned: the list never moves
    assert hashlib.sha256(repr(rows).encode()).hexdigest()[:16] == "b942e6397e76fe43"
    sizes = Counter(len(nums) for _, nums in rows)
    assert sizes == {3: 9_897, 4: 10_103}  # random.randint(3, 4): about half each
    assert {t for t, _ in rows} == set(range(10, 101))  # random.choice(range(10, 101))
    assert {n for _, nums in rows for n in nums} == set(range(1, 100))  # random.randint(1, 99)
    assert generate_reference_tasks(1_234) == rows[:1_234]  # a shorter list is a prefix

    kept = reference_tasks()
    assert kept == tuple(row for row in rows if has_solution(row[1], row[0]))  # the reference's filter, in order
    assert len(kept) == 10_561
    assert Counter(len(nums) for _, nums in kept) == {3: 7_049, 4: 3_512}
    assert reference_tasks() is kept  # cached


def test_reference_rows_are_solvable_by_the_generator_search():
    rows = generate_reference_tasks()
    assert all(sos_search(t, list(nums)) for t, nums in rows[::40])  # 500 rows
    rng = random.Random(0)
    for size in (3, 4):  # the vectorised search agrees with the transcription, on solvable and unsolvable draws
        cases = [([rng.randint(1, 99) for _ in range(size)], rng.randint(10, 100)) for _ in range(800)]
        nums = np.array([n for n, _ in cases], dtype=np.int32)
        targets = np.array([t for _, t in cases], dtype=np.int32)
        got = _reaches([nums[:, i] for i in range(size)], targets)
        assert got.tolist() == [sos_search(t, n) for n, t in cases]
        assert 0 < got.sum() < len(cases)


def test_has_solution_tries_signs_only():
    assert has_solution([3, 5, 2], 4)  # 5 + 2 - 3
    assert has_solution([44, 19, 35], 98)
    assert has_solution([19, 36, 55, 7], 65)  # 55 + 36 - 19 - 7
    assert not has_solution([2, 3, 4], 24)  # needs *
    assert not has_solution([1, 5, 5, 5], 24)


def test_solver_solves_reference_tasks_under_reference_scoring():
    for target, nums in reference_tasks()[::35]:  # ~300 of the 10,561 (all of them: see the report of this change)
        answer = solve_countdown(list(nums), target)
        assert answer is not None and reference_score(answer, nums, target).reward == 1.0


def test_same_seed_same_task_and_the_reference_indexing():
    kept = reference_tasks()
    env = CountdownEnv()
    obs, _ = env.reset(seed=7)
    target, nums = kept[7]
    assert env.state_view()["task_index"] == 7 and env.numbers == list(nums) and env.target == target
    assert obs == f"Numbers: {list(nums)}\nTarget: {target}"
    assert env.reference_state_text() == f"Target: {target}, nums: {list(nums)}"
    first = env.state_view()
    env.reset(seed=7 + len(kept))  # seed % len(filtered)
    assert env.state_view() == first
    env.reset(seed=8)
    assert env.state_view() != first

    env.reset(seed=3)
    env.reset()  # no seed: an index drawn from the env's generator, reproducibly
    drawn = env.state_view()["task_index"]
    env.reset(seed=3)
    env.reset()
    assert env.state_view()["task_index"] == drawn

    small = CountdownEnv(max_instances=1_000)
    small_kept = reference_tasks(1_000)
    assert small_kept == kept[: len(small_kept)] and len(small_kept) < len(kept)
    small.reset(seed=len(small_kept) + 2)
    assert small.state_view()["task_index"] == 2


def test_reset_options_pose_a_fixed_puzzle():
    for kwargs in ({}, OLD):
        env = CountdownEnv(**kwargs)
        obs, _ = env.reset(options={"numbers": [2, 3, 4], "target": 24})
        assert obs == "Numbers: [2, 3, 4]\nTarget: 24" and env.state_view()["task_index"] is None
        assert env.reference_state_text() == "Target: 24, nums: [2, 3, 4]"
        with pytest.raises(ValueError, match="numbers"):
            env.reset(options={"numbers": "2 3 4", "target": 24})


def test_reference_instruction_is_the_reference_text():
    assert CountdownEnv.reference_instruction == (
        "You are solving the Countdown puzzle. You should use the num list to create an equation that equals the "
        "target. Example answer format: <think> To find an equation using [3, 5, 2] to get 4. Let's check 2 + 5 = 7, "
        "7 - 3 = 4. So the answer is 2 + 5 - 3 = 4. </think><answer>2 + 5 - 3</answer>"
    )


# ------------------------------------------------------------------------------------------------- reference scoring
@pytest.mark.parametrize(
    "answer, numbers, target, reward",
    [
        ("2 + 5 - 3", [3, 5, 2], 4, 1.0),  # correct
        ("(5 + 2) - 3", [3, 5, 2], 4, 1.0),
        ("2 + 5 + 3", [3, 5, 2], 4, 0.1),  # right numbers, wrong value
        ("2 + 5", [3, 5, 2], 4, 0.0),  # a number missing
        ("2 + 5 - 3 - 3", [3, 5, 2], 4, 0.0),  # a number twice
        ("2 + 5 - 3 = 4", [3, 5, 2], 4, 0.0),  # "= 4" adds a number: the reference gives 0
        ("6 + 5 - 3", [3, 5, 2], 4, 0.0),  # wrong numbers, right value: 0
        ("-3 + 5 + 2", [3, 5, 2], 4, 1.0),  # unary minus
        ("-(3 - 5) + 2", [3, 5, 2], 4, 1.0),
        ("6 / 4 * 2", [6, 4, 2], 3, 1.0),  # true division
        ("(1 / 10 + 2 / 10) * 10", [1, 10, 2, 10, 10], 3, 1.0),  # 3.0000000000000004: within 1e-5
        ("4.000001", [4, 1], 4, 1.0),  # "4.000001" holds the integers 4 and 1; 1e-6 off
        ("4.0001", [4, 1], 4, 0.1),  # 1e-4 off
        ("8 / (4 - 4)", [4, 4, 8], 1, 0.1),  # evaluation error (ZeroDivisionError): 0.1
        ("2 + 5 -* 3", [3, 5, 2], 4, 0.1),  # syntax error: 0.1
        ("abs(2 + 5 - 3)", [3, 5, 2], 4, 0.1),  # a call: an evaluation error, as without builtins
        ("(2).__add__(5) - 3", [3, 5, 2], 4, 0.1),  # attributes are never evaluated (eval would give 4)
        ("2 ** 5 // 8 % 3", [2, 5, 8, 3], 1, 1.0),  # ** // %: 32 // 8 % 3 == 1
        ("True * (2 + 5 - 3)", [3, 5, 2], 4, 1.0),  # bool constants are numbers to eval too
        ("٢ + ٥ - ٣", [3, 5, 2], 4, 0.1),  # Arabic-Indic digits: the numbers match (\d), eval cannot parse them
        ("02 + 5 - 3", [3, 5, 2], 4, 0.1),  # int("02") == 2, but "02" is a syntax error
        ("__import__('os').system('echo pwned')", [3, 5, 2], 4, 0.0),  # no numbers
    ],
)
def test_reference_scoring_table(answer, numbers, target, reward):
    assert reference_score(answer, numbers, target).reward == pytest.approx(reward)
    if "__" not in answer:  # the table is the reference's own verdict (ragen differs on attribute access only)
        assert transcribed_reference_reward(answer, numbers, target) == pytest.approx(reward)


def transcribed_reference_reward(answer: str, numbers: list[int], target: int) -> float:
    """RAGEN's check_format / check_correctness / compute_reward, transcribed; eval runs on the table's own text."""
    import re

    try:
        if sorted(int(n) for n in re.findall(r"\d+", answer)) != sorted(numbers):
            return 0.0
    except Exception:  # noqa: BLE001 -- the reference's own bare except, transcribed
        return 0.0
    try:
        result = eval(answer, {"__builtins__": None}, {})
        return 1.0 if abs(result - target) < 1e-5 else 0.1
    except Exception:  # noqa: BLE001 -- the reference's own bare except, transcribed
        return 0.1


def test_reference_scoring_reports_numbers_value_and_errors():
    verdict = reference_score("6 / 4 * 2", [6, 4, 2], 3)
    assert verdict == (1.0, True, True, 3.0, None)
    verdict = reference_score("8 / (4 - 4)", [4, 4, 8], 1, format_score=0.25)
    assert verdict.reward == 0.25 and verdict.numbers_ok and not verdict.correct and "ZeroDivision" in verdict.error
    assert reference_score("1 + 2", [1, 2, 3], 3) == (0.0, False, False, None, None)
    assert reference_numbers_match("1 + 2 + 3", [3, 2, 1]) and not reference_numbers_match("1 + 2 + 3", [1, 2])
    assert reference_numbers_match("0001 + 2", [1, 2])  # int("0001") == 1, as the reference's check_format
    assert reference_numbers_match("0" * 5_000 + "7 + 2", [7, 2])


def random_expression(rng: random.Random, depth: int = 0) -> str:
    """A random well-formed expression of the kind safe_eval must evaluate exactly as eval does."""
    if depth >= 4 or rng.random() < 0.3:
        kind = rng.random()
        if kind < 0.75:
            return str(rng.randint(0, 99))
        if kind < 0.9:
            return f"{rng.randint(0, 99)}.{rng.randint(0, 99)}"
        return rng.choice(["0", "1", "1000000", "3j", "True", "1e300", "0.5"])
    if rng.random() < 0.15:
        return f"{rng.choice('+-')}{random_expression(rng, depth + 1)}"
    op = rng.choice(["+", "-", "*", "/", "//", "%", "**"])
    left = random_expression(rng, depth + 1)
    right = str(rng.randint(-3, 4)) if op == "**" else random_expression(rng, depth + 1)
    text = f"{left} {op} {right}"
    return f"({text})" if rng.random() < 0.6 else text


def outcome(fn, text):  # type: ignore[no-untyped-def]
    try:
        return ("value", repr(fn(text)))
    except Exception:  # noqa: BLE001 -- eval's errors, EvaluationError: both "cannot be evaluated"
        return ("error", None)


def test_safe_eval_agrees_with_python_eval_on_random_expressions():
    rng = random.Random(1234)
    errors = 0
    for _ in range(3_000):
        text = random_expression(rng)
        # eval only here, in the test, on expressions the test itself generated
        expected = outcome(lambda s: eval(s, {"__builtins__": None}, {}), text)
        assert outcome(safe_eval, text) == expected, text
        errors += expected[0] == "error"
    assert 0 < errors < 1_500  # both outcomes are exercised


def test_safe_eval_refuses_everything_else():
    for text in ["x", "abs(1)", "(1).real", "[1][0]", "(1, 2)", "1 if 1 else 2", "1 < 2", "1 & 2", "~1", "not 1",
                 "'1'", "None", "lambda: 1", "(x := 1)", "1; 2", "", "   "]:  # fmt: skip
        with pytest.raises(EvaluationError):
            safe_eval(text)
    assert safe_eval("  \t1 + 1") == 2  # eval skips leading spaces and tabs
    assert safe_eval("(1 +\n 2)  # comment") == 3


@pytest.mark.parametrize(
    "text, numbers",
    [
        ("__import__('os')", [1]),
        ("__import__('os').system('true')", []),
        ("9**9**9", [9, 9, 9]),
        ("(9**9)**(9**9)", [9, 9, 9, 9]),
        ("10 ** 10 ** 10", [10, 10, 10]),
        ("(" * 10_000 + "1" + ")" * 10_000, [1]),
        ("-" * 10_000 + "1", [1]),
        ("-" * 900 + "1", [1]),
        ("(" * 150 + "1" + ")" * 150, [1]),
        ("1" + " " * 1_000_000 + "+ 2", [1, 2]),
        ("1+" * 500_000 + "1", [1]),
        ("9" * 1_000_000, [9]),
        ("0" * 1_000_000 + "1", [1]),
        ("1\x00 + 2", [1, 2]),
        ("1e999 - 1e999 + 1", [1, 999, 1, 999, 1]),
    ],
)
def test_hostile_answers_return_quickly_without_raising(text, numbers):
    start = time.perf_counter()
    verdict = reference_score(text, numbers, 12_345)
    assert time.perf_counter() - start < 1.0
    assert verdict.reward in (0.0, 0.1) and not verdict.correct
    env = CountdownEnv()
    env.reset(options={"numbers": numbers or [1], "target": 12_345})
    _, reward, terminated, _, _ = env.step(text)
    assert reward in (0.0, 0.1) and terminated


def test_long_answers_are_evaluation_errors():
    padded = "1 + 2" + " " * MAX_ANSWER_CHARS
    assert reference_score(padded, [1, 2], 3) == (0.1, True, False, None, f"longer than {MAX_ANSWER_CHARS} characters")
    assert reference_score("1 + 2" + " " * (MAX_ANSWER_CHARS - 10), [1, 2], 3).reward == 1.0


# ------------------------------------------------------------------------------------------------- the default env
def test_reference_defaults_through_the_protocol():
    env = gym.make("ragen/Countdown-v0")
    base = env.unwrapped
    assert (base.tasks, base.scoring, base.max_instances) == ("reference", "reference", 20_000)
    assert base.use_all_numbers and base.format_score == 0.1

    env.reset(options={"numbers": [3, 5, 2], "target": 4})
    _, reward, terminated, _, info = env.step(reply("2 + 5 - 3"))
    assert reward == 1.0 and terminated and info["success"] and info["numbers_ok"] and info["value"] == "4"
    assert info["actions"] == ["2 + 5 - 3"] and info["action_is_effective"]
    assert base.reference_state_text() == "Your answer get 1 points."
    assert base.state_text().endswith("Your answer: 2 + 5 - 3 = 4 (correct)")

    env.reset(options={"numbers": [3, 5, 2], "target": 4})
    _, reward, terminated, _, info = env.step(reply("2 + 5 + 3"))
    assert reward == pytest.approx(0.1) and terminated and not info["success"] and info["numbers_ok"]
    assert base.reference_state_text() == "Your answer get 0.1 points."

    env.reset(options={"numbers": [3, 5, 2], "target": 4})
    _, reward, terminated, _, info = env.step(reply("2 + 5 - 3 = 4"))
    assert reward == 0.0 and terminated and not info["numbers_ok"] and not info["action_is_effective"]
    assert base.reference_state_text() == "Your answer get 0 points."
    assert "does not use exactly the given numbers" in base.state_text()

    env.reset(options={"numbers": [3, 5, 2], "target": 4})
    _, reward, terminated, _, info = env.step(reply("twenty four"))  # any non-empty answer is a valid action
    assert reward == 0.0 and terminated and info["action_is_valid"]

    env.reset(options={"numbers": [4, 4, 8], "target": 1})
    _, reward, terminated, _, info = env.step(reply("8 / (4 - 4)"))
    assert reward == pytest.approx(0.1) and info["value"] is None and "ZeroDivisionError" in info["evaluation_error"]
    assert "cannot be evaluated" in base.state_text()


def test_unwrapped_env_rejects_only_empty_answers_and_answers_once():
    env = CountdownEnv()
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("   ")
    assert reward == 0.0 and not terminated and not info["action_is_valid"]
    target, nums = env.target, env.numbers
    answer = solve_countdown(nums, target)
    _, reward, terminated, _, info = env.step(answer)
    assert reward == 1.0 and terminated and info["success"]
    _, reward, terminated, _, _ = env.step(answer)  # already answered: nothing more
    assert reward == 0.0 and terminated and env.is_success()


# ------------------------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"tasks": "dataset"}, "tasks"),
        ({"scoring": "eval"}, "scoring"),
        ({"max_instances": 0}, "max_instances"),
        ({"max_instances": 490_365}, "max_instances"),
        ({"max_numbers": 5}, "max_numbers"),  # a generator argument with the reference tasks
        ({"max_target": 50}, "max_target"),
        ({"use_all_numbers": False}, "use_all_numbers"),  # the reference scoring needs every number
        ({"tasks": "generated", "max_instances": 100}, "max_instances"),
        ({"format_score": None}, "format_score"),
        ({**OLD, "min_numbers": 1}, "min_numbers"),
        ({**OLD, "max_numbers": 2}, "max_numbers"),
        ({**OLD, "max_number": 1}, "max_number"),
        ({**OLD, "max_target": 0}, "max_target"),
        ({**OLD, "use_all_numbers": 1}, "use_all_numbers"),
        ({**OLD, "format_score": None}, "format_score"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=f"invalid argument {name}="):
        gym.make("ragen/Countdown-v0", **kwargs)


def test_the_choices_combine():
    env = CountdownEnv(tasks="generated")  # ragen's puzzles, the reference's scoring
    env.reset(seed=5)
    assert env.state_view()["task_index"] is None and env.target not in env.numbers
    assert env.step(solve_countdown(env.numbers, env.target))[1] == 1.0
    env = CountdownEnv(scoring="strict")  # the reference's tasks, ragen's checker
    env.reset(seed=5)
    assert env.numbers == list(reference_tasks()[5][1])
    assert env.step(solve_countdown(env.numbers, env.target) + " = 0")[1] == 1.0  # "= n" is ignored by strict


# ------------------------------------------------------------------------------------------------- the old options
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
    assert reference_score(found, [1, 5, 5, 5], 24).reward == 1.0  # 24.000000000000004 in floats: within 1e-5


def test_old_options_same_seed_same_puzzle():
    env = CountdownEnv(**OLD)
    env.reset(seed=11)
    first = env.state_view()
    env.reset(seed=11)
    assert env.state_view() == first
    env.reset(seed=12)
    assert env.state_view() != first
    expected, _, _ = generate_puzzle(np_random(11)[0])  # drawn from the env's seeded generator, as before
    env.reset(seed=11)
    assert env.numbers == expected


def test_old_options_rewards_through_the_protocol():
    env = gym.make("ragen/Countdown-v0", **OLD)
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
    _, reward, _, _, info = env.step(reply("2 * 4"))  # 3 unused: every number is required
    assert reward == pytest.approx(0.1)

    env.reset(options={"numbers": [2, 3, 4], "target": 24})
    _, reward, terminated, _, info = env.step(reply("2 * 3 * 4 = 24"))
    assert reward == 1.0

    env.reset(options={"numbers": [2, 3, 4], "target": 24})
    _, reward, terminated, _, info = env.step(reply("twenty four"))  # not an expression: the format penalty
    assert reward == pytest.approx(-0.1) and not terminated and not info["action_is_valid"]
    assert "arithmetic expression" in info["reason"]


def test_at_most_once_variant_and_format_score():
    env = gym.make("ragen/Countdown-v0", **OLD, use_all_numbers=False, format_score=0.0)
    env.reset(options={"numbers": [2, 3, 4], "target": 8})
    assert env.step(reply("2 * 4"))[1] == 1.0
    env.reset(options={"numbers": [2, 3, 4], "target": 8})
    assert env.step(reply("2 * 2 * 2"))[1] == 0.0
    assert "at most once" in env.unwrapped.instructions


def test_division_by_zero_answer_is_well_formed_but_wrong():
    env = CountdownEnv(**OLD)
    env.reset(options={"numbers": [5, 3, 3], "target": 5})
    _, reward, terminated, _, info = env.step("5 / (3 - 3)")
    assert reward == pytest.approx(0.1) and terminated and info["value"] is None
    assert "division by zero" in env.state_text()


def test_check_reasoning_verifies_arithmetic_claims_exactly():
    env = CountdownEnv()
    env.reset(seed=0)
    check = lambda t: env.check_reasoning(t, env.state_view(), [])
    assert check("25 - 5 = 20, then (6 + 4) * 3 = 30. Also 6/4 = 3/2.") == {"supported": 3, "contradicted": 0}
    assert check("First 7 * 8 = 54, so 54 + 2 = 56.") == {"supported": 1, "contradicted": 1}
    assert check("I think 3 + 3 = 6. I think 3 + 3 = 6.") == {"supported": 1, "contradicted": 0}
    assert check("The target is 24 = answer.") == {"supported": 0, "contradicted": 0}
    assert check("2 + 2 = 2 * 2, and 1+1=1+1") == {"supported": 0, "contradicted": 0}  # identities, not values
    assert check("So 6 / 4 = 3/2.") == {"supported": 1, "contradicted": 0}
    assert check("") == {"supported": 0, "contradicted": 0}


def test_countdown_claim_with_zero_denominator_does_not_crash_grounding():
    # "= 3/0" used to raise ZeroDivisionError from Fraction("3/0") inside check_reasoning, which crashed
    # the grounding reward wrapper (and so a training run) on a plain thinking text.
    env = CountdownEnv()
    env.reset(seed=0)
    counts = env.check_reasoning("6 / 4 = 3/0 and 2 + 2 = 4", env.state_view(), [])
    assert counts == {"supported": 1, "contradicted": 1}

    wrapped = gym.make("ragen/Countdown-v0", reward_wrappers=["grounding"])
    wrapped.reset(seed=0)
    _, reward, *_, info = wrapped.step("<think>so 6 / 4 = 3/0</think><answer>1 + 2</answer>")
    assert math.isfinite(reward)
    assert info["reward_details"]["grounding"]["contradicted"] == 1
