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

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field

from hetpatrol.ledger.sacct_stream import JobRun
from hetpatrol.ledger.tres import card_counts, label

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
    ``by_type`` what Prometheus saw per card type; ``status`` ``ok``, ``no_process`` or
    ``no_data`` (see the module doc)."""

    job_id: str
    user: str
    account: str
    start: float
    end: float
    allocated: dict[str, int]
    allocated_card_seconds: float
    by_type: list[CardTypeUse] = field(default_factory=list)
    status: str = "ok"

    @property
    def busy_card_seconds(self) -> float:
        return sum(t.busy_card_seconds for t in self.by_type)

    @property
    def efficiency(self) -> float | None:
        if self.status == "no_data" or self.allocated_card_seconds <= 0:
            return None
        return self.busy_card_seconds / self.allocated_card_seconds

    @property
    def idle_cards(self) -> int | None:
        if self.status == "no_data":
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


class Prometheus:
    """The HTTP API at ``url`` (``http://host:9090``)."""

    def __init__(self, url: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        qs = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
        try:
            with urllib.request.urlopen(
                f"{self.url}/api/v1/query_range?{qs}", timeout=self.timeout
            ) as resp:
                doc = json.load(resp)
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")[:500]
            raise PrometheusError(f"{self.url}: HTTP {exc.code}: {body}") from None
        except (OSError, ValueError) as exc:
            raise PrometheusError(f"{self.url}: {exc}") from None
        if doc.get("status") != "success":
            raise PrometheusError(f"{self.url}: {doc.get('error', doc)}")
        return doc["data"]["result"]


def _step(start: float, end: float, max_points: int = 1000, min_step: float = 1.0) -> float:
    return max(min_step, math.ceil((end - start) / max_points))


def job_efficiency(
    run: JobRun, prom: Prometheus, now: float, min_step: float = 1.0
) -> JobEfficiency | None:
    """The efficiency of one run; None when it held no cards or has not started."""
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
        return eff
    n_points = int(span // step) + 1
    per: dict[tuple[str, str], CardTypeUse] = {}
    utils: dict[tuple[str, str], list[float]] = {}
    for series in util:
        m = series["metric"]
        k = (m.get("vendor", ""), m.get("card_type", ""))
        t = per.setdefault(k, CardTypeUse(*k))
        t.cards_seen += 1
        values = [float(v) for _ts, v in series["values"]]
        utils.setdefault(k, []).extend(values)
        # the mean over the span's steps (a missing step counts as not busy) x the span
        t.busy_card_seconds += sum(values) / n_points * span
    mems: dict[tuple[str, str], list[float]] = {}
    for series in mem:
        m = series["metric"]
        k = (m.get("vendor", ""), m.get("card_type", ""))
        if k not in per:  # memory but no utilization series: seen, busy unknown (0)
            per[k] = CardTypeUse(*k, cards_seen=1)
        mems.setdefault(k, []).extend(float(v) for _ts, v in series["values"])
    for k, t in per.items():
        if utils.get(k):
            t.mean_utilization = round(sum(utils[k]) / len(utils[k]), 6)
        if mems.get(k):
            t.mean_memory_bytes = round(sum(mems[k]) / len(mems[k]), 1)
        # busy time never exceeds the span the card could have been busy
        t.busy_card_seconds = min(t.busy_card_seconds, t.cards_seen * span)
    eff.by_type = sorted(per.values(), key=lambda t: (t.vendor, t.card_type))
    return eff


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
