"""A negotiation language game: two seats split a pool of items they value differently, talking as they bargain.

After Lewis et al. (2017), "Deal or No Deal?". The pool holds books, hats and balls (1-4 of each, 5-7 items in
all, drawn per seed). Each seat has private values per item, whole numbers that make the whole pool worth exactly 10
to it; every item type is worth something to at least one seat, and the two seats' values differ. A seat sees its
own values only; what the other wants it must learn from what the other proposes and says.

Seats: ``player_0`` (``Player 1``) moves first, then the seats alternate (PettingZoo's AEC API).

Action (one per turn), free text in ``<answer>``:

* ``propose books=1 hats=0 balls=2 message: <free text>`` -- the counts are what the *proposer* gets, the other seat
  would get the rest; every item type must be given once (``books=1``, ``books: 1`` or ``books 1``; singular names
  work too), each count between 0 and the pool's. The message is optional and goes to the other seat.
* ``accept message: <free text>`` -- accept the other seat's standing proposal (its latest one): the deal is done.
  Not legal before any proposal.

What is said matters: messages are shown to the other seat, and the rule-based opponent reads them -- a sentence that
says you want, need or value an item type (``"I really need the hats"``) raises its estimate of your value for it,
one that says you do not (``"you can have the books"``, ``"balls are worthless to me"``) sets it to zero -- and
offers what it believes you want most for what costs it least. A message longer than ``max_message_chars`` (300) is
cut; a ``||`` in a message splits the answer into actions, and only the first is played.

Observation (seat ``Player 2`` on turn 2)::

    Negotiation, turn 2 of 10 (both players' turns counted). You are Player 2; the other player is Player 1.
    Pool: 3 books, 1 hat, 2 balls.
    Your values per item: book 1, hat 3, ball 2 (the whole pool is worth 10 to you). The other player's values are
    private.
    Moves so far:
    - Turn 1, the other player proposed: they get 2 books, 0 hats, 2 balls; you get 1 book, 1 hat, 0 balls.
      Message: "I care most about the balls."
    Standing proposal: you would get 1 book, 1 hat, 0 balls, worth 4 to you. Answer accept to take it, or propose.

Rewards: when a proposal is accepted, each seat gets the value of its share divided by 10 (its whole pool's value),
in [0, 1]; if ``turn_cap`` turns (default **10**, 5 per seat) pass without a deal, each gets ``no_deal_reward``
(default 0). 0 on every other turn. Success: a deal worth at least half the pool to the seat (>= 5 of 10).

Episode end: an accepted proposal, or the turn cap (a proposal on the last turn cannot be accepted: no deal). In
PettingZoo a seat's 3rd invalid turn forfeits: the game ends without a deal (both get ``no_deal_reward``). In the
single-agent view (``ragen/Negotiation-v0``) the protocol allows 8 turns (5 moves + 3); running out of turns
truncates the episode with no deal.

Opponents (single-agent view, ``opponent=``): ``"random"`` (accepts a standing proposal with probability 0.3, else
proposes a uniformly random split) and ``"rule"`` (see :class:`RuleNegotiator`).

Arguments (``ragen/Negotiation-v0``): ``turn_cap`` (2..40, both seats' turns together; set ``max_turns`` to
``ceil(turn_cap / 2) + 3`` with it), ``no_deal_reward`` (-1..1), ``max_message_chars`` (>= 0), ``seat`` (``None``:
``seed % 2``; ``0``/``1``), ``opponent`` (default ``"random"``), ``render_mode`` (``None`` or ``"ansi"``).
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any

import numpy as np

from ragen_envs.core import check_arg
from ragen_envs.games.base import GameCore, Opponent, best_of, normalize_move_text
from ragen_envs.games.view import GameEnv

ITEMS: tuple[str, str, str] = ("books", "hats", "balls")
_SINGULAR = {"books": "book", "hats": "hat", "balls": "ball"}
_ITEM_WORDS = {**{name: i for i, name in enumerate(ITEMS)}, **{s: ITEMS.index(p) for p, s in _SINGULAR.items()}}
#: Value of the whole pool to each seat.
POOL_VALUE = 10
_PAIR = re.compile(r"\b(books?|hats?|balls?)\s*(?:=|:)?\s*(-?\d+)\b")
_MESSAGE = re.compile(r"\bmessage\s*:", re.IGNORECASE)
#: What may stand between the pairs of a proposal ("books=1, hats=0 and balls=2").
_SEPARATORS = re.compile(r"[\s,;:&+()]|\band\b")
_ACCEPT_WORDS = frozenset({"accept", "i accept", "accept deal", "accept the deal", "accept proposal", "deal"})


def count_text(counts: tuple[int, ...] | list[int]) -> str:
    """``"2 books, 0 hats, 1 ball"``."""
    return ", ".join(f"{n} {ITEMS[i] if n != 1 else _SINGULAR[ITEMS[i]]}" for i, n in enumerate(counts))


def proposal_text(counts: tuple[int, ...] | list[int], message: str = "") -> str:
    """The canonical move text of a proposal in which the proposer gets ``counts``."""
    text = "propose " + " ".join(f"{ITEMS[i]}={n}" for i, n in enumerate(counts))
    return f"{text} message: {message}" if message else text


@lru_cache(maxsize=64)
def value_vectors(counts: tuple[int, int, int]) -> tuple[tuple[int, int, int], ...]:
    """Every vector of whole item values (0..10) that makes the pool ``counts`` worth :data:`POOL_VALUE`."""
    return tuple(
        (a, b, c)
        for a in range(POOL_VALUE + 1)
        for b in range(POOL_VALUE + 1)
        for c in range(POOL_VALUE + 1)
        if a * counts[0] + b * counts[1] + c * counts[2] == POOL_VALUE
    )


def draw_game(rng: np.random.Generator) -> tuple[tuple[int, int, int], tuple[tuple[int, int, int], ...]]:
    """A pool (1-4 of each type, 5-7 items) and two private value vectors, as Lewis et al. draw them: each worth 10,
    every type valued by at least one seat, the two vectors different."""
    while True:
        counts = tuple(int(x) for x in rng.integers(1, 5, size=3))
        if 5 <= sum(counts) <= 7:
            break
    options = value_vectors(counts)  # type: ignore[arg-type]
    while True:
        a, b = (options[int(i)] for i in rng.integers(len(options), size=2))
        if a != b and all(a[i] > 0 or b[i] > 0 for i in range(3)):
            return counts, (a, b)  # type: ignore[return-value]


class Negotiation(GameCore):
    """The rules of the negotiation game. See the module docstring."""

    name = "negotiation"
    title = "Negotiation"
    outcomes = ("deal", "no deal")
    seat_labels = ("Player 1", "Player 2")

    def __init__(self, turn_cap: int = 10, no_deal_reward: float = 0.0, max_message_chars: int = 300) -> None:
        super().__init__()
        check_arg(
            isinstance(turn_cap, int) and not isinstance(turn_cap, bool) and 2 <= turn_cap <= 40,
            "turn_cap",
            turn_cap,
            "an int in 2..40 (both seats' turns together)",
        )
        check_arg(
            isinstance(no_deal_reward, (int, float))
            and not isinstance(no_deal_reward, bool)
            and -1.0 <= no_deal_reward <= 1.0,
            "no_deal_reward",
            no_deal_reward,
            "a number in [-1, 1]",
        )
        check_arg(
            isinstance(max_message_chars, int) and not isinstance(max_message_chars, bool) and max_message_chars >= 0,
            "max_message_chars",
            max_message_chars,
            "an int >= 0",
        )
        self.turn_cap = turn_cap
        self.no_deal_reward = float(no_deal_reward)
        self.max_message_chars = max_message_chars
        self.counts: tuple[int, int, int] = (1, 1, 1)
        self.values: tuple[tuple[int, int, int], ...] = ((0, 0, 0), (0, 0, 0))
        self.turn = 0
        self.history: list[dict[str, Any]] = []  # {"seat", "kind", "counts" (the proposer's), "message"}
        self.standing: tuple[int, tuple[int, int, int]] | None = None  # (proposer, what the proposer gets)
        self.deal: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None  # each seat's share
        self.finished = False

    # ------------------------------------------------------------------ rules
    def reset(self, rng: np.random.Generator) -> None:
        self.counts, self.values = draw_game(rng)
        self.turn = 0
        self.history = []
        self.standing = None
        self.deal = None
        self.finished = False
        self.forfeited = None

    def to_move(self) -> tuple[int, ...]:
        return () if self.finished else (self.turn,)

    def legal_moves(self, seat: int) -> list[str]:
        if self.finished or seat != self.turn:
            return []
        ranges = " ".join(f"{ITEMS[i]}=0..{n}" for i, n in enumerate(self.counts))
        moves = [f"propose {ranges} message: ..."]
        if self.standing is not None:
            moves.append("accept message: ...")
        return moves

    def split_message(self, text: str) -> tuple[str, str]:
        """``(command, message)`` of a move text: the message is what follows ``message:``, cut and on one line."""
        found = _MESSAGE.search(text)
        if found is None:
            return text, ""
        message = " ".join(text[found.end() :].split())[: self.max_message_chars]
        return text[: found.start()], message

    def parse_move(self, seat: int, text: str) -> str | None:
        if seat not in self.to_move() or not isinstance(text, str):
            return None
        command, message = self.split_message(text)
        command = normalize_move_text(command)
        suffix = f" message: {message}" if message else ""
        if command in _ACCEPT_WORDS:
            return "accept" + suffix if self.standing is not None else None
        if not command.startswith("propose"):
            return None
        rest = command[len("propose") :]
        pairs = _PAIR.findall(rest)
        # Nothing but the pairs (and separators) may follow "propose": "books=1 hats=0 balls=2 and more" is no move.
        if _SEPARATORS.sub("", _PAIR.sub("", rest)):
            return None
        counts: dict[int, int] = {}
        for word, number in pairs:
            index = _ITEM_WORDS[word]
            if index in counts:
                return None  # a type given twice
            counts[index] = int(number)
        if sorted(counts) != [0, 1, 2] or any(not 0 <= counts[i] <= self.counts[i] for i in range(3)):
            return None
        return proposal_text(tuple(counts[i] for i in range(3)), message)

    def play(self, seat: int, move: str) -> dict[int, float]:
        command, message = self.split_message(move)
        self.turn = 1 - seat
        if command.strip() == "accept":
            assert self.standing is not None
            proposer, got = self.standing
            rest = tuple(n - g for n, g in zip(self.counts, got))
            shares = (got, rest) if proposer == 0 else (rest, got)
            self.deal = shares  # type: ignore[assignment]
            self.history.append({"seat": seat, "kind": "accept", "counts": None, "message": message})
            self.finished = True
            return {s: self.score(s) for s in (0, 1)}
        got = tuple(int(n) for _, n in _PAIR.findall(command))
        self.standing = (seat, got)  # type: ignore[assignment]
        self.history.append({"seat": seat, "kind": "propose", "counts": got, "message": message})
        if len(self.history) >= self.turn_cap:
            self.finished = True  # the cap: no one is left to accept
            return {s: self.score(s) for s in (0, 1)}
        return {}

    def forfeit(self, seat: int) -> dict[int, float]:
        self.forfeited = seat
        self.finished = True
        return {s: self.score(s) for s in (0, 1)}

    @property
    def over(self) -> bool:
        return self.finished

    def value(self, seat: int, counts: tuple[int, ...] | list[int]) -> int:
        """What ``counts`` of the items are worth to ``seat``."""
        return sum(v * n for v, n in zip(self.values[seat], counts))

    def score(self, seat: int) -> float:
        if not self.finished:
            return 0.0
        if self.deal is None:
            return self.no_deal_reward
        return self.value(seat, self.deal[seat]) / POOL_VALUE

    def success(self, seat: int) -> bool:
        return self.deal is not None and 2 * self.value(seat, self.deal[seat]) >= POOL_VALUE

    def outcome(self, seat: int) -> str | None:
        if not self.finished:
            return None
        return "deal" if self.deal is not None else "no deal"

    def max_moves(self, seat: int) -> int:
        return math.ceil(self.turn_cap / 2) if seat == 0 else self.turn_cap // 2

    # ------------------------------------------------------------------ text
    def instructions(self, seat: int) -> str:
        example = proposal_text((1, 0, 2), "I need the balls; you can have the hats.")
        return (
            f"You are playing a negotiation game as {self.seat_labels[seat]} against "
            f"{self.seat_labels[1 - seat]}. {'You' if seat == 0 else 'The other player'} move"
            f"{'' if seat == 0 else 's'} first; then you take turns.\n"
            "Together you must split a pool of books, hats and balls. Each of you values the items differently and "
            f"knows only their own values; the whole pool is worth {POOL_VALUE} points to each of you.\n"
            "On your turn, answer with exactly one move:\n"
            f"  {example}\n"
            "    proposes that you get 1 book, 0 hats and 2 balls, and the other player gets the rest. Give every "
            "item type. The message (optional) is shown to the other player: use it to explain, persuade or ask.\n"
            "  accept message: Deal!\n"
            "    accepts the other player's latest proposal, which ends the game with that split.\n"
            f"There are at most {self.turn_cap} turns in all; without a deal by then nobody gets anything"
            + (f" but {self.no_deal_reward:g}" if self.no_deal_reward else "")
            + ".\n"
            f"Reward: the value of the items you get, divided by {POOL_VALUE}."
        )

    def state_text(self, seat: int) -> str:
        me, other = self.seat_labels[seat], self.seat_labels[1 - seat]
        turn_now = len(self.history) + 1
        if self.finished:
            lines = [f"Negotiation, after {len(self.history)} of {self.turn_cap} turns. You are {me}."]
        else:
            counted = f"turn {turn_now} of {self.turn_cap} (both players' turns counted)"
            lines = [f"Negotiation, {counted}. You are {me}; the other player is {other}."]
        lines.append(f"Pool: {count_text(self.counts)}.")
        values = ", ".join(f"{_SINGULAR[ITEMS[i]]} {v}" for i, v in enumerate(self.values[seat]))
        lines.append(
            f"Your values per item: {values} (the whole pool is worth {POOL_VALUE} to you). The other player's "
            "values are private."
        )
        if self.history:
            lines.append("Moves so far:")
            for k, event in enumerate(self.history):
                who = "you" if event["seat"] == seat else "the other player"
                if event["kind"] == "accept":
                    text = f"- Turn {k + 1}, {who} accepted."
                else:
                    got = event["counts"]
                    rest = tuple(n - g for n, g in zip(self.counts, got))
                    mine, theirs = (got, rest) if event["seat"] == seat else (rest, got)
                    text = f"- Turn {k + 1}, {who} proposed: you get {count_text(mine)}; they get {count_text(theirs)}."
                if event["message"]:
                    text += f' Message: "{event["message"]}"'
                lines.append(text)
        if self.finished:
            if self.deal is not None:
                mine = self.deal[seat]
                lines.append(
                    f"Deal: you get {count_text(mine)}, worth {self.value(seat, mine)} to you. The game is over."
                )
            elif self.forfeited is not None:
                who = "You" if self.forfeited == seat else "The other player"
                lines.append(f"{who} forfeited (too many invalid turns): no deal. The game is over.")
            else:
                lines.append("No deal was made within the turn limit. The game is over.")
            return "\n".join(lines)
        if self.standing is not None and self.standing[0] != seat:
            rest = tuple(n - g for n, g in zip(self.counts, self.standing[1]))
            lines.append(
                f"Standing proposal: you would get {count_text(rest)}, worth {self.value(seat, rest)} to you. "
                "Answer accept to take it, or propose."
            )
        if turn_now == self.turn_cap:
            lines.append("This is the last turn: only accepting can still make a deal.")
        return "\n".join(lines)

    def state_view(self, seat: int) -> dict[str, Any]:
        def split(counts: tuple[int, ...]) -> dict[str, int]:
            return {ITEMS[i]: int(n) for i, n in enumerate(counts)}

        history = []
        for event in self.history:
            entry: dict[str, Any] = {"by": "you" if event["seat"] == seat else "other", "kind": event["kind"]}
            if event["counts"] is not None:
                rest = tuple(n - g for n, g in zip(self.counts, event["counts"]))
                mine = event["counts"] if event["seat"] == seat else rest
                entry["you_get"] = split(mine)
            entry["message"] = event["message"]
            history.append(entry)
        standing = None
        if self.standing is not None and self.standing[0] != seat and not self.finished:
            standing = split(tuple(n - g for n, g in zip(self.counts, self.standing[1])))
        return {
            "game": self.name,
            "pool": split(self.counts),
            "values": split(self.values[seat]),  # this seat's own values only
            "turn": len(self.history) + (0 if self.finished else 1),
            "turn_cap": self.turn_cap,
            "no_deal_reward": self.no_deal_reward,
            "history": history,
            "standing": standing,  # what this seat gets if it accepts
            "legal": self.legal_moves(seat),
            "deal": split(self.deal[seat]) if self.deal is not None else None,
            "over": self.finished,
        }

    def describe_moves(self, seat: int) -> str:
        if self.finished or seat != self.turn:
            return "none (it is not your turn)"
        ranges = " ".join(f"{ITEMS[i]}=<0..{n}>" for i, n in enumerate(self.counts))
        text = f"propose {ranges} message: <text> (the counts are what you get)"
        if self.standing is not None:
            text += ", or accept message: <text>"
        return text

    def render(self) -> str:
        lines = [f"pool: {count_text(self.counts)}", f"values: {self.values[0]} / {self.values[1]}"]
        for event in self.history:
            what = "accept" if event["kind"] == "accept" else proposal_text(event["counts"])
            lines.append(f"{self.seat_labels[event['seat']]}: {what}  {event['message']!r}")
        if self.finished:
            lines.append(f"deal: {self.deal}" if self.deal is not None else "no deal")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- opponents
# Clause-level cues of what a message says about the speaker's wants. Negative cues are checked first, since "don't
# need" contains "need".
_NEGATIVE_CUES = (
    "don't need", "dont need", "do not need", "don't want", "dont want", "do not want", "no use", "not need",
    "not want", "worthless", "useless", "nothing to me", "worth nothing", "worth 0", "worth zero", "zero",
    "don't care", "dont care", "do not care", "not interested", "you can have", "you can keep", "you take",
    "you keep", "all yours", "no value", "not valuable", "not worth",
)  # fmt: skip
_POSITIVE_CUES = (
    "need", "want", "value", "love", "like", "important", "most", "really", "must", "give me", "i'll take",
    "i will take", "i get", "valuable", "worth a lot", "prefer", "care about", "interested",
)  # fmt: skip
_CLAUSES = re.compile(r"[.!?;,\n]|\bbut\b|\band\b|\bwhile\b|\bwhereas\b")
_WORDS = re.compile(r"[a-z']+")


def message_claims(message: str) -> dict[int, int]:
    """What a message says the speaker wants: item index -> ``+1`` (wants it) or ``-1`` (does not), by clause."""
    claims: dict[int, int] = {}
    for clause in _CLAUSES.split(message.lower()):
        items = {_ITEM_WORDS[w] for w in _WORDS.findall(clause) if w in _ITEM_WORDS}
        if not items:
            continue
        if any(cue in clause for cue in _NEGATIVE_CUES):
            sign = -1
        elif any(cue in clause for cue in _POSITIVE_CUES):
            sign = 1
        else:
            continue
        for item in items:
            claims[item] = sign
    return claims


class RuleNegotiator(Opponent):
    """A reasonable rule-based negotiator that listens to what is said.

    * It estimates the other seat's values: equal per item at first; a type the other says it wants (see
      :func:`message_claims`) is weighted x3, one it says it does not want goes to 0, and its proposals hint too (a
      type it claims at least half of x1.5, a type it leaves entirely x0.5). Later claims override earlier ones.
    * Its aspiration (the least it settles for, of 10) starts at 8 and drops by 1 with each of its turns, to 5.
    * It accepts a standing proposal worth at least its aspiration, or, on the game's last two turns, anything worth
      at least 4 (on the very last turn, anything better than no deal).
    * Otherwise it proposes the split that gives the other seat the most *estimated* value among those worth at
      least its aspiration to itself (ties: more for itself, then at random), and says truthfully which item type it
      cares about most and which it does not value at all.
    """

    name = "rule"

    def act(self, view: dict[str, Any], rng: np.random.Generator) -> str:
        counts = [view["pool"][k] for k in ITEMS]
        mine = [view["values"][k] for k in ITEMS]
        own_turns = sum(1 for e in view["history"] if e["by"] == "you")
        turn, cap = view["turn"], view["turn_cap"]
        aspiration = max(5, 8 - own_turns)
        standing = view["standing"]
        if standing is not None:
            offered = sum(mine[i] * standing[k] for i, k in enumerate(ITEMS))
            no_deal = view["no_deal_reward"] * POOL_VALUE
            if offered >= aspiration or (turn >= cap - 1 and offered >= 4) or (turn == cap and offered > no_deal):
                return "accept message: Deal, thank you."
        belief = self.estimate(view, counts)
        splits = [(a, b, c) for a in range(counts[0] + 1) for b in range(counts[1] + 1) for c in range(counts[2] + 1)]
        values = [sum(m * n for m, n in zip(mine, s)) for s in splits]
        floor = min(aspiration, max(values))  # all it can get, if less than its aspiration
        candidates = [i for i, v in enumerate(values) if v >= floor]
        # Sort key: the other's estimated share first, then our own value; random among exact ties.
        keys = [sum(belief[j] * (counts[j] - splits[i][j]) for j in range(3)) * 1000 + values[i] for i in candidates]
        chosen = splits[candidates[best_of(keys, rng)]]
        return proposal_text(chosen, self.message(mine, chosen, counts))

    @staticmethod
    def estimate(view: dict[str, Any], counts: list[int]) -> list[float]:
        """The other seat's values per item as believed from its proposals and messages (sums to 10 over the pool)."""
        weights = [1.0, 1.0, 1.0]
        for event in view["history"]:
            if event["by"] != "other":
                continue
            if event["kind"] == "propose":
                # What the other proposes for itself is the pool minus what it offers us.
                theirs = [counts[j] - event["you_get"][ITEMS[j]] for j in range(3)]
                for j in range(3):
                    if 2 * theirs[j] >= counts[j] and theirs[j] > 0:
                        weights[j] *= 1.5
                    elif theirs[j] == 0:
                        weights[j] *= 0.5
            for item, sign in message_claims(event.get("message", "")).items():
                weights[item] = weights[item] * 3.0 if sign > 0 else 0.0
        total = sum(w * n for w, n in zip(weights, counts))
        if total <= 0:
            weights, total = [1.0, 1.0, 1.0], float(sum(counts))
        return [w * POOL_VALUE / total for w in weights]

    @staticmethod
    def message(mine: list[int], chosen: tuple[int, ...], counts: list[int]) -> str:
        top = ITEMS[int(np.argmax(mine))]
        text = f"I care most about the {top}."
        worthless = [ITEMS[i] for i in range(3) if mine[i] == 0]
        if worthless:
            text += f" The {' and '.join(worthless)} are worth nothing to me."
        rest = [counts[i] - chosen[i] for i in range(3)]
        return text + f" I propose I get {count_text(chosen)} and you get {count_text(rest)}."


class RandomNegotiator(Opponent):
    """Accepts a standing proposal with probability 0.3, otherwise proposes a uniformly random split."""

    name = "random"

    def act(self, view: dict[str, Any], rng: np.random.Generator) -> str:
        if view["standing"] is not None and rng.random() < 0.3:
            return "accept message: OK."
        counts = [int(rng.integers(view["pool"][k] + 1)) for k in ITEMS]
        return proposal_text(counts, "How about this?")


#: The opponents of the single-agent view, by name.
OPPONENTS: dict[str, type[Opponent]] = {"random": RandomNegotiator, "rule": RuleNegotiator}


class NegotiationEnv(GameEnv):
    """``ragen/Negotiation-v0``: one seat of the negotiation game against a fixed opponent (module docstring)."""

    core_cls = Negotiation
    opponents = OPPONENTS
