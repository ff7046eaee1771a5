"""The /metrics HTTP server: one thread, no client can stall it.

The training loop shares the interpreter with this server, so the server must
be cheap, and it must stay answerable whatever the network does: a port
scanner holding idle sockets, a client trickling one byte every few seconds,
a client that sends a request and never reads the answer.

Design:
  * one thread and a `selectors` loop over non-blocking sockets: every
    connection makes progress independently, none waits for another;
  * a deadline for the whole request (accept to last byte sent), not per
    read, so a trickler is cut off after `request_timeout` seconds whatever it
    sends;
  * at most `max_connections` open at once: when a new one arrives at the cap,
    the oldest connection that has not yet sent a complete request is dropped
    (then the oldest of the others), so idle sockets cannot crowd out scrapers;
  * requests larger than `max_request_bytes` are answered 431 and closed;
  * one rendering of the registry serves every scraper within
    `cache_seconds` (the response bytes are shared, never copied per client);
  * complete requests for /metrics are answered in turn, at most one per
    `min_interval` (200 a second by default), as the old server did: eager
    scrapers wait for their turn instead of spinning the machine;
  * the thread's busy time outside rendering is kept below `max_share` of wall
    time by sleeping in proportion to the work just done, so however many
    scrapers (or hostile clients) pile on, the training loop keeps the
    interpreter: at the default 5%, about 300 requests a second.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

_READING, _QUEUED, _WRITING, _LINGERING = 0, 1, 2, 3


def _plain_response(status: str, text: str) -> bytes:
    body = text.encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


NOT_FOUND = _plain_response("404 Not Found", "only /metrics is served here\n")
NOT_ALLOWED = _plain_response("405 Method Not Allowed", "only GET is served here\n")
BAD_REQUEST = _plain_response("400 Bad Request", "not an HTTP request\n")
TOO_LARGE = _plain_response("431 Request Header Fields Too Large", "request too large\n")


class _Connection:
    __slots__ = ("sock", "accepted", "deadline", "inbox", "out", "sent", "state")

    def __init__(self, sock: socket.socket, now: float, timeout: float):
        self.sock = sock
        self.accepted = now
        self.deadline = now + timeout
        self.inbox = b""
        self.out: memoryview | None = None
        self.sent = 0
        self.state = _READING


class MetricsServer:
    """Serves GET /metrics (and /) from a cached rendering of `registry`; see the module docstring."""

    def __init__(self, address, registry: CollectorRegistry, cache_seconds: float = 0.5,
                 request_timeout: float = 5.0, max_connections: int = 128, max_request_bytes: int = 8192,
                 max_share: float = 0.05, min_interval: float = 0.005):
        if not 0 < max_share <= 1:
            raise ValueError(f"max_share={max_share} is invalid: expected 0 < max_share <= 1")
        self.registry = registry
        self.cache_seconds = cache_seconds
        self.request_timeout = request_timeout
        self.max_connections = max(1, int(max_connections))
        self.max_request_bytes = int(max_request_bytes)
        self.max_share = max_share
        self.min_interval = min_interval
        self._queue: deque[_Connection] = deque()  # complete requests for /metrics awaiting their answer slot
        self._next_answer = 0.0
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(address)
            self.socket.listen(512)
            self.socket.setblocking(False)
        except OSError:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()
        self._response = b""
        self._header_length = 0
        self._rendered_at = -1e9
        self._render_s = 0.0  # rendering time not yet accounted for by the throttle
        self._connections: dict[socket.socket, _Connection] = {}  # insertion order = accept order
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._closed = False
        # What the server did, for tests and benchmarks (read without a lock: plain ints).
        self.stats = {"answered": 0, "dropped_deadline": 0, "dropped_cap": 0, "too_large": 0, "throttled_s": 0.0}

    # ---- rendering (one per cache interval, shared by every scraper)
    def body(self) -> bytes:
        return self._current()[self._header_length:]

    def _current(self) -> bytes:
        now = time.monotonic()
        if now - self._rendered_at >= self.cache_seconds:
            body = generate_latest(self.registry)
            header = (f"HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE_PLAIN_0_0_4}\r\n"
                      f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
            self._header_length = len(header)
            self._response = header + body
            self._rendered_at = now
            self._render_s += time.monotonic() - now
        return self._response

    # ---- the loop
    def serve_forever(self) -> None:
        sel = self._selector
        sel.register(self.socket, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        debt = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                timeout = 1.0
                if self._connections:
                    first = min(c.deadline for c in self._connections.values())
                    timeout = min(timeout, max(0.0, first - now))
                if self._queue:
                    timeout = min(timeout, max(0.0, self._next_answer - now))
                events = sel.select(timeout)
                t0 = time.perf_counter()
                accept = False
                for key, mask in events:
                    if key.data is None:
                        accept = True
                    elif key.data == "wake":
                        try:
                            self._wake_r.recv(64)
                        except OSError:
                            pass
                    else:
                        self._service(key.data, mask)
                if accept:  # after serving the open connections: a flood of new ones cannot evict them first
                    self._accept()
                self._answer_queued()
                self._expire(time.monotonic())
                # Keep this thread's busy share bounded: sleep in proportion to the work just done.
                # Rendering is left out: the cache already bounds it to one per `cache_seconds`.
                busy = max(0.0, time.perf_counter() - t0 - self._render_s)
                self._render_s = 0.0
                debt = min(0.05, debt + busy * (1.0 / self.max_share - 1.0))
                if debt >= 0.001:
                    time.sleep(debt)
                    self.stats["throttled_s"] += debt
                    debt = 0.0
        finally:
            for conn in list(self._connections.values()):
                self._close(conn)
            self._stopped.set()

    def _accept(self) -> None:
        """Accept a batch of waiting connections; read each at once (a scraper's request is usually there).

        At most a quarter of the cap per round, so the connections accepted in one round are never
        evicted by the rest of that round's accepts before their request has been read.
        """
        now = time.monotonic()
        for _ in range(max(1, self.max_connections // 4)):
            try:
                sock, _ = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. EMFILE: leave the rest queued in the kernel for the next round
                return
            if len(self._connections) >= self.max_connections:
                self._evict()
            sock.setblocking(False)
            conn = _Connection(sock, now, self.request_timeout)
            self._connections[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._service(conn, selectors.EVENT_READ)

    def _evict(self) -> None:
        """Make room: drop the oldest finished (lingering) connection, else the oldest still-reading one."""
        for state in (_LINGERING, _READING, _WRITING, _QUEUED):
            for conn in self._connections.values():
                if conn.state == state:
                    self.stats["dropped_cap"] += state != _LINGERING
                    self._close(conn)
                    return

    def _service(self, conn: _Connection, mask: int) -> None:
        if conn.sock not in self._connections:
            return  # closed earlier in this round
        try:
            if conn.state == _WRITING:
                self._send(conn)
            else:
                data = conn.sock.recv(4096)
                if not data:
                    self._close(conn)
                elif conn.state == _READING:
                    self._received(conn, data)
                # _LINGERING: whatever the client still sends is discarded until it closes
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close(conn)

    def _received(self, conn: _Connection, data: bytes) -> None:
        conn.inbox += data
        end = conn.inbox.find(b"\r\n\r\n")
        if end < 0:
            end = conn.inbox.find(b"\n\n")
        if end < 0:
            if len(conn.inbox) > self.max_request_bytes:
                self.stats["too_large"] += 1
                self._reply(conn, TOO_LARGE)
            return
        if end > self.max_request_bytes:
            self.stats["too_large"] += 1
            self._reply(conn, TOO_LARGE)
            return
        first = conn.inbox.split(b"\n", 1)[0].split()
        if len(first) < 2 or not first[-1].startswith(b"HTTP/"):
            self._reply(conn, BAD_REQUEST)
        elif first[0] != b"GET":
            self._reply(conn, NOT_ALLOWED)
        elif first[1].split(b"?", 1)[0] in (b"/metrics", b"/"):
            conn.state = _QUEUED  # answered in turn, at most one per min_interval (see _answer_queued)
            self._selector.unregister(conn.sock)
            self._queue.append(conn)
        else:
            self._reply(conn, NOT_FOUND)

    def _answer_queued(self) -> None:
        """Answer the oldest waiting /metrics request when its slot has come: one per `min_interval`.

        As in the server this one replaced, eager scrapers are answered in turn rather than as fast
        as they ask, so 50 of them looping cost the machine no more than the old server let them.
        """
        now = time.monotonic()
        while self._queue and now >= self._next_answer:
            conn = self._queue.popleft()
            if conn.sock not in self._connections:
                continue  # dropped at its deadline or to make room
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
            self.stats["answered"] += 1
            self._reply(conn, self._current())
            # Slots missed while this thread waited for the interpreter may be caught up, a few at most.
            self._next_answer = max(self._next_answer, now - 4 * self.min_interval) + self.min_interval

    def _reply(self, conn: _Connection, response: bytes) -> None:
        conn.inbox = b""
        conn.out = memoryview(response)
        conn.sent = 0
        conn.state = _WRITING
        self._send(conn)  # usually the whole response fits the socket buffer at once
        if conn.state == _WRITING and conn.sock in self._connections:
            self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)

    def _send(self, conn: _Connection) -> None:
        try:
            conn.sent += conn.sock.send(conn.out[conn.sent:])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if conn.sent < len(conn.out):
            return
        # All sent: close our side and wait for the client to close its own (or the deadline), so
        # that unread request bytes can never turn our close into a reset that destroys the answer.
        conn.out = None
        conn.state = _LINGERING
        try:
            conn.sock.shutdown(socket.SHUT_WR)
            self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
        except (OSError, ValueError, KeyError):
            self._close(conn)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._connections.values() if c.deadline <= now]:
            self.stats["dropped_deadline"] += conn.state != _LINGERING
            self._close(conn)

    def _close(self, conn: _Connection) -> None:
        if self._connections.pop(conn.sock, None) is None:
            return
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    # ---- lifecycle (the same calls as socketserver's)
    def shutdown(self) -> None:
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._stopped.wait(5)

    def server_close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.socket.close()
        self._wake_r.close()
        self._wake_w.close()
        self._selector.close()


def start_metrics_server(host: str, port: int, registry: CollectorRegistry, cache_seconds: float = 0.5,
                         **options) -> tuple[MetricsServer, threading.Thread]:
    """Bind, then serve on a daemon thread; returns (server, thread)."""
    server = MetricsServer((host, port), registry, cache_seconds, **options)
    thread = threading.Thread(target=server.serve_forever, name="rlvitals-metrics", daemon=True)
    thread.start()
    return server, thread
