"""Placeholder for the worker function (replaced by the functions issue)."""

from __future__ import annotations

from typing import Any


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """SQS batch from one lane: drain check, governor draw, model call, settlement."""
    raise NotImplementedError("the worker handler lands with the functions issue")
