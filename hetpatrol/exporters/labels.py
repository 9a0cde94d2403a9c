"""The labels that name a card in every per-card Prometheus family."""

from __future__ import annotations

from hetpatrol.schema import CardRecord

CARD_LABELS = ("vendor", "card_type", "index", "chip", "uuid")


def card_labels(rec: CardRecord) -> list[str]:
    """Label values of a card, in :data:`CARD_LABELS` order (null -> empty string)."""
    return [
        rec.vendor,
        rec.card_type or "",
        str(rec.index),
        "" if rec.chip is None else str(rec.chip),
        rec.uuid or "",
    ]
