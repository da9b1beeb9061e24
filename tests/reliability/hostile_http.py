"""Real HTTP servers on 127.0.0.1 that misbehave on purpose, for the model-endpoint reliability tests.

:class:`RawServer` accepts connections in a thread and hands each one to a *behaviour*: a function of
``(socket, request)`` that writes whatever bytes it wants (or none) and may hold the connection open. The request is
read whole first (request line, headers, ``Content-Length`` body) and parsed into :class:`Request`, so a behaviour
can answer according to what was asked (the conversation in the JSON body). Every connection is counted.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))

    def conversation(self) -> str:
        """Every message's content, joined (what a behaviour matches on)."""
        try:
            return "\n".join(str(m.get("content", "")) for m in self.json().get("messages", []))
        except (ValueError, AttributeError):
            return ""


Behaviour = Callable[[socket.socket, Request], None]


@dataclass
class RawServer:
    """``with RawServer(behaviour) as server:`` serves ``server.url`` (``http://127.0.0.1:PORT/v1``)."""

    behaviour: Behaviour
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"

    def __enter__(self) -> RawServer:  # noqa: PYI034 (Python 3.10 has no typing.Self)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sock.close()
        with self._lock:
            for conn in self._conns:
                try:
                    conn.close()
                except OSError:
                    pass

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            request = _read_request(conn)
            if request is None:
                return
            with self._lock:
                self.requests.append(request)
            self.behaviour(conn, request)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass


def _read_request(conn: socket.socket) -> Request | None:
    conn.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return Request(method, path, headers, body)


# ------------------------------------------------------------------------------------------------ answers
def completion(text: str = "<answer>Dragon</answer>", usage: Any = None) -> dict[str, Any]:
    """A chat completion whose reply is ``text``."""
    return {"id": "x", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": usage if usage is not None else {"prompt_tokens": 3, "completion_tokens": 2}}  # fmt: skip


def http_bytes(status: int, body: bytes, headers: dict[str, str] | None = None,
               content_length: int | None = None) -> bytes:  # fmt: skip
    lines = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body) if content_length is None else content_length}",
             "Content-Type: application/json", "Connection: close"]  # fmt: skip
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def answer(status: int, data: Any, headers: dict[str, str] | None = None) -> Behaviour:
    """Answer every request with ``status`` and ``data`` (JSON, or raw bytes)."""
    body = data if isinstance(data, bytes) else json.dumps(data).encode()

    def behave(conn: socket.socket, request: Request) -> None:
        conn.sendall(http_bytes(status, body, headers))

    return behave


def hold(seconds: float = 60.0, trickle: bytes | None = None, every: float = 0.2) -> Behaviour:
    """Never answer (hold the connection ``seconds``), or trickle ``trickle`` a byte at a time after a valid status
    line and headers announcing a large body: a per-read timeout never fires, only an overall deadline does."""

    def behave(conn: socket.socket, request: Request) -> None:
        end = time.monotonic() + seconds
        if trickle is not None:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n")
        i = 0
        while time.monotonic() < end:
            if trickle is not None:
                conn.sendall(trickle[i % len(trickle) : i % len(trickle) + 1])
                i += 1
            time.sleep(every)

    return behave


def sequence(*behaviours: Behaviour) -> Behaviour:
    """The k-th request gets the k-th behaviour (the last one for every request after)."""
    count = [0]
    lock = threading.Lock()

    def behave(conn: socket.socket, request: Request) -> None:
        with lock:
            k = min(count[0], len(behaviours) - 1)
            count[0] += 1
        behaviours[k](conn, request)

    return behave


def reset(conn: socket.socket, request: Request) -> None:
    """Close with a TCP reset (SO_LINGER 0): the client sees ``ConnectionResetError``."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    conn.close()


def cut_short(conn: socket.socket, request: Request) -> None:
    """Announce 1,000 bytes, send 10, close: ``IncompleteRead``."""
    conn.sendall(http_bytes(200, b'{"choices"', content_length=1000))


def bad_status_line(conn: socket.socket, request: Request) -> None:
    """Answer something that is not HTTP: ``BadStatusLine``."""
    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
