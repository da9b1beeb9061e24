"""The text space shared by every ragen env.

Gymnasium's :class:`~gymnasium.spaces.Text` only accepts characters of a fixed charset (alphanumerics by
default). An LLM reply, a Sokoban grid with ``√`` or a WebShop product title can hold any unicode character,
so :class:`UnicodeText` keeps ``Text``'s length bounds and sampling but accepts every character.
"""

from __future__ import annotations

import string
from typing import Any

from gymnasium.spaces import Text

#: Characters used when *sampling* from the space (random replies for smoke tests and env checkers).
SAMPLE_CHARSET: str = string.ascii_letters + string.digits + string.punctuation + " \n" + "√<>|"


class UnicodeText(Text):
    """A :class:`~gymnasium.spaces.Text` space whose members are any ``str`` of ``min_length..max_length`` chars.

    Sampling draws from :data:`SAMPLE_CHARSET`; membership only checks the type and the length.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )


#: Longest observation any env emits (a WebShop page in html mode is the largest).
MAX_OBSERVATION_CHARS = 1_000_000
#: Longest reply the protocol accepts whole; longer replies are truncated before parsing (and penalised).
MAX_REPLY_CHARS = 1_000_000
