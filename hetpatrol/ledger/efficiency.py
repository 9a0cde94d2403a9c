"""Per-job efficiency across vendors: cards allocated (sacct) vs busy (Prometheus).

For each job run the cards it held come from ``AllocTRES`` (:mod:`.tres`); what the cards
did comes from the series hetpatrol's daemons export, read back from Prometheus's HTTP
API (``/api/v1/query_range``; https://prometheus.io/docs/prometheus/latest/querying/api/)
over the run's Start..End, the way jobstats does it for NVIDIA, here for NVIDIA and
Ascend alike:

* a card belongs to the job at a step when ``hetpatrol_card_process_memory_bytes`` has a
  series with ``slurm_job="<id>"`` on it (a process of the job holds memory there; the only
  per-card series with the job label, see hetpatrol/exporters/prometheus.py);
* its busy share at that step is ``hetpatrol_card_utilization_ratio`` of the same
  ``instance`` and ``uuid`` (NVML utilization.gpu, npu-smi AICore %);
* its memory is the job's own ``hetpatrol_card_process_memory_bytes`` summed per card.

``busy_card_seconds`` = sum over the job's cards of (mean utilization over the span's
steps, a step without a sample counting 0) x the span;
``efficiency`` = busy / allocated card-seconds; ``idle_cards`` = cards allocated minus
cards on which a process of the job was ever seen.

When Prometheus has no data: ``status`` says which case it is, never a zero efficiency:
``no_data`` when no hetpatrol card series at all exists in the run's span (no daemon was
scraped then: the efficiency is unknown), ``no_process`` when hetpatrol reported cards
then but no process of the job was seen on any (the cards were held idle, or the job's
processes were not attributed: ``slurm_job`` needs the daemon to read /proc as root).
Prometheus cannot tell which node an ``instance`` is, so ``no_data`` is judged over all
instances.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import socket
import threading
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field

from hetpatrol.ledger.sacct_stream import JobRun
from hetpatrol.ledger.tres import card_counts, label
from hetpatrol.node_view import printable

UTIL = "hetpatrol_card_utilization_ratio"
PROC_MEM = "hetpatrol_card_process_memory_bytes"


class PrometheusError(RuntimeError):
    """Prometheus could not be reached or answered an error (its text in the message)."""


@dataclass
class CardTypeUse:
    """What the job's cards of one Prometheus ``vendor``/``card_type`` did."""

    vendor: str
    card_type: str
    cards_seen: int = 0
    busy_card_seconds: float = 0.0
    mean_utilization: float | None = None
    mean_memory_bytes: float | None = None


@dataclass
class JobEfficiency:
    """One job run: ``allocated`` cards per GRES label and ``allocated_card_seconds``;
    ``by_type`` what Prometheus saw per card type; ``status`` ``ok``, ``no_process``,
    ``no_data`` (see the module doc) or ``unknown`` (``reason`` says why: an answer of an
    unexpected shape, or every utilization sample unreadable)."""

    job_id: str
    user: str
    account: str
    start: float
    end: float
    allocated: dict[str, int]
    allocated_card_seconds: float
    by_type: list[CardTypeUse] = field(default_factory=list)
    status: str = "ok"
    #: samples left out: utilization not a ratio in 0..1 (NaN, +-Inf, negative, above 1),
    #: memory not a finite number >= 0
    dropped_samples: int = 0
    #: why the status is ``unknown`` (Prometheus's answer could not be read, or no sample
    #: was left once the unreadable ones were dropped)
    reason: str = ""

    @property
    def busy_card_seconds(self) -> float:
        return sum(t.busy_card_seconds for t in self.by_type)

    @property
    def efficiency(self) -> float | None:
        if self.status in ("no_data", "unknown") or self.allocated_card_seconds <= 0:
            return None
        return self.busy_card_seconds / self.allocated_card_seconds

    @property
    def idle_cards(self) -> int | None:
        if self.status in ("no_data", "unknown"):
            return None
        return max(0, sum(self.allocated.values()) - sum(t.cards_seen for t in self.by_type))

    def to_dict(self) -> dict:
        eff = self.efficiency
        return {
            "job_id": self.job_id,
            "user": self.user,
            "account": self.account,
            "allocated": self.allocated,
            "allocated_card_hours": round(self.allocated_card_seconds / 3600, 6),
            "busy_card_hours": round(self.busy_card_seconds / 3600, 6),
            "efficiency": None if eff is None else round(eff, 4),
            "idle_cards": self.idle_cards,
            "status": self.status,
            "reason": self.reason,
            "dropped_samples": self.dropped_samples,
            "by_type": [
                {
                    "vendor": t.vendor,
                    "card_type": t.card_type,
                    "cards_seen": t.cards_seen,
                    "mean_utilization": t.mean_utilization,
                    "mean_memory_bytes": t.mean_memory_bytes,
                }
                for t in self.by_type
            ],
        }


class PrometheusShapeError(PrometheusError):
    """Prometheus answered, but not the ``query_range`` document of its API (what was
    wrong in the message); the job asked about is ``unknown``."""


#: Largest ``query_range`` answer read (a job's few cards x 1000 steps is far below).
MAX_RESPONSE_BYTES = 32 * 1024 * 1024


def _shape(doc: object) -> list[tuple[dict[str, str], list[tuple[float, str]]]]:
    """A ``query_range`` document -> [(metric labels, [(timestamp, value text)])], or
    :class:`PrometheusShapeError` naming what is not as the API documents it
    (``{"status": "success", "data": {"resultType": "matrix", "result": [{"metric":
    {...}, "values": [[ts, "v"], ...]}]}}``)."""
    if not isinstance(doc, dict):
        raise PrometheusShapeError(f"the answer is a JSON {type(doc).__name__}, not an object")
    data = doc.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        raise PrometheusShapeError("no data.result list")
    out = []
    for i, series in enumerate(result):
        metric = series.get("metric") if isinstance(series, dict) else None
        values = series.get("values") if isinstance(series, dict) else None
        if not isinstance(metric, dict) or not isinstance(values, list):
            raise PrometheusShapeError(f"result[{i}] has no metric object and values list")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
            raise PrometheusShapeError(f"result[{i}].metric: labels are not strings")
        pairs = []
        for j, pair in enumerate(values):
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not isinstance(pair[0], int | float)
                or isinstance(pair[0], bool)
                or not isinstance(pair[1], str)
            ):
                raise PrometheusShapeError(
                    f'result[{i}].values[{j}] is not [timestamp, "value"]: {pair!r}'[:200]
                )
            pairs.append((float(pair[0]), pair[1]))
        out.append((metric, pairs))
    return out


def _sample(text: str) -> float:
    """A sample value as Prometheus writes it (``"0.8"``, ``"NaN"``, ``"+Inf"``);
    :class:`PrometheusShapeError` for text that is not a number."""
    try:
        return float(text)
    except ValueError:
        raise PrometheusShapeError(f"sample value {text[:40]!r} is not a number") from None


class Prometheus:
    """The HTTP API at ``url`` (``http://host:9090``, or https).

    Each query has an overall deadline of ``timeout`` seconds, connection, headers and
    body together (urllib's timeout bounds each read alone: a server dripping a byte at a
    time never trips it), and an answer larger than ``max_bytes`` is refused: both
    :class:`PrometheusError`.
    """

    def __init__(self, url: str, timeout: float = 30.0, max_bytes: int = MAX_RESPONSE_BYTES):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.max_bytes = max_bytes
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PrometheusError(f"{url}: not an http:// or https:// URL")
        self._parts = parts

    def _get(self, target: str) -> tuple[int, bytes]:
        parts = self._parts
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        try:
            conn = cls(parts.hostname, parts.port, timeout=self.timeout)
        except ValueError as exc:  # a port that is not a number
            raise PrometheusError(f"{self.url}: {exc}") from None
        expired = threading.Event()
        held: list[socket.socket] = []

        def _expire() -> None:  # unblocks whatever read is waiting on the socket
            expired.set()
            for sock in held:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(self.timeout, _expire)
        timer.daemon = True
        timer.start()
        try:
            conn.connect()  # bounded by the socket timeout (= the deadline)
            held.append(conn.sock)  # http.client drops conn.sock once the answer is read
            if expired.is_set():
                _expire()
            conn.request("GET", parts.path + target, headers={"Accept": "application/json"})
            resp = conn.getresponse()
            length = resp.getheader("Content-Length")
            if length and length.isdigit() and int(length) > self.max_bytes:
                raise PrometheusError(
                    f"{self.url}: answer of {length} bytes, more than {self.max_bytes}"
                )
            body = bytearray()
            while chunk := resp.read1(1 << 16):
                body += chunk
                if len(body) > self.max_bytes:
                    raise PrometheusError(f"{self.url}: answer larger than {self.max_bytes} bytes")
            if expired.is_set():  # the shutdown looks like the end of the answer
                raise OSError("deadline")
            return resp.status, bytes(body)
        except (OSError, http.client.HTTPException) as exc:
            if expired.is_set():
                raise PrometheusError(
                    f"{self.url}: no complete answer within {self.timeout:g} s"
                ) from None
            raise PrometheusError(f"{self.url}: {exc}") from None
        finally:
            timer.cancel()
            conn.close()

    def query_range(self, expr: str, start: float, end: float, step: float) -> list:
        """``[(labels, [(timestamp, value text)])]`` of ``expr`` over start..end (Unix
        seconds) every ``step`` seconds. :class:`PrometheusError` when Prometheus cannot
        be reached, answers an HTTP or API error, too late or too much;
        :class:`PrometheusShapeError` when the answer is not the API's document."""
        qs = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
        status, body = self._get(f"/api/v1/query_range?{qs}")
        try:
            doc = json.loads(body.decode("utf-8"))
        except RecursionError:
            raise PrometheusShapeError("JSON nested too deeply") from None
        except ValueError as exc:  # not UTF-8, not JSON
            if status != 200:
                text = printable(body[:500].decode("utf-8", errors="replace"))
                raise PrometheusError(f"{self.url}: HTTP {status}: {text}") from None
            raise PrometheusShapeError(f"not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise PrometheusShapeError(f"the answer is a JSON {type(doc).__name__}, not an object")
        if doc.get("status") == "error":
            raise PrometheusError(f"{self.url}: {str(doc.get('error'))[:500]}")
        if status != 200:
            raise PrometheusError(f"{self.url}: HTTP {status}: {str(doc)[:500]}")
        if doc.get("status") != "success":
            raise PrometheusShapeError(f"status is not 'success': {str(doc)[:200]}")
        return _shape(doc)


def _step(start: float, end: float, max_points: int = 1000, min_step: float = 1.0) -> float:
    return max(min_step, math.ceil((end - start) / max_points))


def job_efficiency(
    run: JobRun, prom: Prometheus, now: float, min_step: float = 1.0
) -> JobEfficiency | None:
    """The efficiency of one run; None when it held no cards or has not started.

    Utilization samples that are not a ratio in 0..1 (NaN, +-Inf, negative, above 1) and
    memory samples that are not a finite number >= 0 are dropped and counted
    (``dropped_samples``; a dropped step counts as not busy); when none of the job's
    utilization samples is left the job is ``unknown``. An answer of an unexpected shape
    makes the job ``unknown`` with the reason; :class:`PrometheusError` (unreachable, an
    HTTP or API error, too slow, too large) is raised."""
    if run.start is None:
        return None
    cards = {label(k): v for k, v in card_counts(run.alloc_tres).items()}
    if not cards:
        return None
    start, end = run.start, run.end if run.end is not None else now
    span = max(0.0, end - start)
    eff = JobEfficiency(run.job_id, run.user, run.account, start, end, cards,
                        sum(cards.values()) * span)  # fmt: skip
    step = _step(start, end, min_step=min_step)
    job = run.job_id.replace("\\", "\\\\").replace('"', '\\"')
    try:
        _measure(eff, prom, job, step, span)
    except PrometheusShapeError as exc:
        eff.by_type, eff.dropped_samples = [], 0
        eff.status, eff.reason = "unknown", f"Prometheus answered an unexpected shape: {exc}"
    return eff


def _measure(eff: JobEfficiency, prom: Prometheus, job: str, step: float, span: float) -> None:
    """Fill ``eff`` from Prometheus (see :func:`job_efficiency`)."""
    start, end = eff.start, eff.end
    held = f'count by (instance, uuid) ({PROC_MEM}{{slurm_job="{job}"}})'
    util = prom.query_range(f"{UTIL} * on (instance, uuid) group_left () {held}",
                            start, end, step)  # fmt: skip
    mem = prom.query_range(
        f'sum by (instance, uuid, vendor, card_type) ({PROC_MEM}{{slurm_job="{job}"}})',
        start, end, step,
    )  # fmt: skip
    if not util and not mem:
        any_cards = prom.query_range(f"count({UTIL})", start, end, step)
        eff.status = "no_process" if any_cards else "no_data"
        return
    n_points = int(span // step) + 1
    per: dict[tuple[str, str], CardTypeUse] = {}
    utils: dict[tuple[str, str], list[float]] = {}
    for m, pairs in util:
        k = (m.get("vendor", ""), m.get("card_type", ""))
        t = per.setdefault(k, CardTypeUse(*k))
        t.cards_seen += 1
        values = []
        for _ts, text in pairs:
            v = _sample(text)
            if 0.0 <= v <= 1.0:  # a ratio; NaN, +-Inf and out of range dropped
                values.append(v)
            else:
                eff.dropped_samples += 1
        utils.setdefault(k, []).extend(values)
        # the mean over the span's steps (a missing step counts as not busy) x the span
        t.busy_card_seconds += sum(values) / n_points * span
    mems: dict[tuple[str, str], list[float]] = {}
    for m, pairs in mem:
        k = (m.get("vendor", ""), m.get("card_type", ""))
        if k not in per:  # memory but no utilization series: seen, busy unknown (0)
            per[k] = CardTypeUse(*k, cards_seen=1)
        for _ts, text in pairs:
            v = _sample(text)
            if math.isfinite(v) and v >= 0:
                mems.setdefault(k, []).append(v)
            else:
                eff.dropped_samples += 1
    for k, t in per.items():
        if utils.get(k):
            t.mean_utilization = round(sum(utils[k]) / len(utils[k]), 6)
        if mems.get(k):
            t.mean_memory_bytes = round(sum(mems[k]) / len(mems[k]), 1)
        # busy time never exceeds the span the card could have been busy
        t.busy_card_seconds = min(t.busy_card_seconds, t.cards_seen * span)
    eff.by_type = sorted(per.values(), key=lambda t: (t.vendor, t.card_type))
    if util and not any(utils.values()):
        eff.status = "unknown"
        eff.reason = (
            f"every utilization sample unreadable ({eff.dropped_samples} dropped: "
            "not a ratio in 0..1)"
        )


def efficiencies(
    runs: Iterable[JobRun], prom: Prometheus, now: float, jobs: set[str] | None = None,
    max_jobs: int = 500,
) -> list[JobEfficiency]:  # fmt: skip
    """:func:`job_efficiency` of each run with cards (of ``jobs`` only, when given), at most
    ``max_jobs`` runs (two or three range queries each)."""
    out = []
    for run in runs:
        if jobs is not None and run.job_id not in jobs:
            continue
        e = job_efficiency(run, prom, now)
        if e is not None:
            out.append(e)
            if len(out) >= max_jobs:
                break
    return out
