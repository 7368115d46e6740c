"""The runs the sweeper watches: a sparse global secondary index (``OpenRuns``) on the ledger's
books items.

A run is watched from the moment its books are ready until its closure has been announced. The
watch attributes, who writes them, and why the index costs the hot writes nothing:
docs/explanation/ledger.md ("The sweeper's watch").
"""

from __future__ import annotations

import random
from typing import Any

from swarm.adapters.client_errors import client_error_type, error_code
from swarm.adapters.dynamodb import (
    CONDITIONAL_CHECK_FAILED,
    PARTITION_KEY,
    SORT_KEY,
    call,
    default_client,
)
from swarm.contract import EXECUTION, OPEN_RUNS_INDEX, OPEN_TENANT, REPAIRS, SWEEP_AT, WATCH
from swarm.core.ports import WatchedRun
from swarm.core.records import RunState

#: the value of ``watch`` on every watched run (one partition: opens and closes are rare writes)
WATCHED = "run"

#: a run opened (or reopened) just now is not looked at before this long: its execution is
#: being started by the same request
DEFAULT_WATCH_GRACE_S = 300.0


def watch_values(sweep_at: float, tenant: str) -> dict[str, dict[str, str]]:
    """The attribute values that make a books item watched (the ledger's own writes use them):
    also its tenant's, which puts the run in the ``TenantRuns`` index for as long."""
    return {
        ":watch": {"S": WATCHED},
        ":sweep_at": {"N": repr(float(sweep_at))},
        ":open_tenant": {"S": tenant},
    }


#: the SET clause matching :func:`watch_values` (names ``#watch`` / ``#sweep_at`` /
#: ``#open_tenant``)
WATCH_SET = "#watch = :watch, #sweep_at = :sweep_at, #open_tenant = :open_tenant"
WATCH_NAMES = {"#watch": WATCH, "#sweep_at": SWEEP_AT, "#open_tenant": OPEN_TENANT}


def _watched(run_id: str, item: dict[str, Any]) -> WatchedRun:
    """A watched run from its books item (or its entry in the index)."""
    return WatchedRun(
        run_id=run_id,
        sweep_at=float(item[SWEEP_AT]["N"]),
        execution=item[EXECUTION]["S"] if EXECUTION in item else None,
        repairs=int(item[REPAIRS]["N"]) if REPAIRS in item else 0,
    )


class DynamoDBRunWatch:
    """The :class:`swarm.core.ports.RunWatch` port on the ledger table."""

    def __init__(
        self,
        table_name: str,
        *,
        client: Any = None,
        index_name: str = OPEN_RUNS_INDEX,
        rng: random.Random | None = None,
    ) -> None:
        self.table_name = table_name
        self.index_name = index_name
        self._client = client
        self._rng = rng or random.Random()

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = default_client()
        return self._client

    @staticmethod
    def _key(run_id: str) -> dict[str, Any]:
        return {PARTITION_KEY: {"S": f"run#{run_id}"}, SORT_KEY: {"S": "books"}}

    def _update(self, run_id: str, **kwargs: Any) -> bool:
        """A conditional UpdateItem of the books; False if its condition failed."""
        try:
            call(
                self.client,
                "update_item",
                self._rng,
                TableName=self.table_name,
                Key=self._key(run_id),
                **kwargs,
            )
        except client_error_type() as e:
            if error_code(e) == CONDITIONAL_CHECK_FAILED:
                return False
            raise
        return True

    def due(self, now: float, limit: int) -> list[WatchedRun]:
        """Up to ``limit`` watched runs whose ``sweep_at`` has passed, most overdue first: one
        Query of the index per page (eventually consistent: the caller re-reads the books)."""
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "IndexName": self.index_name,
            "KeyConditionExpression": "#watch = :watch AND #sweep_at <= :now",
            "ExpressionAttributeNames": {"#watch": WATCH, "#sweep_at": SWEEP_AT},
            "ExpressionAttributeValues": {
                ":watch": {"S": WATCHED},
                ":now": {"N": repr(float(now))},
            },
            "ScanIndexForward": True,
        }
        found: list[WatchedRun] = []
        while len(found) < limit:
            page = call(self.client, "query", self._rng, Limit=limit - len(found), **kwargs)
            for item in page.get("Items", []):
                found.append(_watched(item[PARTITION_KEY]["S"].split("#", 1)[1], item))
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return found[:limit]

    def get(self, run_id: str) -> WatchedRun | None:
        """The run's watch entry from its books (strongly consistent); None if not watched."""
        names = {"#w": WATCH, "#s": SWEEP_AT, "#e": EXECUTION, "#r": REPAIRS}
        request = {
            self.table_name: {
                "Keys": [self._key(run_id)],
                "ConsistentRead": True,
                "ProjectionExpression": "#w, #s, #e, #r",
                "ExpressionAttributeNames": names,
            }
        }
        items: list[dict[str, Any]] = []
        while request:
            page = call(self.client, "batch_get_item", self._rng, RequestItems=request)
            items += page.get("Responses", {}).get(self.table_name, [])
            request = page.get("UnprocessedKeys") or {}
        if not items or WATCH not in items[0] or SWEEP_AT not in items[0]:
            return None
        return _watched(run_id, items[0])

    def record(self, run_id: str, execution: str) -> bool:
        """``execution`` reached the finalize loop of the run (its first poll); False if the
        run is not watched (its closure was announced already)."""
        return self._update(
            run_id,
            UpdateExpression="SET #execution = :execution",
            ConditionExpression="attribute_exists(#watch)",
            ExpressionAttributeNames={"#watch": WATCH, "#execution": EXECUTION},
            ExpressionAttributeValues={":execution": {"S": execution}},
        )

    def check(
        self,
        run_id: str,
        sweep_at: float,
        *,
        repairs: int | None = None,
        forget_execution: bool = False,
    ) -> bool:
        """The sweeper looked at the run: look again at ``sweep_at``; with ``repairs``, it
        restarted the run's execution; ``forget_execution``: that restart runs the map first,
        so no execution of the run has reached the finalize loop since."""
        names = {"#watch": WATCH, "#sweep_at": SWEEP_AT}
        values: dict[str, Any] = {":sweep_at": {"N": repr(float(sweep_at))}}
        expression = "SET #sweep_at = :sweep_at"
        if repairs is not None:
            names["#repairs"] = REPAIRS
            values[":repairs"] = {"N": str(int(repairs))}
            expression += ", #repairs = :repairs"
        if forget_execution:
            names["#execution"] = EXECUTION
            expression += " REMOVE #execution"
        return self._update(
            run_id,
            UpdateExpression=expression,
            ConditionExpression="attribute_exists(#watch)",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )

    def release(self, run_id: str, state: RunState, epoch: int) -> bool:
        """Stop watching: the run's closure as ``state`` in exhaustion epoch ``epoch`` has been
        announced. Conditional on the run still being in that closure, so a top-up that
        reopened it meanwhile keeps it watched; False if the condition failed."""
        return self._update(
            run_id,
            UpdateExpression="REMOVE #watch, #sweep_at, #execution, #repairs, #open_tenant",
            ConditionExpression=(
                "attribute_exists(#watch) AND #state = :state AND #exhaustions = :epoch"
            ),
            ExpressionAttributeNames={
                "#watch": WATCH,
                "#sweep_at": SWEEP_AT,
                "#execution": EXECUTION,
                "#repairs": REPAIRS,
                "#open_tenant": OPEN_TENANT,
                "#state": "state",
                "#exhaustions": "exhaustions",
            },
            ExpressionAttributeValues={
                ":state": {"S": state.value},
                ":epoch": {"N": str(int(epoch))},
            },
        )
