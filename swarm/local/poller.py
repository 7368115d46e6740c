"""The parts of Lambda and EventBridge that moto does not run, done the way AWS does them.

:class:`MappingPoller` is the Lambda SQS poller for one event source mapping: it reads the mapping
from moto again whenever it is written (so ``Enabled`` flips by the drain controller take effect at
once: :mod:`swarm.local.changes`), long-polls as
Lambda's pollers do (20 s on the deployed clock) for up to ``BatchSize`` messages (the queue's
own visibility timeout applies, as for Lambda's pollers: the emulator's SQS counts its seconds on
the deployed clock, :func:`swarm.local.patches.emulator.patch_sqs_deployed_clock`), invokes the
function through moto's Lambda API with the SQS event, keeps at most ``MaximumConcurrency``
invocations in flight, and with ``ReportBatchItemFailures`` deletes every message except the
reported failures. A function error (an unhandled exception, a crashed worker) deletes nothing:
the batch comes back after its visibility timeout, as on AWS.

:class:`ParameterRule` is an EventBridge rule on an SSM parameter: moto emits no "Parameter Store
Change" events, so it reads the parameter whenever a parameter is written and invokes the rule's
target with that event when the parameter's version changes.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from swarm.adapters.client_errors import client_error_type, error_code
from swarm.core.codec import parse_message
from swarm.core.errors import InvalidInput
from swarm.local.changes import CHANGES, MAPPINGS, PARAMETERS
from swarm.local.events import sqs_event

log = logging.getLogger("swarm.local")

#: Lambda's default when a mapping sets no MaximumConcurrency (bounded locally)
DEFAULT_CONCURRENCY = 5
#: how often a waiting loop looks at its stop event (no request: the writes it follows wake it)
WAKE_S = 0.5
#: Lambda's SQS pollers long-poll 20 s (on the deployed clock: locally ``20 / time_scale``)
AWS_LONG_POLL_S = 20


@dataclass
class PollerStats:
    batches: int = 0
    messages: int = 0
    deleted: int = 0
    item_failures: int = 0
    function_errors: int = 0
    max_in_flight: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def eventbridge_event(
    detail_type: str,
    source: str,
    account: str,
    region: str,
    resources: list[str],
    detail: dict[str, Any],
) -> dict[str, Any]:
    """The envelope EventBridge delivers to a rule's Lambda target."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": detail_type,
        "source": source,
        "account": account,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": resources,
        "detail": detail,
    }


@dataclass
class Receipts:
    """When the pollers received each unit's messages (the host's clock, as ``time.time()``):
    the order in which SQS gave a lane's units out. A unit already received cannot be reordered
    by the queue's fairness; the e2e fairness scenario tells those apart with it
    (``GET /_local/receipts?batch=``)."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _at: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # run -> unit -> times

    def note(self, messages: list[dict[str, Any]], at: float) -> None:
        for message in messages:
            try:
                units = parse_message(str(message.get("Body", "")))
            except InvalidInput:  # not a lane message: nothing to note
                continue
            with self._lock:
                for unit in units:
                    self._at.setdefault(unit.run_id, {}).setdefault(unit.unit_id, []).append(at)

    def of_run(self, run_id: str) -> dict[str, list[float]]:
        with self._lock:
            return {unit: list(times) for unit, times in self._at.get(run_id, {}).items()}


@dataclass
class MappingPoller:
    clients: Any
    uuid: str
    region: str
    stop: threading.Event
    time_scale: float = 1.0  # the stack's clock runs this many times faster (the long poll)
    #: clients for the queue, signed with the function's role (Lambda polls with it); the
    #: emulator's own ``clients`` read the mapping and invoke the function
    queue_clients: Any = None
    stats: PollerStats = field(default_factory=PollerStats)
    _active: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _mapping: dict[str, Any] = field(default_factory=dict)
    visibility_timeout_s: int = 0  # the queue's, as the mapping read it (deployed seconds)
    #: a receive (a long poll) is in flight: a mapping disabled meanwhile still delivers what it
    #: returns, as Lambda's pollers finish theirs
    receiving: bool = False
    _queue_url: str = ""
    receipts: Receipts | None = None  # when each unit's messages were received

    def refresh(self) -> dict[str, Any]:
        self._mapping = self.clients("lambda").get_event_source_mapping(UUID=self.uuid)
        if not self._queue_url:
            name = self._mapping["EventSourceArn"].rsplit(":", 1)[-1]
            # the mapping knows its queue's ARN; finding the URL is the emulator's own business
            self._queue_url = self.clients("sqs").get_queue_url(QueueName=name)["QueueUrl"]
            # Lambda reads the queue's attributes with the function's role (it needs
            # sqs:GetQueueAttributes); the visibility timeout is SQS's own business (deployed
            # seconds, on the emulator's scaled clock)
            attrs = self._sqs().get_queue_attributes(
                QueueUrl=self._queue_url, AttributeNames=["VisibilityTimeout"]
            )["Attributes"]
            self.visibility_timeout_s = int(attrs["VisibilityTimeout"])
        return self._mapping

    def _sqs(self) -> Any:
        return (self.queue_clients or self.clients)("sqs")

    @property
    def long_poll_s(self) -> int:
        """AWS's 20 s long poll on the local clock (a new message ends it at once; SQS takes
        whole seconds, 1 to 20)."""
        return max(1, min(AWS_LONG_POLL_S, round(AWS_LONG_POLL_S / self.time_scale)))

    @property
    def enabled(self) -> bool:
        return self._mapping.get("State") == "Enabled"

    @property
    def max_concurrency(self) -> int:
        scaling = self._mapping.get("ScalingConfig") or {}
        return int(scaling.get("MaximumConcurrency") or DEFAULT_CONCURRENCY)

    @property
    def in_flight(self) -> int:
        return self._active

    def run(self) -> None:
        CHANGES.require()
        seen = CHANGES.version(MAPPINGS)  # before the read: a write after it is read again
        self.refresh()
        pool = ThreadPoolExecutor(
            max_workers=max(self.max_concurrency, 1), thread_name_prefix=f"esm-{self.uuid[:8]}"
        )
        try:
            while not self.stop.is_set():
                latest = CHANGES.version(MAPPINGS)
                if latest != seen:  # a mapping was written: this one, perhaps
                    try:
                        self.refresh()
                        seen = latest
                    except Exception:  # moto going down: the loop ends with stop
                        log.exception("mapping %s: refresh failed", self.uuid)
                        self.stop.wait(1)
                        continue
                if not self.enabled:
                    CHANGES.wait(MAPPINGS, seen, WAKE_S)
                    continue
                with self._cond:
                    if self._active >= self.max_concurrency:
                        self._cond.wait(WAKE_S / 2)
                        continue
                self.receiving = True  # a long poll in flight still delivers what it gets
                try:
                    messages = self._receive()
                except Exception:
                    if not self.stop.is_set():
                        log.exception("mapping %s: receive failed", self.uuid)
                    self.stop.wait(1)
                    continue
                finally:
                    self.receiving = False
                if not messages:
                    continue
                if self.receipts is not None:
                    self.receipts.note(messages, time.time())
                with self._cond:
                    self._active += 1
                    self.stats.max_in_flight = max(self.stats.max_in_flight, self._active)
                pool.submit(self._deliver, messages)
        finally:
            pool.shutdown(wait=True)

    def _receive(self) -> list[dict[str, Any]]:
        response = self._sqs().receive_message(
            QueueUrl=self._queue_url,
            MaxNumberOfMessages=int(self._mapping.get("BatchSize", 10)),
            WaitTimeSeconds=self.long_poll_s,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages: list[dict[str, Any]] = response.get("Messages", [])
        return messages

    def _deliver(self, messages: list[dict[str, Any]]) -> None:
        try:
            self._invoke(messages)
        except Exception:
            log.exception("mapping %s: delivery failed", self.uuid)
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def _invoke(self, messages: list[dict[str, Any]]) -> None:
        mapping = self._mapping
        event = sqs_event(mapping["EventSourceArn"], messages, self.region)
        self.stats.batches += 1
        self.stats.messages += len(messages)
        response = self.clients("lambda-invoke").invoke(
            FunctionName=mapping["FunctionArn"],
            Payload=json.dumps(event, ensure_ascii=False).encode(),
        )
        payload = response["Payload"].read()
        if response.get("FunctionError"):
            # nothing deleted: the whole batch is redelivered after its visibility timeout
            self.stats.function_errors += 1
            log.warning(
                "mapping %s: function error %s", self.uuid, payload[:4000].decode(errors="replace")
            )
            return
        ids = {m["MessageId"] for m in messages}
        failed: set[str] = set()
        if "ReportBatchItemFailures" in (mapping.get("FunctionResponseTypes") or []):
            try:
                doc = json.loads(payload or b"null") or {}
                failed = {f["itemIdentifier"] for f in doc.get("batchItemFailures") or []}
            except (ValueError, TypeError, KeyError):
                failed = set(ids)  # an unreadable response fails the whole batch, as on AWS
            if not failed <= ids:
                failed = set(ids)
        self.stats.item_failures += len(failed)
        done = [m for m in messages if m["MessageId"] not in failed]
        if done:
            self._sqs().delete_message_batch(
                QueueUrl=self._queue_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done)
                ],
            )
            self.stats.deleted += len(done)


@dataclass
class ParameterRule:
    """An EventBridge rule matching "Parameter Store Change" for one parameter."""

    clients: Any
    parameter: str
    target_arn: str
    region: str
    account: str
    stop: threading.Event
    fired: int = 0
    errors: int = 0

    def _version(self) -> int | None:
        """The parameter's version; None while it does not exist (any other failure raises)."""
        try:
            doc = self.clients("ssm").get_parameter(Name=self.parameter)["Parameter"]
        except client_error_type() as e:
            if error_code(e) == "ParameterNotFound":
                return None
            raise
        return int(doc["Version"])

    def event(self, operation: str) -> dict[str, Any]:
        arn = f"arn:aws:ssm:{self.region}:{self.account}:parameter{self.parameter}"
        detail = {"name": self.parameter, "type": "String", "operation": operation}
        return eventbridge_event(
            "Parameter Store Change", "aws.ssm", self.account, self.region, [arn], detail
        )

    def run(self) -> None:
        CHANGES.require()
        written: int | None = None  # the writes read so far (None: the parameter not read yet)
        seen: int | None = None
        while not self.stop.is_set():
            # (taken before the read: a write after it is read again)
            if written is None:
                latest = CHANGES.version(PARAMETERS)
            else:
                latest = CHANGES.wait(PARAMETERS, written, WAKE_S)
                if latest == written:
                    continue
            try:
                version = self._version()
            except Exception:  # read again (the write is not taken as seen), or moto going down
                if not self.stop.is_set():
                    log.exception("rule on %s: reading it failed", self.parameter)
                self.stop.wait(1)
                continue
            first, written = written is None, latest
            if first:
                seen = version
                continue
            if version is None or version == seen:
                continue
            operation = "Create" if seen is None else "Update"
            seen = version
            self.fire(operation)

    def fire(self, operation: str) -> None:
        # EventBridge retries a failed target (the rule's RetryPolicy): a few times here
        for attempt in range(3):
            response = self.clients("lambda-invoke").invoke(
                FunctionName=self.target_arn, Payload=json.dumps(self.event(operation)).encode()
            )
            response["Payload"].read()
            if not response.get("FunctionError"):
                self.fired += 1
                return
            self.errors += 1
            self.stop.wait(0.5 * (attempt + 1))


_RATE = re.compile(r"^rate\((\d+) (minute|minutes|hour|hours|day|days)\)$")
_UNIT_S = {"minute": 60, "hour": 3600, "day": 86400}


def rate_seconds(expression: str) -> int:
    """``rate(15 minutes)`` -> 900 (EventBridge's rate expressions; cron is not played here)."""
    match = _RATE.match(expression)
    if match is None:
        raise ValueError(f"the local stack plays rate(...) schedules only, not {expression!r}")
    return int(match.group(1)) * _UNIT_S[match.group(2).rstrip("s")]


@dataclass
class ScheduleRule:
    """An EventBridge rule on a schedule: invokes its target every period (time-scaled)."""

    clients: Any
    expression: str
    target_arn: str
    region: str
    account: str
    stop: threading.Event
    time_scale: float = 1.0
    fired: int = 0
    errors: int = 0

    @property
    def period_s(self) -> float:
        return rate_seconds(self.expression) / self.time_scale

    def event(self) -> dict[str, Any]:
        return eventbridge_event("Scheduled Event", "aws.events", self.account, self.region, [], {})

    def run(self) -> None:
        while not self.stop.wait(self.period_s):
            try:
                response = self.clients("lambda-invoke").invoke(
                    FunctionName=self.target_arn, Payload=json.dumps(self.event()).encode()
                )
                response["Payload"].read()
            except Exception:
                if self.stop.is_set():
                    return
                log.exception("schedule %s: invoking %s failed", self.expression, self.target_arn)
                self.errors += 1
                continue
            if response.get("FunctionError"):
                self.errors += 1
            else:
                self.fired += 1
