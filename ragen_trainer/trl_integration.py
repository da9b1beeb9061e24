"""Train TRL's own ``GRPOTrainer`` on any ``ragen/*`` env: datasets, reward functions, a multi-turn rollout, a tool
adapter and the StarPO-S filter, all built on ragen's episode driver so that TRL plays exactly what ragen plays.

What comes from TRL (1.16) and what this module adds:

* **Data.** :func:`initial_state_dataset` makes one row per env seed: ``prompt`` holds the first chat (system prompt
  and first observation, as ``env.reset(seed)`` gives them and as ragen's rollouts build them), and the columns
  ``env_id``, ``seed``, ``protocol`` (the resolved :class:`~ragen_envs.settings.ProtocolSettings`, JSON),
  ``env_kwargs`` (the env's own arguments, JSON) and ``group_randomness`` rebuild the very same env anywhere
  (:class:`EpisodeSpec`). TRL passes these columns to reward functions as keyword arguments.
* **One-turn training with TRL's own generation** (Bandit, Countdown). Reward functions in TRL's signature
  (:func:`env_reward`, :func:`env_success`, :func:`env_format`) replay each completion in the env: ``env.reset(seed)``
  then ``env.step(prefix + completion)``, with the group's env randomness as ragen's driver gives it.
  :class:`RagenGRPOTrainer` puts the protocol's *generation prefix* (``<think>`` / ``<answer>``, ragen's
  ``reply_prefix``) after the chat template's generation prompt, token for token as ragen's rollouts do; a plain
  ``GRPOTrainer`` cannot (it renders conversational prompts with ``add_generation_prompt`` only), so for it
  :func:`initial_state_dataset` can render text prompts that end with the prefix (``tokenizer=``).
* **Multi-turn training** (FrozenLake, Sokoban, WebShop). :class:`RagenRollout` is a ``rollout_func`` for
  ``GRPOTrainer``: it plays whole episodes with the model TRL is training, through ragen's episode driver
  (:func:`ragen_envs.driver.play_episodes`) and token agent (:class:`ragen_trainer.rollout.TokenAgent`), and hands
  TRL each episode as ``prompt_ids`` (the first prompt) + ``completion_ids`` (every reply and every env message after
  it) with ``env_mask`` = ragen's loss mask (1 on the model's reply tokens, 0 on the env's), which TRL multiplies
  into its loss mask. The episode's return, success and format rate ride along as extra fields that the same reward
  functions read.
* **Tools.** :class:`RagenToolEnv` is an ``environment_factory`` class for TRL's tool-calling loop: ``reset`` starts
  the row's episode and the model plays turns by calling its ``take_action`` tool; ``get_reward`` returns the
  episode's return.
* **StarPO-S filtering.** :class:`RagenGRPOTrainer` keeps the top ``filter_ratio`` of each step's groups by in-group
  reward std (:mod:`ragen_trainer.filtering`: same ranking, ties and ``num_kept`` rounding) and masks the other
  groups out of the loss.

TRL hooks used (written against TRL 1.16.0, tested down to the declared lower bound 1.8 by ``scripts/check_lower_bounds.sh``;
they are private methods of ``GRPOTrainer`` and may change between TRL versions):
``rollout_func(prompts, trainer)`` and its ``env_mask`` extra field, ``environment_factory`` (``reset`` /
``get_reward`` / public methods as tools), and in :class:`RagenGRPOTrainer` the overrides of
``_generate_and_score_completions``, ``_calculate_rewards`` and ``_tokenize_prompts``, each calling TRL's own.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import gymnasium as gym
import numpy as np

import ragen_envs  # noqa: F401  (registers the ragen/* ids)
from ragen_envs.core import check_arg
from ragen_envs.driver import GROUP_RANDOMNESS, EpisodeJob, dynamics_seed, play_episodes
from ragen_envs.registration import reference_settings
from ragen_envs.settings import FIELD_NAMES, ProtocolSettings, resolve_protocol, split_protocol_kwargs
from ragen_trainer.engines.base import SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.filtering import (
    DEFAULT_FILTER_RATIO,
    FILTER_MODES,
    FILTER_ROUNDING,
    KEEP_RATIO_RANGE,
    FilterResult,
    filter_groups,
    valid_keep_ratio,
)
from ragen_trainer.rollout import REPLY_TOKENS, ChatTokens, TokenAgent
from ragen_trainer.settings import RolloutSettings
from ragen_trainer.trajectory import Trajectory

try:
    from trl import GRPOTrainer as _GRPOTrainer
except ImportError as exc:  # a missing extra is named, never a trainer class that silently is not TRL's
    raise ImportError(f"ragen_trainer.trl_integration needs TRL ({exc}), which the train extra installs: "
                      "pip install 'ragen[train]'") from exc

#: The columns :func:`initial_state_dataset` writes (besides ``prompt``); :class:`EpisodeSpec` reads them.
SPEC_COLUMNS: tuple[str, ...] = ("env_id", "seed", "protocol", "env_kwargs", "group_randomness")
#: Extra fields :class:`RagenRollout` returns per completion (TRL hands them to reward functions as keyword args).
RETURN_FIELD, SUCCESS_FIELD, TURNS_FIELD, FORMAT_FIELD = "ragen_return", "ragen_success", "ragen_turns", "ragen_format"
#: The column :class:`RagenGRPOTrainer` adds to each row: the generation prefix it put after that row's prompt.
PREFIX_FIELD = "ragen_prefix"
#: What :func:`resolve_env_settings` calls its protocol sources in messages
#: (:func:`ragen_envs.settings.resolve_protocol`).
_DATASET_PLACES = ("env_kwargs['protocol']", "env_kwargs protocol keywords", "the protocol argument")


# ---------------------------------------------------------------------------------------------------------- config
def checkpointing_arg(enabled: bool) -> dict[str, bool]:
    """The ``GRPOConfig`` / ``TrainingArguments`` keyword that turns activation (gradient) checkpointing on or off,
    under the name the installed transformers has: ``activation_checkpointing`` in recent versions, where the old
    ``gradient_checkpointing`` raises a FutureWarning; ``gradient_checkpointing`` before. (TRL's default is on.)"""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": enabled}


# ---------------------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class EpisodeSpec:
    """Everything needed to replay a row's episode: the env id, its seed and how to build the env.

    ``protocol`` and ``env_kwargs`` are canonical JSON text (sorted keys), so a spec is hashable and a dataset column
    of them is plain text. ``gymnasium.make(env_id, **json.loads(env_kwargs), protocol=json.loads(protocol))``
    rebuilds the env (:meth:`make_env`).
    """

    env_id: str
    seed: int
    protocol: str
    env_kwargs: str = "{}"
    group_randomness: str = "shared"

    def __post_init__(self) -> None:
        check_arg(isinstance(self.env_id, str) and self.env_id in gym.registry, "env_id", self.env_id,
                  "a registered gymnasium id such as 'ragen/FrozenLake-v0'")  # fmt: skip
        check_arg(isinstance(self.seed, (int, np.integer)) and not isinstance(self.seed, bool), "seed", self.seed,
                  "an int")  # fmt: skip
        object.__setattr__(self, "seed", int(self.seed))
        check_arg(self.group_randomness in GROUP_RANDOMNESS, "group_randomness", self.group_randomness,
                  f"one of {list(GROUP_RANDOMNESS)}")  # fmt: skip
        _parse_settings(self.protocol)  # fails early, naming the problem
        kwargs = _parse_json_object(self.env_kwargs, "env_kwargs")
        check_arg("protocol" not in kwargs and not set(kwargs) & set(FIELD_NAMES), "env_kwargs", self.env_kwargs,
                  "the env's own arguments only (protocol settings belong in the protocol column)")  # fmt: skip

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> EpisodeSpec:
        """The spec of a dataset row (a dict with the :data:`SPEC_COLUMNS`, as :func:`initial_state_dataset` makes)."""
        missing = [c for c in SPEC_COLUMNS[:3] if c not in row]
        if missing:
            raise ValueError(
                f"invalid dataset row: missing column(s) {missing}; a ragen row has {list(SPEC_COLUMNS)} "
                "(build the dataset with ragen_trainer.trl_integration.initial_state_dataset)"
            )
        return cls(
            env_id=row["env_id"],
            seed=row["seed"],
            protocol=row["protocol"],
            env_kwargs=row.get("env_kwargs") or "{}",
            group_randomness=row.get("group_randomness") or "shared",
        )

    @property
    def settings(self) -> ProtocolSettings:
        """The protocol settings the env plays with."""
        return _parse_settings(self.protocol)

    @property
    def env_key(self) -> tuple[str, str, str]:
        """What identifies the env to build (rows with equal keys can share one env object)."""
        return (self.env_id, self.env_kwargs, self.protocol)

    def make_kwargs(self) -> dict[str, Any]:
        """``gymnasium.make`` keyword arguments: the env's own arguments and the whole protocol."""
        return {**json.loads(self.env_kwargs), "protocol": json.loads(self.protocol)}

    def make_env(self) -> gym.Env:
        return gym.make(self.env_id, **self.make_kwargs())

    def reset_options(self, rollout: int) -> dict[str, Any] | None:
        """The reset options of rollout ``rollout`` of this spec's group (the episode driver's rule)."""
        if self.group_randomness == "independent" and rollout > 0:
            return {"dynamics_seed": dynamics_seed(self.seed, rollout)}
        return None


@lru_cache(maxsize=256)
def _parse_settings(protocol: str) -> ProtocolSettings:
    return ProtocolSettings.from_dict(_parse_json_object(protocol, "protocol"), where="protocol column")


def _parse_json_object(text: Any, name: str) -> dict[str, Any]:
    check_arg(isinstance(text, str), name, text, "JSON text of an object")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid {name} {text!r}: not JSON ({exc})") from None
    check_arg(isinstance(value, dict), name, text, "JSON text of an object")
    return value


def resolve_env_settings(
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    protocol: ProtocolSettings | Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], ProtocolSettings]:
    """Split ``gymnasium.make`` arguments into the env's own arguments and the resolved protocol settings.

    The protocol is the id's reference settings, then ``env_kwargs["protocol"]``, then protocol fields given as
    ``env_kwargs`` keywords, then ``protocol``; a field set in two places to different values is a ``ValueError``
    naming both. The one resolver of ``gymnasium.make`` and the trainer config too
    (:func:`ragen_envs.settings.resolve_protocol`).
    """
    check_arg(isinstance(env_id, str) and env_id in gym.registry, "env_id", env_id,
              f"a registered id; ragen ids: {sorted(k for k in gym.registry if k.startswith('ragen/'))}")  # fmt: skip
    check_arg(env_kwargs is None or isinstance(env_kwargs, Mapping), "env_kwargs", env_kwargs, "None or a dict")
    check_arg(protocol is None or isinstance(protocol, (ProtocolSettings, Mapping)), "protocol", protocol,
              "None, a ProtocolSettings or a dict of its fields")  # fmt: skip
    own = dict(env_kwargs or {})
    nested = own.pop("protocol", None)
    settings = resolve_protocol(reference_settings(env_id), protocol=nested, keywords=split_protocol_kwargs(own),
                                on_top=protocol, places=_DATASET_PLACES)
    return own, settings


def first_messages(observation: str, info: Mapping[str, Any]) -> list[dict[str, str]]:
    """The first chat of an episode from ``env.reset``'s results, as ragen's episode driver builds it: the system
    prompt (``info["system_prompt"]``, when there is one) and the observation as the user message."""
    system = str(info.get("system_prompt") or "")
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": observation}]


def render_prompt(messages: list[dict[str, str]], tokenizer: Any, prefix: str = "") -> tuple[str, list[int]]:
    """The prompt ragen's rollouts feed the model: ``(text, ids)``.

    ragen's ids are the chat template's rendering with the generation prompt, tokenised, followed by the generation
    ``prefix`` tokenised on its own (:class:`~ragen_trainer.rollout.TokenAgent`); ``text`` is the rendering followed by
    the prefix. Tokenising ``text`` in one piece (what TRL does with a text prompt) may merge tokens across the
    boundary and so differ from ``ids`` for some tokenizers.
    """
    chat = ChatTokens(tokenizer)
    text = tokenizer.apply_chat_template(chat.chat_messages(messages), tokenize=False, add_generation_prompt=True)
    ids = chat.encode(text) + (chat.encode(prefix) if prefix else [])
    return text + prefix, ids


def initial_state_dataset(
    env_id: str,
    seeds: Sequence[int],
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    protocol: ProtocolSettings | Mapping[str, Any] | None = None,
    group_randomness: str = "shared",
    tokenizer: Any = None,
) -> Any:
    """A ``datasets.Dataset`` with one row per seed: the first prompt of the episode ``env.reset(seed)`` starts.

    Args:
        env_id: a registered ragen id, e.g. ``"ragen/FrozenLake-v0"``.
        seeds: the initial states (one row each, in order; duplicates allowed).
        env_kwargs: ``gymnasium.make`` arguments (the env's own, and protocol fields as keywords or in ``protocol``).
        protocol: protocol settings on top of the id's reference ones (see :func:`resolve_env_settings`).
        group_randomness: how the rollouts of a group draw the env's randomness, as ragen's driver:
            ``"shared"`` (default, the reference's) or ``"independent"``.
        tokenizer: ``None`` (default): ``prompt`` is the conversational chat (system + user messages), what
            :class:`RagenGRPOTrainer` and :class:`RagenRollout` want. A tokenizer: ``prompt`` is that chat rendered by
            the tokenizer's chat template with the generation prompt *and the generation prefix* (text), for a plain
            ``GRPOTrainer``, which cannot add the prefix to a conversational prompt; the chat is kept in ``messages``.

    Returns:
        Columns ``prompt``, ``env_id``, ``seed``, ``protocol`` (JSON of every protocol setting), ``env_kwargs`` (JSON
        of the env's own arguments), ``group_randomness`` (and ``messages`` with a tokenizer). The env's arguments
        must survive a JSON round trip: the rows are made from the round-tripped arguments, so what the dataset says
        is what the rewards and the rollout rebuild.
    """
    from datasets import Dataset

    check_arg(
        isinstance(seeds, Sequence) and not isinstance(seeds, str) and len(seeds) > 0
        and all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in seeds),
        "seeds", seeds, "a non-empty list of ints",
    )  # fmt: skip
    check_arg(group_randomness in GROUP_RANDOMNESS, "group_randomness", group_randomness,
              f"one of {list(GROUP_RANDOMNESS)}")  # fmt: skip
    own, settings = resolve_env_settings(env_id, env_kwargs, protocol)
    try:
        own_json = json.dumps(own, sort_keys=True)
    except TypeError as exc:
        raise ValueError(f"invalid argument env_kwargs={own!r}: the dataset stores them as JSON ({exc})") from None
    spec = EpisodeSpec(env_id, 0, json.dumps(settings.to_dict(), sort_keys=True), own_json, group_randomness)
    env = spec.make_env()
    rows: list[dict[str, Any]] = []
    try:
        for seed in seeds:
            observation, info = env.reset(seed=int(seed))
            messages = first_messages(observation, info)
            row: dict[str, Any] = {"prompt": messages, "env_id": env_id, "seed": int(seed),
                                   "protocol": spec.protocol, "env_kwargs": spec.env_kwargs,
                                   "group_randomness": group_randomness}  # fmt: skip
            if tokenizer is not None:
                row["messages"] = messages
                row["prompt"] = render_prompt(messages, tokenizer, settings.generation_prefix)[0]
            rows.append(row)
    finally:
        env.close()
    return Dataset.from_list(rows)


def protocol_stop_strings(dataset: Any) -> list[str]:
    """The stop strings of the protocols in ``dataset``'s ``protocol`` column (``["</answer>"]`` with the reference's
    ``stop_after_answer``), for TRL's ``generation_kwargs={"stop_strings": ...}`` on the one-turn path (see
    :func:`bind_tokenizer_for_stop_strings`). :class:`RagenRollout` applies them by itself."""
    check_arg(hasattr(dataset, "column_names") and "protocol" in dataset.column_names, "dataset",
              type(dataset).__name__, "a dataset with a 'protocol' column (initial_state_dataset)")  # fmt: skip
    stops: list[str] = []
    for text in sorted(set(dataset["protocol"])):
        stops += [s for s in _parse_settings(text).stop_strings if s not in stops]
    return stops


def bind_tokenizer_for_stop_strings(model: Any, tokenizer: Any) -> None:
    """Let TRL's transformers generation honour ``stop_strings``.

    ``GenerationConfig.stop_strings`` needs ``model.generate(..., tokenizer=...)``, and TRL's transformers path calls
    ``model.generate(**inputs, generation_config=...)`` without one, so the tokenizer is bound on this model instance
    (``generate`` of the instance, not of the class).
    """
    import functools

    check_arg(callable(getattr(model, "generate", None)), "model", type(model).__name__, "a model with generate()")
    model.generate = functools.partial(type(model).generate, model, tokenizer=tokenizer)


# ---------------------------------------------------------------------------------------------------------- rewards
@dataclass(frozen=True)
class _Outcome:
    reward: float
    success: float
    format_ok: float


class _Replayer:
    """Replays one-turn completions in envs kept per env key, with a small memo so that the several reward functions
    of one step (reward, success, format) step each completion once."""

    def __init__(self, memo_size: int = 4096) -> None:
        self._envs: dict[tuple[str, str, str], gym.Env] = {}
        self._memo: OrderedDict[tuple[Any, ...], _Outcome] = OrderedDict()
        self._memo_size = memo_size
        self._lock = threading.Lock()  # TRL may run reward functions from its async loop thread

    def outcome(self, spec: EpisodeSpec, rollout: int, reply: str) -> _Outcome:
        key = (spec, rollout, reply)
        with self._lock:
            if key in self._memo:
                self._memo.move_to_end(key)
                return self._memo[key]
            env = self._envs.get(spec.env_key)
            if env is None:
                env = self._envs[spec.env_key] = spec.make_env()
            env.reset(seed=spec.seed, options=spec.reset_options(rollout))
            _, reward, _, _, info = env.step(reply)
            result = _Outcome(float(reward), float(bool(info.get("success", False))),
                              float(bool(info.get("format_ok", False))))  # fmt: skip
            self._memo[key] = result
            if len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)
            return result


_REPLAYER = _Replayer()
_WARNED: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, UserWarning, stacklevel=3)


def _completion_text(completion: Any) -> str:
    """A completion's text: TRL passes a string (text prompts) or ``[{"role": "assistant", "content": ...}]``."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], Mapping):
        return "".join(str(m.get("content") or "") for m in completion if m.get("role") == "assistant")
    raise ValueError(
        f"invalid completion {completion!r}: expected a string or a list of chat messages (TRL's completion formats)"
    )


def _env_prefix(spec: EpisodeSpec, prompt: Any, applied: str | None) -> str:
    """The generation prefix the model continued from, which the env must receive before the completion."""
    if applied is not None:  # RagenGRPOTrainer says what it put after the prompt
        return applied
    prefix = spec.settings.generation_prefix
    if isinstance(prompt, str):  # a text prompt ends with the prefix when initial_state_dataset(tokenizer=) made it
        return prefix if prefix and prompt.endswith(prefix) else ""
    if prefix:
        _warn_once(
            "prefix",
            f"ragen rewards: the prompts are conversational and the trainer is not RagenGRPOTrainer, so the model did "
            f"not continue from the protocol's generation prefix {prefix!r}; the completions are scored without it. "
            "Use RagenGRPOTrainer, or text prompts from initial_state_dataset(..., tokenizer=tokenizer).",
        )
    return ""


def _outcomes(prompts: list[Any], completions: list[Any], kwargs: Mapping[str, Any]) -> list[_Outcome]:
    """Each completion's outcome, from the best source available (see :func:`env_reward`)."""
    n = len(completions)
    if RETURN_FIELD in kwargs:  # RagenRollout played the episodes
        return [
            _Outcome(float(r), float(s), float(f))
            for r, s, f in zip(kwargs[RETURN_FIELD], kwargs[SUCCESS_FIELD], kwargs[FORMAT_FIELD])
        ]
    environments = kwargs.get("environments")
    if environments is not None and all(isinstance(e, RagenToolEnv) for e in environments):
        return [_Outcome(e.get_reward(), float(e.success), e.format_rate) for e in environments]
    missing = [c for c in SPEC_COLUMNS[:3] if c not in kwargs]
    if missing:
        raise ValueError(
            f"ragen reward functions need the dataset columns {list(SPEC_COLUMNS)}, missing {missing}: build the "
            "dataset with initial_state_dataset, or use RagenRollout / RagenToolEnv, whose results they read"
        )
    columns = {c: kwargs[c] for c in SPEC_COLUMNS if c in kwargs}
    applied = kwargs.get(PREFIX_FIELD)
    seen: dict[tuple[Any, ...], int] = defaultdict(int)
    out = []
    for i in range(n):
        spec = EpisodeSpec.from_row({c: values[i] for c, values in columns.items()})
        # Completions arrive group by group (TRL's RepeatSampler), so the r-th one of a seed is rollout r of its
        # group; with independent randomness rollout r > 0 resets with its own dynamics seed, as the driver does.
        rollout = seen[spec.env_key + (spec.seed,)]
        seen[spec.env_key + (spec.seed,)] += 1
        prefix = _env_prefix(spec, prompts[i], None if applied is None else applied[i])
        out.append(_REPLAYER.outcome(spec, rollout, prefix + _completion_text(completions[i])))
    return out


def env_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """TRL reward function: the env's reward for each completion (format penalty included).

    Sources, in order: the episode returns :class:`RagenRollout` played (extra field ``ragen_return``); the
    :class:`RagenToolEnv` instances of TRL's ``environment_factory`` (``environments``); otherwise a one-turn replay:
    ``env.reset(seed)`` and ``env.step(prefix + completion)`` with the row's env (dataset columns ``env_id``,
    ``seed``, ``protocol``, ``env_kwargs``, ``group_randomness``) and the generation prefix the model continued from.
    A replay scores the completion as the episode's first turn: for multi-turn envs train with :class:`RagenRollout`.
    """
    return [o.reward for o in _outcomes(prompts, completions, kwargs)]


def env_success(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """TRL reward function: 1.0 where the env reports success after the completion (or the episode), else 0.0.

    Same sources as :func:`env_reward`. Give it weight 0 (``GRPOConfig(reward_weights=[1.0, 0.0, ...])``) to log the
    success rate (``rewards/env_success/mean``) without training on it.
    """
    return [o.success for o in _outcomes(prompts, completions, kwargs)]


def env_format(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """TRL reward function: the fraction of the episode's replies the protocol could parse (``info["format_ok"]``;
    one turn: 1.0 or 0.0). Same sources as :func:`env_reward`; a format-only reward or, at weight 0, a log."""
    return [o.format_ok for o in _outcomes(prompts, completions, kwargs)]


# ---------------------------------------------------------------------------------------------------------- rollout
def trajectory_to_trl(traj: Trajectory, pad_token_id: int) -> dict[str, Any]:
    """One ragen trajectory as TRL's ``rollout_func`` wants it: ``prompt_ids`` (everything before the first reply),
    ``completion_ids`` (the rest: each reply and each env message after it), ``env_mask`` (ragen's loss mask over the
    completion: 1 on reply tokens, 0 on env tokens) and ``logprobs`` (the sampling log-probs over the completion, 0.0
    on env tokens; ``None`` when the trajectory has none).

    An episode whose replies have no tokens at all (its context filled at once) gets one masked ``pad_token_id`` as
    its completion: TRL reads each completion's last token and cannot take an empty one.
    """
    start = next((s for s, e in traj.turn_spans if e > s), len(traj.input_ids))
    completion = list(traj.input_ids[start:])
    mask = [int(m) for m in traj.loss_mask[start:]]
    logprobs = None if traj.old_logprobs is None else [float(x) for x in traj.old_logprobs[start:]]
    if not completion:
        completion, mask = [int(pad_token_id)], [0]
        logprobs = None if logprobs is None else [0.0]
    return {"prompt_ids": list(traj.input_ids[:start]), "completion_ids": completion, "env_mask": mask,
            "logprobs": logprobs}  # fmt: skip


class RagenRollout:
    """A multi-turn ``rollout_func`` for TRL's ``GRPOTrainer``: plays each prompt's episode with the trained model.

    TRL 1.16 calls ``rollout_func(prompts, trainer)`` with the prompts of this process's generation batch (each row
    already repeated ``num_generations`` times in a row by TRL's sampler) and wants one completion per prompt back:
    ``{"prompt_ids", "completion_ids", "logprobs", **extra}``. Extra fields go to the reward functions as keyword
    arguments, except ``env_mask``, which TRL multiplies into its loss mask (its ``tool_mask``).

    Each prompt's episode (env, seed, protocol) is its dataset row's :class:`EpisodeSpec`: with
    :class:`RagenGRPOTrainer` the rows themselves; with a plain ``GRPOTrainer`` the prompt is looked up in the
    trainer's datasets (a prompt that several seeds share plays as the first of them, and a warning says so). The
    episodes are played by ragen's episode driver with :class:`~ragen_trainer.rollout.TokenAgent`, exactly as
    ragen's own rollouts (``collect_rollouts``): the same prompts, generation prefix, stop strings, chat-template
    deltas and loss mask. The rollouts of a group reset with the group's seed (and, with ``group_randomness``
    ``"independent"``, rollout r > 0 with its own dynamics seed): each row's own ``group_randomness`` column, which
    :func:`initial_state_dataset` writes (give it ``settings.group_randomness``).

    Generation uses ragen's :class:`~ragen_trainer.engines.hf.HFEngine` on the trainer's live (unwrapped) model, so
    the episodes are on-policy without any weight sync. TRL's vLLM path is not used: with ``use_vllm=True`` pass an
    ``engine`` (e.g. ragen's ``VLLMEngine``; this class calls its ``update_weights(model)`` before each rollout).
    Sampling follows the trainer's ``temperature``, ``top_p`` and ``top_k``; ``min_p`` and ``repetition_penalty``
    are not supported (a warning says so when they are set).

    Args:
        settings: the rollout's settings (``StarPOConfig.rollout_settings()``, or a
            :class:`~ragen_trainer.settings.RolloutSettings` of your own). ``max_context_tokens``: the longest an
            episode's conversation may grow (prompt, replies and env messages); an episode that fills it ends
            truncated, as in ragen. ``reply_tokens``: ``"sampled"`` (TRL's way: the sampled ids, with their
            log-probs) or ``"cleaned"`` (the reference's: each reply re-tokenised after cleaning, its prefix trained;
            no log-probs). ``loss_mask``: the ``env_mask`` TRL gets, ``"replies"`` (the model's replies only) or
            ``"after_system"`` (the paper's runs: the env's messages after the system prompt too).
        max_new_tokens: most tokens per reply (per turn); ``None``: the trainer's ``max_completion_length``.
        engine: a ragen generation engine to use instead of an ``HFEngine`` on the trainer's model.
        batch_size: episodes generated together (``None``: all of the call's).
        seed: base of the sampling seeds (``None``: the trainer's ``args.seed``); each call, process and episode
            samples with its own seed derived from it, the step and the call count.
    """

    __name__ = "ragen_rollout"

    def __init__(
        self,
        settings: RolloutSettings,
        *,
        max_new_tokens: int | None = None,
        engine: Any = None,
        batch_size: int | None = None,
        seed: int | None = None,
    ) -> None:
        check_arg(isinstance(settings, RolloutSettings), "settings", type(settings).__name__,
                  "a RolloutSettings (StarPOConfig.rollout_settings())")  # fmt: skip
        check_arg(max_new_tokens is None or (isinstance(max_new_tokens, int) and max_new_tokens >= 1),
                  "max_new_tokens", max_new_tokens, "None or an int >= 1")  # fmt: skip
        check_arg(engine is None or callable(getattr(engine, "generate", None)), "engine", type(engine).__name__,
                  "None or a ragen generation engine (HFEngine, VLLMEngine, ...)")  # fmt: skip
        check_arg(batch_size is None or (isinstance(batch_size, int) and batch_size >= 1), "batch_size", batch_size,
                  "None or an int >= 1")  # fmt: skip
        check_arg(seed is None or (isinstance(seed, int) and seed >= 0), "seed", seed, "None or an int >= 0")
        self.settings = settings
        self.max_new_tokens = max_new_tokens
        self.engine = engine
        self.batch_size = batch_size
        self.seed = seed
        self.calls = 0
        self._index: tuple[int, dict[str, list[EpisodeSpec]]] | None = None

    # ---------------------------------------------------------------- TRL's entry point
    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """Play one episode per prompt with ``trainer``'s model; TRL's ``rollout_func`` contract (see the class)."""
        specs = self._specs(prompts, trainer)
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        model = trainer.accelerator.unwrap_model(trainer.model)
        engine = self.engine
        if engine is None:
            if getattr(trainer, "use_vllm", False):
                raise ValueError(
                    "invalid trainer: use_vllm=True, but RagenRollout generates with ragen's HFEngine on the trainer's "
                    "model unless given an engine; pass RagenRollout(settings, engine=...) (e.g. ragen's VLLMEngine) "
                    "or set use_vllm=False"
                )
            engine = HFEngine(model, tokenizer, batch_size=self.batch_size or max(len(specs), 1))
        else:
            engine.update_weights(model)
        if (getattr(trainer, "repetition_penalty", 1.0) or 1.0) != 1.0 or getattr(trainer, "min_p", None):
            _warn_once("sampling", "RagenRollout samples with temperature, top_p and top_k only; the trainer's "
                                   "min_p / repetition_penalty are not applied")  # fmt: skip
        base = self.seed if self.seed is not None else int(getattr(trainer.args, "seed", 0))
        step = int(getattr(trainer.state, "global_step", 0))
        process = int(getattr(trainer.accelerator, "process_index", 0))
        call_seed = int(np.random.SeedSequence([base, step, self.calls, process]).generate_state(1)[0] & 0x7FFFFFFF)
        self.calls += 1
        sampling = SamplingParams(
            temperature=float(trainer.temperature),
            top_p=float(trainer.top_p if trainer.top_p is not None else 1.0),
            top_k=int(trainer.top_k or 0),
            max_new_tokens=self.max_new_tokens or int(trainer.max_completion_length),
            seed=call_seed,
        )
        return self.rollout(specs, engine, tokenizer, sampling, prompts)

    # ---------------------------------------------------------------- the work, usable without a trainer
    def rollout(
        self,
        specs: Sequence[EpisodeSpec],
        engine: Any,
        tokenizer: Any,
        sampling: SamplingParams,
        prompts: Sequence[Any] | None = None,
    ) -> dict[str, list[Any]]:
        """Play one episode per spec (in order; equal specs are one group's rollouts, numbered in order) with
        ``engine`` and return TRL's rollout dict: ``prompt_ids``, ``completion_ids``, ``logprobs`` (``None`` when some
        episode has none), ``env_mask``, and the extra fields ``ragen_return`` (the episode's return),
        ``ragen_success`` (1.0 / 0.0), ``ragen_format`` (fraction of well-formed replies) and ``ragen_turns``.

        ``prompts`` (TRL's, one per spec): each conversational one must be the chat its episode starts with, which
        catches a dataset built with other env settings than its rows say.
        """
        check_arg(len(specs) > 0 and all(isinstance(s, EpisodeSpec) for s in specs), "specs", specs,
                  "a non-empty list of EpisodeSpec")  # fmt: skip
        check_arg(prompts is None or len(prompts) == len(specs), "prompts", f"{len(prompts or [])} prompts",
                  f"None or one prompt per spec ({len(specs)})")  # fmt: skip
        agent = TokenAgent(engine, tokenizer, sampling, settings=self.settings)
        if not agent.token_engine:
            raise ValueError(f"invalid engine {type(engine).__name__}: a chat engine gives text only; TRL trains on "
                             "token ids (use HFEngine or VLLMEngine)")  # fmt: skip
        # One play per env (a batch may mix envs); jobs keep the batch's order so results map back by index.
        by_env: dict[tuple[str, str, str], list[int]] = defaultdict(list)
        for i, spec in enumerate(specs):
            by_env[spec.env_key].append(i)
        groups: dict[tuple[Any, ...], int] = {}
        rollouts: dict[tuple[Any, ...], int] = defaultdict(int)
        results: list[dict[str, Any] | None] = [None] * len(specs)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        for key, indices in by_env.items():
            jobs = []
            for i in indices:
                spec = specs[i]
                group = groups.setdefault(spec.env_key + (spec.seed,), len(groups))
                rollout = rollouts[spec.env_key + (spec.seed,)]
                rollouts[spec.env_key + (spec.seed,)] += 1
                jobs.append(EpisodeJob(group_id=group, seed=spec.seed, rollout=rollout,
                                       options=spec.reset_options(rollout), tag=i))  # fmt: skip
            episodes = play_episodes(key[0], jobs, agent, env_kwargs=specs[indices[0]].make_kwargs(),
                                     batch_size=self.batch_size, on_error="raise")  # fmt: skip
            for episode in episodes:
                traj = agent.trajectory(episode)
                row = trajectory_to_trl(traj, pad)
                formats = [bool(t.info.get("format_ok", False)) for t in episode.turns]
                row.update({
                    RETURN_FIELD: episode.reward,
                    SUCCESS_FIELD: float(episode.success),
                    FORMAT_FIELD: float(np.mean(formats)) if formats else 0.0,
                    TURNS_FIELD: len(episode.turns),
                })  # fmt: skip
                if prompts is not None and isinstance(prompts[episode.job.tag], list):
                    _check_prompt(prompts[episode.job.tag], episode.messages, specs[episode.job.tag])
                results[episode.job.tag] = row
        rows = [r for r in results if r is not None]
        if len(rows) != len(specs):
            raise RuntimeError(f"the episode driver returned {len(rows)} episodes for {len(specs)} prompts")
        out: dict[str, list[Any]] = {k: [r[k] for r in rows] for k in ("prompt_ids", "completion_ids", "env_mask",
                                                                        RETURN_FIELD, SUCCESS_FIELD, FORMAT_FIELD,
                                                                        TURNS_FIELD)}  # fmt: skip
        logprobs = [r["logprobs"] for r in rows]
        out["logprobs"] = None if any(lp is None for lp in logprobs) else logprobs  # type: ignore[assignment]
        return out

    # ---------------------------------------------------------------- which episode each prompt is
    def _specs(self, prompts: list[Any], trainer: Any) -> list[EpisodeSpec]:
        rows = getattr(trainer, "current_inputs", None)
        if rows is not None and len(rows) == len(prompts):
            specs = [EpisodeSpec.from_row(row) for row in rows]
        else:
            specs = [self._lookup(prompt, trainer) for prompt in prompts]
        return specs

    def _lookup(self, prompt: Any, trainer: Any) -> EpisodeSpec:
        datasets = []
        for d in (getattr(trainer, "train_dataset", None), getattr(trainer, "eval_dataset", None)):
            datasets += list(d.values()) if isinstance(d, Mapping) else [d] if d is not None else []
        token = sum(id(d) for d in datasets)
        if self._index is None or self._index[0] != token:
            index: dict[str, list[EpisodeSpec]] = defaultdict(list)
            for dataset in datasets:
                if not hasattr(dataset, "column_names") or not hasattr(dataset, "__len__"):
                    raise ValueError(
                        f"invalid dataset {type(dataset).__name__}: a plain GRPOTrainer gives rollout_func the prompts "
                        "only, so RagenRollout looks them up in an indexable dataset; use RagenGRPOTrainer (which "
                        "hands it the rows) with iterable datasets"
                    )
                for row in dataset:
                    spec = EpisodeSpec.from_row(row)
                    if spec not in index[_prompt_key(row["prompt"])]:
                        index[_prompt_key(row["prompt"])].append(spec)
            self._index = (token, dict(index))
        found = self._index[1].get(_prompt_key(prompt))
        if not found:
            raise ValueError(
                "RagenRollout got a prompt that is in none of the trainer's datasets; build them with "
                f"initial_state_dataset, or use RagenGRPOTrainer (prompt starts {str(prompt)[:120]!r})"
            )
        if len(found) > 1:
            _warn_once("ambiguous", f"{len(found)} dataset rows share one prompt (e.g. seeds "
                                    f"{[s.seed for s in found[:4]]}); a plain GRPOTrainer cannot tell them apart, so "
                                    "they play as the first one. RagenGRPOTrainer hands the rows over exactly.")  # fmt: skip
        return found[0]


def _check_prompt(prompt: list[Any], messages: list[dict[str, str]], spec: EpisodeSpec) -> None:
    """A ``ValueError`` when TRL's prompt is not the chat the episode of ``spec`` starts with."""
    given = [(m.get("role"), m.get("content")) for m in prompt]
    played = [(m["role"], m["content"]) for m in messages[: len(given)]]
    if given != played:
        raise ValueError(
            f"the prompt of {spec.env_id} seed {spec.seed} is not the first chat of its episode: the dataset row's "
            "prompt and its env columns disagree (was the dataset built with other env settings?); rebuild it "
            "with initial_state_dataset"
        )


def _prompt_key(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return json.dumps([[m.get("role"), m.get("content")] for m in prompt])


# ---------------------------------------------------------------------------------------------------------- filter
def variance_filter(
    rewards: Sequence[float],
    num_generations: int,
    *,
    filter_ratio: float,
    filter_mode: str = "std",
    filter_round: str = "floor",
) -> tuple[list[bool], FilterResult]:
    """StarPO-S filtering of one step's rewards laid out as TRL lays them out: group ``g`` is rows
    ``[g * num_generations, (g + 1) * num_generations)``. Returns one keep flag per row and ragen's
    :class:`~ragen_trainer.filtering.FilterResult` (groups ranked by in-group reward std, ties by group index,
    ``num_kept`` rounding). NaN rewards (rows no reward function scored) are left out of their group's std."""
    check_arg(isinstance(num_generations, int) and num_generations >= 1, "num_generations", num_generations,
              "an int >= 1")  # fmt: skip
    values = [float(r) for r in rewards]
    check_arg(len(values) > 0 and len(values) % num_generations == 0, "rewards", f"{len(values)} values",
              f"a non-empty multiple of num_generations={num_generations}")  # fmt: skip
    groups = {
        g: [r for r in values[g * num_generations : (g + 1) * num_generations] if not math.isnan(r)]
        for g in range(len(values) // num_generations)
    }
    result = filter_groups(groups, filter_ratio, filter_mode, filter_round)
    kept = set(result.kept)
    return [i // num_generations in kept for i in range(len(values))], result


class RagenGRPOTrainer(_GRPOTrainer):  # type: ignore[misc,valid-type]
    """TRL's ``GRPOTrainer`` with ragen's generation prefix, exact episode rows for :class:`RagenRollout`, and the
    StarPO-S variance filter. Everything else is TRL's.

    Args:
        *args, **kwargs: ``trl.GRPOTrainer``'s.
        filter_ratio: keep this fraction of each step's groups (prompts), ranked by the in-group std of the total
            reward (TRL's weighted sum of the reward functions); default 0.25 (StarPO-S, as ragen's trainer:
            :data:`~ragen_trainer.filtering.DEFAULT_FILTER_RATIO`), 1.0 keeps all (plain GRPO). The other groups' tokens
            are masked out of the loss (policy, KL and entropy terms; TRL's ``tool_mask``) and the token count
            TRL normalises by is recounted. They were still generated and scored: TRL computes everything before
            this hook, whereas ragen drops them before its scoring forward pass.
        filter_mode: ``"std"`` (keep the highest std, StarPO-S) or ``"std_rev"`` (the lowest, the paper's control).
        filter_round: ``"floor"`` (the reference's ``int(ratio * groups)``, at least 1) or ``"ceil"``.

    With a per-sequence loss (``loss_type`` ``"grpo"``, ``"sapo"``, ``"luspo"``, ``"dr_grpo"``) a masked row still
    counts in TRL's mean over sequences; ``"dapo"`` / ``"bnpo"`` / ``"cispo"`` (token means) match ragen's
    ``token-mean``. Filter metrics are logged as ``filter/kept_groups``, ``filter/std_mean_kept``, ... .
    """

    def __init__(
        self,
        *args: Any,
        filter_ratio: float = DEFAULT_FILTER_RATIO,
        filter_mode: str = "std",
        filter_round: str = "floor",
        **kwargs: Any,
    ) -> None:
        check_arg(valid_keep_ratio(filter_ratio), "filter_ratio", filter_ratio, KEEP_RATIO_RANGE)
        check_arg(filter_mode in FILTER_MODES, "filter_mode", filter_mode, f"one of {list(FILTER_MODES)}")
        check_arg(filter_round in FILTER_ROUNDING, "filter_round", filter_round, f"one of {list(FILTER_ROUNDING)}")
        super().__init__(*args, **kwargs)
        self.filter_ratio = float(filter_ratio)
        self.filter_mode = filter_mode
        self.filter_round = filter_round
        #: The rows (dataset columns) of the batch being generated; :class:`RagenRollout` reads them.
        self.current_inputs: list[dict[str, Any]] | None = None
        #: The last step's filter decision (``None`` before the first filtered step).
        self.last_filter: FilterResult | None = None
        self._step_rewards: Any = None
        self._prefixes: list[str] | None = None
        self._prefix_ids: dict[str, list[int]] = {}

    # Overrides GRPOTrainer._generate_and_score_completions (TRL 1.16.0): the one call per generation batch that
    # sees the rows, the rewards and the tensors the loss reads. Wrapped, not rewritten: TRL does all the work.
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self.current_inputs = inputs
        self._step_rewards = None
        self._prefixes = [self._row_prefix(row) for row in inputs]
        for row, prefix in zip(inputs, self._prefixes):
            if isinstance(row.get("prompt"), list):  # tells the reward functions what the model continued from
                row[PREFIX_FIELD] = prefix
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self.current_inputs, self._prefixes = None, None
        if self.model.training and self.filter_ratio < 1.0:
            self._filter(output)
        return output

    # Overrides GRPOTrainer._calculate_rewards (TRL 1.16.0) only to keep its result (every process's rewards per
    # reward function), which _generate_and_score_completions does not return.
    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._step_rewards = rewards
        return rewards

    # Overrides GRPOTrainer._tokenize_prompts (TRL 1.16.0), which renders conversational prompts with the generation
    # prompt only: the protocol's generation prefix is appended, tokenised on its own, as ragen's TokenAgent does.
    def _tokenize_prompts(self, prompts: list[Any]) -> Any:
        prompt_ids, images, multimodal_fields = super()._tokenize_prompts(prompts)
        prefixes = self._prefixes
        if prefixes is not None and len(prefixes) == len(prompt_ids) and any(prefixes):
            prompt_ids = [self._with_prefix(list(ids), p) for ids, p in zip(prompt_ids, prefixes)]
        return prompt_ids, images, multimodal_fields

    def _with_prefix(self, ids: list[int], prefix: str) -> list[int]:
        extra = self._encode_prefix(prefix)
        # A chat template that writes the prefix itself after the generation prompt (a ragen checkpoint's saved
        # template, see ragen_trainer.models.add_prefix_to_template, loaded without ragen) must not get it twice.
        if extra and ids[-len(extra) :] == extra:
            return ids
        return ids + extra

    def _row_prefix(self, row: Mapping[str, Any]) -> str:
        """The prefix to put after a row's prompt: the protocol's, for conversational ragen rows generated by TRL
        itself (a rollout_func applies its own, and tool-calling environments parse tool calls, not tags)."""
        if self.rollout_func is not None or self.environment_factories is not None:
            return ""
        if not isinstance(row.get("prompt"), list) or not isinstance(row.get("protocol"), str):
            return ""
        return _parse_settings(row["protocol"]).generation_prefix

    def _encode_prefix(self, prefix: str) -> list[int]:
        if prefix not in self._prefix_ids:
            self._prefix_ids[prefix] = list(self._tokenizer(prefix, add_special_tokens=False)["input_ids"])
        return self._prefix_ids[prefix]

    def _filter(self, output: dict[str, Any]) -> None:
        """Mask the dropped groups out of this process's part of the batch (see the class docstring)."""
        import torch

        if self._step_rewards is None:
            raise RuntimeError("RagenGRPOTrainer: TRL scored no rewards this step (its _calculate_rewards changed?)")
        weights = self.reward_weights.to(self._step_rewards.device).unsqueeze(0)
        totals = (self._step_rewards * weights).nansum(dim=1)
        totals[torch.isnan(self._step_rewards).all(dim=1)] = torch.nan  # unscorable rows, as TRL marks them
        keep, result = variance_filter(totals.tolist(), self.num_generations, filter_ratio=self.filter_ratio,
                                       filter_mode=self.filter_mode, filter_round=self.filter_round)  # fmt: skip
        completion_mask = output["completion_mask"]
        local = completion_mask.size(0)
        start = self.accelerator.process_index * local  # TRL's own slice of the gathered rewards
        keep_local = torch.tensor(keep[start : start + local], dtype=completion_mask.dtype,
                                  device=completion_mask.device)  # fmt: skip
        tool_mask = output.get("tool_mask")
        tool_mask = torch.ones_like(completion_mask) if tool_mask is None else tool_mask
        output["tool_mask"] = tool_mask * keep_local.unsqueeze(1)
        loss_mask = completion_mask * output["tool_mask"]
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        self.last_filter = result
        for name, value in result.stats.items():
            self._metrics["train"][name].append(value)
        self._metrics["train"]["filter/kept_frac"].append(len(result.kept) / max(len(result.stds), 1))


# ---------------------------------------------------------------------------------------------------------- tools
class RagenToolEnv:
    """A ragen env for TRL's ``environment_factory``: the model plays its turns by calling the ``take_action`` tool.

    ``GRPOTrainer(..., environment_factory=RagenToolEnv)`` makes one instance per rollout and calls
    ``reset(**row)`` with the dataset row (``initial_state_dataset``'s columns) before generation; the row's
    ``prompt`` already holds the first observation, so ``reset`` returns only a short line saying how to play with the
    tool (appended to the last user message by TRL), or the whole observation when the prompt does not hold it. Every
    ``take_action`` call is one env turn (``env.step``); its result is the env's next message. ``get_reward`` (TRL
    logs it under this class's name) is the episode's return: the sum of the turn rewards, format penalties included.

    The tool's argument is the turn's answer: the action name(s), e.g. ``"Left || Down"``, wrapped here in the tags
    the protocol parses (``<think></think><answer>...</answer>``; the model's thinking is its message text), or a
    whole tagged reply, passed as it is. Only public methods of this class are tools, so it has exactly one.

    The rollouts of a group share the group's env randomness (ragen's default ``"shared"``): TRL does not say which
    rollout of its group an instance plays, so rows with ``group_randomness="independent"`` are refused.
    """

    #: What ``reset`` appends to the prompt by default.
    TOOL_HINT = "\nPlay each turn by calling the take_action tool with your answer for that turn."

    def __init__(self, tool_hint: str | None = None) -> None:
        self.tool_hint = self.TOOL_HINT if tool_hint is None else tool_hint
        self._envs: dict[tuple[str, str, str], gym.Env] = {}
        self._env: gym.Env | None = None
        self._spec: EpisodeSpec | None = None
        self._rewards: list[float] = []
        self._formats: list[bool] = []
        self._success = False
        self._done = False

    def reset(self, **row: Any) -> str | None:
        """Start the episode of a dataset row (TRL passes the row's columns); returns the text TRL appends to the
        prompt's last user message."""
        if "seed" not in row or "env_id" not in row:
            raise ValueError(
                f"invalid dataset row for RagenToolEnv: columns {sorted(row)}; it needs {list(SPEC_COLUMNS)} "
                "(build the train_dataset with ragen_trainer.trl_integration.initial_state_dataset)"
            )
        spec = EpisodeSpec.from_row(row)
        if spec.group_randomness != "shared":
            raise ValueError(
                f"invalid group_randomness={spec.group_randomness!r} for RagenToolEnv: TRL does not tell an "
                "environment which rollout of its group it plays; build the dataset with group_randomness='shared'"
            )
        env = self._envs.get(spec.env_key)
        if env is None:
            env = self._envs[spec.env_key] = spec.make_env()
        observation, info = env.reset(seed=spec.seed)
        self._env, self._spec = env, spec
        self._rewards, self._formats = [], []
        self._success, self._done = bool(info.get("success", False)), False
        prompt = row.get("prompt")
        if isinstance(prompt, list) and prompt and prompt[-1].get("content", "").endswith(observation):
            return self.tool_hint or None
        return observation + self.tool_hint

    def take_action(self, action: str) -> str:
        """Play one turn of the game: send your answer for this turn to the environment.

        Args:
            action: Your answer for this turn: the action name(s) the game lists, several separated by " || " when
                the game allows more than one per turn (e.g. "Left || Down").

        Returns:
            The environment's next message: the turn's reward and the new state, or that the episode has ended.
        """
        if self._env is None or self._spec is None:
            raise ValueError("no episode: call reset(**row) first")
        if self._done:
            raise ValueError(f"the episode has ended (return {sum(self._rewards):g}); do not call take_action again")
        observation, reward, terminated, truncated, info = self._env.step(self._reply(action))
        self._rewards.append(float(reward))
        self._formats.append(bool(info.get("format_ok", False)))
        self._success = bool(info.get("success", False))
        self._done = bool(terminated or truncated)
        return observation

    def get_reward(self) -> float:
        """The episode's return so far: the sum of its turn rewards (0.0 when no turn was played)."""
        return float(sum(self._rewards))

    @property
    def success(self) -> bool:
        """The env's success flag after the last turn."""
        return self._success

    @property
    def done(self) -> bool:
        return self._done

    @property
    def turns(self) -> int:
        return len(self._rewards)

    @property
    def format_rate(self) -> float:
        """The fraction of this episode's turns whose reply the protocol parsed (0.0 with no turn)."""
        return float(np.mean(self._formats)) if self._formats else 0.0

    def __del__(self) -> None:
        # TRL keeps a pool of instances for the whole run; an env holding a resource (WebShop's server) lets it go
        # with its instance.
        for env in getattr(self, "_envs", {}).values():
            with contextlib.suppress(Exception):  # at interpreter exit the env's modules may already be gone
                env.close()

    def _reply(self, action: Any) -> str:
        """The reply text the protocol receives for a tool argument."""
        text = str(action).strip()
        if "<answer>" in text:  # a whole tagged reply: the model wrote the protocol's format itself
            return text
        assert self._spec is not None
        # The thinking, if any, is the model's message text around the tool call; the protocol needs the tags.
        think = "<think></think>" if self._spec.settings.enable_think else ""
        return f"{think}<answer>{text}</answer>"


def ragen_environment_factory(tool_hint: str | None = None) -> Callable[[], RagenToolEnv]:
    """A zero-argument factory of :class:`RagenToolEnv` (what ``environment_factory`` wants), with ``tool_hint`` (the
    text ``reset`` appends to the prompt; ``""`` appends nothing)."""
    check_arg(tool_hint is None or isinstance(tool_hint, str), "tool_hint", tool_hint, "None or a str")

    def factory() -> RagenToolEnv:
        return RagenToolEnv(tool_hint)

    return factory


__all__ = [
    "FORMAT_FIELD",
    "PREFIX_FIELD",
    "REPLY_TOKENS",
    "RETURN_FIELD",
    "SPEC_COLUMNS",
    "SUCCESS_FIELD",
    "TURNS_FIELD",
    "EpisodeSpec",
    "RagenGRPOTrainer",
    "RagenRollout",
    "RagenToolEnv",
    "RolloutSettings",
    "bind_tokenizer_for_stop_strings",
    "checkpointing_arg",
    "env_format",
    "env_reward",
    "env_success",
    "first_messages",
    "initial_state_dataset",
    "protocol_stop_strings",
    "ragen_environment_factory",
    "render_prompt",
    "resolve_env_settings",
    "trajectory_to_trl",
    "variance_filter",
]
