"""The ``object_read`` tool's reader: a text object of the calling tenant's own folder of the
batch bucket, ``manifests/uploads/<tenant>/`` (where ``POST /uploads`` puts a tenant's files:
swarm/service/uploads.py), bounded in size.

The model names the object by its key *inside* that folder; the tenant comes from the worker,
never from the model, so the key the tool reads always starts with the tenant's own prefix. A
key that tries to leave it (``..``, a leading ``/``, a backslash, a control character) is refused
before S3 is called. The tool's role may only ``s3:GetObject`` under ``manifests/uploads/``:
even a bug here cannot read results, attempts or another prefix of the bucket.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from swarm.adapters.client_errors import client_error_type, error_code
from swarm.core.tool_protocol import ToolInputError

#: the folder of each tenant's objects (swarm.service.uploads writes under it)
TENANT_OBJECTS_PREFIX: Final = "manifests/uploads/"
#: the most bytes read of one object (the model gets the start, and is told it was cut)
MAX_OBJECT_BYTES: Final = 64 * 1024
_KEY: Final = re.compile(r"^[A-Za-z0-9!_.*'()=,@+-][A-Za-z0-9!_.*'()=,@+/-]{0,511}$")


def tenant_key(tenant: str, key: Any) -> str:
    """The bucket key of the tenant's object ``key`` (its key inside the tenant's folder, or the
    full key ``POST /uploads`` answered, which starts with that folder), or
    :class:`ToolInputError`."""
    folder = f"{TENANT_OBJECTS_PREFIX}{tenant}/"
    if isinstance(key, str) and key.startswith(folder):
        key = key.removeprefix(folder)
    if not isinstance(key, str) or not _KEY.match(key):
        raise ToolInputError(
            "key must be the object's key inside your folder: 1 to 512 letters, digits or "
            "!_.*'()=,@+-/, not starting with '/'"
        )
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise ToolInputError("key must not hold empty, '.' or '..' path parts")
    return f"{TENANT_OBJECTS_PREFIX}{tenant}/{key}"


@dataclass
class TenantObjects:
    client: Any
    bucket: str

    def read(self, tenant: str, key: str) -> dict[str, Any]:
        """``{"key", "bytes", "truncated", "text"}`` of the tenant's object; ToolInputError for
        an object that does not exist (or is not the tenant's) or is not text."""
        full = tenant_key(tenant, key)
        try:
            answer = self.client.get_object(
                Bucket=self.bucket, Key=full, Range=f"bytes=0-{MAX_OBJECT_BYTES - 1}"
            )
        except client_error_type() as error:
            if error_code(error) in ("NoSuchKey", "404", "AccessDenied", "InvalidRange"):
                # AccessDenied: S3 answers it for a missing key when the role may not list
                raise ToolInputError(f"no object {key!r} in your folder") from None
            raise
        body = answer["Body"].read(MAX_OBJECT_BYTES)
        total = _total_size(answer, len(body))
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as error:
            if total > len(body) and error.start >= len(body) - 3:  # cut inside a character
                text = body[: error.start].decode("utf-8")
            else:
                raise ToolInputError(f"object {key!r} is not UTF-8 text") from None
        return {"key": key, "bytes": total, "truncated": total > len(body), "text": text}


def _total_size(answer: dict[str, Any], read: int) -> int:
    content_range = str(answer.get("ContentRange") or "")
    if "/" in content_range:
        size = content_range.rpartition("/")[2]
        if size.isdigit():
            return int(size)
    return int(answer.get("ContentLength") or read)
