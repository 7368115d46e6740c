"""The results store on S3: each attempt's outcome once, and a closed run's results file.

Objects live in the batch bucket under ``results/<run>/`` (encrypted at rest by the bucket's
default encryption, expired by its lifecycle rule):

* ``attempts/<page>.json``: a *page*, the outcomes of a worker invocation's attempts of the run
  (one write for them all: swarm.service.pages), under a key of its own; the ledger's unit
  names the page holding its last attempt's outcome (``UnitRecord.outcome_key``);
* ``attempts/<unit>/<attempt>.json``: one attempt's outcome alone (an output too long for a
  page, a worker outside an invocation), written with ``If-None-Match: *`` so S3 itself refuses
  a second write of the same attempt (412): the first record stands;
* the results file, streamed: one ``PutObject`` up to :data:`PART_BYTES`, a multipart upload
  beyond it (S3 takes up to 10,000 parts), so its size is bounded by S3 (5 TB), not by the
  function's memory; one that a call has no time to finish keeps its upload in
  ``<file>.parts.json`` and the next call goes on from there.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

from botocore.config import Config

from swarm.adapters.aws import S3_DENIED_CODES, S3_MISSING_CODES, S3Blobs
from swarm.adapters.client_errors import client_error_type, error_code
from swarm.core.errors import ReadDenied
from swarm.core.results import (
    AttemptOutcome,
    FileLines,
    always,
    attempt_key,
    find_outcomes,
    page_doc,
    page_key,
    results_file_key,
    write_in_parts,
)

#: the S3 client's configuration for presigned URLs: Signature Version 4 (every region takes it)
S3_SIGV4: Final = Config(signature_version="s3v4")
#: a results file is written in parts of this size (S3's minimum part is 5 MiB)
PART_BYTES: Final = 8 * 1024 * 1024
#: parallel reads of outcome objects (a page of results reads one object per page or unit)
READERS: Final = 16
#: S3 answers a conditional write that races another one for the same key with 409: try again
CONDITIONAL_RACE_TRIES: Final = 3


def progress_key(key: str) -> str:
    """Where a results file too long for one call keeps its multipart upload between calls
    (its id, its parts, the unit its last part ends after); expired with ``results/``."""
    return f"{key}.parts.json"


@dataclass
class S3Results:
    client: Any  # an s3 client
    bucket: str
    part_bytes: int = PART_BYTES

    def _put_once(self, key: str, doc: Any) -> bool:
        """Write ``doc`` at ``key`` unless something is there (``If-None-Match: *``)."""
        body = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
        for _ in range(CONDITIONAL_RACE_TRIES):
            try:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=body,
                    ContentType="application/json",
                    IfNoneMatch="*",
                )
                return True
            except client_error_type() as e:
                code = error_code(e)
                if code in ("PreconditionFailed", "412"):
                    return False
                if code != "ConditionalRequestConflict":
                    raise
        return False  # the racing write won and holds the key

    def record(self, outcome: AttemptOutcome) -> str | None:
        key = attempt_key(outcome.run_id, outcome.unit_id, outcome.attempt)
        return key if self._put_once(key, outcome.as_doc()) else None

    def record_page(self, run_id: str, outcomes: Sequence[AttemptOutcome]) -> str:
        key = page_key(run_id, uuid.uuid4().hex)
        if not self._put_once(key, page_doc(outcomes)):  # pragma: no cover - 128 random bits
            raise RuntimeError(f"a page's new key {key} is taken")
        return key

    def _doc(self, key: str) -> Any:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except client_error_type() as e:
            code = error_code(e)
            if code in S3_MISSING_CODES:
                return None
            if code in S3_DENIED_CODES:
                raise ReadDenied(key, str(code)) from None
            raise
        return json.loads(body)

    def _docs(self, keys: Sequence[str]) -> dict[str, Any]:
        if len(keys) <= 1:
            return {k: self._doc(k) for k in keys}
        with ThreadPoolExecutor(max_workers=min(READERS, len(keys))) as pool:
            return dict(zip(keys, pool.map(self._doc, keys), strict=True))

    def outcomes(
        self, run_id: str, attempts: Sequence[tuple[str, int, str | None]]
    ) -> list[AttemptOutcome | None]:
        return find_outcomes(run_id, attempts, self._docs)

    def write_file(
        self,
        run_id: str,
        name: str,
        lines: FileLines,
        keep_going: Callable[[], bool] = always,
    ) -> str | None:
        key = results_file_key(run_id, name)
        saved = self._doc(progress_key(key))  # a file begun by an earlier call (or None)
        try:
            return self._write(key, lines, keep_going, saved)
        except client_error_type() as e:
            if saved is None or error_code(e) != "NoSuchUpload":
                raise
            # the saved upload is gone (the bucket's lifecycle rule aborts one after a day)
            return self._write(key, lines, keep_going, None)

    def _write(
        self,
        key: str,
        lines: FileLines,
        keep_going: Callable[[], bool],
        saved: dict[str, Any] | None,
    ) -> str | None:
        target = {"Bucket": self.bucket, "Key": key}
        kept: str | None = None if saved is None else str(saved["upload_id"])
        upload_id = kept
        parts: list[dict[str, Any]] = [] if saved is None else list(saved["parts"])
        after: str | None = None if saved is None else saved["after"]

        def put_part(body: bytes, last: str | None) -> None:
            nonlocal upload_id, after
            if upload_id is None:
                upload_id = self.client.create_multipart_upload(
                    **target, ContentType="application/x-ndjson"
                )["UploadId"]
            number = len(parts) + 1
            etag = self.client.upload_part(
                **target, UploadId=upload_id, PartNumber=number, Body=body
            )["ETag"]
            parts.append({"ETag": etag, "PartNumber": number})
            after = last

        try:
            tail = write_in_parts(lines(after), self.part_bytes, put_part, keep_going)
            if tail is None:  # out of time: the next call goes on after the last part
                self._put(
                    progress_key(key), {"upload_id": upload_id, "parts": parts, "after": after}
                )
                return None
            if upload_id is None:
                self.client.put_object(**target, Body=tail, ContentType="application/x-ndjson")
                return key
            if tail:
                put_part(tail, None)
            self.client.complete_multipart_upload(
                **target, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            # an upload begun by this call and not saved for the next: abort it (the bucket's
            # lifecycle rule also aborts it after a day); a saved one is the next call's
            if upload_id is not None and upload_id != kept:
                try:
                    self.client.abort_multipart_upload(**target, UploadId=upload_id)
                except client_error_type():
                    pass
            raise
        return key

    def _put(self, key: str, doc: Any) -> None:
        body = json.dumps(doc, separators=(",", ":")).encode()
        self.client.put_object(
            Bucket=self.bucket, Key=key, Body=body, ContentType="application/json"
        )

    def exists(self, key: str) -> bool:
        return S3Blobs(self.client, self.bucket).exists(key)

    def download_url(self, key: str, expires_s: int) -> str:
        filename = "-".join(key.split("/")[-2:])  # <batch>-completed-0.jsonl, <unit>-00001.json
        url: str = self.client.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": self.bucket,
                "Key": key,
                "ResponseContentDisposition": f'attachment; filename="{filename}"',
            },
            ExpiresIn=expires_s,
        )
        return url

    def location(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"
