"""Instant queries against Prometheus's HTTP API (``POST /api/v1/query``).

The answer is the ``vector`` result type: a list of ``{"metric": {labels},
"value": [unix_time, "value as string"]}``
(https://prometheus.io/docs/prometheus/latest/querying/api/#instant-queries).
Errors (no answer, HTTP error, ``"status": "error"``, an answer of another shape) raise
:class:`PrometheusError` with the URL and Prometheus's own ``error`` text.

Bounds: each query has an overall deadline of ``timeout`` seconds (connect, headers and
body together: a server that drips its answer byte by byte is cut off at the deadline,
not at ``timeout`` per read), and no query runs past the client's ``deadline`` (one
``--timeout`` for a whole command, however many queries it makes); an answer larger
than :data:`ANSWER_MAX` bytes is refused (by its Content-Length unread, else once that
many bytes came): parsed, a JSON answer takes some 40 times its size in memory (a 200 MB
answer took 7.4 GB).
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import http.client

    from hetpatrol.recorded import Recording

#: Seconds one query may take, all of it.
QUERY_TIMEOUT = 30.0
#: Most bytes of one answer: 16 MiB. The fleet's queries aggregate on the server: the
#: largest, ``count by (node, instance, vendor, card_type, ...)``, is ~250 bytes per node
#: and card type, some 5 MB for 10,000 nodes of two types.
ANSWER_MAX = 16 * 1024 * 1024
#: Most bytes of an error answer read for its message.
_ERROR_MAX = 64 * 1024
_CHUNK = 1 << 16


class PrometheusError(RuntimeError):
    """A query failed; the message names the server and the query."""


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector: its labels and its value (NaN, +Inf, -Inf and a
    null value are kept as float NaN/inf: the reader decides what a non-finite value
    means)."""

    labels: dict[str, str]
    value: float


class _Deadline:
    """Shuts the connection's socket at the deadline: a blocked read returns at once."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float):
        self.conn = conn
        #: the connected socket, kept: ``conn.sock`` is dropped once a response that
        #: closes the connection has its headers (its body is read through the file)
        self.sock: socket.socket | None = None
        self.expired = threading.Event()
        self.timer = threading.Timer(seconds, self._fire)
        self.timer.daemon = True

    def _fire(self) -> None:
        self.expired.set()
        sock = self.sock or self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> _Deadline:
        self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.timer.cancel()
        self.conn.close()


class PrometheusClient:
    """Instant queries against ``base_url`` (``http://prometheus:9090``, a path prefix
    such as ``/prometheus`` kept); ``timeout``: seconds per query, all of it;
    ``deadline``: ``time.monotonic()`` after which no query runs or goes on (a command's
    ``--timeout`` as a whole); ``max_bytes``: the largest answer read."""

    def __init__(
        self,
        base_url: str,
        timeout: float = QUERY_TIMEOUT,
        max_bytes: int = ANSWER_MAX,
        *,
        deadline: float | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.deadline = deadline

    def _seconds_left(self, url: str) -> float:
        """Seconds this query may take: ``timeout``, or less when the deadline is nearer;
        ``PrometheusError`` when the deadline has passed."""
        if self.deadline is None:
            return self.timeout
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise PrometheusError(f"{url}: no time left of the --timeout for this query")
        return min(self.timeout, left)

    def _post(self, url: str, body: bytes) -> tuple[int, bytes]:
        """(HTTP status, body) within the deadline and the size bound."""
        # imported here: http.client brings ssl (~5 MB), which hetpatrol run must not
        # hold for a command it never runs (cli imports this module for its parser)
        import http.client

        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise PrometheusError(f"{url}: not an http:// or https:// URL")
        host = parts.netloc.rpartition("@")[2]
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        seconds = self._seconds_left(url)
        conn = cls(host, timeout=seconds)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        with _Deadline(conn, seconds) as deadline:
            try:
                conn.connect()  # within ``timeout``, which the deadline is
                deadline.sock = conn.sock
                conn.request(
                    "POST",
                    path,
                    body=body,
                    headers={"Content-Type": "application/x-www-form-urlencoded"},
                )
                resp = conn.getresponse()
                limit = self.max_bytes if resp.status == 200 else _ERROR_MAX
                length = resp.getheader("Content-Length")
                if resp.status == 200 and length and length.isdigit() and int(length) > limit:
                    raise PrometheusError(
                        f"{url}: answer of {int(length)} bytes is larger than {limit} "
                        "bytes: not read"
                    )
                chunks, total = [], 0
                while True:
                    chunk = resp.read1(_CHUNK)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    total += len(chunk)
                    if total > limit:
                        if resp.status != 200:
                            break  # enough of an error page for its message
                        raise PrometheusError(f"{url}: answer larger than {limit} bytes: not read")
                if deadline.expired.is_set():
                    raise OSError("expired")
                return resp.status, b"".join(chunks)
            except (http.client.HTTPException, OSError) as exc:
                if deadline.expired.is_set():
                    raise PrometheusError(
                        f"{url}: no complete answer within {seconds:g} s"
                    ) from None
                if isinstance(exc, socket.timeout):
                    raise PrometheusError(f"{url}: no answer within {seconds:g} s") from None
                raise PrometheusError(
                    f"{url}: {exc.strerror or exc}"
                    if isinstance(exc, OSError)
                    else f"{url}: {exc!r}"
                ) from None

    def query(self, expr: str) -> list[Sample]:
        """The instant vector of ``expr`` at the server's now.

        ``PrometheusError`` when there is no answer within the deadline, the answer is
        an error, larger than the bound, or not an instant vector of that shape.
        """
        url = f"{self.base_url}/api/v1/query"
        body = urllib.parse.urlencode({"query": expr}).encode()
        status, raw = self._post(url, body)
        if status != 200:  # 400/422/503 carry Prometheus's JSON error
            detail = _error_text(raw) or (
                f"HTTP {status}, not an answer of Prometheus's HTTP API "
                f"(is {self.base_url} the Prometheus server, not an exporter?)"
            )
            raise PrometheusError(f"{url}: {detail} (query {expr!r})")
        try:
            doc = json.loads(raw)
        except RecursionError:
            raise PrometheusError(_shape(url, "nested too deep")) from None
        except ValueError:
            raise PrometheusError(
                f"{url}: answer is not JSON: {raw[:200]!r} (is {self.base_url} the "
                "Prometheus server, not an exporter?)"
            ) from None
        if not isinstance(doc, dict):
            raise PrometheusError(_shape(url, f"a JSON {type(doc).__name__}, not an object"))
        if doc.get("status") != "success":
            raise PrometheusError(f"{url}: {_error_text(raw) or 'no status'} (query {expr!r})")
        data = doc.get("data")
        if not isinstance(data, dict):
            raise PrometheusError(_shape(url, "'data' is not an object"))
        if data.get("resultType") != "vector":
            raise PrometheusError(
                f"{url}: expected an instant vector, got {str(data.get('resultType'))[:80]!r}"
            )
        result = data.get("result")
        if result is None:
            result = []
        if not isinstance(result, list):
            raise PrometheusError(_shape(url, "'result' is not a list"))
        return [_sample(url, i, item) for i, item in enumerate(result)]


class RecordedPrometheus(PrometheusClient):
    """Answers from a recording (:class:`hetpatrol.recorded.Recording`, ``--replay``)
    instead of a server: each query's recorded JSON answer, read by the same checks."""

    def __init__(self, recording: Recording):
        super().__init__(f"file:{recording.root}")
        self.recording = recording

    def _post(self, url: str, body: bytes) -> tuple[int, bytes]:
        (expr,) = urllib.parse.parse_qs(body.decode())["query"]
        return 200, self.recording.answer(expr)


def _shape(url: str, why: str) -> str:
    return f"{url}: Prometheus answered an unexpected shape: {why}"


def _sample(url: str, i: int, item: Any) -> Sample:
    """One ``{"metric": {...}, "value": [t, "v"]}``; a value that is not a number (null,
    ``"NaN"``) is NaN."""
    if not isinstance(item, dict):
        raise PrometheusError(_shape(url, f"result[{i}] is not an object"))
    metric = item.get("metric") or {}
    if not isinstance(metric, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metric.items()
    ):
        raise PrometheusError(_shape(url, f"result[{i}].metric is not string labels"))
    pair = item.get("value")
    if not isinstance(pair, list) or len(pair) != 2:
        raise PrometheusError(_shape(url, f"result[{i}].value is not [time, value]"))
    value = pair[1]
    try:
        number = float(value) if isinstance(value, (str, int, float)) else math.nan
    except ValueError:
        number = math.nan
    if isinstance(value, bool):
        number = math.nan
    return Sample(dict(metric), number)


def _error_text(raw: bytes) -> str | None:
    """Prometheus's ``errorType: error`` of a JSON error answer; None for anything else
    (an HTML page of some other server says nothing to the reader)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or not ("error" in doc or "errorType" in doc):
        return None
    return f"{str(doc.get('errorType', 'error'))[:100]}: {str(doc.get('error', ''))[:500]}"
