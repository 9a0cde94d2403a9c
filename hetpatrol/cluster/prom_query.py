"""Instant queries against Prometheus's HTTP API (``GET /api/v1/query``).

The answer is the ``vector`` result type: a list of ``{"metric": {labels},
"value": [unix_time, "value as string"]}``
(https://prometheus.io/docs/prometheus/latest/querying/api/#instant-queries).
Errors (no answer, HTTP error, ``"status": "error"``) raise :class:`PrometheusError`
with the URL and Prometheus's own ``error`` text.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

#: Seconds one query may take.
QUERY_TIMEOUT = 30.0


class PrometheusError(RuntimeError):
    """A query failed; the message names the server and the query."""


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector: its labels and its value (NaN kept as NaN)."""

    labels: dict[str, str]
    value: float


class PrometheusClient:
    """Instant queries against ``base_url`` (``http://prometheus:9090``, a path prefix
    such as ``/prometheus`` kept)."""

    def __init__(self, base_url: str, timeout: float = QUERY_TIMEOUT):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def query(self, expr: str) -> list[Sample]:
        """The instant vector of ``expr`` at the server's now."""
        url = f"{self.base_url}/api/v1/query"
        body = urllib.parse.urlencode({"query": expr}).encode()
        req = urllib.request.Request(
            url, data=body, headers={"Content-Type": "application/x-www-form-urlencoded"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:  # 400/422/503 carry Prometheus's JSON error
            raw = exc.read(64 * 1024)
            detail = _error_text(raw) or (
                f"HTTP {exc.code}, not an answer of Prometheus's HTTP API "
                f"(is {self.base_url} the Prometheus server, not an exporter?)"
            )
            raise PrometheusError(f"{url}: {detail} (query {expr!r})") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusError(f"{url}: {reason}") from None
        try:
            doc = json.loads(raw)
        except ValueError:
            raise PrometheusError(f"{url}: answer is not JSON: {raw[:200]!r}") from None
        if doc.get("status") != "success":
            raise PrometheusError(f"{url}: {_error_text(raw) or 'no status'} (query {expr!r})")
        data = doc.get("data") or {}
        if data.get("resultType") != "vector":
            raise PrometheusError(
                f"{url}: expected an instant vector, got {data.get('resultType')!r}"
            )
        out = []
        for item in data.get("result") or ():
            try:
                value = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                value = float("nan")
            out.append(Sample(dict(item.get("metric") or {}), value))
        return out


def _error_text(raw: bytes) -> str | None:
    """Prometheus's ``errorType: error`` of a JSON error answer; None for anything else
    (an HTML page of some other server is not shown: it says nothing to the reader)."""
    try:
        doc = json.loads(raw)
        return f"{doc.get('errorType', 'error')}: {doc.get('error', '')}"
    except (ValueError, AttributeError):
        return None
