"""The text space shared by every ragen env, and its support for gymnasium's shared memory (``AsyncVectorEnv``).

Gymnasium's :class:`~gymnasium.spaces.Text` only accepts characters of a fixed charset (alphanumerics by
default). An LLM reply, a Sokoban grid with ``√`` or a WebShop product title can hold any unicode character,
so :class:`UnicodeText` keeps ``Text``'s length bounds and sampling but accepts every character.

Shared memory. ``AsyncVectorEnv(shared_memory=True)`` (what ``gymnasium.make_vec(..., vectorization_mode="async")``
makes) has each worker write its observation into a buffer made by ``create_shared_memory`` and reads the buffer
back *once*, when it is built, with ``read_from_shared_memory``, expecting a live view (a numpy array for ``Box``).
Gymnasium 1.x's ``Text`` versions store charset indices and read them into a tuple of ``str``: a snapshot of the
zeroed buffer, so every observation of every step is ``max_length`` copies of the charset's first character
(``"aaaa..."``), and a character outside the charset cannot be written at all. For :class:`UnicodeText` this module
registers its own three functions: each env gets a slot of ``max_length + 1`` int32 (its length, then its code
points), and the view read back is :class:`SharedTexts`, which decodes the slots when indexed, so it always holds
the latest observations (``AsyncVectorEnv``'s default ``copy=True`` returns ``tuple(view)``, a tuple of ``str``).
"""

from __future__ import annotations

import multiprocessing as mp
import string
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import numpy as np
from gymnasium.spaces import Text
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

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


#: The ``max_length`` of every unwrapped env's ``observation_space``: ``BaseTextEnv`` cuts any longer state text to
#: it (head and tail kept, see :func:`ragen_envs.core.cap_text`); a WebShop page in html mode is the longest text.
#: The LLM-facing env cuts its observations to ``ProtocolSettings.max_observation_chars`` (default: this value), and
#: its ``observation_space`` has that bound.
MAX_OBSERVATION_CHARS = 1_000_000
#: Longest reply the protocol accepts whole; longer replies are truncated before parsing (and penalised).
MAX_REPLY_CHARS = 1_000_000


# ------------------------------------------------------------------------------------------ shared memory
# One slot of ``max_length + 1`` int32 per env: the text's length, then its code points. UTF-32 holds any code point
# (lone surrogates too, with "surrogatepass"), so encoding and decoding are one C call each.
_CODEC = "utf-32-le"


class SharedTexts(Sequence[str]):
    """The texts in an ``AsyncVectorEnv``'s shared memory: a live, read-only sequence, decoded when indexed.

    ``tuple(view)`` (or ``copy.deepcopy(view)``, which ``AsyncVectorEnv(copy=True)`` applies) is a snapshot: a tuple of
    ``str``. With ``copy=False`` the env returns the view itself, which changes with the next ``step``/``reset``.
    """

    def __init__(self, shared_memory: Any, n: int, max_length: int) -> None:
        self._memory = shared_memory  # keeps the buffer alive
        self._slots = np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape(n, max_length + 1)

    def __len__(self) -> int:
        return int(self._slots.shape[0])

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        slot = self._slots[index]
        return slot[1 : 1 + int(slot[0])].tobytes().decode(_CODEC, "surrogatepass")

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __copy__(self) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (SharedTexts, tuple, list)):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # it changes

    def __repr__(self) -> str:
        return f"SharedTexts({tuple(self)!r})"


@create_shared_memory.register(UnicodeText)
def _create_unicode_shared_memory(space: UnicodeText, n: int = 1, ctx: ModuleType = mp) -> Any:
    return ctx.Array(np.dtype(np.int32).char, n * (space.max_length + 1))


@write_to_shared_memory.register(UnicodeText)
def _write_unicode_to_shared_memory(space: UnicodeText, index: int, value: str, shared_memory: Any) -> None:
    if not space.contains(value):  # never cut or pad silently: an observation outside its space is a bug
        got = f"a str of {len(value)} characters" if isinstance(value, str) else type(value).__name__
        raise ValueError(f"invalid observation for {space}: {got}")
    codes = np.frombuffer(value.encode(_CODEC, "surrogatepass"), dtype=np.int32)
    width = space.max_length + 1
    slot = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)[index * width : (index + 1) * width]
    slot[1 : 1 + len(codes)] = codes
    slot[0] = len(codes)


@read_from_shared_memory.register(UnicodeText)
def _read_unicode_from_shared_memory(space: UnicodeText, shared_memory: Any, n: int = 1) -> SharedTexts:
    return SharedTexts(shared_memory, n, space.max_length)
