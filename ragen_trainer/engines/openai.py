"""An OpenAI-compatible HTTP client (``POST {base_url}/chat/completions``) for evaluating hosted or served models.

Works with any server that speaks the Chat Completions API: OpenAI, vLLM's and SGLang's OpenAI servers, llama.cpp's
``llama-server``, Ollama, LM Studio, TGI. Standard library only (``urllib``), one request per conversation, several in
flight at once (``concurrency``), retries with exponential backoff on connection errors, 429 and 5xx.

This is a *chat engine*: it sends messages and gets text back, without token ids or log-probabilities, so its
trajectories are for evaluation only (the rollout re-tokenises the text and flags them ``eval_only``).

Stop strings (``SamplingParams.stop``, e.g. ``"</answer>"``). The reply must end right after its first stop string,
which stays in its text. Servers disagree on that last part, so the reply is settled here, in this order:

1. The stop strings are sent as ``"stop"`` (unless ``send_stop=False``), so the server stops there and does not spend
   tokens past it.
2. The text is cut locally after its first stop string (:func:`~ragen_trainer.engines.base.cut_at_stop`): a server
   that ignores ``stop``, or keeps it and the rest of the token that completed it (``transformers serve`` does), gives
   the same reply as one that honours it. Finish reason: ``"stop"``.
3. No stop string in the text, the server says ``finish_reason="stop"``, and stop strings were sent: OpenAI-compatible
   servers *strip* the stop string from the text, so it is put back when the server says it stopped on it:

   * the choice has vLLM's ``stop_reason`` (or SGLang's ``matched_stop``): it is appended when that is one of the stop
     strings; ``None`` (end of sequence) or a token id means the model ended by itself, and nothing is appended;
   * the server gives no such field (OpenAI, llama.cpp, Ollama, ...): a ``"stop"`` is ambiguous (stop string or the
     model's own end of turn). With exactly one stop string it is appended: a model that follows the reply format
     reaches its closing tag before its end-of-turn token, so this is right for every well-formed reply; the price is
     that a reply the model ended early (``"<answer>Dragon"`` + end of turn) gets a closing tag it never wrote. With
     several stop strings nothing is appended (which one ended the reply is unknown).

   ``restore_stop=False`` turns that guess off, for servers that keep the stop string in the text (``transformers
   serve``): there a ``"stop"`` without it in the text is the model's own end. ``send_stop=False`` avoids the question
   altogether: the server generates to its own end and step 2 alone decides (exact, but the tokens after the stop
   string are generated and billed).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ragen_envs.core import check_arg
from ragen_trainer.engines.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationEngine,
    GenerationResult,
    SamplingParams,
    cut_at_stop,
)

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIEngineError(RuntimeError):
    """The endpoint refused or failed a request; the message carries the HTTP status and the server's own words.

    ``status``: the HTTP status of a refusal (a 4xx, or a 5xx that is not retried), else ``None``."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class OpenAIEngine(GenerationEngine):
    """Chat completions over HTTP.

    Args:
        model: the model name the server expects (``"gpt-4o-mini"``, the served model's id, ...).
        base_url: the API root, up to and including ``/v1`` (``https://api.openai.com/v1``,
            ``http://127.0.0.1:8000/v1``).
        api_key: sent as ``Authorization: Bearer ...``; default ``$OPENAI_API_KEY`` (none for local servers).
        timeout: seconds per request.
        max_retries: retries after a connection error, 429 or 5xx (exponential backoff from ``backoff`` seconds).
        concurrency: requests in flight at once.
        extra_body: more JSON fields for every request (e.g. ``{"repetition_penalty": 1.0}`` for vLLM).
        send_top_k: send ``top_k`` when it is > 0 (OpenAI itself rejects the field; vLLM, llama.cpp, Ollama accept it).
        max_tokens_field: the request field for the reply length: ``max_tokens`` (most servers) or
            ``max_completion_tokens`` (OpenAI's newer models).
        send_stop: send ``SamplingParams.stop`` as the request's ``stop`` (default). ``False``: the stop strings are
            only applied here, to the returned text (for servers or models that refuse ``stop``, or to avoid the
            ambiguity described in the module docstring).
        restore_stop: put a stop string back on a reply the server ended with ``finish_reason="stop"`` without it and
            without saying why (default, right for servers that strip it: OpenAI, llama.cpp, Ollama); ``False`` for
            servers that keep it (``transformers serve``). A ``stop_reason`` from the server is followed either way.
    """

    supports_token_ids = False
    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str = "https://api.openai.com/v1",
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 3,
        concurrency: int = 4,
        backoff: float = 1.0,
        extra_body: dict[str, Any] | None = None,
        send_top_k: bool = True,
        max_tokens_field: str = "max_tokens",
        send_stop: bool = True,
        restore_stop: bool = True,
    ) -> None:
        check_arg(isinstance(model, str) and model.strip() != "", "model", model, "the model name the server serves")
        base_url = check_http_url(base_url, "an http(s) URL such as 'http://127.0.0.1:8000/v1'")
        check_arg(isinstance(timeout, (int, float)) and timeout > 0, "timeout", timeout, "a number of seconds > 0")
        check_arg(isinstance(max_retries, int) and max_retries >= 0, "max_retries", max_retries, "an int >= 0")
        check_arg(isinstance(concurrency, int) and concurrency >= 1, "concurrency", concurrency, "an int >= 1")
        check_arg(isinstance(backoff, (int, float)) and backoff >= 0, "backoff", backoff, "a number of seconds >= 0")
        check_arg(extra_body is None or isinstance(extra_body, dict), "extra_body", extra_body, "None or a dict")
        self.model = model
        self.base_url = base_url
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.backoff = float(backoff)
        self.extra_body = dict(extra_body or {})
        self.send_top_k = send_top_k
        check_arg(
            max_tokens_field in ("max_tokens", "max_completion_tokens"),
            "max_tokens_field",
            max_tokens_field,
            "'max_tokens' or 'max_completion_tokens' (OpenAI's reasoning models want the latter)",
        )
        self.max_tokens_field = max_tokens_field
        check_arg(isinstance(send_stop, bool), "send_stop", send_stop, "True or False")
        self.send_stop = send_stop
        check_arg(isinstance(restore_stop, bool), "restore_stop", restore_stop, "True or False")
        self.restore_stop = restore_stop
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0}

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        raise NotImplementedError(
            "OpenAIEngine is a chat engine: it takes messages (generate_chat), not token ids, and its replies cannot "
            "be trained on. Use HFEngine or VLLMEngine for training."
        )

    def generate_chat(
        self, messages_batch: list[list[dict[str, str]]], params: SamplingParams
    ) -> list[GenerationResult]:
        check_arg(isinstance(params, SamplingParams), "params", type(params).__name__, "a SamplingParams")
        bodies = [self._body(messages, params, row) for row, messages in enumerate(messages_batch)]

        def complete(body: dict[str, Any]) -> GenerationResult:
            return self._complete(body, params.stop)

        if len(bodies) <= 1 or self.concurrency == 1:
            return [complete(body) for body in bodies]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(bodies))) as pool:
            return list(pool.map(complete, bodies))

    def _body(self, messages: list[dict[str, str]], params: SamplingParams, row: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "temperature": params.temperature,
            "top_p": params.top_p,
            self.max_tokens_field: params.max_new_tokens,
            "n": 1,
        }
        if params.seed is not None:
            # One seed per conversation: the N rollouts of a group share their first prompt and must still differ.
            body["seed"] = params.seed + row
        if self.send_top_k and params.top_k > 0:
            body["top_k"] = params.top_k
        if self.send_stop and params.stop:
            body["stop"] = list(params.stop)
        body.update(self.extra_body)
        return body

    def _complete(self, body: dict[str, Any], stop: tuple[str, ...] = ()) -> GenerationResult:
        data = self._post("/chat/completions", body)
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise OpenAIEngineError(
                f"unexpected response from {self.base_url}/chat/completions: {str(data)[:300]}"
            ) from exc
        usage = data.get("usage") or {}
        self.usage["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
        self.usage["completion_tokens"] += int(usage.get("completion_tokens") or 0)
        self.usage["requests"] += 1
        text, finish = settle_stop(str(text), choice, stop, sent="stop" in body, guess=self.restore_stop)
        return GenerationResult(token_ids=[], text=text, logprobs=None, finish_reason=finish)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return post_json(
            self.base_url + path,
            body,
            api_key=self.api_key,
            timeout=self.timeout,
            max_retries=self.max_retries,
            backoff=self.backoff,
        )


def check_http_url(base_url: Any, accepted: str) -> str:
    """``base_url`` without a trailing slash, or a ``ValueError`` saying what is accepted."""
    parsed = urllib.parse.urlparse(base_url if isinstance(base_url, str) else "")
    check_arg(parsed.scheme in ("http", "https") and bool(parsed.netloc), "base_url", base_url, accepted)
    return base_url.rstrip("/")


def settle_stop(
    text: str, choice: dict[str, Any], stop: tuple[str, ...], *, sent: bool, guess: bool = True
) -> tuple[str, str]:
    """The reply text and finish reason of one chat choice under the stop-string rule of the module docstring.

    ``sent``: the request carried the stop strings (the server may have stripped one from the text); ``guess``: when
    the server does not say what it stopped on, take a bare ``"stop"`` for the only stop string."""
    server_finish = choice.get("finish_reason")
    if stop:
        text, found = cut_at_stop(text, stop)
        if found:
            return text, FINISH_STOP
        if sent and server_finish == "stop":
            return text + (_stripped_stop(choice, stop, guess) or ""), FINISH_STOP
    return text, FINISH_LENGTH if server_finish == "length" else FINISH_STOP


def _stripped_stop(choice: dict[str, Any], stop: tuple[str, ...], guess: bool) -> str | None:
    """The stop string a server stopped on and left out of the text, or ``None`` (see the module docstring)."""
    for field in ("stop_reason", "matched_stop"):  # vLLM, SGLang: the string, a token id, or None (end of sequence)
        if field in choice:
            reason = choice[field]
            return reason if isinstance(reason, str) and reason in stop else None
    return stop[0] if guess and len(stop) == 1 else None


def post_json(
    url: str,
    body: dict[str, Any],
    *,
    api_key: str | None = None,
    timeout: float = 120.0,
    max_retries: int = 3,
    backoff: float = 1.0,
) -> dict[str, Any]:
    """POST ``body`` as JSON and return the JSON answer; retries (exponential backoff from ``backoff`` seconds) after a
    connection error, 429 or 5xx, and raises :class:`OpenAIEngineError` with the server's own words otherwise.
    Standard library only, shared by the OpenAI-protocol engines."""
    payload = json.dumps(body).encode("utf-8")
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    last_error = ""
    for attempt in range(max_retries + 1):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        request = urllib.request.Request(url, data=payload, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            detail = _error_detail(exc)
            last_error = f"HTTP {exc.code}: {detail}"
            if exc.code not in _RETRY_STATUS:
                raise OpenAIEngineError(f"{url} refused the request ({last_error})", status=exc.code) from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            last_error = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        except json.JSONDecodeError as exc:
            raise OpenAIEngineError(f"{url} answered with something that is not JSON ({exc})") from exc
    raise OpenAIEngineError(f"{url} failed after {max_retries + 1} attempt(s); last error: {last_error}")


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        raw = exc.read().decode("utf-8", errors="replace")
    except OSError:
        return str(exc.reason)
    try:
        data = json.loads(raw)
        error = data.get("error", data)
        if isinstance(error, dict):
            return str(error.get("message") or error)[:500]
        return str(error)[:500]
    except (ValueError, AttributeError):
        return raw[:500] or str(exc.reason)
