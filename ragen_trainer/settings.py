"""The settings objects the rollout and loss functions take, made from the run config in one place.

ragen follows two references (:mod:`ragen_trainer.config`): ``reference: paper``, the default (the paper's runs), and
``reference: latest`` (the reference code today). Some settings differ between them: the loss mask, the dual clip,
the loss aggregation. A library function with a default of its own for such a setting would silently give whoever
calls it directly one of the two, whichever its author had in mind. So :func:`ragen_trainer.rollout.collect_rollouts`,
:func:`ragen_trainer.selfplay.collect_selfplay_rollouts`, :class:`ragen_trainer.rollout.TokenAgent`,
:class:`ragen_trainer.trl_integration.RagenRollout`, :func:`ragen_trainer.losses.policy_loss` and
:func:`ragen_trainer.losses.value_loss` take these objects whole, with no default, and
:class:`~ragen_trainer.config.StarPOConfig` makes them (:meth:`~ragen_trainer.config.StarPOConfig.rollout_settings`,
:meth:`~ragen_trainer.config.StarPOConfig.loss_settings`). Every value then has one default, the config field's (its
``ByReference`` value where the references differ)::

    from ragen_trainer.config import load_config

    paper = load_config("starpo-s").rollout_settings()  # the paper's runs: every token after the system prompt
    latest = load_config("starpo-s").replace(reference="latest").rollout_settings()  # today's: the replies only
    replies = load_config("starpo-s").replace(loss_mask="replies").rollout_settings()  # one field changed

Each field has the name of the config field it comes from. The objects are frozen: one is made per run (or per call
of the config's method) and passed on as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ragen_envs.core import check_arg
from ragen_envs.driver import GROUP_RANDOMNESS

#: The most tokens of a whole conversation: RAGEN's ``max_model_len: 3600``, the same in both references. The config
#: field's default, and that of the evaluation's model agent, which plays as training does.
DEFAULT_MAX_CONTEXT_TOKENS = 3600
#: ``reply_tokens`` values: ``"cleaned"`` (the reference's: the cleaned reply re-tokenised, generation prefix trained)
#: and ``"sampled"`` (the sampled ids kept exactly, generation prefix masked). See :mod:`ragen_trainer.rollout`.
REPLY_TOKENS: tuple[str, ...] = ("cleaned", "sampled")
#: ``loss_mask`` values: ``"after_system"`` (the paper's runs: everything after the system prompt) and ``"replies"``
#: (the later reference: the replies only). See :mod:`ragen_trainer.rollout`.
LOSS_MASKS: tuple[str, ...] = ("after_system", "replies")


def check_loss_mask(loss_mask: Any) -> None:
    """Raise a ``ValueError`` unless ``loss_mask`` is one of :data:`LOSS_MASKS`."""
    check_arg(
        loss_mask in LOSS_MASKS,
        "loss_mask",
        loss_mask,
        "'after_system' (the paper's runs: everything after the system prompt trained) or 'replies' (only the "
        "model's replies)",
    )


def check_reply_tokens(reply_tokens: Any) -> None:
    """Raise a ``ValueError`` unless ``reply_tokens`` is one of :data:`REPLY_TOKENS`."""
    check_arg(
        reply_tokens in REPLY_TOKENS,
        "reply_tokens",
        reply_tokens,
        "'cleaned' (the reference's: the cleaned reply re-tokenised, generation prefix trained) or 'sampled' "
        "(the sampled ids exactly, generation prefix masked)",
    )


def _required(help: str) -> Any:
    """A field without a default (its value is the config's), with its help text in TRL's style."""
    return field(metadata={"help": help})


@dataclass(frozen=True)
class RolloutSettings:
    """How episodes are played and tokenised for training: the config's fields of the same names
    (:meth:`ragen_trainer.config.StarPOConfig.rollout_settings`). Checked when made."""

    loss_mask: str = _required("The trained positions: after_system (the paper's runs: every token after the system "
                               "prompt) or replies (the later reference: the model's replies only).")
    reply_tokens: str = _required("The trained ids of a reply: cleaned (the reference's: the cleaned reply "
                                  "re-tokenised, the generation prefix trained) or sampled (the sampled ids exactly, "
                                  "the prefix masked).")
    max_context_tokens: int = _required("Most tokens of a whole conversation; an episode that fills it ends truncated "
                                        "and a reply that would overflow it is cut.")
    group_randomness: str = _required("Env randomness of a group's rollouts: shared (the reference's: same payouts "
                                      "and slips) or independent (each rollout re-seeded after the reset).")

    def __post_init__(self) -> None:
        check_reply_tokens(self.reply_tokens)
        check_loss_mask(self.loss_mask)
        check_arg(isinstance(self.max_context_tokens, int) and self.max_context_tokens >= 2, "max_context_tokens",
                  self.max_context_tokens, "an int >= 2")  # fmt: skip
        check_arg(self.group_randomness in GROUP_RANDOMNESS, "group_randomness", self.group_randomness,
                  f"one of {list(GROUP_RANDOMNESS)}")  # fmt: skip


@dataclass(frozen=True)
class LossSettings:
    """What the loss functions of :mod:`ragen_trainer.losses` compute with: the config's fields of the same names
    (:meth:`ragen_trainer.config.StarPOConfig.loss_settings`). The weights of the terms (``entropy_coef``,
    ``kl_coef``, ``value_loss_coef``) are the caller's, who sums them (:func:`ragen_trainer.update.ppo_loss`)."""

    clip_low: float = _required("PPO clip epsilon below 1 (ratio >= 1 - clip_low).")
    clip_high: float = _required("PPO clip epsilon above 1 (clip-higher).")
    clip_ratio_c: float = _required("Dual clip: with a negative advantage a token's loss is at most -A * clip_ratio_c "
                                    "(> 1); 0 = no dual clip (the paper's runs).")
    loss_agg_mode: str = _required("How token losses are averaged: micro-token-mean (the paper's runs), "
                                   "seq-mean-token-mean (the later reference), token-mean or seq-mean-token-sum.")
    loss_agg_micro_size: int = _required("micro-token-mean: sequences per loss micro-batch.")
    kl_estimator: str = _required("KL estimator of the KL loss: k1 (log-ratio, the reference's 'kl') or k3 "
                                  "(low-variance, >= 0).")
    value_clip: float = _required("Clip range of the value loss around the rollout's values.")


__all__ = [
    "DEFAULT_MAX_CONTEXT_TOKENS",
    "LOSS_MASKS",
    "REPLY_TOKENS",
    "LossSettings",
    "RolloutSettings",
    "check_loss_mask",
    "check_reply_tokens",
]
