"""AWS service limits the local emulator enforces, where moto does not (or not exactly).

A green run on moto says nothing about a limit moto does not check, so the local stack (and the
tests that call :func:`apply_all`) answer these requests as AWS does: the same error code, HTTP
status and message. What moto 5.2.5 already enforces is left to moto and listed per service in
docs/explanation/local.md ("Service limits enforced locally"), with the limits that stay unchecked.

Sources (checked for this module): the AWS developer guides and API references (through botocore
1.44's bundled documentation: SQS messages and EventBridge entries are 1 MiB since 2025-2026, no
longer 256 KiB), and, where AWS documents no byte-exact rule, published measurements against AWS:
DynamoDB sizes a number by its base-100 digit pairs, a Step Functions execution that reaches
25,000 history events fails with ``States.Runtime`` as event 25,000.

DynamoDB (:func:`patch_dynamodb`)
  * item size 400 KB (409,600 bytes, inclusive) as AWS computes it (:func:`item_size`), on
    PutItem, BatchWriteItem (checked for every item before any is written), UpdateItem (the
    resulting item; the item is left as it was, and an item the update would have created is not
    created) and TransactWriteItems (a ``ValidationError`` cancellation reason, as AWS reports a
    validation failure inside a transaction). moto checks an approximation (405,000 by its own
    sizes: numbers as their text, binaries as base64, no list/map overhead), which rejects items
    AWS accepts; that check is replaced.
  * BatchWriteItem at most 25 requests; TransactWriteItems at most 4 MB (4,194,304 bytes) of items.
  * numbers: at most 38 significant digits, magnitude from 1E-130 to below 1E+126, in every
    attribute value of a request (items, keys, expression values). moto checks the range only in
    a put item's attributes, through ``float`` (so ``1E+126`` passes), and never the precision.

Step Functions (:func:`patch_stepfunctions`)
  * 262,144 bytes (UTF-8) of input or output: moto checks state and task outputs but fails at
    exactly 262,144 (it allows < 262,144); this allows it. Added: a state's input (a Distributed
    Map child's first state: its item), a task's parameters when it is scheduled (both fail with
    ``States.DataLimitExceeded``) and StartExecution's input (``ValidationException``).
  * 25,000 events in an execution's history: event 25,000 is ``ExecutionFailed``
    (``States.Runtime``, "The execution reached the maximum number of history events (25000).").
    A Distributed Map's child executions have their own histories (not counted in the parent's).

Lambda (:func:`patch_lambda`)
  * a synchronous Invoke's request over 6,291,456 bytes: ``RequestEntityTooLargeException`` (413);
    an asynchronous one (``Event``) over 1,048,576 bytes: the same. A response over 6,291,556
    bytes: the function error ``Function.ResponseSizeTooLarge``. moto checked only the response,
    at ~6,000,000 bytes of a Python object's size (``sys.getsizeof``).

SQS (:func:`patch_sqs`)
  * a message's size is its body (UTF-8) plus each message attribute's name, type and value, up
    to the queue's ``MaximumMessageSize`` (moto counted the body's characters only); a batch's
    messages together at most 1 MiB (moto: the bodies' characters); DelaySeconds below 0 (moto
    checks only above 900).

S3 (:func:`patch_s3`)
  * UploadPart of a multipart upload that is no longer there (aborted, e.g. by a lifecycle
    rule, or completed): ``NoSuchUpload`` (404), as AWS answers; moto failed with an internal
    error (a ``KeyError``).

EventBridge (:func:`patch_events`)
  * PutEvents entries together at most 1 MiB, sized as AWS documents (``Time`` 14 bytes, the
    UTF-8 bytes of ``Source``, ``DetailType``, ``Detail`` and each of ``Resources``). moto checks
    the 10-entry limit only.

Every patch is process-wide, idempotent and re-applied by :func:`apply_all` if another patch
replaced it (``moto_dynamodb.dynamodb_unpatched`` restores moto's own DynamoDB methods).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

# ------------------------------------------------------------------ the limits

DYNAMODB_MAX_ITEM_BYTES = 409_600  # 400 KB; an item of exactly this size is accepted
DYNAMODB_MAX_BATCH_WRITE_REQUESTS = 25
DYNAMODB_MAX_TRANSACTION_BYTES = 4 * 1024 * 1024
DYNAMODB_MAX_NUMBER_DIGITS = 38
DYNAMODB_MAX_HASH_KEY_BYTES = 2_048  # moto checks it on PutItem only
DYNAMODB_MAX_RANGE_KEY_BYTES = 1_024
DYNAMODB_MAX_NUMBER_EXPONENT = 125  # 9.99...E+125 is the largest magnitude
DYNAMODB_MIN_NUMBER_EXPONENT = -130  # 1E-130 is the smallest non-zero magnitude

SFN_MAX_PAYLOAD_BYTES = 262_144
SFN_MAX_HISTORY_EVENTS = 25_000

LAMBDA_MAX_SYNC_REQUEST_BYTES = 6_291_456
LAMBDA_MAX_SYNC_RESPONSE_BYTES = 6_291_556
LAMBDA_MAX_ASYNC_REQUEST_BYTES = 1_048_576

SQS_MAX_BATCH_BYTES = 1_048_576
SQS_MAX_DELAY_SECONDS = 900

EVENTS_MAX_REQUEST_BYTES = 1_048_576
EVENTS_TIME_BYTES = 14

# ------------------------------------------------------------------ AWS's messages

ITEM_TOO_LARGE = "Item size has exceeded the maximum allowed size"
ITEM_TO_UPDATE_TOO_LARGE = "Item size to update has exceeded the maximum allowed size"
TRANSACTION_TOO_LARGE = (
    "Collection size of items exceeded, which can also be caused by the aggregate size of the "
    "items in the transaction exceeding the 4MB limit"
)
TOO_MANY_BATCH_WRITES = "Too many items requested for the BatchWriteItem call"
NUMBER_TOO_PRECISE = "Attempting to store more than 38 significant digits in a Number"
NUMBER_OVERFLOW = (
    "Number overflow. Attempting to store a number with magnitude larger than supported range"
)
NUMBER_UNDERFLOW = (
    "Number underflow. Attempting to store a number with magnitude smaller than supported range"
)
SFN_HISTORY_CAUSE = "The execution reached the maximum number of history events ({limit})."
LAMBDA_RESPONSE_TOO_LARGE = (
    "Response payload size exceeded maximum allowed payload size "
    f"({LAMBDA_MAX_SYNC_RESPONSE_BYTES} bytes)."
)
EVENTS_TOO_LARGE = "Total size of the entries in the request is over the limit."

_GUARD = threading.Lock()
_MARK = "__swarm_limits__"


def _marked(fn: Any) -> bool:
    return bool(getattr(fn, _MARK, False))


def _mark(fn: Callable[..., Any]) -> Callable[..., Any]:
    setattr(fn, _MARK, True)
    return fn


def _wrap(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace ``owner.name`` by ``make(current)``, unless it is already this module's wrapper."""
    current = owner.__dict__.get(name, getattr(owner, name))
    if _marked(current):
        return
    wrapper = make(current)
    functools.update_wrapper(wrapper, current)
    setattr(owner, name, _mark(wrapper))


def _utf8_len(text: str | bytes | None) -> int:
    if text is None:
        return 0
    return len(text) if isinstance(text, bytes) else len(text.encode("utf-8"))


# ================================================================== DynamoDB


def number_digits(text: str) -> tuple[tuple[int, ...], int, bool] | None:
    """``(significant digits, exponent of the last digit, negative)`` of a DynamoDB number, or
    None when it does not parse (moto rejects those itself). Leading and trailing zeros are not
    significant; zero has no digits."""
    try:
        value = Decimal(text)
    except (InvalidOperation, ValueError, TypeError):
        return None
    if not value.is_finite():
        return None
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    lead = 0
    while lead < len(digits) and digits[lead] == 0:
        lead += 1
    trail = len(digits)
    while trail > lead and digits[trail - 1] == 0:
        trail -= 1
    return tuple(digits[lead:trail]), exponent + (len(digits) - trail), bool(sign)


def number_error(text: str) -> str | None:
    """AWS's ValidationException message for a number it refuses to store, or None."""
    parsed = number_digits(text)
    if parsed is None:
        return None
    digits, exponent, _negative = parsed
    if not digits:
        return None  # zero, any exponent
    if len(digits) > DYNAMODB_MAX_NUMBER_DIGITS:
        return NUMBER_TOO_PRECISE
    magnitude = exponent + len(digits) - 1  # the exponent in scientific notation
    if magnitude > DYNAMODB_MAX_NUMBER_EXPONENT:
        return NUMBER_OVERFLOW
    if magnitude < DYNAMODB_MIN_NUMBER_EXPONENT:
        return NUMBER_UNDERFLOW
    return None


def number_size(text: str) -> int:
    """A number's bytes: its significant digits in base-100 pairs aligned on the decimal point,
    one byte of exponent, one more if negative; zero is 1 byte. (AWS documents "1 byte per two
    significant digits, plus 1 byte"; pairs aligned on the point are what it measures.)"""
    parsed = number_digits(text)
    if parsed is None:
        return len(text)
    digits, exponent, negative = parsed
    if not digits:
        return 1
    first_power = exponent + len(digits) - 1  # the power of ten of the first digit
    pairs = first_power // 2 - exponent // 2 + 1
    return 1 + pairs + int(negative)


def _binary_size(value: Any) -> int:
    if isinstance(value, bytes | bytearray):
        return len(value)
    try:
        return len(base64.b64decode(value, validate=True))
    except (binascii.Error, ValueError, TypeError):
        return _utf8_len(str(value))


def _type_and_value(attribute: Any) -> tuple[str, Any]:
    """An attribute value as ``{"S": "x"}`` (the wire) or moto's ``DynamoType``."""
    if isinstance(attribute, Mapping):
        return next(iter(attribute.items()))
    return str(attribute.type), attribute.value


def attribute_size(attribute: Any) -> int:
    """One attribute value's bytes as DynamoDB counts them toward the item size."""
    kind, value = _type_and_value(attribute)
    if kind == "S":
        return _utf8_len(value)
    if kind == "N":
        return number_size(str(value))
    if kind == "B":
        return _binary_size(value)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(_utf8_len(v) for v in value)
    if kind == "NS":
        return sum(number_size(str(v)) for v in value)
    if kind == "BS":
        return sum(_binary_size(v) for v in value)
    if kind == "L":  # 3 bytes, plus 1 per element
        return 3 + sum(1 + attribute_size(v) for v in value)
    if kind == "M":
        return 3 + sum(_utf8_len(k) + 1 + attribute_size(v) for k, v in value.items())
    return 0


def item_size(item: Mapping[str, Any]) -> int:
    """An item's bytes: every attribute's name (UTF-8) plus its value (:func:`attribute_size`)."""
    return sum(_utf8_len(name) + attribute_size(value) for name, value in item.items())


def _numbers(node: Any) -> Iterator[str]:
    """Every number (``N``, and each of ``NS``) in a request body, at any depth."""
    if isinstance(node, Mapping):
        if len(node) == 1:
            kind, value = next(iter(node.items()))
            if kind == "N" and isinstance(value, str):
                yield value
                return
            if kind == "NS" and isinstance(value, list):
                yield from (v for v in value if isinstance(v, str))
                return
        for child in node.values():
            yield from _numbers(child)
    elif isinstance(node, list):
        for child in node:
            yield from _numbers(child)


class ValidationError(Exception):
    """A validation failure inside a transaction. moto reports an exception that is not its own
    as a cancellation reason named after the exception's class: ``ValidationError``, the code
    AWS gives a transacted item that is too large."""


_DYNAMODB_ACTIONS: tuple[str, ...] = (
    "put_item",
    "update_item",
    "delete_item",
    "get_item",
    "query",
    "scan",
    "batch_get_item",
    "batch_write_item",
    "transact_write_items",
    "transact_get_items",
)

_TRANSACTION = threading.local()


def _in_transaction() -> bool:
    return bool(getattr(_TRANSACTION, "active", False))


def _check_request(action: str, body: Mapping[str, Any]) -> None:
    """Request-level limits, before moto handles the request (raises AWS's ValidationException)."""
    from moto.dynamodb.exceptions import MockValidationException

    for number in _numbers(body):
        message = number_error(number)
        if message is not None:
            raise MockValidationException(message)
    if action == "batch_write_item":
        batches = body.get("RequestItems") or {}
        for requests in batches.values():
            if len(requests) > DYNAMODB_MAX_BATCH_WRITE_REQUESTS:
                raise MockValidationException(
                    "1 validation error detected: Value at 'requestItems' failed to satisfy "
                    "constraint: Map value must satisfy constraint: [Member must have length "
                    f"less than or equal to {DYNAMODB_MAX_BATCH_WRITE_REQUESTS}, Member must "
                    "have length greater than or equal to 1]"
                )
        if sum(len(r) for r in batches.values()) > DYNAMODB_MAX_BATCH_WRITE_REQUESTS:
            raise MockValidationException(TOO_MANY_BATCH_WRITES)
        for requests in batches.values():  # every item before any is written
            for request in requests:
                item = (request.get("PutRequest") or {}).get("Item")
                if item is not None and item_size(item) > DYNAMODB_MAX_ITEM_BYTES:
                    raise MockValidationException(ITEM_TOO_LARGE)
    elif (
        action == "transact_write_items"
        and _transaction_size(body.get("TransactItems") or []) > DYNAMODB_MAX_TRANSACTION_BYTES
    ):
        raise MockValidationException(TRANSACTION_TOO_LARGE)


def _transaction_size(transact_items: list[Mapping[str, Any]]) -> int:
    """What a transaction writes, from the request: a Put's item; an Update's key and values;
    a Delete's or ConditionCheck's key."""
    total = 0
    for entry in transact_items:
        for kind, op in entry.items():
            if kind == "Put":
                total += item_size(op.get("Item") or {})
            else:
                total += item_size(op.get("Key") or {})
                if kind == "Update":
                    values = op.get("ExpressionAttributeValues") or {}
                    total += sum(attribute_size(v) for v in values.values())
    return total


def _named_keys(action: str, body: Mapping[str, Any]) -> Iterator[tuple[Any, Any]]:
    """The ``(table name, key)`` pairs a request names by key."""
    if action in ("get_item", "update_item", "delete_item"):
        yield body.get("TableName"), body.get("Key")
    elif action == "batch_get_item":
        for table, request in (body.get("RequestItems") or {}).items():
            for key in (request or {}).get("Keys") or []:
                yield table, key
    elif action in ("transact_get_items", "transact_write_items"):
        for item in body.get("TransactItems") or []:
            for op in ("Get", "Update", "Delete", "ConditionCheck"):
                if isinstance(item, Mapping) and op in item:
                    yield item[op].get("TableName"), item[op].get("Key")


def _check_keys(handler: Any, action: str, body: Mapping[str, Any]) -> None:
    """AWS refuses a key over the key size limits (partition 2,048 bytes, sort 1,024) with a
    ValidationException in every request that names one; moto checks them on PutItem only, and
    would answer "not found" to a read."""
    from moto.dynamodb.exceptions import MockValidationException

    for table_name, key in _named_keys(action, body):
        if not isinstance(key, Mapping):
            continue
        try:
            table = handler.dynamodb_backend.get_table(table_name)
        except Exception:  # moto answers a missing table itself
            continue
        limits = (
            (table.hash_key_attr, DYNAMODB_MAX_HASH_KEY_BYTES, "hashkey"),
            (table.range_key_attr, DYNAMODB_MAX_RANGE_KEY_BYTES, "rangekey"),
        )
        for attribute, limit, what in limits:
            value = key.get(attribute) if attribute else None
            if isinstance(value, Mapping) and attribute_size(value) > limit:
                raise MockValidationException(
                    f"One or more parameter values were invalid: Size of {what} has exceeded "
                    f"the maximum size limit of {limit} bytes"
                )


def _handler(action: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def handler(self: Any) -> Any:
        body = getattr(self, "body", None) or {}
        _check_request(action, body)
        _check_keys(self, action, body)
        if action != "transact_write_items":
            return original(self)
        _TRANSACTION.active = True
        try:
            return original(self)
        finally:
            _TRANSACTION.active = False

    return handler


def _table_put_item(original: Callable[..., Any]) -> Callable[..., Any]:
    def put_item(self: Any, item_attrs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if item_size(item_attrs) > DYNAMODB_MAX_ITEM_BYTES:
            from moto.dynamodb.exceptions import ItemSizeTooLarge

            if _in_transaction():
                raise ValidationError(ITEM_TOO_LARGE)
            raise ItemSizeTooLarge()
        return original(self, item_attrs, *args, **kwargs)

    return put_item


def _backend_update_item(original: Callable[..., Any]) -> Callable[..., Any]:
    def update_item(self: Any, table_name: str, key: dict[str, Any], *args: Any, **kw: Any) -> Any:
        from swarm.local.patches import dynamodb as moto_dynamodb

        with moto_dynamodb.dynamodb_lock():
            # the item as it was (None: absent), put back if the update makes it too large
            saved = moto_dynamodb._snapshot_items(
                self, [{"Update": {"TableName": table_name, "Key": key}}]
            )
            item = original(self, table_name, key, *args, **kw)
            if item is None or item_size(item.attrs) <= DYNAMODB_MAX_ITEM_BYTES:
                return item
            moto_dynamodb._restore_items(saved)
        if _in_transaction():
            raise ValidationError(ITEM_TO_UPDATE_TOO_LARGE)
        from moto.dynamodb.exceptions import ItemSizeToUpdateTooLarge

        raise ItemSizeToUpdateTooLarge()

    return update_item


def patch_dynamodb() -> None:
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.dynamo_type import LimitedSizeDict
    from moto.dynamodb.models.table import Table
    from moto.dynamodb.responses import DynamoHandler

    # moto's approximate 405,000-byte check, run on every attribute set (O(n) each): replaced by
    # item_size on the whole item
    LimitedSizeDict.__setitem__ = dict.__setitem__  # type: ignore[method-assign]
    for action in _DYNAMODB_ACTIONS:
        _wrap(DynamoHandler, action, functools.partial(_handler, action))
    _wrap(Table, "put_item", _table_put_item)
    _wrap(DynamoDBBackend, "update_item", _backend_update_item)


# ================================================================== Step Functions


def _sfn_within(value: Any) -> bool:
    """Whether a state's data fits: its JSON (compact, as Step Functions passes it) in UTF-8.
    (moto measured ``json.dumps`` with its default ", " and ": " separators and ASCII escapes.)"""
    if not isinstance(value, str):
        value = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return _utf8_len(value) <= SFN_MAX_PAYLOAD_BYTES


def _data_limit_exceeded(env: Any, cause: str) -> Exception:
    from moto.stepfunctions.parser.api import HistoryEventType, TaskFailedEventDetails
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
        FailureEvent,
        FailureEventException,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import (
        StatesErrorName,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )

    error = StatesErrorNameType.StatesStatesDataLimitExceeded
    details: Any = {  # an EventDetails (a TypedDict whose every key moto's typing requires)
        "taskFailedEventDetails": TaskFailedEventDetails(error=error.to_name(), cause=cause)
    }
    failure: Exception = FailureEventException(
        failure_event=FailureEvent(
            env=env,
            error_name=StatesErrorName(typ=error),
            event_type=HistoryEventType.TaskFailed,
            event_details=details,
        )
    )
    return failure


def _state_eval_body(original: Callable[..., Any]) -> Callable[..., Any]:
    def _eval_body(self: Any, env: Any) -> Any:
        if not _sfn_within(env.states.get_input()):
            raise _data_limit_exceeded(
                env,
                f"The state/task '{self.name}' received an input with a size exceeding the "
                "maximum number of bytes service limit.",
            )
        return original(self, env)

    return _eval_body


def _task_scheduled(original: Callable[..., Any]) -> Callable[..., Any]:
    def _before_eval_execution(
        self: Any, env: Any, resource_runtime_part: Any, raw_parameters: Any, **kwargs: Any
    ) -> Any:
        if not _sfn_within(raw_parameters):
            raise _data_limit_exceeded(
                env,
                f"The state/task '{self._get_sfn_resource_type()}' was scheduled with "
                "parameters exceeding the maximum number of bytes service limit.",
            )
        return original(self, env, resource_runtime_part, raw_parameters, **kwargs)

    return _before_eval_execution


def _start_execution(original: Callable[..., Any]) -> Callable[..., Any]:
    def start_execution(self: Any) -> Any:
        from moto.stepfunctions.exceptions import ValidationException

        if _utf8_len(self._get_param("input")) > SFN_MAX_PAYLOAD_BYTES:
            raise ValidationException(
                "1 validation error detected: Value at 'input' failed to satisfy constraint: "
                f"Member must have length less than or equal to {SFN_MAX_PAYLOAD_BYTES}"
            )
        return original(self)

    return start_execution


def _history_failure() -> Any:
    from moto.stepfunctions.parser.api import ExecutionFailedEventDetails
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )

    return ExecutionFailedEventDetails(
        error=StatesErrorNameType.StatesRuntime.to_name(),
        cause=SFN_HISTORY_CAUSE.format(limit=SFN_MAX_HISTORY_EVENTS),
    )


def _add_event(original: Callable[..., Any]) -> Callable[..., Any]:
    """An execution's history stops at 24,999 events; event 25,000 is its ExecutionFailed."""
    from moto.stepfunctions.parser.api import HistoryEventType

    closing = {
        HistoryEventType.ExecutionFailed,
        HistoryEventType.ExecutionSucceeded,
        HistoryEventType.ExecutionAborted,
        HistoryEventType.ExecutionTimedOut,
    }

    def add_event(self: Any, context: Any, event_type: Any, *args: Any, **kwargs: Any) -> Any:
        env = getattr(self, "_swarm_env", None)
        if env is None:  # a map run's child executions: their own histories
            return original(self, context, event_type, *args, **kwargs)
        with self._swarm_lock:
            next_id = self._event_id_gen._next_id
            if next_id < SFN_MAX_HISTORY_EVENTS:
                return original(self, context, event_type, *args, **kwargs)
            if env._swarm_history_failure is None:
                env._swarm_history_failure = _history_failure()
                env.set_error(env._swarm_history_failure)
            if next_id > SFN_MAX_HISTORY_EVENTS or event_type not in closing:
                return next_id - 1  # dropped: the execution has failed
            kwargs.pop("event_details", None)
            details = {"executionFailedEventDetails": env._swarm_history_failure}
            return original(self, context, HistoryEventType.ExecutionFailed, details, **kwargs)

    return add_event


def _set_error(original: Callable[..., Any]) -> Callable[..., Any]:
    def set_error(self: Any, error: Any) -> Any:
        failure = getattr(self, "_swarm_history_failure", None)
        return original(self, failure if failure is not None else error)

    return set_error


def _evaluation_environment(original: Callable[..., Any]) -> Callable[..., Any]:
    def _get_evaluation_environment(self: Any) -> Any:
        env = original(self)
        env._swarm_history_failure = None
        manager = env.event_manager
        manager._swarm_env = env
        manager._swarm_lock = threading.RLock()
        return env

    return _get_evaluation_environment


def patch_stepfunctions() -> None:
    from moto.stepfunctions.parser import quotas
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service import (  # noqa: E501
        StateTaskService,
    )
    from moto.stepfunctions.parser.asl.component.state.state import CommonStateField
    from moto.stepfunctions.parser.asl.eval.environment import Environment
    from moto.stepfunctions.parser.asl.eval.event.event_manager import EventManager
    from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker
    from moto.stepfunctions.responses import StepFunctionResponse

    # moto allows < 262,144 bytes; AWS allows 262,144. Rebound where moto imported it by name.
    original = quotas.is_within_size_quota
    if not _marked(original):

        def within(value: Any) -> bool:
            return _sfn_within(value)

        _mark(within)
        quotas.is_within_size_quota = within
        for name, module in list(sys.modules.items()):
            if name.startswith("moto.stepfunctions") and (
                getattr(module, "is_within_size_quota", None) is original
            ):
                module.is_within_size_quota = within  # type: ignore[attr-defined]

    _wrap(CommonStateField, "_eval_body", _state_eval_body)
    _wrap(StateTaskService, "_before_eval_execution", _task_scheduled)
    _wrap(StepFunctionResponse, "start_execution", _start_execution)
    _wrap(EventManager, "add_event", _add_event)
    _wrap(Environment, "set_error", _set_error)
    _wrap(ExecutionWorker, "_get_evaluation_environment", _evaluation_environment)


# ================================================================== Lambda


def _lambda_error(status: int, code: str, message: str) -> tuple[int, dict[str, str], str]:
    headers = {"x-amzn-ErrorType": code, "content-type": "application/json", "status": str(status)}
    return status, headers, json.dumps({"Type": "User", "message": message})


def _lambda_invoke(original: Callable[..., Any]) -> Callable[..., Any]:
    """moto's ``LambdaResponse.invoke`` with AWS's request and response limits (moto's own
    response check, ``sys.getsizeof(payload) > 6000000``, is replaced)."""

    def invoke(self: Any) -> tuple[int, dict[str, str], str | bytes]:
        from urllib.parse import unquote

        invocation_type = self.headers.get("X-Amz-Invocation-Type")
        if invocation_type == "Event":
            limit, operation = LAMBDA_MAX_ASYNC_REQUEST_BYTES, "InvokeAsync"
        else:
            limit, operation = LAMBDA_MAX_SYNC_REQUEST_BYTES, "InvokeFunction"
        if _utf8_len(self.body) > limit:
            return _lambda_error(
                413,
                "RequestEntityTooLargeException",
                f"Request must be smaller than {limit} bytes for the {operation} operation",
            )
        response_headers: dict[str, str] = {}
        function_name = unquote(self.path.rsplit("/", 2)[-2])
        qualifier = self._get_param("qualifier")
        payload = self.backend.invoke(
            function_name, qualifier, self.body, self.headers, response_headers
        )
        if payload is None:
            return 404, response_headers, "{}"
        synchronous = invocation_type not in ("Event", "DryRun")
        if synchronous and _utf8_len(payload) > LAMBDA_MAX_SYNC_RESPONSE_BYTES:
            response_headers["x-amz-function-error"] = "Unhandled"
            payload = json.dumps(
                {
                    "errorMessage": LAMBDA_RESPONSE_TOO_LARGE,
                    "errorType": "Function.ResponseSizeTooLarge",
                }
            ).encode()
        response_headers["content-type"] = "application/json"
        if invocation_type == "Event":
            status_code = 202
        elif invocation_type == "DryRun":
            status_code = 204
        else:
            if (
                self.headers.get("X-Amz-Log-Type") != "Tail"
                and "x-amz-log-result" in response_headers
            ):
                del response_headers["x-amz-log-result"]
            status_code = 200
        response_headers["status"] = str(status_code)
        return status_code, response_headers, payload

    return invoke


def patch_lambda() -> None:
    from moto.awslambda.responses import LambdaResponse
    from moto.utilities.aws_headers import amz_crc32

    _wrap(LambdaResponse, "invoke", lambda original: amz_crc32(_lambda_invoke(original)))


# ================================================================== SQS


def message_size(body: str | None, attributes: Mapping[str, Any] | None) -> int:
    """A message's size as SQS counts it: the body's UTF-8 bytes, plus each message
    attribute's name, data type and value."""
    size = _utf8_len(body)
    for name, attribute in (attributes or {}).items():
        size += _utf8_len(name)
        size += _utf8_len(attribute.get("DataType") or attribute.get("data_type"))
        string = attribute.get("StringValue", attribute.get("string_value"))
        binary = attribute.get("BinaryValue", attribute.get("binary_value"))
        size += _utf8_len(string) if string is not None else 0
        size += _binary_size(binary) if binary is not None else 0
    return size


def _check_message(queue: Any, body: str, attributes: Mapping[str, Any] | None) -> None:
    from moto.sqs.exceptions import InvalidParameterValue

    limit = int(queue.maximum_message_size)
    if message_size(body, attributes) > limit:
        raise InvalidParameterValue(
            "One or more parameters are invalid. Reason: Message must be shorter than "
            f"{limit} bytes."
        )


def _check_delay(delay_seconds: Any) -> None:
    from moto.sqs.exceptions import InvalidParameterValue

    if delay_seconds is not None and int(delay_seconds) < 0:
        raise InvalidParameterValue(
            f"Value {delay_seconds} for parameter DelaySeconds is invalid. Reason: "
            f"DelaySeconds must be >= 0 and <= {SQS_MAX_DELAY_SECONDS}."
        )


def _sqs_send_message(original: Callable[..., Any]) -> Callable[..., Any]:
    def send_message(self: Any, queue_name: str, message_body: str, *args: Any, **kw: Any) -> Any:
        attributes = kw.get("message_attributes", args[0] if args else None)
        _check_message(self.get_queue(queue_name), message_body, attributes)
        _check_delay(kw.get("delay_seconds", args[1] if len(args) > 1 else None))
        return original(self, queue_name, message_body, *args, **kw)

    return send_message


def _sqs_send_message_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    def send_message_batch(self: Any, queue_name: str, entries: dict[str, Any]) -> Any:
        from moto.sqs.exceptions import BatchRequestTooLong

        queue = self.get_queue(queue_name)
        total = sum(
            message_size(e.get("MessageBody"), e.get("MessageAttributes")) for e in entries.values()
        )
        if total > SQS_MAX_BATCH_BYTES:
            raise BatchRequestTooLong(total)
        for entry in entries.values():  # validate every message before sending any, as moto does
            _check_message(queue, entry.get("MessageBody"), entry.get("MessageAttributes"))
        # a bad DelaySeconds fails its entry alone: moto's send_message_batch catches the error
        # of send_message (patched above) into the response's Failed list
        return original(self, queue_name, entries)

    return send_message_batch


def patch_sqs() -> None:
    from moto.sqs.models import SQSBackend

    _wrap(SQSBackend, "send_message", _sqs_send_message)
    _wrap(SQSBackend, "send_message_batch", _sqs_send_message_batch)


# ================================================================== EventBridge


def entry_size(entry: Mapping[str, Any]) -> int:
    """A PutEvents entry's size as EventBridge computes it."""
    size = EVENTS_TIME_BYTES if entry.get("Time") is not None else 0
    size += _utf8_len(entry.get("Source")) + _utf8_len(entry.get("DetailType"))
    size += _utf8_len(entry.get("Detail"))
    size += sum(_utf8_len(r) for r in entry.get("Resources") or [] if r is not None)
    return size


def _put_events(original: Callable[..., Any]) -> Callable[..., Any]:
    def put_events(self: Any) -> Any:
        from moto.events.exceptions import ValidationException

        entries = self._get_param("Entries") or []
        if len(entries) <= 10 and sum(map(entry_size, entries)) > EVENTS_MAX_REQUEST_BYTES:
            raise ValidationException(EVENTS_TOO_LARGE)  # more than 10: moto's error
        return original(self)

    return put_events


def patch_events() -> None:
    from moto.events.responses import EventsHandler

    _wrap(EventsHandler, "put_events", _put_events)


# ================================================================== S3


def _s3_upload_part(original: Callable[..., Any]) -> Callable[..., Any]:
    def upload_part(self: Any, bucket_name: str, multipart_id: str, *args: Any, **kw: Any) -> Any:
        from moto.s3.exceptions import NoSuchUpload

        if multipart_id not in self.get_bucket(bucket_name).multiparts:
            raise NoSuchUpload(upload_id=multipart_id)
        return original(self, bucket_name, multipart_id, *args, **kw)

    return upload_part


def patch_s3() -> None:
    from moto.s3.models import S3Backend

    _wrap(S3Backend, "upload_part", _s3_upload_part)


# ================================================================== all


PATCHES: dict[str, Callable[[], None]] = {
    "dynamodb": patch_dynamodb,
    "stepfunctions": patch_stepfunctions,
    "lambda": patch_lambda,
    "s3": patch_s3,
    "sqs": patch_sqs,
    "events": patch_events,
}


def apply_all() -> None:
    """Enforce every limit above (idempotent; re-applies a patch another one replaced)."""
    with _GUARD:
        for patch in PATCHES.values():
            patch()
