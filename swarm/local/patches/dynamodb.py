"""moto's DynamoDB made atomic per item, as real DynamoDB is.

Why: moto's request lock covers request dispatch, not the DynamoDB backend. Two threads doing a
conditional ``UpdateItem`` on one item can both evaluate the condition against the old item and
both write, so a correct governor can over-grant in a test and an incorrect one can look fine
(measured: 8-16 threads decrementing an item from 300 granted 310-477). Real DynamoDB conditional
writes and transactions are atomic per item. :func:`patch_dynamodb_atomicity` wraps the backend's
item operations in ONE re-entrant lock, which makes them atomic again (300 granted, every run).

The patch also makes ``update_item`` return a *copy* of the item taken under the lock: moto
serialises ``ReturnValues=ALL_NEW`` from the live item after the backend call returns, so without
the copy a response could show a later writer's values.

And it makes ``TransactWriteItems`` cost what it writes. moto snapshots *every table* a
transaction names (a deep copy, for the rollback), so each transaction costs O(table size) and a
batch's admissions cost O(batch size squared): with a 2,000-unit batch on the local stack that copy
took ~27% of the process's CPU, growing with every unit, and the fleet crawled. Under the lock no
other writer can interleave, so the patch snapshots just the items the transaction names and
puts them back if it is cancelled (moto's own whole-table copy is a no-op while patched).
Not undone on a rollback: DynamoDB Streams records (the control plane uses no streams).

The patch is idempotent, process-wide (it patches the class, so every backend and every account
is covered) and reversible (:func:`unpatch_dynamodb_atomicity`, used by the test that proves the
patch matters).

Two more patches here change no answer, only what it costs: :func:`patch_dynamodb_expressions`
parses each expression string once, :func:`patch_dynamodb_json` writes the item operations'
responses with ``json.dumps`` instead of moto's shape-walking serializer.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# The backend methods that read or write items. Reads are included so a strongly consistent
# read (and a TransactGetItems, whose logic lives in moto's responses module) never observes a
# half-applied transaction.
DYNAMODB_LOCKED_METHODS: tuple[str, ...] = (
    "put_item",
    "update_item",
    "delete_item",
    "transact_write_items",
    "get_item",
    "query",
    "scan",
    "batch_write_item",
    "transact_get_items",
    "batch_get_item",
)

_DYNAMODB_LOCK = threading.RLock()
_ORIGINALS: dict[str, Any] = {}
_PATCH_GUARD = threading.Lock()


def dynamodb_lock() -> threading.RLock:
    """The lock every patched DynamoDB backend call holds (tests use it to inject delays)."""
    return _DYNAMODB_LOCK


def _locked(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _DYNAMODB_LOCK:
            result = original(*args, **kwargs)
            if name == "update_item":
                # responses.py serialises ALL_NEW after we return: hand it a stable snapshot
                result = copy.deepcopy(result)
            return result

    wrapper.__swarm_patched__ = True  # type: ignore[attr-defined]
    return wrapper


class _NoTableCopy:
    """What ``moto.dynamodb.models`` sees as the ``copy`` module while patched: a deep copy of a
    ``Table`` is the table itself. moto's only such copy is ``transact_write_items``'s whole-table
    rollback snapshot, which :func:`_transaction` replaces with item snapshots."""

    def __init__(self, table_type: type) -> None:
        self._table_type = table_type  # moto's Table, resolved once (deepcopy is a hot path)

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    def deepcopy(self, x: Any, memo: dict[int, Any] | None = None) -> Any:
        return x if isinstance(x, self._table_type) else copy.deepcopy(x, memo)


_Snapshot = tuple[Any, Any, Any, Any]  # (table, hash value, range value or None, item or None)


def _snapshot_items(backend: Any, transact_items: list[dict[str, Any]]) -> list[_Snapshot]:
    """Copies of the items a transaction names, as they are before it runs (None: absent).
    Entries moto will reject (unknown table, incomplete key) are skipped: they write nothing."""
    from moto.dynamodb.models.dynamo_type import DynamoType

    saved: list[_Snapshot] = []
    for entry in transact_items:
        try:
            op_type, op = next(iter(entry.items()))
            table = backend.tables.get(op.get("TableName"))
            key = op["Item"] if op_type == "Put" else op["Key"]
            hash_value = DynamoType(key[table.hash_key_attr])
            range_value = DynamoType(key[table.range_key_attr]) if table.has_range_key else None
        except (AttributeError, KeyError, StopIteration, TypeError):
            continue
        bucket = table.items.get(hash_value)
        if range_value is None:
            current = bucket
        else:
            current = bucket.get(range_value) if bucket is not None else None
        saved.append((table, hash_value, range_value, copy.deepcopy(current)))
    return saved


def _restore_items(saved: list[_Snapshot]) -> None:
    for table, hash_value, range_value, item in reversed(saved):  # the first snapshot wins
        if range_value is None:
            if item is None:
                table.items.pop(hash_value, None)
            else:
                table.items[hash_value] = item
            continue
        bucket = table.items[hash_value]
        if item is None:
            bucket.pop(range_value, None)
            if not bucket:
                del table.items[hash_value]
        else:
            bucket[range_value] = item


def _transaction(original: Callable[..., Any]) -> Callable[..., Any]:
    """``transact_write_items`` under the lock, rolled back item by item when cancelled."""

    @functools.wraps(original)
    def wrapper(self: Any, transact_items: list[dict[str, Any]]) -> Any:
        with _DYNAMODB_LOCK:
            saved = _snapshot_items(self, transact_items)
            try:
                return original(self, transact_items)
            except BaseException:
                _restore_items(saved)
                raise

    wrapper.__swarm_patched__ = True  # type: ignore[attr-defined]
    return wrapper


def _responses_locked(original: Callable[..., Any]) -> Callable[..., Any]:
    """A whole request under the lock: moto's responses module reads live items outside the
    backend's methods. UpdateItem deep-copies the item it is about to update (for
    ``ReturnValues``) after the backend's ``get_item`` returned it; GetItem, Query and Scan
    serialise the items the backend returned; PutItem reads the old item for ``ALL_OLD``;
    TransactGetItems and BatchGetItem read the tables directly. Outside the lock another
    thread's write could tear the item mid-copy (seen: "dictionary changed size during
    iteration" in a 16-thread throttle storm on UpdateItem)."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _DYNAMODB_LOCK:
            return original(*args, **kwargs)

    wrapper.__swarm_patched__ = True  # type: ignore[attr-defined]
    return wrapper


_RESPONSE_METHODS: tuple[str, ...] = (
    "get_item",
    "put_item",
    "update_item",
    "delete_item",
    "query",
    "scan",
    "transact_get_items",
    "batch_get_item",
    "batch_write_item",
)


def patch_dynamodb_atomicity() -> None:
    """Serialise moto's DynamoDB item operations with one RLock (idempotent)."""
    import moto.dynamodb.models as models
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.responses import DynamoHandler

    with _PATCH_GUARD:
        if _ORIGINALS:
            return
        for name in DYNAMODB_LOCKED_METHODS:
            original = getattr(DynamoDBBackend, name)
            _ORIGINALS[f"backend.{name}"] = original
            if name == "transact_write_items":
                setattr(DynamoDBBackend, name, _transaction(original))
            else:
                setattr(DynamoDBBackend, name, _locked(name, original))
        _ORIGINALS["module.copy"] = models.copy  # type: ignore[attr-defined]
        models.copy = _NoTableCopy(models.Table)  # type: ignore[attr-defined,assignment]
        for name in _RESPONSE_METHODS:
            original = getattr(DynamoHandler, name)
            _ORIGINALS[f"responses.{name}"] = original
            setattr(DynamoHandler, name, _responses_locked(original))


def unpatch_dynamodb_atomicity() -> None:
    """Restore moto's original (racy) methods; for the test that shows the patch matters."""
    import moto.dynamodb.models as models
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.responses import DynamoHandler

    with _PATCH_GUARD:
        for key, original in _ORIGINALS.items():
            kind, name = key.split(".", 1)
            owner = {"backend": DynamoDBBackend, "responses": DynamoHandler, "module": models}[kind]
            setattr(owner, name, original)
        _ORIGINALS.clear()


def dynamodb_patched() -> bool:
    return bool(_ORIGINALS)


@contextmanager
def dynamodb_unpatched() -> Iterator[None]:
    """Temporarily run moto without the patch (restores the previous state afterwards)."""
    was = dynamodb_patched()
    unpatch_dynamodb_atomicity()
    try:
        yield
    finally:
        if was:
            patch_dynamodb_atomicity()


#: distinct expression strings kept parsed (the control plane writes with a few dozen)
EXPRESSION_CACHE_SIZE = 4096


def patch_dynamodb_expressions() -> None:
    """Parse each DynamoDB expression string once (idempotent, process-wide).

    moto parses an ``UpdateExpression`` twice per request (``responses.py`` checks the names it
    uses, then the backend parses it again) and lexes a ``ConditionExpression`` with a dozen
    regular expressions, on every write. The control plane's writes use a few dozen expression
    strings over and over: under a 10,000-unit batch that parsing and lexing took about a fifth
    of the local stack's busy time (py-spy, 2026-12-07). The parse of an update expression
    depends on its string alone and moto never changes the tree it returns (its validator works
    on a deep copy), so the tree is cached by string; a condition expression's tokens depend on
    its string alone, so they are cached and fresh nodes built from them each time (moto's later
    passes build on them). An expression moto rejects raises as before, each time (errors are
    not cached)."""
    from moto.dynamodb.comparisons import ConditionExpressionParser
    from moto.dynamodb.parsing import expressions

    # a module moto marks `# type: ignore` as a whole: mypy sees none of its names
    UpdateExpressionParser: Any = expressions.UpdateExpressionParser  # type: ignore[attr-defined]
    with _PATCH_GUARD:
        if getattr(UpdateExpressionParser.make, "__swarm_patched__", False):
            return
        parse = functools.lru_cache(maxsize=EXPRESSION_CACHE_SIZE)(UpdateExpressionParser.make)

        def make(cls: type, expression_str: str) -> Any:
            return parse(expression_str)

        make.__swarm_patched__ = True  # type: ignore[attr-defined]
        UpdateExpressionParser.make = classmethod(make)

        lex_uncached = ConditionExpressionParser._lex_condition_expression

        @functools.lru_cache(maxsize=EXPRESSION_CACHE_SIZE)
        def tokens(expression: str) -> tuple[tuple[str, str], ...]:
            nodes = lex_uncached(ConditionExpressionParser(expression, None, None))
            return tuple((node.nonterminal, node.text) for node in nodes)

        def lex(parser: Any) -> Any:
            literal = parser.Kind.LITERAL
            return deque(
                parser.Node(nonterminal=kind, kind=literal, text=text, value=text, children=[])
                for kind, text in tokens(parser.condition_expression)
            )

        ConditionExpressionParser._lex_condition_expression = lex  # type: ignore[method-assign,assignment]


#: the item operations whose results moto builds as DynamoDB JSON already (attribute-value maps,
#: counts, keys, consumed capacity): their responses can be written with ``json.dumps``
ITEM_OPERATIONS = frozenset(
    {
        "GetItem",
        "PutItem",
        "UpdateItem",
        "DeleteItem",
        "Query",
        "Scan",
        "BatchGetItem",
        "BatchWriteItem",
        "TransactGetItems",
        "TransactWriteItems",
    }
)

#: set SWARM_VERIFY_DYNAMODB_JSON=1 to serialise every item response both ways and fail on any
#: difference (how the fast path was checked against moto's serializer on the whole suite)
VERIFY_JSON = os.environ.get("SWARM_VERIFY_DYNAMODB_JSON") == "1"


class SerializerMismatch(AssertionError):
    """The fast path's body differs from moto's serializer's (SWARM_VERIFY_DYNAMODB_JSON=1)."""


def _blob(value: Any) -> str:
    if isinstance(value, bytes | bytearray):  # a B or BS value: base64 on the wire
        return base64.b64encode(value).decode()
    raise TypeError(f"not DynamoDB JSON: {type(value).__name__}")


def patch_dynamodb_json() -> None:
    """Write item operations' responses with ``json.dumps`` (idempotent, process-wide).

    moto serialises every response by walking the operation's output shape, looking each member
    up under several spellings: for a ``Query`` or ``BatchGetItem`` that walk visits every
    attribute of every item, and it took 43% of the ledger's integration tests' time and 8% of
    the local stack's under a 10,000-unit batch (py-spy, 2026-12-07). The results of the item
    operations are DynamoDB JSON already, so they are dumped as they are, as the serializer
    writes them: only the output shape's members, ``None`` left out, binary values base64.
    Errors, and every other operation, go through moto's serializer."""
    from moto.core.utils import get_service_model
    from moto.dynamodb.responses import DynamoHandler

    with _PATCH_GUARD:
        if getattr(DynamoHandler.serialized, "__swarm_patched__", False):
            return
        original = DynamoHandler.serialized
        # operation: (status, headers, the output shape's members)
        shapes: dict[str, tuple[int, dict[str, str], frozenset[str]]] = {}

        def serialized(self: Any, action_result: Any) -> Any:
            operation = self._get_action()
            result = action_result.result
            if operation not in ITEM_OPERATIONS or isinstance(result, BaseException):
                return original(self, action_result)
            if operation not in shapes or VERIFY_JSON:
                status, headers, body = original(self, action_result)
                output = get_service_model("dynamodb").operation_model(operation).output_shape
                members = frozenset(output.members)
                shapes[operation] = (status, {"Content-Type": headers["Content-Type"]}, members)
                if not VERIFY_JSON:
                    return status, headers, body
                expected = json.loads(body)
            status, base_headers, members = shapes[operation]
            fast = json.dumps(
                {k: v for k, v in result.items() if v is not None and k in members}, default=_blob
            )
            if VERIFY_JSON and json.loads(fast) != expected:
                raise SerializerMismatch(f"{operation}: {fast} != moto's {json.dumps(expected)}")
            headers = dict(base_headers)
            headers.update(self.response_headers)
            return status, headers, fast

        serialized.__swarm_patched__ = True  # type: ignore[attr-defined]
        DynamoHandler.serialized = serialized  # type: ignore[method-assign]
