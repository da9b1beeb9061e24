"""Which tokens of a reply are trained: ``reply_tokens="cleaned"`` (the default, the reference's) and ``"sampled"``.

The reference (RAGEN ``ragen/llm_agent/ctx_manager.py``) cleans each reply in ``ContextManager._parse_response``
(``<think>..</think><answer>..</answer>``, nothing after the first ``</answer>``; a reply its pattern does not match is
kept as it is), re-renders the conversation with the chat template and tokenises it whole in ``get_lm_inputs``
(``formulate_rollouts``); the generation prefix (``<think>`` / ``<answer>``) is part of the assistant message, so it is
trained. ``"sampled"`` keeps the sampled ids exactly and masks the prefix.

Cheap: a scripted engine (fixed reply texts) and the tiny ChatML tokenizer of ``conftest.py``; one test runs the tiny
random model through the HF engine.
"""

from __future__ import annotations

import copy
import random
import re
from dataclasses import fields, replace

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer.engines import SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.engines.hf_generate import GenerateEngine
from ragen_trainer.rollout import REPLY_TOKENS, ChatTokens, TokenAgent, clean_reply, collect_rollouts
from ragen_trainer.settings import RolloutSettings
from tests.trainer.conftest import latest_rollout

# What the model writes after the "<think>" prefix: turn 1 has blanks to clean, an invalid arm and text after the
# answer; turn 2 is clean and wins (Bandit, two turns allowed here to test the multi-turn bookkeeping).
RAW = [
    "  hmm </think>\n<answer> Unicorn </answer> and then more text",
    "Dragon is risky</think><answer>Dragon</answer>",
]
ENV_TEXTS = ["<think>" + r for r in RAW]
CLEANED = ["<think>hmm</think><answer>Unicorn</answer>", "<think>Dragon is risky</think><answer>Dragon</answer>"]
PARAMS = SamplingParams(max_new_tokens=64)


def _encode(tokenizer, text):
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _by_call(replies):
    """A script giving ``replies[k]`` at generate call k (every episode here lives the same turns)."""
    return lambda prompt, call, row: replies[min(call, len(replies) - 1)]


def _spans_mask(traj):
    mask = [0] * len(traj.input_ids)
    for start, end in traj.turn_spans:
        mask[start:end] = [1] * (end - start)
    return mask


def _bandit(engine, tokenizer, **kwargs):
    """Bandit rollouts (up to 5 turns); rollout settings (``reply_tokens``, ...) as keywords over
    :func:`latest_rollout`'s."""
    env_kwargs = {"max_turns": 5, **kwargs.pop("env_kwargs", {})}
    settings = latest_rollout(**{f.name: kwargs.pop(f.name) for f in fields(RolloutSettings) if f.name in kwargs})
    return collect_rollouts(engine, tokenizer, "ragen/Bandit-v0", [0, 1], 2, settings=settings, sampling=PARAMS,
                            env_kwargs=env_kwargs, **kwargs)  # fmt: skip


# ---------------------------------------------------------------------------------------------- the reference parser
def _reference_parse(response, enable_think, action_sep, max_actions):
    """The reference's ``ContextManager._parse_response`` (``ctx_manager.py``), its ``llm_response``, as an oracle."""
    pattern = r"<think>(.*?)</think>\s*<answer>(.*?)</answer>" if enable_think else r"<answer>(.*?)</answer>"
    match = re.search(pattern, response, re.DOTALL)
    if not match:
        return response
    think, answer = (match.group(1), match.group(2)) if enable_think else ("", match.group(1))
    for token in ["<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>"]:
        answer = answer.replace(token, "").strip()
        think = think.replace(token, "").strip()
    actions = [a.strip() for a in answer.split(action_sep) if a.strip()]
    if len(actions) > max_actions:
        answer = (" " + action_sep + " ").join(actions[:max_actions])
    return f"<think>{think}</think><answer>{answer}</answer>" if enable_think else f"<answer>{answer}</answer>"


CASES = [
    "<think>a</think><answer>Left</answer>",
    "<think> a </think> \n <answer> Left || Up </answer> trailing",
    "intro <think>a</think><answer>Left</answer><think>b</think><answer>Up</answer>",
    "<think>a</think>x<answer>Left</answer>",  # text between the blocks: no match, kept whole
    "<think>a</think>x</think><answer>Left</answer>",  # the think group runs to the </think> before <answer>
    "<think><think></answer> 123. </think><answer> <answer> say || hi </answer></answer>",  # the reference's example
    "<think>a</think><answer>Left || Up || Down || Right || Left || Up || Down</answer>",  # over the action cap
    "<think>a</think><answer>Left</answer",  # unclosed
    "<answer>Left</answer>",
    "Left",
    "",
    "<think>a<|im_end|></think>\u00a0<answer><|im_start|>Left</answer>",  # non-breaking space counts as \s
    "<think>a</think><answer>b</think><answer>c</answer>",
]


@pytest.mark.parametrize("enable_think", [True, False])
def test_clean_reply_is_the_reference_parser(enable_think):
    for case in CASES:
        assert clean_reply(case, enable_think=enable_think, action_sep="||", max_actions=5) == _reference_parse(
            case, enable_think, "||", 5
        ), case
    # Random strings of tag fragments: the linear scan finds the groups the backtracking regex finds.
    pieces = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "a", "||", "Up", "<|im_end|>", "</", ">"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        for cap in (1, 5):
            expected = _reference_parse(text, enable_think, "||", cap)
            assert clean_reply(text, enable_think=enable_think, action_sep="||", max_actions=cap) == expected, text


# ---------------------------------------------------------------------------------------------- "cleaned" (default)
def test_cleaned_is_the_default_and_trains_the_prefix_and_the_cleaned_reply(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, _by_call(RAW))
    batch = _bandit(engine, tiny_tokenizer)  # no reply_tokens: the default
    eos = tiny_tokenizer.eos_token_id
    for traj in batch.trajectories:
        assert traj.num_turns == 2 and traj.success
        assert traj.replies == ENV_TEXTS  # the env receives prefix + the model's text, as with "sampled"
        assert traj.infos[0]["invalid_actions"] == ["Unicorn"] and traj.infos[1]["actions"] == ["Dragon"]
        assert traj.loss_mask == _spans_mask(traj)
        for (start, end), cleaned in zip(traj.turn_spans, CLEANED):
            # The trained ids are the tokenizer's encoding of the cleaned reply, then the template's <|im_end|>.
            assert traj.input_ids[start:end] == _encode(tiny_tokenizer, cleaned) + [eos]
            # The generation prefix opens the trained reply, with loss mask 1; the generation prompt before it is 0.
            prefix_len = len(_encode(tiny_tokenizer, "<think>"))
            assert tiny_tokenizer.decode(traj.input_ids[start : start + prefix_len]) == "<think>"
            assert traj.loss_mask[start : start + prefix_len] == [1] * prefix_len
            assert traj.loss_mask[start - 1] == 0
            assert tiny_tokenizer.decode(traj.input_ids[:start]).endswith("<|im_start|>assistant\n")
        text = tiny_tokenizer.decode(traj.input_ids)
        assert "and then more text" not in text and " Unicorn " not in text  # after </answer>; stripped blanks
        # The whole conversation re-rendered with the cleaned replies and tokenised at once gives the same ids (the
        # reference's re-tokenisation; the rendering's final newline follows the last <|im_end|>).
        assert [m["content"] for m in traj.messages if m["role"] == "assistant"] == CLEANED
        rendered = tiny_tokenizer.apply_chat_template(traj.messages[:-1], tokenize=False)
        assert traj.input_ids == _encode(tiny_tokenizer, rendered)[:-1] and rendered.endswith("<|im_end|>\n")
        assert traj.old_logprobs is None  # re-tokenised ids were not sampled; the trainer scores them itself


def test_cleaned_next_prompt_continues_from_the_trained_ids(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, _by_call(RAW))
    batch = _bandit(engine, tiny_tokenizer)
    prefix_ids = _encode(tiny_tokenizer, "<think>")
    for row, traj in enumerate(batch.trajectories):  # every episode is live in both calls, in batch order
        first, second = engine.prompts[0][row], engine.prompts[1][row]
        (start0, end0), (start1, _) = traj.turn_spans
        assert first == traj.input_ids[:start0] + prefix_ids  # generation continued after the prefix ...
        assert second == traj.input_ids[:start1] + prefix_ids  # ... and the next prompt extends the trained ids
        assert second[:end0] == traj.input_ids[:end0]
        assert tiny_tokenizer.decode(traj.input_ids[end0:start1]).startswith("\n<|im_start|>user\n")  # not twice


@pytest.mark.parametrize(
    ("enable_think", "raw", "expected"),
    [
        (True, "I pick Dragon</answer> then more", "<think>I pick Dragon</answer> then more"),  # no </think>
        (False, " Dragon </answer> and more", "<answer>Dragon</answer>"),
        (False, "Dragon", "<answer>Dragon"),  # unclosed: kept as it is
    ],
    ids=["think-malformed", "answer-text-after", "answer-unclosed"],
)
def test_cleaned_reply_by_think_mode_and_malformed_replies(tiny_tokenizer, scripted_engine, enable_think, raw,
                                                           expected):  # fmt: skip
    engine = scripted_engine(tiny_tokenizer, _by_call([raw]))
    batch = _bandit(engine, tiny_tokenizer, env_kwargs={"enable_think": enable_think, "max_turns": 1})
    prefix = "<think>" if enable_think else "<answer>"
    for traj in batch.trajectories:
        start, end = traj.turn_spans[0]
        assert traj.replies == [prefix + raw]
        assert traj.input_ids[start:end] == _encode(tiny_tokenizer, expected) + [tiny_tokenizer.eos_token_id]
        assert traj.loss_mask == _spans_mask(traj)


def test_cleaned_reply_is_cut_to_the_context(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, _by_call(RAW))
    probe = _bandit(engine, tiny_tokenizer, env_kwargs={"max_turns": 1}).trajectories[0]
    start, end = probe.turn_spans[0]
    limit = start + (end - start) // 2  # room for half the cleaned reply (the prefix's tokens included)
    engine = scripted_engine(tiny_tokenizer, _by_call(RAW))
    traj = _bandit(engine, tiny_tokenizer, max_context_tokens=limit).trajectories[0]
    # The sample was cut to the room after the prefix, so it is malformed and kept whole; the prefix, the cut text
    # and the end-of-turn token need more room than the sample had: they are cut to the context too.
    assert len(traj.replies[0]) < len(ENV_TEXTS[0]) and len(traj.input_ids) == limit
    assert traj.num_turns == 1 and traj.truncated and traj.finish_reasons == ["length"]
    assert traj.turn_spans == [(start, limit)] and traj.loss_mask == _spans_mask(traj)
    expected = _encode(tiny_tokenizer, traj.replies[0]) + [tiny_tokenizer.eos_token_id]
    assert len(expected) > limit - start and traj.input_ids[start:] == expected[: limit - start]
    assert traj.input_ids[:start] == probe.input_ids[:start]


def test_cleaned_with_a_template_whose_end_marker_is_not_a_special_token(tiny_tokenizer, scripted_engine):
    tokenizer = copy.deepcopy(tiny_tokenizer)  # "<|eot_id|>" is plain text for the tiny tokenizer
    tokenizer.chat_template = (
        "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' "
        "+ message['content'] + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    )
    assert ChatTokens(tokenizer).end_of_turn_ids() == []
    assert ChatTokens(tiny_tokenizer).end_of_turn_ids() == [tiny_tokenizer.eos_token_id]
    engine = scripted_engine(tokenizer, _by_call(RAW))
    for traj in _bandit(engine, tokenizer).trajectories:
        assert traj.success and traj.loss_mask == _spans_mask(traj)
        for (start, end), cleaned in zip(traj.turn_spans, CLEANED):
            assert traj.input_ids[start:end] == _encode(tokenizer, cleaned)  # the marker stays env text (mask 0)
            assert end == len(traj.input_ids) or tokenizer.decode(traj.input_ids[end:]).startswith("<|eot_id|>")
        # The last reply's marker would come with the next prompt, which an ended episode does not get.
        rendered = tokenizer.apply_chat_template(traj.messages[:-1], tokenize=False)
        assert tokenizer.decode(traj.input_ids) + "<|eot_id|>" == rendered


# ---------------------------------------------------------------------------------------------- "sampled"
def test_sampled_keeps_the_sampled_ids_and_masks_the_prefix(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, _by_call(RAW))
    batch = _bandit(engine, tiny_tokenizer, reply_tokens="sampled")
    prefix_ids = _encode(tiny_tokenizer, "<think>")
    for traj in batch.trajectories:
        assert traj.success and traj.replies == ENV_TEXTS
        assert traj.loss_mask == _spans_mask(traj)
        for (start, end), raw in zip(traj.turn_spans, RAW):
            assert traj.input_ids[start:end] == _encode(tiny_tokenizer, raw) + [tiny_tokenizer.eos_token_id]
            assert traj.input_ids[start - len(prefix_ids) : start] == prefix_ids
            assert traj.loss_mask[start - len(prefix_ids) : start] == [0] * len(prefix_ids)
            assert traj.old_logprobs[start:end] == [-1.0] * (end - start)  # the scripted engine's log-probs
        assert "and then more text" in tiny_tokenizer.decode(traj.input_ids)  # nothing dropped
        assert [m["content"] for m in traj.messages if m["role"] == "assistant"] == ENV_TEXTS
        rendered = tiny_tokenizer.apply_chat_template(traj.messages[:-1], tokenize=False)
        assert tiny_tokenizer.decode(traj.input_ids) + "\n" == rendered
    for row, traj in enumerate(batch.trajectories):
        assert engine.prompts[1][row] == traj.input_ids[: traj.turn_spans[1][0]]


def test_both_modes_play_the_same_episodes(tiny_tokenizer, scripted_engine):
    runs = {mode: _bandit(scripted_engine(tiny_tokenizer, _by_call(RAW)), tiny_tokenizer, reply_tokens=mode)
            for mode in REPLY_TOKENS}  # fmt: skip
    prefix_len = len(_encode(tiny_tokenizer, "<think>"))
    for a, b in zip(runs["cleaned"].trajectories, runs["sampled"].trajectories):
        assert (a.replies, a.turn_rewards, a.success) == (b.replies, b.turn_rewards, b.success)
        assert [i["actions"] for i in a.infos] == [i["actions"] for i in b.infos]
        # The same first prompt; "cleaned" counts the prefix as the reply's start, "sampled" as the prompt's end.
        assert a.input_ids[: a.turn_spans[0][0]] == b.input_ids[: b.turn_spans[0][0] - prefix_len]


def test_bad_reply_tokens_values_are_refused(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, _by_call(RAW))
    for bad in ("raw", "Cleaned", None, 1):
        with pytest.raises(ValueError, match=r"reply_tokens.*'cleaned'.*'sampled'"):  # checked where they are made
            replace(latest_rollout(), reply_tokens=bad)
    with pytest.raises(ValueError, match=r"settings.*RolloutSettings"):
        TokenAgent(engine, tiny_tokenizer, PARAMS, settings={"reply_tokens": "cleaned"})


# ---------------------------------------------------------------------------------------------- a real engine
def test_cleaned_rollouts_with_the_hf_engine_do_not_depend_on_its_cache(tiny_model, tiny_tokenizer):
    """The tiny random model's replies are re-tokenised (their ids rarely survive), so the HF engine's parked caches
    mostly miss; its trajectories equal those of an engine without a cache and of ``model.generate``."""
    kwargs = {"sampling": SamplingParams(temperature=0, max_new_tokens=12),
              "env_kwargs": {"protocol": {"stop_after_answer": False, "max_turns": 3}}}  # fmt: skip

    def signature(engine):
        batch = collect_rollouts(engine, tiny_tokenizer, "ragen/FrozenLake-v0", [0, 1], 2, settings=latest_rollout(),
                                 **kwargs)
        return [(t.input_ids, t.loss_mask, t.turn_spans, t.replies, t.turn_rewards) for t in batch.trajectories]

    cached = signature(HFEngine(tiny_model, tiny_tokenizer, batch_size=4))
    assert cached == signature(HFEngine(tiny_model, tiny_tokenizer, max_parked_tokens=0))
    assert cached == signature(GenerateEngine(tiny_model, tiny_tokenizer))
    assert any(len(spans) > 1 for _, _, spans, _, _ in cached)  # multi-turn: later prompts continue trained ids
    for ids, mask, spans, replies, _ in cached:
        for (start, end), reply in zip(spans, replies):
            assert mask[start:end] == [1] * (end - start)
            assert tiny_tokenizer.decode(ids[start:end], skip_special_tokens=True).startswith("<think>")
