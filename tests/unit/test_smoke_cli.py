"""`swarm smoke`: deploy, a batch checked end to end, drain, redeploy, drain off, destroy; one
line a step; the first failure ends the steps with exit 1 and the stack is destroyed unless
--keep. A fake control plane and the fake CDK runner of the deploy tests (no AWS account here):
`swarm smoke --local` itself runs in `make test` (scripts/test-suite)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import pytest

from swarm.api.models import BatchStatus, Drain, TokenBook, UnitCounts
from swarm.cli import smoke as smoke_cmd
from swarm.cli.deploy import CdkDeployer, DeployFailed
from swarm.cli.smoke import AwsSmokeStack, Smoke
from swarm.client import ApiError, Target
from swarm.core.errors import InvalidInput, SwarmError
from swarm.core.records import Lane, RunState
from tests.unit.helpers import run_cli

TARGET = Target("https://api.example/smoke", "eu-west-1", "/swarm/smoke/drain")


@dataclass
class FakePlane:
    """The control plane: batches complete at once; records every call in ``log``."""

    log: list[str]
    draining: bool = False
    #: what to get wrong: "accept-while-draining", "overspend", "no-answer", "no-results-file"
    fault: str = ""
    off_refusals: int = 1  # submits refused with 503 after drain off (the caches settling)
    batches: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> Any:
        self.log.append(f"submit {len(body['units'])}")
        if self.draining and self.fault != "accept-while-draining":
            raise ApiError(503, "draining", "the control plane is draining", 5)
        if not self.draining and self.off_refusals and len(self.batches) == 1:
            self.off_refusals -= 1
            raise ApiError(503, "draining", "the control plane is draining", 5)
        batch = f"b-{len(self.batches)}"
        self.batches[batch] = [
            {
                "unit_id": u["unit_id"],
                "state": "completed",
                "attempts": 1,
                "tokens": u["projected_tokens"],
                "output": "" if self.fault == "no-answer" else f"answer to {u['unit_id']}",
            }
            for u in body["units"]
        ]
        return {
            "batch_id": batch,
            "units": len(body["units"]),
            "lane": "normal",
            "tokens": {"budget": 6_000_000},
        }

    def status(self, batch_id: str) -> Any:
        self.log.append(f"status {batch_id}")
        units = self.batches[batch_id]
        spent = sum(u["tokens"] for u in units) + (1000 if self.fault == "overspend" else 0)
        # the API's own models: a fake that drifts from them fails here, not on a real stack
        return BatchStatus(
            batch_id=batch_id,
            tenant="smoke",
            lane=Lane.NORMAL,
            state=RunState.COMPLETED,
            units=len(units),
            counts=UnitCounts(
                completed=len(units),
                dead_lettered=0,
                remainder=0,
                running=0,
                queued=0,
                pending=0,
            ),
            attempts=len(units),
            retries=0,
            tokens=TokenBook(
                budget=6_000_000, spent=spent, reserved=0, available=6_000_000 - spent
            ),
            elapsed_s=1.0,
            healthy_line="",
        ).model_dump(mode="json", exclude_none=True)

    def results(
        self, batch_id: str, *, state: str | None, limit: int, next_token: str | None
    ) -> Any:
        self.log.append(f"results {batch_id}")
        page: dict[str, Any] = {"units": [dict(u) for u in self.batches[batch_id][:limit]]}
        if self.fault != "no-results-file":
            page["download"] = {"location": f"s3://results/{batch_id}.jsonl"}
        return page

    def fetch(self, url: str) -> bytes:
        raise AssertionError("no answer is linked here")

    def set_drain(self, on: bool) -> None:
        self.log.append(f"drain {'on' if on else 'off'}")
        self.draining = on

    def drain_status(self) -> Any:
        self.log.append("drain status")
        return Drain(
            draining=self.draining, settled=True, running=0, queued=0, safe_to_deploy=True
        ).model_dump(mode="json")


@dataclass
class FakeRedeployer:
    log: list[str]
    fail: BaseException | None = None

    def describe(self) -> str:
        return "redeploy the fake stack"

    def diff(self, out: TextIO) -> None:
        raise AssertionError("a smoke never diffs")

    def deploy(self, out: TextIO) -> None:
        self.log.append("redeploy")
        if self.fail is not None:
            raise self.fail


@dataclass
class FakeStack:
    log: list[str]
    plane: FakePlane
    deploy_fails: bool = False
    redeploy_fails: bool = False
    name: str = "Swarm-smoke"

    def deploy(self, out: TextIO) -> str:
        self.log.append("deploy")
        if self.deploy_fails:
            raise DeployFailed("`npx cdk deploy Swarm-smoke` exited with status 1")
        return "Swarm-smoke in 300s"

    def tenant(self) -> Any:
        return self.plane

    def operator(self) -> Any:
        return self.plane

    def redeployer(self) -> Any:
        fail = DeployFailed("synth failed") if self.redeploy_fails else None
        return FakeRedeployer(self.log, fail)

    def destroy(self, out: TextIO) -> str:
        self.log.append("destroy")
        return "Swarm-smoke deleted in 200s"

    def keep_hint(self) -> str:
        return "npx cdk destroy Swarm-smoke -c stage=smoke --force"


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def run_smoke(
    keep: bool = False, fault: str = "", watcher: Any = None, **stack: Any
) -> tuple[int, list[str], list[str]]:
    """(exit status, the calls in order, the printed lines)."""
    log: list[str] = []
    clock = FakeClock()
    out = io.StringIO()
    smoke = Smoke(
        FakeStack(log, FakePlane(log, fault=fault), **stack),
        units=3,
        keep=keep,
        timeout_s=60,
        interval_s=1,
        out=out,
        log=io.StringIO(),
        clock=clock.now,
        sleep=clock.sleep,
    )
    if watcher is not None:
        smoke.watcher = watcher
    return smoke.run(), log, out.getvalue().splitlines()


def test_every_step_runs_in_order_and_the_stack_is_destroyed_at_the_end() -> None:
    code, log, lines = run_smoke()
    assert code == 0
    assert log == [
        "deploy",
        "submit 3",
        "status b-0",
        "results b-0",
        "results b-0",  # the results file's location
        "drain on",
        "drain status",
        "submit 1",  # refused: draining
        "redeploy",
        "drain off",
        "submit 2",  # refused once while the switch settles, then accepted
        "submit 2",
        "status b-1",
        "destroy",
    ]
    steps = [line.split(":", 1)[0] for line in lines[:-1]]
    assert steps == [
        "ok deploy",
        "ok submit",
        "ok batch",
        "ok results",
        "ok books",
        "ok drain",
        "ok redeploy",
        "ok drain off",
        "ok destroy",
    ]
    text = "\n".join(lines)
    assert "batch b-0: 3 units on the normal lane" in text
    assert "completed in 0s: 3 completed, 0 dead-lettered, 0 not run; 3 attempts" in text
    assert "3 units, 3 answers; results file s3://results/b-0.jsonl" in text
    assert "0 reserved" in text and "a new batch refused with 503" in text
    assert "2 of 2 units completed (1 refusals while the switch settled)" in text
    assert lines[-1].startswith("smoke passed: Swarm-smoke, 9 steps")


def test_keep_leaves_the_stack_and_says_how_to_delete_it() -> None:
    code, log, lines = run_smoke(keep=True)
    assert code == 0 and "destroy" not in log
    assert "ok keep: Swarm-smoke kept: `npx cdk destroy Swarm-smoke -c stage=smoke --force`" in (
        lines
    )


@pytest.mark.parametrize(
    ("fault", "step", "seen"),
    [
        ("overspend", "books", "the spend is not the units' tokens"),
        ("no-answer", "results", "completed units without an answer: unit-00000"),
        ("accept-while-draining", "drain", "batch b-1 was accepted while draining"),
    ],
)
def test_the_first_failure_stops_the_steps_exits_1_and_still_destroys(
    fault: str, step: str, seen: str
) -> None:
    code, log, lines = run_smoke(fault=fault)
    assert code == 1
    failed = [line for line in lines if line.startswith("FAILED")]
    assert len(failed) == 1 and failed[0].startswith(f"FAILED {step}: ") and seen in failed[0]
    # nothing after the failed step ran, except the destroy
    assert "redeploy" not in log
    assert log[-1] == "destroy" and lines[-2].startswith("ok destroy")
    assert lines[-1].startswith(f"smoke FAILED at {step}")


def test_a_failed_deploy_runs_nothing_else_but_the_destroy() -> None:
    code, log, lines = run_smoke(deploy_fails=True)
    assert (code, log) == (1, ["deploy", "destroy"])
    assert lines[0] == "FAILED deploy: `npx cdk deploy Swarm-smoke` exited with status 1"


def test_a_failed_deploy_with_keep_destroys_nothing() -> None:
    code, log, lines = run_smoke(keep=True, deploy_fails=True)
    assert (code, log) == (1, ["deploy"])
    assert any(line.startswith("ok keep: Swarm-smoke kept") for line in lines)


def test_a_failed_redeploy_leaves_drain_on_and_destroys() -> None:
    code, log, lines = run_smoke(redeploy_fails=True)
    assert code == 1
    assert log[-3:] == ["submit 1", "redeploy", "destroy"]  # no drain off
    assert "FAILED redeploy: synth failed" in lines


def test_a_batch_that_never_closes_fails_its_step_naming_the_timeout() -> None:
    def never(client: Any, batch: str, interval_s: float, timeout_s: float, out: Any) -> Any:
        raise InvalidInput("--watch", f"batch {batch} still running after {timeout_s}s")

    code, log, lines = run_smoke(watcher=never)
    assert code == 1 and log[-1] == "destroy"
    assert "FAILED batch: batch b-0 still running after 60s (--timeout)" in lines


def test_a_results_file_never_written_fails_after_the_timeout() -> None:
    code, _, lines = run_smoke(fault="no-results-file")
    assert code == 1
    assert "FAILED results: no results file for batch b-0 after 60s" in lines


# ------------------------------------------------------------------ --stage, with cdk faked


@dataclass
class Recorder:
    """The CDK CLI (as in tests/unit/test_deploy_cli.py): records the commands it is given."""

    calls: list[list[str]] = field(default_factory=list)

    def __call__(self, command: Sequence[str], env: Mapping[str, str], cwd: Path) -> int:
        self.calls.append(list(command))
        return 0


def test_a_stage_is_deployed_redeployed_and_destroyed_with_cdk_as_two_roles(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the CDK CLI faked, a deployed stack's outputs, and clients that record whose
    # profile they sign with
    cdk = Recorder()
    log: list[str] = []
    plane = FakePlane(log)
    profiles: list[str | None] = []

    def client(target: Target, timeout_s: float = 30.0) -> FakePlane:
        assert target.api_url == TARGET.api_url
        profiles.append(target.profile)
        return plane

    real_stack_for = smoke_cmd.stack_for

    def stack_for(args: Any) -> AwsSmokeStack:
        stack = real_stack_for(args, exists=lambda stack, region: False)
        assert isinstance(stack, AwsSmokeStack)
        stack.deployer.run = cdk
        stack.read_stack = lambda stack, region: TARGET
        stack.empty_buckets = empty
        return stack

    def empty(stack: str, region: str | None) -> int:
        cdk.calls.append(["empty the buckets of", stack, str(region)])
        return 7

    monkeypatch.setattr(smoke_cmd, "Client", client)
    monkeypatch.setattr(smoke_cmd, "stack_for", stack_for)
    monkeypatch.setattr(smoke_cmd.time, "sleep", lambda s: None)
    # When the smoke runs on a stage
    argv = ["smoke", "--stage", "smoke", "--units", "2", "--region", "eu-west-1"]
    argv += ["--tenant-profile", "t", "--operator-profile", "o", "--require-approval", "never"]
    code, out, _ = run_cli(argv, capsys)
    # Then cdk deploys it, deploys it again after the drain, and destroys it
    assert code == 0, out
    stage = ["Swarm-smoke", "-c", "stage=smoke"]
    assert cdk.calls == [
        ["npx", "cdk", "deploy", *stage, "--require-approval", "never"],
        ["npx", "cdk", "deploy", *stage, "--require-approval", "never"],
        ["empty the buckets of", "Swarm-smoke", "eu-west-1"],  # CloudFormation cannot otherwise
        ["npx", "cdk", "destroy", *stage, "--force"],
    ]
    # the tenant submits, the operator drains, each with its own profile
    assert profiles == ["t", "o"]
    assert out.splitlines()[0].startswith("ok deploy: Swarm-smoke in ")
    assert "ok destroy: Swarm-smoke deleted in 0s (7 objects deleted from its buckets first)" in out


def test_a_destroy_refused_for_a_late_object_empties_the_buckets_again_and_retries_once() -> None:
    calls: list[str] = []
    statuses = iter([1, 0])

    def cdk(command: Sequence[str], env: Mapping[str, str], cwd: Path) -> int:
        calls.append(command[2])
        return next(statuses)

    def empty(stack: str, region: str | None) -> int:
        calls.append("empty")
        return 1

    stack = AwsSmokeStack(CdkDeployer("smoke", run=cdk), empty_buckets=empty)
    assert "(2 objects deleted" in stack.destroy(io.StringIO())
    assert calls == ["empty", "destroy", "empty", "destroy"]


def _args(*argv: str) -> Any:
    from swarm.cli import build_parser

    return build_parser().parse_args(["smoke", *argv])


def test_a_stage_that_exists_is_refused_unless_kept() -> None:
    asked: list[tuple[str, str | None]] = []

    def exists(stack: str, region: str | None) -> bool:
        asked.append((stack, region))
        return True

    with pytest.raises(SwarmError, match="Swarm-dev exists already: a smoke destroys"):
        smoke_cmd.stack_for(_args("--stage", "dev"), exists=exists)
    assert asked == [("Swarm-dev", None)]
    kept = smoke_cmd.stack_for(_args("--stage", "dev", "--keep"), exists=exists)
    assert kept.name == "Swarm-dev"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stage", "prod"], "'prod' is a production stage"),
        (["--local", "--tenant-profile", "t"], "--tenant-profile, --operator-profile"),
        (["--stage", "Bad_Name"], "is not a stage name"),
        (["--local", "--units", "0"], "--units"),
        (["--local", "--stage", "x"], "not allowed with argument"),
    ],
)
def test_bad_options_are_one_line_errors_and_change_nothing(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["smoke", *argv], capsys)
    assert code == 2
    assert message in err
