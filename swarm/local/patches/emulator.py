"""moto patches the local stack needs besides the DynamoDB one in
:mod:`swarm.local.patches.dynamodb`.

Each patch is small, process-wide, idempotent, and listed in docs/explanation/local.md with the
reason:

* :func:`patch_event_bus_ref`: moto's ``Ref`` of ``AWS::Events::EventBus`` renders the Python
  object (``<moto.events.models.EventBus object at 0x..>``) instead of the bus name, which breaks
  every function's ``EVENT_BUS_NAME``. Real CloudFormation returns the name.
* :func:`patch_state_machine_cfn`: with execution enabled, moto's API serves state machines from
  its interpreter backend while CloudFormation creates them in the plain backend (so they are not
  listed, cannot be updated and never run). The patch creates them in the backend the API uses.
* :func:`patch_sqs_no_builtin_esm`: moto's own SQS event source mapping invokes the function
  synchronously inside ``SendMessage`` (no batching, no concurrency limit, no visibility timeout).
  The local poller (:mod:`swarm.local.poller`) replaces it, so moto's is switched off.
* :func:`patch_sqs_fair_queues`: SQS *fair queues* (standard queues, ``MessageGroupId`` = tenant)
  serve tenants with few messages in flight ahead of a tenant that floods the queue. moto returns
  messages in send order. The patch orders the visible messages of a standard queue the way fair
  queues behave: round-robin across message groups, groups with fewer in-flight messages first.
* :func:`patch_sqs_message_clock`: moto decides whether a message is visible or delayed by
  building two ``datetime`` objects per message, and every send, receive and attribute read scans
  every message of the queue (a send computes all the queue's attributes, three scans). With a
  2,000-unit batch queued that clock was ~25% of the stack's CPU. The patch reads the same clock
  (epoch milliseconds) with ``time.time()``.
* :func:`patch_sqs_deployed_clock`: the local stack runs the deployed system on a clock
  ``time_scale`` times faster, but SQS takes whole seconds (``DelaySeconds``,
  ``VisibilityTimeout``). Counted on the local clock, one SQS second was ten deployed seconds at
  x10: a unit whose place in the governor's queue was ready in 0.25 s waited a whole local second,
  so units due 2.5 deployed seconds apart arrived together, four to a worker invocation, where
  AWS delivers them one by one (measured with ``swarm bench cost``: 3.7 units per invocation at
  x10, 1.0 at x1). The patch makes the emulator's SQS count its seconds on the deployed clock,
  scaled: a delay or visibility timeout of N seconds lasts N / ``time_scale`` local seconds, and
  the SQS adapter (``SqsLanes.time_scale``) rounds its callers' local durations up to whole
  deployed seconds, as SQS rounds them on AWS. moto's long poll also looked for a message whose
  delay or visibility timeout ended only once a second (it wakes at once on a send): it now wakes
  when the next one is due, as a long poll on SQS returns a message once it is visible.
* :func:`patch_sqs_retention_check`: moto's receive checks each message's retention period by
  computing every queue attribute (the message counts: a scan) per message, so a receive was
  quadratic in the queue's depth; the patch reads the one attribute.
* :func:`patch_sqs_send_attributes`: moto's send computes every queue attribute (the message
  counts: three passes over the queue) to read ``ContentBasedDeduplication``, which only a FIFO
  queue has, so fanning out a batch was quadratic in its size (10,000 units: ~62% of the
  emulator's CPU, the workers starved while the chunks were sent). A send to a standard queue
  skips them.
* :func:`patch_sqs_delete_in_place`: moto's delete builds a new list of the queue's messages
  without the deleted one and assigns it, holding no lock, so two deletes from one queue at once
  (two batches of a lane done together) undid one of them (a duplicate delivery) and dropped a
  message sent in between (seen: a unit requeued by a worker never came back, and its batch
  never closed). The patch removes the message in place, under the lock moto's send takes.
* :func:`patch_dynamodb_query_candidates`: moto answers every Query by sorting *every item of
  the table* and comparing each with the key condition, then sorting the matches: a Query cost
  O(table size), so the finalizer's poll of a run's expired leases (a sparse index) grew with
  every unit and attempt the table held (10,000 queued units: ~40% of the emulator's CPU). The
  patch hands moto's query only the items that can match, unsorted (moto sorts its matches
  itself): the key's partition when the key condition names the table's partition key, for an
  index only the items that carry every key attribute of the index (DynamoDB's sparse indexes),
  and only those whose sort key meets the key condition (moto's own comparison). Same answers,
  by moto's own code.
* :func:`patch_sfn_client_cache`: moto's Step Functions interpreter builds a new boto3 client for
  every task it runs (every ``lambda:invoke`` of every map child), so each child costs a client
  build (~5% of the stack's CPU) and a new connection, for which the server's single accept
  thread starts a new thread. The patch reuses one client per region and service, with a
  connection pool sized for the map's concurrency (measured: a 2,000-unit fan-out in ~130 s
  instead of ~150 s, one run each).
* :func:`patch_change_signals`: the local stack's pollers follow the event source mappings and
  the drain parameter (:mod:`swarm.local.poller`); moto emits no event when they are written, and
  reading them over HTTP every half second cost an idle stack most of its 22% of a core. The
  patch bumps :data:`swarm.local.changes.CHANGES` after each write of either, and the pollers wait
  for that.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from swarm.local.patches import limits
from swarm.local.patches import stepfunctions as sfn_patch
from swarm.local.patches.table_updates import patch_table_index_updates

_APPLIED: set[str] = set()
_GUARD = threading.Lock()

#: A definition the state machine holds until the local definition replaces it.
PLACEHOLDER_DEFINITION = json.dumps(
    {
        "StartAt": "NotDeployed",
        "States": {"NotDeployed": {"Type": "Fail", "Error": "LocalDefinitionNotApplied"}},
    }
)


def _once(name: str, patch: Callable[[], None]) -> None:
    with _GUARD:
        if name in _APPLIED:
            return
        patch()
        _APPLIED.add(name)


def patch_event_bus_ref() -> None:
    def apply() -> None:
        from moto.events.models import EventBus

        EventBus.physical_resource_id = property(lambda self: self.name)  # type: ignore[attr-defined]

    _once("event-bus-ref", apply)


def patch_state_machine_cfn() -> None:
    def apply() -> None:
        from moto.stepfunctions.models import StateMachine
        from moto.stepfunctions.responses import get_backend
        from moto.stepfunctions.utils import cfn_to_api_tags

        def create_from_cloudformation_json(
            cls: Any,
            /,
            resource_name: str,
            cloudformation_json: Any,
            account_id: str,
            region_name: str,
            **kwargs: Any,
        ) -> Any:
            properties = cloudformation_json["Properties"]
            name = properties.get("StateMachineName", resource_name)
            # DefinitionS3Location is ignored by moto: hold a placeholder until the runtime
            # applies infra.local_definition's definition with update_state_machine
            definition = properties.get("DefinitionString") or PLACEHOLDER_DEFINITION
            tags = cfn_to_api_tags(properties.get("Tags", []))
            backend = get_backend(account_id, region_name)
            return backend.create_state_machine(
                name, definition, properties.get("RoleArn", ""), tags=tags
            )

        StateMachine.create_from_cloudformation_json = classmethod(  # type: ignore[method-assign,assignment]
            create_from_cloudformation_json
        )

    _once("state-machine-cfn", apply)


def patch_sqs_no_builtin_esm() -> None:
    def apply() -> None:
        from moto.sqs.models import Queue

        # __init__ assigns {}; reads get a fresh empty dict, so nothing is ever triggered
        Queue.lambda_event_source_mappings = property(  # type: ignore[assignment]
            lambda self: {}, lambda self, value: None
        )

    _once("sqs-no-builtin-esm", apply)


def fair_order(messages: list[Any], in_flight: Counter[str]) -> list[Any]:
    """Visible messages in fair-queue order: the n-th message of a group ranks at
    ``in_flight[group] + n``; ties keep send order. Messages without a group form one group."""
    seen: Counter[str] = Counter()
    ranked = []
    for position, message in enumerate(messages):
        group = message.group_id or ""
        ranked.append((in_flight[group] + seen[group], position, message))
        seen[group] += 1
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [r[2] for r in ranked]


def patch_sqs_fair_queues() -> None:
    def apply() -> None:
        from moto.sqs.models import Queue

        unordered: Callable[[Any], list[Any]] = Queue.messages.fget  # type: ignore[attr-defined]

        def messages(self: Any) -> list[Any]:
            visible = unordered(self)
            if self.fifo_queue or len(visible) < 2:
                return visible
            if len({m.group_id or "" for m in visible}) < 2:
                return visible  # one group: its fair order is its send order
            in_flight: Counter[str] = Counter(
                m.group_id or "" for m in self._messages if not m.visible
            )
            return fair_order(visible, in_flight)

        def visible_count(self: Any) -> int:  # a count needs no order
            return len(unordered(self))

        def wait_for_messages(self: Any, timeout: int) -> None:  # nor does "is there one?"
            with self._messages_lock:
                self._messages_lock.wait_for(lambda: unordered(self), timeout=timeout)

        Queue.messages = property(messages)  # type: ignore[method-assign,assignment]
        Queue.approximate_number_of_messages = property(visible_count)  # type: ignore[method-assign,assignment]
        Queue.wait_for_messages = wait_for_messages  # type: ignore[method-assign]

    _once("sqs-fair-queues", apply)


def patch_sqs_retention_check() -> None:
    """moto's receive checks each visible message's retention period through
    ``get_queue_attributes``, which computes every attribute, the message counts included (a pass
    over the queue): a receive was quadratic in the queue's depth (10,000 queued units: most of
    the emulator's time). Read the one attribute instead; the rule is moto's."""

    def apply() -> None:
        from moto.core.utils import unix_time
        from moto.sqs.models import SQSBackend

        def is_message_valid_based_on_retention_period(
            self: Any, queue_name: str, message: Any
        ) -> bool:
            retention_s = int(self.get_queue(queue_name).message_retention_period)
            return bool(retention_s + message.sent_timestamp / 1000 > unix_time())

        SQSBackend.is_message_valid_based_on_retention_period = (  # type: ignore[method-assign]
            is_message_valid_based_on_retention_period
        )

    _once("sqs-retention-check", apply)


def patch_sqs_send_attributes() -> None:
    def apply() -> None:
        from moto.sqs.models import Queue, SQSBackend

        every_attribute: Callable[[Any], dict[str, Any]] = Queue.attributes.fget  # type: ignore[attr-defined]
        original = SQSBackend.send_message
        sending = threading.local()

        def attributes(self: Any) -> dict[str, Any]:
            if getattr(sending, "active", False) and not self.fifo_queue:
                # all a send reads is ContentBasedDeduplication, a FIFO queue's attribute alone
                return {}
            return every_attribute(self)

        def send_message(self: Any, *args: Any, **kw: Any) -> Any:
            sending.active = True
            try:
                return original(self, *args, **kw)
            finally:
                sending.active = False

        Queue.attributes = property(attributes)  # type: ignore[method-assign,assignment]
        SQSBackend.send_message = send_message  # type: ignore[method-assign]

    _once("sqs-send-attributes", apply)


def patch_sqs_delete_in_place() -> None:
    def apply() -> None:
        from moto.sqs.exceptions import ReceiptHandleIsInvalid
        from moto.sqs.models import Queue

        original = Queue.delete_message

        def delete_message(self: Any, receipt_handle: str) -> None:
            if receipt_handle in self.deleted_messages:
                return  # deleted already: SQS takes a second delete
            with self._messages_lock:  # what add_message holds while it appends
                found = [m for m in self._messages if m.had_receipt_handle(receipt_handle)]
                if not found:
                    raise ReceiptHandleIsInvalid()
                for message in found:
                    self._messages.remove(message)
                    self.pending_messages.discard(message)
                    self.deleted_messages.update(message.all_receipt_handles)

        delete_message.unpatched = original  # type: ignore[attr-defined]  # for its test
        Queue.delete_message = delete_message  # type: ignore[method-assign]

    _once("sqs-delete-in-place", apply)


def patch_dynamodb_query_candidates() -> None:
    def apply() -> None:
        from moto.dynamodb.models.table import Table

        every_item: Callable[[Any], list[Any]] = Table.all_items
        original = Table.query
        querying = threading.local()

        def candidates(table: Any, hash_key: Any, args: tuple[Any, ...], kw: Any) -> list[Any]:
            # moto's parameters after hash_key: range_comparison, range_objs, limit,
            # exclusive_start_key, scan_index_forward, projection_expressions, index_name
            comparison, objects = args[0], args[1]
            index_name = args[6] if len(args) > 6 else kw.get("index_name")
            if not table.range_key_attr or len(kw.get("range_key_conditions") or []) > 1:
                return every_item(table)
            if not index_name:
                if hash_key is None:
                    return []
                partitions, keys, sort_key = (
                    [table.items.get(hash_key, {})],
                    [],
                    table.range_key_attr,
                )
            else:
                index = next((i for i in table.all_indexes() if i.name == index_name), None)
                if index is None:
                    return every_item(table)  # moto's own error follows
                partition = dict(kw.get("hash_key_conditions") or []).get(table.hash_key_attr)
                partitions = (
                    table.items.values() if partition is None else [table.items.get(partition, {})]
                )
                keys = [k["AttributeName"] for k in index.schema]
                ranges = [k["AttributeName"] for k in index.schema if k["KeyType"] == "RANGE"]
                sort_key = ranges[0] if len(ranges) == 1 else None
            found = [
                item
                for items in partitions
                for item in items.values()
                if all(k in item.attrs for k in keys)  # an index holds only items with its keys
            ]
            if comparison and sort_key:  # the key condition on the sort key, by moto's compare
                found = [i for i in found if i.attrs[sort_key].compare(comparison, objects)]
            return found

        def all_items(self: Any) -> list[Any]:
            pool = getattr(querying, "pool", None)
            if pool is not None and pool[0] is self:
                return list(pool[1])
            return every_item(self)

        @functools.wraps(original)
        def query(self: Any, hash_key: Any, *args: Any, **kw: Any) -> Any:
            querying.pool = (self, candidates(self, hash_key, args, kw))
            try:
                return original(self, hash_key, *args, **kw)
            finally:
                querying.pool = None

        Table.all_items = all_items  # type: ignore[method-assign]
        Table.query = query  # type: ignore[method-assign]

    _once("dynamodb-query-candidates", apply)


@contextmanager
def dynamodb_query_unpatched() -> Iterator[None]:
    """moto's own Query for the duration (the test that pins the patch's answers)."""
    from moto.dynamodb.models.table import Table

    patched = Table.query
    Table.query = getattr(patched, "__wrapped__", patched)  # type: ignore[method-assign]
    try:
        yield
    finally:
        Table.query = patched  # type: ignore[method-assign]


def patch_sqs_message_clock() -> None:
    def apply() -> None:
        from moto.sqs.models import Message

        Message.visible = property(lambda self: time.time() * 1000.0 > self.visible_at)  # type: ignore[method-assign,assignment]
        Message.delayed = property(lambda self: time.time() * 1000.0 < self.delayed_until)  # type: ignore[method-assign,assignment]

    _once("sqs-message-clock", apply)


#: how many times faster than the deployed clock the local stack runs (patch_sqs_deployed_clock)
SQS_TIME_SCALE = [1.0]


def patch_sqs_deployed_clock(time_scale: float) -> None:
    if time_scale <= 0:
        raise ValueError(f"time_scale must be > 0, not {time_scale}")
    SQS_TIME_SCALE[0] = time_scale

    def apply() -> None:
        from moto.sqs import models
        from moto.sqs.models import Message, Queue

        def later_ms(seconds: int) -> float:  # SQS seconds from now, in local epoch ms
            # moto's own clock, looked up at each call (a test may freeze it)
            now = float(models.unix_time_millis())  # type: ignore[attr-defined]
            return now + int(seconds) * 1000.0 / SQS_TIME_SCALE[0]

        def delay(self: Any, delay_seconds: int) -> None:
            self.delayed_until = later_ms(delay_seconds)

        def change_visibility(self: Any, visibility_timeout: int) -> None:
            self.visible_at = later_ms(visibility_timeout)

        def wait_for_messages(self: Any, timeout: int) -> None:
            # until a message is sent or the next delayed or invisible one is due (moto: a send
            # or a second, so a delay's end was seen up to a local second late)
            now = float(models.unix_time_millis())  # type: ignore[attr-defined]
            due = [
                max(m.visible_at, m.delayed_until)
                for m in self._messages
                if max(m.visible_at, m.delayed_until) > now
            ]
            wait = min(float(timeout), (min(due) - now) / 1000.0 + 0.001) if due else timeout
            with self._messages_lock:
                self._messages_lock.wait_for(lambda: self.messages, timeout=wait)

        Message.delay = delay  # type: ignore[method-assign]
        Message.change_visibility = change_visibility  # type: ignore[method-assign]
        Queue.wait_for_messages = wait_for_messages  # type: ignore[method-assign]

    _once("sqs-deployed-clock", apply)


#: the credentials the interpreter's tasks call with: the state machine's role, set by the local
#: stack once it is deployed (``boto3.client`` keyword arguments); moto's dummy keys until then
INTERPRETER_CREDENTIALS: dict[str, str] = {}

#: connections each cached interpreter client keeps (a Distributed Map runs up to
#: ``fanout.max_concurrency`` children at once, 100 by default)
SFN_CLIENT_POOL = 128


def patch_sfn_client_cache() -> None:
    def apply() -> None:
        import sys

        import boto3
        from botocore.config import Config
        from moto.core.models import botocore_stubber
        from moto.settings import moto_server_port
        from moto.stepfunctions.parser.asl.component.common.timeouts.timeout import (
            TimeoutSeconds,
        )
        from moto.stepfunctions.parser.asl.utils import boto_client

        original = boto_client.boto_client_for
        cache: dict[tuple[str, str, str | None, str], Any] = {}
        lock = threading.Lock()

        def boto_client_for(region: str, service: str, state_credentials: Any = None) -> Any:
            # as moto's, but built once: the server's endpoint, or none when moto intercepts
            endpoint = (
                None if botocore_stubber.enabled else f"http://localhost:{moto_server_port()}"
            )
            credentials = INTERPRETER_CREDENTIALS or {
                "aws_access_key_id": "ak",
                "aws_secret_access_key": "sk",
            }
            with lock:
                key = (region, service, endpoint, credentials["aws_access_key_id"])
                if key not in cache:
                    cache[key] = boto3.client(
                        service_name=service,
                        region_name=region,
                        endpoint_url=endpoint,
                        **credentials,
                        config=Config(
                            parameter_validation=False,
                            retries={"max_attempts": 0, "total_max_attempts": 1},
                            connect_timeout=TimeoutSeconds.DEFAULT_TIMEOUT_SECONDS,
                            read_timeout=TimeoutSeconds.DEFAULT_TIMEOUT_SECONDS,
                            max_pool_connections=SFN_CLIENT_POOL,
                        ),
                    )
                return cache[key]

        # the interpreter's modules imported the function by name: rebind it in each of them
        boto_client.boto_client_for = boto_client_for
        for name, module in list(sys.modules.items()):
            if name.startswith("moto.stepfunctions") and (
                getattr(module, "boto_client_for", None) is original
            ):
                module.boto_client_for = boto_client_for  # type: ignore[attr-defined]

    _once("sfn-client-cache", apply)


def patch_change_signals() -> None:
    def apply() -> None:
        from moto.awslambda.models import LambdaBackend
        from moto.ssm.models import SimpleSystemManagerBackend

        from swarm.local.changes import CHANGES, MAPPINGS, PARAMETERS

        def signalling(kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def write(*args: Any, **kwargs: Any) -> Any:
                try:
                    return original(*args, **kwargs)
                finally:  # a refused write changed nothing: a poller reads the same state again
                    CHANGES.bump(kind)

            return write

        for backend, kind, names in (
            (
                LambdaBackend,
                MAPPINGS,
                (
                    "create_event_source_mapping",
                    "update_event_source_mapping",
                    "delete_event_source_mapping",
                ),
            ),
            (
                SimpleSystemManagerBackend,
                PARAMETERS,
                (
                    "put_parameter",
                    "label_parameter_version",
                    "delete_parameter",
                    "delete_parameters",
                ),
            ),
        ):
            for name in names:
                setattr(backend, name, signalling(kind, getattr(backend, name)))
        CHANGES.signalled = True

    _once("change-signals", apply)


def apply_all() -> None:
    patch_change_signals()  # the pollers wait for writes instead of polling (swarm.local.changes)
    patch_event_bus_ref()
    patch_state_machine_cfn()
    patch_sqs_no_builtin_esm()
    patch_sqs_fair_queues()
    patch_sqs_message_clock()
    patch_sqs_retention_check()
    patch_sqs_send_attributes()
    patch_sqs_delete_in_place()
    patch_dynamodb_query_candidates()
    patch_sfn_client_cache()
    sfn_patch.patch_sfn_start_execution()  # the continue-as-new task (patches/stepfunctions.py)
    sfn_patch.patch_sfn_stop_stays_aborted()  # a stop while a task waits for its token
    patch_table_index_updates()  # a redeploy's index changes (patches/table_updates.py)
    limits.apply_all()  # AWS's service limits (patches/limits.py)
