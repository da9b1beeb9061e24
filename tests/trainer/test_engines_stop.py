"""Stop strings in the non-HF engines (``SamplingParams.stop``): what is sent, and the reply that comes back.

The rule (see :mod:`ragen_trainer.engines.base`): a reply ends right after its first stop string, which stays in its
text; its last token is the one that completed the string, and its log-probs stay aligned with its tokens; the finish
reason is ``"stop"``. vLLM is replaced by stand-ins with its output shapes (``vllm.LLM``, TRL's ``VLLMClient``, a
``vllm serve`` HTTP server), and the OpenAI-compatible chat servers by a local HTTP server that answers like each kind
(vLLM's ``stop_reason``, OpenAI's bare ``finish_reason``, ``transformers serve`` keeping the string).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")

from ragen_trainer.engines.base import SamplingParams
from ragen_trainer.engines.openai import OpenAIEngine, OpenAIEngineError, settle_stop
from ragen_trainer.engines.vllm import (
    VLLMEngine,
    openai_completion_body,
    parse_openai_completion,
    vllm_sampling_kwargs,
)
from tests.trainer.conftest import JSONServer

ANSWER = "</answer>"


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _logprobs(ids: list[int]) -> list[float]:
    """Distinct log-probs, so a misaligned cut shows: position i gets -(i + 1) / 10."""
    return [-(i + 1) / 10 for i in range(len(ids))]


# ------------------------------------------------------------------------------------------------ vLLM colocate
class _FakeLLM:
    """Stands in for ``vllm.LLM``: answers every prompt with ``completion`` (token ids), with vLLM's output shapes
    (``logprobs``: one ``{token_id: Logprob}`` dict per position)."""

    def __init__(self, completion: list[int], finish_reason: str = "stop") -> None:
        self.completion, self.finish_reason = completion, finish_reason
        self.calls: list[tuple[list, list]] = []

    def generate(self, prompts: list, sampling_params: list, use_tqdm: bool) -> list:
        self.calls.append((prompts, sampling_params))
        steps = [{t: SimpleNamespace(logprob=lp), t + 1: SimpleNamespace(logprob=-50.0)} for t, lp in self._pairs()]
        out = SimpleNamespace(token_ids=list(self.completion), logprobs=steps, finish_reason=self.finish_reason)
        return [SimpleNamespace(outputs=[out]) for _ in prompts]

    def _pairs(self) -> list[tuple[int, float]]:
        return list(zip(self.completion, _logprobs(self.completion)))


def test_vllm_sampling_kwargs_carry_the_stop_strings():
    kwargs = vllm_sampling_kwargs(SamplingParams(stop=(ANSWER, "</think>")), [2], 7)
    assert kwargs["stop"] == [ANSWER, "</think>"] and kwargs["include_stop_str_in_output"] is True
    assert kwargs["stop_token_ids"] == [2] and kwargs["seed"] == 7
    assert vllm_sampling_kwargs(SamplingParams(), [2], None)["stop"] == []  # none: vLLM stops on tokens only


def test_vllm_colocate_keeps_the_stop_string_and_its_token(tiny_tokenizer):
    tok = tiny_tokenizer
    reply = _ids(tok, "<answer>Dragon</answer>")  # what vLLM returns when it honours stop: ends with '>'
    llm = _FakeLLM(reply)
    engine = VLLMEngine("tiny", tok, llm=llm, sampling_params_factory=dict)
    [result] = engine.generate([[1, 2]], SamplingParams(stop=(ANSWER,), max_new_tokens=32))
    sent = llm.calls[0][1][0]
    assert sent["stop"] == [ANSWER] and sent["include_stop_str_in_output"] is True
    assert result.token_ids == reply and result.logprobs == _logprobs(reply)
    assert result.text == "<answer>Dragon</answer>" and result.finish_reason == "stop"


def test_vllm_colocate_cuts_tokens_and_logprobs_together_when_vllm_went_past_the_stop(tiny_tokenizer):
    tok = tiny_tokenizer
    head = _ids(tok, "<answer>Dragon</answer>")
    reply = head + _ids(tok, "\nmore text") + [tok.eos_token_id]  # a vLLM that ignored stop
    llm = _FakeLLM(reply, finish_reason="stop")
    engine = VLLMEngine("tiny", tok, llm=llm, sampling_params_factory=dict)
    [result] = engine.generate([[1]], SamplingParams(stop=(ANSWER,)))
    assert result.token_ids == head
    assert result.logprobs == _logprobs(reply)[: len(head)]  # the same positions: aligned with the kept tokens
    assert result.text.endswith(ANSWER) and result.finish_reason == "stop"


def test_vllm_colocate_stop_inside_a_token_keeps_the_token_and_cuts_the_text(tiny_tokenizer):
    """'Dragon' is one token: the stop string 'Drag' ends inside it. The token stays (it was sampled), the text ends
    with the stop string."""
    tok = tiny_tokenizer
    reply = _ids(tok, "<answer>Dragon</answer>") + [tok.eos_token_id]
    dragon = reply.index(_ids(tok, "Dragon")[0])
    engine = VLLMEngine("tiny", tok, llm=_FakeLLM(reply, finish_reason="length"), sampling_params_factory=dict)
    [result] = engine.generate([[1]], SamplingParams(stop=("Drag",)))
    assert result.token_ids == reply[: dragon + 1] and result.logprobs == _logprobs(reply)[: dragon + 1]
    assert result.text == "<answer>Drag" and result.finish_reason == "stop"


def test_vllm_colocate_earliest_of_several_stop_strings_wins(tiny_tokenizer):
    tok = tiny_tokenizer
    reply = _ids(tok, "<think>x</think><answer>Left</answer>")
    engine = VLLMEngine("tiny", tok, llm=_FakeLLM(reply), sampling_params_factory=dict)
    [result] = engine.generate([[1]], SamplingParams(stop=(ANSWER, "</think>")))
    # '</think>' is completed by the token '><', which also carries the '<' of '<answer>': kept as a token, cut from
    # the text.
    assert result.text == "<think>x</think>"
    assert tok.decode(result.token_ids).startswith("<think>x</think>") and len(result.token_ids) < len(reply)
    assert result.logprobs == _logprobs(reply)[: len(result.token_ids)]


def test_vllm_colocate_without_stop_strings_is_unchanged(tiny_tokenizer):
    tok = tiny_tokenizer
    reply = _ids(tok, "<answer>Dragon</answer>") + [tok.eos_token_id]
    engine = VLLMEngine("tiny", tok, llm=_FakeLLM(reply), sampling_params_factory=dict)
    [result] = engine.generate([[1]], SamplingParams())
    assert result.token_ids == reply and result.text == "<answer>Dragon</answer>" and result.finish_reason == "stop"
    [result] = engine.generate([[1]], SamplingParams(stop=("Phoenix",)))  # a stop string that never comes
    assert result.token_ids == reply and result.finish_reason == "stop"


def test_vllm_colocate_builds_its_llm_with_prefix_caching(tiny_tokenizer, monkeypatch):
    built: list[dict] = []
    fake_vllm = SimpleNamespace(LLM=lambda **kw: built.append(kw) or SimpleNamespace(), SamplingParams=dict)
    monkeypatch.setattr("ragen_trainer.engines.vllm.require_vllm", lambda: fake_vllm)
    VLLMEngine("tiny", tiny_tokenizer)
    assert built[0]["enable_prefix_caching"] is True and built[0]["model"] == "tiny"
    VLLMEngine("tiny", tiny_tokenizer, llm_kwargs={"enable_prefix_caching": False})  # the caller's word wins
    assert built[1]["enable_prefix_caching"] is False


# ------------------------------------------------------------------------------------------------ vLLM server (TRL)
class _FakeClient:
    """Stands in for TRL's ``VLLMClient``: ``generate`` returns ``completion`` for every prompt, with TRL's shapes."""

    def __init__(self, completion: list[int]) -> None:
        self.completion = completion
        self.calls: list[tuple[list, dict]] = []

    def generate(self, prompts: list, **kwargs: Any) -> dict:
        self.calls.append((prompts, kwargs))
        return {
            "completion_ids": [list(self.completion) for _ in prompts],
            "logprobs": [[[lp] for lp in _logprobs(self.completion)] for _ in prompts],
        }


def test_vllm_server_mode_sends_stop_strings_and_cuts_replies(tiny_tokenizer):
    tok = tiny_tokenizer
    head = _ids(tok, "<answer>Dragon</answer>")
    reply = head + _ids(tok, "\n") + [tok.eos_token_id]
    client = _FakeClient(reply)
    engine = VLLMEngine("tiny", tok, mode="server", client=client, sampling_params_factory=dict)
    results = engine.generate([[1], [2]], SamplingParams(stop=(ANSWER,), seed=3))
    for _, kwargs in client.calls:
        extra = kwargs["generation_kwargs"]
        assert extra["stop"] == [ANSWER] and extra["include_stop_str_in_output"] is True
    assert all(r.token_ids == head and r.logprobs == _logprobs(reply)[: len(head)] for r in results)
    assert all(r.text == "<answer>Dragon</answer>" and r.finish_reason == "stop" for r in results)
    client.calls.clear()
    engine.generate([[1]], SamplingParams())
    assert "stop" not in client.calls[0][1]["generation_kwargs"]  # nothing to send


# ------------------------------------------------------------------------------------------------ vLLM openai mode
def _vllm_serve(tokenizer: Any, *, return_token_ids: bool = True, tokens_as_ids: bool = True):
    """A stand-in for ``vllm serve``'s ``/v1/completions``: the reply is '<answer>Dragon</answer>' + eos, cut as
    vLLM cuts it (after the token completing a stop string, which stays when include_stop_str_in_output is set)."""
    full = _ids(tokenizer, "<answer>Dragon</answer>\n") + [tokenizer.eos_token_id]

    def respond(path: str, body: dict) -> tuple[int, dict]:
        if path != "/v1/completions":
            return 404, {"error": {"message": f"no route {path}"}}
        if not isinstance(body.get("prompt"), list):
            return 400, {"error": {"message": "prompt must be token ids here"}}
        ids, reason, stop_reason = list(full), "stop", None
        for n in range(1, len(full) + 1):
            text = tokenizer.decode(full[:n], skip_special_tokens=True)
            hit = next((s for s in body.get("stop") or [] if s in text), None)
            if hit is not None:
                ids, stop_reason = full[:n], hit
                break
        ids = ids[: body["max_tokens"]]
        if len(ids) == body["max_tokens"] and stop_reason is None and ids[-1] != tokenizer.eos_token_id:
            reason = "length"
        text = tokenizer.decode(ids, skip_special_tokens=True)
        if stop_reason and not body.get("include_stop_str_in_output"):
            text = text[: text.find(stop_reason)]
        lps = _logprobs(ids)
        tokens = [f"token_id:{t}" if tokens_as_ids else tokenizer.decode([t]) for t in ids]
        choice = {
            "index": 0,
            "text": text,
            "finish_reason": reason,
            "stop_reason": stop_reason,
            "logprobs": {
                "tokens": tokens,
                "token_logprobs": lps,
                "top_logprobs": [{k: v} for k, v in zip(tokens, lps)],
            },
        }
        if return_token_ids:
            choice["token_ids"] = ids
        return 200, {"id": "cmpl-1", "object": "text_completion", "model": body["model"], "choices": [choice]}

    return respond, full


def test_vllm_openai_mode_speaks_vllm_serve_completions(tiny_tokenizer):
    tok = tiny_tokenizer
    respond, _ = _vllm_serve(tok)
    with JSONServer(respond) as server:
        engine = VLLMEngine("served/tiny", tok, mode="openai", base_url=server.url, concurrency=3)
        params = SamplingParams(temperature=0.7, top_k=5, max_new_tokens=40, seed=11, stop=(ANSWER,))
        results = engine.generate([[5, 6, 7], [5, 6, 7], [8]], params)
    bodies = sorted((r["body"] for r in server.requests), key=lambda b: b["seed"])
    assert [b["seed"] for b in bodies] == [11, 12, 13]  # one request per prompt, each with its own seed
    assert sorted(map(tuple, (b["prompt"] for b in bodies))) == [(5, 6, 7), (5, 6, 7), (8,)]  # token ids, verbatim
    body = bodies[0]
    assert body["model"] == "served/tiny" and body["max_tokens"] == 40 and body["temperature"] == 0.7
    assert body["top_k"] == 5 and body["logprobs"] == 0 and body["n"] == 1
    assert body["stop"] == [ANSWER] and body["include_stop_str_in_output"] is True
    assert body["return_token_ids"] is True and body["return_tokens_as_token_ids"] is True
    assert tok.eos_token_id in body["stop_token_ids"] and body["skip_special_tokens"] is True
    head = _ids(tok, "<answer>Dragon</answer>")
    for r in results:
        assert r.token_ids == head and r.logprobs == _logprobs(head)
        assert r.text == "<answer>Dragon</answer>" and r.finish_reason == "stop"
    assert engine.supports_token_ids and not engine.supports_weight_updates


def test_vllm_openai_mode_reply_ends_on_eos_or_length(tiny_tokenizer):
    tok = tiny_tokenizer
    respond, full = _vllm_serve(tok)
    with JSONServer(respond) as server:
        engine = VLLMEngine("m", tok, mode="openai", base_url=server.url)
        [whole] = engine.generate([[1]], SamplingParams())  # no stop strings: runs to eos, which it keeps
        [short] = engine.generate([[1]], SamplingParams(max_new_tokens=3, top_k=0, seed=None))
        body = server.requests[-1]["body"]
    assert whole.token_ids == full and whole.finish_reason == "stop" and whole.text == "<answer>Dragon</answer>\n"
    assert short.token_ids == full[:3] and short.finish_reason == "length" and short.logprobs == _logprobs(full)[:3]
    assert "top_k" not in body and "seed" not in body and "stop" not in body  # off / unset: not sent


def test_vllm_openai_mode_reads_ids_from_logprob_tokens_of_older_servers(tiny_tokenizer):
    tok = tiny_tokenizer
    respond, _ = _vllm_serve(tok, return_token_ids=False)
    with JSONServer(respond) as server:
        engine = VLLMEngine("m", tok, mode="openai", base_url=server.url)
        [r] = engine.generate([[1]], SamplingParams(stop=(ANSWER,)))
    assert r.token_ids == _ids(tok, "<answer>Dragon</answer>") and r.text.endswith(ANSWER)
    respond, _ = _vllm_serve(tok, return_token_ids=False, tokens_as_ids=False)
    with JSONServer(respond) as server:
        engine = VLLMEngine("m", tok, mode="openai", base_url=server.url)
        with pytest.raises(OpenAIEngineError, match="return_tokens_as_token_ids"):
            engine.generate([[1]], SamplingParams())


def test_vllm_openai_mode_explains_a_server_that_is_not_vllm(tiny_tokenizer):
    def refuse(path: str, body: dict) -> tuple[int, dict]:
        return 422, {"detail": "Unexpected fields in the request: {'stop_token_ids'}"}

    with JSONServer(refuse) as server:
        engine = VLLMEngine("m", tiny_tokenizer, mode="openai", base_url=server.url, max_retries=0)
        with pytest.raises(OpenAIEngineError, match=r"422.*Unexpected fields.*vllm serve.*OpenAIEngine"):
            engine.generate([[1]], SamplingParams())


def test_vllm_openai_mode_refuses_weight_updates_and_bad_arguments(tiny_tokenizer, tiny_model):
    engine = VLLMEngine("m", tiny_tokenizer, mode="openai", base_url="http://127.0.0.1:9")  # nothing is contacted
    assert engine.base_url == "http://127.0.0.1:9/v1"  # a bare host:port gets vllm serve's API root
    assert VLLMEngine("m", tiny_tokenizer, mode="openai", base_url="http://h:1/api/v1/").base_url == "http://h:1/api/v1"
    with pytest.raises(NotImplementedError, match="mode='server'"):
        engine.update_weights(tiny_model)
    with pytest.raises(ValueError, match="base_url"):
        VLLMEngine("m", tiny_tokenizer, mode="openai")
    with pytest.raises(ValueError, match="base_url"):
        VLLMEngine("m", tiny_tokenizer, mode="openai", base_url="file:///etc/passwd")
    with pytest.raises(ValueError, match="served_model_name"):
        VLLMEngine("m", tiny_tokenizer, mode="openai", base_url="http://h:1", served_model_name=" ")
    with pytest.raises(ValueError, match="concurrency"):
        VLLMEngine("m", tiny_tokenizer, mode="openai", base_url="http://h:1", concurrency=0)
    assert VLLMEngine("m", tiny_tokenizer, mode="openai", base_url="http://h:1", served_model_name="x")._seeds(
        SamplingParams(seed=4), 2
    ) == [4, 5]


def test_openai_completion_body_and_parse_edge_cases():
    body = openai_completion_body("m", [3, 4], SamplingParams(), [2], None)
    assert body["prompt"] == [3, 4] and "stop" not in body and "include_stop_str_in_output" not in body
    url = "http://x/v1/completions"
    ids, lps, reason = parse_openai_completion({"choices": [{"token_ids": [1, 2], "finish_reason": "length"}]}, url)
    assert ids == [1, 2] and lps is None and reason == "length"  # no log-probs asked back: None, not zeros
    nan = {"choices": [{"token_ids": [1, 2], "logprobs": {"token_logprobs": [-0.1, None]}}]}
    assert parse_openai_completion(nan, url)[1] is None  # a position without a log-prob: none for the reply
    with pytest.raises(OpenAIEngineError, match="1 log-probs for 2 tokens"):
        parse_openai_completion({"choices": [{"token_ids": [1, 2], "logprobs": {"token_logprobs": [-0.1]}}]}, url)
    with pytest.raises(OpenAIEngineError, match="no token ids"):
        parse_openai_completion({"choices": [{"text": "hi"}]}, url)
    with pytest.raises(OpenAIEngineError, match="unexpected response"):
        parse_openai_completion({"error": "x"}, url)


# ------------------------------------------------------------------------------------------------ OpenAIEngine (chat)
def _chat_server(choice_for: Callable[[dict], dict]):
    def respond(path: str, body: dict) -> tuple[int, dict]:
        choice = {"index": 0, **choice_for(body)}
        return 200, {"id": "x", "object": "chat.completion", "model": body["model"], "choices": [choice]}

    return respond


def _chat(server: JSONServer, params: SamplingParams, **kwargs: Any) -> tuple[str, str]:
    engine = OpenAIEngine("m", server.url, backoff=0.0, **kwargs)
    [r] = engine.generate_chat([[{"role": "user", "content": "go"}]], params)
    return r.text, r.finish_reason


def test_openai_engine_sends_stop_strings_only_when_asked():
    reply = _chat_server(lambda body: {"finish_reason": "stop", "message": {"content": "ok"}})
    with JSONServer(reply) as server:
        _chat(server, SamplingParams(stop=(ANSWER, "</think>")))
        _chat(server, SamplingParams())
        _chat(server, SamplingParams(stop=(ANSWER,)), send_stop=False)
    sent = [r["body"] for r in server.requests]
    assert sent[0]["stop"] == [ANSWER, "</think>"] and "stop" not in sent[1] and "stop" not in sent[2]
    with pytest.raises(ValueError, match="send_stop"):
        OpenAIEngine("m", server.url, send_stop="yes")
    with pytest.raises(ValueError, match="restore_stop"):
        OpenAIEngine("m", server.url, restore_stop=None)


def test_openai_engine_puts_back_the_stop_string_vllm_stripped():
    """vLLM's chat server strips the stop string and names it in ``stop_reason``; ``None`` means end of sequence,
    an int a stop token: then nothing is appended."""
    answers = {
        "string": {"finish_reason": "stop", "stop_reason": ANSWER, "message": {"content": "<answer>Dragon"}},
        "eos": {"finish_reason": "stop", "stop_reason": None, "message": {"content": "<answer>Dragon"}},
        "token": {"finish_reason": "stop", "stop_reason": 2, "message": {"content": "<answer>Dragon"}},
        "sglang": {"finish_reason": "stop", "matched_stop": ANSWER, "message": {"content": "<answer>Dragon"}},
    }
    with JSONServer(_chat_server(lambda body: answers[body["messages"][-1]["content"]])) as server:
        engine = OpenAIEngine("m", server.url, backoff=0.0, concurrency=1)
        params = SamplingParams(stop=(ANSWER, "</think>"))
        texts = {k: engine.generate_chat([[{"role": "user", "content": k}]], params)[0].text for k in answers}
    assert texts == {
        "string": "<answer>Dragon</answer>",
        "eos": "<answer>Dragon",
        "token": "<answer>Dragon",
        "sglang": "<answer>Dragon</answer>",
    }


def test_openai_engine_bare_stop_finish_appends_only_an_unambiguous_stop_string():
    """OpenAI (and llama.cpp, Ollama) say only finish_reason='stop': with one stop string it is put back, with
    several nothing is (which one is unknown), and with send_stop=False the server never saw them."""
    stripped = {"finish_reason": "stop", "message": {"content": "<answer>Dragon"}}
    with JSONServer(_chat_server(lambda body: stripped)) as server:
        assert _chat(server, SamplingParams(stop=(ANSWER,))) == ("<answer>Dragon</answer>", "stop")
        assert _chat(server, SamplingParams(stop=(ANSWER, "</think>"))) == ("<answer>Dragon", "stop")
        assert _chat(server, SamplingParams(stop=(ANSWER,)), send_stop=False) == ("<answer>Dragon", "stop")
        assert _chat(server, SamplingParams()) == ("<answer>Dragon", "stop")
        # A server that keeps stop strings (transformers serve): a bare 'stop' without one is the model's own end.
        assert _chat(server, SamplingParams(stop=(ANSWER,)), restore_stop=False) == ("<answer>Dragon", "stop")
    named = {"finish_reason": "stop", "stop_reason": ANSWER, "message": {"content": "<answer>Dragon"}}
    with JSONServer(_chat_server(lambda body: named)) as server:  # the server's own word is followed either way
        assert _chat(server, SamplingParams(stop=(ANSWER,)), restore_stop=False) == ("<answer>Dragon</answer>", "stop")


def test_openai_engine_cuts_text_the_server_left_after_the_stop_string():
    """A server that keeps the stop string and the rest of its token (transformers serve), or ignores stop."""
    kept = {"finish_reason": "length", "message": {"content": "<answer>Dragon</answer>\nand then more"}}
    with JSONServer(_chat_server(lambda body: kept)) as server:
        assert _chat(server, SamplingParams(stop=(ANSWER,))) == ("<answer>Dragon</answer>", "stop")
        assert _chat(server, SamplingParams(stop=("then", ANSWER))) == ("<answer>Dragon</answer>", "stop")
        assert _chat(server, SamplingParams()) == ("<answer>Dragon</answer>\nand then more", "length")


def test_settle_stop_rules():
    stop = (ANSWER,)
    assert settle_stop("a</answer>b", {"finish_reason": "stop"}, stop, sent=True) == ("a</answer>", "stop")
    assert settle_stop("a", {"finish_reason": "length"}, stop, sent=True) == ("a", "length")  # cut by the limit
    assert settle_stop("a", {"finish_reason": "stop"}, stop, sent=False) == ("a", "stop")
    assert settle_stop("a", {"finish_reason": "stop"}, stop, sent=True) == ("a</answer>", "stop")
    assert settle_stop("a", {"finish_reason": "stop"}, stop, sent=True, guess=False) == ("a", "stop")
    assert settle_stop("a", {"finish_reason": "stop", "stop_reason": "other"}, stop, sent=True) == ("a", "stop")
    assert settle_stop("a", {"finish_reason": None}, (), sent=False) == ("a", "stop")
