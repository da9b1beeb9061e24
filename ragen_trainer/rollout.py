"""Multi-turn rollouts: P initial states x N rollouts each, on any registered text env.

For each seed, ``group_size`` envs are made with ``gymnasium.make(env_id, **env_kwargs)`` and reset with that seed, so
the N rollouts of a group start from the same initial state (the GRPO / StarPO-S group). The env's own randomness
after reset (FrozenLake's slippery moves, the Bandit's payout draw) comes from the same seed too, so within a group
only the model's choices differ, as in the reference code. Each episode is a chat::

    system: reset info["system_prompt"]     user: observation     assistant: reply     user: next observation ...

Every turn, the replies of all live episodes are generated in one batched call, each reply is passed to its env's
``step``, and the episode ends when the env says so (terminated or truncated), after ``max_turns`` turns, or when the
context (``max_context_tokens``) is full (``truncated=True``).

Tokens (the loss mask). The conversation's ``input_ids`` are built incrementally and **the model's sampled tokens are
never re-tokenised**: generation at turn t+1 continues from exactly the tokens the model produced at turn t, and the
trainer scores exactly those. Only the environment's text comes from the tokenizer's chat template, as a *delta*:
the template is rendered with a placeholder in place of the latest reply, and the text after the placeholder (the
template's end-of-turn marker, the next user message, the next generation prompt) is tokenised and appended with
``loss_mask`` 0. When the model itself emitted the end-of-turn token that the template writes after a reply
(``<|im_end|>`` in ChatML), that token is part of the reply (mask 1) and is not written twice. Where the delta
approach needs care:

* A reply cut by ``max_new_tokens`` has no end-of-turn token; the template's marker is then appended as env text
  (mask 0), so the next turn still sees a well-formed chat.
* A model that stops with a token the template does not write there (plain eos instead of ``<|eot_id|>``) keeps its
  token (mask 1) and the template's marker follows (mask 0).
* Templates that rewrite earlier assistant messages (Qwen3 and DeepSeek-R1 drop old ``<think>`` blocks) would give
  another text if re-rendered; the rollout keeps the model's tokens as generated, so sampling and training see the
  same sequence (this is on purpose: it is the sequence the model's probabilities were computed on).
* Templates without a system role (they raise on one, like Gemma's) get the system prompt folded into the first user
  message.
* The delta is tokenised on its own. With ChatML-like templates it starts at a special token or a newline after one,
  so it tokenises as in the whole rendering; with other templates a merge across the boundary can differ from
  tokenising the whole text at once, which is harmless (generation continues from the same ids that are trained).

Reply prefix (the reference's *generation prefix*, RAGEN ``ctx_manager.py``). After the template's generation prompt
the prompt gets ``"<think>"`` (thinking on) or ``"<answer>"`` (thinking off), so the model continues *inside* the
tag; small instruct models rarely open the tag on their own, and a reply the protocol cannot parse gives no learning
signal. The prefix tokens are prompt (``loss_mask`` 0, not the model's sample); the env receives ``prefix + reply``
and the assistant message holds ``prefix + reply``, so ``decode(input_ids)`` is still exactly the template rendering
of the conversation (the template writes the assistant content right after the generation prompt). The prefix is
tokenised on its own; since it follows the generation prompt's newline and the model's reply follows it, the only
difference from tokenising the whole rendering at once is a possible merge across the prefix/reply boundary (e.g.
``"<answer>"`` + ``"Left"``), which changes no text and is harmless: generation continues from exactly these ids and
the trainer scores exactly these ids. ``reply_prefix="auto"`` picks the tag from each env's ``TurnProtocol``
(``enable_think``); ``""`` turns the prefix off.

Chat engines (an OpenAI-compatible API) return text only: their replies are re-tokenised to fill ``input_ids`` and
the trajectory is flagged ``eval_only`` (no log-probs; never train on it).

Rewards: ``turn_rewards`` are the env's per-turn rewards; :func:`placed_rewards` puts them on tokens, either the
trajectory sum on the last model token or each turn's reward on the last token of that turn's reply.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from ragen_envs.core import check_arg
from ragen_trainer.engines.base import FINISH_LENGTH, FINISH_STOP, GenerationEngine, GenerationResult, SamplingParams
from ragen_trainer.trajectory import RolloutBatch, Trajectory

#: Stands in for the latest reply when the chat template is rendered to find the text that follows a reply.
_PLACEHOLDER = "RAGEN_REPLY_PLACEHOLDER_7f3a"
#: ``reply_prefix`` value that picks the reference's generation prefix from the env's protocol.
AUTO_PREFIX = "auto"
#: Per-turn sampling seeds are ``seed + turn * _SEED_STRIDE`` (distinct streams per turn, reproducible per run).
_SEED_STRIDE = 1_000_003


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

    def _accepts_system(self) -> bool:
        try:
            probe = "RAGEN_SYSTEM_PROBE"
            text = self._render([{"role": "system", "content": probe}, {"role": "user", "content": "U"}], True)
        except Exception:  # noqa: BLE001 - templates raise jinja errors of their own for unsupported roles
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

    def _special_tokens(self) -> set[str]:
        tokens = set(getattr(self.tokenizer, "all_special_tokens", []) or [])
        added = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
        tokens.update(str(t) for t in added.values())
        return tokens


@dataclass
class _Episode:
    """Mutable state of one live episode (becomes a :class:`Trajectory`)."""

    group_id: int
    seed: int
    env: Any
    messages: list[dict[str, str]]
    prefix: str = ""
    prefix_ids: list[int] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    success: bool = False
    done: bool = False
    truncated: bool = False

    def add_tokens(self, ids: list[int], trained: bool, logprobs: list[float] | None = None) -> None:
        self.input_ids.extend(ids)
        self.loss_mask.extend([1 if trained else 0] * len(ids))
        if self.logprobs is not None:
            if trained and logprobs is None:
                self.logprobs = None  # the engine gave none: the trainer recomputes them
            else:
                self.logprobs.extend(logprobs if trained and logprobs is not None else [0.0] * len(ids))


def dynamics_seed(seed: int, rollout_index: int) -> int:
    """The env-randomness seed of rollout ``rollout_index`` of the group started from ``seed`` (stable, distinct)."""
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, rollout_index]).generate_state(1)[0])


def protocol_enable_think(env: Any) -> bool | None:
    """``enable_think`` of the :class:`~ragen_envs.protocol.TurnProtocol` in ``env``'s wrapper chain (``None``: none)."""
    current = env
    for _ in range(32):  # wrapper chains are short; the bound guards against a cycle
        if hasattr(current, "enable_think") and isinstance(current.enable_think, bool):
            return bool(current.enable_think)
        nxt = getattr(current, "env", None)
        if nxt is None or nxt is current:
            return None
        current = nxt
    return None


def resolve_reply_prefix(reply_prefix: str, env: Any) -> str:
    """The prefix text for ``env``: ``"auto"`` -> ``"<think>"`` / ``"<answer>"`` by the env protocol's
    ``enable_think`` (``""`` for an env without a turn protocol); any other string is used as is."""
    if reply_prefix != AUTO_PREFIX:
        return reply_prefix
    think = protocol_enable_think(env)
    if think is None:
        return ""
    return "<think>" if think else "<answer>"


def check_reply_prefix(reply_prefix: Any) -> str:
    """Validate a ``reply_prefix`` argument (``"auto"``, ``""`` or any other text); returns it."""
    check_arg(
        isinstance(reply_prefix, str) and "\x00" not in reply_prefix,
        "reply_prefix",
        reply_prefix,
        "'auto' (the reference's <think>/<answer> by the env's enable_think), '' (no prefix) or the prefix text",
    )
    return reply_prefix


def collect_rollouts(
    engine: GenerationEngine,
    tokenizer: Any,
    env_id: str,
    seeds: list[int],
    group_size: int,
    *,
    env_kwargs: dict[str, Any] | None = None,
    max_turns: int | None = None,
    sampling: SamplingParams,
    max_context_tokens: int = 3600,
    progress: bool = False,
    reply_prefix: str = AUTO_PREFIX,
) -> RolloutBatch:
    """Run ``len(seeds) x group_size`` episodes of ``env_id`` with ``engine`` and return them tokenised.

    Args:
        engine: a token engine (``HFEngine``, ``VLLMEngine``: trainable trajectories) or a chat engine
            (``OpenAIEngine``: ``eval_only`` trajectories).
        tokenizer: the policy's tokenizer; its chat template builds the prompts. May be ``None`` only for a chat
            engine (the trajectories then carry text only, no ids).
        env_id: a registered id, e.g. ``"ragen/Sokoban-v0"``.
        seeds: one initial state per seed (P = ``len(seeds)``); group ``i`` uses ``seeds[i]``.
        group_size: rollouts per initial state (N).
        env_kwargs: keyword arguments for ``gymnasium.make``.
        max_turns: stop an episode after this many turns (``truncated``); ``None``: only the env's own limit.
        sampling: decoding settings; with ``sampling.seed`` set, turn ``t`` samples with ``seed + t * 1000003``.
        max_context_tokens: the longest a conversation may grow (prompt + replies); an episode that fills it ends
            ``truncated`` and a reply that would overflow it is cut.
        progress: show a progress bar (episodes finished, current turn).
        reply_prefix: text put after each generation prompt for the model to continue from (prompt tokens,
            ``loss_mask`` 0); the env gets ``prefix + reply``. ``"auto"`` (default, as the reference): ``"<think>"``
            or ``"<answer>"`` by the env protocol's ``enable_think``; ``""``: none. Chat engines cannot be given a
            partial assistant message, so with them ``"auto"`` means no prefix and any other non-empty prefix is
            an error.

    Returns:
        A :class:`RolloutBatch` ordered group by group (``group_id`` = index into ``seeds``), with ``timings``
        ``generation`` / ``environment`` / ``tokenization`` / ``total`` in seconds.
    """
    import gymnasium as gym

    import ragen_envs  # noqa: F401  (registers the ragen/* ids)

    check_arg(
        isinstance(env_id, str) and env_id != "", "env_id", env_id, "a registered gymnasium id like 'ragen/Bandit-v0'"
    )
    check_arg(
        isinstance(seeds, (list, tuple))
        and len(seeds) > 0
        and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds),
        "seeds",
        seeds,
        "a non-empty list of ints",
    )
    check_arg(
        isinstance(group_size, int) and not isinstance(group_size, bool) and group_size >= 1,
        "group_size",
        group_size,
        "an int >= 1",
    )
    check_arg(
        max_turns is None or (isinstance(max_turns, int) and max_turns >= 1),
        "max_turns",
        max_turns,
        "None or an int >= 1",
    )
    check_arg(isinstance(sampling, SamplingParams), "sampling", type(sampling).__name__, "a SamplingParams")
    check_arg(
        isinstance(max_context_tokens, int) and max_context_tokens >= 2,
        "max_context_tokens",
        max_context_tokens,
        "an int >= 2",
    )
    check_arg(env_kwargs is None or isinstance(env_kwargs, dict), "env_kwargs", env_kwargs, "None or a dict")
    check_reply_prefix(reply_prefix)
    if env_id not in gym.registry:
        known = sorted(k for k in gym.registry if k.startswith("ragen/"))
        raise ValueError(f"invalid argument env_id={env_id!r}: not a registered gymnasium id; ragen ids: {known}")

    token_engine = bool(getattr(engine, "supports_token_ids", True))
    if token_engine:
        check_arg(tokenizer is not None, "tokenizer", tokenizer, "the policy's tokenizer (a token engine needs one)")
    else:
        check_arg(
            reply_prefix in (AUTO_PREFIX, ""),
            "reply_prefix",
            reply_prefix,
            f"'auto' or '' with the chat engine {type(engine).__name__} (it cannot continue a partial reply)",
        )
    chat = ChatTokens(tokenizer) if tokenizer is not None else None
    timings = {"generation": 0.0, "environment": 0.0, "tokenization": 0.0}
    started = time.perf_counter()

    # ---- make and reset the envs: the N rollouts of group g share seeds[g], hence the initial state
    episodes: list[_Episode] = []
    t0 = time.perf_counter()
    for group_id, seed in enumerate(seeds):
        for rollout_index in range(group_size):
            env = gym.make(env_id, **(env_kwargs or {}))
            # Same initial state for the whole group (seed), independent env randomness per rollout (dynamics_seed).
            observation, info = env.reset(seed=seed, options={"dynamics_seed": dynamics_seed(seed, rollout_index)})
            system = info.get("system_prompt") or ""
            messages = [{"role": "system", "content": system}] if system else []
            messages.append({"role": "user", "content": observation})
            prefix = resolve_reply_prefix(reply_prefix, env) if token_engine else ""
            episodes.append(_Episode(group_id=group_id, seed=seed, env=env, messages=messages, prefix=prefix))
    timings["environment"] += time.perf_counter() - t0

    t0 = time.perf_counter()
    if chat is not None:
        prefix_cache: dict[str, list[int]] = {}
        for ep in episodes:
            if ep.prefix and ep.prefix not in prefix_cache:
                prefix_cache[ep.prefix] = chat.encode(ep.prefix)
            ep.prefix_ids = prefix_cache.get(ep.prefix, [])
            # The generation prompt, then the reply prefix: both prompt (mask 0); the model continues after them.
            ep.add_tokens(chat.prompt_ids(ep.messages) + ep.prefix_ids, trained=False)
            if len(ep.input_ids) >= max_context_tokens:
                raise ValueError(
                    f"invalid argument max_context_tokens={max_context_tokens}: the first prompt of {env_id} "
                    f"(seed {ep.seed}) is already {len(ep.input_ids)} tokens"
                )
    timings["tokenization"] += time.perf_counter() - t0

    bar = _progress_bar(progress, len(episodes), env_id)
    turn = 0
    try:
        while True:
            live = [ep for ep in episodes if not ep.done]
            if not live:
                break
            params = sampling.with_seed(None if sampling.seed is None else sampling.seed + turn * _SEED_STRIDE)
            if chat is not None and token_engine:
                # Never sample more than the roomiest live context can hold (longer replies would be cut anyway).
                room = max(max_context_tokens - len(ep.input_ids) for ep in live)
                if room < params.max_new_tokens:
                    params = replace(params, max_new_tokens=max(room, 1))

            # ---- one batched generation over every live episode
            t0 = time.perf_counter()
            if token_engine:
                results = engine.generate([ep.input_ids for ep in live], params)
            else:
                results = engine.generate_chat([_plain_messages(ep.messages) for ep in live], params)
            timings["generation"] += time.perf_counter() - t0
            if len(results) != len(live):
                raise RuntimeError(f"{type(engine).__name__} returned {len(results)} replies for {len(live)} prompts")

            for ep, result in zip(live, results):
                t0 = time.perf_counter()
                result = _fit_reply(ep, result, token_engine, chat, max_context_tokens)
                start = len(ep.input_ids)
                if result.token_ids:
                    ep.add_tokens(result.token_ids, trained=True, logprobs=result.logprobs)
                ep.turn_spans.append((start, len(ep.input_ids)))
                # The reply as the env and the chat see it: the prefix the model continued from, then its text.
                reply_text = ep.prefix + result.text
                ep.replies.append(reply_text)
                ep.finish_reasons.append(result.finish_reason)
                history = list(ep.messages)
                ep.messages.append({"role": "assistant", "content": reply_text})
                timings["tokenization"] += time.perf_counter() - t0

                t0 = time.perf_counter()
                observation, reward, terminated, truncated, info = ep.env.step(reply_text)
                timings["environment"] += time.perf_counter() - t0
                ep.turn_rewards.append(float(reward))
                ep.infos.append(dict(info))
                ep.success = bool(info.get("success", False))
                ep.messages.append({"role": "user", "content": observation})
                if terminated or truncated:
                    ep.done, ep.truncated = True, bool(truncated and not terminated)
                    continue
                if max_turns is not None and len(ep.turn_rewards) >= max_turns:
                    ep.done, ep.truncated = True, True
                    continue

                # ---- the env's text for the next turn, as a template delta (mask 0)
                t0 = time.perf_counter()
                if chat is not None:
                    delta = chat.delta_ids(history, result.token_ids, observation) + ep.prefix_ids
                    # Room for the delta and at least one generated token, or the context is full.
                    if len(ep.input_ids) + len(delta) >= max_context_tokens:
                        ep.done, ep.truncated = True, True
                    else:
                        ep.add_tokens(delta, trained=False)
                timings["tokenization"] += time.perf_counter() - t0

            turn += 1
            if bar is not None:
                finished = sum(ep.done for ep in episodes)
                bar.update(finished - bar.n)
                bar.set_postfix(turn=turn, live=len(episodes) - finished)
    finally:
        if bar is not None:
            bar.close()
        for ep in episodes:
            ep.env.close()

    trajectories = [
        Trajectory(
            group_id=ep.group_id,
            seed=ep.seed,
            env_id=env_id,
            messages=ep.messages,
            input_ids=ep.input_ids,
            loss_mask=ep.loss_mask,
            turn_spans=ep.turn_spans,
            turn_rewards=ep.turn_rewards,
            success=ep.success,
            replies=ep.replies,
            infos=ep.infos,
            old_logprobs=ep.logprobs if (token_engine and chat is not None) else None,
            truncated=ep.truncated,
            finish_reasons=ep.finish_reasons,
            eval_only=not token_engine,
        )
        for ep in episodes
    ]
    timings["total"] = time.perf_counter() - started
    return RolloutBatch(trajectories=trajectories, timings=timings)


def _fit_reply(
    ep: _Episode, result: GenerationResult, token_engine: bool, chat: ChatTokens | None, max_context_tokens: int
) -> GenerationResult:
    """Re-tokenise chat-engine replies, and cut a reply that would overflow the context."""
    ids = list(result.token_ids)
    logprobs = list(result.logprobs) if result.logprobs is not None else None
    if not token_engine:
        ids = chat.encode(result.text) if chat is not None else []
        logprobs = None
    room = max_context_tokens - len(ep.input_ids)
    if chat is not None and len(ids) > room:
        ids = ids[: max(room, 0)]
        logprobs = logprobs[: len(ids)] if logprobs is not None else None
        text = chat.tokenizer.decode(ids, skip_special_tokens=True)
        return GenerationResult(token_ids=ids, text=text, logprobs=logprobs, finish_reason=FINISH_LENGTH)
    if ids == result.token_ids and logprobs == result.logprobs:
        return result
    return GenerationResult(
        token_ids=ids, text=result.text, logprobs=logprobs, finish_reason=result.finish_reason or FINISH_STOP
    )


def _plain_messages(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _progress_bar(enabled: bool, total: int, env_id: str) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"rollout {env_id}", unit="episode", leave=False)


def placed_rewards(traj: Trajectory, placement: Literal["trajectory", "turn"] = "trajectory") -> list[float]:
    """A token-level reward vector aligned with ``traj.input_ids``.

    ``"trajectory"``: R(tau) = sum of the turn rewards on the last model token (the paper's outcome reward);
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
        rewards[ends[-1]] += traj.reward
        return rewards
    last = None
    for (start, end), reward in zip(traj.turn_spans, traj.turn_rewards):
        if end > start:
            last = end - 1
        target = last if last is not None else ends[0]
        rewards[target] += float(reward)
    return rewards


__all__ = [
    "AUTO_PREFIX",
    "ChatTokens",
    "check_reply_prefix",
    "collect_rollouts",
    "placed_rewards",
    "protocol_enable_think",
    "resolve_reply_prefix",
]
