"""parse_reply: the reply format of the paper, with and without thinking, and every way a reply can be malformed."""

from __future__ import annotations

import pytest

from ragen_envs.parsing import ParsedReply, parse_reply, split_actions


def test_well_formed_reply():
    p = parse_reply("<think>box is left</think><answer>Left || Up</answer>")
    assert p.format_ok and p.reason is None
    assert p.think == "box is left"
    assert p.actions == ["Left", "Up"]


def test_whitespace_between_think_and_answer_is_allowed_text_around_ignored():
    p = parse_reply("Sure!\n<think> a </think>\n  <answer> Down </answer> trailing")
    assert p.format_ok and p.actions == ["Down"] and p.think == "a"


def test_first_pair_is_used():
    p = parse_reply("<think>x</think><answer>Left</answer><think>y</think><answer>Up</answer>")
    assert p.actions == ["Left"]


@pytest.mark.parametrize(
    "reply, reason_part",
    [
        ("", "missing <think>"),
        ("<answer>Left</answer>", "missing <think>"),
        ("<think>unclosed <answer>Left</answer>", "missing <think>"),
        ("<think>x</think> some text <answer>Left</answer>", "directly follow"),
        ("<think>x</think><answer>Left", "unclosed <answer>"),
        ("<think>x</think><answer></answer>", "no action"),
        ("<think>x</think><answer> || || </answer>", "no action"),
        ("<think>x</think><answer><answer>Left</answer></answer>", "nested"),
    ],
)
def test_malformed_replies_have_a_reason(reply, reason_part):
    p = parse_reply(reply)
    assert not p.format_ok
    assert p.actions == []
    assert reason_part in p.reason


def test_non_string_reply():
    p = parse_reply(None)  # type: ignore[arg-type]
    assert not p.format_ok and "must be text" in p.reason


def test_special_tokens_are_removed():
    p = parse_reply("<|im_start|><think>t</think><answer>Up<|im_end|></answer><|endoftext|>")
    assert p.format_ok and p.actions == ["Up"]


def test_thinking_off_accepts_answer_tags_and_bare_actions_only_when_asked():
    assert parse_reply("<answer>Left || Up</answer>", enable_think=False).actions == ["Left", "Up"]
    assert not parse_reply("Left || Up", enable_think=False).format_ok  # the reference requires the tags
    bare = parse_reply("Left || Up", enable_think=False, bare_answers=True)
    assert bare.format_ok and bare.actions == ["Left", "Up"] and bare.think == ""
    # An opened but unclosed answer tag is still malformed with thinking off.
    assert not parse_reply("<answer>Left", enable_think=False, bare_answers=True).format_ok
    assert not parse_reply("   ", enable_think=False, bare_answers=True).format_ok


def test_custom_separator():
    p = parse_reply("<think>t</think><answer>Left, Up ,Down</answer>", separator=",")
    assert p.actions == ["Left", "Up", "Down"]
    assert split_actions("a ; b;;c", ";") == ["a", "b", "c"]


def test_megabyte_reply_is_parsed_without_error():
    big = "<think>" + "x" * 1_000_000 + "</think><answer>Left</answer>"
    p = parse_reply(big)
    assert p.format_ok and p.actions == ["Left"] and len(p.think) == 1_000_000
    unclosed = "<think>" + "<answer>" * 100_000
    assert not parse_reply(unclosed).format_ok


def test_parsed_reply_defaults():
    p = ParsedReply()
    assert p.actions == [] and not p.format_ok and p.reason is None
