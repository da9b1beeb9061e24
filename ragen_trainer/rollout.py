"""Multi-turn rollouts: P initial states x N rollouts each, on any registered text env, with a model.

Episodes are played by the one episode driver (:func:`ragen_envs.driver.play_episodes`, the same loop evaluation
uses) with :class:`TokenAgent`, which generates and keeps the tokens. The N rollouts of a group reset with the group's
seed, hence the same initial state (the GRPO / StarPO-S group), and with ``group_randomness="shared"`` the same env
randomness (the reference's; ``group_randomness="independent"`` gives each further rollout its own, the driver's
``dynamics_seed``).
Each episode is a chat::

    system: reset info["system_prompt"]     user: observation     assistant: reply     user: next observation ...

Every turn, the replies of all live episodes are generated in one batched call, each reply is passed to its env's
``step``, and the episode ends when the env says so (terminated or truncated: the protocol's ``max_turns`` and action
budget are the only turn limits) or when the context (``max_context_tokens``) is full (``truncated=True``).

Tokens (the loss mask). The conversation's ``input_ids`` are built incrementally: the environment's text comes from
the tokenizer's chat template as a *delta* (the template is rendered with a placeholder in place of the latest reply,
and the text after the placeholder -- the template's end-of-turn marker, the next user message, the next generation
prompt -- is tokenised and appended with ``loss_mask`` 0). Generation at turn t+1 always continues from exactly the
ids kept at turn t, so sampling and training see the same sequence. Which ids a reply keeps is ``reply_tokens``:

* ``"cleaned"`` (the config's, the reference's: RAGEN ``ragen/llm_agent/ctx_manager.py``). The reply as the env
  received it (generation prefix + the model's text) is cleaned as ``ContextManager._parse_response`` does
  (:func:`clean_reply`: ``<think>...</think><answer>...</answer>``, or ``<answer>...</answer>`` with thinking off;
  text before the first tag and after the first ``</answer>`` dropped; a reply the pattern does not match is kept
  as it is), then tokenised on its own, followed by the template's end-of-turn token (``<|im_end|>`` in ChatML).
  These ids replace both the generation prefix at the prompt's end and the sampled ids, and all of them have
  ``loss_mask`` 1: the prefix is trained as part of the response, as in the reference, where ``get_lm_inputs``
  (via ``formulate_rollouts``) re-renders every assistant message with its cleaned text and tokenises the whole
  conversation, and the loss mask covers each assistant turn (its mask, counted from ``<|im_start|>`` tokens in
  ``get_masks_and_scores``, also covers the role header and the newline after ``<|im_end|>``; ragen trains the reply
  and its end-of-turn token only). The end-of-turn token is trained even when the model
  did not write it (a reply cut by ``max_new_tokens`` or stopped at ``</answer>``), as the template writes it inside
  the assistant turn. The trained ids are not the sampled ones, so the trajectory has no sampling log-probs
  (``old_logprobs`` is ``None``; the trainer scores its batch with a forward pass anyway), and ``messages`` hold the
  cleaned replies (``replies`` keep what the env received). Tokenising the reply on its own equals tokenising the
  whole rendering wherever the reply sits between a newline and a special token (ChatML), and is harmless where a
  merge across the boundary could differ (generation continues from the trained ids). Cost: where the cleaned ids
  differ from the sampled ones (e.g. ``"<think>"`` merging with the reply's first word), the HF engine cannot reuse
  the episode's parked KV cache and re-encodes its next prompt in full (correct either way).
* ``"sampled"`` (ragen's original behaviour). **The model's sampled tokens are never re-tokenised**: the trainer
  scores exactly the ids the model produced, with their sampling log-probs. The generation prefix is prompt
  (``loss_mask`` 0, not the model's sample). When the model itself emitted the end-of-turn token that the template
  writes after a reply, that token is part of the reply (mask 1) and is not written twice; a reply cut by
  ``max_new_tokens`` has none, and the template's marker is appended as env text (mask 0); a model that stops with a
  token the template does not write there (plain eos instead of ``<|eot_id|>``) keeps its token (mask 1) and the
  template's marker follows (mask 0).

In both modes ``turn_spans`` are the ``[start, end)`` of each reply's trained ids (exactly the positions with
``loss_mask`` 1; the prefix is inside the span only under ``"cleaned"``), the env receives ``prefix + reply`` (the
same text in both modes), and ``decode(input_ids)`` is the template rendering of ``messages`` up to the last reply
(ChatML-like templates). Earlier replies are never re-rendered, in either mode: templates that rewrite earlier assistant messages
(Qwen3 and DeepSeek-R1 drop old ``<think>`` blocks) would give another text if the whole chat were rendered again
(the reference re-renders it every turn; with ChatML templates such as Qwen2.5's, the paper's, the two agree).
Templates without a system role (they raise on one, like Gemma's) get the system prompt folded into the
first user message. The delta is tokenised on its own; with ChatML-like templates it starts at a special token or a
newline after one, so it tokenises as in the whole rendering.

Reply prefix (the reference's *generation prefix*, ``ctx_manager.py`` ``get_lm_inputs``). After the template's
generation prompt the prompt gets ``"<think>"`` (thinking on) or ``"<answer>"`` (thinking off), so the model continues
*inside* the tag; small instruct models rarely open the tag on their own, and a reply the protocol cannot parse gives
no learning signal. The prefix is tokenised on its own for generation. The prefix is each env's
``ProtocolSettings.generation_prefix`` (``reply_prefix``: ``"auto"`` picks the tag by ``enable_think``; ``""`` turns
the prefix off).

Loss mask (``loss_mask``). ``"replies"`` trains exactly the replies' trained ids above (``turn_spans``); environment
text is never trained. ``"after_system"`` is how the paper's runs trained (RAGEN ``3059df8``,
``ragen/llm_agent/ctx_manager.py`` ``get_masks_and_scores`` with ``enable_response_mask: False``): the reference counts
``<|im_start|>`` tokens and trains every position whose *input* token lies after the system turn, so the targets are
every token from the one after the first user turn's ``<|im_start|>`` to the end of the conversation: the user turns
(instructions, states, rewards) and the template's role headers as well as the replies. The reference's conversation
for training ends with the last reply's ``<|im_end|>`` and the newline the template writes after it (the final state
is dropped); that closing text is appended here too (trained), and the episode's reward sits on it, the last
trained token, as the reference puts the score on the last token. ``turn_spans`` still mark the replies, so turn-level
rewards and the rollout metrics count the model's own tokens in both modes. A template without a system turn (the
system prompt folded into the first user message) trains everything after the first token.

Chat engines (an OpenAI-compatible API) return text only: their replies are re-tokenised as they came to fill
``input_ids`` (``reply_tokens`` does not apply; no prefix, no cleaning) and the trajectory is flagged ``eval_only``
(no log-probs; never train on it).

Rewards: ``turn_rewards`` are the env's per-turn rewards; :func:`placed_rewards` puts them on tokens, either the
trajectory sum on the last model token or each turn's reward on the last token of that turn's reply.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

import numpy as np

import ragen_envs  # noqa: F401  (registers the ragen/* ids)
from ragen_envs.core import check_arg
from ragen_envs.driver import AgentReply, Episode, play_episodes, rollout_jobs
from ragen_envs.settings import AUTO_PREFIX, ProtocolSettings
from ragen_trainer.engines.base import (
    ENGINE_FAILURE,
    FINISH_LENGTH,
    FINISH_STOP,
    BatchSession,
    GenerationEngine,
    GenerationRequest,
    GenerationResult,
    GenerationSession,
    SamplingParams,
)
from ragen_trainer.settings import LOSS_MASKS, REPLY_TOKENS, RolloutSettings, check_loss_mask, check_reply_tokens
from ragen_trainer.trajectory import RolloutBatch, Trajectory

#: Stands in for the latest reply when the chat template is rendered to find the text that follows a reply.
_PLACEHOLDER = "RAGEN_REPLY_PLACEHOLDER_7f3a"
#: Per-turn sampling seeds are ``seed + turn * _SEED_STRIDE`` (distinct streams per turn, reproducible per run).
_SEED_STRIDE = 1_000_003
#: What the reference removes from the thinking and the answer of a well-formed reply (``ctx_manager.py``,
#: ``ContextManager.special_token_list``), in its order.
_REFERENCE_STRIPPED = ("<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>")


class ChatTokens:
    """Renders a tokenizer's chat template into token ids for the env side of the conversation.

    ``prompt_ids(system, user)`` gives the first prompt (ending with the generation prompt); ``delta_ids(messages,
    reply_ids, observation)`` gives the tokens that follow a reply up to the next generation prompt, without the
    reply's own end-of-turn token when the model emitted it.
    """

    def __init__(self, tokenizer: Any) -> None:
        check_arg(
            tokenizer is not None and hasattr(tokenizer, "apply_chat_template"),
            "tokenizer",
            type(tokenizer).__name__,
            "a transformers tokenizer with a chat template",
        )
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"invalid argument tokenizer={getattr(tokenizer, 'name_or_path', '?')!r}: it has no chat template; "
                "set tokenizer.chat_template (a Jinja template) or use an instruct model's tokenizer"
            )
        self.tokenizer = tokenizer
        self.fold_system = not self._accepts_system()
        self._end_of_turn: list[int] | None = None  # end_of_turn_ids(), rendered on first use
        self._closing: str | None = None  # the text after a conversation's last reply, rendered on first use

    def _accepts_system(self) -> bool:
        try:
            probe = "RAGEN_SYSTEM_PROBE"
            text = self._render([{"role": "system", "content": probe}, {"role": "user", "content": "U"}], True)
        except Exception:
            return False
        return probe in text  # some templates silently drop the system message

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def chat_messages(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        """``messages`` as the template accepts them (system folded into the first user message where needed)."""
        if not self.fold_system or not messages or messages[0]["role"] != "system":
            return messages
        rest = [dict(m) for m in messages[1:]]
        if rest and rest[0]["role"] == "user":
            rest[0]["content"] = messages[0]["content"] + "\n\n" + rest[0]["content"]
        else:
            rest.insert(0, {"role": "user", "content": messages[0]["content"]})
        return rest

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return self.encode(self._render(self.chat_messages(messages), True))

    def delta_text(self, history: list[dict[str, str]], reply_ids: list[int], observation: str) -> str:
        """The template text after the latest reply: end-of-turn marker, ``observation`` as a user turn, generation
        prompt. ``history`` ends with the user message the reply answered."""
        rendered = self._render(
            self.chat_messages(
                history + [{"role": "assistant", "content": _PLACEHOLDER}, {"role": "user", "content": observation}]
            ),
            True,
        )
        pos = rendered.rfind(_PLACEHOLDER)
        if pos < 0:
            raise ValueError("the chat template dropped the assistant message; cannot build multi-turn prompts with it")
        tail = rendered[pos + len(_PLACEHOLDER) :]
        if reply_ids:
            # The model's own end-of-turn token is already in the sequence: don't write the template's copy.
            last = self.tokenizer.decode(reply_ids[-1:], skip_special_tokens=False)
            if last.strip() and last in self._special_tokens() and tail.startswith(last):
                tail = tail[len(last) :]
        return tail

    def delta_ids(self, history: list[dict[str, str]], reply_ids: list[int], observation: str) -> list[int]:
        return self.encode(self.delta_text(history, reply_ids, observation))

    def end_of_turn_ids(self) -> list[int]:
        """The special token the template writes right after an assistant message (``<|im_end|>`` in ChatML), as
        ids; ``[]`` when the template writes none there (then the end of turn stays env text, as ``delta_text``
        gives it). Rendered once on a probe chat: templates write the same marker after every reply."""
        if self._end_of_turn is None:
            probe = [{"role": "user", "content": "U"}, {"role": "assistant", "content": _PLACEHOLDER}]
            rendered = self._render(self.chat_messages(probe), False)
            tail = rendered[rendered.rfind(_PLACEHOLDER) + len(_PLACEHOLDER) :] if _PLACEHOLDER in rendered else ""
            # The longest special token opening the tail (a marker may be a prefix of another one).
            marker = max((t for t in self._special_tokens() if t.strip() and tail.startswith(t)), key=len, default="")
            self._end_of_turn = self.encode(marker) if marker else []
        return list(self._end_of_turn)

    def system_turn_ids(self, system: str) -> list[int]:
        """The ids of the template's system turn alone (ChatML: ``<|im_start|>system\n...<|im_end|>\n``); ``[]`` when
        the template has no system turn (the system prompt is folded into the first user message) or cannot render
        one on its own."""
        if self.fold_system:
            return []
        try:
            return self.encode(self._render([{"role": "system", "content": system}], False))
        except Exception:  # a template that refuses a chat without a user turn: no separable system turn
            return []

    def closing_ids(self, reply_ids: list[int]) -> list[int]:
        """The template's text after the last reply of a finished conversation (ChatML: ``<|im_end|>\n``), as ids,
        without the end-of-turn token when ``reply_ids`` already end with it (``"\n"`` in ChatML)."""
        if self._closing is None:
            probe = [{"role": "user", "content": "U"}, {"role": "assistant", "content": _PLACEHOLDER}]
            rendered = self._render(self.chat_messages(probe), False)
            pos = rendered.rfind(_PLACEHOLDER)
            self._closing = rendered[pos + len(_PLACEHOLDER) :] if pos >= 0 else ""
        tail = self._closing
        if reply_ids:
            last = self.tokenizer.decode(reply_ids[-1:], skip_special_tokens=False)
            if last.strip() and last in self._special_tokens() and tail.startswith(last):
                tail = tail[len(last) :]
        return self.encode(tail) if tail else []

    def _special_tokens(self) -> set[str]:
        tokens = set(getattr(self.tokenizer, "all_special_tokens", []) or [])
        added = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
        tokens.update(str(t) for t in added.values())
        return tokens


def check_prefix_supported(engine: GenerationEngine, settings: ProtocolSettings, where: str) -> None:
    """A chat engine (text in, text out) cannot continue a partial reply: it gets whole messages and no generation
    prefix, so an explicit non-empty ``reply_prefix`` cannot be honoured with it (``"auto"`` and ``""`` can)."""
    if not getattr(engine, "supports_token_ids", True) and settings.reply_prefix not in (AUTO_PREFIX, ""):
        raise ValueError(
            f"invalid reply_prefix={settings.reply_prefix!r} for {where}: {type(engine).__name__} cannot continue a "
            "partial reply (a chat engine gets whole messages); use 'auto' or ''"
        )


def _sampling_seed(base: int | None, turn: int) -> int | None:
    return None if base is None else base + turn * _SEED_STRIDE


def _reference_match(text: str, enable_think: bool) -> tuple[str, str] | None:
    """``(think, answer)`` as the reference's ``re.search`` finds them, or ``None`` when it finds nothing.

    The reference searches ``<think>(.*?)</think>\\s*<answer>(.*?)</answer>`` (thinking on) or
    ``<answer>(.*?)</answer>`` with ``re.DOTALL``. Linear scans give the same groups without regex backtracking
    (cubic on a reply full of tags): the match always starts at the first opening tag, because any later start that
    matches makes the first one match too, and the lazy groups end at the first closing tags that let the rest match.
    """
    if not enable_think:
        start = text.find("<answer>")
        end = text.find("</answer>", start + len("<answer>")) if start >= 0 else -1
        return None if end < 0 else ("", text[start + len("<answer>") : end])
    start = text.find("<think>")
    if start < 0:
        return None
    close = text.find("</think>", start + len("<think>"))
    while close >= 0:
        after = close + len("</think>")
        rest = text[after:].lstrip()  # \s* in a str pattern: Unicode whitespace, as str.lstrip strips
        if rest.startswith("<answer>"):
            # The first </think> followed by <answer> is the one to use: a later one could only need a later </answer>.
            opened = len(text) - len(rest) + len("<answer>")
            end = text.find("</answer>", opened)
            return None if end < 0 else (text[start + len("<think>") : close], text[opened:end])
        close = text.find("</think>", after)
    return None


def clean_reply(reply: str, *, enable_think: bool, action_sep: str, max_actions: int) -> str:
    """The reply as the reference trains it (``ragen/llm_agent/ctx_manager.py``, ``ContextManager._parse_response``).

    A well-formed reply becomes ``<think>{think}</think><answer>{answer}</answer>`` (``<answer>{answer}</answer>``
    with thinking off): text before the first tag and after the first ``</answer>`` is dropped, the tags and ChatML
    markers are removed from inside think and answer, both are stripped, and an answer with more than
    ``max_actions`` actions keeps the first ``max_actions``, joined by ``" {action_sep} "``. A reply the reference's
    pattern does not match is returned unchanged (the reference keeps "this kind of invalid string" as it is).

    ``reply`` is what the env receives: the generation prefix followed by the model's text (special tokens already
    skipped by the decoder, as the reference decodes with ``skip_special_tokens=True``).

    >>> clean_reply("<think> go left </think>\\n<answer>Left || Up</answer> and more", enable_think=True,
    ...             action_sep="||", max_actions=1)
    '<think>go left</think><answer>Left</answer>'
    """
    found = _reference_match(reply, enable_think)
    if found is None:
        return reply
    think, answer = found
    for token in _REFERENCE_STRIPPED:  # the reference's loop: replace, then strip, token by token
        answer = answer.replace(token, "").strip()
        think = think.replace(token, "").strip()
    actions = [action.strip() for action in answer.split(action_sep) if action.strip()]
    if len(actions) > max_actions:
        answer = f" {action_sep} ".join(actions[:max_actions])
    return f"<think>{think}</think><answer>{answer}</answer>" if enable_think else f"<answer>{answer}</answer>"


class TokenAgent:
    """An agent for :func:`ragen_envs.driver.play_episodes` that generates with an engine and keeps every episode's
    exact token ids, loss mask, log-probs and turn spans in ``episode.memory["tokens"]`` (see the module docstring).

    Each call generates the replies of all live episodes in one engine call. The first call of an episode encodes its
    chat up to the generation prompt; later calls append only the template's delta after the previous reply (end of
    turn, the new observation, the next generation prompt). Every prompt ends with the episode protocol's generation
    prefix (``ProtocolSettings.generation_prefix``: ``<think>`` / ``<answer>`` by ``enable_think``, the reference's),
    and the env receives ``prefix + reply``. A chat engine (text only) gets the messages and no prefix.

    ``settings.reply_tokens`` says which tokens of a reply are kept and trained (see the module docstring):
    ``"cleaned"`` (the reference's) replaces the prefix and the sampled ids by the tokenisation of the cleaned reply
    (:func:`clean_reply`) and the template's end-of-turn token, all with ``loss_mask`` 1; ``"sampled"`` keeps the
    sampled ids exactly, the prefix masked. Later prompts continue from the kept ids either way.

    Args:
        engine: a token engine (trainable trajectories) or a chat engine (``eval_only`` trajectories).
        tokenizer: the policy's tokenizer (``None`` only with a chat engine: no token ids are then kept).
        sampling: decoding settings; the sampling seed of each call is ``seed_for(episodes, turn)``.
        settings: the rollout's settings (``StarPOConfig.rollout_settings()``); the agent uses three of them.
            ``max_context_tokens``: the longest a conversation may grow; an episode whose next prompt would not leave
            room for one generated token ends (truncated, ``stop="context full"``), and a reply that would overflow is
            cut. ``reply_tokens``: ``"cleaned"`` (the reference's) or ``"sampled"``; applies to token engines (a chat
            engine's replies are re-tokenised as they came, for ``eval_only`` trajectories). ``loss_mask``:
            ``"replies"`` (only the replies are trained) or ``"after_system"`` (the paper's runs: everything after the
            system prompt, the template's closing text appended); see the module docstring. (``group_randomness`` is
            the job list's: :func:`ragen_envs.driver.rollout_jobs`.)
        seed_for: the sampling seed of a call from its live episodes and the turn index; default
            ``sampling.seed + turn * 1000003`` (distinct streams per turn, reproducible per run).
    """

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Any,
        sampling: SamplingParams,
        *,
        settings: RolloutSettings,
        seed_for: Callable[[list[Episode], int], int | None] | None = None,
    ) -> None:
        check_arg(isinstance(sampling, SamplingParams), "sampling", type(sampling).__name__, "a SamplingParams")
        check_arg(isinstance(settings, RolloutSettings), "settings", type(settings).__name__,
                  "a RolloutSettings (StarPOConfig.rollout_settings())")  # fmt: skip
        self.engine = engine
        self.token_engine = bool(getattr(engine, "supports_token_ids", True))
        if self.token_engine:
            check_arg(
                tokenizer is not None, "tokenizer", tokenizer, "the policy's tokenizer (a token engine needs one)"
            )
        self.chat = ChatTokens(tokenizer) if tokenizer is not None else None
        self.sampling = sampling
        self.settings = settings
        # read on every turn of every episode: kept as plain attributes (checked when the settings were made)
        self.max_context_tokens = settings.max_context_tokens
        self.reply_tokens = settings.reply_tokens
        self.loss_mask = settings.loss_mask
        self.seed_for = seed_for or (lambda episodes, turn: _sampling_seed(sampling.seed, turn))
        self.timings = {"generation": 0.0, "tokenization": 0.0}
        self._prefix_ids: dict[str, list[int]] = {}
        self._session: GenerationSession | None = None
        self._session_stop: tuple[str, ...] | None = None
        self._asked: dict[int, Episode] = {}  # id(episode) -> episode whose reply is being generated

    # ---------------------------------------------------------------- per-episode token state
    def _state(self, episode: Episode) -> dict[str, Any]:
        state = episode.memory.get("tokens")
        if state is None:
            settings = episode.protocol.settings
            check_prefix_supported(self.engine, settings, episode.env_name)
            prefix = settings.generation_prefix if self.token_engine else ""
            state = {"prefix": prefix, "input_ids": [], "loss_mask": [], "logprobs": [], "spans": [],
                     "finish_reasons": [], "last_reply_ids": [], "trained_replies": [],
                     "settings": settings}  # fmt: skip
            episode.memory["tokens"] = state
        return state

    def _prefix(self, prefix: str) -> list[int]:
        assert self.chat is not None
        if prefix not in self._prefix_ids:
            self._prefix_ids[prefix] = self.chat.encode(prefix) if prefix else []
        return self._prefix_ids[prefix]

    def _extend_prompt(self, episode: Episode, state: dict[str, Any]) -> bool:
        """Append the env's tokens up to the next generation point (mask 0); ``False`` when they do not fit."""
        assert self.chat is not None
        if not state["input_ids"]:
            ids = self.chat.prompt_ids(episode.messages) + self._prefix(state["prefix"])
            if len(ids) >= self.max_context_tokens:
                raise ValueError(
                    f"invalid argument max_context_tokens={self.max_context_tokens}: the first prompt of "
                    f"{episode.env_id} (seed {episode.seed}) is already {len(ids)} tokens"
                )
        else:
            history, observation = episode.messages[:-2], episode.messages[-1]["content"]
            ids = self.chat.delta_ids(history, state["last_reply_ids"], observation) + self._prefix(state["prefix"])
            # Room for the delta and at least one generated token, or the context is full.
            if len(state["input_ids"]) + len(ids) >= self.max_context_tokens:
                return False
        _add(state, ids, trained=False)
        return True

    # ---------------------------------------------------------------- the agent (streaming, see ragen_envs.driver)
    def submit(self, episode: Episode) -> AgentReply | None:
        """Queue ``episode``'s next reply: its prompt grows by the env's delta (the engine re-encodes nothing it
        still holds). Answers at once, with ``stop="context full"``, when the context has no room left."""
        t0 = time.perf_counter()
        state = self._state(episode)
        fits = self.chat is None or self._extend_prompt(episode, state)
        self.timings["tokenization"] += time.perf_counter() - t0
        if not fits:
            return AgentReply("", stop="context full")
        session = self._session_for(episode)
        key = id(episode)
        self._asked[key] = episode
        turn = len(episode.turns)
        seed = self.seed_for([episode], turn)
        if seed is not None:  # one stream per episode and turn: a group's identical prompts sample their own replies
            seed = int(np.random.SeedSequence([seed, episode.group_id, episode.rollout]).generate_state(1)[0])
        if self.token_engine:
            room = self.max_context_tokens - len(state["input_ids"]) if self.chat is not None else None
            session.submit(GenerationRequest(key, prompt=list(state["input_ids"]), seed=seed, max_new_tokens=room))
        else:
            session.submit(GenerationRequest(key, messages=_plain_messages(episode.messages), seed=seed))
        return None

    def poll(self) -> list[tuple[Episode, AgentReply]]:
        """Advance generation one engine step; returns the replies that finished, recorded in their episodes."""
        if self._session is None:
            return []
        t0 = time.perf_counter()
        finished = self._session.step()
        self.timings["generation"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        replies = []
        for key, result in finished:
            episode = self._asked.pop(key)
            replies.append((episode, self._record(episode.memory["tokens"], result)))
        self.timings["tokenization"] += time.perf_counter() - t0
        return replies

    def pending(self) -> bool:
        return self._session is not None and self._session.busy

    def release(self, episode: Episode) -> None:
        if self._session is not None:
            self._session.release(id(episode))

    def finish_stream(self) -> None:
        """End the engine session (its caches are dropped; the next episode opens a new one)."""
        if self._session is not None:
            self._session.close()
        self._session, self._session_stop = None, None
        self._asked.clear()

    def reply_batch(self, episodes: list[Episode]) -> list[AgentReply]:
        """The turn-synchronous form: one reply for each of ``episodes`` (queued together, generated together; no
        cache is kept between calls). The driver uses the streaming form (:meth:`submit` / :meth:`poll`)."""
        replies: dict[int, AgentReply] = {}
        for episode in episodes:
            reply = self.submit(episode)
            if reply is not None:
                replies[id(episode)] = reply
        while self.pending():
            for episode, reply in self.poll():
                replies[id(episode)] = reply
        # Called outside the driver's streaming loop nobody would end the session: end it here (the model's train /
        # eval mode is restored; the next call re-encodes its prompts, which stays correct).
        self.finish_stream()
        return [replies[id(e)] for e in episodes]

    def _session_for(self, episode: Episode) -> GenerationSession:
        stop = episode.protocol.settings.stop_strings
        if self._session is not None and stop != self._session_stop:
            if self._asked:
                raise ValueError(f"episodes with different stop strings ({stop} vs {self._session_stop}) in one play")
            self.finish_stream()
        if self._session is None:
            params = replace(self.sampling, stop=stop)
            opener = getattr(self.engine, "session", None)  # duck-typed engines get the batch-per-step session
            self._session = opener(params) if callable(opener) else BatchSession(self.engine, params)
            self._session_stop = stop
        return self._session

    def _record(self, state: dict[str, Any], result: GenerationResult) -> AgentReply:
        """Append a reply's tokens to its episode's state; the reply as the env sees it. A reply the engine could not
        produce (a chat endpoint failed it: ``result.error``) ends the episode with the reason, recording nothing."""
        if result.error is not None:
            return AgentReply("", stop=f"{ENGINE_FAILURE}: {result.error}")
        result = self._fit(state, result)
        # The reply as the env sees it, in both modes: the prefix the model continued from, then its text.
        env_text = state["prefix"] + result.text
        if self.reply_tokens == "cleaned" and self.token_engine and self.chat is not None:
            start, ids, finish = self._cleaned_ids(state, env_text, result.finish_reason)
            _add(state, ids, trained=True, logprobs=None)  # not the sampled ids: no sampling log-probs for them
        else:
            start, ids, finish = len(state["input_ids"]), result.token_ids, result.finish_reason
            if ids:
                _add(state, ids, trained=True, logprobs=result.logprobs)
            state["trained_replies"].append(env_text)
        state["spans"].append((start, len(state["input_ids"])))
        state["finish_reasons"].append(finish)
        state["last_reply_ids"] = ids
        return AgentReply(env_text, len(result.token_ids) or None)

    def _cleaned_ids(self, state: dict[str, Any], env_text: str, finish: str) -> tuple[int, list[int], str]:
        """The reference's trained reply (``reply_tokens="cleaned"``): the generation prefix is taken off the
        prompt's end, and the cleaned reply (prefix included) is tokenised with the template's end-of-turn token
        after it, cut to the context. Returns where the reply starts, its ids and its finish reason."""
        assert self.chat is not None
        settings = state["settings"]
        cleaned = clean_reply(env_text, enable_think=settings.enable_think, action_sep=settings.action_sep,
                              max_actions=settings.actions_per_turn)  # fmt: skip
        state["trained_replies"].append(cleaned)
        _drop_tail(state, len(self._prefix(state["prefix"])))
        ids = self.chat.encode(cleaned) + self.chat.end_of_turn_ids()
        room = self.max_context_tokens - len(state["input_ids"])
        if len(ids) > room:  # re-tokenising (and the end-of-turn token) may need more room than the sample did
            ids, finish = ids[: max(room, 0)], FINISH_LENGTH
        return len(state["input_ids"]), ids, finish

    def _fit(self, state: dict[str, Any], result: GenerationResult) -> GenerationResult:
        """Re-tokenise chat-engine replies, and cut a reply that would overflow the context."""
        ids = list(result.token_ids)
        logprobs = list(result.logprobs) if result.logprobs is not None else None
        if not self.token_engine:
            ids = self.chat.encode(result.text) if self.chat is not None else []
            logprobs = None
        room = self.max_context_tokens - len(state["input_ids"])
        if self.chat is not None and len(ids) > room:
            ids = ids[: max(room, 0)]
            logprobs = logprobs[: len(ids)] if logprobs is not None else None
            text = self.chat.tokenizer.decode(ids, skip_special_tokens=True)
            return GenerationResult(token_ids=ids, text=text, logprobs=logprobs, finish_reason=FINISH_LENGTH)
        if ids == result.token_ids and logprobs == result.logprobs:
            return result
        return GenerationResult(
            token_ids=ids, text=result.text, logprobs=logprobs, finish_reason=result.finish_reason or FINISH_STOP
        )

    def trajectory(self, episode: Episode) -> Trajectory:
        """The :class:`Trajectory` of a finished episode played by this agent."""
        state = episode.memory.get("tokens") or {"input_ids": [], "loss_mask": [], "logprobs": [], "spans": [],
                                                   "finish_reasons": []}  # fmt: skip
        trainable = self.token_engine and self.chat is not None
        input_ids, loss_mask, logprobs = state["input_ids"], state["loss_mask"], state["logprobs"]
        spans = state["spans"][: len(episode.turns)]
        if self.loss_mask == "after_system" and trainable and spans:
            input_ids, loss_mask, logprobs = self._after_system(episode, state)
        return Trajectory(
            group_id=episode.group_id,
            seed=episode.seed,
            env_id=episode.env_id,
            messages=_trained_messages(episode.messages, state.get("trained_replies") or []),
            input_ids=input_ids,
            loss_mask=loss_mask,
            turn_spans=spans,
            turn_rewards=[t.reward for t in episode.turns],
            success=episode.success,
            replies=[t.reply for t in episode.turns],
            infos=[dict(t.info) for t in episode.turns],
            old_logprobs=logprobs if trainable else None,
            truncated=episode.truncated,
            finish_reasons=state["finish_reasons"][: len(episode.turns)],
            eval_only=not self.token_engine,
        )


    def _after_system(self, episode: Episode, state: dict[str, Any]) -> tuple[list[int], list[int], list[float] | None]:
        """``input_ids``, ``loss_mask`` and log-probs of a finished episode under ``loss_mask="after_system"``: the
        template's closing text after the last reply appended (when the context has room for it), and every target
        whose input token lies after the system turn trained (see the module docstring)."""
        assert self.chat is not None
        ids = list(state["input_ids"])
        logprobs = list(state["logprobs"]) if state["logprobs"] is not None else None
        last_start, last_end = state["spans"][len(episode.turns) - 1]
        if last_end == len(ids):  # nothing after the last reply yet (always, unless the context was full)
            closing = self.chat.closing_ids(ids[last_start:last_end])
            if closing and len(ids) + len(closing) <= self.max_context_tokens:
                ids += closing
                if logprobs is not None:
                    logprobs += [0.0] * len(closing)
        system = episode.messages[0]["content"] if episode.messages and episode.messages[0]["role"] == "system" else ""
        return ids, after_system_mask(ids, self.chat.system_turn_ids(system) if system else []), logprobs


def after_system_mask(input_ids: list[int], system_ids: list[int]) -> list[int]:
    """The paper's loss mask over ``input_ids`` (RAGEN ``3059df8`` ``get_masks_and_scores``, ``turn_indicators > 1``):
    position ``j`` is trained when the token before it lies after the system turn, i.e. ``j >= len(system_ids) + 1``.
    ``system_ids`` must open ``input_ids`` (the template's system turn); otherwise there is no system turn and every
    token but the first is trained."""
    start = len(system_ids) if system_ids and input_ids[: len(system_ids)] == system_ids else 0
    return [1 if j >= start + 1 else 0 for j in range(len(input_ids))]


def _trained_messages(messages: list[dict[str, str]], replies: list[str]) -> list[dict[str, str]]:
    """``messages`` with the assistant contents replaced, in order, by the replies as trained (the cleaned text
    under ``reply_tokens="cleaned"``), so the template renders the trained sequence."""
    out, turn = [], 0
    for message in messages:
        if message["role"] == "assistant" and turn < len(replies):
            message = {**message, "content": replies[turn]}
            turn += 1
        out.append(message)
    return out


def _drop_tail(state: dict[str, Any], n: int) -> None:
    """Remove the last ``n`` tokens (the generation prefix) from ``state``'s sequence."""
    if n <= 0:
        return
    del state["input_ids"][-n:], state["loss_mask"][-n:]
    if state["logprobs"] is not None:
        del state["logprobs"][-n:]


def _add(state: dict[str, Any], ids: list[int], trained: bool, logprobs: list[float] | None = None) -> None:
    state["input_ids"].extend(ids)
    state["loss_mask"].extend([1 if trained else 0] * len(ids))
    if state["logprobs"] is not None:
        if trained and logprobs is None:
            state["logprobs"] = None  # the engine gave none: the trainer recomputes them
        else:
            state["logprobs"].extend(logprobs if trained and logprobs is not None else [0.0] * len(ids))


def collect_rollouts(
    engine: GenerationEngine,
    tokenizer: Any,
    env_id: str,
    seeds: list[int],
    group_size: int,
    *,
    settings: RolloutSettings,
    sampling: SamplingParams,
    env_kwargs: dict[str, Any] | None = None,
    progress: bool = False,
) -> RolloutBatch:
    """Run ``len(seeds) x group_size`` episodes of ``env_id`` with ``engine`` through the episode driver
    (:func:`ragen_envs.driver.play_episodes`) and return them tokenised.

    Args:
        engine: a token engine (``HFEngine``, ``VLLMEngine``: trainable trajectories) or a chat engine
            (``OpenAIEngine``: ``eval_only`` trajectories).
        tokenizer: the policy's tokenizer; its chat template builds the prompts. May be ``None`` only for a chat
            engine (the trajectories then carry text only, no ids).
        env_id: a registered id, e.g. ``"ragen/Sokoban-v0"``.
        seeds: one initial state per seed (P = ``len(seeds)``); group ``i`` uses ``seeds[i]``.
        group_size: rollouts per initial state (N).
        settings: the rollout's settings, made by the config (``StarPOConfig.rollout_settings()``):
            ``max_context_tokens``, the longest a conversation may grow (prompt + replies: an episode that fills it
            ends ``truncated`` and a reply that would overflow it is cut); ``group_randomness``, ``"shared"`` (the
            reference's: a group's rollouts see the same payouts and slips) or ``"independent"`` (each rollout its
            own; :func:`ragen_envs.driver.rollout_jobs`); ``reply_tokens``, the trained tokens of each reply:
            ``"cleaned"`` (the reference's: the reply cleaned by :func:`clean_reply` and re-tokenised, the generation
            prefix trained; ``old_logprobs`` is then ``None``) or ``"sampled"`` (the sampled ids exactly, with their
            log-probs; the prefix masked); ``loss_mask``, the trained positions: ``"replies"`` (the replies only) or
            ``"after_system"`` (the paper's runs: everything after the system prompt). See the module docstring.
        sampling: decoding settings; with ``sampling.seed`` set, turn ``t`` samples with ``seed + t * 1000003``.
        env_kwargs: keyword arguments for ``gymnasium.make`` (env arguments, ``protocol=`` settings).
        progress: show a progress bar (episodes finished, current turn).

    Returns:
        A :class:`RolloutBatch` ordered group by group (``group_id`` = index into ``seeds``), with ``timings``
        ``generation`` / ``environment`` / ``tokenization`` / ``total`` in seconds.
    """
    import gymnasium as gym

    check_arg(
        isinstance(env_id, str) and env_id != "", "env_id", env_id, "a registered gymnasium id like 'ragen/Bandit-v0'"
    )
    check_arg(isinstance(seeds, (list, tuple)) and len(seeds) > 0, "seeds", seeds, "a non-empty list of ints")
    check_arg(env_kwargs is None or isinstance(env_kwargs, dict), "env_kwargs", env_kwargs, "None or a dict")
    if env_id not in gym.registry:
        known = sorted(k for k in gym.registry if k.startswith("ragen/"))
        raise ValueError(f"invalid argument env_id={env_id!r}: not a registered gymnasium id; ragen ids: {known}")
    agent = TokenAgent(engine, tokenizer, sampling, settings=settings)
    jobs = rollout_jobs(list(seeds), group_size, group_randomness=settings.group_randomness)
    started = time.perf_counter()
    bar = progress_bar(progress, len(jobs), env_id)
    try:
        episodes = play_episodes(env_id, jobs, agent, env_kwargs=env_kwargs, on_error="raise", progress=bar)
    finally:
        if bar is not None:
            bar.close()
    total = time.perf_counter() - started
    timings = dict(agent.timings)
    timings["environment"] = max(total - timings["generation"] - timings["tokenization"], 0.0)
    timings["total"] = total
    return RolloutBatch(trajectories=[agent.trajectory(e) for e in episodes], timings=timings)


def _plain_messages(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def progress_bar(enabled: bool, total: int, env_id: str, unit: str = "episode") -> Any:
    """A transient tqdm bar for a rollout (``None`` when not ``enabled``)."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"rollout {env_id}", unit=unit, leave=False)


def placed_rewards(traj: Trajectory, placement: Literal["trajectory", "turn"] = "trajectory") -> list[float]:
    """A token-level reward vector aligned with ``traj.input_ids``.

    ``"trajectory"``: R(tau) = sum of the turn rewards on the last trained token (the paper's outcome reward; the
    last reply's last token, or under ``loss_mask="after_system"`` the template's closing text after it, where the
    reference puts the score: the conversation's last token);
    ``"turn"``: each turn's reward on the last token of that turn's reply (for turn-level credit, e.g. bi-level GAE).
    Everything else is 0. A turn whose reply is empty (cut by the context) moves its reward to the previous reply's
    last token, so no reward is lost.
    """
    check_arg(placement in ("trajectory", "turn"), "placement", placement, "'trajectory' or 'turn'")
    rewards = [0.0] * len(traj.input_ids)
    ends = [end - 1 for start, end in traj.turn_spans if end > start]
    if not ends:
        return rewards
    if placement == "trajectory":
        trained = [j for j, m in enumerate(traj.loss_mask) if m]
        rewards[max(ends[-1], trained[-1]) if trained else ends[-1]] += traj.reward
        return rewards
    last = None
    for (start, end), reward in zip(traj.turn_spans, traj.turn_rewards):
        if end > start:
            last = end - 1
        target = last if last is not None else ends[0]
        rewards[target] += float(reward)
    return rewards


__all__ = [
    "LOSS_MASKS",
    "REPLY_TOKENS",
    "ChatTokens",
    "RolloutSettings",
    "TokenAgent",
    "after_system_mask",
    "check_loss_mask",
    "check_prefix_supported",
    "check_reply_tokens",
    "clean_reply",
    "collect_rollouts",
    "placed_rewards",
]
