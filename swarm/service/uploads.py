"""``POST /uploads``: a short-lived URL that writes one new manifest under the caller's prefix.

Tenants need no rights on the bucket: the URL is presigned by the API function's role, which may
write ``manifests/uploads/*``, and it writes exactly one key, generated here under
``manifests/uploads/<tenant>/``, so no tenant can name (let alone read or replace) another's
upload; ``POST /batches`` reads a manifest only under the caller's own prefix
(:func:`swarm.service.api_models.check_manifest_key`).

Why a presigned PUT, and how its size is bounded. S3 has two kinds of presigned upload: a PUT
URL, and a POST form whose signed policy may carry a ``content-length-range``. A PUT URL does not
take a size range, but Signature Version 4 signs the headers it is given, and S3 refuses a
request whose signed headers differ (403 SignatureDoesNotMatch): the URL is signed for the exact
``Content-Length`` the caller asked for (at most :data:`~swarm.api.models.MAX_MANIFEST_BYTES`),
so S3 stores no more than that. The PUT is kept because it is one plain request any HTTP client
(``curl -T``, ``requests.put``) sends, where a POST needs a multipart form with the policy's
fields in order. The same signature makes the upload write-once (``If-None-Match: *``: a URL
that leaked cannot replace a manifest) and fixes its type. The bound does not rest on S3 alone:
``POST /batches`` refuses a manifest over the limit before reading its body (413), whatever
wrote it.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from swarm.api.models import UPLOADS_PREFIX, Upload, UploadRequest
from swarm.core.ports import BlobStore
from swarm.core.records import check_tenant

#: the default lifetime of an upload URL (``uploads.url_seconds`` in cdk.json)
UPLOAD_URL_S = 300


def upload_key(tenant: str) -> str:
    """A new key under the tenant's own prefix, never given before (a random 128-bit name)."""
    return f"{UPLOADS_PREFIX}{check_tenant(tenant)}/{uuid.uuid4().hex}.json"


@dataclass
class Uploads:
    blobs: BlobStore
    url_s: int = UPLOAD_URL_S

    def grant(self, tenant: str, request: UploadRequest, now: float) -> dict[str, Any]:
        """The :class:`~swarm.api.models.Upload` answer: the key to submit, the URL, the method
        and headers to send it with, and when it expires."""
        key = upload_key(tenant)
        signed = self.blobs.upload_url(key, request.size_bytes, self.url_s)
        return Upload(
            key=key,
            url=signed.url,
            method="PUT",
            headers=dict(signed.headers),
            expires_in_s=self.url_s,
            # the signature's date is the signing second: it is valid until then + url_s
            expires_at=math.floor(now) + self.url_s,
        ).model_dump(mode="json")
