"""Metric families and their Prometheus text format (0.0.4), without prometheus-client.

Why not prometheus-client here: the daemon renders ~250 series per patrol on a 16-card
node, and prometheus-client's ``*MetricFamily`` classes build a ``Sample`` namedtuple and a
label dict per series, and ``generate_latest`` validates and escapes every label of every
series on every call (43 % of the daemon's CPU in a py-spy profile); importing the package
also costs ~10 MB of resident memory (its HTTP server, registry, collectors and parsers),
a quarter of the daemon's. The families here keep each series as a tuple of label values,
and :class:`TextRenderer` keeps each label set's rendered ``{a="x",b="y"}`` from one
render to the next: a label set seen in the last render is looked up, a new one is
rendered once, those not seen again are dropped (the cache holds exactly the last
render's label sets, so it never grows).

The bytes are ``generate_latest``'s: ``tests/test_exposition_text.py`` registers these
families in a prometheus-client registry (through :attr:`Family.samples`, which builds
its ``Sample`` tuples on demand) and compares both outputs on every replay scenario.
prometheus-client stays what the tests parse the exposition with, and what
``hetpatrol ledger`` writes its textfile with.

Rules followed (https://prometheus.io/docs/instrumenting/exposition_formats/):
``# HELP`` escapes ``\\`` and newline; label values escape ``\\``, ``"`` and newline;
label pairs sorted by name; a label whose value is ``""`` is left out (Prometheus treats
an empty label as an absent one); counters get ``_total``, info families ``_info`` and
the ``gauge`` type, state sets the ``gauge`` type. Values are written as Go's
``strconv.FormatFloat(v, 'g', -1, 64)`` would for the values seen here, the way
prometheus-client's ``floatToGoString`` does: ``1.0``, ``+Inf``, ``NaN``, and an exponent
once a positive number has more than six digits before the point (``4.2949673e+09``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: The Content-Type of the text format, version 0.0.4.
CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"

_TYPES = {"info": "gauge", "stateset": "gauge"}


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def format_value(value: float) -> str:
    """A sample value as the text format writes it (see the module docstring).

    ``3`` -> ``3.0``, ``0.5`` -> ``0.5``, ``85899345920`` -> ``8.589934592e+10``,
    ``4294967296`` -> ``4.294967296e+09`` (two exponent digits at least, as Go), ``inf`` ->
    ``+Inf``, ``nan`` -> ``NaN``. Raises ``TypeError``/``ValueError`` for a value that is
    not a number."""
    d = float(value)
    if d != d:
        return "NaN"
    if math.isinf(d):
        return "+Inf" if d > 0 else "-Inf"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


class Family:
    """One metric family: ``name``, ``documentation``, ``type`` and its series.

    A series is kept as ``(sample name, label names, label values, value)``; the label
    names are the family's own tuple for all but info and state-set series. Label values
    are strings, ``""`` meaning "no such label" (left out when rendered).
    """

    type = "gauge"
    unit = ""  # read by prometheus-client's OpenMetrics writer (tests)
    _suffix = ""

    def __init__(
        self,
        name: str,
        documentation: str,
        value: float | None = None,
        labels: Sequence[str] | None = None,
    ):
        self.name = name
        self.documentation = documentation
        self.labelnames: tuple[str, ...] = tuple(labels or ())
        self.rows: list[tuple[str, tuple[str, ...], tuple[str, ...], float]] = []
        if value is not None:
            if self.labelnames:
                raise ValueError("value and labels are exclusive")
            self.add_metric((), value)

    def add_metric(self, labels: Sequence[str], value: Any) -> None:
        """Add one series: ``labels`` are the values of :attr:`labelnames`, in order.
        Raises ``ValueError`` when their count differs."""
        if len(labels) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(labels)} label values for {self.labelnames}")
        self.rows.append((self.name + self._suffix, self.labelnames, tuple(labels), value))

    @property
    def samples(self) -> list:
        """The series as prometheus-client ``Sample`` tuples (labels without the empty
        ones), for its registry and for tests; imports prometheus-client on first use."""
        from prometheus_client.samples import Sample

        return [
            Sample(sname, {k: v for k, v in zip(names, vals, strict=True) if v != ""}, float(v0))
            for sname, names, vals, v0 in self.rows
        ]


class GaugeFamily(Family):
    """A gauge: ``add_metric(label_values, number)``."""


class CounterFamily(Family):
    """A counter: the series is named ``<name>_total`` (a ``_total`` given is dropped)."""

    type = "counter"
    _suffix = "_total"

    def __init__(self, name: str, documentation: str, value=None, labels=None):
        if name.endswith("_total"):
            name = name[: -len("_total")]
        super().__init__(name, documentation, value, labels)


class InfoFamily(Family):
    """An info metric: ``add_metric(label_values, {key: value})``, series ``<name>_info``
    of value 1 with the card's labels and the info keys as labels."""

    type = "info"
    _suffix = "_info"

    def add_metric(self, labels: Sequence[str], value: Mapping[str, str]) -> None:
        self.rows.append(
            (
                self.name + "_info",
                self.labelnames + tuple(value),
                tuple(labels) + tuple(value.values()),
                1,
            )
        )


class StateSetFamily(Family):
    """A state set: ``add_metric(label_values, {state: bool})``, one series per state
    (sorted by name) with the state in a label named after the family, 1 for the states
    that are on."""

    type = "stateset"

    def add_metric(self, labels: Sequence[str], value: Mapping[str, bool]) -> None:
        names = self.labelnames + (self.name,)
        base = tuple(labels)
        for state, on in sorted(value.items()):
            self.rows.append((self.name, names, (*base, state), 1 if on else 0))


class TextRenderer:
    """Renders families as ``generate_latest`` does; reuse one instance across patrols.

    Not thread-safe: one renderer per exposition, called under its lock."""

    def __init__(self) -> None:
        self._labels: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
        #: values of the last render, formatted (counts, flags, totals repeat from one
        #: patrol to the next); like the label cache, it holds only the last render's
        self._values: dict[float, str] = {}
        self._headers: dict[tuple[str, str, str], str] = {}

    @staticmethod
    def _labelstr(names: tuple[str, ...], values: tuple[str, ...]) -> str:
        pairs = sorted((n, v) for n, v in zip(names, values, strict=True) if v != "")
        if not pairs:
            return ""
        return "{" + ",".join(f'{n}="{_escape_value(v)}"' for n, v in pairs) + "}"

    def _header(self, family: Family) -> str:
        key = (family.name, family.type, family.documentation)
        text = self._headers.get(key)
        if text is None:
            name = family.name + family._suffix
            kind = _TYPES.get(family.type, family.type)
            doc = _escape_help(family.documentation)
            text = self._headers[key] = f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"
        return text

    def render(self, families: Iterable[Family]) -> bytes:
        """The text exposition of ``families`` (UTF-8 bytes)."""
        previous, previous_values = self._labels, self._values
        seen: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
        formatted: dict[float, str] = {}
        out: list[str] = []
        append = out.append
        for family in families:
            append(self._header(family))
            for sname, names, values, value in family.rows:
                key = (names, values)
                labels = seen.get(key)
                if labels is None:
                    labels = previous.get(key)
                    if labels is None:
                        labels = self._labelstr(names, values)
                    seen[key] = labels
                if not value:  # 0 == 0.0 == -0.0 as keys: zeros are not cached
                    text = "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
                else:
                    text = formatted.get(value)
                    if text is None:
                        text = previous_values.get(value)
                        if text is None:
                            text = format_value(value)
                        formatted[value] = text
                append(f"{sname}{labels} {text}\n")
        self._labels, self._values = seen, formatted
        return "".join(out).encode("utf-8")
