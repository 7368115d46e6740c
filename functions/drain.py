"""Placeholder for the drain function (replaced by the functions issue)."""

from __future__ import annotations

from typing import Any


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """On a drain parameter change, disable or enable the workers' event source mappings."""
    raise NotImplementedError("the drain handler lands with the functions issue")
