"""An OpenAI-compatible HTTP client (``POST {base_url}/chat/completions``) for evaluating hosted or served models.

Works with any server that speaks the Chat Completions API: OpenAI, vLLM's and SGLang's OpenAI servers, llama.cpp's
``llama-server``, Ollama, LM Studio, TGI. Standard library only (``urllib``), one request per conversation, several in
flight at once (``concurrency``), retries with exponential backoff on connection errors, 429 and 5xx.

This is a *chat engine*: it sends messages and gets text back, without token ids or log-probabilities, so its
trajectories are for evaluation only (the rollout re-tokenises the text and flags them ``eval_only``).
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
from ragen_trainer.engines.base import FINISH_LENGTH, FINISH_STOP, GenerationEngine, GenerationResult, SamplingParams

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIEngineError(RuntimeError):
    """The endpoint refused or failed a request; the message carries the HTTP status and the server's own words."""


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
    ) -> None:
        check_arg(isinstance(model, str) and model.strip() != "", "model", model, "the model name the server serves")
        parsed = urllib.parse.urlparse(base_url if isinstance(base_url, str) else "")
        check_arg(
            parsed.scheme in ("http", "https") and bool(parsed.netloc),
            "base_url",
            base_url,
            "an http(s) URL such as 'http://127.0.0.1:8000/v1'",
        )
        check_arg(isinstance(timeout, (int, float)) and timeout > 0, "timeout", timeout, "a number of seconds > 0")
        check_arg(isinstance(max_retries, int) and max_retries >= 0, "max_retries", max_retries, "an int >= 0")
        check_arg(isinstance(concurrency, int) and concurrency >= 1, "concurrency", concurrency, "an int >= 1")
        check_arg(isinstance(backoff, (int, float)) and backoff >= 0, "backoff", backoff, "a number of seconds >= 0")
        check_arg(extra_body is None or isinstance(extra_body, dict), "extra_body", extra_body, "None or a dict")
        self.model = model
        self.base_url = base_url.rstrip("/")
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
        if len(bodies) <= 1 or self.concurrency == 1:
            return [self._complete(body) for body in bodies]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(bodies))) as pool:
            return list(pool.map(self._complete, bodies))

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
        body.update(self.extra_body)
        return body

    def _complete(self, body: dict[str, Any]) -> GenerationResult:
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
        finish = FINISH_LENGTH if choice.get("finish_reason") == "length" else FINISH_STOP
        return GenerationResult(token_ids=[], text=str(text), logprobs=None, finish_reason=finish)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.base_url + path
        payload = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(url, data=payload, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return json.loads(response.read().decode("utf-8"))
            except urllib.error.HTTPError as exc:
                detail = _error_detail(exc)
                last_error = f"HTTP {exc.code}: {detail}"
                if exc.code not in _RETRY_STATUS:
                    raise OpenAIEngineError(f"{url} refused the request ({last_error})") from exc
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                last_error = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
            except json.JSONDecodeError as exc:
                raise OpenAIEngineError(f"{url} answered with something that is not JSON ({exc})") from exc
        raise OpenAIEngineError(f"{url} failed after {self.max_retries + 1} attempt(s); last error: {last_error}")


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
