"""Claim parsers shared by the envs' ``check_reasoning``: what a ``<think>`` text says about a grid state.

A reasoning-grounding reward (:class:`ragen_envs.rewards.ReasoningGroundingReward`) asks the env to verify the claims a
model's thinking makes about the state it was written in. The envs differ in *what* is true; these helpers share *how*
claims are found in free text, so that every grid env recognises the same phrasings:

* position claims -- ``"I am at (1, 2)"``, ``"the goal is at (3,3)"``, ``"holes at (1,1), (2,3) and (3,0)"``:
  :func:`check_position_claims`;
* move-outcome claims -- ``"moving left leads to a hole"``, ``"going down would reach the goal"``,
  ``"Right is safe, no hole"``: :func:`check_move_claims`;
* relative-direction claims -- ``"the goal is below me"``, ``"the goal is to the right"``:
  :func:`check_relative_claims`.

Coordinates are ``(row, col)`` counted from 0 at the top-left, as every grid env's instructions say. Each distinct
claim is counted once, so repeating a true sentence earns nothing more. Phrases the parsers do not recognise are not
claims: they are neither supported nor contradicted. Everything here is linear-time regular-expression scanning with no
backtracking-heavy patterns, and the input is cut to :data:`MAX_THINK_CHARS` first, so megabyte replies stay cheap.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence

#: Only this many leading characters of a thinking text are checked (claims past it are ignored).
MAX_THINK_CHARS = 8192

#: Direction words (lower-case) -> canonical action names of the grid envs.
DIRECTION_WORDS: dict[str, str] = {
    "left": "Left",
    "west": "Left",
    "right": "Right",
    "east": "Right",
    "up": "Up",
    "upward": "Up",
    "upwards": "Up",
    "north": "Up",
    "down": "Down",
    "downward": "Down",
    "downwards": "Down",
    "south": "Down",
}

_COORD = re.compile(r"[\(\[]\s*(\d{1,3})\s*,\s*(\d{1,3})\s*[\)\]]")
_CLAUSE_SPLIT = re.compile(r"[.!?;\n]+|,\s*(?:but|while|whereas|so)\b")
_LIST_GAP = re.compile(r"^[\s,]*(?:and|or|&)?[\s,]*$")
# Words between an entity and a coordinate that make the coordinate a future or hypothetical position.
_NOT_NOW = re.compile(r"\b(?:to|into|will|would|could|after|then|next|move|moving|go|going|reach|end|land|if)\b")
_NEGATION = re.compile(r"\b(?:not|no|never|avoid|avoids|avoiding|away|without|nor|cannot)\b|n't\b")
_VAGUE = re.compile(
    r"\b(?:closer|nearer|toward|towards|chance|chances|direction|path|route|way|eventually|later|further|farther|"
    r"approach|approaches|distance|then)\b"
)
_MOVE = re.compile(
    r"\b(?:move|moving|moves|go|going|goes|step|stepping|head|heading|walk|walking|slide|sliding|push|pushing|"
    r"taking|take|choose|choosing|pick)\s+(?:one\s+(?:step|cell|tile)\s+)?(?:to\s+the\s+)?"
    r"(left|right|up|down|west|east|north|south)\b"
)
_WORD_RE_CACHE: dict[tuple[str, ...], re.Pattern[str]] = {}


def clauses(text: str) -> list[str]:
    """Lower-cased clauses of ``text`` (split on sentence ends, semicolons, new lines and contrastive commas)."""
    return [c.strip() for c in _CLAUSE_SPLIT.split(text[:MAX_THINK_CHARS].lower()) if c.strip()]


def _words_re(words: Sequence[str]) -> re.Pattern[str]:
    key = tuple(words)
    pattern = _WORD_RE_CACHE.get(key)
    if pattern is None:
        alternatives = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
        pattern = re.compile(rf"(?<![\w']){'(?:' + alternatives + ')'}(?![\w'])")
        _WORD_RE_CACHE[key] = pattern
    return pattern


def find_coordinates(text: str) -> list[tuple[int, int, int, int]]:
    """``(start, end, row, col)`` of every ``(row, col)`` or ``[row, col]`` pair in ``text``."""
    return [(m.start(), m.end(), int(m.group(1)), int(m.group(2))) for m in _COORD.finditer(text)]


def check_position_claims(
    text: str,
    locations: Mapping[str, Collection[tuple[int, int]]],
    keywords: Mapping[str, Sequence[str]],
) -> tuple[int, int]:
    """Count ``(supported, contradicted)`` claims that an entity is at a coordinate.

    ``locations`` maps an entity (``"player"``, ``"goal"``, ``"hole"``) to the cells where it really is;
    ``keywords`` maps it to the words that name it (``"i am"``, ``"goal"``, ``"holes"``). A coordinate is attributed
    to the nearest entity word before it in the same clause when the words between them are few (<= 4) and do not make
    it a future position (``"I will move to (1, 2)"`` is a plan, not a claim); a list of coordinates after one entity
    word (``"holes at (1,1), (2,3) and (3,0)"``) belongs to that entity.
    """
    finders = {entity: _words_re(words) for entity, words in keywords.items()}
    seen: set[tuple[str, int, int]] = set()
    supported = contradicted = 0
    for clause in clauses(text):
        coords = find_coordinates(clause)
        if not coords:
            continue
        mentions: list[tuple[int, str]] = []
        for entity, finder in finders.items():
            mentions.extend((m.end(), entity) for m in finder.finditer(clause))
        mentions.sort()
        previous_end = 0
        previous_entity: str | None = None
        for start, end, row, col in coords:
            entity: str | None = None
            if previous_entity is not None and _LIST_GAP.match(clause[previous_end:start]):
                entity = previous_entity
            else:
                before = [(pos, ent) for pos, ent in mentions if previous_end <= pos <= start]
                if before:
                    pos, ent = before[-1]
                    gap = clause[pos:start]
                    if len(gap.split()) <= 4 and not _NOT_NOW.search(gap):
                        entity = ent
            previous_end, previous_entity = end, entity
            if entity is None or (entity, row, col) in seen:
                continue
            seen.add((entity, row, col))
            if (row, col) in locations.get(entity, ()):
                supported += 1
            else:
                contradicted += 1
    return supported, contradicted


def check_move_claims(
    text: str,
    predict: Callable[[str], Collection[str]],
    outcomes: Mapping[str, Sequence[str]],
) -> tuple[int, int]:
    """Count ``(supported, contradicted)`` claims about what a move does.

    A claim is a clause with a move phrase (``"moving left"``, ``"go down"``, ``"step to the right"``) followed within
    eight words by an outcome word (``outcomes`` maps an outcome name such as ``"hole"`` to its words), with no word
    of progress between them (``closer``, ``towards``, ``chance``, ``then``: those speak of the route, not the next
    cell). ``predict(direction)`` returns the outcomes that the move (a canonical direction) really has from the state
    the thinking was written in. A negation between the move and the outcome word (``not``, ``no``, ``avoid``,
    ``n't``) turns the claim into "this move does *not* lead there" (``"moving left avoids the hole"``, ``"going up
    does not reach the goal"``).
    """
    finders = {name: _words_re(words) for name, words in outcomes.items()}
    seen: set[tuple[str, str, bool]] = set()
    supported = contradicted = 0
    for clause in clauses(text):
        move = _MOVE.search(clause)
        if move is None:
            continue
        direction = DIRECTION_WORDS[move.group(1)]
        tail = clause[move.end() :]
        for name, finder in finders.items():
            hit = finder.search(tail)
            if hit is None:
                continue
            gap = tail[: hit.start()]
            # "moving down brings me closer to the goal" or "... gives the best chance to reach the goal" is about
            # progress, not about the next cell: only short, direct phrasings are claims.
            if len(gap.split()) > 8 or _VAGUE.search(gap):
                continue
            # Only a negation between the move and the outcome word negates it ("left avoids the hole");
            # one before the move ("don't go left, it leads to a hole") is advice, not a claim about the outcome.
            negated = bool(_NEGATION.search(tail, 0, hit.start()))
            key = (direction, name, negated)
            if key in seen:
                continue
            seen.add(key)
            happens = name in predict(direction)
            if happens != negated:
                supported += 1
            else:
                contradicted += 1
    return supported, contradicted


_RELATIVE = re.compile(
    r"\b(?:is|are|lies|lie|sits|located|seems)\s+(?:directly\s+|right\s+|just\s+|somewhere\s+)?"
    r"(?:to\s+the\s+|on\s+the\s+)?(below|under|beneath|above|over|left|right|up|down)\b"
)
_RELATIVE_WORDS = {
    "below": "Down",
    "under": "Down",
    "beneath": "Down",
    "down": "Down",
    "above": "Up",
    "over": "Up",
    "up": "Up",
    "left": "Left",
    "right": "Right",
}


def check_relative_claims(
    text: str,
    subject_words: Sequence[str],
    reference: tuple[int, int],
    targets: Collection[tuple[int, int]],
) -> tuple[int, int]:
    """Count ``(supported, contradicted)`` claims like ``"the goal is below me"`` / ``"the goal is to the left"``.

    ``subject_words`` name the entity (``"goal"``), ``targets`` are its cells and ``reference`` is the player's cell.
    "below" is true when the entity's row is larger than the player's, "left" when its column is smaller, and so on;
    a claim is supported when it holds for at least one of the entity's cells.
    """
    subject = _words_re(subject_words)
    seen: set[str] = set()
    supported = contradicted = 0
    for clause in clauses(text):
        found = subject.search(clause)
        if found is None or _NEGATION.search(clause):
            continue
        rel = _RELATIVE.search(clause, found.end())
        if rel is None or rel.start() - found.end() > 20:
            continue
        direction = _RELATIVE_WORDS[rel.group(1)]
        if direction in seen:
            continue
        seen.add(direction)
        r0, c0 = reference
        holds = any(
            (direction == "Down" and r > r0)
            or (direction == "Up" and r < r0)
            or (direction == "Left" and c < c0)
            or (direction == "Right" and c > c0)
            for r, c in targets
        )
        if holds:
            supported += 1
        else:
            contradicted += 1
    return supported, contradicted
