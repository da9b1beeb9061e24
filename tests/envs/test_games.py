"""The text games without PettingZoo: rules of each game core, the fixed opponents (the perfect tic-tac-toe player never
loses), and the single-agent views ``ragen/<Game>-v0`` (registration, gymnasium's env checker, the info contract,
seeding, forfeits by running out of turns, clear errors for bad arguments)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragen_envs
from ragen_envs.core import INFO_KEYS
from ragen_envs.games import GAMES, OPPONENT_NAMES, GameEnv
from ragen_envs.games.base import INVALID_CAP, GameCore, Opponent, RandomOpponent, parse_seat
from ragen_envs.games.connect_four import ConnectFour, RuleConnectFour
from ragen_envs.games.negotiation import Negotiation, RandomNegotiator, RuleNegotiator, message_claims, proposal_text
from ragen_envs.games.prisoners_dilemma import AlwaysDefect, PrisonersDilemma, TitForTat
from ragen_envs.games.tictactoe import PerfectTicTacToe, RuleTicTacToe, TicTacToe, best_moves
from ragen_envs.registration import GAME_IDS

GAME_ENV_IDS = list(GAME_IDS)
ALL_REWARDS = ["format", "grounding", "thinking_length"]


def _reply(move: str) -> str:
    return f"<think>my move</think><answer>{move}</answer>"


def _play(core, players, rng) -> None:
    """Play a whole game on ``core`` (already reset) with one opponent object per seat."""
    while not core.over:
        for seat in core.to_move():
            move = core.parse_move(seat, players[seat].act(core.state_view(seat), rng))
            assert move is not None
            core.play(seat, move)


def _play_seeded(core: GameCore, games: int, players_of: Callable[[int], list[Opponent]]) -> Iterator[int]:
    """Play ``games`` whole games on ``core``: game ``g`` is reset and played with ``default_rng(g)``, one opponent
    object per seat from ``players_of(g)``; yields ``g`` once that game is over."""
    for game in range(games):
        rng = np.random.default_rng(game)
        core.reset(rng)
        _play(core, players_of(game), rng)
        yield game


# ------------------------------------------------------------------------------------------------ registration
def test_game_ids_are_registered_with_their_turn_budgets():
    assert GAME_ENV_IDS == [
        "ragen/TicTacToe-v0",
        "ragen/ConnectFour-v0",
        "ragen/PrisonersDilemma-v0",
        "ragen/Negotiation-v0",
    ]
    assert {entry.env_id for entry in GAMES.values()} == set(GAME_ENV_IDS)
    for env_id in GAME_ENV_IDS:
        assert env_id in gym.registry
        settings = ragen_envs.reference_settings(env_id)
        base = gym.make(env_id).unwrapped
        assert isinstance(base, GameEnv)
        # max_turns = the most moves a seat can need + INVALID_CAP: the registered numbers match the envs
        assert settings.max_turns == settings.max_actions_per_episode == base.turn_budget
        assert base.turn_budget == max(base.core.max_moves(0), base.core.max_moves(1)) + INVALID_CAP
        assert settings.actions_per_turn == 1
    assert [ragen_envs.reference_settings(i).max_turns for i in GAME_ENV_IDS] == [8, 24, 13, 8]


def test_import_ragen_envs_stays_light_and_works_without_pettingzoo():
    code = (
        "import sys; sys.modules['pettingzoo'] = None\n"  # importing pettingzoo now fails, as if not installed
        "import gymnasium as gym, ragen_envs\n"
        "assert 'ragen_envs.games' not in sys.modules and 'torch' not in sys.modules\n"
        "env = gym.make('ragen/TicTacToe-v0', opponent='perfect'); env.reset(seed=0)\n"
        "env.step('<think>t</think><answer>5</answer>')\n"
        "from ragen_envs.games import aec_env\n"
        "try:\n    aec_env('tictactoe')\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert "pip install 'ragen[games]'" in out.stdout


# ------------------------------------------------------------------------------------------------ tic-tac-toe
def test_tictactoe_rules_win_draw_and_illegal_moves():
    core = TicTacToe()
    core.reset(np.random.default_rng(0))
    assert core.to_move() == (0,) and core.legal_moves(1) == []
    for seat, cell in [(0, "1"), (1, "4"), (0, "2"), (1, "5")]:
        assert core.play(seat, core.parse_move(seat, cell)) == {}
    assert core.parse_move(0, "4") is None  # taken
    assert core.parse_move(1, "3") is None  # not O's turn
    assert core.parse_move(0, "10") is None and core.parse_move(0, "three") is None
    assert core.parse_move(0, " '3'. ") == "3"
    assert core.play(0, "3") == {0: 1.0, 1: 0.0}
    assert core.over and core.success(0) and core.outcome(1) == "loss" and core.to_move() == ()
    assert "The game is over. You won." in core.state_text(0)

    core.reset(np.random.default_rng(0))
    # X O X / X O O / O X X: a draw
    for i, cell in enumerate(["1", "2", "3", "5", "4", "6", "8", "7"]):
        assert core.play(i % 2, cell) == {}
    assert core.play(0, "9") == {0: 0.5, 1: 0.5}
    assert core.outcome(0) == core.outcome(1) == "draw" and not core.success(0)


def test_tictactoe_lenient_spellings():
    core = TicTacToe()
    core.reset(np.random.default_rng(0))
    assert core.parse_move(0, "center") == "5" and core.parse_move(0, "Top Left") == "1"
    assert core.parse_move(0, "cell 9") == "9" and core.parse_move(0, "bottom-right") == "9"


def test_rule_tictactoe_wins_then_blocks_then_takes_the_centre():
    rule, rng = RuleTicTacToe(), np.random.default_rng(0)
    view = {"board": ["X", "X", "", "O", "O", "", "", "", ""], "you": "X"}
    assert rule.act(view, rng) == "3"  # win beats block
    view = {"board": ["X", "", "", "O", "O", "", "X", "", ""], "you": "X"}
    assert rule.act(view, rng) == "6"  # block
    view = {"board": ["X", "", "", "", "", "", "", "", ""], "you": "O"}
    assert rule.act(view, rng) == "5"  # centre


@pytest.mark.parametrize("opponent", ["random", "perfect"])
def test_perfect_tictactoe_never_loses_in_10000_seeded_games(opponent):
    """10,000 seeded games against random (perfect plays X in even games, O in odd ones) and against itself."""
    perfect = PerfectTicTacToe()
    other = RandomOpponent() if opponent == "random" else PerfectTicTacToe()
    core = TicTacToe()
    outcomes = {"win": 0, "draw": 0, "loss": 0}
    start = time.perf_counter()
    for game in _play_seeded(core, 10_000, lambda g: [perfect, other] if g % 2 == 0 else [other, perfect]):
        seat = game % 2
        outcomes[core.outcome(seat)] += 1
        if opponent == "perfect":
            assert core.outcome(1 - seat) == "draw"
    elapsed = time.perf_counter() - start
    assert outcomes["loss"] == 0, outcomes
    if opponent == "random":
        assert outcomes["win"] > 8_000  # it does not just draw: it punishes random play
    else:
        assert outcomes["draw"] == 10_000
    assert elapsed < 20, f"10,000 games took {elapsed:.1f} s"


def test_perfect_tictactoe_takes_the_quickest_win():
    view = {"board": ["X", "X", "", "O", "O", "", "", "", ""], "you": "X"}
    assert PerfectTicTacToe().act(view, np.random.default_rng(0)) == "3"


# ------------------------------------------------------------------------------------------------ connect four
def test_connect_four_rules():
    core = ConnectFour()
    core.reset(np.random.default_rng(0))
    for _ in range(3):  # X stacks column 1, O column 2
        core.play(0, "1")
        core.play(1, "2")
    assert core.play(0, "1") == {0: 1.0, 1: 0.0}  # vertical four
    assert core.winner == 0

    core.reset(np.random.default_rng(0))
    for column in "1234":  # X along the bottom row, O on top of it
        assert core.parse_move(0, column) == column
        rewards = core.play(0, column)
        if core.over:
            break
        core.play(1, column)
    assert core.over and core.winner == 0 and rewards == {0: 1.0, 1: 0.0}

    core.reset(np.random.default_rng(0))
    # a rising diagonal for X: (5,0) (4,1) (3,2) (2,3), rows counted from the top
    for seat, column in [(0, "1"), (1, "2"), (0, "2"), (1, "3"), (0, "3"), (1, "4"), (0, "3"), (1, "4"), (0, "4"),
                         (1, "7"), (0, "4")]:  # fmt: skip
        core.play(seat, column)
    assert core.over and core.winner == 0

    core.reset(np.random.default_rng(0))
    for i in range(6):
        core.play(i % 2, "1")
    assert core.parse_move(0, "1") is None and "1" not in core.legal_moves(0)  # a full column
    assert core.parse_move(0, "column 3") == "3" and core.parse_move(0, "8") is None


def test_connect_four_draw_on_a_full_grid():
    core = ConnectFour()
    core.reset(np.random.default_rng(0))
    # 42 alternating moves (found by a search) that fill the grid with no four in any line.
    order = list("131411112222322353533445454455766677676776")
    seat, rewards = 0, {}
    for column in order:
        rewards = core.play(seat, column)
        seat = 1 - seat
        if core.over:
            break
    assert core.over and core.winner is None and rewards == {0: 0.5, 1: 0.5}


def test_rule_connect_four_wins_blocks_and_prefers_the_centre():
    rule, rng = RuleConnectFour(), np.random.default_rng(0)
    empty = ["......."] * 6
    assert rule.act({"board": empty, "you": "X"}, rng) == "4"
    board = ["......."] * 5 + ["XXX.OO."]
    assert rule.act({"board": board, "you": "X"}, rng) == "4"  # win
    board = ["......."] * 5 + ["OOO.X.X"]
    assert rule.act({"board": board, "you": "X"}, rng) == "4"  # block
    # Column 4 would let O win on top of it (O has three in the second row from the bottom): avoid it.
    board = ["......."] * 4 + ["OOO....", "XXO.XX."]
    assert rule.act({"board": board, "you": "X"}, rng) != "4"


def test_rule_connect_four_beats_random():
    core, rule, rand = ConnectFour(), RuleConnectFour(), RandomOpponent()
    games = _play_seeded(core, 200, lambda g: [rule, rand] if g % 2 == 0 else [rand, rule])
    wins = sum(core.outcome(game % 2) == "win" for game in games)
    assert wins > 180


# ------------------------------------------------------------------------------------------------ prisoner's dilemma
def test_prisoners_dilemma_payoffs_rounds_and_forfeits():
    core = PrisonersDilemma(rounds=3)
    core.reset(np.random.default_rng(0))
    assert core.to_move() == (0, 1)
    assert core.play(0, "Defect") == {} and core.to_move() == (1,)
    assert core.state_view(1)["history"] == []  # the committed choice stays hidden
    assert core.play(1, "Cooperate") == {0: 5 / 15, 1: 0.0}
    core.play(0, "Cooperate")
    assert core.play(1, "Cooperate") == {0: 3 / 15, 1: 3 / 15}
    core.play(1, "Defect")
    core.withdraw(1, "void")
    assert core.to_move() == (0, 1) and "void" in core.state_text(1)
    core.play(0, "Defect")
    assert core.play(1, "Defect") == {0: 1 / 15, 1: 1 / 15}
    assert core.over and core.totals == [9.0, 4.0] and core.outcome(0) == "win"
    assert core.score(0) == pytest.approx(9 / 15)
    assert core.success(0) and not core.success(1)  # success: at least R * rounds = 9, what mutual cooperation pays
    core.reset(np.random.default_rng(0))
    core.play(0, "Cooperate")
    core.play(1, "Cooperate")
    assert core.forfeit(1) == {1: 0.0, 0: 10 / 15}  # 2 rounds left: S for the forfeiter, T for the other
    assert core.over and core.totals == [13.0, 3.0] and core.success(0)
    core.reset(np.random.default_rng(0))
    assert core.forfeit_all() == {0: 3 / 15, 1: 3 / 15}  # 3 rounds of mutual defection


def test_prisoners_dilemma_success_threshold_is_mutual_cooperation():
    core = PrisonersDilemma(rounds=2)
    core.reset(np.random.default_rng(0))
    for _ in range(2):
        core.play(0, "Cooperate")
        core.play(1, "Cooperate")
    assert core.totals == [6.0, 6.0] and core.success(0) and core.success(1) and core.outcome(0) == "draw"


def test_pd_opponents():
    rng = np.random.default_rng(0)
    tft = TitForTat()
    assert tft.act({"history": []}, rng) == "Cooperate"
    assert tft.act({"history": [{"you": "Cooperate", "other": "Defect"}]}, rng) == "Defect"
    assert AlwaysDefect().act({"history": []}, rng) == "Defect"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rounds": 0}, "rounds"),
        ({"rounds": True}, "rounds"),
        ({"payoffs": (1, 2, 3, 4)}, r"T > R > P > S"),
        ({"payoffs": (5, 3, 1)}, "four finite numbers"),
        ({"payoffs": (10, 3, 1, 0)}, r"2R > T \+ S"),
    ],
)
def test_pd_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PrisonersDilemma(**kwargs)


# ------------------------------------------------------------------------------------------------ negotiation
def test_negotiation_pools_and_values_follow_the_rules():
    core = Negotiation()
    for seed in range(300):
        core.reset(np.random.default_rng(seed))
        assert all(1 <= n <= 4 for n in core.counts) and 5 <= sum(core.counts) <= 7
        a, b = core.values
        assert a != b
        for values in core.values:
            assert sum(v * n for v, n in zip(values, core.counts)) == 10
        assert all(a[i] > 0 or b[i] > 0 for i in range(3))


def _negotiation(seed: int = 0, **kwargs) -> Negotiation:
    core = Negotiation(**kwargs)
    core.reset(np.random.default_rng(seed))
    core.counts, core.values = (3, 1, 2), ((1, 3, 2), (2, 0, 2))
    return core


def test_negotiation_parsing():
    core = _negotiation()
    assert core.parse_move(0, "accept") is None  # nothing to accept yet
    assert core.parse_move(1, "propose books=1 hats=1 balls=1") is None  # not its turn
    assert core.parse_move(0, "propose books=1 hats=0 balls=2") == "propose books=1 hats=0 balls=2"
    assert core.parse_move(0, "Propose: Books: 1, hat 0 and balls=2. message: hi  there\n") == (
        "propose books=1 hats=0 balls=2 message: hi there"
    )
    for bad in (
        "propose books=1 hats=0",  # a type missing
        "propose books=1 hats=0 balls=2 books=1",  # twice
        "propose books=4 hats=0 balls=0",  # more than the pool
        "propose books=-1 hats=0 balls=0",
        "propose books=1 hats=0 balls=2 and a pony",  # more than the pairs
        "give me everything",
        "",
    ):
        assert core.parse_move(0, bad) is None, bad
    long = core.parse_move(0, "propose books=0 hats=0 balls=0 message: " + "x" * 1000)
    assert long is not None and len(long) == len("propose books=0 hats=0 balls=0 message: ") + 300


def test_negotiation_deal_and_no_deal():
    core = _negotiation()
    assert core.play(0, "propose books=1 hats=1 balls=0 message: I want the hat") == {}
    assert core.parse_move(1, "accept") == "accept"
    assert core.play(1, "accept message: fine") == {0: 0.4, 1: 0.8}  # seat 0 gets 1+3, seat 1 2*2+2*2
    assert core.over and core.outcome(0) == "deal" and not core.success(0) and core.success(1)
    assert 'Message: "I want the hat"' in core.state_text(1)

    core = _negotiation(turn_cap=2, no_deal_reward=0.1)
    core.play(0, "propose books=3 hats=1 balls=2")
    assert "last turn" in core.state_text(1)
    assert core.play(1, "propose books=3 hats=1 balls=2") == {0: 0.1, 1: 0.1}  # the cap: no deal
    assert core.over and core.outcome(1) == "no deal" and core.deal is None

    core = _negotiation()
    core.play(0, "propose books=3 hats=1 balls=2")
    assert core.forfeit(1) == {0: 0.0, 1: 0.0} and core.over and "forfeited" in core.state_text(0)


def test_negotiation_state_hides_the_other_seats_values():
    core = _negotiation()
    assert core.state_view(0)["values"] == {"books": 1, "hats": 3, "balls": 2}
    assert core.state_view(1)["values"] == {"books": 2, "hats": 0, "balls": 2}
    assert "hat 3" in core.state_text(0) and "hat 3" not in core.state_text(1)
    json.dumps(core.state_view(0))


def test_message_claims():
    assert message_claims("I really need the hats, you can have the books.") == {1: 1, 0: -1}
    assert message_claims("Balls are worthless to me but I love books") == {2: -1, 0: 1}
    assert message_claims("hello there") == {}


def test_rule_negotiator_listens_to_what_is_said():
    """The same proposal with different messages gets different counter-offers: what is said matters."""
    rng = np.random.default_rng(0)

    def counter(message: str) -> str:
        core = _negotiation()
        core.values = ((2, 2, 1), (1, 3, 2))  # the opponent (seat 1) values hats most
        core.play(0, proposal_text((2, 0, 1), message))
        return RuleNegotiator().act(core.state_view(1), rng)

    wants_balls = counter("I need the balls. You can have the books.")
    wants_books = counter("I need the books. The balls are worthless to me.")
    # It keeps the hat either way (worth 3 to it) and gives away what the message asked for.
    assert wants_balls.startswith("propose books=3 hats=1 balls=1")
    assert wants_books.startswith("propose books=1 hats=1 balls=2")


def test_rule_negotiator_accepts_good_offers_and_concedes_late():
    rng = np.random.default_rng(0)
    rule = RuleNegotiator()
    core = _negotiation()
    core.play(0, "propose books=3 hats=0 balls=0")  # seat 1 gets hats 1 and balls 2: worth 4 to it (aspiration 8)
    assert rule.act(core.state_view(1), rng).startswith("propose")
    core = _negotiation()
    core.play(0, "propose books=0 hats=1 balls=0")  # seat 1 gets 3 books and 2 balls: worth 10
    assert rule.act(core.state_view(1), rng).startswith("accept")
    core = _negotiation(turn_cap=2)
    core.play(0, "propose books=3 hats=0 balls=1")  # worth 2 to seat 1, but the last turn: better than no deal
    assert rule.act(core.state_view(1), rng).startswith("accept")


def test_negotiators_play_legal_moves_and_rule_makes_deals():
    core, rule, rand = Negotiation(), RuleNegotiator(), RandomNegotiator()
    deals = 0
    for game in _play_seeded(core, 200, lambda g: [rule, rule] if g % 2 else [rule, rand]):
        assert core.over
        deals += (game % 2 == 1) and core.deal is not None
    assert deals >= 95  # two rule-based negotiators (100 games) almost always agree


# ------------------------------------------------------------------------------------------------ single-agent views
CHECKER_VARIANTS = [(i, {}) for i in GAME_ENV_IDS] + [
    ("ragen/TicTacToe-v0", {"opponent": "perfect", "seat": 1, "render_mode": "ansi"}),
    ("ragen/ConnectFour-v0", {"opponent": "rule", "enable_think": False}),
    ("ragen/PrisonersDilemma-v0", {"opponent": "always_defect", "rounds": 4, "max_turns": 7}),
    ("ragen/Negotiation-v0", {"opponent": "rule", "reward_wrappers": ALL_REWARDS, "prompt_layout": "ragen"}),
]


@pytest.mark.parametrize("env_id, kwargs", CHECKER_VARIANTS)
def test_check_env_wrapped_and_unwrapped(env_id, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "different from the unwrapped version" is expected for the wrapped env
        check_env(gym.make(env_id, **kwargs), skip_render_check=False)
    env_kwargs = {k: v for k, v in kwargs.items() if k in ("opponent", "seat", "render_mode", "rounds")}
    check_env(gym.make(env_id, **env_kwargs).unwrapped, skip_render_check=False)


@pytest.mark.parametrize("env_id", GAME_ENV_IDS)
@pytest.mark.parametrize("opponent", ["random", "rule"])
def test_views_play_whole_games_with_the_info_contract(env_id, opponent):
    """A scripted agent (the game's random legal mover, through the protocol) against each opponent: every step has
    the contract keys, parts sum to the reward, a finished game's rewards sum to its score."""
    env = gym.make(env_id, opponent=opponent)
    agent_rng = np.random.default_rng(1)
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        base = env.unwrapped
        assert set(INFO_KEYS) <= set(info) and info["legal_actions"] and info["opponent"]
        assert base.seat == seed % 2  # seats alternate with the seed
        total, steps, terminated, truncated = 0.0, 0, False, False
        while not (terminated or truncated):
            move = _agent_move(base, agent_rng)
            obs, reward, terminated, truncated, info = env.step(_reply(move))
            steps += 1
            assert set(INFO_KEYS) <= set(info) and env.observation_space.contains(obs)
            assert sum(info["reward_parts"].values()) == pytest.approx(reward)
            assert info["format_ok"] and info["action_is_valid"] and info["reason"] is None
            total += reward
        assert terminated and not truncated and base.core.over
        assert total == pytest.approx(base.core.score(base.seat))
        assert info["success"] == base.core.success(base.seat) and info["outcome"] is not None
        assert steps <= base.core.max_moves(base.seat)


def _agent_move(base: GameEnv, rng: np.random.Generator) -> str:
    view = base.core.state_view(base.seat)
    if view["game"] == "negotiation":
        return RandomNegotiator().act(view, rng)
    return RandomOpponent().act(view, rng)


def _perfect_reply(env: gym.Env) -> str:
    return _reply(str(best_moves(tuple(env.unwrapped.core.board))[0] + 1))


def test_view_rewards_win_draw_loss():
    env = gym.make("ragen/TicTacToe-v0", opponent="perfect", seat=1)
    env.reset(seed=0)  # perfect X moves first; perfect O draws
    total, done = 0.0, False
    while not done:
        _, reward, done, _, info = env.step(_perfect_reply(env))
        total += reward
    assert info["outcome"] == "draw" and total == 0.5 and not info["success"]

    env = gym.make("ragen/TicTacToe-v0", opponent="random", seat=0)
    wins = 0
    for seed in range(20):
        env.reset(seed=seed)
        done = False
        while not done:
            _, reward, done, _, info = env.step(_perfect_reply(env))
        assert reward in (1.0, 0.5) and (reward == 1.0) == info["success"] == (info["outcome"] == "win")
        wins += info["success"]
    assert wins >= 15

    env = gym.make("ragen/TicTacToe-v0", opponent="perfect")
    rng = np.random.default_rng(0)
    outcomes = []
    for seed in range(20):
        _, info = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            _, reward, done, _, info = env.step(_reply(str(rng.choice(info["legal_actions"]))))
            total += reward
        outcomes.append(info["outcome"])
        assert total == {"loss": 0.0, "draw": 0.5}[info["outcome"]]  # a random agent never beats it
    assert "loss" in outcomes


def test_view_pd_against_tit_for_tat():
    env = gym.make("ragen/PrisonersDilemma-v0")  # tit-for-tat by default
    env.reset(seed=0)
    rewards = [env.step(_reply("Cooperate"))[1] for _ in range(9)]
    obs, reward, terminated, _, info = env.step(_reply("Defect"))  # the classic last-round defection
    assert terminated and sum(rewards) + reward == pytest.approx((27 + 5) / 50)
    assert info["success"] and info["outcome"] == "win" and "Totals: you 32, the other player 27" in obs


def test_view_invalid_turns_then_running_out_of_turns_is_a_forfeit():
    env = gym.make("ragen/TicTacToe-v0", opponent="random", seat=0)
    env.reset(seed=3)
    board_before = env.unwrapped.core.board_text()
    results = []
    for reply in ["<answer>5</answer>", _reply("ten"), "nonsense", _reply("5 || 1")]:  # the last one is legal
        results.append(env.step(reply))
    for _, reward, terminated, truncated, info in results[:3]:
        assert reward == pytest.approx(-0.1) and not terminated and not truncated
        assert isinstance(info["reason"], str) and info["reason"]
    assert env.unwrapped.core.board_text() != board_before  # only the 4th reply moved
    assert results[3][4]["dropped_actions"] == ["1"] and results[3][4]["reason"] is None
    steps = 4
    truncated = terminated = False
    while not (terminated or truncated):
        _, reward, terminated, truncated, info = env.step("garbage")
        steps += 1
    assert truncated and not terminated and steps == 8 and not info["success"]  # the 8-turn budget


def test_illegal_move_reason_names_the_legal_moves():
    env = gym.make("ragen/TicTacToe-v0", lenient_actions=True, seat=0)
    env.reset(seed=0)
    env.step(_reply("centre"))
    taken = "5"
    _, reward, _, _, info = env.step(_reply(taken))
    assert reward == pytest.approx(-0.1) and not info["action_is_valid"]
    assert "valid actions: the number of an empty cell:" in info["reason"] and ", 5," not in info["reason"]
    base = gym.make("ragen/TicTacToe-v0", seat=0).unwrapped
    base.reset(seed=0)
    base.step("5")
    *_, info = base.step("5")
    assert "is not a legal move now" in info["reason"]


@pytest.mark.parametrize("env_id", GAME_ENV_IDS)
def test_same_seed_same_game(env_id):
    def trajectory(seed: int, **kwargs) -> list:
        env = gym.make(env_id, opponent="random", **kwargs)
        out = [env.reset(seed=seed)[0]]
        rng = np.random.default_rng(0)
        for _ in range(6):
            if env.unwrapped.core.over:
                break
            out.append(env.step(_reply(_agent_move(env.unwrapped, rng)))[:4])
        return out

    assert trajectory(7) == trajectory(7)
    firsts = {trajectory(seed)[0] for seed in range(1, 40, 2)}  # odd seeds: the opponent moves first
    # The Prisoner's Dilemma starts the same for every seed; the others differ by the opponent's move or the pool.
    assert len(firsts) == 1 if "Prisoners" in env_id else len(firsts) > 1
    # dynamics_seed: the same initial state, the opponent's later moves drawn afresh
    env = gym.make(env_id, opponent="random")
    first = env.reset(seed=7, options={"dynamics_seed": 1})[0]
    assert first == trajectory(7)[0]


def test_unseeded_reset_draws_the_seat():
    env = gym.make("ragen/TicTacToe-v0")
    env.reset(seed=0)
    seats = set()
    for _ in range(30):
        env.reset()
        seats.add(env.unwrapped.seat)
    assert seats == {0, 1}


@pytest.mark.parametrize(
    "env_id, kwargs, match",
    [
        ("ragen/TicTacToe-v0", {"opponent": "grandmaster"}, r"opponent='grandmaster'.*'perfect'"),
        ("ragen/ConnectFour-v0", {"opponent": "perfect"}, r"one of \['random', 'rule'\] for Connect Four"),
        ("ragen/TicTacToe-v0", {"seat": "middle"}, r"seat='middle'.*'first'"),
        ("ragen/TicTacToe-v0", {"seat": 2}, "seat=2"),
        ("ragen/TicTacToe-v0", {"seat": True}, "seat=True"),
        ("ragen/Negotiation-v0", {"turn_cap": 1}, r"turn_cap=1: expected an int in 2\.\.40"),
        ("ragen/Negotiation-v0", {"no_deal_reward": 2}, "no_deal_reward"),
        ("ragen/PrisonersDilemma-v0", {"rounds": -3}, "rounds=-3"),
        ("ragen/TicTacToe-v0", {"render_mode": "rgb_array"}, "render_mode"),
    ],
)
def test_bad_arguments_name_what_is_accepted(env_id, kwargs, match):
    with pytest.raises(ValueError, match=match):
        gym.make(env_id, **kwargs)


def test_parse_seat_spellings():
    assert [parse_seat(s) for s in (None, "alternate", 0, "first", 1, "second")] == [None, None, 0, 0, 1, 1]


def test_opponent_instance_and_broken_opponent():
    env = gym.make("ragen/TicTacToe-v0", opponent=RuleTicTacToe(), seat=0)
    env.reset(seed=0)
    assert env.step(_reply("1"))[4]["opponent"] == "rule"

    class Broken(RandomOpponent):
        name = "broken"

        def act(self, view, rng):
            return "10"

    env = gym.make("ragen/TicTacToe-v0", opponent=Broken(), seat=1)
    with pytest.raises(RuntimeError, match="opponent .* played an illegal move '10'"):
        env.reset(seed=0)


def test_every_game_lists_its_opponents():
    assert OPPONENT_NAMES == {
        "tictactoe": ("random", "rule", "perfect"),
        "connect_four": ("random", "rule"),
        "prisoners_dilemma": ("random", "tit_for_tat", "rule", "always_defect", "always_cooperate"),
        "negotiation": ("random", "rule"),
    }


# ------------------------------------------------------------------------------------------------ fuzzing the views
FRAGMENTS = [
    "<think>", "</think>", "<answer>", "</answer>", "||", " ", "\n", "", "1", "5", "9", "0", "10", "4", "7",
    "Cooperate", "defect", "D", "propose", "books=1", "hats=0", "balls=2", "books=9", "accept", "message:", "I need",
    "the hats", "center", "column 3", "√", "中文", "\x00", "<|im_end|>", "eval('1')", "-1",
]  # fmt: skip
replies = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=30).map("".join),
    st.builds(
        lambda think, answer: f"<think>{think}</think><answer>{answer}</answer>",
        st.text(max_size=60),
        st.lists(st.sampled_from(FRAGMENTS), max_size=8).map(" ".join),
    ),
)
_VIEWS: dict[str, gym.Env] = {}


@pytest.mark.parametrize("env_id", GAME_ENV_IDS)
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(batch=st.lists(replies, min_size=1, max_size=12))
def test_hypothesis_replies_never_raise_and_episodes_stay_bounded(env_id, batch):
    if env_id not in _VIEWS:
        _VIEWS[env_id] = gym.make(env_id, opponent="rule", reward_wrappers=ALL_REWARDS, lenient_actions=True)
    env = _VIEWS[env_id]
    env.reset(seed=len(batch))
    budget = ragen_envs.reference_settings(env_id).max_turns
    for turn, reply in enumerate(batch * budget):  # replay the batch until the episode must have ended
        obs, reward, terminated, truncated, info = env.step(reply)
        assert env.observation_space.contains(obs) and math.isfinite(reward)
        assert set(INFO_KEYS) <= set(info)
        assert sum(info["reward_parts"].values()) == pytest.approx(reward)
        if not info["format_ok"] or not info["action_is_valid"]:
            assert isinstance(info["reason"], str) and info["reason"]
        if terminated or truncated:
            break
    assert terminated or truncated
    assert turn < budget


# ------------------------------------------------------------------------------------------------ the episode driver
class _LegalMoveAgent:
    """A scripted agent for the driver: a random legal move of the episode's state, in the reply format."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def reply_batch(self, episodes: list) -> list[str]:
        return [_reply(_agent_move(episode.env.unwrapped, self.rng)) for episode in episodes]


@pytest.mark.parametrize("env_id", GAME_ENV_IDS)
def test_the_episode_driver_plays_the_views_unchanged(env_id):
    """Training, validation, evaluation and the demo play through ``play_episodes``: the games need nothing more."""
    from ragen_envs.driver import play_episodes, rollout_jobs

    jobs = rollout_jobs(seeds=[0, 1, 2], group_size=2, group_randomness="independent")
    episodes = play_episodes(env_id, jobs, _LegalMoveAgent(), env_kwargs={"opponent": "rule"})
    assert len(episodes) == 6
    for episode in episodes:
        assert episode.error is None and episode.done and episode.terminated
        assert episode.turns and 0.0 <= episode.reward <= 1.0
    # the rollouts of a group share the initial state (seat, the opponent's first move, the pool)
    assert episodes[0].first_observation == episodes[1].first_observation
