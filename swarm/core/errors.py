"""Domain exceptions. Adapters translate their storage errors into these; callers map them to
HTTP statuses or CLI messages by type, never by message text."""

from __future__ import annotations


class SwarmError(Exception):
    """Base of every error the control plane raises on purpose."""


class InvalidInput(SwarmError, ValueError):
    """A caller gave a value the control plane cannot accept; the message says which and why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFound(SwarmError, KeyError):
    """A run or unit that does not exist."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "not found"


class Conflict(SwarmError):
    """The request contradicts what the books already hold (e.g. a different spec for a run id)."""
