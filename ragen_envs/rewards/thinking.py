"""ThinkingLengthReward: keep thinking from shrinking away, without paying for padding."""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym

from ragen_envs.core import check_arg
from ragen_envs.rewards.base import RewardShaping

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
#: Only the first this many characters of a thinking text are scanned.
_MAX_SCAN_CHARS = 20_000


def padding_stats(words: list[str], ngram: int = 3) -> tuple[float, float]:
    """``(distinct_ratio, repeated_ngram_ratio)`` of a word list: unique words / words, and the share of its
    ``ngram``-grams that repeat an earlier one (0 for natural text, near 1 for copy-pasted padding)."""
    if not words:
        return 0.0, 0.0
    distinct = len(set(words)) / len(words)
    grams = [tuple(words[i : i + ngram]) for i in range(len(words) - ngram + 1)]
    repeated = 1.0 - len(set(grams)) / len(grams) if grams else 0.0
    return distinct, repeated


class ThinkingLengthReward(RewardShaping):
    """Reward the length of the ``<think>`` text up to a target, with guards against padding.

    The paper (Finding 3) sees thinking shrink under outcome-only rewards; this shaping pays for thinking that keeps
    its length, but only for words that carry something:

    * words are runs of letters or digits (punctuation, whitespace and symbols earn nothing);
    * the credit grows linearly to ``max_bonus`` at ``target_words`` and stops there (a cap, so longer is not better);
    * thinking longer than ``max_words`` (the response budget) earns nothing, nor does one shorter than ``min_words``;
    * padding earns nothing: a distinct-word ratio below ``min_distinct_ratio`` ("go go go go"), or a share of repeated
      ``ngram``-grams above ``max_repeat_ratio`` (the same sentence pasted several times);
    * a malformed reply earns nothing.

    Args:
        max_bonus: credit at ``target_words`` words (>= 0).
        target_words: length at which the credit is full (>= 1).
        min_words / max_words: credit only for ``min_words <= words <= max_words``.
        min_distinct_ratio, max_repeat_ratio, ngram: the padding guards.
        weight, name: see :class:`~ragen_envs.rewards.base.RewardShaping`.
    """

    default_name = "thinking_length"

    def __init__(
        self,
        env: gym.Env,
        *,
        max_bonus: float = 0.1,
        target_words: int = 60,
        min_words: int = 5,
        max_words: int = 400,
        min_distinct_ratio: float = 0.3,
        max_repeat_ratio: float = 0.25,
        ngram: int = 3,
        weight: float = 1.0,
        name: str | None = None,
    ) -> None:
        super().__init__(env, weight=weight, name=name)

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        check_arg(
            isinstance(max_bonus, (int, float)) and not isinstance(max_bonus, bool) and max_bonus >= 0,
            "max_bonus",
            max_bonus,
            "a number >= 0",
        )
        check_arg(is_int(target_words) and target_words >= 1, "target_words", target_words, "an int >= 1")
        check_arg(
            is_int(min_words) and 0 <= min_words <= target_words,
            "min_words",
            min_words,
            f"an int in 0..target_words ({target_words})",
        )
        check_arg(
            is_int(max_words) and max_words >= target_words,
            "max_words",
            max_words,
            f"an int >= target_words ({target_words})",
        )
        check_arg(
            isinstance(min_distinct_ratio, (int, float)) and 0 <= min_distinct_ratio <= 1,
            "min_distinct_ratio",
            min_distinct_ratio,
            "a number in [0, 1]",
        )
        check_arg(
            isinstance(max_repeat_ratio, (int, float)) and 0 <= max_repeat_ratio <= 1,
            "max_repeat_ratio",
            max_repeat_ratio,
            "a number in [0, 1]",
        )
        check_arg(is_int(ngram) and ngram >= 1, "ngram", ngram, "an int >= 1")
        self.max_bonus = float(max_bonus)
        self.target_words, self.min_words, self.max_words = target_words, min_words, max_words
        self.min_distinct_ratio, self.max_repeat_ratio, self.ngram = (
            float(min_distinct_ratio),
            float(max_repeat_ratio),
            ngram,
        )

    def compute(self, action: str, info: dict[str, Any], context: Any) -> tuple[float, dict[str, Any]]:
        words = _WORD.findall(str(info.get("think", ""))[:_MAX_SCAN_CHARS].lower())
        n = len(words)
        details: dict[str, Any] = {"words": n}
        if not info.get("format_ok", False):
            return 0.0, {**details, "why_zero": "malformed reply"}
        if n < self.min_words:
            return 0.0, {**details, "why_zero": f"fewer than {self.min_words} words"}
        if n > self.max_words:
            return 0.0, {**details, "why_zero": f"more than {self.max_words} words"}
        distinct, repeated = padding_stats(words, self.ngram)
        details.update(distinct_ratio=round(distinct, 3), repeated_ngram_ratio=round(repeated, 3))
        if distinct < self.min_distinct_ratio:
            return 0.0, {**details, "why_zero": "padding: too few distinct words"}
        if repeated > self.max_repeat_ratio:
            return 0.0, {**details, "why_zero": "padding: repeated phrases"}
        return self.max_bonus * min(n, self.target_words) / self.target_words, details
