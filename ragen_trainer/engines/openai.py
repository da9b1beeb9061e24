"""An OpenAI-compatible HTTP client (``POST {base_url}/chat/completions``) for evaluating hosted or served models.

Works with any server that speaks the Chat Completions API: OpenAI, vLLM's and SGLang's OpenAI servers, llama.cpp's
``llama-server``, Ollama, LM Studio, TGI. Standard library only (``urllib``), one request per conversation, several in
flight at once (``concurrency``).

Failures (:class:`RequestPolicy`). Every attempt has one deadline (``timeout``: from connecting to the answer's last
byte, not per socket read, so a server that trickles bytes or never answers cannot hold a request longer), and a
transient failure is retried (``max_retries`` times, after ``backoff`` seconds doubling up to ``max_backoff``, or the
server's ``Retry-After`` within that cap): HTTP 408, 409, 425, 429 and 5xx (but 501 and 505), a refused or reset
connection, an answer cut short (``IncompleteRead``), a bad status line, the deadline passing. Any other 4xx is the
server's refusal and is not retried. An answer that is not a completion (not UTF-8, not JSON, no choices) is an error
of that request; a malformed ``usage`` only leaves the token counts uncounted, the completion is kept.

In a session (:meth:`OpenAIEngine.session`, what the rollout and the evaluation use) a request that fails is that
request's result (``GenerationResult.error``): its episode ends with the reason and the others go on. After
``give_up_after`` replies in a row failed the endpoint is taken for down: the requests left fail at once, unsent, so a
dead endpoint costs seconds, not hours. :meth:`OpenAIEngine.generate_chat` raises the first failure instead. Requests
run in daemon threads; closing the session (or Ctrl-C in the thread that waits on it) shuts their sockets down and
waits for none of them.

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

import email.utils
import functools
import http.client
import json
import math
import os
import queue
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from ragen_envs.core import check_arg
from ragen_trainer.engines.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationEngine,
    GenerationRequest,
    GenerationResult,
    GenerationSession,
    SamplingParams,
    cut_at_stop,
)

#: Statuses worth another attempt: timeouts, conflicts, too early, too many requests, and server errors except "not
#: implemented" and "HTTP version not supported", which the same request will get again.
_RETRY_STATUS = frozenset({408, 409, 425, 429, *range(500, 600)}) - {501, 505}
#: Largest answer read (a chat completion is some KB; a server streaming without end is cut off here).
MAX_ANSWER_BYTES = 64 * 1024 * 1024
#: How often a thread waiting on requests wakes up (so that Ctrl-C reaches it at once).
_WAIT_SLICE = 0.25


class OpenAIEngineError(RuntimeError):
    """The endpoint refused or failed a request; the message carries the HTTP status and the server's own words.

    ``status``: the HTTP status of a refusal (a 4xx, or a 5xx that is not retried), else ``None``."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RequestPolicy:
    """How long a request may take and how often it is tried (see the module docstring)."""

    timeout: float = 120.0
    """Seconds one attempt may take, from connecting to the answer's last byte (not per socket read)."""
    max_retries: int = 3
    """Attempts after the first, for transient failures only."""
    backoff: float = 1.0
    """Seconds before the first retry; doubled for each next one."""
    max_backoff: float = 30.0
    """Longest wait between attempts, also for a server's ``Retry-After``."""
    give_up_after: int = 8
    """Replies failed in a row (after their retries) after which a session fails the rest unsent; 0: never."""

    def __post_init__(self) -> None:
        check_arg(_seconds(self.timeout, positive=True), "timeout", self.timeout, "a finite number of seconds > 0")
        check_arg(_count(self.max_retries), "max_retries", self.max_retries, "an int >= 0")
        check_arg(_seconds(self.backoff), "backoff", self.backoff, "a finite number of seconds >= 0")
        check_arg(_seconds(self.max_backoff), "max_backoff", self.max_backoff, "a finite number of seconds >= 0")
        check_arg(_count(self.give_up_after), "give_up_after", self.give_up_after, "an int >= 0 (0: never)")

    def wait_before(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before attempt number ``attempt`` (1 = the first retry)."""
        wait = self.backoff * 2 ** (attempt - 1)
        if retry_after is not None:
            wait = max(wait, retry_after)
        return min(wait, self.max_backoff)


def _seconds(value: Any, positive: bool = False) -> bool:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return ok and (value > 0 if positive else value >= 0)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class OpenAIEngine(GenerationEngine):
    """Chat completions over HTTP.

    Args:
        model: the model name the server expects (``"gpt-4o-mini"``, the served model's id, ...).
        base_url: the API root, up to and including ``/v1`` (``https://api.openai.com/v1``,
            ``http://127.0.0.1:8000/v1``).
        api_key: sent as ``Authorization: Bearer ...``; default ``$OPENAI_API_KEY`` (none for local servers).
        timeout: seconds one attempt of a request may take in all (connect, send, wait, read the whole answer).
        max_retries: retries after a transient failure (see the module docstring).
        concurrency: requests in flight at once.
        backoff: seconds before the first retry, doubling up to ``max_backoff`` (or the server's ``Retry-After``).
        give_up_after: in a session, after this many replies failed in a row the rest fail unsent (0: never).
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
        max_backoff: float = 30.0,
        give_up_after: int = 8,
        extra_body: dict[str, Any] | None = None,
        send_top_k: bool = True,
        max_tokens_field: str = "max_tokens",
        send_stop: bool = True,
        restore_stop: bool = True,
    ) -> None:
        check_arg(isinstance(model, str) and model.strip() != "", "model", model, "the model name the server serves")
        base_url = check_http_url(base_url, "an http(s) URL such as 'http://127.0.0.1:8000/v1'")
        check_arg(_count(concurrency) and concurrency >= 1, "concurrency", concurrency, "an int >= 1")
        check_arg(extra_body is None or isinstance(extra_body, dict), "extra_body", extra_body, "None or a dict")
        self.policy = RequestPolicy(timeout=timeout, max_retries=max_retries, backoff=backoff,
                                    max_backoff=max_backoff, give_up_after=give_up_after)  # fmt: skip
        self.model = model
        self.base_url = base_url
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.concurrency = concurrency
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
        self._lock = threading.Lock()
        self._failed_in_a_row = 0
        self._last_failure = ""

    # The policy's fields, under the names the engine has always had.
    timeout = property(lambda self: self.policy.timeout)
    max_retries = property(lambda self: self.policy.max_retries)
    backoff = property(lambda self: self.policy.backoff)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        raise NotImplementedError(
            "OpenAIEngine is a chat engine: it takes messages (generate_chat), not token ids, and its replies cannot "
            "be trained on. Use HFEngine or VLLMEngine for training."
        )

    def generate_chat(
        self, messages_batch: list[list[dict[str, str]]], params: SamplingParams
    ) -> list[GenerationResult]:
        """One reply per conversation, in order (``concurrency`` requests at once); raises
        :class:`OpenAIEngineError` for the first conversation that failed (a session gives per-request errors)."""
        check_arg(isinstance(params, SamplingParams), "params", type(params).__name__, "a SamplingParams")
        requests = [GenerationRequest(row, messages=messages) for row, messages in enumerate(messages_batch)]
        seeds = [None if params.seed is None else params.seed + row for row in range(len(requests))]
        with self.session(params) as session:
            for request, seed in zip(requests, seeds):
                session.submit(GenerationRequest(request.key, messages=request.messages, seed=seed))
            results: dict[Hashable, GenerationResult] = {}
            while session.busy:
                results.update(session.step())
        for row in range(len(requests)):
            if results[row].error is not None:
                raise OpenAIEngineError(results[row].error, status=session.statuses.get(row))
        return [results[row] for row in range(len(requests))]

    def session(self, params: SamplingParams) -> ChatSession:
        """A session whose requests run concurrently and fail one by one (see the module docstring)."""
        return ChatSession(self, params)

    def _body(self, messages: list[dict[str, str]], params: SamplingParams, seed: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "temperature": params.temperature,
            "top_p": params.top_p,
            self.max_tokens_field: params.max_new_tokens,
            "n": 1,
        }
        if seed is not None:  # one seed per conversation: the N rollouts of a group share their first prompt
            body["seed"] = seed
        if self.send_top_k and params.top_k > 0:
            body["top_k"] = params.top_k
        if self.send_stop and params.stop:
            body["stop"] = list(params.stop)
        body.update(self.extra_body)
        return body

    def _complete(self, body: dict[str, Any], stop: tuple[str, ...] = (), cancel: Cancel | None = None
                  ) -> GenerationResult:  # fmt: skip
        """One completion; :class:`OpenAIEngineError` when the endpoint fails it or answers no completion."""
        url = self.base_url + "/chat/completions"
        data = post_json(url, body, api_key=self.api_key, policy=self.policy, cancel=cancel)
        text, choice = _completion_text(data, url)
        self._count_usage(data.get("usage"))
        text, finish = settle_stop(text, choice, stop, sent="stop" in body, guess=self.restore_stop)
        return GenerationResult(token_ids=[], text=text, logprobs=None, finish_reason=finish)

    def _count_usage(self, usage: Any) -> None:
        """Add a completion's token counts; a missing or malformed ``usage`` leaves them uncounted (never an error:
        the completion itself is fine)."""
        counts = {}
        if isinstance(usage, dict):
            for key in ("prompt_tokens", "completion_tokens"):
                value = usage.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    counts[key] = max(int(value), 0)
        with self._lock:
            for key, value in counts.items():
                self.usage[key] += value
            self.usage["requests"] += 1

    # ---------------------------------------------------------------- the endpoint's health, for sessions
    def _note(self, error: str | None) -> None:
        with self._lock:
            if error is None:
                self._failed_in_a_row = 0
            else:
                self._failed_in_a_row += 1
                self._last_failure = error

    def _given_up(self) -> str | None:
        """Why requests are no longer sent (``give_up_after`` replies failed in a row), or ``None``."""
        limit = self.policy.give_up_after
        with self._lock:
            if limit and self._failed_in_a_row >= limit:
                return (f"not sent: the last {self._failed_in_a_row} requests to {self.base_url} failed in a row "
                        f"(the endpoint looks down; the last failure: {self._last_failure})")  # fmt: skip
        return None


def _completion_text(data: Any, url: str) -> tuple[str, dict[str, Any]]:
    """The reply text and the choice of a chat completion, or :class:`OpenAIEngineError` saying what it lacks."""
    choices = data.get("choices") if isinstance(data, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise OpenAIEngineError(f"{url} answered something that is not a chat completion (no choices[0].message): "
                                f"{_clip(json.dumps(data, ensure_ascii=False))}")  # fmt: skip
    content = message.get("content")
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    if content is not None and not isinstance(content, str):
        raise OpenAIEngineError(f"{url} answered a completion whose message content is not text: "
                                f"{_clip(json.dumps(content, ensure_ascii=False))}")  # fmt: skip
    return content or "", choice


class ChatSession(GenerationSession):
    """Requests of one play, run ``concurrency`` at a time in daemon threads; :meth:`step` returns those that
    finished (waiting for one at least). A request the endpoint failed comes back with ``error`` set. Each request's
    seed is its own (``GenerationRequest.seed``), so a reply does not depend on what else was in flight."""

    def __init__(self, engine: OpenAIEngine, params: SamplingParams) -> None:
        super().__init__(engine, params)
        self.engine: OpenAIEngine = engine
        self._queue: deque[GenerationRequest] = deque()
        self._running = 0
        self._done: queue.SimpleQueue[tuple[Hashable, GenerationResult, int | None]] = queue.SimpleQueue()
        self._cancel = Cancel()
        #: key -> HTTP status of a refused request (for generate_chat's error).
        self.statuses: dict[Hashable, int] = {}

    def submit(self, request: GenerationRequest) -> None:
        check_arg(request.messages is not None, "request", request, "a GenerationRequest with messages (a chat engine)")
        self._queue.append(request)

    @property
    def busy(self) -> bool:
        return bool(self._queue) or self._running > 0

    def step(self) -> list[tuple[Hashable, GenerationResult]]:
        self._start()
        if not self._running:
            return []
        finished = [self._wait()]
        while True:  # everything else that has finished meanwhile
            try:
                finished.append(self._done.get_nowait())
            except queue.Empty:
                break
        self._running -= len(finished)
        self._start()
        out = []
        for key, result, status in finished:
            if status is not None:
                self.statuses[key] = status
            out.append((key, result))
        return out

    def close(self) -> None:
        """Drop what is queued and abort what is in flight (sockets shut down); waits for nothing."""
        self._queue.clear()
        self._cancel.abort_all()

    def _wait(self) -> tuple[Hashable, GenerationResult, int | None]:
        # Short waits in a loop: the thread stays responsive to Ctrl-C whatever the requests are doing.
        while True:
            try:
                return self._done.get(timeout=_WAIT_SLICE)
            except queue.Empty:
                continue
            except BaseException:  # KeyboardInterrupt: nothing in flight may outlive the wait
                self.close()
                raise

    def _start(self) -> None:
        while self._queue and self._running < self.engine.concurrency:
            request = self._queue.popleft()
            self._running += 1
            threading.Thread(target=self._run, args=(request,), name="ragen-openai", daemon=True).start()

    def _run(self, request: GenerationRequest) -> None:
        engine, status = self.engine, None
        reason = engine._given_up()
        try:
            if reason is not None:
                result = _failed(reason)
            else:
                body = engine._body(request.messages or [], self.params, request.seed)
                try:
                    result = engine._complete(body, self.params.stop, self._cancel)
                    engine._note(None)
                except OpenAIEngineError as exc:
                    if not self._cancel.event.is_set():  # a cancelled request says nothing of the endpoint
                        engine._note(str(exc))
                    result, status = _failed(str(exc)), exc.status
        except BaseException as exc:  # noqa: BLE001 - a bug here must end this request, not hang the session
            result = _failed(f"{type(exc).__name__}: {exc}")
        self._done.put((request.key, result, status))


def _failed(reason: str) -> GenerationResult:
    return GenerationResult(token_ids=[], text="", logprobs=None, finish_reason=FINISH_STOP, error=reason)


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


# ------------------------------------------------------------------------------------------------ HTTP
class Cancel:
    """The attempts in flight of one caller, which another thread can abort at once (their sockets shut down)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._attempts: set[_Attempt] = set()

    def add(self, attempt: _Attempt) -> None:
        with self._lock:
            self._attempts.add(attempt)
        if self.event.is_set():
            attempt.abort("cancelled")

    def discard(self, attempt: _Attempt) -> None:
        with self._lock:
            self._attempts.discard(attempt)

    def abort_all(self) -> None:
        self.event.set()
        with self._lock:
            attempts = list(self._attempts)
        for attempt in attempts:
            attempt.abort("cancelled")


class _Attempt:
    """One HTTP exchange whose socket a deadline timer or a :class:`Cancel` can shut down from another thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.reason: str | None = None

    def attach(self, sock: socket.socket) -> None:
        """The exchange's socket, once connected (kept here: urllib lets go of the connection's own reference while
        the answer is still being read through it)."""
        with self._lock:
            self._sock = sock
            aborted = self.reason is not None
        if aborted:
            _shutdown(sock)

    def abort(self, reason: str) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
            sock = self._sock
        if sock is not None:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    """End an exchange from another thread: a read blocked on a silent server returns (the shutdown), and a server
    that keeps trickling bytes, which Linux still delivers after a shutdown, meets a read timeout that is now all but
    zero."""
    try:
        sock.settimeout(0.001)
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


class _Tracked:
    """A connection (mixed into http.client's) that hands its socket to its :class:`_Attempt` once connected."""

    def __init__(self, *args: Any, attempt: _Attempt, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._attempt = attempt

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self._attempt.attach(self.sock)  # type: ignore[attr-defined]


class _TrackedHTTP(_Tracked, http.client.HTTPConnection):
    pass


class _TrackedHTTPS(_Tracked, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, attempt: _Attempt) -> None:
        super().__init__()
        self._attempt = attempt

    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(functools.partial(_TrackedHTTP, attempt=self._attempt), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, attempt: _Attempt) -> None:
        super().__init__()
        self._attempt = attempt

    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(functools.partial(_TrackedHTTPS, attempt=self._attempt), req, context=self._context)


class _Retry(Exception):
    """A transient failure of one attempt: worth another (``retry_after``: the server's wish, in seconds)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def post_json(
    url: str,
    body: dict[str, Any],
    *,
    api_key: str | None = None,
    timeout: float = 120.0,
    max_retries: int = 3,
    backoff: float = 1.0,
    policy: RequestPolicy | None = None,
    cancel: Cancel | None = None,
) -> dict[str, Any]:
    """POST ``body`` as JSON and return the JSON answer, under ``policy`` (default: one made of ``timeout``,
    ``max_retries`` and ``backoff``): each attempt within its deadline, transient failures retried (see the module
    docstring). Raises :class:`OpenAIEngineError` with the server's own words for a refusal, for an answer that is
    not UTF-8 JSON, after the last failed attempt, and when ``cancel`` aborts it. Standard library only, shared by
    the OpenAI-protocol engines."""
    policy = policy or RequestPolicy(timeout=timeout, max_retries=max_retries, backoff=backoff)
    payload = json.dumps(body).encode("utf-8")
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    last_error, retry_after = "", None
    for attempt in range(policy.max_retries + 1):
        if attempt:
            pause = policy.wait_before(attempt, retry_after)
            if cancel is not None:
                if cancel.event.wait(pause):
                    break
            else:
                time.sleep(pause)
        if cancel is not None and cancel.event.is_set():
            break
        try:
            raw = _try_once(url, payload, headers, policy.timeout, cancel)
        except _Retry as exc:
            last_error, retry_after = str(exc), exc.retry_after
            continue
        return _parse_answer(url, raw)
    if cancel is not None and cancel.event.is_set():
        raise OpenAIEngineError(f"{url}: the request was cancelled" + (f" (after: {last_error})" if last_error else ""))
    raise OpenAIEngineError(f"{url} failed after {policy.max_retries + 1} attempt(s); last error: {last_error}")


def _try_once(url: str, payload: bytes, headers: dict[str, str], timeout: float, cancel: Cancel | None) -> bytes:
    """One POST within ``timeout`` seconds in all: the answer's bytes (2xx), :class:`_Retry` for a transient failure,
    :class:`OpenAIEngineError` for a refusal."""
    attempt = _Attempt()
    late = f"no complete answer within {timeout:g} s"
    timer = threading.Timer(timeout, attempt.abort, args=(late,))
    timer.daemon = True
    opener = urllib.request.build_opener(_HTTPHandler(attempt), _HTTPSHandler(attempt))
    request = urllib.request.Request(url, data=payload, headers=headers, method="POST")
    if cancel is not None:
        cancel.add(attempt)
    timer.start()
    try:
        with opener.open(request, timeout=timeout) as response:
            raw = response.read(MAX_ANSWER_BYTES + 1)
            missing = getattr(response, "length", None)  # what Content-Length announced and never came
        if missing and len(raw) <= MAX_ANSWER_BYTES and attempt.reason is None:
            raise http.client.IncompleteRead(raw, missing)
    except urllib.error.HTTPError as exc:
        status, detail = exc.code, _error_detail(exc)
        exc.close()
        if attempt.reason is not None:
            raise _Retry(attempt.reason) from None
        if status in _RETRY_STATUS:
            raise _Retry(f"HTTP {status}: {detail}", _retry_after(exc.headers)) from None
        raise OpenAIEngineError(f"{url} refused the request (HTTP {status}: {detail})", status=status) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        # A socket timeout is the same deadline (each read may take at most all of it), met before the timer's.
        timed_out = isinstance(getattr(exc, "reason", exc), (TimeoutError, socket.timeout))
        raise _Retry(attempt.reason or (late if timed_out else _describe(exc))) from None
    finally:
        timer.cancel()
        if cancel is not None:
            cancel.discard(attempt)
    if attempt.reason is not None:  # shut down mid-read: what was read is not the whole answer
        raise _Retry(attempt.reason)
    if len(raw) > MAX_ANSWER_BYTES:
        raise OpenAIEngineError(f"{url} answered more than {MAX_ANSWER_BYTES:,} bytes: not a chat completion")
    return raw


def _parse_answer(url: str, raw: bytes) -> dict[str, Any]:
    """The JSON object of a 2xx answer, or :class:`OpenAIEngineError` saying what it is instead."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OpenAIEngineError(f"{url} answered a body that is not UTF-8 text ({exc.reason} at byte {exc.start} of "
                                f"{len(raw)}): {_clip(raw.decode('utf-8', errors='replace'))}") from None  # fmt: skip
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
        raise OpenAIEngineError(f"{url} answered something that is not JSON ({reason}): {_clip(text)}") from None
    if not isinstance(data, dict):
        raise OpenAIEngineError(f"{url} answered JSON that is not an object: {_clip(text)}")
    return data


def _describe(exc: BaseException) -> str:
    """A connection-level failure in words (the reason inside urllib's ``URLError``)."""
    inner = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(inner, http.client.IncompleteRead):
        return f"the answer was cut short (IncompleteRead: {len(inner.partial)} bytes read)"
    if isinstance(inner, http.client.RemoteDisconnected):
        return "the server closed the connection without answering (RemoteDisconnected)"
    if isinstance(inner, http.client.BadStatusLine):
        return f"the server did not answer HTTP (bad status line {_clip(str(inner), 80)})"
    return f"{type(inner).__name__}: {inner}"


def _retry_after(headers: Any) -> float | None:
    """A ``Retry-After`` header in seconds (a number or an HTTP date), ``None`` when absent or unreadable."""
    value = headers.get("Retry-After") if headers is not None else None
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} characters)"


def _error_detail(exc: urllib.error.HTTPError) -> str:
    """The server's own words in an error answer (its JSON ``error.message``, else the start of its body)."""
    try:
        raw = exc.read(64 * 1024).decode("utf-8", errors="replace")
    except (OSError, http.client.HTTPException):  # cut short, or shut down at the deadline
        return str(exc.reason)
    try:
        data = json.loads(raw)
        error = data.get("error", data)
        if isinstance(error, dict):
            return str(error.get("message") or error)[:500]
        return str(error)[:500]
    except (ValueError, AttributeError):
        return raw[:500] or str(exc.reason)
