"""Placeholder for the fanout function (replaced by the functions issue)."""

from __future__ import annotations

from typing import Any


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Distributed Map item step: ledger admission of one unit, then enqueue it on its lane."""
    raise NotImplementedError("the fanout handler lands with the functions issue")
