"""The text games under PettingZoo: PettingZoo's own API and seed tests on every game (with random text and with
plausible replies that play real games), hypothesis-fuzzed replies that never raise and never stall a game, forfeits,
the per-seat turn protocol (messages, penalties, reward wrappers, settings) and the info contract."""

from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pettingzoo")

from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test, seed_test

import ragen_envs
from ragen_envs.core import INFO_KEYS
from ragen_envs.games import GAMES, aec_env, parallel_env
from ragen_envs.games.base import INVALID_CAP
from ragen_envs.games.pettingzoo_env import TextGameAECEnv, TextGameParallelEnv, TextObservation
from ragen_envs.settings import ProtocolSettings
from ragen_envs.spaces import UnicodeText

AEC_GAMES = [name for name, entry in GAMES.items() if entry.api == "aec"]
PLAUSIBLE_MOVES = {
    "tictactoe": [str(i) for i in range(11)],
    "connect_four": [str(i) for i in range(9)],
    "prisoners_dilemma": ["Cooperate", "Defect", "Cooperate", "Defect", "maybe"],
    "negotiation": ["accept message: ok", "accept"]
    + [f"propose books={a} hats={b} balls={c} message: I want {a}" for a in range(4) for b in range(3) for c in (0, 2)],
}  # fmt: skip


class PlausibleReplies(UnicodeText):
    """An action space whose samples are mostly well-formed replies naming a move (legal or not), so that PettingZoo's
    random-action tests play real games; one sample in ten is random text."""

    def __init__(self, moves: list[str]) -> None:
        super().__init__(256)
        self.moves = moves

    def sample(self, mask=None, probability=None) -> str:
        if self.np_random.random() < 0.1:
            return super().sample()
        move = self.moves[int(self.np_random.integers(len(self.moves)))]
        return f"<think>let me see</think><answer>{move}</answer>"


def _plausible(env, game: str):
    for agent in env.possible_agents:
        env.unwrapped.action_spaces[agent] = PlausibleReplies(PLAUSIBLE_MOVES[game])
    return env


def _reply(move: str) -> str:
    return f"<think>t</think><answer>{move}</answer>"


def _check_info(info: dict) -> None:
    assert set(INFO_KEYS) <= set(info)
    for key in ("agent", "seat", "legal_actions", "outcome", "score", "invalid_turns", "invalid_cap", "forfeit"):
        assert key in info, key


# ------------------------------------------------------------------------------------------------ PettingZoo's tests
@pytest.mark.parametrize("game", AEC_GAMES)
@pytest.mark.parametrize("plausible", [False, True])
def test_pettingzoo_api_test(game, plausible):
    env = aec_env(game)
    if plausible:
        _plausible(env, game)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # text observations are "not a NumPy array": PettingZoo warns, as designed
        api_test(env, num_cycles=300)


@pytest.mark.parametrize("plausible", [False, True])
def test_pettingzoo_parallel_api_test(plausible):
    env = parallel_env("prisoners_dilemma")
    if plausible:
        _plausible(env, "prisoners_dilemma")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(env, num_cycles=300)


@pytest.mark.parametrize("game", AEC_GAMES)
def test_pettingzoo_seed_test(game):
    seed_test(lambda: _plausible(aec_env(game), game), num_cycles=100)


def test_pettingzoo_parallel_seed_test():
    parallel_seed_test(lambda: _plausible(parallel_env(), "prisoners_dilemma"), num_cycles=100)


def test_plausible_replies_play_real_games():
    """The plausible-reply space makes PettingZoo's random play end games by their rules, not only by forfeits."""
    outcomes = set()
    env = _plausible(aec_env("tictactoe"), "tictactoe")
    for seed in range(30):
        env.reset(seed=seed)
        for i, agent in enumerate(env.possible_agents):  # seeded replies: the same games in every run and order
            env.action_space(agent).seed(100 * seed + i)
        for agent in env.agent_iter():
            _, _, terminated, truncated, info = env.last()
            if terminated or truncated:
                outcomes.add((info["outcome"], info["forfeit"]))
                env.step(None)
                continue
            env.step(env.action_space(agent).sample())
    assert ("win", False) in outcomes and ("loss", False) in outcomes


# ------------------------------------------------------------------------------------------------ fuzzing
FRAGMENTS = [
    "<think>", "</think>", "<answer>", "</answer>", "||", " ", "\n", "", "1", "3", "5", "7", "9", "0", "10", "4",
    "Cooperate", "Defect", "propose", "books=1", "hats=0", "balls=1", "books=0", "hats=1", "balls=0", "accept",
    "message:", "I need the hats", "√", "中文", "\x00", "<|im_end|>", "__import__('os')",
]  # fmt: skip
reply = st.one_of(
    st.text(max_size=120),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6)), max_size=25).map("".join),
    st.lists(st.sampled_from(FRAGMENTS), max_size=8).map(lambda parts: _reply(" ".join(parts))),
    st.sampled_from([_reply(m) for m in ["1", "2", "3", "4", "5", "6", "7", "8", "9", "Cooperate", "Defect"]]),
    st.sampled_from([_reply(m) for m in PLAUSIBLE_MOVES["negotiation"]]),
    st.none(),
    st.integers(),
)
_FUZZ_ENVS: dict[str, object] = {}


def _steps_bound(core) -> int:
    """Most steps a game can take whatever the replies: every step plays a move (round) or is an invalid turn of at
    least one seat, and each seat's INVALID_CAP-th invalid turn ends the game."""
    if core.simultaneous:
        return core.max_moves(0) + 2 * (INVALID_CAP - 1) + 1
    return core.max_moves(0) + core.max_moves(1) + 2 * (INVALID_CAP - 1) + 1


@pytest.mark.parametrize("game", AEC_GAMES)
@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(replies=st.lists(reply, min_size=1, max_size=16), seed=st.integers(0, 1000))
def test_fuzzed_replies_never_raise_and_games_end_in_bounded_steps_aec(game, replies, seed):
    if game not in _FUZZ_ENVS:
        _FUZZ_ENVS[game] = TextGameAECEnv(game, reward_wrappers=["format", "grounding", "thinking_length"])
    env = _FUZZ_ENVS[game]
    env.reset(seed=seed)
    bound = _steps_bound(env.core)
    steps = 0
    for agent in env.agent_iter(10_000):
        obs, reward, terminated, truncated, info = env.last()
        assert isinstance(obs, str) and env.observation_space(agent).contains(obs)
        assert math.isfinite(reward)
        _check_info(info)
        if terminated or truncated:
            env.step(None)
            continue
        env.step(replies[steps % len(replies)])
        steps += 1
        acted = env.infos[agent]
        assert sum(acted["reward_parts"].values()) == pytest.approx(env.rewards[agent])
        if not acted["format_ok"] or not acted["action_is_valid"]:
            assert isinstance(acted["reason"], str) and acted["reason"]
        assert steps <= bound
    assert env.core.over and not env.agents


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(replies=st.lists(st.tuples(reply, reply), min_size=1, max_size=16), seed=st.integers(0, 1000))
def test_fuzzed_replies_never_raise_and_games_end_in_bounded_steps_parallel(replies, seed):
    if "pd" not in _FUZZ_ENVS:
        _FUZZ_ENVS["pd"] = TextGameParallelEnv(reward_wrappers=["format", "thinking_length"], rounds=5)
    env = _FUZZ_ENVS["pd"]
    env.reset(seed=seed)
    bound = _steps_bound(env.core)
    steps = 0
    while env.agents:
        a, b = replies[steps % len(replies)]
        observations, rewards, terminations, _, infos = env.step({"player_0": a, "player_1": b})
        steps += 1
        for agent in observations:
            assert env.observation_space(agent).contains(observations[agent])
            assert math.isfinite(rewards[agent])
            _check_info(infos[agent])
            assert sum(infos[agent]["reward_parts"].values()) == pytest.approx(rewards[agent])
        assert steps <= bound
    assert env.core.over and all(terminations.values())


# ------------------------------------------------------------------------------------------------ turn-based games
def _play_aec(env, replies: dict[str, list[str]]) -> dict[str, tuple]:
    """Play scripted replies; the last ``env.last()`` of each agent, with its total reward."""
    totals = dict.fromkeys(env.possible_agents, 0.0)
    last = {}
    counters = dict.fromkeys(env.possible_agents, 0)
    for agent in env.agent_iter():
        obs, reward, terminated, truncated, info = env.last()
        totals[agent] += reward
        if terminated or truncated:
            last[agent] = (obs, totals[agent], info)
            env.step(None)
            continue
        env.step(replies[agent][counters[agent]])
        counters[agent] += 1
    return last


def test_tictactoe_game_messages_rewards_and_infos():
    env = aec_env("tictactoe", reward_wrappers=["format"])
    env.reset(seed=0)
    first = env.observe("player_0")
    assert isinstance(first, TextObservation) and isinstance(first, str)
    assert first.startswith("You are playing tic-tac-toe as X against O.") and "Turn 1:" in first
    assert env.infos["player_0"]["system_prompt"] == "You're a helpful assistant. "
    env.step(_reply("5"))
    second = env.observe("player_1")  # O's first message: the instructions, then the board after X's move
    assert second.startswith("You are playing tic-tac-toe as O against X.") and "X played cell 5." in second
    last = _play_aec(env, {"player_0": [_reply(m) for m in "193"], "player_1": [_reply(m) for m in "24"]})
    # X: 5, 1, 9 wins on the diagonal; O: 2, 4
    obs_x, total_x, info_x = last["player_0"]
    obs_o, _, info_o = last["player_1"]
    assert info_x["outcome"] == "win" and info_x["success"] and info_o["outcome"] == "loss"
    assert total_x == pytest.approx(1.0 + 0.1 * 3)  # the win, and the format bonus of X's 3 turns after the first
    assert "The episode has ended." in obs_x and "You lost." in obs_o and "Reward:\n0.0" in obs_o


def test_invalid_turns_forfeit_at_the_cap():
    env = aec_env("connect_four")
    env.reset(seed=0)
    env.step(_reply("4"))
    for k in range(1, INVALID_CAP + 1):
        assert env.agent_selection == "player_1"  # the same seat again after an invalid turn
        env.step(_reply("8") if k % 2 else "no tags")
        info = env.infos["player_1"]
        assert info["invalid_turns"] == k and info["reward_parts"]["format_penalty"] == pytest.approx(-0.1)
    assert info["forfeit"] and "forfeit" in info["reason"] and info["outcome"] == "loss"
    assert env.terminations == {"player_0": True, "player_1": True}
    assert env.rewards == {"player_0": 1.0, "player_1": pytest.approx(-0.1)}
    assert env.infos["player_0"]["outcome"] == "win" and env.infos["player_0"]["success"]
    assert "O forfeited the game" in env.observe("player_0") and "Reward:\n1.0" in env.observe("player_0")


def test_invalid_cap_argument_and_a_cap_of_one():
    env = TextGameAECEnv("tictactoe", invalid_cap=1)
    env.reset(seed=0)
    env.step("garbage")
    assert env.core.over and env.core.forfeited == 0
    with pytest.raises(ValueError, match=r"invalid_cap=0: expected an int >= 1"):
        TextGameAECEnv("tictactoe", invalid_cap=0)


def test_negotiation_under_pettingzoo_same_pool_as_the_single_agent_view():
    import gymnasium as gym

    env = aec_env("negotiation", enable_think=False)
    for seed in (0, 1):
        env.reset(seed=seed)
        view = gym.make("ragen/Negotiation-v0", seat=0)
        view.reset(seed=seed)
        assert env.unwrapped.core.counts == view.unwrapped.core.counts
        assert env.unwrapped.core.values == view.unwrapped.core.values
    env.reset(seed=2)
    counts = env.unwrapped.core.counts
    env.step("<answer>propose books=0 hats=0 balls=0 message: take it all, I insist</answer>")
    message = env.observe("player_1")
    assert 'Message: "take it all, I insist"' in message and "Standing proposal" in message
    env.step("<answer>accept message: thanks!</answer>")
    assert env.terminations["player_0"] and env.unwrapped.core.deal == ((0, 0, 0), counts)
    assert env.rewards == {"player_0": 0.0, "player_1": 1.0}
    assert 'Message: "thanks!"' in env.observe("player_0")


def test_same_seed_same_messages():
    def run(seed: int) -> list[str]:
        env = aec_env("negotiation")
        env.reset(seed=seed)
        out = []
        for agent in env.agent_iter(6):
            out.append(env.observe(agent))
            env.step(_reply("propose books=1 hats=1 balls=1 message: hello"))
        return out

    assert run(3) == run(3) and run(3) != run(4)


def test_ragen_prompt_layout_and_thinking_off():
    env = aec_env("tictactoe", prompt_layout="ragen", enable_think=False, bare_answers=True)
    env.reset(seed=0)
    system = env.infos["player_0"]["system_prompt"]
    assert "tic-tac-toe" in system and "<answer>...</answer>" in system
    env.step("5")  # a bare answer
    assert env.infos["player_0"]["actions"] == ["5"]
    env.step("<think>x</think><answer>")  # malformed
    assert "Your last reply was not used in full" in env.observe("player_1")


def test_settings_from_the_registered_id_and_game_owned_turn_budget():
    env = TextGameAECEnv("negotiation")
    registered = ragen_envs.reference_settings("ragen/Negotiation-v0")
    assert env.settings.length_hint == registered.length_hint == 200
    assert env.settings.actions_per_turn == 1 and env.settings.max_turns == 5 + 2 * INVALID_CAP
    with pytest.warns(UserWarning, match=r"max_turns=5 \(registered: 8\), max_actions_per_episode=10 \(registered: 8\) "
                                         r"replaced by the game's own turn budget 11"):  # fmt: skip
        env = TextGameAECEnv("tictactoe", protocol=ProtocolSettings(enable_think=False, format_penalty=-0.5))
    assert not env.settings.enable_think and env.settings.format_penalty == -0.5 and env.settings.max_turns == 11
    for kwargs, name in (
        ({"actions_per_turn": 2}, "actions_per_turn"),
        ({"max_turns": 3}, "max_turns"),
        ({"protocol": {"max_actions_per_episode": 3}}, "max_actions_per_episode"),
        ({"protocol": {"enable_think": True}, "enable_think": False}, "enable_think"),
        ({"no_such_setting": 1}, "no_such_setting"),
    ):
        with pytest.raises((ValueError, TypeError), match=name):
            TextGameAECEnv("tictactoe", **kwargs)


@pytest.mark.parametrize(
    "make, game, match",
    [
        (aec_env, "chess", r"game='chess': expected one of \['connect_four', 'negotiation'"),
        (aec_env, "prisoners_dilemma", "a turn-based game"),
        (parallel_env, "tictactoe", "a simultaneous game"),
    ],
)
def test_bad_game_names(make, game, match):
    with pytest.raises(ValueError, match=match):
        make(game)


def test_game_arguments_pass_through():
    env = TextGameAECEnv("negotiation", turn_cap=4, no_deal_reward=0.2)
    env.reset(seed=0)
    for _ in range(4):
        env.step(_reply("propose books=0 hats=0 balls=0"))
    assert env.core.over and env.rewards == {"player_0": pytest.approx(0.2), "player_1": pytest.approx(0.2)}


# ------------------------------------------------------------------------------------------------ prisoner's dilemma
def test_pd_rounds_payoffs_void_rounds_and_forfeit():
    env = parallel_env("prisoners_dilemma", rounds=3)
    observations, infos = env.reset(seed=0)
    assert set(observations) == set(infos) == {"player_0", "player_1"}
    assert "for 3 rounds" in observations["player_0"]
    _, rewards, _, _, infos = env.step({"player_0": _reply("Cooperate"), "player_1": _reply("Defect")})
    assert rewards == {"player_0": 0.0, "player_1": pytest.approx(5 / 15)}
    for agent in rewards:
        assert sum(infos[agent]["reward_parts"].values()) == pytest.approx(rewards[agent])
    # player_0 chose first: its round payoff came with player_1's choice and is on its info too
    _, rewards, _, _, infos = env.step({"player_0": _reply("Defect"), "player_1": _reply("Cooperate")})
    assert rewards == {"player_0": pytest.approx(5 / 15), "player_1": 0.0}
    assert infos["player_0"]["reward_parts"]["env"] == pytest.approx(5 / 15)
    assert "Reward:\n0.3333" in env.observe("player_0")
    # player_1 replies badly: the round is void, player_0's choice discarded
    observations, rewards, _, _, infos = env.step({"player_0": _reply("Cooperate"), "player_1": "???"})
    assert rewards == {"player_0": 0.0, "player_1": pytest.approx(-0.1)}
    assert infos["player_0"]["round_void"] and "was discarded" in observations["player_0"]
    assert len(env.core.history) == 2
    # a missing action is an invalid turn too; the 3rd invalid turn forfeits: 1 round left, S=0 / T=5
    env.step({"player_0": _reply("Cooperate")})
    observations, rewards, terminations, _, infos = env.step({"player_0": _reply("Cooperate"), "player_1": None})
    assert infos["player_1"]["forfeit"] and infos["player_1"]["invalid_turns"] == 3
    assert rewards == {"player_0": pytest.approx(5 / 15), "player_1": pytest.approx(-0.1)}
    assert all(terminations.values()) and env.agents == []
    assert env.core.totals == [10.0, 5.0] and infos["player_0"]["success"] is True
    with pytest.raises(ValueError, match="the game is over"):
        env.step({})


def test_pd_both_seats_reach_the_cap_together():
    env = parallel_env(rounds=10)
    env.reset(seed=0)
    for _ in range(INVALID_CAP):
        _, rewards, terminations, _, _ = env.step({"player_0": "x", "player_1": "y"})
    assert all(terminations.values()) and env.core.forfeited == -1
    assert rewards["player_0"] == pytest.approx(-0.1 + 10 / 50)  # every round as mutual defection: P=1 each
    assert "Both players forfeited" in env.observe("player_0")


def test_pd_full_game_with_reward_wrappers():
    env = parallel_env(rounds=4, reward_wrappers=["format"])
    env.reset(seed=1)
    total = dict.fromkeys(env.possible_agents, 0.0)
    while env.agents:
        _, rewards, _, _, infos = env.step({a: _reply("Cooperate") for a in env.agents})
        for agent, r in rewards.items():
            total[agent] += r
            assert infos[agent]["reward_parts"]["format"] == pytest.approx(0.1)
    assert total["player_0"] == pytest.approx(12 / 20 + 0.4)
    assert infos["player_0"]["outcome"] == "draw" and infos["player_0"]["success"]
