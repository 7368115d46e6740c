"""The service ports on SQS, S3, Step Functions, SSM, EventBridge and Lambda.

Each adapter takes an injected boto3 client (tests and the local runtime pass moto-backed ones;
the Lambda functions build them lazily through :func:`swarm.wiring.boto3_clients`). Errors are
mapped by AWS error code, never by message text.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm.adapters.client_errors import client_error_type, error_code
from swarm.contract import parse_drain_value
from swarm.core import codec
from swarm.core.errors import InvalidInput, NotFound, ObjectTooLarge, ReadDenied
from swarm.core.lanes import Bundle, QueuedUnit
from swarm.core.ports import (
    MAX_SQS_VISIBILITY_S,
    SQS_BATCH_BYTES,
    SQS_BATCH_MESSAGES,
    DrainState,
    LaneDepth,
    MappingState,
    SignedUpload,
    check_delays,
    sqs_seconds,
    upload_headers,
)
from swarm.core.records import LANES, Lane

#: how many times a SendMessageBatch is sent for the entries SQS failed (not the sender's
#: fault: e.g. an internal error), with a doubling pause from SEND_RETRY_PAUSE_S between
SEND_ATTEMPTS = 4
SEND_RETRY_PAUSE_S = 0.05


class SendFailed(Exception):
    """SQS did not take every message of a batch (after :data:`SEND_ATTEMPTS` for a failure
    that was not the sender's fault)."""


def message_batches(sizes: Sequence[int]) -> list[list[int]]:
    """The messages of ``sizes`` (each body's bytes) cut in order into SendMessageBatch
    requests: at most SQS_BATCH_MESSAGES messages and SQS_BATCH_BYTES of bodies each; a
    message over SQS_BATCH_BYTES is a request of its own (SQS refuses it as it would alone)."""
    batches: list[list[int]] = []
    current: list[int] = []
    total = 0
    for index, size in enumerate(sizes):
        if current and (len(current) >= SQS_BATCH_MESSAGES or total + size > SQS_BATCH_BYTES):
            batches.append(current)
            current, total = [], 0
        current.append(index)
        total += size
    if current:
        batches.append(current)
    return batches


@dataclass
class SqsLanes:
    """One standard queue per lane; the tenant is the message group, so SQS fair queues can
    spread tenants inside a lane."""

    client: Any
    urls: Mapping[Lane, str]
    sleep: Callable[[float], None] = time.sleep  # between sends of a batch's failed entries
    #: the callers' clock runs this many times faster than SQS's (a local stack's; 1 on AWS):
    #: their delays are rounded up to whole SQS seconds on SQS's clock (ports.sqs_seconds)
    time_scale: float = 1.0

    def _seconds(self, seconds: float) -> int:
        return sqs_seconds(seconds, self.time_scale)

    def send(self, item: QueuedUnit, delay_s: float = 0) -> None:
        self._send_one(item, codec.message_body(item), delay_s)

    def _send_one(self, item: QueuedUnit, body: str, delay_s: float) -> None:
        """One message on ``item``'s lane, in its tenant's group."""
        self.client.send_message(
            QueueUrl=self.urls[item.lane],
            MessageBody=body,
            DelaySeconds=self._seconds(delay_s),
            MessageGroupId=item.tenant,
        )

    def send_many(self, items: Sequence[QueuedUnit], delays_s: Sequence[float] = ()) -> None:
        """Each item a message of its own: :meth:`send_bundles` of one unit each."""
        delays = check_delays(items, delays_s)
        self.send_bundles([Bundle((i,), d) for i, d in zip(items, delays, strict=True)])

    def send_bundles(self, bundles: Sequence[Bundle]) -> None:
        """SendMessageBatch per lane (:func:`message_batches`), each bundle one entry with its
        delay; a batch's failed entries are sent again, up to :data:`SEND_ATTEMPTS` times, unless
        SQS says they are the sender's fault (SendFailed at once). A message over the size limit
        goes alone through ``SendMessage``, and SQS refuses it as it always has."""
        by_lane: dict[Lane, list[tuple[Bundle, str]]] = {}
        for b in bundles:
            by_lane.setdefault(b.units[0].lane, []).append((b, codec.bundle_body(b.units)))
        for lane, group in by_lane.items():
            sizes = [len(body.encode()) for _, body in group]
            for batch in message_batches(sizes):
                if len(batch) == 1 and sizes[batch[0]] > SQS_BATCH_BYTES:
                    b, body = group[batch[0]]
                    self._send_one(b.units[0], body, b.delay_s)
                    continue
                entries = [(group[i][0].units[0], group[i][1], group[i][0].delay_s) for i in batch]
                self._send_batch(self.urls[lane], entries)

    def _send_batch(self, url: str, entries: Sequence[tuple[QueuedUnit, str, float]]) -> None:
        pending = {str(n): entry for n, entry in enumerate(entries)}  # Id: unique per request
        for attempt in range(SEND_ATTEMPTS):
            if attempt:
                self.sleep(SEND_RETRY_PAUSE_S * 2 ** (attempt - 1))
            answer = self.client.send_message_batch(
                QueueUrl=url,
                Entries=[
                    {
                        "Id": entry_id,
                        "MessageBody": body,
                        "MessageGroupId": item.tenant,
                        **({"DelaySeconds": self._seconds(delay)} if delay > 0 else {}),
                    }
                    for entry_id, (item, body, delay) in pending.items()
                ],
            )
            failed = answer.get("Failed") or []
            if not failed:
                return
            ours = [f for f in failed if f.get("SenderFault")]
            if ours:
                raise SendFailed(
                    f"SQS refused {len(ours)} message(s) of a batch on {url}: "
                    + "; ".join(f"{f.get('Code')}: {f.get('Message', '')}" for f in ours[:3])
                )
            pending = {f["Id"]: pending[f["Id"]] for f in failed}
        raise SendFailed(
            f"SQS failed {len(pending)} message(s) of a batch on {url} {SEND_ATTEMPTS} times"
        )

    def change_visibility(self, lane: Lane, receipt_handle: str, seconds: float) -> None:
        self.client.change_message_visibility(
            QueueUrl=self.urls[lane],
            ReceiptHandle=receipt_handle,
            VisibilityTimeout=sqs_seconds(seconds, self.time_scale, MAX_SQS_VISIBILITY_S),
        )

    def depths(self) -> Mapping[Lane, LaneDepth]:
        names = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ]
        out: dict[Lane, LaneDepth] = {}
        for lane in LANES:
            if lane not in self.urls:
                continue
            attrs = self.client.get_queue_attributes(
                QueueUrl=self.urls[lane], AttributeNames=names
            )["Attributes"]
            out[lane] = LaneDepth(*(int(attrs.get(n, 0)) for n in names))
        return out


#: what S3 answers for a missing key when the caller has s3:ListBucket on it (GetObject says
#: NoSuchKey; HeadObject has no body, so botocore reports the status code)
S3_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
#: what S3 answers when it will not say: a missing key without s3:ListBucket, or no read right
S3_DENIED_CODES = frozenset({"AccessDenied", "403", "Forbidden"})


@dataclass
class S3Blobs:
    """The batch bucket. A missing key raises :class:`NotFound`; a 403 raises
    :class:`ReadDenied`, never "missing": S3 answers 403 for a missing key when the caller lacks
    ``s3:ListBucket``, but also for an object the caller may not read, so only the caller knows
    whether "missing" is a safe reading (infra grants ``s3:ListBucket`` on the prefixes each
    function reads, which makes S3 answer 404 for a missing key there)."""

    client: Any
    bucket: str

    def put_json(self, key: str, doc: Any) -> None:
        self.client.put_object(
            Bucket=self.bucket,
            Key=key,
            Body=json.dumps(doc, separators=(",", ":")).encode(),
            ContentType="application/json",
        )

    def get_json(self, key: str, max_bytes: int | None = None) -> Any:
        """The object as JSON; NotFound, ReadDenied, ObjectTooLarge (over ``max_bytes``: its
        body is not read), or InvalidInput (named by the key) when it is not JSON."""
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=key)
        except client_error_type() as e:
            self._raise_for_read(key, e)
            raise
        stream = answer["Body"]
        if max_bytes is None:
            body = stream.read()
        else:
            # S3 says the size first (refused unread); the bounded read holds without it
            size = int(answer.get("ContentLength", 0))
            body = b"" if size > max_bytes else stream.read(max_bytes + 1)
            if size > max_bytes or len(body) > max_bytes:
                stream.close()
                raise ObjectTooLarge(key, max(size, len(body)), max_bytes)
        try:
            return json.loads(body)
        except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8 text
            reason = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8 text"
            raise InvalidInput(key, f"not JSON ({reason})") from None

    def upload_url(self, key: str, size_bytes: int, expires_s: int) -> SignedUpload:
        """A presigned PUT (Signature Version 4: the client must be configured for it, see
        :func:`swarm.wiring.client_configs`) signed with :func:`upload_headers`: S3 refuses a
        request without exactly those headers (SignatureDoesNotMatch, 403), so the object is
        written once (412 if it exists), of exactly ``size_bytes``. It carries the signer's
        rights, and lasts ``expires_s`` or the signer's session, whichever ends first."""
        headers = upload_headers(size_bytes)
        url: str = self.client.generate_presigned_url(
            "put_object",
            Params={
                "Bucket": self.bucket,
                "Key": key,
                "ContentType": headers["Content-Type"],
                "ContentLength": size_bytes,
                "IfNoneMatch": headers["If-None-Match"],
            },
            ExpiresIn=expires_s,
            HttpMethod="PUT",
        )
        return SignedUpload(url, headers)

    def exists(self, key: str) -> bool:
        """Whether the object exists. A 403 raises ReadDenied: "does not exist" would make the
        finalizer write its results and announce the closure again."""
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except client_error_type() as e:
            if error_code(e) in S3_MISSING_CODES:
                return False
            self._raise_for_read(key, e)
            raise
        return True

    @staticmethod
    def _raise_for_read(key: str, error: Exception) -> None:
        code = error_code(error)
        if code in S3_MISSING_CODES:
            raise NotFound(f"no object {key!r} in the bucket") from None
        if code in S3_DENIED_CODES:
            raise ReadDenied(key, str(code)) from None


@dataclass
class StepFunctionsExecutions:
    client: Any
    state_machine_arn: str

    def start(self, name: str, payload: Mapping[str, Any]) -> bool:
        try:
            self.client.start_execution(
                stateMachineArn=self.state_machine_arn, name=name, input=json.dumps(payload)
            )
        except client_error_type() as e:
            if error_code(e) == "ExecutionAlreadyExists":
                return False
            raise
        return True

    def execution_arn(self, name: str) -> str:
        """``arn:<p>:states:<r>:<a>:execution:<state machine>:<name>``."""
        prefix, marker, machine = self.state_machine_arn.partition(":stateMachine:")
        if not marker:
            raise ValueError(f"{self.state_machine_arn!r} is not a state machine ARN")
        return f"{prefix}:execution:{machine.split(':', 1)[0]}:{name}"

    def status(self, name: str) -> str | None:
        """The execution's status (DescribeExecution); None if there is no such execution."""
        try:
            response = self.client.describe_execution(executionArn=self.execution_arn(name))
        except client_error_type() as e:
            if error_code(e) == "ExecutionDoesNotExist":
                return None
            raise
        return str(response["status"])


@dataclass
class SsmDrainSwitch:
    """The drain flag; ``draining()`` caches for ``ttl_s`` unless asked for a fresh read.

    Every function reads it cached (the API per submit and resume, the worker once per
    invocation), so the account's SSM throughput (40 GetParameter/s standard, shared by the
    account and region) is spent at most once per container per ``ttl_s``: concurrent readers
    of an empty or expired cache (a worker's unit threads) wait for one read instead of each
    making their own. :meth:`state` says when the last change has reached every cache, and the
    drain view calls a deploy safe only after that: a cached value is dated from when its read
    was sent, so no cache holds a value older than the change past ``ttl_s`` after it. A read
    that fails (throttled, or SSM unreachable) serves the last value this container saw,
    however old; with nothing cached it raises."""

    client: Any
    name: str
    ttl_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    _cached: tuple[float, bool] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: held across a cached read's GetParameter: one request for every concurrent reader
    _reading: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: after a failed read, cached readers are served the last value until then (so a throttle
    #: does not turn every waiting reader into a request of its own)
    _quiet_until: float = field(default=float("-inf"), repr=False)

    def _fresh_cached(self) -> bool | None:
        with self._lock:
            if self._cached is None:
                return None
            now = self.clock()
            if now - self._cached[0] < self.ttl_s or now < self._quiet_until:
                return self._cached[1]
        return None

    def draining(self, fresh: bool = False) -> bool:
        if not fresh:
            cached = self._fresh_cached()
            if cached is not None:
                return cached
            with self._reading:  # one read at a time; those who waited find its value
                cached = self._fresh_cached()
                if cached is not None:
                    return cached
                return self._read_or_cached()
        return self._read_or_cached()

    def _read_or_cached(self) -> bool:
        try:
            return self._read()[0]
        except Exception:
            with self._lock:
                if self._cached is not None:
                    self._quiet_until = self.clock() + self.ttl_s / 5
                    return self._cached[1]
            raise

    def _read(self) -> tuple[bool, Any]:
        sent = self.clock()  # the value is at least as new as this
        parameter = self.client.get_parameter(Name=self.name)["Parameter"]
        on = parse_drain_value(str(parameter["Value"]))
        with self._lock:
            self._cached = (sent, on)
        return on, parameter.get("LastModifiedDate")

    def state(self) -> DrainState:
        """An exact read. Settled once every cache has expired since the change (``ttl_s``),
        and as long again: a worker invocation that read "off" just before then may still be
        writing its entry in the register of running work (one request), and the functions'
        clocks may be a little off SSM's."""
        on, changed = self._read()
        settled = changed.timestamp() + 2 * self.ttl_s if changed is not None else None
        return DrainState(on, settled)

    def set(self, draining: bool) -> None:
        self.client.put_parameter(
            Name=self.name, Value="on" if draining else "off", Type="String", Overwrite=True
        )
        with self._lock:
            self._cached = None


@dataclass
class EventBridgeEvents:
    client: Any
    bus_name: str
    source: str = "swarm.control-plane"

    def publish(self, detail_type: str, detail: Mapping[str, Any]) -> None:
        response = self.client.put_events(
            Entries=[
                {
                    "EventBusName": self.bus_name,
                    "Source": self.source,
                    "DetailType": detail_type,
                    "Detail": json.dumps(detail, default=str),
                }
            ]
        )
        if response.get("FailedEntryCount"):
            entry = response["Entries"][0]
            raise RuntimeError(
                f"EventBridge refused {detail_type}: {entry.get('ErrorCode')} "
                f"{entry.get('ErrorMessage')}"
            )


@dataclass
class LambdaMappings:
    client: Any
    uuids: Mapping[Lane, str]

    def set_enabled(self, enabled: bool) -> list[MappingState]:
        states = []
        for lane, uuid in self.uuids.items():
            resp = self.client.update_event_source_mapping(UUID=uuid, Enabled=enabled)
            states.append(MappingState(lane, uuid, str(resp.get("State", "Unknown"))))
        return states

    def states(self) -> list[MappingState]:
        return [
            MappingState(
                lane,
                uuid,
                str(self.client.get_event_source_mapping(UUID=uuid).get("State", "Unknown")),
            )
            for lane, uuid in self.uuids.items()
        ]
