"""BFCL's units with their backends' journal in DynamoDB (the embedded, patched moto server):
the at-most-once oracle holds with workers killed at every point of a turn and stale duplicates,
and of two processes appending the same position, exactly one wins."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from swarm.adapters.tool_journals import DynamoDBJournals
from swarm.adapters.tool_notes import create_notes_table
from swarm.core.agent_driver import KillPoint, MemoryLogStore, MemoryTurnBooks
from swarm.core.clock import VirtualClock
from swarm.core.errors import Contended
from swarm.local.server import EmbeddedServer
from swarm.workloads import bfcl
from tests.integration.conftest import server_client

POINTS = list(KillPoint)


@pytest.fixture
def journals(moto_server: EmbeddedServer, request: pytest.FixtureRequest) -> DynamoDBJournals:
    client = server_client(moto_server.endpoint, pool=20)
    name = "j-" + "".join(c if c.isalnum() else "-" for c in request.node.name)[:200]
    create_notes_table(client, name)  # the same key schema (pk, sk)
    return DynamoDBJournals(name, client)


def test_bfcl_units_keep_their_state_in_a_dynamodb_journal_through_kills(
    journals: DynamoDBJournals,
) -> None:
    store, books = MemoryLogStore(), MemoryTurnBooks()
    runs = []
    for index, entry in enumerate(bfcl.entries(limit=12)):
        left = {(POINTS[index % 5], 1 + index % 3), (POINTS[(index + 2) % 5], 2 + index % 4)}

        def kill(point: KillPoint, turn: int, left: set[Any] = left) -> bool:
            if (point, turn) in left:
                left.discard((point, turn))
                return True
            return False

        runs.append(bfcl.run_in_memory(entry, "b1", store, books, journals, VirtualClock(), kill))  # type: ignore[arg-type]
    assert [r.verdict for r in runs] == [{"valid": True}] * 12
    assert sum(r.kills for r in runs) >= 12
    assert sum(r.tool_repeats for r in runs) >= 1  # calls answered from the journal by key


def test_of_two_appends_at_one_position_exactly_one_wins(journals: DynamoDBJournals) -> None:
    journals.append(
        "u1", 0, {"key": "b/u1/t0", "name": "ls", "input": {}, "status": "success", "value": "a"}
    )
    start = threading.Barrier(6)
    won: list[int] = []
    refused: list[int] = []

    def append(i: int) -> None:
        start.wait()
        try:
            journals.append(
                "u1",
                1,
                {"key": f"b/u1/t{i}", "name": "cd", "input": {}, "status": "success", "value": i},
            )
            won.append(i)
        except Contended:
            refused.append(i)

    threads = [threading.Thread(target=append, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 5
    journal = journals.read("u1")
    assert [e["value"] for e in journal] == ["a", won[0]]
    with pytest.raises(Contended):
        journals.append("u1", 1, {"key": "late"})
    assert journals.read("u2") == []
