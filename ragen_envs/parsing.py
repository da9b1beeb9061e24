"""Parse a model's reply into its thinking and its actions.

The reply format of the paper is ``<think>...</think><answer>a1 || a2 || ...</answer>``; with thinking off it is
``<answer>a1 || a2</answer>`` (or, with ``bare_answers=True``, leniently, the bare actions). Like the reference code, the first well-formed
``<think>``/``<answer>`` pair is used and text around it is ignored; unlike a regular expression with backtracking,
parsing is a few linear ``str.find`` scans, so a megabyte reply costs milliseconds. Nothing in a reply is executed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Chat-template control tokens that models sometimes leak into a reply; removed before parsing.
SPECIAL_TOKENS: tuple[str, ...] = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")


@dataclass
class ParsedReply:
    """The parts of one reply.

    ``format_ok`` is ``False`` when the required tags are missing or the answer holds no action; ``reason`` then says
    why in words that can be shown to the model.
    """

    think: str = ""
    answer: str = ""
    actions: list[str] = field(default_factory=list)
    format_ok: bool = False
    reason: str | None = None


def _between(text: str, open_tag: str, close_tag: str, start: int = 0) -> tuple[str, int] | None:
    """The text between the first ``open_tag`` at/after ``start`` and the next ``close_tag``, and the end index."""
    i = text.find(open_tag, start)
    if i < 0:
        return None
    j = text.find(close_tag, i + len(open_tag))
    if j < 0:
        return None
    return text[i + len(open_tag) : j], j + len(close_tag)


def split_actions(answer: str, separator: str) -> list[str]:
    """Split an answer on ``separator`` into stripped, non-empty action strings."""
    return [part.strip() for part in answer.split(separator) if part.strip()]


def parse_reply(
    reply: str, *, enable_think: bool = True, separator: str = "||", bare_answers: bool = False
) -> ParsedReply:
    """Parse ``reply``; never raises on any string.

    >>> parse_reply("<think>box left of me</think><answer>Left || Up</answer>").actions
    ['Left', 'Up']
    """
    if not isinstance(reply, str):
        return ParsedReply(reason=f"reply must be text, got {type(reply).__name__}")
    text = reply
    for token in SPECIAL_TOKENS:
        if token in text:
            text = text.replace(token, "")

    think = ""
    search_from = 0
    if enable_think:
        found = _between(text, "<think>", "</think>")
        if found is None:
            return ParsedReply(reason="missing <think>...</think> block; reply as <think>...</think><answer>...</answer>")
        think, search_from = found
        # The answer must follow the thinking, separated by whitespace at most (as the reference's regex requires).
        rest = text[search_from:]
        if not rest.lstrip().startswith("<answer>"):
            return ParsedReply(
                think=think.strip(),
                reason="the <answer>...</answer> block must directly follow </think>",
            )
    found = _between(text, "<answer>", "</answer>", search_from)
    if found is None:
        if enable_think or not bare_answers or "<answer>" in text:
            return ParsedReply(think=think.strip(), reason="missing or unclosed <answer>...</answer> block")
        answer = text  # thinking off and bare answers allowed: the whole reply is the answer
    else:
        answer = found[0]
    if "<answer>" in answer or "<think>" in answer:
        return ParsedReply(think=think.strip(), answer=answer, reason="nested tags inside <answer>")
    actions = split_actions(answer, separator)
    if not actions:
        return ParsedReply(think=think.strip(), answer=answer, reason="the answer holds no action")
    return ParsedReply(think=think.strip(), answer=answer.strip(), actions=actions, format_ok=True)
