"""Placeholder for the dlq function (replaced by the functions issue)."""

from __future__ import annotations

from typing import Any


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """SQS batch from the dead-letter queues: record each dead letter and settle it."""
    raise NotImplementedError("the dlq handler lands with the functions issue")
