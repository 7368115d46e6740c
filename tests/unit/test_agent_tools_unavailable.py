"""A unit naming tools that cannot be looked up now (an MCP server that cannot list its tools,
docs/agents.md "MCP tools") goes back to its lane before its claim: no attempt claimed, no model
called; once the server answers, the loops run to their end with exact books."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from swarm.core.agent import Tool
from swarm.core.ports import ToolsUnavailable
from swarm.core.records import RunState
from swarm.service.worker import Requeue
from tests.unit.test_agent_worker import AgentPlane, Tools, agent_units, assert_books_exact


class _Unlisted(Mapping[str, Tool]):
    """The specs while the server is down: a lookup raises, as McpServers.find does."""

    def __getitem__(self, name: str) -> Tool:
        raise ToolsUnavailable("the MCP server 'm' could not list its tools (ConnectError)")

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


@dataclass
class DownTools(Tools):
    down: bool = False

    def specs(self) -> Mapping[str, Tool]:
        return _Unlisted() if self.down else super().specs()


def test_a_unit_whose_tools_cannot_be_listed_waits_in_its_lane_unclaimed_and_uncalled() -> None:
    tools = DownTools()
    ap = AgentPlane(tools=tools)
    p = ap.plane
    run_id = ap.submit(agent_units(3, turns=3))
    # Given the server is down when the units are delivered
    tools.down = True
    for _ in range(3):
        item = p.queue.receive()
        assert item is not None
        report = p.worker.process(item)
        # Then each goes back to its lane after the retry backoff, naming why
        assert isinstance(report.outcome, Requeue), report.outcome
        assert report.outcome.reason.startswith("tools unavailable: the MCP server 'm'")
        assert report.outcome.delay_s > 0
        p.queue.send(item, report.outcome.delay_s)
    # and nothing was started or called: no log event, no model call
    assert all(log == [] for log in ap.logs(run_id).values()) and len(ap.logs(run_id)) == 3
    assert p.model.of_run(run_id).calls == 0
    # When the server answers again, the loops run to their end
    tools.down = False
    ap.pump()
    run = p.ledger.run(run_id)
    assert run.state is RunState.COMPLETED and run.completed == 3
    assert_books_exact(ap, run_id)
