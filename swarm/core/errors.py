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


class Contended(SwarmError):
    """What a decision read changed before its write: decide again on a fresh read (e.g. two
    submissions of one tenant deciding on the same count of its queued units)."""


class ReadDenied(SwarmError):
    """A store refused to read an object (S3's 403 ``AccessDenied`` on GetObject/HeadObject).

    S3 gives this answer for a key that does not exist when the caller lacks ``s3:ListBucket``
    on it, and for an object the caller may not read. The stack grants ``s3:ListBucket`` on the
    prefixes each function reads, so S3 answers a missing key with 404 (:class:`NotFound`); a
    caller treats this error as "missing" only where acting on "missing" is a refusal that writes
    nothing (see its uses)."""

    def __init__(self, key: str, code: str) -> None:
        super().__init__(
            f"S3 refused to read {key!r} ({code}): the object is missing and this role lacks "
            "s3:ListBucket on its prefix, or this role may not read it"
        )
        self.key = key
        self.code = code


class ObjectTooLarge(SwarmError):
    """A store holds an object bigger than its reader may take (read nothing of it)."""

    def __init__(self, key: str, size: int, limit: int) -> None:
        super().__init__(f"{key!r} is {size:,} bytes; the limit is {limit:,}")
        self.key = key
        self.size = size
        self.limit = limit
