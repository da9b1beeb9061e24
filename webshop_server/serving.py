"""The WebShop's HTTP/1.1 connection layer: one selector thread owns every socket, a few threads run the handlers.

Why not ``socketserver.ThreadingMixIn`` (what the shop used before): a thread per connection ties a thread, and a
slot of the connection cap, to a client for as long as the client likes. A client that sends one byte a second
never trips a per-``recv`` timeout, so 256 of them held all 256 slots and the accept loop blocked: nobody else was
answered. Garbage without a newline (a TLS ClientHello) kept ``readline`` waiting for 30 s, and a blank or HTTP/0.9
request line got no answer at all.

Here, as in nginx or gunicorn's async workers, a connection costs a buffer until its request has fully arrived:

* **one selector thread** accepts, reads and writes every socket, non-blocking. It frames requests (request line,
  headers up to the blank line, ``Content-Length`` body) and only a *complete* request goes to a handler thread.
  Slow or idle clients hold no thread, so they cannot starve the handlers, and accepting is never blocked.
* **limits**: request line (``max_line_bytes``), head (``max_head_bytes``), body (``max_body_bytes``, checked from
  ``Content-Length`` before any of the body is read). Garbage is recognised from its first bytes (a request starts
  with a method name: TLS, SSLv2, NUL or binary bytes do not) and answered 400 at once. Every error names its limit
  in a JSON body.
* **deadlines, not per-read timeouts**: a request must arrive completely (head and body) within
  ``request_timeout`` s of its first byte (of the accept, for the first request); a trickle does not extend it. Past
  it the client gets 408 (or a plain close when it sent nothing). Idle keep-alive connections close after
  ``keepalive_timeout`` s; a response the client does not read is abandoned after ``write_timeout`` s.
* **a connection cap that sheds instead of blocking**: at ``max_connections`` open connections a new one is still
  accepted and the connection that has waited longest for its request to finish is closed (then the longest-idle
  keep-alive one, then the slowest reader), provided it has been so for ``shed_after`` s (0.25): a client accepted
  a moment ago has had no chance to be slow. The slowest clients make room; new clients are never refused. Only
  when no connection qualifies (all are new or in a handler) does accepting pause for 20 ms, leaving new clients
  in the kernel's backlog, so the cap is never exceeded.
* **lingering close**: after an error answer the server half-closes and drains what the client still sends for up
  to ``linger_timeout`` s, so a client still uploading a too-large body reads its 413 instead of a reset.
* handlers run on the complete request in memory (``rfile``/``wfile`` are ``BytesIO``) on ``handler_threads``
  threads, so a handler never blocks on a socket; the loop sends the response.

Each phase (waiting for a request, idle, in a handler, writing, lingering) keeps its connections in an ordered dict
in the order they entered it; the phase's timeout is a constant, so deadlines are in order too: expiring and
shedding take the first entries, O(1) per connection, however many connections are open.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import queue
import re
import selectors
import socket
import threading
import time
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass
from email.utils import formatdate
from http import HTTPStatus
from http.server import HTTPServer
from typing import Any

log = logging.getLogger("webshop_server")


@dataclass(frozen=True)
class Limits:
    """What one client may cost the server. Every limit is per request or per connection, in one worker process."""

    max_line_bytes: int = 16 * 1024  # request line
    max_head_bytes: int = 32 * 1024  # request line + headers
    max_headers: int = 100  # header lines (exactly this many are accepted)
    max_body_bytes: int = 64 * 1024  # Content-Length
    max_json_depth: int = 64  # nesting of a JSON body's arrays and objects
    request_timeout: float = 10.0  # a request's first byte (or the accept) to its last byte
    keepalive_timeout: float = 30.0  # idle time between requests on a keep-alive connection
    write_timeout: float = 30.0  # to send one response
    linger_timeout: float = 2.0  # draining input after an error answer
    max_connections: int = 1024  # open connections; more are accepted by shedding the slowest
    shed_after: float = 0.25  # a connection is only shed once it has been this long in its phase (waiting, idle, ...)
    handler_threads: int = 8  # threads running request handlers

    def __post_init__(self) -> None:
        counts = ("max_line_bytes", "max_head_bytes", "max_headers", "max_body_bytes", "max_json_depth",
                  "max_connections", "handler_threads")  # fmt: skip
        for name, value in asdict(self).items():
            kinds = int if name in counts else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise TypeError(
                    f"invalid limit {name}={value!r}: expected {'an integer' if name in counts else 'a number'}"
                )
            if not 0 < value < 1e9:
                raise ValueError(f"invalid limit {name}={value!r}: expected a positive number below 1e9")


# A request starts with a method name: RFC 9110 token characters. TLS (0x16), SSLv2 (0x80), NUL and other binary
# first bytes are not, so garbage is answered at once instead of waiting for a newline that may never come.
_TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_MAX_METHOD = 32
_HEAD_END = re.compile(rb"\n\r?\n")  # the empty line after the last header (the stdlib parser's notion)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LINGER_MAX_BYTES = 1 << 20

# phases of a connection
_PENDING, _IDLE, _BUSY, _WRITE, _LINGER = "pending", "idle", "busy", "write", "linger"


class _Conn:
    __slots__ = ("addr", "close_after", "closed", "continue_sent", "deadline", "drained", "events", "fd", "head",
                 "inbuf", "line_end", "out", "phase", "scan", "served", "since", "sock")  # fmt: skip

    def __init__(self, sock: socket.socket, addr: Any) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.addr = addr
        self.inbuf = bytearray()
        self.out = b""
        self.phase = ""
        self.since = 0.0  # when it entered its phase
        self.deadline = 0.0
        self.served = 0  # requests answered on this connection
        self.close_after = False
        self.head: tuple[int, int, bool, bool] | None = None  # (head end, body length, force close, expects 100)
        self.continue_sent = False
        self.events = 0
        self.closed = False
        self.drained = 0
        # Where the search for the end of the request line / head resumes, and the request line's end once found:
        # a request trickling in byte by byte is scanned once, not once per byte.
        self.scan = 0
        self.line_end = -1


class _Request:
    __slots__ = ("data", "force_close")

    def __init__(self, data: bytes, force_close: bool) -> None:
        self.data = data
        self.force_close = force_close


class _Reject:
    __slots__ = ("limit", "message", "status")

    def __init__(self, status: int, message: str, limit: dict[str, Any] | None = None) -> None:
        self.status = status
        self.message = message
        self.limit = limit


def error_response(status: int, message: str, limit: dict[str, Any] | None = None, server: str = "WebShop") -> bytes:
    """A complete ``Connection: close`` response with a JSON body ``{"error", "status"[, "limit"]}``."""
    payload: dict[str, Any] = {"error": message, "status": status}
    if limit:
        payload["limit"] = limit
    body = json.dumps(payload).encode("utf-8")
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nServer: {server}\r\nDate: {formatdate(usegmt=True)}\r\n"
        f"Content-Type: application/json; charset=utf-8\r\nContent-Length: {len(body)}\r\nCache-Control: no-store\r\n"
        "X-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


def frame(conn: _Conn, limits: Limits) -> _Request | _Reject | None:
    """The next complete request in ``conn.inbuf`` (removed from it), a reason to reject it, or None (need more)."""
    buf = conn.inbuf
    if conn.served and buf[:1] in (b"\r", b"\n"):
        # RFC 9112 2.2: blank lines before a request line are ignored (some clients send CRLF after a POST body).
        # Only between requests: on a new connection a blank request line is answered 400 below.
        i = 0
        while i < len(buf) and buf[i] in (10, 13):
            i += 1
        del buf[:i]
        conn.scan = 0
    if not buf:
        return None
    if conn.head is None:
        if buf[0] in (10, 13):
            if buf[0] == 13 and len(buf) < 2:
                return None
            return _Reject(400, "blank request line: expected 'METHOD /path HTTP/1.1'")
        method = bytes(buf[: _MAX_METHOD + 1])
        end = len(method)
        for stop in (b" ", b"\r", b"\n"):
            j = method.find(stop)
            if j >= 0:
                end = min(end, j)
        token = method[:end]
        if not all(b in _TCHAR for b in token):
            if buf[0] == 0x16:
                return _Reject(400, "a TLS handshake on a plain-HTTP server: use http://, not https://")
            return _Reject(400, "not an HTTP request: a request starts with a method name such as GET or POST")
        if end > _MAX_METHOD:
            return _Reject(400, f"not an HTTP request: method name longer than {_MAX_METHOD} characters")
        if conn.line_end < 0:
            line_end = buf.find(b"\n", conn.scan)
            if line_end < 0 or line_end > limits.max_line_bytes:
                if len(buf) > limits.max_line_bytes:
                    return _Reject(414, f"request line longer than {limits.max_line_bytes} bytes",
                                   {"max_line_bytes": limits.max_line_bytes})  # fmt: skip
                conn.scan = len(buf)
                return None
            words = bytes(buf[:line_end]).split()
            if len(words) != 3 or not words[2].startswith(b"HTTP/"):
                # HTTP/0.9 or a malformed line: no headers follow. The handler answers 400 and closes.
                data = bytes(buf[: line_end + 1])
                del buf[: line_end + 1]
                conn.scan = 0
                return _Request(data, force_close=True)
            conn.line_end = conn.scan = line_end
        line_end = conn.line_end
        m = _HEAD_END.search(buf, max(line_end, conn.scan - 2))
        if m is None or m.end() > limits.max_head_bytes:
            if m is not None or len(buf) > limits.max_head_bytes:
                return _Reject(431, f"request line and headers longer than {limits.max_head_bytes} bytes",
                               {"max_head_bytes": limits.max_head_bytes})  # fmt: skip
            conn.scan = len(buf)
            return None
        version = bytes(buf[:line_end]).split()[2]
        headers = bytes(buf[line_end + 1 : m.start()]).count(b"\n") + 1 if m.start() > line_end + 1 else 0
        if headers > limits.max_headers:
            return _Reject(431, f"{headers} request headers; at most {limits.max_headers} are accepted",
                           {"max_headers": limits.max_headers})  # fmt: skip
        conn.head = _parse_framing(bytes(buf[line_end + 1 : m.end()]), m.end(), limits, version)
        conn.continue_sent = False
    head_end, body_len, force_close, _expect = conn.head
    if len(buf) < head_end + body_len:
        return None
    data = bytes(buf[: head_end + body_len])
    del buf[: head_end + body_len]
    conn.head = None
    conn.scan, conn.line_end = 0, -1
    return _Request(data, force_close)


def _parse_framing(headers: bytes, head_end: int, limits: Limits, version: bytes) -> tuple[int, int, bool, bool]:
    """(head end, body length, force close, expects 100-continue) from the raw header lines.

    When the body's length is unknown (Transfer-Encoding, a bad, conflicting or too large Content-Length) no body is
    read: the handler answers 4xx and the connection closes, so nothing of that body is read as a next request.
    """
    lengths: set[bytes] = set()
    chunked = expect = False
    for line in headers.split(b"\n"):
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        name = name.strip().lower()
        if name == b"content-length":
            lengths.add(value.strip())
        elif name == b"transfer-encoding":
            chunked = True
        elif name == b"expect":
            expect = value.strip().lower() == b"100-continue"
    if chunked:
        return head_end, 0, True, False
    if not lengths:
        return head_end, 0, False, False
    raw = next(iter(lengths))
    if len(lengths) > 1 or not (raw.isdigit() and len(raw) <= 15):
        return head_end, 0, True, False
    n = int(raw)
    if n > limits.max_body_bytes:
        return head_end, 0, True, False
    return head_end, n, False, expect and n > 0 and version == b"HTTP/1.1"


class SelectorHTTPServer(HTTPServer):
    """An ``HTTPServer`` (bind, listen, ``serve_forever``, ``shutdown``, ``server_close``) served by a selector loop.

    Subclasses implement :meth:`handle_request_bytes`: a complete request in, a complete response and whether to
    close out. It runs on a handler thread.
    """

    allow_reuse_address = True
    request_queue_size = 1024
    server_version = "WebShop"

    def __init__(self, address: tuple[str, int], limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        super().__init__(address, None)  # type: ignore[arg-type]  # no RequestHandlerClass: see handle_request_bytes
        self.max_connections = _fd_bounded(self.limits.max_connections)
        self._conns: dict[int, _Conn] = {}
        self._phases: dict[str, OrderedDict[_Conn, None]] = {p: OrderedDict() for p in (_PENDING, _IDLE, _BUSY,
                                                                                         _WRITE, _LINGER)}  # fmt: skip
        self._timeouts = {_PENDING: self.limits.request_timeout, _IDLE: self.limits.keepalive_timeout,
                          _WRITE: self.limits.write_timeout, _LINGER: self.limits.linger_timeout}  # fmt: skip
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: deque = deque()
        self._threads: list[threading.Thread] = []
        self._selector: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._serving = False
        self._stop = False
        self._accept_resume: float | None = None  # accepting paused until then (no connection could make room)
        self._fd_warned = 0.0
        self._loop_pid = 0
        self._stopped = threading.Event()
        self._stopped.set()
        self.counters = {"accepted": 0, "requests": 0, "rejected": 0, "timed_out": 0, "shed": 0}

    # ------------------------------------------------------------------ to override
    def handle_request_bytes(self, data: bytes, client_address: Any, force_close: bool) -> tuple[bytes, bool]:
        raise NotImplementedError

    # ------------------------------------------------------------------ socketserver API
    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until :meth:`shutdown` (or an exception, e.g. KeyboardInterrupt, in this thread)."""
        self._stopped.clear()
        self._serving = True
        self._loop_pid = os.getpid()
        # Made here, not in __init__: pre-forked workers each get their own selector, wake-up pair and threads.
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.socket.setblocking(False)
        self._selector.register(self.socket, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
        self._threads = [threading.Thread(target=self._handler_thread, daemon=True, name=f"webshop-handler-{i}")
                         for i in range(self.limits.handler_threads)]  # fmt: skip
        for t in self._threads:
            t.start()
        try:
            while not self._stop:
                now = time.monotonic()
                self._expire(now)
                timeout = poll_interval
                for phase in self._timeouts:
                    first = next(iter(self._phases[phase]), None)
                    if first is not None:
                        timeout = min(timeout, max(0.0, first.deadline - now + 0.005))
                if self._accept_resume is not None:
                    if now >= self._accept_resume:
                        self._accept_resume = None
                        self._selector.register(self.socket, selectors.EVENT_READ, None)
                    else:
                        timeout = min(timeout, self._accept_resume - now)
                for key, mask in self._selector.select(timeout):
                    data = key.data
                    if data is None:
                        self._accept()
                    elif data is self._wake_r:
                        _drain(self._wake_r)
                    elif not data.closed:
                        if mask & selectors.EVENT_WRITE:
                            self._flush(data)
                        if mask & selectors.EVENT_READ and not data.closed:
                            self._read(data)
                self._finish_responses()
        finally:
            self._serving = False
            self._stop = False
            self._accept_resume = None
            for conn in list(self._conns.values()):
                self._close(conn)
            for _ in self._threads:
                self._jobs.put(None)
            for t in self._threads:
                t.join(timeout=5)
            self._threads = []
            self._done.clear()
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` and wait until it has returned (call it from another thread). Called before
        ``serve_forever`` has started, it makes that return at once (the standard library's would wait forever)."""
        self._stop = True
        if self._serving and self._loop_pid == os.getpid():  # in a forked child the loop thread does not exist
            self._wake()
            self._stopped.wait()

    def stats(self) -> dict[str, Any]:
        """Open connections by phase, and counters (approximate when read from another thread)."""
        phases = {p: len(d) for p, d in list(self._phases.items())}
        return {"open": len(self._conns), "max": self.max_connections, **phases, **self.counters}

    # ------------------------------------------------------------------ handler threads
    def _handler_thread(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            conn, request = job
            try:
                out, close = self.handle_request_bytes(request.data, conn.addr, request.force_close)
            except BaseException:  # a bug in a handler: log it, answer 500, keep serving (and keep this thread)
                log.exception("unhandled error in a request handler")
                out, close = error_response(500, "internal server error", server=self.server_version), True
            self._done.append((conn, out, close or request.force_close))
            self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            pass  # the pair is full: a wake-up is pending anyway
        except (OSError, AttributeError):
            pass  # closed: the loop has stopped

    # ------------------------------------------------------------------ the loop's work
    def _accept(self) -> None:
        for _ in range(64):
            victim = None
            if len(self._conns) >= self.max_connections:
                victim = self._victim()
                if victim is None:  # nobody has been slow for long: new clients wait in the kernel's backlog
                    self._pause_accepting(0.02)
                    return
            try:
                sock, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return  # nothing to accept (with pre-forked workers, another may have taken it): nothing was shed
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if time.monotonic() - self._fd_warned > 10:
                        self._fd_warned = time.monotonic()
                        log.warning("accept failed (%s): closing the slowest connections to make room", exc)
                    victim = self._victim()
                    if victim is not None:
                        self._shed(victim)
                    else:
                        self._pause_accepting(0.1)
                elif exc.errno != errno.ECONNABORTED:
                    log.debug("accept failed", exc_info=True)
                return
            if victim is not None:
                self._shed(victim)
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            conn = _Conn(sock, addr)
            self._conns[conn.fd] = conn
            self.counters["accepted"] += 1
            self._enter(conn, _PENDING)
            self._interest(conn)

    def _pause_accepting(self, seconds: float) -> None:
        if self._accept_resume is None:
            self._selector.unregister(self.socket)  # type: ignore[union-attr]
        self._accept_resume = time.monotonic() + seconds

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if conn.phase == _LINGER:
            conn.drained += len(data)
            if not data or conn.drained > _LINGER_MAX_BYTES:
                self._close(conn)
            return
        if not data:  # the client closed its sending side
            # Bytes of a request that will never be complete get a 400 (CR/LF left between keep-alive requests do not).
            if conn.phase == _PENDING and (conn.inbuf.strip(b"\r\n") or (conn.inbuf and not conn.served)):
                self._reject(conn, _Reject(400, "incomplete request: the client closed the connection before the "
                                                "request was complete"))  # fmt: skip
            else:
                self._close(conn)
            return
        conn.inbuf += data
        self._next_request(conn)

    def _next_request(self, conn: _Conn) -> None:
        result = frame(conn, self.limits)
        if result is None:
            if conn.phase == _IDLE and conn.inbuf:
                self._enter(conn, _PENDING)  # the first byte of the next request: its deadline starts now
            head = conn.head
            if head is not None and head[3] and not conn.continue_sent:
                conn.continue_sent = True
                conn.out += _CONTINUE
                self._flush(conn)
            self._interest(conn)
        elif isinstance(result, _Reject):
            self._reject(conn, result)
        else:
            self._enter(conn, _BUSY)
            self._interest(conn)
            self.counters["requests"] += 1
            self._jobs.put((conn, result))

    def _reject(self, conn: _Conn, reject: _Reject) -> None:
        self.counters["rejected"] += 1
        self._respond(conn, error_response(reject.status, reject.message, reject.limit, self.server_version), True)

    def _respond(self, conn: _Conn, out: bytes, close: bool) -> None:
        conn.out += out
        conn.close_after = conn.close_after or close
        self._enter(conn, _WRITE)
        self._flush(conn)
        if not conn.closed:
            self._interest(conn)

    def _finish_responses(self) -> None:
        while self._done:
            conn, out, close = self._done.popleft()
            if not conn.closed:
                self._respond(conn, out, close)

    def _flush(self, conn: _Conn) -> None:
        while conn.out:
            try:
                n = conn.sock.send(conn.out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close(conn)
                return
            conn.out = conn.out[n:]
        if conn.phase != _WRITE:
            return
        if conn.close_after:
            self._linger(conn)
            return
        conn.served += 1
        self._enter(conn, _IDLE)
        if conn.inbuf:  # a pipelined request
            self._next_request(conn)
        else:
            self._interest(conn)

    def _linger(self, conn: _Conn) -> None:
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.inbuf.clear()
        conn.head = None
        self._enter(conn, _LINGER)
        self._interest(conn)

    def _expire(self, now: float) -> None:
        for phase in (_PENDING, _IDLE, _WRITE, _LINGER):
            members = self._phases[phase]
            while members:
                conn = next(iter(members))
                if conn.deadline > now:
                    break
                if phase == _PENDING and (conn.inbuf or conn.head):
                    self.counters["timed_out"] += 1
                    t = self.limits.request_timeout
                    self._reject(conn, _Reject(408, f"the request did not arrive completely within {t:g} s",
                                               {"request_timeout_s": t}))  # fmt: skip
                else:  # nothing sent, idle keep-alive, a response not read, or done lingering: close quietly
                    if phase in (_PENDING, _WRITE):
                        self.counters["timed_out"] += 1
                    self._close(conn)

    def _victim(self) -> _Conn | None:
        """The connection to close for a new one: done and lingering, else waiting longest for its request to finish,
        else idle longest, else reading its response slowest; only one that has been so for ``shed_after`` s (a
        client accepted a moment ago has had no chance to be slow). None when there is no such connection."""
        now = time.monotonic()
        for phase in (_LINGER, _PENDING, _IDLE, _WRITE):
            members = self._phases[phase]
            if members:
                conn = next(iter(members))  # the oldest in its phase
                if now - conn.since >= self.limits.shed_after:
                    return conn
        return None

    def _shed(self, conn: _Conn) -> None:
        self.counters["shed"] += 1
        if conn.phase == _PENDING and conn.inbuf:
            try:  # best effort: tell it why, without waiting
                conn.sock.send(
                    error_response(408, "closed to make room: the request was too slow",
                                   {"max_connections": self.max_connections}, self.server_version)
                )  # fmt: skip
            except OSError:
                pass
        self._close(conn)

    # ------------------------------------------------------------------ bookkeeping
    def _enter(self, conn: _Conn, phase: str) -> None:
        if conn.phase:
            self._phases[conn.phase].pop(conn, None)
        conn.phase = phase
        conn.since = time.monotonic()
        conn.deadline = conn.since + self._timeouts.get(phase, 0.0)
        self._phases[phase][conn] = None

    def _interest(self, conn: _Conn) -> None:
        if conn.closed:
            return
        events = selectors.EVENT_READ if conn.phase in (_PENDING, _IDLE, _LINGER) else 0
        if conn.out:
            events |= selectors.EVENT_WRITE
        if events == conn.events:
            return
        try:
            if conn.events == 0:
                self._selector.register(conn.sock, events, conn)  # type: ignore[union-attr]
            elif events == 0:
                self._selector.unregister(conn.sock)  # type: ignore[union-attr]
            else:
                self._selector.modify(conn.sock, events, conn)  # type: ignore[union-attr]
        except (OSError, ValueError, KeyError):
            self._close(conn)
            return
        conn.events = events

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.events and self._selector is not None:
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass
        conn.events = 0
        if conn.phase:
            self._phases[conn.phase].pop(conn, None)
        self._conns.pop(conn.fd, None)
        try:
            conn.sock.close()
        except OSError:
            pass


def run_handler(
    handler_cls: type, server: Any, data: bytes, client_address: Any, force_close: bool
) -> tuple[bytes, bool]:
    """Run a ``BaseHTTPRequestHandler`` subclass on one complete request held in memory."""
    handler = handler_cls.__new__(handler_cls)
    handler.server = server
    handler.client_address = client_address
    handler.request = handler.connection = None
    handler.rfile = io.BytesIO(data)
    handler.wfile = io.BytesIO()
    handler.force_close = force_close
    handler.close_connection = True
    handler.handle_one_request()
    return handler.wfile.getvalue(), bool(handler.close_connection)


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except (BlockingIOError, InterruptedError, OSError):
        pass


def _fd_bounded(wanted: int) -> int:
    """``wanted``, lowered so that the connections fit under the process's open-file limit (with room to spare)."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return wanted
    if soft == resource.RLIM_INFINITY:
        return wanted
    return min(wanted, max(16, soft - 64))
