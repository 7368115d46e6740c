"""The finalize loop's wait for its run's closure (:class:`swarm.core.ports.Closures`) on AWS.

The loop's ``Poll`` task (statemachines/fanout.asl.json) waits for a task token: the finalizer
keeps it beside the run's books, in the ledger's table (``run#<run>`` / ``closer``; tokens run to
~1 KB, and on the books every settlement would pay for it), and the worker or dead-letter handler
whose write closes the run reads it and hands it back with ``SendTaskSuccess``. A token whose
task is over (it timed out: the loop sweeps, then keeps a fresh one) is answered ``TaskTimedOut``
or ``InvalidToken``: nobody was waiting, and the next poll finds the run closed.
"""

from __future__ import annotations

import json
from typing import Any

from swarm.adapters.client_errors import client_error_type, error_code
from swarm.adapters.dynamodb import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE, call
from swarm.adapters.dynamodb_items import key, real, string, whole

#: the item's sort key, beside the run's ``books`` and ``spec``
CLOSER = "closer"
#: a kept token is never needed past a day (a task waits FinalizerMaxPollSeconds, <= 900 s)
TOKEN_TTL_S = 86_400
#: Step Functions' answers for a token whose task is no longer waiting
ENDED = frozenset({"TaskTimedOut", "InvalidToken", "TaskDoesNotExist"})
#: what the woken task answers (the loop then writes the closure: ``Close``)
WOKEN = json.dumps({"woken": True})


class StepFunctionsClosures:
    """Tokens in the ledger's table; the wake is Step Functions' ``SendTaskSuccess``."""

    def __init__(self, table_name: str, dynamodb: Any, stepfunctions: Any) -> None:
        self.table_name = table_name
        self.dynamodb = dynamodb
        self.stepfunctions = stepfunctions

    def wait(self, run_id: str, token: str, now: float) -> None:
        call(
            self.dynamodb,
            "update_item",
            TableName=self.table_name,
            Key=key(run_id, CLOSER),
            UpdateExpression="SET #token = :token, #at = :at, #expires = :expires",
            ExpressionAttributeNames={
                "#token": "token",
                "#at": "at",
                "#expires": TTL_ATTRIBUTE,
            },
            ExpressionAttributeValues={
                ":token": string(token),
                ":at": real(now),
                ":expires": whole(int(now) + TOKEN_TTL_S),
            },
        )

    def notify(self, run_id: str) -> bool:
        item = self._kept(key(run_id, CLOSER))
        if item is None:
            return False
        try:
            self.stepfunctions.send_task_success(taskToken=item["token"]["S"], output=WOKEN)
        except client_error_type() as e:
            if error_code(e) in ENDED:
                return False
            raise
        return True

    def _kept(self, wanted: dict[str, Any]) -> dict[str, Any] | None:
        """The token's item, strongly consistent (the token kept just before the run closed);
        a ``BatchGetItem``, as every read of the roles that close runs."""
        pending: dict[str, Any] = {self.table_name: {"Keys": [wanted], "ConsistentRead": True}}
        for _ in range(5):  # a key left unprocessed (throttled) is asked for again
            answer = call(self.dynamodb, "batch_get_item", RequestItems=pending)
            for item in answer.get("Responses", {}).get(self.table_name, []):
                if (item[PARTITION_KEY], item[SORT_KEY]) == (
                    wanted[PARTITION_KEY],
                    wanted[SORT_KEY],
                ):
                    return dict(item)
            pending = answer.get("UnprocessedKeys") or {}
            if not pending:
                return None
        raise RuntimeError(f"the closure token of {wanted[PARTITION_KEY]['S']} stayed unread")
