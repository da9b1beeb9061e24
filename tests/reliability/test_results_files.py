"""Result files are checked against a schema when read: malformed and hand-edited ones are skipped by the leaderboard
with a warning naming the file and the field, a NaN never ranks, and every result, checkpoint and leaderboard file is
written atomically (a crash mid-write leaves the previous file intact)."""

from __future__ import annotations

import copy
import json
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragen_trainer import fileio
from ragen_trainer.evaluation.agents import OracleAgent, RandomAgent
from ragen_trainer.evaluation.cli import main as cli_main
from ragen_trainer.evaluation.leaderboard import build_board, build_leaderboard, load_valid_results
from ragen_trainer.evaluation.metrics import summarize
from ragen_trainer.evaluation.runner import load_result, run_suite, save_result, to_jsonable
from ragen_trainer.evaluation.schema import ResultFileError, ResultFileWarning, validate_result
from ragen_trainer.evaluation.suites import suite_hash

from ..evaluation.helpers import small_suite

ENTRIES = [("Bandit", "ragen/Bandit-v0", 3), ("FrozenLake", "ragen/FrozenLake-v0", 3)]


@pytest.fixture(scope="module")
def good() -> dict[str, dict[str, Any]]:
    """Two real results of one small suite (2 rollouts per state, so pass@k is there too), as read back from JSON."""
    suite = small_suite(*ENTRIES, rollouts=2)
    return {agent.name: json.loads(json.dumps(run_suite(suite, agent, progress=False)))
            for agent in (OracleAgent(), RandomAgent())}  # fmt: skip


@pytest.fixture()
def good_files(good, tmp_path) -> list[Path]:
    return [save_result(good[name], tmp_path / f"{name}.json") for name in ("oracle", "random")]


def _first(result: dict[str, Any], test: Callable[[dict[str, Any]], bool]) -> int:
    return next(i for i, e in enumerate(result["episodes"]) if test(e))


def _failed(e: dict[str, Any]) -> bool:
    return not e["success"] and bool(e["turns"])


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """An edit setting ``path`` (dots; list indexes as numbers) to ``value``; ``DELETE`` removes the key."""

    def edit(r: dict[str, Any]) -> dict[str, Any]:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node = r
        for p in parents:
            node = node[p]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
        return r

    return edit


DELETE = object()


def _text(r: dict[str, Any]) -> str:
    return json.dumps(r, indent=1)


def _rescore_summary(r: dict[str, Any]) -> dict[str, Any]:
    r["summary"] = summarize(r["episodes"], [e["name"] for e in r["suite"]["definition"]["envs"]])
    return r


# ---------------------------------------------------------------------------------------------------- the cases
# (id, edit of the random agent's result -> dict (written as JSON, NaN literals allowed) or str / bytes written as
#  is, the field the warning must name, a fragment of what it must say is wrong)
MALFORMED: list[tuple[str, Callable[[dict[str, Any]], Any], str, str]] = [
    ("not-json", lambda r: "this is not JSON\n", "", "not valid JSON"),
    ("empty-file", lambda r: "", "", "the file is empty"),
    ("truncated-json", lambda r: _text(r)[: len(_text(r)) // 2], "", "not valid JSON"),
    ("not-utf8", lambda r: b"\xff\xfe\x00garbage\x9c", "", "not UTF-8"),
    ("list-not-object", lambda r: [r], "(top level)", "expected a JSON object, got a list"),
    ("string-not-object", lambda r: '"ragen-eval-result"', "(top level)", "got a string"),
    ("wrong-format-tag", _set("format", "ragen-eval-results"), "format", "not a ragen evaluation result"),
    ("future-format-version", _set("format_version", 2), "format_version", "this ragen reads 1"),
    ("checkpoint-not-result", lambda r: {"format": "ragen-eval-checkpoint", "suite_hash": r["suite"]["hash"],
                                         "agent": r["agent"], "env_seconds": {}, "episodes": []},
     "format", "not a ragen evaluation result"),
    ("missing-summary", _set("summary", DELETE), "summary", "Field required"),
    ("missing-suite-hash", _set("suite.hash", DELETE), "suite.hash", "Field required"),
    ("missing-turn-success", _set("episodes.0.turns.0.success", DELETE), "episodes[0].turns[0].success",
     "Field required"),
    ("episodes-is-object", _set("episodes", {"0": {}}), "episodes", "valid list"),
    ("summary-is-null", _set("summary", None), "summary", "valid dictionary"),
    ("env-summaries-are-a-list", _set("summary.envs", []), "summary.envs", "valid dictionary"),
    ("score-is-a-string", _set("summary.overall.score", "95.0"), "summary.overall.score", "valid number"),
    ("rate-is-a-boolean", _set("summary.envs.Bandit.success_rate", True), "summary.envs.Bandit.success_rate",
     "valid number"),
    ("count-is-a-float", _set("summary.envs.Bandit.episodes", 6.0), "summary.envs.Bandit.episodes", "valid integer"),
    ("turn-success-is-text", _set("episodes.0.turns.0.success", "yes"), "episodes[0].turns[0].success",
     "valid boolean"),
    ("huge-float-1e999", lambda r: _text(r).replace('"score": ', '"score": 1e999 , "was": ', 1),
     "summary.overall.score", "finite number"),
    ("huge-integer-5000-digits", lambda r: _text(r).replace('"seed": 7000', '"seed": ' + "9" * 5000, 1), "",
     "not valid JSON for ragen"),
    ("huge-seed", _set("episodes.0.seed", 2**70), "episodes[0].seed", "less than or equal to"),
    ("nested-100k-deep", lambda r: "[" * 100_000 + "]" * 100_000, "", "nested too deeply"),
]

HAND_EDITED: list[tuple[str, Callable[[dict[str, Any]], Any], str, str]] = [
    ("nan-score", _set("summary.overall.score", math.nan), "summary.overall.score", "finite number"),
    ("infinite-success-rate", _set("summary.envs.Bandit.success_rate", math.inf), "summary.envs.Bandit.success_rate",
     "finite number"),
    ("success-rate-1.7", _set("summary.envs.Bandit.success_rate", 1.7), "summary.envs.Bandit.success_rate",
     "less than or equal to 1"),
    ("negative-standard-error", _set("summary.envs.FrozenLake.success_rate_se", -0.1),
     "summary.envs.FrozenLake.success_rate_se", "greater than or equal to 0"),
    ("negative-error-count", _set("summary.envs.Bandit.errors", -1), "summary.envs.Bandit.errors",
     "greater than or equal to 0"),
    ("score-above-100", _set("summary.overall.score", 250.0), "summary.overall.score", "less than or equal to 100"),
    ("pass-at-1-is-1.5", _set("summary.envs.Bandit.pass_at_k.1", 1.5), "summary.envs.Bandit.pass_at_k.1",
     "less than or equal to 1"),
    ("score-inconsistent-with-envs", _set("summary.overall.score", 99.0), "summary.overall.score",
     "not the mean of the per-env success rates"),
    ("overall-episode-count-mismatch", _set("summary.overall.episodes", 99), "summary.overall.episodes",
     "per-env episode counts sum to"),
    ("episode-removed-from-list", lambda r: r["episodes"].pop() and r, "summary.envs.FrozenLake.episodes",
     "the file holds 5 FrozenLake episodes"),
    ("episode-removed-summary-redone", lambda r: _rescore_summary(r["episodes"].pop() and r), "episodes",
     "the suite pins 3 seed(s) x 2 rollout(s) = 6"),
    ("failed-episode-marked-success", lambda r: _set(f"episodes.{_first(r, _failed)}.success", True)(r),
     "episodes[{failed}].success", "its last turn's success is False"),
    ("episode-reward-inflated", lambda r: _set(f"episodes.{_first(r, _failed)}.reward", 10.0)(r),
     "episodes[{failed}].reward", "not the sum of its turn rewards"),
    ("turn-reward-not-its-parts", lambda r: _inflate_turn(r, parts=False), "episodes[{failed}].turns[0].reward",
     "not the sum of its reward_parts"),
    ("turn-reward-inflated-everywhere", lambda r: _inflate_turn(r, parts=True),
     "summary.envs.{failed_env}.mean_reward", "re-scoring the episodes gives"),
    ("rate-and-score-edited-together", lambda r: _edit_rate_and_score(r), "summary.envs.FrozenLake.success_rate",
     "re-scoring the episodes gives"),
    ("failed-turn-and-episode-flipped", lambda r: _flip_episode(r), "summary.envs.{failed_env}.success_rate",
     "re-scoring the episodes gives"),
    ("episode-duplicated", lambda r: _set("episodes.1", copy.deepcopy(r["episodes"][0]))(r), "episodes[1]",
     "repeats episode 0"),
    ("episode-of-unknown-env", _set("episodes.0.env", "Chess"), "episodes[0].env", "not an env of the suite"),
    ("nan-inside-turn-extras", _set("episodes.0.turns.0.info_extra", {"x": [1.0, math.nan]}),
     "episodes[0].turns[0].info_extra.x[1]", "finite number"),
    ("suite-id-renamed", _set("suite.id", "paper-v2"), "suite.id", "does not name suite 'test' version 1"),
    ("suite-seeds-cut-to-fit", lambda r: _cut_seeds(r), "suite.hash", "the definition was edited after the run"),
]


def _inflate_turn(r: dict[str, Any], parts: bool) -> dict[str, Any]:
    episode = r["episodes"][_first(r, _failed)]
    episode["turns"][0]["reward"] += 1.0
    episode["reward"] += 1.0
    if parts:
        episode["turns"][0]["reward_parts"]["env"] += 1.0
    return r


def _edit_rate_and_score(r: dict[str, Any]) -> dict[str, Any]:
    envs = r["summary"]["envs"]
    envs["FrozenLake"]["success_rate"] = 1.0
    r["summary"]["overall"]["score"] = 100.0 * sum(s["success_rate"] for s in envs.values()) / len(envs)
    return r


def _cut_seeds(r: dict[str, Any]) -> dict[str, Any]:
    """Drop FrozenLake's last state from the definition and the episodes, and redo the summary: consistent, but the
    suite is no longer the one that was run."""
    r["suite"]["definition"]["envs"][1]["seeds"]["count"] = 2
    r["episodes"] = [e for e in r["episodes"] if not (e["env"] == "FrozenLake" and e["seed"] == 7002)]
    return _rescore_summary(r)


def _flip_episode(r: dict[str, Any]) -> dict[str, Any]:
    episode = r["episodes"][_first(r, _failed)]
    episode["turns"][-1]["success"] = True
    episode["success"] = True
    return r


CASES = MALFORMED + HAND_EDITED


def _write_case(folder: Path, good_result: dict[str, Any], case: tuple) -> tuple[Path, str, str]:
    """Write the case's file; returns its path, the field and the message fragment (placeholders filled in)."""
    name, edit, field, fragment = case
    original = copy.deepcopy(good_result)
    failed = _first(original, _failed)
    made = edit(copy.deepcopy(good_result))
    path = folder / f"{name}.json"
    if isinstance(made, bytes):
        fileio.atomic_write_text(path, made.decode("latin-1"), encoding="latin-1")  # these very bytes
    elif isinstance(made, str):
        fileio.atomic_write_text(path, made)
    else:
        fileio.atomic_write_text(path, json.dumps(made, indent=1))  # NaN / Infinity literals, as a hand edit makes
    fill = {"failed": failed, "failed_env": original["episodes"][failed]["env"]}
    return path, field.format(**fill), fragment.format(**fill)


def test_there_are_enough_cases():
    assert len(MALFORMED) >= 10 and len(HAND_EDITED) >= 10
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_bad_file_is_skipped_with_a_warning_naming_file_and_field(case, good, good_files, tmp_path):
    bad, field, fragment = _write_case(tmp_path, good["random"], case)
    with pytest.warns(ResultFileWarning) as caught:
        markdown, _ = build_leaderboard([good_files[0], bad, good_files[1]])
    messages = [str(w.message) for w in caught if issubclass(w.category, ResultFileWarning)]
    assert len(messages) == 1, messages
    message = messages[0]
    assert str(bad) in message and fragment in message, message
    assert f"{field}: " in message if field else True, message
    # the good files still build the board, ranked
    rows = [line for line in markdown.splitlines() if line.startswith(("| 1 ", "| 2 "))]
    assert [r.split("|")[2].strip() for r in rows] == ["oracle", "random"]
    assert "| 3 " not in markdown and "nan" not in markdown.lower()
    # and loading that file alone raises the same problem
    with pytest.raises(ResultFileError) as raised:
        load_result(bad)
    assert raised.value.path == str(bad) and any(fragment in m for _, m in raised.value.problems)


def test_every_bad_file_of_a_folder_is_skipped_by_the_cli_with_one_warning_each(good, good_files, tmp_path, capsys):
    for case in CASES:
        _write_case(tmp_path, good["random"], case)
    md, page = tmp_path / "out" / "lb.md", tmp_path / "out" / "lb.html"
    assert cli_main(["leaderboard", str(tmp_path), "--markdown", str(md), "--html", str(page)]) == 0
    captured = capsys.readouterr()
    warned = [line for line in captured.err.splitlines() if line.startswith("warning: skipped")]
    assert len(warned) == len(CASES)
    for case in CASES:
        assert sum(f"{case[0]}.json" in line for line in warned) == 1
    assert f"{len(CASES)} bad file(s) skipped" in captured.out
    text = md.read_text(encoding="utf-8")
    assert text.index("| oracle") < text.index("| random") and text.count("| 1 |") == 1


def test_one_bad_file_asked_for_exits_2_naming_file_and_field(good, tmp_path, capsys):
    bad, _, _ = _write_case(tmp_path, good["random"], HAND_EDITED[0])  # the NaN score
    assert cli_main(["leaderboard", str(bad), "--markdown", str(tmp_path / "m.md"), "--html",
                     str(tmp_path / "h.html")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert str(bad) in err and "summary.overall.score" in err and "finite number" in err
    assert not (tmp_path / "m.md").exists()
    # a list with only bad files: nothing to build, exit 2
    other, _, _ = _write_case(tmp_path, good["random"], MALFORMED[0])
    assert cli_main(["leaderboard", str(bad), str(other), "--markdown", str(tmp_path / "m.md"), "--html",
                     str(tmp_path / "h.html")]) == 2  # fmt: skip
    assert "none of the 2 result file(s) is valid" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["not-json", "nan-score", "success-rate-1.7", "huge-seed", "episode-of-unknown-env"])
def test_rescore_of_a_bad_file_exits_2_naming_the_field(name, good, tmp_path, capsys):
    case = next(c for c in CASES if c[0] == name)
    bad, field, fragment = _write_case(tmp_path, good["random"], case)
    assert cli_main(["eval", "--rescore", str(bad), "-o", str(tmp_path / "fixed.json")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and field in err and fragment in err
    assert not (tmp_path / "fixed.json").exists()


@pytest.mark.parametrize("name", ["score-inconsistent-with-envs", "failed-episode-marked-success",
                                  "rate-and-score-edited-together", "failed-turn-and-episode-flipped"])  # fmt: skip
def test_rescore_reports_a_summary_its_episodes_do_not_reproduce_and_writes_the_fix_with_o(
    name, good, tmp_path, capsys
):
    case = next(c for c in CASES if c[0] == name)
    bad, field, _ = _write_case(tmp_path, good["random"], case)
    assert cli_main(["eval", "--rescore", str(bad)]) == 2
    captured = capsys.readouterr()
    assert "differs from the re-scored one" in captured.out and field in captured.err and str(bad) in captured.err
    fixed = tmp_path / "fixed.json"
    assert cli_main(["eval", "--rescore", str(bad), "-o", str(fixed)]) == 0
    assert validate_result(load_result(fixed)) == []


def test_a_nan_never_ranks(good, good_files, tmp_path):
    nan = copy.deepcopy(good["random"])
    nan["agent"]["name"] = "cheater"
    nan["summary"]["overall"]["score"] = math.nan
    # through the files: skipped
    path = tmp_path / "cheater.json"
    fileio.atomic_write_text(path, json.dumps(nan))
    with pytest.warns(ResultFileWarning, match="cheater.json.*summary.overall.score"):
        markdown, page = build_leaderboard([path, *good_files])
    assert "cheater" not in markdown and "cheater" not in page
    # handed to build_board directly (no schema): left out, never first
    for score in (math.nan, math.inf, -math.inf, 1e300, -5.0):
        nan["summary"]["overall"]["score"] = score
        with pytest.warns(ResultFileWarning, match="summary.overall.score"):
            board = build_board([nan, good["oracle"], good["random"]], ["cheater", "o", "r"])
        assert [row["agent"]["name"] for row in board[0]["rows"]] == ["oracle", "random"]


def test_a_nan_is_never_written_as_a_score(good, tmp_path):
    assert to_jsonable(float("nan")) is None and to_jsonable({"a": [np.float32("inf"), 1.5]}) == {"a": [None, 1.5]}
    path = save_result(good["oracle"], tmp_path / "r.json")
    before = path.read_bytes()
    for edit in (_set("summary.overall.score", math.nan), _set("summary.envs.Bandit.success_rate", np.float64("nan")),
                 _set("episodes.0.reward", math.inf)):  # fmt: skip
        bad = edit(copy.deepcopy(good["oracle"]))
        with pytest.raises(ResultFileError, match="refusing to write result file") as raised:
            save_result(bad, path)
        assert "finite number" in str(raised.value)
    # the summary as to_jsonable writes a NaN (None): rejected too, as a score that is not the mean of the envs
    bad = copy.deepcopy(good["oracle"])
    bad["summary"]["overall"]["score"] = to_jsonable(math.nan)
    with pytest.raises(ResultFileError, match="summary.overall.score"):
        save_result(bad, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_results_of_older_suite_versions_stay_readable(good, good_files, tmp_path):
    old = copy.deepcopy(good["random"])
    for entry in old["suite"]["definition"]["envs"]:
        entry.pop("protocol")  # suites from before ragen recorded the turn protocol
    old["suite"]["definition"]["name"] = old["suite"]["name"] = "paper"
    old["suite"]["id"] = "paper-v1"
    old["suite"]["hash"] = suite_hash(old["suite"]["definition"])  # an older file stores its own definition's hash
    old["agent"]["name"] = "old-run"
    for episode in old["episodes"]:  # fields the first result files did not have are optional
        for key in ("reset_info", "initial_state", "final_view", "state_index"):
            episode.pop(key, None)
        for turn in episode["turns"]:
            turn.pop("info_extra", None)
            turn.pop("reply_tokens", None)
    path = tmp_path / "old.json"
    fileio.atomic_write_text(path, json.dumps(old))
    assert validate_result(load_result(path)) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResultFileWarning)
        markdown, _ = build_leaderboard([path, *good_files])
    assert "Suite `paper-v1`" in markdown and "protocol: not recorded" in markdown and "| old-run" in markdown


def test_load_valid_results_can_raise_or_skip(good, good_files, tmp_path):
    bad, _, _ = _write_case(tmp_path, good["random"], HAND_EDITED[2])
    with pytest.raises(ResultFileError, match="success_rate"):
        load_valid_results([good_files[0], bad], on_bad="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        results, kept, errors = load_valid_results([good_files[0], bad], on_bad="skip")
    assert kept == [str(good_files[0])] and len(results) == 1 and errors[0].path == str(bad)


# ---------------------------------------------------------------------------------------------------- atomic writes
class _Crash(Exception):
    pass


def _crash_mid_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every atomic write writes half its text to the temporary file, then the process 'dies'."""
    real_fdopen = os.fdopen

    class _Half:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()
            return False

        def write(self, text):
            self.fh.write(text[: len(text) // 2])
            self.fh.flush()
            raise _Crash("killed mid-write")

    monkeypatch.setattr(fileio.os, "fdopen", lambda fd, *a, **k: _Half(real_fdopen(fd, *a, **k)))


def _crash_before_rename(monkeypatch: pytest.MonkeyPatch) -> None:
    def replace(src, dst):
        raise _Crash("killed before the rename")

    monkeypatch.setattr(fileio.os, "replace", replace)


CRASHES = [_crash_mid_write, _crash_before_rename]


@pytest.mark.parametrize("crash", CRASHES, ids=["mid-write", "before-rename"])
def test_a_crash_while_saving_a_result_leaves_the_old_file(crash, good, tmp_path, monkeypatch):
    path = save_result(good["random"], tmp_path / "r.json")
    before = path.read_bytes()
    crash(monkeypatch)
    with pytest.raises(_Crash):
        save_result(good["oracle"], path)
    monkeypatch.undo()
    assert path.read_bytes() == before and load_result(path)["agent"]["name"] == "random"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no stray temporary file


@pytest.mark.parametrize("crash", CRASHES, ids=["mid-write", "before-rename"])
def test_a_crash_while_writing_the_leaderboard_leaves_the_old_pages(crash, good_files, tmp_path, monkeypatch):
    md, page = tmp_path / "lb.md", tmp_path / "lb.html"
    build_leaderboard(good_files, markdown_path=md, html_path=page)
    before = md.read_bytes(), page.read_bytes()
    crash(monkeypatch)
    with pytest.raises(_Crash):
        build_leaderboard(good_files[:1], markdown_path=md, html_path=page, title="other")
    monkeypatch.undo()
    assert (md.read_bytes(), page.read_bytes()) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


class _StopAtFrozenLake(RandomAgent):
    def reply(self, ctx):
        if ctx.env_name == "FrozenLake":
            raise KeyboardInterrupt
        return super().reply(ctx)


def test_a_crash_while_saving_the_checkpoint_leaves_the_previous_one_and_the_run_resumes(tmp_path, monkeypatch):
    suite = small_suite(*ENTRIES, ("Bandit2", "ragen/Bandit-v0", 2))
    checkpoint, output = tmp_path / "r.json.partial", tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        run_suite(suite, _StopAtFrozenLake(), progress=False, checkpoint=checkpoint, output=output)
    before = checkpoint.read_bytes()
    assert {e["env"] for e in json.loads(before)["episodes"]} == {"Bandit"}
    _crash_mid_write(monkeypatch)  # the next checkpoint (after FrozenLake) dies mid-write
    with pytest.raises(_Crash):
        run_suite(suite, RandomAgent(), progress=False, checkpoint=checkpoint, output=output)
    monkeypatch.undo()
    assert checkpoint.read_bytes() == before and not output.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    result = run_suite(suite, RandomAgent(), progress=False, checkpoint=checkpoint, output=output)
    assert not checkpoint.exists() and load_result(output)["summary"] == result["summary"]
    assert len(result["episodes"]) == 3 * 1 + 3 * 1 + 2


def test_a_corrupt_checkpoint_is_ignored_with_a_warning(tmp_path, capsys):
    suite = small_suite(("Bandit", "ragen/Bandit-v0", 2))
    checkpoint = tmp_path / "r.json.partial"
    fileio.atomic_write_text(checkpoint, '{"format": "ragen-eval-checkpoint", "episodes": [')
    result = run_suite(suite, RandomAgent(), progress=False, checkpoint=checkpoint)
    assert "ignoring checkpoint" in capsys.readouterr().err and len(result["episodes"]) == 2
    assert not checkpoint.exists()
