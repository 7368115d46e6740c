"""``swarm smoke``: a stack of its own, end to end, one line a step.

The steps: deploy; submit a small batch (on the simulated model plane, cdk.json's default
``model.adapter``); wait until it closes; check its results (every unit has its outcome, every
completed one its answer, the results file written) and its books (the tokens spent are the
units' tokens, nothing reserved, within the budget); drain (the switch on, nothing in flight, a
new batch refused with 503); redeploy; drain off (a new batch accepted and completed); destroy,
unless ``--keep``. The first failure ends the steps with exit status 1 (the stack is still
destroyed, unless ``--keep``); each step prints ``ok`` or ``FAILED`` with what it saw.

Nothing here is new machinery: the deploys are :mod:`swarm.cli.deploy`'s deployers
(:class:`~swarm.cli.deploy.CdkDeployer`, :class:`~swarm.cli.deploy.LocalDeployer`), the local
stack is :func:`swarm.cli.local.up` / :func:`~swarm.cli.local.down`, the drain wait is
:func:`swarm.cli.ops.wait_for_drain`, the batch's progress :func:`swarm.cli.ops.watch` and its
results :func:`swarm.cli.results.units`, all through :class:`swarm.client.Client`.

``--stage NAME`` deploys ``Swarm-NAME`` to the AWS account of your credentials (``npx cdk
deploy``, then ``npx cdk destroy --force``); it refuses a production stage and a stack that
exists already (unless ``--keep``: nothing is destroyed then). ``--local`` uses the local stack
of ``--state-dir`` if one runs there, or starts one.
"""

from __future__ import annotations

import argparse
import io
import json
import shlex
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TextIO, cast

from swarm.cli.argtypes import float_in, int_in, positive_int
from swarm.cli.deploy import (
    APPROVALS,
    LOCAL_REDEPLOY_TIMEOUT_S,
    REPO_ROOT,
    CdkDeployer,
    Deployer,
    DeployFailed,
    LocalDeployer,
    _context_value,
    _stage,
)
from swarm.cli.ops import TERMINAL, _interval, generated_units, wait_for_drain, watch
from swarm.client import LOCAL_TARGET_FILE, ApiError, Client, Target, aws_failure, one_line
from swarm.core.errors import InvalidInput, SwarmError
from swarm.local.deploy import LocalOptions

DEFAULT_STATE_DIR = LOCAL_TARGET_FILE.parent / "smoke"
#: the batch: small, Lab-6.1-like units (a few seconds of the local stack at x10)
DEFAULT_UNITS = 20
MIN_TOKENS, MAX_TOKENS = 8_000, 16_000


class StepFailed(SwarmError):
    """A step saw something wrong; the message is what it saw."""


class SmokeApi(Protocol):
    """What the smoke needs of the control plane (:class:`swarm.client.Client`)."""

    def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> Any: ...

    def status(self, batch_id: str) -> Any: ...

    def results(
        self, batch_id: str, *, state: str | None, limit: int, next_token: str | None
    ) -> Any: ...

    def fetch(self, url: str) -> bytes: ...

    def set_drain(self, on: bool) -> None: ...

    def drain_status(self) -> Any: ...


class SmokeStack(Protocol):
    """Where the smoke runs: how to deploy it, talk to it, redeploy and destroy it."""

    @property
    def name(self) -> str:
        """How messages name it: ``Swarm-smoke``, ``the local stack``."""
        ...

    def deploy(self, out: TextIO) -> str:
        """Deploy (or attach); what was done, for the step's line. Raises SwarmError."""
        ...

    def tenant(self) -> SmokeApi:
        """The client a tenant submits and reads with."""
        ...

    def operator(self) -> SmokeApi:
        """The client an operator drains with (``GET /drain``, the switch)."""
        ...

    def redeployer(self) -> Deployer: ...

    def destroy(self, out: TextIO) -> str:
        """Delete the stack; what was done. Raises SwarmError."""
        ...

    def keep_hint(self) -> str:
        """How to delete the stack later (after ``--keep``)."""
        ...


# ------------------------------------------------------------------ the stacks


@dataclass
class LocalSmokeStack:
    """The local stack of ``state_dir``: attached to if it runs, started otherwise."""

    state_dir: Path
    options: LocalOptions = field(default_factory=LocalOptions)
    name: str = "the local stack"
    _target: Target | None = None

    def deploy(self, out: TextIO) -> str:
        from swarm.cli.local import running_pid, up

        pid = running_pid(self.state_dir)
        if pid is not None:
            self._target = Target.load(self.state_dir / LOCAL_TARGET_FILE.name)
            return f"attached to the local stack in {self.state_dir} (pid {pid})"
        started = time.monotonic()
        self._target = up(self.options, self.state_dir, quiet=True)
        return (
            f"local stack up in {time.monotonic() - started:.0f}s in {self.state_dir} "
            f"(x{self.options.time_scale:g})"
        )

    @property
    def target(self) -> Target:
        if self._target is None:
            raise SwarmError("the local stack is not up")
        return self._target

    def tenant(self) -> SmokeApi:
        return Client(self.target)

    def operator(self) -> SmokeApi:
        return Client(self.target)  # locally: operator routes are signed as the operator

    def redeployer(self) -> Deployer:
        return LocalDeployer(Client(self.target, timeout_s=LOCAL_REDEPLOY_TIMEOUT_S))

    def destroy(self, out: TextIO) -> str:
        from swarm.cli.local import down

        stopped = down(self.state_dir, quiet=True)
        return "local stack stopped" if stopped else "no local stack was running"

    def keep_hint(self) -> str:
        return f"swarm local down --state-dir {shlex.quote(str(self.state_dir))}"


StackReader = Callable[[str, str | None], Target]


def _stack_exists(stack: str, region: str | None) -> bool:
    import boto3
    from botocore.exceptions import ClientError

    try:
        boto3.client("cloudformation", region_name=region).describe_stacks(StackName=stack)
    except ClientError as e:
        if "does not exist" in str(e):
            return False
        raise SwarmError(f"cannot read stack {stack!r}: {aws_failure(e)}") from None
    except Exception as e:
        raise SwarmError(f"cannot read stack {stack!r}: {aws_failure(e) or e}") from None
    return True


def _empty_buckets(stack: str, region: str | None) -> int:
    """Delete every object (and version) of the stack's buckets: CloudFormation cannot delete a
    bucket that holds objects, and a non-production stage's buckets are deleted with it (the
    batch bucket holds the smoke's manifests and results, the access-log bucket its logs).
    Returns how many objects were deleted."""
    import boto3

    try:
        cfn = boto3.client("cloudformation", region_name=region)
        s3 = boto3.resource("s3", region_name=region)
        deleted = 0
        for page in cfn.get_paginator("list_stack_resources").paginate(StackName=stack):
            for resource in page["StackResourceSummaries"]:
                if resource["ResourceType"] != "AWS::S3::Bucket":
                    continue
                if resource["ResourceStatus"] == "DELETE_COMPLETE":
                    continue
                for answer in s3.Bucket(resource["PhysicalResourceId"]).object_versions.delete():
                    deleted += len(answer.get("Deleted", []))
    except Exception as e:
        raise SwarmError(f"cannot empty the buckets of {stack}: {aws_failure(e) or e}") from None
    return deleted


@dataclass
class AwsSmokeStack:
    """Stack ``Swarm-<stage>`` in the account of your credentials, deployed with ``npx cdk``."""

    deployer: CdkDeployer
    tenant_profile: str | None = None
    operator_profile: str | None = None
    read_stack: StackReader = Target.from_stack
    empty_buckets: Callable[[str, str | None], int] = _empty_buckets
    _target: Target | None = None

    @property
    def name(self) -> str:
        return self.deployer.stack

    def deploy(self, out: TextIO) -> str:
        started = time.monotonic()
        self.deployer.deploy(out)
        self._target = self.read_stack(self.name, self.deployer.region)
        return f"{self.name} in {time.monotonic() - started:.0f}s: {self.deployer.describe()}"

    @property
    def target(self) -> Target:
        if self._target is None:
            raise SwarmError(f"{self.name} is not deployed")
        return self._target

    def tenant(self) -> SmokeApi:
        return Client(replace(self.target, profile=self.tenant_profile))

    def operator(self) -> SmokeApi:
        return Client(replace(self.target, profile=self.operator_profile))

    def redeployer(self) -> Deployer:
        return self.deployer

    def destroy(self, out: TextIO) -> str:
        """Empty the buckets, then ``cdk destroy``; once more if it failed (S3 delivers access
        logs minutes late: one may land in the emptied log bucket before it is deleted)."""
        started = time.monotonic()
        emptied = self.empty_buckets(self.name, self.deployer.region)
        try:
            self.deployer.destroy(out)
        except DeployFailed:
            emptied += self.empty_buckets(self.name, self.deployer.region)
            self.deployer.destroy(out)
        return (
            f"{self.name} deleted in {time.monotonic() - started:.0f}s ({emptied} objects "
            "deleted from its buckets first)"
        )

    def keep_hint(self) -> str:
        return shlex.join(self.deployer.command("destroy"))


# ------------------------------------------------------------------ the steps


@dataclass
class Smoke:
    stack: SmokeStack
    units: int = DEFAULT_UNITS
    seed: int = 0
    keep: bool = False
    timeout_s: float = 900.0
    interval_s: float = 1.0
    out: TextIO = field(default_factory=lambda: sys.stdout)
    #: the deployers' own output (cdk's, the local redeploy's message)
    log: TextIO = field(default_factory=lambda: sys.stderr)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    watcher: Callable[..., Any] = watch
    seen: list[tuple[str, bool, str]] = field(default_factory=list)

    def run(self) -> int:
        """0: every step ok; 1: a step failed (the rest were skipped; the stack is destroyed
        all the same, unless ``keep``); 130: interrupted."""
        started = self.clock()
        failed = None
        try:
            for name, step in self._steps():
                if not self._step(name, step):
                    failed = name
                    break
        except KeyboardInterrupt:
            self._say(f"interrupted; {self.stack.name} is kept: `{self.stack.keep_hint()}`")
            return 130
        code = 0 if failed is None else 1
        if self.keep:
            self._line("keep", True, f"{self.stack.name} kept: `{self.stack.keep_hint()}`")
        elif not self._step("destroy", lambda: self.stack.destroy(self.log)):
            code = 1
            self._say(f"delete it yourself: `{self.stack.keep_hint()}`")
        elapsed = self.clock() - started
        if code == 0:
            self._say(f"smoke passed: {self.stack.name}, {len(self.seen)} steps in {elapsed:.0f}s")
        else:
            self._say(f"smoke FAILED at {failed or 'destroy'} after {elapsed:.0f}s")
        return code

    def _steps(self) -> Iterator[tuple[str, Callable[[], str]]]:
        yield "deploy", lambda: self.stack.deploy(self.log)
        tenant = self.stack.tenant()
        batch: dict[str, Any] = {}
        yield "submit", lambda: self._submit(tenant, batch)
        yield "batch", lambda: self._batch(tenant, batch)
        yield "results", lambda: self._results(tenant, batch)
        yield "books", lambda: self._books(batch)
        operator = self.stack.operator()
        yield "drain", lambda: self._drain(operator, tenant)
        deployer = self.stack.redeployer()
        yield "redeploy", lambda: self._redeploy(deployer)
        yield "drain off", lambda: self._drain_off(operator, tenant)

    # -- one step: ok or FAILED, one line
    def _step(self, name: str, step: Callable[[], str]) -> bool:
        try:
            self._line(name, True, step())
            return True
        except SwarmError as e:
            self._line(name, False, one_line(str(e), 1000))
            return False
        except Exception as e:  # an answer of an unexpected shape, an AWS SDK error...
            text = aws_failure(e) or f"{type(e).__name__}: {e}"
            self._line(name, False, one_line(text, 1000))
            return False

    def _line(self, name: str, ok: bool, text: str) -> None:
        self.seen.append((name, ok, text))
        self._say(f"{'ok' if ok else 'FAILED'} {name}: {text}")

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    # -- the steps
    def _submit(self, tenant: SmokeApi, batch: dict[str, Any]) -> str:
        units = generated_units(self.units, self.seed, MIN_TOKENS, MAX_TOKENS)
        doc = tenant.submit({"units": units}, f"smoke-{uuid.uuid4()}")
        batch.update(id=str(doc["batch_id"]), units=units, submitted=self.clock())
        if doc["units"] != self.units:
            raise StepFailed(f"batch {doc['batch_id']} has {doc['units']} units, not {self.units}")
        return (
            f"batch {doc['batch_id']}: {doc['units']} units on the {doc['lane']} lane, "
            f"budget {doc['tokens']['budget']:,} tokens"
        )

    def _watch(self, tenant: SmokeApi, batch_id: str) -> Any:
        """The batch's status once it is terminal (progress is not printed)."""
        try:
            return self.watcher(
                cast(Client, tenant), batch_id, self.interval_s, self.timeout_s, out=io.StringIO()
            )
        except InvalidInput as e:  # watch's own timeout names its --watch
            raise StepFailed(f"{e.message} (--timeout)") from None

    def _batch(self, tenant: SmokeApi, batch: dict[str, Any]) -> str:
        final = self._watch(tenant, batch["id"])
        batch["final"] = final
        counts = final["counts"]
        took = self.clock() - batch["submitted"]
        figures = (
            f"{final['state']} in {took:.0f}s: {counts['completed']} completed, "
            f"{counts['dead_lettered']} dead-lettered, {counts['remainder']} not run; "
            f"{final['attempts']} attempts ({final['retries']} retries)"
        )
        settled = counts["completed"] + counts["dead_lettered"]
        if final["state"] != "completed" or settled != self.units or counts["remainder"]:
            raise StepFailed(f"batch {batch['id']} {figures}; every unit should have settled")
        if counts["completed"] == 0:
            raise StepFailed(f"batch {batch['id']} {figures}; no unit completed")
        return figures

    def _results(self, tenant: SmokeApi, batch: dict[str, Any]) -> str:
        from swarm.cli.results import units as result_units

        seen = list(result_units(cast(Client, tenant), batch["id"], None))
        batch["results"] = seen
        ids = sorted(u["unit_id"] for u in seen)
        expected = sorted(u["unit_id"] for u in batch["units"])
        if ids != expected:
            missing = sorted(set(expected) - set(ids))[:5]
            raise StepFailed(
                f"{len(ids)} results for {len(expected)} units (missing e.g. {missing})"
            )
        unanswered = [
            u["unit_id"] for u in seen if u["state"] == "completed" and not u.get("output")
        ]
        if unanswered:
            raise StepFailed(f"completed units without an answer: {', '.join(unanswered[:5])}")
        unexplained = [
            u["unit_id"] for u in seen if u["state"] != "completed" and not u.get("error")
        ]
        if unexplained:
            raise StepFailed(f"failed units without an error: {', '.join(unexplained[:5])}")
        where = self._results_file(tenant, batch["id"])
        answered = sum(1 for u in seen if u["state"] == "completed")
        return f"{len(seen)} units, {answered} answers; results file {where}"

    def _results_file(self, tenant: SmokeApi, batch_id: str) -> str:
        """Where the finalizer wrote the batch's results file, once it has (bounded wait)."""
        deadline = self.clock() + self.timeout_s
        while True:
            page = tenant.results(batch_id, state="completed", limit=1, next_token=None)
            if "download" in page:
                return str(page["download"]["location"])
            if self.clock() > deadline:
                raise StepFailed(f"no results file for batch {batch_id} after {self.timeout_s:g}s")
            self.sleep(self.interval_s)

    def _books(self, batch: dict[str, Any]) -> str:
        tokens = batch["final"]["tokens"]
        billed = sum(int(u["tokens"]) for u in batch["results"])
        figures = (
            f"spent {tokens['spent']:,} of {tokens['budget']:,} tokens, the units' own "
            f"{billed:,}; {tokens['reserved']:,} reserved, {tokens['available']:,} available"
        )
        wrong = []
        if tokens["spent"] != billed:
            wrong.append("the spend is not the units' tokens")
        if tokens["reserved"] != 0:
            wrong.append("tokens are still reserved by a closed batch")
        if tokens["spent"] > tokens["budget"]:
            wrong.append("the spend is over the budget")
        if tokens["available"] != tokens["budget"] - tokens["spent"]:
            wrong.append("available is not budget - spent")
        if wrong:
            raise StepFailed(f"{figures}: {'; '.join(wrong)}")
        return figures

    def _drain(self, operator: SmokeApi, tenant: SmokeApi) -> str:
        started = self.clock()
        operator.set_drain(True)
        safe, doc = wait_for_drain(
            operator,
            self.timeout_s,
            self.interval_s,
            out=io.StringIO(),
            tolerate_errors=3,
            clock=self.clock,
            sleep=self.sleep,
        )
        if not safe:
            raise StepFailed(
                f"still {doc['running']} running after {self.timeout_s:g}s with drain on"
            )
        unit = generated_units(1, self.seed + 1, MIN_TOKENS, MIN_TOKENS)
        try:
            refused = tenant.submit({"units": unit}, f"smoke-drained-{uuid.uuid4()}")
        except ApiError as e:
            if e.status != 503:
                raise StepFailed(f"a batch submitted while draining got {e}, not 503") from None
        else:
            raise StepFailed(f"batch {refused['batch_id']} was accepted while draining")
        return (
            f"on, {doc['running']} running, {doc['queued']} queued after "
            f"{self.clock() - started:.0f}s; a new batch refused with 503"
        )

    def _redeploy(self, deployer: Deployer) -> str:
        started = self.clock()
        deployer.deploy(self.log)
        return f"{deployer.describe()} in {self.clock() - started:.0f}s"

    def _drain_off(self, operator: SmokeApi, tenant: SmokeApi) -> str:
        operator.set_drain(False)
        started = self.clock()
        units = generated_units(2, self.seed + 2, MIN_TOKENS, MAX_TOKENS)
        key = f"smoke-after-{uuid.uuid4()}"
        refusals = 0
        while True:  # the functions' cached switch turns off within its cache's lifetime
            try:
                doc = tenant.submit({"units": units}, key)
                break
            except ApiError as e:
                if e.status != 503 or self.clock() - started > self.timeout_s:
                    raise
                refusals += 1
                self.sleep(self.interval_s)
        final = self._watch(tenant, str(doc["batch_id"]))
        counts = final["counts"]
        figures = (
            f"batch {doc['batch_id']} {final['state']} after the redeploy: "
            f"{counts['completed']} of 2 units completed ({refusals} refusals while the switch "
            f"settled) in {self.clock() - started:.0f}s"
        )
        if final["state"] not in TERMINAL or counts["completed"] + counts["dead_lettered"] != 2:
            raise StepFailed(figures)
        return figures


# ------------------------------------------------------------------ the command


def _production_stages() -> list[str]:
    try:
        context = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
        return [str(s) for s in context.get("production_stages", [])]
    except (OSError, ValueError, KeyError) as e:
        raise InvalidInput("--stage", f"cannot read cdk.json's production_stages: {e}") from None


def stack_for(
    args: argparse.Namespace, exists: Callable[[str, str | None], bool] = _stack_exists
) -> SmokeStack:
    """The stack the options name; refuses what a smoke must not touch."""
    if args.local:
        if args.tenant_profile or args.operator_profile or args.region or args.context:
            raise InvalidInput(
                "--local", "--tenant-profile, --operator-profile, --region and -c are for --stage"
            )
        return LocalSmokeStack(args.state_dir, LocalOptions(time_scale=args.time_scale))
    if args.stage in _production_stages():
        raise InvalidInput(
            "--stage",
            f"{args.stage!r} is a production stage (cdk.json's production_stages): a smoke "
            "deploys a stage of its own and destroys it; pick another name, e.g. smoke",
        )
    deployer = CdkDeployer(args.stage, tuple(args.context), args.require_approval, args.region)
    if not args.keep and exists(deployer.stack, args.region):
        raise InvalidInput(
            "--stage",
            f"stack {deployer.stack} exists already: a smoke destroys the stack it ran on; pick "
            "a new stage name, or pass --keep to run on it and keep it",
        )
    return AwsSmokeStack(deployer, args.tenant_profile, args.operator_profile)


def cmd_smoke(args: argparse.Namespace) -> int:
    stack = stack_for(args)
    smoke = Smoke(
        stack,
        units=args.units,
        seed=args.seed,
        keep=args.keep,
        timeout_s=args.timeout,
        interval_s=args.interval,
    )
    return smoke.run()


HELP = """\
Deploy a stack, run a small batch through it on the simulated model plane, check the results
and the books, drain, redeploy, drain off, then destroy the stack (unless --keep). One line a
step, `ok` or `FAILED` with what it saw; the first failure ends the steps with exit status 1
(the stack is destroyed all the same, unless --keep). Exit status 2: a bad option, nothing done.

--stage NAME deploys Swarm-NAME with `npx cdk deploy` to the account of your AWS credentials
(bootstrapped: `npx cdk bootstrap`) and deletes it with `npx cdk destroy --force`. It refuses a
production stage, and a stack that exists already unless --keep. The API knows callers by their
IAM role: submitting takes a tenant's role (swarm-tenant-NAME) and draining an operator's
(swarm-operator-NAME), so give an AWS profile for each (--tenant-profile, --operator-profile).

--local uses the local stack of --state-dir if one runs there, or starts one (the same stack as
`swarm local up`); destroying it stops it.

examples:
  swarm smoke --local                            # ~1-2 min: up, the steps, down
  swarm smoke --local --state-dir .swarm --keep  # on the stack of `swarm local up`, kept
  swarm smoke --stage smoke --tenant-profile smoke-tenant --operator-profile smoke-operator
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "smoke",
        help="deploy, a small batch checked end to end, drain, redeploy, drain off, destroy",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--stage", type=_stage, help="deploy Swarm-STAGE to AWS (a stage of its own)"
    )
    where.add_argument("--local", action="store_true", help="the local stack (started if needed)")
    p.add_argument("--keep", action="store_true", help="do not destroy the stack at the end")
    p.add_argument(
        "--units", type=int_in(1, 1_000), default=DEFAULT_UNITS, help=f"units ({DEFAULT_UNITS})"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the units (0)")
    p.add_argument(
        "--timeout",
        type=positive_int,
        default=900,
        help="seconds each wait may take: the batch, the results file, the drain (900)",
    )
    p.add_argument("--interval", type=_interval, default=1.0, help="seconds between checks (1)")
    g = p.add_argument_group("--local")
    g.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"the local stack's state directory ({DEFAULT_STATE_DIR})",
    )
    g.add_argument(
        "--time-scale",
        type=float_in(0.1, 1_000),
        default=LocalOptions.time_scale,
        help=f"a stack it starts: its clock (x{LocalOptions.time_scale:g})",
    )
    g = p.add_argument_group("--stage")
    g.add_argument("--region", help="AWS region (default: your AWS configuration)")
    g.add_argument("--tenant-profile", help="AWS profile of a tenant's role (submits, reads)")
    g.add_argument("--operator-profile", help="AWS profile of an operator's role (drains)")
    g.add_argument(
        "--require-approval",
        choices=APPROVALS,
        default="broadening",
        help="passed to cdk deploy (broadening)",
    )
    g.add_argument(
        "-c",
        "--context",
        action="append",
        default=[],
        type=_context_value,
        metavar="KEY=VALUE",
        help="a cdk.json context override, as with cdk -c (repeatable)",
    )
    p.set_defaults(handler=cmd_smoke)
