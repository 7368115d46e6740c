"""The bill, measured: every request the local stack serves, counted as AWS would bill it.

:data:`METER` (process-wide, like :data:`swarm.local.patches.iam.AUDIT`) counts, by service,
operation and caller, each billed request and the quantity AWS prices it in
(``GET /_local/bill``, ``POST /_local/bill/reset``; ``swarm bench cost`` prices it with
:mod:`swarm.bench.prices`):

* **DynamoDB** (on demand): read and write request units from the items' sizes as DynamoDB
  computes them (:func:`swarm.local.patches.limits.item_size`): a write is 1 unit per started
  KB of the larger of the item before and after (a delete: the item deleted; a failed condition:
  the existing item, at least 1 unit), a read 1 unit per started 4 KB (half for an eventually
  consistent read; a Query sums its items before rounding, a BatchGetItem rounds each item); a
  transaction's items cost twice (a ConditionCheck as a write of the item checked; a cancelled
  transaction as if each item's condition had failed); a write that changes what a global
  secondary index holds costs the index's writes too (1 to add or remove an entry or change its
  projected attributes, 2 when its key changes). Errors (validation, throttling) are not billed.
* **SQS**: every API call, in 64 KB chunks of its payload (a batch's messages together; a
  receive's messages; an empty receive is one request, listed apart). An event source mapping
  keeps :data:`ESM_IDLE_POLLERS` pollers long-polling a queue that has no messages (Lambda's
  standard mode; with ``MaximumConcurrency`` set, as every mapping here, it never goes down to
  two), each with a 20 s wait; the local mapping runs one poller at that wait on the deployed
  clock, so each of its empty receives is billed as :data:`ESM_IDLE_POLLERS` requests.
* **S3**: requests by class: PUT, COPY, POST and LIST; GET, HEAD and the rest; DELETE (free).
* **Step Functions**: a Standard execution's state transitions (each state entered, each retry);
  one transition in the parent for each child a Distributed Map starts; an Express execution's
  request and its duration (rounded up to 100 ms, 64 MB). The *deployed* execution types are
  billed (:func:`state_machine_types`: the map's children are Express on AWS, Standard in moto).
* **Lambda**: each invocation and its GB-seconds from the measured duration (rounded up to 1 ms)
  and the function's configured memory. The local stack runs the deployed system on a clock
  ``time_scale`` times faster for the model's latency and the worker's waits for tokens, so those
  parts of a measured duration are converted back to the deployed clock (x ``time_scale``); the
  rest (the function's own work and its AWS requests) counts as measured. The worker's GB-seconds
  are split into the model call, sleeping for tokens and the rest.
* **EventBridge** ``PutEvents``: each entry, in 64 KB chunks. **SSM** parameter reads: counted,
  free at standard throughput. **API Gateway** (REST): each authorized request
  (:mod:`swarm.local.apiserver`).

Callers: requests signed by the emulator's own admin user (deploying, the pollers reading their
mappings and invoking, the drain rule's polling, API Gateway's invoke) are the emulator's
plumbing, not the application's, and are not counted; every other principal is named
(:meth:`Meter.name_caller`: a function's role, the event source mappings' pollers, the state
machine; ``unknown`` for another, such as an operator). Lambda invocations are counted where
they run (:mod:`swarm.local.functions`), not as Lambda API requests. Not counted: storage (S3,
DynamoDB), CloudWatch Logs ingestion and metrics, X-Ray, KMS, data transfer. The meter counts
while :attr:`Meter.enabled` (the local stack enables it); ``install`` is process-wide.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from swarm.local.patches.limits import entry_size, item_size, message_size

log = logging.getLogger("swarm.local")

# ------------------------------------------------------------------ what AWS bills in
WRITE_UNIT_BYTES = 1024  # a DynamoDB write request unit: 1 KB
READ_UNIT_BYTES = 4096  # a DynamoDB read request unit: 4 KB (strongly consistent)
SQS_CHUNK_BYTES = 64 * 1024  # each 64 KB chunk of a payload is billed as one request
#: the pollers Lambda keeps on an idle queue per SQS event source mapping ("When traffic is low,
#: Lambda scales back the processing to five concurrent batches"; the optimization down to two
#: "is not available when you enable the maximum concurrency setting": Lambda developer guide,
#: "Configuring scaling behavior for SQS event source mappings")
ESM_IDLE_POLLERS = 5
#: the bill's name for the event source mappings' pollers
ESM_CALLER = "event source mapping"
EVENTS_CHUNK_BYTES = 64 * 1024  # each 64 KB chunk of a PutEvents entry is one event
LAMBDA_GRANULARITY_S = 0.001  # Lambda rounds each invocation's duration up to 1 ms
EXPRESS_GRANULARITY_S = 0.1  # Express executions: up to 100 ms
EXPRESS_MEMORY_CHUNK_MB = 64  # Express memory is billed in 64 MB chunks (at least one)

STANDARD = "STANDARD"
EXPRESS = "EXPRESS"
PARENT = "parent"
CHILD = "map child"

#: The price keys (:mod:`swarm.bench.prices` prices each): the quantity a line counts.
DYNAMODB_WRITE = "dynamodb.write_request_units"
DYNAMODB_READ = "dynamodb.read_request_units"
SQS_REQUESTS = "sqs.standard_requests"
S3_PUT = "s3.put_copy_post_list_requests"
S3_GET = "s3.get_and_other_requests"
S3_DELETE = "s3.delete_requests"
SFN_TRANSITIONS = "stepfunctions.standard_state_transitions"
SFN_EXPRESS_REQUESTS = "stepfunctions.express_requests"
SFN_EXPRESS_GB_S = "stepfunctions.express_gb_seconds"
LAMBDA_REQUESTS = "lambda.requests"
LAMBDA_GB_S = {"x86_64": "lambda.x86_64_gb_seconds", "arm64": "lambda.arm64_gb_seconds"}
EVENTS = "eventbridge.custom_events"
SSM_STANDARD = "ssm.standard_parameter_api_interactions"
APIGW_REST = "apigateway.rest_requests"
NOT_BILLED = "not_billed"  # control-plane calls AWS does not charge for, errors

#: services whose requests are never the application's bill here: Lambda is counted per
#: invocation by the function host, the rest is deployment and identity plumbing
_UNMETERED_SERVICES = frozenset(
    {"lambda", "awslambda", "sts", "iam", "cloudformation", "moto_api", "logs"}
)
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


# ================================================================== the arithmetic
def write_units(size_bytes: int, transactional: bool = False) -> int:
    """DynamoDB write request units for one item write of ``size_bytes``: 1 per started KB, at
    least 1; twice that inside a transaction."""
    units = max(1, math.ceil(size_bytes / WRITE_UNIT_BYTES))
    return 2 * units if transactional else units


def read_units(size_bytes: int, consistent: bool = True, transactional: bool = False) -> float:
    """DynamoDB read request units for reading ``size_bytes`` (one item, or a Query's items
    together): 1 per started 4 KB, at least 1; half for an eventually consistent read, twice for
    a transactional one."""
    units = float(max(1, math.ceil(size_bytes / READ_UNIT_BYTES)))
    if transactional:
        return 2 * units
    return units if consistent else units / 2


def write_op_units(
    kind: str,
    before: int | None,
    after: int | None,
    succeeded: bool,
    transactional: bool = False,
) -> int:
    """Write units of one item operation (``Put``, ``Update``, ``Delete``, ``ConditionCheck``)
    from the item's size before and after it (None: absent). A write that succeeded costs the
    larger of the two sizes (a delete: the item deleted); a failed condition, and a condition
    check, cost the existing item's size (at least 1 unit)."""
    if not succeeded or kind in ("ConditionCheck", "Delete"):
        size = before or 0
    else:
        size = max(before or 0, after or 0)
    return write_units(size, transactional)


@dataclass(frozen=True)
class IndexEntry:
    """An item's entry in a global secondary index: its index key, a digest of the attributes
    the index projects, and their size."""

    key: str
    projected: str
    size: int


def index_write_units(before: IndexEntry | None, after: IndexEntry | None) -> int:
    """Write units a table write costs one global secondary index: none if the item is in it
    neither before nor after or nothing it projects changed; one write to add or remove the
    entry or to update its projected attributes; two (a delete and a put) when its key changes."""
    if before is None and after is None:
        return 0
    if before is None:
        return write_units(after.size) if after is not None else 0
    if after is None:
        return write_units(before.size)
    if before.key != after.key:
        return write_units(before.size) + write_units(after.size)
    if before.projected != after.projected:
        return write_units(after.size)
    return 0


def chunks(size_bytes: int, chunk_bytes: int) -> int:
    """Billed requests for a payload of ``size_bytes``: one per started chunk, at least one."""
    return max(1, math.ceil(size_bytes / chunk_bytes))


def sqs_requests(payload_bytes: int) -> int:
    """An SQS request of ``payload_bytes`` (the messages it carries) bills as one request per
    started 64 KB."""
    return chunks(payload_bytes, SQS_CHUNK_BYTES)


def billed_events(entry_sizes: Iterable[int]) -> int:
    """EventBridge bills each PutEvents entry as one event per started 64 KB."""
    return sum(chunks(size, EVENTS_CHUNK_BYTES) for size in entry_sizes)


def round_up(seconds: float, granularity_s: float) -> float:
    """``seconds`` rounded up to a multiple of ``granularity_s`` (a float's last-bit noise, as
    in ``0.1 * 3``, does not start another increment)."""
    steps = math.ceil(round(max(0.0, seconds) / granularity_s, 9))
    return steps * granularity_s


def gb_seconds(seconds: float, memory_mb: float) -> float:
    return seconds * memory_mb / 1024


def lambda_billed_seconds(duration_s: float) -> float:
    """A Lambda invocation's billed duration: rounded up to 1 ms (at least 1 ms)."""
    return max(LAMBDA_GRANULARITY_S, round_up(duration_s, LAMBDA_GRANULARITY_S))


def express_gb_seconds(duration_s: float, memory_mb: float = 0.0) -> float:
    """An Express execution's GB-seconds: its duration rounded up to 100 ms (at least 100 ms),
    its memory in 64 MB chunks (at least one: a small workflow's 50 MB base)."""
    billed_s = max(EXPRESS_GRANULARITY_S, round_up(duration_s, EXPRESS_GRANULARITY_S))
    memory = max(1, math.ceil(memory_mb / EXPRESS_MEMORY_CHUNK_MB)) * EXPRESS_MEMORY_CHUNK_MB
    return gb_seconds(billed_s, memory)


def deployed_seconds(measured_s: float, scaled_s: float, time_scale: float) -> float:
    """A duration measured on the local clock, on the deployed one: its ``scaled_s`` part (the
    model's latency, sleeping for tokens: time the local stack runs ``time_scale`` times faster)
    converted back, the rest as measured."""
    scaled_s = min(max(0.0, scaled_s), max(0.0, measured_s))
    return measured_s - scaled_s + scaled_s * time_scale


_S3_LIST_PARAMETERS = frozenset(
    {
        "list-type",
        "prefix",
        "delimiter",
        "marker",
        "continuation-token",
        "start-after",
        "max-keys",
        "encoding-type",
        "fetch-owner",
    }
)


def s3_operation(
    method: str, has_key: bool, query: Iterable[str], copy_source: bool = False
) -> tuple[str, str]:
    """``(operation, price key)`` of an S3 request from its method, whether it names an object,
    its query parameters' names and whether it copies (``x-amz-copy-source``). S3 bills PUT,
    COPY, POST and LIST requests in one class, GET, HEAD and every other request in another, and
    DELETE requests not at all."""
    q = set(query)
    method = method.upper()
    if method == "DELETE":
        if "uploadId" in q:
            return "AbortMultipartUpload", S3_DELETE
        return ("DeleteObject" if has_key else "DeleteBucket"), S3_DELETE
    if method in ("GET", "HEAD") and has_key:
        if method == "GET" and "uploadId" in q:
            return "ListParts", S3_PUT
        return ("GetObject" if method == "GET" else "HeadObject"), S3_GET
    if method == "HEAD":
        return "HeadBucket", S3_GET
    if method == "GET":
        if "uploads" in q:
            return "ListMultipartUploads", S3_PUT
        if "versions" in q:
            return "ListObjectVersions", S3_PUT
        if not q or q & _S3_LIST_PARAMETERS:
            return ("ListObjectsV2" if "list-type" in q else "ListObjects"), S3_PUT
        return f"GetBucket {'/'.join(sorted(q))}", S3_GET
    if method == "PUT":
        if not has_key:
            return "PutBucket", S3_PUT
        if "partNumber" in q and "uploadId" in q:
            return ("UploadPartCopy" if copy_source else "UploadPart"), S3_PUT
        return ("CopyObject" if copy_source else "PutObject"), S3_PUT
    if "uploads" in q:
        return "CreateMultipartUpload", S3_PUT
    if "uploadId" in q:
        return "CompleteMultipartUpload", S3_PUT
    if "delete" in q:
        return "DeleteObjects", S3_PUT  # a POST: billed as one, whatever it deletes
    return f"{method} object", S3_PUT


def state_machine_types(template: Mapping[str, Any]) -> tuple[str, str]:
    """``(parent, map children)`` execution types as deployed: the state machine's
    ``StateMachineType`` (default STANDARD) and its ``MapExecutionType`` substitution (the
    children of its Distributed Map; STANDARD when it has none). The local copy of the
    definition runs the children as STANDARD (moto cannot run EXPRESS ones): AWS bills these."""
    parent, child = STANDARD, STANDARD
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") != "AWS::StepFunctions::StateMachine":
            continue
        props = resource.get("Properties", {})
        parent = str(props.get("StateMachineType") or STANDARD)
        child = str((props.get("DefinitionSubstitutions") or {}).get("MapExecutionType", child))
    return parent.upper(), child.upper()


# ================================================================== the meter
@dataclass
class Line:
    """What one (service, operation, caller) cost: ``requests`` counts billed requests (an API
    call, a state transition, an execution, an invocation, an event), ``quantity`` what the
    price applies to (request units, 64 KB chunks, GB-seconds...; its key is ``price``)."""

    service: str
    operation: str
    caller: str
    price: str
    requests: int = 0
    quantity: float = 0.0


@dataclass
class FunctionUse:
    """One function's invocations since the last reset. ``measured_s``, ``model_s``,
    ``slept_s`` and ``waited_s`` are on the local clock; ``billed_s`` and ``gb_s`` on the
    deployed one."""

    memory_mb: int = 0
    architecture: str = "x86_64"
    invocations: int = 0
    measured_s: float = 0.0
    model_s: float = 0.0  # in the (simulated, time-scaled) model call
    slept_s: float = 0.0  # sleeping for tokens (time-scaled)
    waited_s: float = 0.0  # holding on for tokens, as the worker reports it (sleeps + draws)
    billed_s: float = 0.0
    gb_s: float = 0.0
    waited_deployed_s: float = 0.0  # waited_s on the deployed clock
    cold_starts: int = 0  # invocations that started a new sandbox (an INIT)
    module: str = ""  # the handler module a cold start imports


@dataclass
class ExecutionUse:
    """Executions of one kind (:data:`PARENT` or :data:`CHILD`) since the last reset."""

    started: int = 0
    finished: int = 0
    transitions: int = 0  # states entered and retries, whatever the type bills
    duration_s: float = 0.0


@dataclass
class Meter:
    """Counts while :attr:`enabled` (the local stack enables it; moto's hooks cost nothing
    more than a flag's test otherwise)."""

    enabled: bool = False
    time_scale: float = 1.0
    parent_type: str = STANDARD
    child_type: str = STANDARD
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _lines: dict[tuple[str, str, str, str], Line] = field(default_factory=dict)
    _functions: dict[str, FunctionUse] = field(default_factory=dict)
    _billed: dict[str, list[float]] = field(default_factory=dict)  # per invocation, seconds
    _executions: dict[str, ExecutionUse] = field(default_factory=dict)
    _dynamodb: dict[str, int] = field(default_factory=dict)
    _excluded: set[str] = field(default_factory=set)
    _callers: dict[str, str] = field(default_factory=dict)
    _running: int = 0  # parent executions running now (not reset)
    _since: float = field(default_factory=time.time)

    # -- configuration
    def configure(
        self,
        *,
        time_scale: float | None = None,
        parent_type: str | None = None,
        child_type: str | None = None,
    ) -> None:
        with self._lock:
            if time_scale is not None:
                if time_scale <= 0:
                    raise ValueError(f"time_scale must be > 0, not {time_scale}")
                self.time_scale = time_scale
            for name, value in (("parent_type", parent_type), ("child_type", child_type)):
                if value is None:
                    continue
                if value.upper() not in (STANDARD, EXPRESS):
                    raise ValueError(f"{name} must be STANDARD or EXPRESS, not {value!r}")
                setattr(self, name, value.upper())

    def exclude(self, access_key_id: str) -> None:
        """Requests signed with this key are the emulator's plumbing: never counted."""
        with self._lock:
            self._excluded.add(access_key_id)

    def name_caller(self, access_key_id: str, name: str) -> None:
        with self._lock:
            self._callers[access_key_id] = name

    def caller(self, access_key_id: str | None) -> str | None:
        """Who signed a request (``"unknown"`` for a key never named), or None when the
        request is not counted: the emulator's own, or the meter is off."""
        if not self.enabled:
            return None
        if access_key_id is None:
            return "unsigned"
        with self._lock:
            if access_key_id in self._excluded:
                return None
            return self._callers.get(access_key_id, "unknown")

    # -- counting
    def add(
        self,
        service: str,
        operation: str,
        caller: str,
        price: str,
        requests: int = 1,
        quantity: float = 1.0,
    ) -> None:
        if not self.enabled:
            return
        key = (service, operation, caller, price)
        with self._lock:
            line = self._lines.get(key)
            if line is None:
                line = self._lines[key] = Line(service, operation, caller, price)
            line.requests += requests
            line.quantity += quantity

    def note(self, counter: str, n: int = 1) -> None:
        """A DynamoDB event worth seeing beside the bill (failed conditions, cancellations)."""
        with self._lock:
            self._dynamodb[counter] = self._dynamodb.get(counter, 0) + n

    def lambda_invocation(
        self,
        function: str,
        memory_mb: int,
        measured_s: float,
        model_s: float = 0.0,
        slept_s: float = 0.0,
        waited_s: float = 0.0,
        architecture: str = "x86_64",
        cold_start: str | None = None,
    ) -> None:
        """One invocation of ``function`` (a label: ``worker``, ``fanout``...) that ran for
        ``measured_s`` on the local clock, of which ``model_s`` in the model call and
        ``slept_s`` sleeping for tokens (both time-scaled); ``waited_s``: what the worker
        reported holding on for tokens (its sleeps and its draws' requests). ``cold_start``:
        the handler module a new sandbox imported for it (its INIT, which AWS bills too, is
        measured apart: :func:`swarm.bench.cost.bill_init`)."""
        if not self.enabled:
            return
        scale = self.time_scale
        model_s = min(max(0.0, model_s), measured_s)
        slept_s = min(max(0.0, slept_s), measured_s - model_s)
        billed = lambda_billed_seconds(deployed_seconds(measured_s, model_s + slept_s, scale))
        model_gb = gb_seconds(model_s * scale, memory_mb)
        wait_gb = gb_seconds(slept_s * scale, memory_mb)
        total_gb = gb_seconds(billed, memory_mb)
        price = LAMBDA_GB_S.get(architecture, LAMBDA_GB_S["x86_64"])
        self.add("lambda", "Invoke", function, LAMBDA_REQUESTS, 1, 1)
        if model_gb:
            self.add("lambda", "duration: the model call", function, price, 0, model_gb)
        if wait_gb:
            self.add("lambda", "duration: sleeping for tokens", function, price, 0, wait_gb)
        self.add("lambda", "duration", function, price, 0, total_gb - model_gb - wait_gb)
        with self._lock:
            use = self._functions.setdefault(function, FunctionUse())
            use.memory_mb, use.architecture = memory_mb, architecture
            use.invocations += 1
            if cold_start is not None:
                use.cold_starts += 1
                use.module = cold_start
            use.measured_s += measured_s
            use.model_s += model_s
            use.slept_s += slept_s
            use.waited_s += waited_s
            use.billed_s += billed
            self._billed.setdefault(function, []).append(billed)
            use.gb_s += total_gb
            use.waited_deployed_s += deployed_seconds(waited_s, min(slept_s, waited_s), scale)

    def _type(self, kind: str) -> str:
        return self.parent_type if kind == PARENT else self.child_type

    def state_entered(self, kind: str, state: str, retry: bool = False) -> None:
        """A state transition (a state entered, or a retry of it) in an execution of ``kind``;
        billed when that kind is Standard."""
        if not self.enabled:
            return
        with self._lock:
            self._executions.setdefault(kind, ExecutionUse()).transitions += 1
        if self._type(kind) == STANDARD:
            what = "retry" if retry else "state transition"
            suffix = "" if kind == PARENT else f" ({kind})"
            self.add("stepfunctions", f"{what}: {state}{suffix}", "state machine", SFN_TRANSITIONS)

    def execution_started(self, kind: str) -> None:
        with self._lock:
            self._executions.setdefault(kind, ExecutionUse()).started += 1
            if kind == PARENT:
                self._running += 1
        if kind == CHILD:  # the Distributed Map's own charge, whatever the child's type
            self.add(
                "stepfunctions",
                "map child started (Distributed Map)",
                "state machine",
                SFN_TRANSITIONS,
            )

    def execution_finished(self, kind: str, duration_s: float) -> None:
        with self._lock:
            use = self._executions.setdefault(kind, ExecutionUse())
            use.finished += 1
            use.duration_s += duration_s
            if kind == PARENT:
                self._running -= 1
        if self._type(kind) == EXPRESS:
            label = "Express execution" + ("" if kind == PARENT else f" ({kind})")
            self.add("stepfunctions", label, "state machine", SFN_EXPRESS_REQUESTS)
            self.add(
                "stepfunctions",
                f"{label}: duration",
                "state machine",
                SFN_EXPRESS_GB_S,
                0,
                express_gb_seconds(duration_s),
            )

    # -- reading
    def reset(self) -> None:
        """Start a new window (configuration, callers and running executions stay)."""
        with self._lock:
            self._lines.clear()
            self._functions.clear()
            self._billed.clear()
            self._executions.clear()
            self._dynamodb.clear()
            self._since = time.time()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            lines = sorted(
                (asdict(line) for line in self._lines.values()),
                key=lambda d: (d["service"], d["operation"], d["caller"], d["price"]),
            )
            return {
                "since": self._since,
                "window_s": time.time() - self._since,
                "time_scale": self.time_scale,
                "execution_types": {PARENT: self.parent_type, CHILD: self.child_type},
                "executions_running": self._running,
                "lines": lines,
                "lambda": {
                    name: {**asdict(use), **_percentiles_ms(self._billed.get(name, []))}
                    for name, use in sorted(self._functions.items())
                },
                "stepfunctions": {k: asdict(v) for k, v in sorted(self._executions.items())},
                "dynamodb": dict(sorted(self._dynamodb.items())),
            }


def _percentiles_ms(billed_s: list[float]) -> dict[str, float]:
    """The 10th, 50th and 90th percentiles of billed durations, in ms (nearest rank)."""
    if not billed_s:
        return {}
    ordered = sorted(billed_s)
    last = len(ordered) - 1
    return {
        f"billed_ms_p{q}": 1000 * ordered[min(last, math.ceil(q / 100 * len(ordered)) - 1)]
        for q in (10, 50, 90)
    }


#: the local stack's meter (process-wide: moto's patches and the function host feed it)
METER = Meter()


# ================================================================== the requests
def access_key(headers: Any, query: Mapping[str, Any] | None = None) -> str | None:
    """The access key id a request is signed with (an ``Authorization`` header, or a presigned
    URL's ``X-Amz-Credential``), or None."""
    authorization = headers.get("Authorization") if headers is not None else None
    if authorization:
        match = _CREDENTIAL.search(str(authorization))
        if match:
            return match.group(1)
    credential = (query or {}).get("X-Amz-Credential")
    if isinstance(credential, list):
        credential = credential[0] if credential else None
    if credential:
        return str(credential).split("/", 1)[0]
    return None


def _text(payload: Any) -> str:
    if isinstance(payload, bytes | bytearray):
        return payload.decode("utf-8", errors="replace")
    return payload if isinstance(payload, str) else ""


def _json(payload: Any) -> dict[str, Any]:
    text = _text(payload)
    if not text.lstrip().startswith("{"):
        return {}
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


# ---------------------------------------------------------------- DynamoDB
def _table(backend: Any, name: Any) -> Any:
    try:
        return backend.get_table(name)
    except Exception:  # moto answers a missing table itself; nothing is billed
        return None


def _key_of(table: Any, item: Mapping[str, Any]) -> dict[str, Any]:
    names = [n for n in (table.hash_key_attr, table.range_key_attr) if n]
    return {n: item[n] for n in names if n in item}


def _stored_item(table: Any, key: Mapping[str, Any]) -> Any:
    """The table's item with ``key`` (moto's ``Item``), or None."""
    from moto.dynamodb.models.dynamo_type import DynamoType

    try:
        hash_value = DynamoType(key[table.hash_key_attr])
        range_value = DynamoType(key[table.range_key_attr]) if table.range_key_attr else None
    except (KeyError, TypeError, AttributeError):
        return None
    bucket = table.items.get(hash_value)
    if range_value is None or bucket is None:
        return bucket
    return bucket.get(range_value)


def _index_entry(index: Any, attrs: Mapping[str, Any]) -> IndexEntry | None:
    keys = list(index.schema_key_attrs)
    if any(k not in attrs for k in keys):
        return None  # a sparse index: the item is not in it
    projection = index.projection or {}
    kind = projection.get("ProjectionType", "ALL")
    base = set(index.table_key_attrs) | set(keys)
    if kind == "ALL":
        names: set[str] = set(attrs)
    elif kind == "KEYS_ONLY":
        names = base
    else:
        names = base | set(projection.get("NonKeyAttributes") or [])
    entry = {n: attrs[n] for n in names if n in attrs}
    return IndexEntry(
        key=json.dumps([attrs[k].to_json() for k in keys], sort_keys=True, default=str),
        projected=json.dumps(
            {n: v.to_json() for n, v in entry.items()}, sort_keys=True, default=str
        ),
        size=item_size(entry),
    )


@dataclass(frozen=True)
class _State:
    size: int
    indexes: dict[str, IndexEntry]


def _size(table: Any, key: Mapping[str, Any]) -> int:
    """The stored item's size (0: absent); what a read of it is billed on, whatever it
    projects."""
    if table is None:
        return 0
    item = _stored_item(table, key)
    return 0 if item is None else item_size(item.attrs)


def _state(table: Any, key: Mapping[str, Any]) -> _State | None:
    item = _stored_item(table, key)
    if item is None:
        return None
    entries = {ix.name: _index_entry(ix, item.attrs) for ix in table.global_indexes}
    return _State(item_size(item.attrs), {n: e for n, e in entries.items() if e is not None})


_WRITE_KINDS = ("Put", "Update", "Delete", "ConditionCheck")


def _write_ops(backend: Any, action: str, body: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(kind, table, key)`` of every item a write request names."""
    ops: list[tuple[str, Any, Any]] = []

    def named(kind: str, table_name: Any, request: Mapping[str, Any]) -> None:
        table = _table(backend, table_name)
        if table is None:
            return
        key = _key_of(table, request.get("Item") or {}) if kind == "Put" else request.get("Key")
        if isinstance(key, Mapping):
            ops.append((kind, table, key))

    if action in ("PutItem", "UpdateItem", "DeleteItem"):
        named(action.removesuffix("Item"), body.get("TableName"), body)
    elif action == "BatchWriteItem":
        for table_name, requests in (body.get("RequestItems") or {}).items():
            for request in requests or []:
                if "PutRequest" in request:
                    named("Put", table_name, request["PutRequest"])
                elif "DeleteRequest" in request:
                    named("Delete", table_name, request["DeleteRequest"])
    elif action == "TransactWriteItems":
        for entry in body.get("TransactItems") or []:
            for kind in _WRITE_KINDS:
                if kind in entry:
                    named(kind, entry[kind].get("TableName"), entry[kind])
    return ops


def _outcome(status: int, payload: Any) -> str:
    if 200 <= status < 300:
        return "ok"
    text = _text(payload)
    if "ConditionalCheckFailedException" in text:
        return "condition failed"
    if "TransactionCanceledException" in text:
        return "cancelled"
    return "error"


def _read_units(backend: Any, action: str, body: Mapping[str, Any], response: Any) -> float:
    doc = _json(response)
    if action == "GetItem":
        size = _size(_table(backend, body.get("TableName")), body.get("Key") or {})
        return read_units(size, bool(body.get("ConsistentRead")))
    if action == "TransactGetItems":
        total = 0.0
        for entry in body.get("TransactItems") or []:
            get = entry.get("Get") or {}
            size = _size(_table(backend, get.get("TableName")), get.get("Key") or {})
            total += read_units(size, transactional=True)
        return total
    if action == "BatchGetItem":
        unprocessed = doc.get("UnprocessedKeys") or {}
        total = 0.0
        for table_name, request in (body.get("RequestItems") or {}).items():
            table = _table(backend, table_name)
            left = unprocessed.get(table_name, {}).get("Keys", [])
            skipped = {json.dumps(k, sort_keys=True) for k in left}
            consistent = bool(request.get("ConsistentRead"))
            for key in (request or {}).get("Keys") or []:
                if json.dumps(key, sort_keys=True) not in skipped:
                    total += read_units(_size(table, key), consistent)
        return total
    # Query, Scan: the items read, summed, then rounded (no filter here: every item read is
    # returned; a projection on the table is billed on the whole items)
    items = doc.get("Items") or []
    table = _table(backend, body.get("TableName"))
    projected = any(k in body for k in ("ProjectionExpression", "AttributesToGet", "Select"))
    whole = projected and table is not None and not body.get("IndexName")
    total_size = sum(
        (_size(table, _key_of(table, item)) if whole else 0) or item_size(item) for item in items
    )
    consistent = bool(body.get("ConsistentRead")) and not body.get("IndexName")
    return read_units(total_size, consistent)


_READS = ("GetItem", "BatchGetItem", "TransactGetItems", "Query", "Scan")
_WRITES = ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems")


def _dynamodb(handler: Any, action: str, caller: str, call: Callable[[], Any]) -> Any:
    if action not in _READS and action not in _WRITES:
        response = call()
        METER.add("dynamodb", action, caller, NOT_BILLED, 1, 0)
        return response
    from swarm.local.patches.dynamodb import dynamodb_lock

    body: Mapping[str, Any] = handler.body if isinstance(handler.body, Mapping) else {}
    backend = handler.dynamodb_backend
    # the whole request under the lock every item operation takes: the items' sizes before and
    # after are this request's, not another writer's
    with dynamodb_lock():
        ops = _write_ops(backend, action, body) if action in _WRITES else []
        before = [_state(table, key) for _kind, table, key in ops]
        response = call()
        status, _headers, payload = response
        outcome = _outcome(int(status), payload)
        if outcome == "error":
            METER.add("dynamodb", f"{action} (error)", caller, NOT_BILLED, 1, 0)
            return response
        if action in _READS:
            units = _read_units(backend, action, body, payload)
            METER.add("dynamodb", action, caller, DYNAMODB_READ, 1, units)
            return response
        after = [_state(table, key) for _kind, table, key in ops]
    transactional = action == "TransactWriteItems"
    succeeded = outcome == "ok"
    units = 0
    index_units: dict[str, int] = {}
    for (kind, _t, _k), old, new in zip(ops, before, after, strict=True):
        units += write_op_units(
            kind,
            old.size if old else None,
            new.size if new else None,
            succeeded,
            transactional,
        )
        if not succeeded or kind == "ConditionCheck":
            continue
        for name in set(old.indexes if old else {}) | set(new.indexes if new else {}):
            cost = index_write_units(
                old.indexes.get(name) if old else None, new.indexes.get(name) if new else None
            )
            if cost:
                index_units[name] = index_units.get(name, 0) + cost
    label = action if succeeded else f"{action} ({outcome})"
    METER.add("dynamodb", label, caller, DYNAMODB_WRITE, 1, units)
    for name, cost in sorted(index_units.items()):
        METER.add("dynamodb", f"{action}: index {name}", caller, DYNAMODB_WRITE, 0, cost)
    if not succeeded:
        METER.note(
            "conditions failed" if outcome == "condition failed" else "transactions cancelled"
        )
    return response


# ---------------------------------------------------------------- SQS, EventBridge, SSM
def _sqs(action: str, body: Mapping[str, Any], caller: str, response: Any) -> None:
    status, _headers, payload = response
    if not 200 <= int(status) < 300:
        METER.add("sqs", f"{action} (error)", caller, NOT_BILLED, 1, 0)
        return
    operation, size = action, 0
    if action == "SendMessage":
        size = message_size(body.get("MessageBody"), body.get("MessageAttributes"))
    elif action == "SendMessageBatch":
        size = sum(
            message_size(e.get("MessageBody"), e.get("MessageAttributes"))
            for e in body.get("Entries") or []
        )
    elif action == "ReceiveMessage":
        messages = _json(payload).get("Messages") or []
        size = sum(message_size(m.get("Body"), m.get("MessageAttributes")) for m in messages)
        if not messages:
            operation = "ReceiveMessage (empty)"
    billed = sqs_requests(size)
    if operation == "ReceiveMessage (empty)" and caller == ESM_CALLER:
        operation = f"ReceiveMessage (empty; x{ESM_IDLE_POLLERS}: AWS's idle pollers)"
        billed *= ESM_IDLE_POLLERS
    METER.add("sqs", operation, caller, SQS_REQUESTS, billed, billed)


def _events(action: str, body: Mapping[str, Any], caller: str, response: Any) -> None:
    status = int(response[0])
    if action != "PutEvents" or not 200 <= status < 300:
        METER.add("events", action, caller, NOT_BILLED, 1, 0)
        return
    billed = billed_events(entry_size(e) for e in body.get("Entries") or [])
    METER.add("events", action, caller, EVENTS, billed, billed)


# ---------------------------------------------------------------- the patches
_PATCHED: set[str] = set()
_GUARD = threading.Lock()


def _request_body(handler: Any) -> Mapping[str, Any]:
    from swarm.local.patches.iam import _request_body as parsed

    body = parsed(handler)
    return body if isinstance(body, Mapping) else {}


def _patch_responses() -> None:
    """Every request of the JSON and query services (moto's ``BaseResponse.call_action``)."""
    from moto.core.responses import BaseResponse

    original = BaseResponse.call_action

    @functools.wraps(original)
    def call_action(self: Any) -> Any:
        service = str(getattr(self, "service_name", "") or "")
        if not METER.enabled or service in _UNMETERED_SERVICES:
            return original(self)
        caller = METER.caller(access_key(self.headers))
        if caller is None:
            return original(self)
        action = str(self._get_action() or "")
        if service == "dynamodb":
            return _dynamodb(self, action, caller, lambda: original(self))
        response = original(self)
        try:
            body = _request_body(self)
            if service == "sqs":
                _sqs(action, body, caller, response)
            elif service == "events":
                _events(action, body, caller, response)
            elif service == "ssm":
                METER.add("ssm", action, caller, SSM_STANDARD)
            else:  # Step Functions' API (a Standard workflow bills its transitions), ...
                METER.add(service, action, caller, NOT_BILLED, 1, 0)
        except Exception:  # the bill never breaks a request
            log.exception("billing: could not meter %s %s", service, action)
        return response

    BaseResponse.call_action = call_action  # type: ignore[method-assign]


def _patch_s3() -> None:
    from moto.s3.responses import S3Response

    def metered(original: Callable[..., Any], has_key: bool) -> Callable[..., Any]:
        @functools.wraps(original)
        def response(self: Any, request: Any, full_url: str, headers: Any) -> Any:
            result = original(self, request, full_url, headers)
            if not METER.enabled:
                return result
            try:
                query = urllib.parse.parse_qs(
                    urllib.parse.urlsplit(full_url).query, keep_blank_values=True
                )
                caller = METER.caller(access_key(request.headers, query))
                if caller is not None:
                    copy = bool(request.headers.get("x-amz-copy-source"))
                    operation, price = s3_operation(request.method, has_key, query, copy)
                    if int(result[0]) == 403:  # refused: S3 does not bill it
                        operation, price = f"{operation} (denied)", NOT_BILLED
                    METER.add("s3", operation, caller, price, 1, 0 if price == NOT_BILLED else 1)
            except Exception:
                log.exception("billing: could not meter an S3 request")
            return result

        return response

    S3Response.bucket_response = metered(S3Response.bucket_response, False)  # type: ignore[method-assign]
    S3Response.key_response = metered(S3Response.key_response, True)  # type: ignore[method-assign]


def _kind(env: Any) -> str:
    return str(getattr(env.event_manager, "_swarm_bill_kind", PARENT))


def _patch_stepfunctions() -> None:
    """State transitions, retries and executions of moto's interpreter (a Distributed Map's
    children share one event history, which the meter marks as theirs)."""
    from moto.stepfunctions.parser.asl.component.common.retry.retry_outcome import RetryOutcome
    from moto.stepfunctions.parser.asl.component.state.exec.execute_state import ExecutionState
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration.itemprocessor.distributed_item_processor_worker import (  # noqa: E501
        DistributedItemProcessorWorker,
    )
    from moto.stepfunctions.parser.asl.component.state.state import CommonStateField
    from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker

    entered = CommonStateField.eval

    def state_eval(self: Any, env: Any) -> Any:
        METER.state_entered(_kind(env), str(self.name))
        return entered(self, env)

    retry = ExecutionState._handle_retry

    def _handle_retry(self: Any, env: Any, failure_event: Any) -> Any:
        outcome = retry(self, env, failure_event)
        if outcome == RetryOutcome.CanRetry:
            METER.state_entered(_kind(env), str(self.name), retry=True)
        return outcome

    child = DistributedItemProcessorWorker._eval_job

    def _eval_job(self: Any, env: Any, job: Any) -> Any:
        env.event_manager._swarm_bill_kind = CHILD  # the map run's history (moto's one per run)
        METER.execution_started(CHILD)
        started = time.perf_counter()
        try:
            return child(self, env, job)
        finally:
            METER.execution_finished(CHILD, time.perf_counter() - started)

    logic: Callable[..., Any] = ExecutionWorker._execution_logic

    def _execution_logic(self: Any) -> Any:
        METER.execution_started(PARENT)
        started = time.perf_counter()
        try:
            return logic(self)
        finally:
            METER.execution_finished(PARENT, time.perf_counter() - started)

    CommonStateField.eval = state_eval  # type: ignore[method-assign]
    ExecutionState._handle_retry = _handle_retry  # type: ignore[method-assign]
    DistributedItemProcessorWorker._eval_job = _eval_job  # type: ignore[method-assign]
    ExecutionWorker._execution_logic = _execution_logic  # type: ignore[method-assign]


PATCHES: dict[str, Callable[[], None]] = {
    "responses": _patch_responses,
    "s3": _patch_s3,
    "stepfunctions": _patch_stepfunctions,
}


def install() -> None:
    """Meter every request moto serves in this process (idempotent, process-wide)."""
    with _GUARD:
        for name, patch in PATCHES.items():
            if name not in _PATCHED:
                patch()
                _PATCHED.add(name)
