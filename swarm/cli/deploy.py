"""``swarm deploy``: drain, wait until nothing is running, deploy, undrain.

The deploy procedure as one command (docs/how-to/draining-and-deploying.md): turn the drain
switch on (new batches get 503,
workers take nothing new, queued units stay queued), wait until ``GET /drain`` says nothing is
running (bounded by ``--timeout``, with the progress of ``swarm drain on --wait``), deploy,
then turn the switch off. Any failure after the switch went on (the wait timed out, the deploy
failed, Ctrl-C) leaves it ON, since the deployed version is then unknown or half-updated, and
says what happened and which commands come next. ``--dry-run`` prints the plan and runs
``cdk diff``; it never touches the switch.

What deploys is a small pluggable :class:`Deployer`: :class:`CdkDeployer` runs the CDK CLI
(``npx cdk deploy Swarm-<stage> -c stage=<stage> --require-approval ...``) for a stage in an
AWS account; :class:`LocalDeployer` asks the local stack (``swarm local up``) to redeploy
itself through its ``POST /_local/redeploy`` route. Tests inject fakes.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TextIO

from swarm.cli.argtypes import positive_int
from swarm.cli.ops import _interval, wait_for_drain
from swarm.client import ApiError, Client, Target
from swarm.core.errors import InvalidInput, SwarmError

#: the checkout holding cdk.json (the CDK app's root): `npx cdk` runs there
REPO_ROOT = Path(__file__).resolve().parents[2]
#: `cdk deploy --require-approval`: broadening (CDK's default) asks before IAM or security-group
#: changes that widen access; never (CI, or after reading `--dry-run`'s diff); any-change
APPROVALS = ("broadening", "any-change", "never")
#: how long the local stack may take to re-synthesize and redeploy
LOCAL_REDEPLOY_TIMEOUT_S = 900.0
#: failed `GET /drain` checks in a row a wait survives (a long wait should outlive one lost
#: request); the first check is made before the switch is touched, so a caller the API refuses
#: finds out with nothing changed
TOLERATED_CHECK_FAILURES = 3


class DeployFailed(SwarmError):
    """The deploy (or the dry run's diff) did not succeed; the message says what ran."""


class Deployer(Protocol):
    def describe(self) -> str:
        """What deploying runs, for the plan (one line)."""
        ...

    def diff(self, out: TextIO) -> None:
        """Show what a deploy would change (the dry run). Raises DeployFailed."""
        ...

    def deploy(self, out: TextIO) -> None:
        """Deploy; return when it is done. Raises DeployFailed."""
        ...


class DrainApi(Protocol):
    """What the deploy needs of the control plane (:class:`swarm.client.Client`)."""

    def set_drain(self, on: bool) -> None: ...

    def drain_status(self) -> Any: ...


# ------------------------------------------------------------------ deployers

#: the CDK CLI's environment: no version nag, no jsii Node warnings (as the Makefile sets)
CDK_ENV = {
    "CDK_DISABLE_VERSION_CHECK": "1",
    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    "JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION": "1",
}

Runner = Callable[[Sequence[str], Mapping[str, str], Path], int]


def run_command(command: Sequence[str], env: Mapping[str, str], cwd: Path) -> int:
    """Run a command on this terminal (its output and prompts are the operator's); its status."""
    try:
        return subprocess.run(list(command), env=dict(env), cwd=cwd, check=False).returncode
    except FileNotFoundError:
        raise DeployFailed(
            f"{command[0]} is not installed: the CDK CLI needs Node 20+ (`make setup` installs "
            "the pinned CLI)"
        ) from None


@dataclass
class CdkDeployer:
    """``npx cdk deploy`` of stack ``Swarm-<stage>`` from this checkout, as
    docs/tutorials/first-deployment.md does it."""

    stage: str
    context: Sequence[str] = ()  # extra `-c KEY=VALUE` for the app (cdk.json's keys)
    require_approval: str = "broadening"
    region: str | None = None
    root: Path = REPO_ROOT
    run: Runner = run_command

    @property
    def stack(self) -> str:
        return f"Swarm-{self.stage}"

    def command(self, verb: str) -> list[str]:
        command = ["npx", "cdk", verb, self.stack, "-c", f"stage={self.stage}"]
        for value in self.context:
            command += ["-c", value]
        if verb == "deploy":
            command += ["--require-approval", self.require_approval]
        if verb == "destroy":  # `swarm smoke`: its own stage, deleted without a prompt
            command.append("--force")
        return command

    def describe(self) -> str:
        return shlex.join(self.command("deploy"))

    def diff(self, out: TextIO) -> None:
        self._run(self.command("diff"), out)

    def deploy(self, out: TextIO) -> None:
        self._run(self.command("deploy"), out)

    def destroy(self, out: TextIO) -> None:
        """``npx cdk destroy --force``: the stack and what it does not retain (a production
        stage retains its tables, buckets and logs; cdk.json's production_stages)."""
        self._run(self.command("destroy"), out)

    def _run(self, command: list[str], out: TextIO) -> None:
        if not (self.root / "cdk.json").is_file():
            raise DeployFailed(f"no cdk.json in {self.root}: run swarm from this repository")
        env = {**os.environ, **CDK_ENV}
        if self.region:
            env["AWS_REGION"] = env["AWS_DEFAULT_REGION"] = self.region
        print(f"$ {shlex.join(command)}", file=out, flush=True)
        status = self.run(command, env, self.root)
        if status != 0:
            raise DeployFailed(f"`{shlex.join(command)}` exited with status {status}")


class RequestClient(Protocol):
    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]: ...


@dataclass
class LocalDeployer:
    """The local stack redeploys itself: ``POST /_local/redeploy`` on its API port, which runs
    ``swarm.local``'s ``redeploy()`` (synthesize this checkout, update the stack in place)."""

    client: RequestClient
    route: str = "/_local/redeploy"

    def describe(self) -> str:
        return f"POST {self.route} (the local stack redeploys the template of this checkout)"

    def diff(self, out: TextIO) -> None:
        print(
            "no cdk diff for the local stack: a redeploy synthesizes this checkout's template "
            "and updates the emulated stack with it",
            file=out,
        )

    def deploy(self, out: TextIO) -> None:
        try:
            _, doc = self.client.request("POST", self.route, {})
        except ApiError as e:
            if e.status == 404:
                raise DeployFailed(
                    f"the local stack does not support redeploy yet ({self.route} answered "
                    "404); restart it instead: `swarm local down && swarm local up`"
                ) from None
            raise DeployFailed(f"the local stack's redeploy failed: {e}") from None
        if isinstance(doc, dict) and doc.get("message"):
            print(str(doc["message"]), file=out)


# ------------------------------------------------------------------ the procedure


@dataclass(frozen=True)
class Where:
    """How to name the target in messages, and the commands an operator runs next."""

    name: str  # "Swarm-prod" or "the local stack"
    drain_parameter: str
    drain_off: str  # e.g. "swarm drain off --stack Swarm-prod"
    drain_status: str
    again: str  # this deploy, to run again
    stack_status: str | None = None  # how to see a deployment that may still run


@dataclass
class Deployment:
    api: DrainApi
    deployer: Deployer
    where: Where
    timeout_s: float = 1800.0
    interval_s: float = 2.0
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def run(self, dry_run: bool = False) -> int:
        """0: deployed and drain off (or the dry run's diff ran). 1: stopped with drain ON.
        130: interrupted (drain ON once it was turned on). A failure before the switch is
        touched raises SwarmError (exit 2): nothing changed."""
        before = self.api.drain_status()  # the API answers this caller, before anything changes
        self._plan(before, dry_run)
        if dry_run:
            return self._dry_run()
        started = self.clock()
        try:
            self._say(f"[1/4] drain on: {self.where.drain_parameter}")
            self.api.set_drain(True)
        except SwarmError as e:
            raise SwarmError(f"could not turn drain on, so nothing was deployed: {e}") from None
        except KeyboardInterrupt:
            return self._stopped(
                "interrupted while turning drain on; nothing was deployed",
                [
                    f"see the switch: `{self.where.drain_status}`",
                    self._resume_intake("resume work"),
                ],
                130,
                drain="may be ON",
            )
        try:
            safe, doc = wait_for_drain(
                self.api,
                self.timeout_s,
                self.interval_s,
                out=self.out,
                tolerate_errors=TOLERATED_CHECK_FAILURES,
                prefix="[2/4] ",
                clock=self.clock,
                sleep=self.sleep,
            )
        except SwarmError as e:
            return self._stopped(
                f"the drain check failed: {e}; nothing was deployed", *self._after_wait()
            )
        except KeyboardInterrupt:
            return self._stopped(
                "interrupted while waiting; nothing was deployed", *self._after_wait(130)
            )
        if not safe:
            return self._stopped(
                f"still {doc['running']} running after {self.timeout_s:g}s; nothing was deployed",
                *self._after_wait(),
            )
        self._say("[2/4] running: 0; queued units stay queued.")
        self._say(f"[3/4] deploying: {self.deployer.describe()}")
        try:
            self.deployer.deploy(self.out)
        except DeployFailed as e:
            return self._stopped(
                f"the deploy failed: {e}",
                [
                    f"fix the cause (the output above), then run `{self.where.again}` again: it "
                    "finds nothing running and goes on to deploy",
                    self._resume_intake("or resume work on the version deployed now"),
                ],
                1,
            )
        except KeyboardInterrupt:
            steps = [self._resume_intake("once it has finished or rolled back, resume work")]
            if self.where.stack_status:
                steps.insert(
                    0, f"see whether the deployment still runs: `{self.where.stack_status}`"
                )
            return self._stopped(
                f"interrupted during the deploy: {self.where.name} may still be updating, or "
                "be half-updated",
                steps,
                130,
            )
        try:
            self._say("[4/4] drain off")
            self.api.set_drain(False)
        except (SwarmError, KeyboardInterrupt) as e:
            reason = "interrupted" if isinstance(e, KeyboardInterrupt) else str(e)
            return self._stopped(
                f"deployed {self.where.name}, but turning drain off failed ({reason})",
                [self._resume_intake("resume work")],
                130 if isinstance(e, KeyboardInterrupt) else 1,
            )
        elapsed = self.clock() - started
        self._say(f"deployed {self.where.name} in {elapsed:.0f}s; drain off, work resumes.")
        return 0

    # -- pieces
    def _plan(self, before: Any, dry_run: bool) -> None:
        state = "on" if before.get("draining") else "off"
        self._say(
            f"swarm deploy: {self.where.name}{' (dry run)' if dry_run else ''}\n"
            f"  now: drain {state}, {before.get('running', '?')} running, "
            f"{before.get('queued', '?')} queued\n"
            f"  1. drain on ({self.where.drain_parameter}): new batches get 503, workers take "
            "nothing new, queued units stay queued\n"
            f"  2. wait until nothing is running (at most {self.timeout_s:g}s, checking every "
            f"{self.interval_s:g}s)\n"
            f"  3. deploy: {self.deployer.describe()}\n"
            "  4. drain off (on any failure drain stays on, with what to do next)"
        )
        if before.get("draining") and not dry_run:
            self._say("  note: drain is already on; it is turned off after a successful deploy")

    def _dry_run(self) -> int:
        self._say("dry run: the diff of what would be deployed; the drain switch is not touched")
        try:
            self.deployer.diff(self.out)
        except DeployFailed as e:
            print(f"swarm deploy: the diff failed: {e}", file=self.err, flush=True)
            return 1
        self._say("dry run: nothing was changed")
        return 0

    def _after_wait(self, code: int = 1) -> tuple[list[str], int]:
        """The next steps after a wait that did not end with nothing running."""
        return (
            [
                f"see what is still running: `{self.where.drain_status}`; when it says safe "
                f"to deploy, run `{self.where.again}` again (or with a longer --timeout)",
                self._resume_intake(),
            ],
            code,
        )

    def _resume_intake(self, how: str = "or resume work without deploying") -> str:
        return f"{how}: `{self.where.drain_off}`"

    def _stopped(self, reason: str, steps: list[str], code: int, drain: str = "is ON") -> int:
        lines = [
            f"swarm deploy: {reason}",
            f"drain {drain}: new batches get 503, workers take nothing new, queued units stay "
            "queued.",
            "next:",
            *(f"  - {step}" for step in steps),
        ]
        print("\n".join(lines), file=self.err, flush=True)
        return code

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)


# ------------------------------------------------------------------ the command


def _context_value(text: str) -> str:
    key, sep, _ = text.partition("=")
    if not sep or not key or key == "stage":
        raise argparse.ArgumentTypeError(
            f"{text!r}: give KEY=VALUE for a cdk.json context key (the stage is --stage)"
        )
    return text


def _stage(text: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,15}", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a stage name: lowercase letters, digits and '-', starting with a "
            "letter, at most 16 characters (cdk.json's rule)"
        )
    return text


def plan_for(args: argparse.Namespace) -> tuple[DrainApi, Deployer, Where]:
    """The control plane to drain, the deployer, and the names for messages, from the options."""
    if args.local:
        if args.context or args.region:
            raise InvalidInput("--local", "-c and --region are for a stage in an AWS account")
        target = Target.load()
        if not target.local:
            raise InvalidInput("--local", "the saved target is not a local stack")
        if args.tenant:
            target = replace(target, tenant=args.tenant)
        client = Client(target)
        deployer: Deployer = LocalDeployer(Client(target, timeout_s=LOCAL_REDEPLOY_TIMEOUT_S))
        return (
            client,
            deployer,
            Where(
                name="the local stack",
                drain_parameter=target.drain_parameter,
                drain_off="swarm drain off",
                drain_status="swarm drain status",
                again="swarm deploy --local",
                stack_status="swarm local status",
            ),
        )
    if args.tenant:
        raise InvalidInput("--tenant", "is for --local; a deployed stack knows you by your role")
    stack = f"Swarm-{args.stage}"
    region = f" --region {args.region}" if args.region else ""
    try:
        target = Target.from_stack(stack, args.region)
    except InvalidInput as e:
        raise InvalidInput(
            "--stage",
            f"{e.message}. swarm deploy drains a deployed stack; for the first deploy of a "
            f"stage run `npx cdk deploy -c stage={args.stage}` "
            "(docs/tutorials/first-deployment.md)",
        ) from None
    again = [f"swarm deploy --stage {args.stage}{region}"]
    again += [f"-c {shlex.quote(value)}" for value in args.context]
    if args.require_approval != "broadening":
        again.append(f"--require-approval {args.require_approval}")
    deployer = CdkDeployer(
        args.stage, tuple(args.context), args.require_approval, args.region or target.region
    )
    return (
        Client(target),
        deployer,
        Where(
            name=stack,
            drain_parameter=target.drain_parameter,
            drain_off=f"swarm drain off --stack {stack}{region}",
            drain_status=f"swarm drain status --stack {stack}{region}",
            again=" ".join(again),
            stack_status=(
                f"aws cloudformation describe-stacks --stack-name {stack}{region} "
                "--query 'Stacks[0].StackStatus'"
            ),
        ),
    )


def cmd_deploy(args: argparse.Namespace) -> int:
    api, deployer, where = plan_for(args)
    deployment = Deployment(api, deployer, where, args.timeout, args.interval)
    return deployment.run(dry_run=args.dry_run)


HELP = """\
Deploy with the drain switch: drain on, wait until nothing is running (queued units stay
queued), deploy, drain off.

On any failure after drain went on (the wait times out, the deploy fails, Ctrl-C) drain stays
ON (new batches get 503, queued units stay queued) and the message says what to run next.
Exit status: 0 deployed, 1 stopped with drain on, 2 nothing changed (bad option, stack not
found, API or switch unreachable), 130 interrupted.

examples:
  swarm deploy --stage prod --dry-run     # the plan and `cdk diff`; drain untouched
  swarm deploy --stage prod               # npx cdk deploy Swarm-prod -c stage=prod ...
  swarm deploy --stage dev -c account_concurrency_limit=3000 --require-approval never
  swarm deploy --local                    # the local stack from `swarm local up`
  make deploy STAGE=prod                  # the same as `swarm deploy --stage prod`
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "deploy",
        help="drain, wait for running work, cdk deploy, undrain (--dry-run: plan and cdk diff)",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--stage",
        type=_stage,
        help="deploy stack Swarm-STAGE to AWS (npx cdk deploy -c stage=STAGE); "
        "it must exist: its outputs name the API and the drain switch",
    )
    where.add_argument("--local", action="store_true", help="redeploy the local stack")
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan and run cdk diff; drain untouched"
    )
    p.add_argument(
        "--timeout",
        type=positive_int,
        default=1800,
        help="seconds to wait for running work to reach 0 before giving up (1800)",
    )
    p.add_argument("--interval", type=_interval, default=2.0, help="seconds between checks (2)")
    p.add_argument(
        "--require-approval",
        choices=APPROVALS,
        default="broadening",
        help="passed to cdk deploy: broadening (default: asks before widening IAM or "
        "security groups), any-change, never (CI, or after reading --dry-run)",
    )
    p.add_argument(
        "-c",
        "--context",
        action="append",
        default=[],
        type=_context_value,
        metavar="KEY=VALUE",
        help="a cdk.json context override for the app, as with cdk -c (repeatable)",
    )
    p.add_argument("--region", help="AWS region of the stack (default: your AWS configuration)")
    p.add_argument("--tenant", help="local stack only: check the drain as this tenant")
    p.set_defaults(handler=cmd_deploy)
