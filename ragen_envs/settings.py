"""Every turn-protocol setting in one typed object: :class:`ProtocolSettings`.

The turn protocol (:class:`ragen_envs.protocol.TurnProtocol`) is configured by this object and by nothing else. Each
registered ``ragen/*`` id declares its reference values (:data:`ragen_envs.registration.ENV_IDS`); keyword arguments
of ``gymnasium.make`` override them, one field at a time::

    env = gymnasium.make("ragen/Sokoban-v0", actions_per_turn=2)            # a field as a keyword
    env = gymnasium.make("ragen/Sokoban-v0", protocol={"actions_per_turn": 2})  # or in a ``protocol`` dict

The trainer config, the evaluation suites, result files, checkpoints and leaderboard rows embed the resolved object
(:meth:`ProtocolSettings.to_dict`), so a run says exactly which protocol it played. A setting may be given in several
places (a config file, a CLI flag, ``env_kwargs``); :func:`merge_settings` accepts that only when they agree, and
otherwise raises an error naming both places: there is never a silent winner.

Reference values: RAGEN's ``config/base.yaml`` (``agent_proxy``: ``max_turn`` 5, ``max_actions_per_turn`` 5,
``action_sep`` ``||``, ``enable_think``; ``es_manager.format_penalty`` -0.1), ``config/envs.yaml`` (per env:
``max_actions_per_traj``, ``max_tokens``, the length hint) and the per-env files ``config/_1_bandit.yaml`` /
``_4_countdown.yaml`` (one turn, one action) and ``_6_webshop.yaml`` (9 turns, one action each). See
``docs/fidelity.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ragen_envs.core import check_arg
from ragen_envs.spaces import MAX_OBSERVATION_CHARS, MAX_REPLY_CHARS

#: ``prompt_layout`` values. ``"reference"``: RAGEN's ``ctx_manager.py`` messages (system "You're a helpful
#: assistant.", the env's instructions opening the first user message, ``Turn k:`` / ``State:`` blocks, reward
#: messages); ``"ragen"``: instructions, reply format and action budget in the system message, ragen's wording.
PROMPT_LAYOUTS: tuple[str, ...] = ("reference", "ragen")
#: ``reply_prefix`` value that picks the reference's generation prefix: ``<think>`` with thinking on, else ``<answer>``.
AUTO_PREFIX = "auto"


@dataclass(frozen=True)
class ProtocolSettings:
    """The settings of the turn protocol (one model reply per step). Defaults: RAGEN's ``config/base.yaml``."""

    max_turns: int = field(
        default=5, metadata={"help": "Turns before the episode is truncated (agent_proxy.max_turn)."}
    )
    actions_per_turn: int = field(
        default=5, metadata={"help": "Most actions executed per reply; extra ones are dropped (max_actions_per_turn)."}
    )
    max_actions_per_episode: int = field(
        default=10,
        metadata={"help": "Action budget of an episode; truncated once spent (envs.yaml max_actions_per_traj)."},
    )
    action_sep: str = field(default="||", metadata={"help": "Separator between actions inside <answer>."})
    enable_think: bool = field(
        default=True, metadata={"help": "Require <think>...</think> before <answer> (off: the no-think ablation)."}
    )
    bare_answers: bool = field(
        default=False,
        metadata={
            "help": "With thinking off, also accept bare actions without <answer> tags (ragen's lenient parsing; the "
            "reference requires <answer>...</answer>)."
        },
    )
    lenient_actions: bool = field(
        default=False,
        metadata={
            "help": "Also accept each env's synonyms for its action names (north, 1-4, arrows, 'move left', quotes); "
            "the reference accepts only the names themselves, in any case."
        },
    )
    format_penalty: float = field(
        default=-0.1, metadata={"help": "Reward added on a turn whose reply is malformed or names an invalid action."}
    )
    length_hint: int = field(
        default=100,
        metadata={"help": "N in the prompt's 'Max response length: N words (tokens).' (envs.yaml max_tokens)."},
    )
    prompt_layout: str = field(
        default="reference", metadata={"help": f"Message layout: one of {PROMPT_LAYOUTS} (see the module docstring)."}
    )
    reply_prefix: str = field(
        default=AUTO_PREFIX,
        metadata={
            "help": "Generation prefix the model continues after: 'auto' (<think> or <answer> by enable_think, as "
            "the reference), '' (none) or the text."
        },
    )
    stop_after_answer: bool = field(
        default=True,
        metadata={
            "help": "End each reply at its first </answer> (the reference's parser keeps nothing after it, so the "
            "tokens would only be trained on); False lets the model write on to its end-of-turn token or the limit."
        },
    )
    max_reply_chars: int = field(
        default=MAX_REPLY_CHARS, metadata={"help": "A longer reply is cut to this many characters before parsing."}
    )
    max_observation_chars: int = field(
        default=MAX_OBSERVATION_CHARS, metadata={"help": "Observations are cut to this many characters."}
    )

    def __post_init__(self) -> None:
        for name in ("max_turns", "actions_per_turn", "max_actions_per_episode", "length_hint"):
            _check_int(name, getattr(self, name), 1)
        _check_int("max_reply_chars", self.max_reply_chars, 64)
        _check_int("max_observation_chars", self.max_observation_chars, 256)
        check_arg(
            isinstance(self.action_sep, str) and self.action_sep.strip() != "" and len(self.action_sep) <= 16,
            "action_sep",
            self.action_sep,
            "a non-blank str of at most 16 characters (the reference uses '||')",
        )
        check_arg(isinstance(self.enable_think, bool), "enable_think", self.enable_think, "True or False")
        check_arg(isinstance(self.bare_answers, bool), "bare_answers", self.bare_answers, "True or False")
        check_arg(isinstance(self.lenient_actions, bool), "lenient_actions", self.lenient_actions, "True or False")
        check_arg(
            isinstance(self.stop_after_answer, bool), "stop_after_answer", self.stop_after_answer, "True or False"
        )
        check_arg(
            isinstance(self.format_penalty, (int, float))
            and not isinstance(self.format_penalty, bool)
            and math.isfinite(self.format_penalty),
            "format_penalty",
            self.format_penalty,
            "a finite number (the reference uses -0.1)",
        )
        object.__setattr__(self, "format_penalty", float(self.format_penalty))
        check_arg(self.prompt_layout in PROMPT_LAYOUTS, "prompt_layout", self.prompt_layout, f"one of {PROMPT_LAYOUTS}")
        check_arg(
            isinstance(self.reply_prefix, str) and "\x00" not in self.reply_prefix and len(self.reply_prefix) <= 256,
            "reply_prefix",
            self.reply_prefix,
            "'auto' (the reference's <think>/<answer> by enable_think), '' (no prefix) or the prefix text",
        )

    # ------------------------------------------------------------------ derived values
    @property
    def generation_prefix(self) -> str:
        """The text the model continues from after the chat template's generation prompt (resolves ``"auto"``)."""
        if self.reply_prefix != AUTO_PREFIX:
            return self.reply_prefix
        return "<think>" if self.enable_think else "<answer>"

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """Strings that end a reply during generation (``SamplingParams.stop``)."""
        return ("</answer>",) if self.stop_after_answer else ()

    # ------------------------------------------------------------------ conversions
    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field (what result files, checkpoints and suites record)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "protocol settings") -> ProtocolSettings:
        """Build from a dict of field values; an unknown key is a ``ValueError`` naming ``where`` and the fields."""
        check_arg(isinstance(data, Mapping), where, data, "a dict of protocol settings")
        _check_fields(data, where)
        return cls(**dict(data))

    def updated(self, overrides: Mapping[str, Any], *, where: str = "protocol settings") -> ProtocolSettings:
        """A copy with ``overrides`` applied (validated; unknown keys name ``where``)."""
        if not overrides:
            return self
        _check_fields(overrides, where)
        return replace(self, **dict(overrides))


#: The field names, in declaration order.
FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(ProtocolSettings))


def split_protocol_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Remove and return the protocol fields found as top-level keys of ``kwargs`` (``gymnasium.make`` style)."""
    return {k: kwargs.pop(k) for k in FIELD_NAMES if k in kwargs}


def merge_settings(base: ProtocolSettings, sources: Iterable[tuple[str, Mapping[str, Any] | None]]) -> ProtocolSettings:
    """Apply the overrides of several named places on top of ``base``.

    ``sources`` are ``(place, overrides)`` pairs, e.g. ``[("config.protocol", {...}), ("env_kwargs", {...}),
    ("--max_turns", {"max_turns": 3})]``. A field set in two places to different values is a ``ValueError`` naming
    both places and both values; set to the same value it is fine. Unknown fields name their place.
    """
    chosen: dict[str, tuple[str, Any]] = {}
    for place, overrides in sources:
        if not overrides:
            continue
        check_arg(isinstance(overrides, Mapping), place, overrides, "a dict of protocol settings")
        _check_fields(overrides, place)
        for key, value in overrides.items():
            if key in chosen and not _same(chosen[key][1], value):
                first_place, first_value = chosen[key]
                raise ValueError(
                    f"protocol setting {key!r} is given twice with different values: {first_value!r} in "
                    f"{first_place} and {value!r} in {place}; set it in one place"
                )
            chosen.setdefault(key, (place, value))
    return base.updated({k: v for k, (_, v) in chosen.items()})


#: What :func:`resolve_protocol` calls its sources in error messages unless told otherwise: ``gymnasium.make``'s own.
MAKE_PLACES: tuple[str, str, str] = ("the protocol argument", "gymnasium.make keywords", "the protocol on top")


def resolve_protocol(
    base: ProtocolSettings,
    *,
    protocol: ProtocolSettings | Mapping[str, Any] | None = None,
    keywords: Mapping[str, Any] | None = None,
    on_top: ProtocolSettings | Mapping[str, Any] | None = None,
    places: tuple[str, str, str] = MAKE_PLACES,
) -> ProtocolSettings:
    """The protocol an env plays: the one resolution behind ``gymnasium.make`` (:func:`ragen_envs.factory.
    make_text_env`), the trainer config (``StarPOConfig.protocol_settings``) and TRL's datasets
    (``ragen_trainer.trl_integration.resolve_env_settings``).

    Sources, lowest first:

    1. ``base``: the env id's registered reference settings;
    2. ``protocol``: a mapping of fields, or a whole :class:`ProtocolSettings` (``gymnasium.make``'s ``protocol=``,
       the config's ``protocol`` field, ``env_kwargs["protocol"]`` of a TRL dataset);
    3. ``keywords``: protocol fields given one by one (``gymnasium.make(..., max_turns=3)``, a config's
       ``env_kwargs``);
    4. ``on_top``: a caller's own layer over those (``initial_state_dataset(protocol=...)``).

    No source silently wins: a field given in two places with different values is a ``ValueError`` naming both
    (:func:`merge_settings`, which names the sources by ``places``, one name each for 2, 3 and 4), so the order
    only decides which place an error names first. A whole :class:`ProtocolSettings` given alone in 2 is already
    resolved and is returned as it is, that very object (the trainer config resolves a run's protocol once and its
    envs play it); with other sources beside it, every one of its fields counts as given there.
    """
    sources = (protocol, keywords, on_top)
    if isinstance(protocol, ProtocolSettings) and not keywords and not on_top:
        return protocol
    given = [(place, value.to_dict() if isinstance(value, ProtocolSettings) else value)
             for place, value in zip(places, sources)]  # fmt: skip
    return merge_settings(base, given)


def _check_fields(keys: Iterable[str], where: str) -> None:
    """A ``ValueError`` naming ``where`` when ``keys`` hold a name that is not a settings field."""
    unknown = sorted(set(keys) - set(FIELD_NAMES))
    if unknown:
        raise ValueError(f"invalid {where}: unknown protocol setting(s) {unknown}; accepted: {list(FIELD_NAMES)}")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return bool(a == b)


def _check_int(name: str, value: Any, minimum: int) -> None:
    check_arg(
        isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
        name,
        value,
        f"an int >= {minimum}",
    )


__all__ = [
    "AUTO_PREFIX",
    "FIELD_NAMES",
    "MAKE_PLACES",
    "PROMPT_LAYOUTS",
    "ProtocolSettings",
    "merge_settings",
    "resolve_protocol",
    "split_protocol_kwargs",
]
