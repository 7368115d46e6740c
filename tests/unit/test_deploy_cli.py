"""`swarm deploy`: drain on, wait, deploy, drain off; every failure leaves drain on and says what
to do next; --dry-run never touches the switch. A fake control plane and a fake deployer."""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import pytest

from swarm.cli import deploy as deploy_cmd
from swarm.cli.deploy import (
    CdkDeployer,
    DeployFailed,
    Deployment,
    LocalDeployer,
    Where,
)
from swarm.cli.ops import wait_for_drain
from swarm.client import ApiError, Target
from swarm.core.errors import InvalidInput, SwarmError
from tests.unit.helpers import run_cli

WHERE = Where(
    name="Swarm-prod",
    drain_parameter="/swarm/prod/drain",
    drain_off="swarm drain off --stack Swarm-prod",
    drain_status="swarm drain status --stack Swarm-prod",
    again="swarm deploy --stage prod",
    stack_status="aws cloudformation describe-stacks --stack-name Swarm-prod",
)


def status(running: int, draining: bool = True, queued: int = 5) -> dict[str, Any]:
    return {
        "draining": draining,
        "running": running,
        "queued": queued,
        "safe_to_deploy": draining and running == 0,
    }


@dataclass
class FakeApi:
    """The control plane: records every call in ``log`` (shared with the deployer)."""

    log: list[str]
    after_drain_on: list[dict[str, Any]]  # what GET /drain answers once drain is on
    draining: bool = False
    fail_drain: set[bool] = field(default_factory=set)  # set_drain(on) raises for these values
    _answers: Iterator[dict[str, Any]] | None = None

    def set_drain(self, on: bool) -> None:
        self.log.append(f"drain {'on' if on else 'off'}")
        if on in self.fail_drain:
            raise SwarmError("cannot set the drain switch /swarm/prod/drain: AccessDenied")
        self.draining = on

    def drain_status(self) -> Any:
        self.log.append("status")
        if not self.draining:
            return status(3, draining=False)
        if self._answers is None:
            self._answers = iter(self.after_drain_on)
        return next(self._answers, self.after_drain_on[-1])


@dataclass
class FakeDeployer:
    log: list[str]
    fail: BaseException | None = None

    def describe(self) -> str:
        return "npx cdk deploy Swarm-prod -c stage=prod --require-approval broadening"

    def diff(self, out: TextIO) -> None:
        self.log.append("diff")
        print("Stack Swarm-prod: 1 change", file=out)

    def deploy(self, out: TextIO) -> None:
        self.log.append("deploy")
        if self.fail is not None:
            raise self.fail


class FakeClock:
    def __init__(self, interrupt_after: int | None = None) -> None:
        self.t = 0.0
        self.sleeps = 0
        self.interrupt_after = interrupt_after

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        if self.interrupt_after is not None and self.sleeps > self.interrupt_after:
            raise KeyboardInterrupt
        self.t += seconds


def deployment(
    after_drain_on: list[dict[str, Any]],
    fail: BaseException | None = None,
    clock: FakeClock | None = None,
    **api: Any,
) -> tuple[Deployment, list[str], io.StringIO, io.StringIO]:
    log: list[str] = []
    out, err = io.StringIO(), io.StringIO()
    clock = clock or FakeClock()
    d = Deployment(
        FakeApi(log, after_drain_on, **api),
        FakeDeployer(log, fail),
        WHERE,
        timeout_s=10,
        interval_s=2,
        out=out,
        err=err,
        clock=clock.now,
        sleep=clock.sleep,
    )
    return d, log, out, err


def test_success_drains_waits_deploys_then_undrains_in_that_order() -> None:
    # Given a stack with work in flight that settles after two checks
    d, log, out, err = deployment([status(2), status(1), status(0)])

    # When the operator deploys
    code = d.run()

    # Then: drain on, wait (with progress) until nothing is in flight, deploy, drain off
    assert code == 0, err.getvalue()
    assert log == ["status", "drain on", "status", "status", "status", "deploy", "drain off"]
    text = out.getvalue()
    assert "[1/4] drain on: /swarm/prod/drain" in text
    assert "[2/4] waiting: 2 running, 5 queued\n[2/4] waiting: 1 running, 5 queued\n" in text
    assert "[3/4] deploying: npx cdk deploy Swarm-prod" in text
    assert "[4/4] drain off" in text and "deployed Swarm-prod in 4s; drain off" in text
    assert err.getvalue() == ""


def _assert_left_drained(log: list[str], err: str, reason: str) -> None:
    assert "drain off" not in log
    assert f"swarm deploy: {reason}" in err
    assert "drain is ON: new batches get 503" in err
    assert "`swarm drain off --stack Swarm-prod`" in err  # how to resume work without deploying


def test_a_wait_that_times_out_deploys_nothing_and_leaves_drain_on() -> None:
    d, log, _, err = deployment([status(2)])
    assert d.run() == 1
    assert "deploy" not in log
    _assert_left_drained(log, err.getvalue(), "still 2 running after 10s; nothing was deployed")
    assert "`swarm drain status --stack Swarm-prod`" in err.getvalue()
    assert "run `swarm deploy --stage prod` again" in err.getvalue()


def test_a_failed_deploy_leaves_drain_on_with_what_to_do_next() -> None:
    failure = DeployFailed("`npx cdk deploy Swarm-prod` exited with status 1")
    d, log, _, err = deployment([status(0)], fail=failure)
    assert d.run() == 1
    assert log[-1] == "deploy"
    _assert_left_drained(log, err.getvalue(), f"the deploy failed: {failure}")
    assert "then run `swarm deploy --stage prod` again" in err.getvalue()
    assert "on the version deployed now" in err.getvalue()


def test_ctrl_c_while_waiting_deploys_nothing_and_leaves_drain_on() -> None:
    d, log, _, err = deployment([status(4)], clock=FakeClock(interrupt_after=1))
    assert d.run() == 130
    assert "deploy" not in log
    _assert_left_drained(log, err.getvalue(), "interrupted while waiting; nothing was deployed")


def test_ctrl_c_during_the_deploy_says_the_stack_may_still_be_updating() -> None:
    d, log, _, err = deployment([status(0)], fail=KeyboardInterrupt())
    assert d.run() == 130
    _assert_left_drained(log, err.getvalue(), "interrupted during the deploy")
    assert "`aws cloudformation describe-stacks --stack-name Swarm-prod`" in err.getvalue()


def test_a_failed_drain_off_after_the_deploy_says_so() -> None:
    d, log, _, err = deployment([status(0)], fail_drain={False})
    assert d.run() == 1
    assert log[-2:] == ["deploy", "drain off"]
    assert "deployed Swarm-prod, but turning drain off failed" in err.getvalue()
    assert "`swarm drain off --stack Swarm-prod`" in err.getvalue()


def test_a_switch_that_cannot_be_turned_on_changes_nothing() -> None:
    d, log, _, _ = deployment([status(0)], fail_drain={True})
    with pytest.raises(SwarmError, match="could not turn drain on, so nothing was deployed"):
        d.run()
    assert "deploy" not in log


def test_a_dry_run_shows_the_plan_and_the_diff_and_never_touches_the_switch() -> None:
    d, log, out, _ = deployment([status(0)])
    assert d.run(dry_run=True) == 0
    assert log == ["status", "diff"]
    text = out.getvalue()
    assert "swarm deploy: Swarm-prod (dry run)" in text
    assert "now: drain off, 3 running, 5 queued" in text
    assert "3. deploy: npx cdk deploy Swarm-prod" in text
    assert "Stack Swarm-prod: 1 change" in text and "nothing was changed" in text


def test_the_wait_survives_a_few_failed_checks() -> None:
    answers: list[Any] = [SwarmError("no answer"), status(1), SwarmError("no answer"), status(0)]

    class Flaky:
        def drain_status(self) -> Any:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    clock, out = FakeClock(), io.StringIO()
    safe, doc = wait_for_drain(
        Flaky(), 60, 1, out, tolerate_errors=1, clock=clock.now, sleep=clock.sleep
    )
    assert safe and doc["running"] == 0
    assert out.getvalue().count("check failed (no answer); trying again") == 2


# ------------------------------------------------------------------ the deployers


@dataclass
class Recorder:
    status: int = 0
    calls: list[tuple[list[str], dict[str, str], Path]] = field(default_factory=list)

    def __call__(self, command: Sequence[str], env: Mapping[str, str], cwd: Path) -> int:
        self.calls.append((list(command), dict(env), cwd))
        return self.status


def test_cdk_deployer_runs_the_readmes_command_for_the_stage() -> None:
    run = Recorder()
    cdk = CdkDeployer("prod", ("account_concurrency_limit=10",), "never", "eu-west-1", run=run)
    out = io.StringIO()
    cdk.diff(out)
    cdk.deploy(out)
    (diff, env, cwd), (deploy, _, _) = run.calls
    context = ["-c", "stage=prod", "-c", "account_concurrency_limit=10"]
    assert diff == ["npx", "cdk", "diff", "Swarm-prod", *context]
    assert deploy == ["npx", "cdk", "deploy", "Swarm-prod", *context, "--require-approval", "never"]
    assert (cwd / "cdk.json").is_file()
    assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert env["CDK_DISABLE_VERSION_CHECK"] == "1"
    assert "$ npx cdk deploy Swarm-prod -c stage=prod" in out.getvalue()


def test_a_cdk_failure_is_deploy_failed_naming_the_command_and_status() -> None:
    cdk = CdkDeployer("dev", run=Recorder(status=1))
    with pytest.raises(DeployFailed, match=r"`npx cdk deploy Swarm-dev .*` exited with status 1"):
        cdk.deploy(io.StringIO())


@dataclass
class FakeLocalApi:
    answer: ApiError | None = None
    requests: list[tuple[str, str]] = field(default_factory=list)

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        self.requests.append((method, path))
        if self.answer is not None:
            raise self.answer
        return 200, {"message": "redeployed Swarm-local"}


def test_the_local_deployer_posts_to_the_local_stacks_redeploy_route() -> None:
    api, out = FakeLocalApi(), io.StringIO()
    LocalDeployer(api).deploy(out)
    assert api.requests == [("POST", "/_local/redeploy")]
    assert "redeployed Swarm-local" in out.getvalue()


def test_a_local_stack_without_the_route_says_it_cannot_redeploy_yet() -> None:
    missing = FakeLocalApi(ApiError(404, "not_found", "no local route", None))
    with pytest.raises(DeployFailed, match="does not support redeploy yet") as error:
        LocalDeployer(missing).deploy(io.StringIO())
    assert "swarm local down && swarm local up" in str(error.value)
    broken = FakeLocalApi(ApiError(500, "internal", "synth failed", None))
    with pytest.raises(DeployFailed, match="redeploy failed: 500 internal: synth failed"):
        LocalDeployer(broken).deploy(io.StringIO())


# ------------------------------------------------------------------ the command line


def test_the_command_wires_the_plan_and_passes_the_exit_status(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[str] = []
    api = FakeApi(log, [status(0)])
    seen: list[Any] = []

    def plan_for(args: Any) -> Any:
        seen.append(args)
        return api, FakeDeployer(log, DeployFailed("boom")), WHERE

    monkeypatch.setattr(deploy_cmd, "plan_for", plan_for)
    code, out, err = run_cli(["deploy", "--stage", "prod", "--timeout", "60"], capsys)
    assert code == 1 and "the deploy failed: boom" in err and "[3/4] deploying" in out
    assert seen[0].stage == "prod" and seen[0].timeout == 60 and not seen[0].dry_run
    assert log == ["status", "drain on", "status", "deploy"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["deploy"], "one of the arguments --stage --local is required"),
        (["deploy", "--stage", "prod", "--local"], "not allowed with argument"),
        (["deploy", "--stage", "Prod!"], "is not a stage name"),
        (["deploy", "--stage", "prod", "-c", "stage=dev"], "the stage is --stage"),
        (["deploy", "--stage", "prod", "-c", "quota"], "give KEY=VALUE"),
        (["deploy", "--stage", "prod", "--timeout", "0"], "--timeout: 0 is out of range"),
        (["deploy", "--stage", "prod", "--require-approval", "maybe"], "invalid choice"),
    ],
)
def test_bad_options_are_one_line_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(args, capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_help_explains_the_procedure(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["deploy", "--help"], capsys)
    assert code == 0
    for text in (
        "drain on, wait until nothing is running (queued units stay\nqueued), deploy, drain off",
        "--dry-run",
    ):
        assert text in out
    assert "make deploy STAGE=prod" in out


def _args(*argv: str) -> Any:
    from swarm.cli import build_parser

    return build_parser().parse_args(["deploy", *argv])


def test_a_stage_is_drained_through_its_stacks_outputs_and_deployed_with_cdk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def from_stack(stack: str, region: str | None = None) -> Target:
        assert (stack, region) == ("Swarm-prod", "eu-west-1")
        return Target("https://api.example/prod", "eu-west-1", "/swarm/prod/drain")

    monkeypatch.setattr(Target, "from_stack", staticmethod(from_stack))
    args = _args("--stage", "prod", "--region", "eu-west-1", "-c", "quota_tpm=400000")
    _, deployer, where = deploy_cmd.plan_for(args)
    assert isinstance(deployer, CdkDeployer)
    assert deployer.command("deploy") == [
        *("npx", "cdk", "deploy", "Swarm-prod", "-c", "stage=prod", "-c", "quota_tpm=400000"),
        *("--require-approval", "broadening"),
    ]
    assert deployer.region == "eu-west-1"
    assert where.drain_off == "swarm drain off --stack Swarm-prod --region eu-west-1"
    assert where.again == "swarm deploy --stage prod --region eu-west-1 -c quota_tpm=400000"


def test_a_stage_without_a_stack_explains_the_first_deploy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def from_stack(stack: str, region: str | None = None) -> Target:
        raise InvalidInput("--stack", f"cannot read stack {stack!r}: does not exist")

    monkeypatch.setattr(Target, "from_stack", staticmethod(from_stack))
    with pytest.raises(InvalidInput, match=r"npx cdk deploy -c stage=new"):
        deploy_cmd.plan_for(_args("--stage", "new"))


def test_local_redeploys_the_saved_local_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Target("http://127.0.0.1:9", "us-east-1", "/swarm/local/drain", "http://127.0.0.1:8").save()
    api, deployer, where = deploy_cmd.plan_for(_args("--local", "--tenant", "ops"))
    assert isinstance(deployer, LocalDeployer)
    assert where.name == "the local stack" and where.drain_off == "swarm drain off"
    assert api.target.tenant == "ops"  # type: ignore[attr-defined]
    with pytest.raises(InvalidInput, match="for a stage in an AWS account"):
        deploy_cmd.plan_for(_args("--local", "-c", "quota_tpm=1"))
