"""Card quotas per account (and user) and GRES type, against the ledger's usage.

Limits come from what Slurm itself enforces (``sacctmgr show assoc``; sacctmgr(1),
https://slurm.schedmd.com/sacctmgr.html, GrpTRESMins / GrpTRES / MaxTRESPerJob) or, for a
site that meters outside Slurm, from a quota file (YAML)::

    quotas:
      - account: physics
        gres: gpu:a100          # or a bare "gpu": every GPU type counts
        card_hours: 500
      - account: chemistry
        user: hpbob             # optional: that user's share only
        gres: ascend:910b
        card_hours: 40

How usage is measured per kind of limit:

* ``GrpTRESMins`` and ``card_hours``: card-minutes (hours) the account (with its
  sub-accounts, through ``ParentName``) or user held in the ledger's window. Slurm
  enforces GrpTRESMins against its own decayed usage since the last reset
  (``PriorityDecayHalfLife``, ``PriorityUsageResetPeriod``; only with
  priority/multifactor): pick the window that matches the site's reset period.
* ``GrpTRES``: cards of the type held now by running jobs.
* ``MaxTRESPerJob``: the most cards of the type one run held in the window.

A limit on an untyped name (``gres/gpu=8``) counts every type of that name.
Status: ``ok`` below 80 %, ``warning`` from 80 %, ``reached`` from 100 % (at the limit:
a per-job or concurrent limit still allows it, a time quota is used up).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from hetpatrol.ledger.tres import parse_tres
from hetpatrol.ledger.usage import Ledger
from hetpatrol.slurm.gres import parse_count
from hetpatrol.yaml_document import DocumentError, format_key_path, parse_document, read_document

WARN_AT, REACHED_AT = 0.8, 1.0
ASSOC_FIELDS = (
    "Cluster",
    "Account",
    "User",
    "Partition",
    "ParentName",
    "GrpTRESMins",
    "GrpTRES",
    "MaxTRESPerJob",
)
#: limit kind -> unit of its value
KINDS = {
    "GrpTRESMins": "card_minutes",
    "card_hours": "card_hours",
    "GrpTRES": "cards",
    "MaxTRESPerJob": "cards",
}


class QuotaError(ValueError):
    """A quota file or sacctmgr line that cannot be read (the text in the message)."""


@dataclass(frozen=True)
class Limit:
    """One limit: on ``account`` (``user`` empty: the whole account) for GRES ``gres``
    (``gpu:a100``, or ``gpu`` for every type), ``kind`` one of :data:`KINDS`, ``value`` in
    that kind's unit; ``source`` ``sacctmgr`` or the quota file's path."""

    account: str
    user: str
    gres: str
    kind: str
    value: float
    source: str


@dataclass(frozen=True)
class QuotaRow:
    limit: Limit
    used: float

    @property
    def ratio(self) -> float:
        return self.used / self.limit.value if self.limit.value > 0 else float("inf")

    @property
    def status(self) -> str:
        r = self.ratio
        return "reached" if r >= REACHED_AT else "warning" if r >= WARN_AT else "ok"

    def to_dict(self) -> dict:
        lim = self.limit
        return {
            "account": lim.account,
            "user": lim.user,
            "gres": lim.gres,
            "kind": lim.kind,
            "unit": KINDS[lim.kind],
            "limit": lim.value,
            "used": round(self.used, 6),
            "ratio": round(self.ratio, 6),
            "status": self.status,
            "source": lim.source,
        }


def sacctmgr_argv(prefix: Iterable[str] = ("sacctmgr",)) -> list[str]:
    return [*prefix, "-n", "-P", "show", "assoc", "format=" + ",".join(ASSOC_FIELDS)]


def parse_assoc(text: str) -> tuple[list[Limit], dict[str, str]]:
    """``sacctmgr -n -P show assoc format=`` :data:`ASSOC_FIELDS` -> card limits and the
    account -> parent account map. Limits on non-GRES TRES (cpu, mem) are left out."""
    limits: list[Limit] = []
    parents: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != len(ASSOC_FIELDS):
            raise QuotaError(
                f"sacctmgr line {lineno}: expected {len(ASSOC_FIELDS)} fields: {line!r}"
            )
        row = dict(zip(ASSOC_FIELDS, parts, strict=True))
        if not row["User"] and row["ParentName"]:
            parents[row["Account"]] = row["ParentName"]
        for kind in ("GrpTRESMins", "GrpTRES", "MaxTRESPerJob"):
            for key, value in parse_tres(row[kind]).items():
                if not key.startswith("gres/"):
                    continue
                count = parse_count(value)
                if count is None:
                    raise QuotaError(f"sacctmgr line {lineno}: {kind} {key}={value!r}")
                limits.append(
                    Limit(
                        row["Account"], row["User"], key[5:].lower(), kind, float(count), "sacctmgr"
                    )
                )
    return limits, parents


_ENTRY_KEYS = ("account", "user", "gres", "card_hours")


def _line_of(node, path: tuple) -> int | None:
    """1-based line of the value at ``path`` (keys, list indexes) in a composed YAML tree;
    the deepest node found on the way when the rest is missing."""
    line = None if node is None else node.start_mark.line + 1
    for part in path:
        nxt = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == part:
                    nxt = v
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            nxt = node.value[part] if part < len(node.value) else None
        if nxt is None:
            break
        node, line = nxt, nxt.start_mark.line + 1
    return line


def load_quota_file(path: Path) -> list[Limit]:
    """The limits of a quota file (see the module doc).

    Read with the guarded YAML reader (:func:`hetpatrol.yaml_document.read_document`: a
    regular UTF-8 file of at most 4 MiB, nesting and alias expansion bounded). Each entry
    is a mapping with ``account`` and ``gres`` (strings), optional ``user`` (a string),
    ``card_hours`` (a finite number > 0) and nothing else. :class:`QuotaError` names the
    file, the line and the key (``quotas[0].card_hours``) of what is wrong.
    """
    try:
        doc, root = parse_document(read_document(path))
    except OSError as exc:
        raise QuotaError(f"{path}: {exc.strerror or exc}") from None
    except DocumentError as exc:
        raise QuotaError(f"{path}: {exc}") from None

    def fail(where: tuple, message: str) -> QuotaError:
        line = _line_of(root, where)
        at = f"line {line}: " if line is not None else ""
        return QuotaError(f"{path}: {at}{format_key_path(where)}: {message}")

    entries = doc.get("quotas") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise fail(("quotas",), "expected a top-level 'quotas:' list")
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not e.get("account") or not e.get("gres"):
            raise fail(("quotas", i), f"quota {i + 1} needs 'account' and 'gres': {e!r}"[:300])
        unknown = [k for k in e if k not in _ENTRY_KEYS]
        if unknown:
            raise fail(
                ("quotas", i, str(unknown[0])),
                f"unknown key {str(unknown[0])!r}; one of {', '.join(_ENTRY_KEYS)}",
            )
        for key in ("account", "gres", "user"):
            value = e.get(key)
            if value is not None and not isinstance(value, str):
                raise fail(
                    ("quotas", i, key),
                    f"{key} must be a string, not {type(value).__name__} {value!r}"[:300]
                    + " (quote it)",
                )
        hours = e.get("card_hours")
        if (
            isinstance(hours, bool)
            or not isinstance(hours, int | float)
            or not math.isfinite(hours)
            or not hours > 0
        ):
            raise fail(
                ("quotas", i, "card_hours"),
                f"quota {i + 1}: card_hours must be a finite number > 0: {hours!r}"[:300],
            )
        out.append(
            Limit(e["account"], e.get("user") or "", e["gres"].lower(), "card_hours",
                  float(hours), str(path))
        )  # fmt: skip
    return out


def _matches(limit_gres: str, gres: str) -> bool:
    return gres == limit_gres or (":" not in limit_gres and gres.split(":")[0] == limit_gres)


def evaluate(limits: Iterable[Limit], ledger: Ledger, parents: dict[str, str]) -> list[QuotaRow]:
    """Usage against each limit. ``ledger`` must be grouped by ("account", "user")."""
    if ledger.by != ("account", "user"):
        raise ValueError("quota evaluation needs a ledger grouped by account, user")

    def ancestors(account: str) -> list[str]:
        out, seen = [account], {account}
        while (p := parents.get(out[-1])) and p not in seen:
            out.append(p)
            seen.add(p)
        return out

    rows = []
    for lim in limits:
        used = 0.0
        for (account, user, gres), t in ledger.groups.items():
            if not _matches(lim.gres, gres) or lim.account not in ancestors(account):
                continue
            if lim.user and user != lim.user:
                continue
            if lim.kind == "GrpTRESMins":
                used += t.card_seconds / 60.0
            elif lim.kind == "card_hours":
                used += t.card_seconds / 3600.0
            elif lim.kind == "MaxTRESPerJob":
                used = max(used, t.max_cards)
            else:  # GrpTRES: cards held now
                used += ledger.running_cards.get((account, user, gres), 0)
        rows.append(QuotaRow(lim, used))
    return rows


#: exit code when some usage could not be read (the Nagios plugin convention's UNKNOWN)
EXIT_UNKNOWN = 3


def exit_code(rows: Iterable[QuotaRow], unreadable: int = 0) -> int:
    """0 every quota below 80 %, 1 one at 80 % or more, 2 one at 100 % or more; 3
    (:data:`EXIT_UNKNOWN`) instead of 0 or 1 when ``unreadable`` TRES items were left out
    (the usage may be higher than counted; a quota reached stays 2, since what could not
    be read can only add to it)."""
    statuses = {r.status for r in rows}
    if "reached" in statuses:
        return 2
    if unreadable:
        return EXIT_UNKNOWN
    return 1 if "warning" in statuses else 0


def write_textfile(rows: list[QuotaRow], ledger: Ledger, path: Path) -> None:
    """The quotas as Prometheus text exposition (for node_exporter's textfile collector or
    a push), written atomically:

    ``hetpatrol_ledger_quota_usage_ratio{account,user,gres,limit}`` (used / limit),
    ``hetpatrol_ledger_quota_limit`` and ``hetpatrol_ledger_quota_used`` in the limit's
    unit (label ``unit``: card_minutes, card_hours, cards), and
    ``hetpatrol_ledger_card_seconds{account,user,gres}`` (usage in the window).
    """
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    from hetpatrol.exporters.state import write_atomic

    class _Collector:
        def collect(self):
            labels = ["account", "user", "gres", "limit", "unit"]
            ratio = GaugeMetricFamily(
                "hetpatrol_ledger_quota_usage_ratio",
                "Card usage over its quota (1 = quota reached).",
                labels=labels[:4],
            )
            limit = GaugeMetricFamily(
                "hetpatrol_ledger_quota_limit",
                "Card quota, in the unit of label unit.",
                labels=labels,
            )
            used = GaugeMetricFamily(
                "hetpatrol_ledger_quota_used",
                "Card usage counted against the quota, in the unit of label unit.",
                labels=labels,
            )
            for r in rows:
                lim = r.limit
                lv = [lim.account, lim.user, lim.gres, lim.kind]
                ratio.add_metric(lv, r.ratio)
                limit.add_metric([*lv, KINDS[lim.kind]], lim.value)
                used.add_metric([*lv, KINDS[lim.kind]], r.used)
            secs = GaugeMetricFamily(
                "hetpatrol_ledger_card_seconds",
                "Cards x seconds held in the ledger window.",
                labels=["account", "user", "gres"],
            )
            for (account, user, gres), t in sorted(ledger.groups.items()):
                secs.add_metric([account, user, gres], t.card_seconds)
            bad = GaugeMetricFamily(
                "hetpatrol_ledger_unreadable_tres_items",
                "AllocTRES items of the window's records that could not be read and were "
                "left out of the usage (above 0: the usage may be higher).",
            )
            bad.add_metric([], ledger.bad_tres_count)
            yield from (ratio, limit, used, secs, bad)

    registry = CollectorRegistry()
    registry.register(_Collector())
    # not prometheus_client's write_to_textfile: it opens a temporary file of a
    # guessable name (path.<pid>.<thread>) following symlinks; write_atomic refuses
    # links and other users' directories (hetpatrol/safe_files.py)
    write_atomic(Path(path), generate_latest(registry))
