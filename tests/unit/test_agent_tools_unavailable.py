"""A unit naming tools that cannot be looked up now (an MCP server that cannot list its tools,
docs/agents.md "MCP tools") goes back to its lane before its claim: no attempt claimed, no model
called; once the server answers, the loops run to their end with exact books. A server that stays
down longer than ``tools_wait_s`` fails the unit, named so, instead of cycling it forever."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from swarm.core.agent import Tool
from swarm.core.ports import ToolsUnavailable
from swarm.core.records import RunState, UnitState
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
        # and its copy carries since when it waits (its first delivery's time)
        assert report.outcome.tools_down_since == p.clock.t
        back = replace(item, tools_down_since=report.outcome.tools_down_since)
        p.queue.send(back, report.outcome.delay_s)
    # and nothing was started or called: no log event, no model call
    assert all(log == [] for log in ap.logs(run_id).values()) and len(ap.logs(run_id)) == 3
    assert p.model.of_run(run_id).calls == 0
    # When the server answers again, the loops run to their end
    tools.down = False
    ap.pump()
    run = p.ledger.run(run_id)
    assert run.state is RunState.COMPLETED and run.completed == 3
    assert_books_exact(ap, run_id)


def test_a_unit_whose_tools_stay_unlisted_past_the_wait_fails_named_so_and_uncalled() -> None:
    tools = DownTools()
    ap = AgentPlane(tools=tools)
    p = ap.plane
    wait_s = p.worker.config.tools_wait_s
    run_id = ap.submit(agent_units(2, turns=3))
    # Given the server is down from the units' first delivery on, and stays down
    tools.down = True
    started = p.clock.t
    # When the units cycle through their lane (the pump carries each copy's tools_down_since)
    outcomes = ap.pump()
    # Then each waited about tools_wait_s, then failed (not retried), its transcript saying why
    assert wait_s <= p.clock.t - started <= wait_s + 2 * p.worker.config.retry_backoff_s + 1
    assert outcomes["tools unavailable"] >= 2 * int(wait_s / p.worker.config.retry_backoff_s)
    run = p.ledger.run(run_id)
    assert run.state is RunState.COMPLETED and run.dead_lettered == 2, run
    for unit_id, log in ap.logs(run_id).items():
        assert p.ledger.unit(run_id, unit_id).state is UnitState.DEAD_LETTERED
        [stopped] = [e for e in log if e["type"] == "stopped"]
        assert stopped["reason"] == "failed", stopped
        assert "its tools could not be listed for" in stopped["detail"]
        assert "the MCP server 'm' could not list its tools" in stopped["detail"]
    # and nothing was billed or called
    assert p.model.of_run(run_id).calls == 0 and run.spent == 0 and run.reserved == 0
