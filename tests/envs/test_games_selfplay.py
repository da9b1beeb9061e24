"""Self-play games (``ragen_envs.games.selfplay.play_games``): both seats played by agents in one game, each seat
recorded as its own episode with its own chat, turns and rewards; bad replies and stopped seats never stall a game."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pettingzoo")

from ragen_envs.driver import AgentReply, rollout_jobs
from ragen_envs.games import GAMES, OPPONENT_NAMES
from ragen_envs.games.base import INVALID_CAP, LOSS, WIN
from ragen_envs.games.selfplay import FixedOpponentAgent, Matchup, play_games


def fixed(game: str, name: str) -> FixedOpponentAgent:
    return FixedOpponentAgent(name, dict(GAMES[game].env.opponents), game)


class ScriptedAgent:
    """Answers every seat with the next text of ``texts`` (cycling), counting the calls."""

    def __init__(self, texts: list[str]) -> None:
        self.texts, self.calls = texts, 0

    def reply_batch(self, episodes):
        out = []
        for _ in episodes:
            out.append(AgentReply(self.texts[self.calls % len(self.texts)]))
            self.calls += 1
        return out


class StoppingAgent:
    """Stops every seat it plays (as a model agent does when the context is full)."""

    def reply_batch(self, episodes):
        return [AgentReply("", stop="context full") for _ in episodes]


@pytest.mark.parametrize("game", sorted(GAMES))
def test_each_seat_is_an_episode_whose_rewards_sum_to_its_game_score(game):
    names = OPPONENT_NAMES[game]
    first, second = fixed(game, names[0]), fixed(game, names[-1])
    jobs = rollout_jobs([3, 4, 5], group_size=2)
    records = play_games(game, jobs, lambda job: Matchup((first, second), (True, True), "fixed"),
                         env_kwargs={"enable_think": False})  # fmt: skip
    assert [r.job for r in records] == jobs
    for record in records:
        for seat, episode in enumerate(record.seats):
            assert episode.done and episode.terminated and not episode.truncated
            assert episode.job.group_id == 2 * record.job.group_id + seat
            assert episode.job.tag == {"seat": seat, "opponent": "fixed", "game": game}
            assert episode.turns, "every seat moved at least once"
            # Fixed opponents always reply well, so a seat's return is exactly its game score.
            assert episode.reward == pytest.approx(record.scores[seat])
            assert episode.turns[-1].info["outcome"] == record.outcomes[seat] is not None
            # The chat alternates user / assistant and ends with the message that says the game is over.
            roles = [m["role"] for m in episode.messages if m["role"] != "system"]
            assert roles == ["user", "assistant"] * len(episode.turns) + ["user"]
            assert all(t.observation for t in episode.turns)
        assert set(record.outcomes) <= set(GAMES[game].core.outcomes)


def test_the_second_seat_reads_the_first_seats_move_and_a_loss_reaches_the_loser():
    # X plays 1, 2, 3 (a row); O plays 4, 5: X wins on its third move, after O's second.
    x, o = (
        ScriptedAgent(["<answer>1</answer>", "<answer>2</answer>", "<answer>3</answer>"]),
        ScriptedAgent(["<answer>4</answer>", "<answer>5</answer>"]),
    )
    (record,) = play_games("tictactoe", rollout_jobs([0]), lambda job: Matchup((x, o), (True, True), "self"),
                           env_kwargs={"enable_think": False})  # fmt: skip
    seat_x, seat_o = record.seats
    assert record.outcomes == ("win", "loss") and record.scores == (WIN, LOSS)
    assert "X played cell 1" in seat_o.first_observation  # O's first message is made when O first moves
    assert "X played" not in seat_x.first_observation
    assert [t.reward for t in seat_x.turns] == [0.0, 0.0, WIN]
    assert seat_o.turns[-1].info["outcome"] == "loss" and not seat_o.success and seat_x.success
    assert "game is over" in seat_o.messages[-1]["content"] or "ended" in seat_o.messages[-1]["content"]


@pytest.mark.parametrize("game", sorted(GAMES))
def test_a_stopped_seat_forfeits_without_stalling(game):
    good = fixed(game, OPPONENT_NAMES[game][0])
    (record,) = play_games(game, rollout_jobs([1]), lambda job: Matchup((StoppingAgent(), good), (True, True), "x"),
                           env_kwargs={"enable_think": False})  # fmt: skip
    stopped, other = record.seats
    assert stopped.truncated and stopped.end_reason == "context full" and not stopped.turns
    assert other.done and record.scores[1] >= record.scores[0]


reply = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["<answer>5</answer>", "<answer>Cooperate</answer>", "<answer>accept</answer>", "<answer>",
                     "<answer>propose books=1 hats=1 balls=0 message: hi</answer>", "<answer>99</answer>"]),
)  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(game=st.sampled_from(sorted(GAMES)), texts=st.lists(reply, min_size=1, max_size=8), seed=st.integers(0, 99))
def test_fuzzed_replies_never_raise_and_every_game_ends(game, texts, seed):
    agent = ScriptedAgent(texts)
    records = play_games(game, rollout_jobs([seed], 2), lambda job: Matchup((agent, agent), (True, True), "self"))
    for record in records:
        assert all(e.done for e in record.seats)
        invalid = [sum(not t.info["action_is_valid"] for t in e.turns) for e in record.seats]
        assert all(n <= INVALID_CAP for n in invalid)  # the cap forfeits the game, so no seat goes beyond it
        assert all(0.0 <= s <= 1.0 for s in record.scores)


def test_progress_advances_once_per_finished_game():
    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    bar, rnd = Bar(), fixed("connect_four", "random")
    play_games("connect_four", rollout_jobs([0, 1], 3), lambda job: Matchup((rnd, rnd), (True, True), "x"),
               batch_size=4, progress=bar)  # fmt: skip
    assert bar.n == 6


def test_fixed_opponents_share_the_groups_randomness_unless_independent():
    game = "tictactoe"
    rnd = fixed(game, "random")

    def moves(jobs):
        records = play_games(game, jobs, lambda job: Matchup((rnd, rnd), (True, True), "random"))
        return [[t.reply for t in r.seats[0].turns] for r in records]

    shared = moves(rollout_jobs([7], 3))
    assert shared[0] == shared[1] == shared[2]
    independent = moves(rollout_jobs([7], 3, group_randomness="independent"))
    assert independent[0] == shared[0] and len({tuple(m) for m in independent}) > 1


def test_bad_arguments_name_what_is_accepted():
    with pytest.raises(ValueError, match="game"):
        play_games("chess", [], lambda job: None)
    with pytest.raises(ValueError, match="opponent"):
        FixedOpponentAgent("grandmaster", dict(GAMES["tictactoe"].env.opponents), "tictactoe")
