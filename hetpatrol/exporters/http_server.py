"""The ``/metrics`` HTTP server: one thread, one ``selectors`` loop, every connection.

Why not ``http.server.ThreadingHTTPServer`` (what this replaced, measured with
``tests/bench/daemon.py``): it gives each connection a thread and parses every request's
headers with the ``email`` package. With 20 scrapers asking together (scrapers that share
a schedule), the 20 threads queue on the GIL and hand it over at each read and write:
0.15-0.28 ms of CPU per scrape and a p99 of 8-12 ms for the last answer of a round, on
a body that is already rendered. Serving a cached body needs none of that: here a scrape
costs a ``recv``, a split of the request head and one ``send``.

What it serves (HTTP/1.1, RFC 9112): ``GET``/``HEAD`` of ``/metrics`` (the body of the
last patrol, gzip when ``Accept-Encoding`` accepts it) and ``/``; 404 for other paths,
405 for other methods, 400 for a request that is not HTTP/1.x or carries a body, 431
when the request head passes :attr:`MetricsServer.max_head_bytes`. Also 400 (and close):
an HTTP/1.1 request without one ``Host``, a ``Content-Length`` that is not digits or
differs between lines (invalid framing, RFC 9112 6.3), a field name that is not a token,
a field value with NUL or CR. Accepted: bare LF line ends and empty lines before the
request line (RFC 9112 2.2), the absolute form ``GET http://host/metrics`` (3.2.2).
Connections are kept alive (HTTP/1.1 unless ``Connection: close``; HTTP/1.0 only with
``Connection: keep-alive``, which the answer then repeats) and requests on one
connection are answered in order.

Bounds: at most :attr:`MetricsServer.max_connections` connections, and at most
:attr:`MetricsServer.max_connections_per_source` from one peer address, so one noisy
client leaves room for Prometheus. A request that reached the daemon is answered: room
is made only by closing an *idle* connection (its peer has closed it, or it has sent
nothing for :attr:`MetricsServer.evict_idle_seconds` and the socket holds no unread
byte, checked with a non-blocking ``MSG_PEEK``), never one whose next request is waiting
in the kernel buffer (a close with unread data sends an RST, and the client's request is
lost). With no idle connection to close: a source over its limit has its request
answered ``503`` with ``Retry-After`` and ``Connection: close``; with the whole server
full, the listener waits (new connections stay queued in the kernel) and the oldest
connection of the busiest source is told ``Connection: close`` in its next answer. After
an answer with ``Connection: close`` the server shuts its side and reads (discarding)
until the peer closes or :attr:`MetricsServer.linger_seconds` pass, so an answer is not
cut off by an RST when the client sent more. A connection that has not completed a
request and its answer within :attr:`MetricsServer.idle_timeout_seconds` of its last one
(or of its accept) is closed, so a client that drips its request a byte at a time, or
never reads its answer, holds a socket for that long and no thread at all.
"""

from __future__ import annotations

import re
import selectors
import socket
import threading
import time
from typing import TYPE_CHECKING

from hetpatrol.exporters.text_format import CONTENT_TYPE_TEXT

if TYPE_CHECKING:
    from hetpatrol.exporters.prometheus import Exposition

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}
#: the end of a request head: CRLF CRLF, or bare LF line ends (RFC 9112 2.2: "a recipient
#: MAY recognize a single LF as a line terminator and ignore any preceding CR"; curl and
#: http.client send CRLF, hand-typed and some embedded clients LF)
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_LINE_END = re.compile(r"\r?\n")
#: field-name = token (RFC 9110 5.1, 5.6.2)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: HTTP-version = "HTTP/" DIGIT "." DIGIT (RFC 9112 2.3), major 1 only
_VERSION = re.compile(r"HTTP/1\.[0-9]")
_INDEX = b'<html><body><h1>hetpatrol</h1><a href="/metrics">metrics</a></body></html>'


def accepts_gzip(header: str | None) -> bool:
    """Whether an ``Accept-Encoding`` value accepts gzip (RFC 9110 12.5.3): the ``q`` of
    ``gzip`` when it is listed, else that of ``*``; a coding without ``q`` has q=1, a
    ``q`` that is not a number in [0, 1] refuses. At most 64 codings are looked at."""
    qualities: dict[str, float] = {}
    for item in (header or "").split(",")[:64]:
        coding, *params = (p.strip() for p in item.split(";"))
        coding = coding.lower()
        if coding not in ("gzip", "x-gzip", "*") or coding in qualities:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
                if not 0.0 <= q <= 1.0:  # also nan
                    q = 0.0
        qualities["gzip" if coding == "x-gzip" else coding] = q
    q = qualities.get("gzip", qualities.get("*", 0.0))
    return q > 0.0


def _is_token_fast(name: str) -> bool:
    """True for the usual field names (ASCII letters, digits, ``-``), without a regex;
    False leaves the decision to :data:`_TOKEN`."""
    return name.isascii() and name.replace("-", "a").isalnum()


class _Connection:
    __slots__ = (
        "sock",
        "source",
        "inbuf",
        "outbuf",
        "outpos",
        "deadline",
        "quiet_since",
        "closing",
        "lingering",
        "refuse",
        "retire",
        "events",
    )

    def __init__(self, sock: socket.socket, source: str, now: float, deadline: float):
        self.sock = sock
        self.source = source  # the peer's address, without the port
        self.inbuf = b""
        self.outbuf = b""  # the answer being sent
        self.outpos = 0  # bytes of it sent
        self.deadline = deadline
        self.quiet_since = now  # monotonic time of its accept or last answer sent
        self.closing = False  # the answer being sent says Connection: close; close after it
        self.lingering = False  # our side is shut: read and discard until the peer closes
        self.refuse = False  # its source is over its limit: answer 503 and close
        self.retire = False  # to give its slot back: its next answer says Connection: close
        self.events = selectors.EVENT_READ  # what the selector waits for


def _peer_state(sock: socket.socket) -> str:
    """``"closed"`` (the peer closed or reset it), ``"pending"`` (unread bytes wait in
    the kernel buffer) or ``"idle"``, by a non-blocking ``recv(MSG_PEEK)`` that leaves
    the bytes where they are."""
    try:
        data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return "idle"
    except OSError:
        return "closed"
    return "pending" if data else "closed"


class MetricsServer:
    """Serves ``/metrics`` from an :class:`~hetpatrol.exporters.prometheus.Exposition`
    in a background thread.

    ``host`` is an IPv4 or IPv6 address (``::`` for every address), ``port`` 0 picks a
    free one (:attr:`port`). Raises ``OSError`` when the address cannot be bound.
    """

    #: connections served at once (a 2-core node answers ~5,000 scrapes/s from one
    #: thread; more connections add no throughput, only descriptors)
    max_connections = 128
    #: connections from one peer address; the rest stay for other scrapers
    max_connections_per_source = 96
    #: seconds without a request after which a connection with no unread byte may be
    #: closed to make room (a client that has just connected, or just read an answer,
    #: is about to send its request)
    evict_idle_seconds = 0.25
    #: seconds a connection told ``Connection: close`` is read (and discarded) after its
    #: answer, so the answer is not cut off by an RST
    linger_seconds = 2.0
    #: seconds a connection may take to complete a request and its answer
    idle_timeout_seconds = 10.0
    #: most bytes of one request head (request line and headers)
    max_head_bytes = 8192
    #: seconds the listener is left alone after accept() failed (no descriptor left)
    accept_backoff_seconds = 0.25

    def __init__(self, host: str, port: int, exposition: Exposition):
        self.exposition = exposition
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: dict[int, _Connection] = {}
        self._per_source: dict[str, int] = {}
        self._stopping = False
        self._accept_paused_until = 0.0  # accept() failed: the listener is not watched
        self._paused_full = False  # ... because every connection is in use
        self._date = (0, "")
        self._thread = threading.Thread(target=self._serve, name="metrics-http", daemon=True)

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._conns)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close every connection (waits up to 5 s for the loop)."""
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for conn in list(self._conns.values()):
            self._close(conn)
        self._selector.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()

    # ------------------------------------------------------------------ the loop
    def _serve(self) -> None:
        while not self._stopping:
            now = time.monotonic()
            if self._accept_paused_until and now >= self._accept_paused_until:
                self._accept_paused_until = 0.0
                self._selector.register(self._listener, selectors.EVENT_READ, "accept")
            timeout = min((c.deadline for c in self._conns.values()), default=now + 1.0) - now
            if self._accept_paused_until:
                timeout = min(timeout, self._accept_paused_until - now)
            accept = False
            for key, mask in self._selector.select(max(0.0, min(timeout, 1.0))):
                if key.data == "accept":
                    accept = True
                elif key.data == "wake":
                    return
                else:
                    self._event(key.data, mask)
            if accept:  # after the others: a peer's close seen in this round frees its slot
                self._accept()
            now = time.monotonic()
            for conn in [c for c in self._conns.values() if c.deadline <= now]:
                self._close(conn)

    def _pause_accept(self, seconds: float, *, full: bool = False) -> None:
        """Leave the listener unwatched for ``seconds`` (queued connections wait in the
        kernel's backlog); ``full``: until a connection closes, at the latest."""
        if not self._accept_paused_until:
            self._selector.unregister(self._listener)
        self._accept_paused_until = time.monotonic() + seconds
        self._paused_full = full

    def _accept(self) -> None:
        while True:
            if len(self._conns) >= self.max_connections and not self._make_room(None):
                # full, none idle: the next connection waits in the backlog (it is not
                # taken in only to be closed), and the busiest source gives one back
                self._retire_one()
                self._pause_accept(self.evict_idle_seconds, full=True)
                return
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # gone before it was accepted: the next one
                continue
            except OSError:
                # EMFILE, ENFILE, ENOBUFS: the connection stays queued and the listener
                # readable, so the next select() would return at once: a loop spinning a
                # core (and the GIL the patrol needs) until a descriptor frees up. The
                # listener is not watched for a moment instead.
                self._pause_accept(self.accept_backoff_seconds)
                return
            source = addr[0] if isinstance(addr, tuple) else ""
            sock.setblocking(False)
            # headers and body go out in one send; no Nagle delay on the keep-alive
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            now = time.monotonic()
            conn = _Connection(sock, source, now, now + self.idle_timeout_seconds)
            if self._per_source.get(source, 0) >= self.max_connections_per_source:
                # over its share: an idle one of its own makes room, else this one's
                # request is answered 503 (never a close with its request unread)
                conn.refuse = not self._make_room(source)
            self._conns[sock.fileno()] = conn
            self._per_source[source] = self._per_source.get(source, 0) + 1
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _make_room(self, source: str | None) -> bool:
        """Close one idle connection: of ``source``, or (None) of the source holding the
        most. A connection whose peer has closed it goes first (it is no loss); then the
        one quiet longest, if it has been quiet :attr:`evict_idle_seconds`, has no answer
        in hand and no unread byte in the kernel buffer, one between requests before one
        stuck in a partial request it stopped sending (RFC 9112 9.5
        lets a server close an idle connection at any time; one with a request waiting
        would be reset and the request lost). Without this, clients that connect and send
        nothing kept every scraper out for the idle timeout. False when none is idle."""
        if source is None:  # the busiest first, then the others
            sources = sorted(self._per_source, key=self._per_source.__getitem__, reverse=True)
        else:
            sources = [source]
        now = time.monotonic()
        for src in sources:
            # between requests first; then one stuck in a partial request (a slow drip:
            # what it sent is read, nothing more has come since, none of it is lost by a
            # close, and kept it would hold its slot for the idle timeout)
            candidates = sorted(
                (
                    c
                    for c in self._conns.values()
                    if c.source == src and not c.outbuf and not c.lingering
                ),
                key=lambda c: (bool(c.inbuf), c.quiet_since),
            )
            for conn in candidates:
                if _peer_state(conn.sock) == "closed":
                    self._close(conn)
                    return True
            for conn in candidates:
                if now - conn.quiet_since < self.evict_idle_seconds:
                    continue
                if _peer_state(conn.sock) == "idle":
                    self._close(conn)
                    return True
        return False

    def _retire_one(self) -> None:
        """Tell the oldest connection of the busiest source ``Connection: close`` in its
        next answer (it is answered, then closed, and its client reconnects)."""
        source = max(self._per_source, key=self._per_source.__getitem__, default="")
        live = [
            c for c in self._conns.values() if c.source == source and not c.closing and not c.retire
        ]
        if live:
            # not ``closing``: an answer already being sent without the header must not
            # be followed by a close its client does not expect
            min(live, key=lambda c: c.quiet_since).retire = True

    def _event(self, conn: _Connection, mask: int) -> None:
        try:
            if mask & selectors.EVENT_READ:
                data = conn.sock.recv(65536)
                if not data:
                    self._close(conn)
                    return
                if conn.lingering:  # what it sent after its last answer: dropped
                    return
                # (quiet_since stays: a request trickled in byte by byte is no more
                # active than a silent one; a real client sends its request at once)
                conn.inbuf += data
            self._progress(conn)
        except OSError:  # reset by the peer, broken pipe
            self._close(conn)
        except Exception:  # noqa: BLE001 - one bad connection must not stop the server
            self._close(conn)

    def _progress(self, conn: _Connection) -> None:
        """Send what is pending; once all is sent, answer the next complete request.
        A connection with an answer still to send is not read (it waits for the peer to
        read): one answer at most is held per connection, however many requests a
        client sends ahead."""
        while True:
            if conn.outpos < len(conn.outbuf):
                conn.outpos += conn.sock.send(memoryview(conn.outbuf)[conn.outpos :])
                if conn.outpos < len(conn.outbuf):
                    self._want(conn, selectors.EVENT_WRITE)
                    return
                conn.outbuf, conn.outpos = b"", 0
                conn.quiet_since = time.monotonic()
                if conn.closing:
                    self._linger(conn)
                    return
            if not self._next_request(conn):
                self._want(conn, selectors.EVENT_READ)
                return

    def _linger(self, conn: _Connection) -> None:
        """Its last answer is sent: shut our side (the peer reads the end of the answer,
        then EOF) and read until the peer closes, or :attr:`linger_seconds` pass; closing
        at once with unread bytes would send an RST that can destroy the answer still in
        flight (RFC 9112 9.6)."""
        conn.lingering = True
        conn.inbuf = b""
        conn.deadline = time.monotonic() + self.linger_seconds
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        self._want(conn, selectors.EVENT_READ)

    def _want(self, conn: _Connection, events: int) -> None:
        if conn.events != events:
            conn.events = events
            self._selector.modify(conn.sock, events, conn)

    def _next_request(self, conn: _Connection) -> bool:
        """Answer the first complete request in the input; False when there is none."""
        # RFC 9112 2.2: "a server that is expecting to receive and parse a request-line
        # SHOULD ignore at least one empty line (CRLF) received prior to the request-line"
        if conn.inbuf[:1] in (b"\r", b"\n"):
            conn.inbuf = conn.inbuf.lstrip(b"\r\n")
        # CRLF CRLF (what clients send) by find(); bare LF line ends by the regex
        limit = self.max_head_bytes + 4
        start = conn.inbuf.find(b"\r\n\r\n", 0, limit)
        stop = start + 4
        inbuf = conn.inbuf
        if start < 0 or inbuf.find(b"\n\n", 0, start) >= 0 or inbuf.find(b"\n\r\n", 0, start) >= 0:
            match = _HEAD_END.search(conn.inbuf, 0, limit)
            if match is None:
                if len(conn.inbuf) > self.max_head_bytes:
                    self._respond(conn, 431, b"request head too large\n", close=True)
                    return True
                return False
            start, stop = match.span()
        head, conn.inbuf = conn.inbuf[:start], conn.inbuf[stop:]
        if len(head) > self.max_head_bytes:
            self._respond(conn, 431, b"request head too large\n", close=True)
        elif conn.refuse:
            self._respond(conn, 503, b"too many connections from this address\n", close=True)
        else:
            self._request(conn, head)
        return True

    def _request(self, conn: _Connection, head: bytes) -> None:
        text = head.decode("latin-1")
        if text.count("\n") == text.count("\r\n"):
            lines = text.split("\r\n")
        else:  # bare LF line ends
            lines = _LINE_END.split(text)
        parts = lines[0].split(" ")
        if len(parts) != 3 or not _VERSION.fullmatch(parts[2]):
            self._respond(conn, 400, b"bad request\n", close=True)
            return
        method, target, version = parts
        headers: dict[str, str] = {}
        hosts = 0
        lengths: set[str] = set()
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            # a field-name is a token, no whitespace before the colon (RFC 9112 5.1: MUST
            # 400), no obs-fold (5.2: 400 or replace), and a value with NUL, CR or LF is
            # "invalid and dangerous" (RFC 9110 5.5: reject or replace; 9112 2.2, bare CR)
            value = value.strip(" \t")
            if (
                not colon
                or not (_is_token_fast(name) or _TOKEN.fullmatch(name))
                or "\0" in value
                or "\r" in value
            ):
                self._respond(conn, 400, b"bad header\n", close=True)
                return
            key = name.lower()
            if key == "host":
                hosts += 1
            elif key == "content-length":
                lengths.update(v.strip(" \t") for v in value.split(","))
            # repeated lines are one comma-separated list (RFC 9110 5.3)
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        # RFC 9112 3.2: a server MUST answer 400 to an HTTP/1.1 request without a Host
        # line, and to any request with more than one
        if hosts > 1 or (hosts == 0 and version != "HTTP/1.0"):
            self._respond(conn, 400, b"bad or missing Host\n", close=True)
            return
        # Content-Length = 1*DIGIT (RFC 9110 8.6); differing values, or one that is not
        # digits, make the framing invalid: 400 and close (RFC 9112 6.3 item 5), never
        # a guess at where the next request starts
        if len(lengths) > 1 or any(not (v.isascii() and v.isdigit()) for v in lengths):
            self._respond(conn, 400, b"bad Content-Length\n", close=True)
            return
        # (digits compared as text: int() refuses over 4,300 digits, a head may hold 8 KB)
        if "transfer-encoding" in headers or any(v.lstrip("0") for v in lengths):
            self._respond(conn, 400, b"a request body is not accepted\n", close=True)
            return
        connection = headers.get("connection", "").lower()
        close = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
        # an HTTP/1.0 client keeps the connection only when the answer says so (RFC 9112
        # C.2.2, RFC 2068 19.7.1)
        keep_alive = version == "HTTP/1.0" and not close
        if method not in ("GET", "HEAD"):
            self._respond(
                conn, 405, b"method not allowed\n", close=close, allow=True, keep_alive=keep_alive
            )
            return
        # absolute-form (RFC 9112 3.2.2: "a server MUST accept the absolute-form"): the
        # path is what follows the authority
        if target[:1] != "/" and "://" in target:
            scheme, _, rest = target.partition("://")
            if scheme.lower() in ("http", "https"):
                target = "/" + rest.partition("/")[2]
        path = target.split("?", 1)[0]
        if path == "/metrics":
            if accepts_gzip(headers.get("accept-encoding")):
                body, encoding = self.exposition.body_gzip(), "gzip"
            else:
                body, encoding = self.exposition.body, None
            self._respond(
                conn,
                200,
                body,
                CONTENT_TYPE_TEXT,
                close,
                encoding,
                True,
                head_only=method == "HEAD",
                keep_alive=keep_alive,
            )
        elif path == "/":
            self._respond(
                conn,
                200,
                _INDEX,
                "text/html; charset=utf-8",
                close,
                head_only=method == "HEAD",
                keep_alive=keep_alive,
            )
        else:
            self._respond(
                conn,
                404,
                b"not found\n",
                close=close,
                head_only=method == "HEAD",
                keep_alive=keep_alive,
            )
        conn.deadline = time.monotonic() + self.idle_timeout_seconds

    def _http_date(self) -> str:
        now = int(time.time())
        if self._date[0] != now:  # IMF-fixdate (RFC 9110 5.6.7), once a second
            # email.utils is loaded in the daemon already (importlib.metadata, for the
            # plugins' entry points)
            from email.utils import formatdate

            self._date = (now, formatdate(now, usegmt=True))
        return self._date[1]

    def _respond(
        self,
        conn: _Connection,
        status: int,
        body: bytes,
        ctype: str = "text/plain; charset=utf-8",
        close: bool = False,
        encoding: str | None = None,
        vary: bool = False,
        *,
        head_only: bool = False,
        allow: bool = False,
        keep_alive: bool = False,
    ) -> None:
        head = [
            f"HTTP/1.1 {status} {_REASONS[status]}",
            "Server: hetpatrol",
            f"Date: {self._http_date()}",
            f"Content-Type: {ctype}",
            f"Content-Length: {len(body)}",
        ]
        if vary:
            head.append("Vary: Accept-Encoding")
        if encoding:
            head.append(f"Content-Encoding: {encoding}")
        if allow:
            head.append("Allow: GET, HEAD")
        if status == 503:
            head.append("Retry-After: 1")
        if close or conn.retire:
            head.append("Connection: close")
            conn.closing = True
        elif keep_alive:
            head.append("Connection: keep-alive")
        conn.outbuf += ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        if not head_only:
            conn.outbuf += body

    def _close(self, conn: _Connection) -> None:
        fd = conn.sock.fileno()
        if self._conns.pop(fd, None) is None:
            return
        left = self._per_source.pop(conn.source, 1) - 1
        if left:
            self._per_source[conn.source] = left
        if self._paused_full:  # a slot is free: the listener is watched again at once
            self._paused_full = False
            self._accept_paused_until = min(self._accept_paused_until, time.monotonic())
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
