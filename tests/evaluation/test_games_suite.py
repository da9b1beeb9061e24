"""The games suite (``games-v1``): coverage of every game x opponent x seat, win / draw / loss metrics with clustered
standard errors (a game without an outcome is a loss), the schema's checks of them, and the leaderboard's games table
and game replays."""

from __future__ import annotations

import copy
import json
import math
import re

import pytest

from ragen_envs.games import GAMES, OPPONENT_NAMES
from ragen_envs.games.tictactoe import best_moves
from ragen_envs.registration import reference_settings
from ragen_trainer.evaluation.agents import GAME_ORACLE_OPPONENTS, Agent, OracleAgent, RandomAgent, format_reply
from ragen_trainer.evaluation.leaderboard import build_leaderboard
from ragen_trainer.evaluation.metrics import (
    GAME_OUTCOMES,
    env_family,
    game_outcomes,
    outcome_rate_key,
    summarize_env,
    summarize_game,
)
from ragen_trainer.evaluation.runner import load_result, run_suite, save_result, summary_lines
from ragen_trainer.evaluation.schema import EnvSummary, validate_result
from ragen_trainer.evaluation.suites import load_suite

from .helpers import small_suite

SEATS = {"first": 0, "second": 1}


class PerfectTicTacToe(Agent):
    """A scripted minimax player (the perfect opponent's solver) that answers through the turn protocol."""

    name = "perfect-tictactoe"

    def reply(self, ctx):
        board = tuple(ctx.env.unwrapped.core.board)
        cell = best_moves(board)[0] + 1
        return format_reply(ctx, f"minimax picks cell {cell}", [str(cell)])


class Stubborn(Agent):
    """Names cell 0, which does not exist: every turn is invalid and the seat runs out of turns (a forfeit)."""

    name = "stubborn"

    def reply(self, ctx):
        return format_reply(ctx, "", ["0"])


def _game_of(env_id: str) -> str:
    return next(name for name, entry in GAMES.items() if entry.env_id == env_id)


@pytest.fixture(scope="module")
def suite():
    return load_suite("games")


@pytest.fixture(scope="module")
def random_result(suite, tmp_path_factory):
    """Every entry of the suite, its first 6 seeds, played by the random agent; saved and read back."""
    path = tmp_path_factory.mktemp("games") / "random.json"
    return load_result(save_result(run_suite(suite.select(max_states=6), RandomAgent(), progress=False), path))


@pytest.fixture(scope="module")
def perfect_result(suite, tmp_path_factory):
    names = [e.name for e in suite.envs if e.env_id == GAMES["tictactoe"].env_id]
    path = tmp_path_factory.mktemp("games") / "perfect.json"
    return load_result(save_result(run_suite(suite.select(names, 16), PerfectTicTacToe(), progress=False), path))


# ------------------------------------------------------------------------------------------------------ the suite
def test_the_suite_plays_every_game_against_every_fixed_opponent_from_both_seats(suite):
    assert suite.suite_id == "games-v1" and load_suite("games-v1").hash == suite.hash
    # An alias (the Prisoner's Dilemma's "rule" is tit_for_tat) is the same opponent: played once, under its first name.
    expected = {(entry.env_id, entry.opponents[name], seat) for game, entry in GAMES.items()
                for name in OPPONENT_NAMES[game] for seat in SEATS}  # fmt: skip
    played = []
    for e in suite.envs:
        game = GAMES[_game_of(e.env_id)]
        opponent, seat = e.env_kwargs["opponent"], e.env_kwargs["seat"]
        assert opponent in OPPONENT_NAMES[_game_of(e.env_id)] and seat in SEATS
        assert e.name == f"{env_family(e.env_id)}-{opponent}-{seat}"
        played.append((e.env_id, game.opponents[opponent], seat))
    assert set(played) == expected and len(played) == len(expected)  # each exactly once
    for e in suite.envs:
        assert e.seeds == tuple(range(3000000, 3000064)) and e.rollouts_per_state == 1
        assert e.protocol == reference_settings(e.env_id)  # each id's reference turn budget (its forfeit rule)
        assert e.decoding["temperature"] == 0.5 and e.decoding["max_new_tokens"] >= 256
    # pinned seeds apart from the other suites' (no state is shared with paper-v2 / quick-v2)
    others = {s for e in load_suite("paper-v2").envs for s in e.seeds}
    assert not others & set(suite.envs[0].seeds)


def test_every_game_has_outcome_words_and_the_schema_knows_every_game_metric():
    for entry in GAMES.values():
        assert game_outcomes(entry.env_id) == entry.core.outcomes and len(entry.core.outcomes) >= 2
    episode = {"env": "T", "env_id": "ragen/TicTacToe-v0", "seed": 0, "rollout": 0, "turns": []}
    keys = {k for words in GAME_OUTCOMES.values() for k in summarize_game([episode], words)}
    assert keys <= set(EnvSummary.model_fields)  # typed and range-checked, not free-form extras


# ------------------------------------------------------------------------------------------------------ metrics
def _turn(outcome=None, score=0.0, success=False):
    return {"success": success, "reward": 0.0, "action_is_valid": True, "format_ok": True, "actions": ["1"],
            "reply": "", "info_extra": {"outcome": outcome, "score": score, "seat": "X"}}  # fmt: skip


def _episode(seed, turns, env_id="ragen/TicTacToe-v0", error=None):
    return {"env": "T", "env_id": env_id, "seed": seed, "rollout": 0, "turns": turns, "error": error}


def test_win_draw_loss_rates_count_an_episode_without_an_outcome_as_a_loss():
    episodes = [
        _episode(0, [_turn(), _turn("win", 1.0, True)]),
        _episode(1, [_turn("draw", 0.5)]),
        _episode(2, [_turn("loss", 0.0)]),
        _episode(3, [_turn(), _turn()]),  # truncated by the turn budget: the game went on
        _episode(4, [], error="boom"),  # the agent failed before its first move
    ]
    s = summarize_env(episodes)
    assert (s["win_rate"], s["draw_rate"], s["loss_rate"]) == (0.2, 0.2, 0.6)
    assert s["no_outcome"] == 2 and s["success_rate"] == 0.2
    assert s["loss_rate_se"] == pytest.approx(math.sqrt(0.6 * 0.4 / 4))  # clustered by seed, one rollout each
    assert s["mean_score"] == pytest.approx(0.3) and "deal_rate" not in s
    # rollouts of one seed are averaged first, as for success
    twice = summarize_env([_episode(0, [_turn("win", 1.0)]), {**_episode(0, [_turn("loss")]), "rollout": 1},
                           _episode(1, [_turn("loss")]), {**_episode(1, [_turn("loss")]), "rollout": 1}])  # fmt: skip
    assert twice["win_rate"] == 0.25 and twice["win_rate_se"] == pytest.approx(0.25)


def test_the_negotiation_reports_deals_and_other_envs_get_no_game_metrics():
    deal = summarize_env([_episode(0, [_turn("deal", 0.6)], "ragen/Negotiation-v0"),
                          _episode(1, [_turn("no deal", 0.0)], "ragen/Negotiation-v0"),
                          _episode(2, [_turn()], "ragen/Negotiation-v0")])  # fmt: skip
    assert deal["deal_rate"] == pytest.approx(1 / 3) and deal["no_deal_rate"] == pytest.approx(2 / 3)
    assert "win_rate" not in deal and deal["no_outcome"] == 1
    bandit = summarize_env([_episode(0, [_turn("win")], "ragen/Bandit-v0")])
    assert not {"win_rate", "no_outcome", "mean_score"} & set(bandit)  # existing suites' summaries are unchanged


# ------------------------------------------------------------------------------------------------------ running it
def test_the_random_agent_on_every_entry_gives_a_valid_result_with_rates_summing_to_one(random_result, suite):
    envs = random_result["summary"]["envs"]
    assert list(envs) == [e.name for e in suite.envs]
    for name, s in envs.items():
        words = game_outcomes(suite.env(name).env_id)
        rates = [s[outcome_rate_key(w)] for w in words]
        assert sum(rates) == pytest.approx(1.0) and all(0.0 <= r <= 1.0 for r in rates)
        for w, r in zip(words, rates):  # one rollout per seed: the binomial standard error over 6 states
            assert s[outcome_rate_key(w) + "_se"] == pytest.approx(math.sqrt(r * (1 - r) / 5))
        episodes = [e for e in random_result["episodes"] if e["env"] == name]
        finals = [(e["turns"][-1]["info_extra"].get("outcome") if e["turns"] else None) for e in episodes]
        assert s["no_outcome"] == sum(o not in words for o in finals)
        worst = outcome_rate_key(words[-1])
        assert s[worst] * len(episodes) == pytest.approx(sum(o in (None, words[-1]) for o in finals))
        assert {o for o in finals if o is not None} <= set(words)  # the games say only the words metrics knows
    # the seat is the one the entry names
    for e in random_result["episodes"]:
        seat = SEATS[suite.env(e["env"]).env_kwargs["seat"]]
        labels = GAMES[_game_of(e["env_id"])].core.seat_labels
        assert e["reset_info"]["seat"] == labels[seat]
    assert "games: outcome %" in "\n".join(summary_lines(random_result))


def test_the_reference_agents_play_every_game_without_errors(random_result, suite, tmp_path):
    # The random agent plays the negotiation's free-form moves with the game's own random negotiator.
    assert not [e["env"] for e in random_result["episodes"] if e.get("error")]
    assert set(GAME_ORACLE_OPPONENTS) == {e.env_id.split("/")[1].removesuffix("-v0") for e in suite.envs}
    oracle = load_result(save_result(run_suite(suite.select(max_states=4), OracleAgent(), progress=False),
                                     tmp_path / "oracle.json"))  # fmt: skip
    assert not [e["env"] for e in oracle["episodes"] if e.get("error")]
    envs = oracle["summary"]["envs"]
    for name, s in envs.items():
        if name.startswith("TicTacToe-"):  # the oracle plays perfect TicTacToe: it never loses
            assert s["loss_rate"] == 0.0, name
    assert envs["ConnectFour-random-first"]["win_rate"] > 0.5


def test_a_tampered_game_summary_fails_the_schema(random_result):
    bad = copy.deepcopy(random_result)
    s = bad["summary"]["envs"]["TicTacToe-random-first"]
    s["win_rate"], s["draw_rate"], s["loss_rate"] = 0.5, 0.5, 0.5  # each a rate, but 1.5 together
    problems = validate_result(bad)
    assert any("win_rate" in field and "sum to" in message for field, message in problems)
    s["win_rate"] = 1.5
    problems = validate_result(bad, consistency=False)
    assert any(field.endswith("win_rate") and "less than or equal to 1" in message for field, message in problems)
    gone = copy.deepcopy(random_result)
    del gone["summary"]["envs"]["TicTacToe-random-first"]["draw_rate"]
    assert any("comes without" in message for _, message in validate_result(gone))


def test_a_perfect_player_never_loses_at_tictactoe_from_either_seat(perfect_result):
    envs = perfect_result["summary"]["envs"]
    for seat in SEATS:
        random, perfect = envs[f"TicTacToe-random-{seat}"], envs[f"TicTacToe-perfect-{seat}"]
        assert random["loss_rate"] == 0.0 and random["no_outcome"] == 0
        assert random["win_rate"] >= 0.75  # minimax against random play wins nearly always
        assert perfect["draw_rate"] == 1.0 and perfect["loss_rate_se"] == 0.0  # perfect against perfect: draws
        assert envs[f"TicTacToe-rule-{seat}"]["loss_rate"] == 0.0


def test_running_out_of_turns_is_a_forfeit_counted_as_a_loss():
    result = run_suite(small_suite(("T", "ragen/TicTacToe-v0", 4), T={"env_kwargs": {"opponent": "random"}}),
                       Stubborn(), progress=False)  # fmt: skip
    s = result["summary"]["envs"]["T"]
    assert s["loss_rate"] == 1.0 and s["no_outcome"] == 4 and s["win_rate"] == 0.0
    assert all(e["truncated"] for e in result["episodes"])
    assert validate_result(json.loads(json.dumps(result))) == []


# ------------------------------------------------------------------------------------------------------ leaderboard
def _replays(page: str) -> list[dict]:
    found = re.search(r'<script type="application/json" id="replay-data">(.*?)</script>', page, re.DOTALL)
    return json.loads(found.group(1))


def test_the_board_shows_win_draw_loss_and_replays_the_games(random_result, perfect_result, tmp_path):
    paths = [save_result(r, tmp_path / f"{i}.json") for i, r in enumerate((random_result, perfect_result))]
    markdown, page = build_leaderboard(paths)
    header = "| agent | env | opponent | seat | win % | draw % | loss % | deal % | no deal % | score % | no outcome |"
    assert header in markdown
    row = next(
        line for line in markdown.splitlines() if line.startswith("| perfect-tictactoe | TicTacToe-random-first")
    )
    assert row.split(" | ")[6] == "0.0 ± 0.0"  # loss %
    assert "games-table" in page and 'id="state-text"' in page
    runs = {run["label"]: run for run in _replays(page)}
    episode = runs["perfect-tictactoe"]["envs"]["TicTacToe-random-second"][0]
    assert episode["legend"] is None and episode["game"]["seat"] == "O" and episode["game"]["opponent"] == "random"
    assert episode["game"]["outcome"] in ("win", "draw") and episode["game"]["words"] == ["win", "draw", "loss"]
    assert "X" in episode["initial_state"]  # X moved first: the board the agent starts from
    assert all("---+---+---" in t["state"] for t in episode["turns"])  # the board after every turn
    assert episode["turns"][-1]["outcome"] == episode["game"]["outcome"]
    assert all(t["move"] and isinstance(t["opponent_moves"], list) for t in episode["turns"])
    deals = runs["random"]["envs"]["Negotiation-rule-first"][0]["game"]
    assert deals["words"] == ["deal", "no deal"]


def test_suites_without_games_keep_their_tables(tmp_path):
    result = run_suite(small_suite(("Bandit", "ragen/Bandit-v0", 3)), RandomAgent(), progress=False)
    markdown, page = build_leaderboard([save_result(result, tmp_path / "bandit.json")])
    assert "Games:" not in markdown and "win %" not in markdown and "games-table" not in page
    assert "game" not in _replays(page)[0]["envs"]["Bandit"][0]
    assert result["episodes"][0]["turns"][0]["state"] is None  # no state recorded for a non-grid, non-game env


@pytest.mark.browser
def test_the_viewer_replays_a_game_turn_by_turn_in_headless_chromium(perfect_result, tmp_path):
    pytest.importorskip("selenium")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from .test_leaderboard import _chromium

    page = tmp_path / "board.html"
    build_leaderboard([save_result(perfect_result, tmp_path / "perfect.json")], html_path=page)
    driver = _chromium()
    try:
        driver.get(page.as_uri())
        Select(driver.find_element(By.ID, "env-select")).select_by_visible_text("TicTacToe-random-second")
        board = driver.find_element(By.ID, "state-text")
        assert board.is_displayed() and "---+---+---" in board.text and "X" in board.text
        assert not driver.find_element(By.ID, "grid-canvas").is_displayed()
        detail = driver.find_element(By.ID, "turn-detail").text
        assert "playing O against the random opponent" in detail and "result:" in detail
        driver.find_element(By.ID, "next").click()
        detail = driver.find_element(By.ID, "turn-detail").text
        assert "move:" in detail and "opponent's answer:" in detail
        assert board.text.count("O") >= 1
        driver.find_element(By.ID, "play").click()
        WebDriverWait(driver, 15).until(lambda d: d.find_element(By.ID, "next").get_attribute("disabled") is not None)
        assert "game over:" in driver.find_element(By.ID, "turn-detail").text
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        driver.quit()
