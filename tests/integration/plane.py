"""The control plane as the synthesized template declares it, on in-process moto, with its real
handlers driven by the events AWS would send them.

Nothing here types a resource or a variable by hand:

- :func:`template` synthesizes the app once with :data:`OPTIONS` (the local stack's context with
  this tier's knobs, :class:`TierOptions`) into ``.swarm/integration/cdk.out``, reused while the
  sources are unchanged (:func:`swarm.local.deploy.synthesize`; xdist workers wait for one synth
  under a file lock);
- :func:`control_plane` deploys it into a fresh ``mock_aws`` through CloudFormation exactly as the
  local stack does (:func:`swarm.local.deploy.deploy`): both tables, the lanes with their
  attributes, redrive policies and their DLQ, the bucket, the drain parameter, the event bus, the
  state machine with its local definition, the functions, their roles and mappings;
- each handler runs with its function's ``Environment.Variables`` as CloudFormation deployed them
  (Refs and GetAtts resolved to the moto resources) and clients signed with its own execution
  role, IAM enforced (:mod:`swarm.local.patches.iam`): the plane installs a
  :class:`swarm.wiring.Host`, so the handler's ``Wiring.from_env()`` reads the invoking
  function's environment and clients. A test's knob (a failure rate, a lease) overrides a
  variable the template sets, on every function that has it.

:class:`ControlPlane` then plays the parts of API Gateway, the state machine and the SQS event
source mappings. The tests' own view of the books uses the emulator's admin clients
(:meth:`ControlPlane.client`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib
import json
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError
from moto import mock_aws

from swarm import wiring
from swarm.adapters.aws import EventBridgeEvents
from swarm.adapters.dynamodb_ledger import DynamoDBLedger
from swarm.contract import (
    BUCKET_NAME,
    DRAIN_PARAMETER_NAME,
    EVENT_BUS_NAME,
    LEASE_SECONDS,
    LEDGER_TABLE_NAME,
    OPERATOR_PRINCIPAL_PREFIX,
    SWARM_FUNCTION,
    TENANT_PRINCIPAL_PREFIX,
    queue_url_var,
)
from swarm.core.ports import ModelPlane
from swarm.core.records import LANES, Lane
from swarm.local import patches
from swarm.local.clients import REGION, ClientFactory, client_factory
from swarm.local.deploy import ROOT, Deployed, LocalOptions, deploy, synthesize
from swarm.local.events import LambdaContext, proxy_event, sqs_event
from swarm.local.functions import PROCESS_WIDE
from swarm.local.patches import emulator, iam

ACCOUNT = "123456789012"  # moto's default account


@dataclass(frozen=True)
class TierOptions(LocalOptions):
    """The local stack's context (stage ``local``, bundling skipped, one-second finalizer poll)
    at time scale 1, with this tier's knobs: a quota and a small bucket that refill in a blink
    (the normal lane keeps 5% of 300,000 tokens), bundles gathered within 3 s (the bucket fills in
    3.2), a model that never fails unless a test says so, and a finalize loop that continues as a
    new execution after 2 polls, each waiting at most 3 s for the run's closer (a poll here is a
    call of this process's moto, not of a busy emulator's: swarm.local.deploy.LocalOptions)."""

    time_scale: float = 1.0
    failure_rate: float | None = 0.0
    quota_tpm: int = 6_000_000
    model_quota_tpm: int = 6_500_000  # the model's own quota, above the governed rate
    governor_capacity_tokens: int = 300_000
    finalizer_polls_per_execution: int = 2
    finalizer_max_poll_s: int = 3

    def context(self) -> dict[str, Any]:
        context = super().context()
        models = context["models"]  # the default model's quota (the other models' as shipped)
        models["catalog"][models["default"]]["tpm"] = self.quota_tpm
        context["governor_capacity_tokens"] = self.governor_capacity_tokens
        context["model"]["simulated"]["quota_tpm"] = self.model_quota_tpm
        context["fanout"]["finalizer_polls_per_execution"] = self.finalizer_polls_per_execution
        # the bucket fills in ~3.2 s, the longest the governor honours a booking late: a bundle
        # gathers no longer (infra/config.py, SwarmConfig._bundles_keep_their_tickets)
        context["worker"]["bundle_window_seconds"] = 3
        context["worker"]["bundle_max_window_seconds"] = 3
        return context


OPTIONS = TierOptions()
STACK = f"Swarm-{OPTIONS.stage}"  # as the local stack names it
ASSEMBLY = ROOT / ".swarm" / "integration" / "cdk.out"


@functools.cache
def template() -> Path:
    """The tier's synthesized template (at most one synthesis at a time across processes)."""
    ASSEMBLY.mkdir(parents=True, exist_ok=True)
    with (ASSEMBLY.parent / "synth.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return synthesize(ASSEMBLY, OPTIONS)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Function:
    """A deployed function: its handler module (``functions.<module>``), the environment
    CloudFormation gave it (with the test's overrides), and clients signed with its role."""

    name: str
    module: str
    role_arn: str
    env: dict[str, str]
    clients: ClientFactory


class PlaneHost:
    """:class:`swarm.wiring.Host` for the plane: inside :meth:`ControlPlane.running` (every
    invocation), ``Wiring.from_env()`` gets the running function's environment and clients; the
    timers run on the real clock, and each worker builds its own simulated model from its
    settings."""

    time_scale = 1.0

    def __init__(self, functions: Mapping[str, Function]) -> None:
        self.functions = functions
        self._local = threading.local()

    def stack(self) -> list[str]:
        running: list[str] | None = getattr(self._local, "running", None)
        if running is None:
            running = self._local.running = []
        return running

    def invocation(self) -> tuple[Mapping[str, str], ClientFactory] | None:
        running = self.stack()
        if not running:
            return None
        function = self.functions[running[-1]]
        return function.env, function.clients

    def model_plane(self) -> ModelPlane | None:
        return None


@dataclass
class ControlPlane:
    deployed: Deployed
    #: by handler module: ``api``, ``worker``, ``fanout``, ``finalizer``, ``dlq``, ...
    functions: dict[str, Function]
    host: PlaneHost
    admin: ClientFactory
    processed_executions: set[str] = field(default_factory=set)
    events_url: str | None = None
    announced: list[dict[str, Any]] = field(default_factory=list)

    # ------------------------------------------------------------------ what was deployed
    def env(self, function: str) -> dict[str, str]:
        """The environment of ``function`` (its handler module's name)."""
        return self.functions[function].env

    @property
    def ledger_table(self) -> str:
        return self.env("api")[LEDGER_TABLE_NAME]

    @property
    def bucket(self) -> str:
        return self.env("api")[BUCKET_NAME]

    @property
    def state_machine_arn(self) -> str:
        [arn] = self.deployed.of_type("AWS::StepFunctions::StateMachine").values()
        return arn

    @property
    def queue_urls(self) -> dict[Lane, str]:
        return {lane: self.env("api")[queue_url_var(lane)] for lane in LANES}

    @property
    def dlq_url(self) -> str:
        """The lanes' one dead-letter queue."""
        [url] = [
            url
            for logical, url in self.deployed.of_type("AWS::SQS::Queue").items()
            if logical.startswith("LanesDeadLetters")
        ]
        return url

    def tenant_arn(self, tenant: str) -> str:
        """The caller API Gateway reports for ``tenant``'s role (``<prefix><tenant>``)."""
        prefix = self.env("api")[TENANT_PRINCIPAL_PREFIX]
        return f"arn:aws:sts::{ACCOUNT}:assumed-role/{prefix}{tenant}/session"

    def operator_arn(self, name: str = "ops") -> str:
        prefix = self.env("api")[OPERATOR_PRINCIPAL_PREFIX]
        return f"arn:aws:sts::{ACCOUNT}:assumed-role/{prefix}{name}/session"

    # ------------------------------------------------------------------ plumbing
    def client(self, service: str) -> Any:
        """A client signed as the emulator's admin: the tests' view of the books."""
        return self.admin(service)

    @contextlib.contextmanager
    def running(self, function: str) -> Iterator[None]:
        """Inside, a handler's ``Wiring.from_env()`` is ``function``'s (nested calls stack: an
        invocation made from inside another one is its own, and the outer one resumes after)."""
        stack = self.host.stack()
        stack.append(function)
        try:
            yield
        finally:
            stack.pop()

    def invoke(self, function: str, event: Mapping[str, Any]) -> Any:
        module = importlib.import_module(self.functions[function].module)
        with self.running(function):
            return module.handler(dict(event), LambdaContext(self.functions[function].name))

    # ------------------------------------------------------------------ API Gateway
    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        tenant: str | None = "acme",
        headers: Mapping[str, str] | None = None,
        raw: str | None = None,
        query: Mapping[str, str] | None = None,
        operator: bool = False,
        role_id: str | None = None,
        operator_name: str = "ops",
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """A request as API Gateway hands it over: signed by ``tenant``'s role (its unique id
        ``role_id``, by default one fixed per tenant), or by an operator's role."""
        text = raw if raw is not None else (None if body is None else json.dumps(body))
        event = proxy_event(
            method,
            path,
            body=text,
            headers={"Content-Type": "application/json", **(headers or {})},
            user_arn=(
                self.operator_arn(operator_name)
                if operator
                else self.tenant_arn(tenant)
                if tenant
                else None
            ),
            user=f"{role_id or _role_id(tenant or 'ops')}:session",
            query=query,
        )
        response = self.invoke("api", event)
        headers = dict(response.get("headers") or {})
        for name, values in (response.get("multiValueHeaders") or {}).items():
            headers.setdefault(name, values[0])
        return response["statusCode"], json.loads(response["body"]), headers

    # ------------------------------------------------------------------ the state machine
    def fan_out_events(self) -> list[dict[str, Any]]:
        """The Distributed Map's item events of every execution not processed yet (marked
        processed now): what the map would pass to the fan-out step, one per manifest item (a
        chunk of units)."""
        sfn, s3 = self.client("stepfunctions"), self.client("s3")
        events = []
        for execution in sfn.list_executions(stateMachineArn=self.state_machine_arn)["executions"]:
            arn = execution["executionArn"]
            if arn in self.processed_executions:
                continue
            self.processed_executions.add(arn)
            payload = json.loads(sfn.describe_execution(executionArn=arn)["input"])
            self.open_step(payload)
            body = s3.get_object(Bucket=self.bucket, Key=payload["manifest_key"])
            for index, item in enumerate(json.loads(body["Body"].read())):
                events.append({"batch_id": payload["batch_id"], "index": index, "chunk": item})
        return events

    def open_step(self, payload: Mapping[str, Any]) -> int:
        """The state machine's first step for an input that opens the run (``OpenUnits``): the
        finalizer's open action, looped on its cursor until the run is open; its invocations."""
        state = payload.get("open")
        invocations = 0
        while state is not None and not state["done"]:
            event = {"action": "open", "batch_id": payload["batch_id"], **state}
            state = self.invoke("finalizer", event)
            invocations += 1
        return invocations

    def open_batch(self, batch_id: str) -> int:
        """Only the open step of the batch's own execution (the map not run)."""
        sfn = self.client("stepfunctions")
        arn = self.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{batch_id}"
        return self.open_step(json.loads(sfn.describe_execution(executionArn=arn)["input"]))

    def run_state_machine(self) -> list[str]:
        """Each new execution: every manifest item through the fan-out step (what the
        Distributed Map does); the finalizer then runs in :meth:`finalize`."""
        started: list[str] = []
        for event in self.fan_out_events():
            self.invoke("fanout", event)
            if event["batch_id"] not in started:
                started.append(event["batch_id"])
        return started

    def finalize(self, batch_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.invoke("finalizer", {"batch_id": batch_id})
        return result

    def run_to_close(self, batch_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """Every new execution's fan-out, the workers (waiting for the units sent back to their
        lane: :meth:`work`), then the finalizer, until the run closes."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.run_state_machine()
            self.work(wait_delayed_s=max(0.0, deadline - time.monotonic()))
            result = self.finalize(batch_id)
            if result["closed"]:
                return result
            if time.monotonic() > deadline:
                run = ledger(self).run(batch_id)
                raise AssertionError(f"run {batch_id} never closed in {timeout_s:g} s: {run}")
            time.sleep(0.2)

    # ------------------------------------------------------------------ the ESM pollers
    def receive(self, lane: Lane, max_messages: int = 10, dlq: bool = False) -> list[Any]:
        """What the lane's mapping would poll, with the worker's lease as visibility timeout."""
        url = self.dlq_url if dlq else self.queue_urls[lane]
        return list(
            self.client("sqs")
            .receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=max_messages,
                AttributeNames=["All"],
                VisibilityTimeout=int(self.env("worker")[LEASE_SECONDS]),
            )
            .get("Messages", [])
        )

    def deliver(
        self, lane: Lane, messages: list[Any], dlq: bool = False, fast_retry: bool = True
    ) -> dict[str, Any]:
        """One batch to the worker (or the DLQ handler); deletes what succeeded, as the ESM does.

        ``fast_retry`` makes a failed message visible again at once instead of after the worker's
        retry backoff (moto keeps real time).
        """
        url = self.dlq_url if dlq else self.queue_urls[lane]
        sqs = self.client("sqs")
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        try:
            response: dict[str, Any] = self.invoke(
                "dlq" if dlq else "worker", sqs_event(arn, messages, REGION)
            )
        except BatchProcessingError:  # every record failed: a function error, and the mapping
            # deletes nothing (as on AWS and in swarm/local/poller.py)
            response = {"batchItemFailures": [{"itemIdentifier": m["MessageId"]} for m in messages]}
        failed = {f["itemIdentifier"] for f in response["batchItemFailures"]}
        for m in messages:
            if m["MessageId"] not in failed:
                sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            elif fast_retry:
                sqs.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
                )
        return response

    def work(self, max_batches: int = 500, wait_delayed_s: float = 30.0) -> int:
        """Poll every lane (highest first) until nothing is visible or delayed; returns batches
        delivered. A delayed message is waited for on moto's real clock, up to
        ``wait_delayed_s`` in all: the units a worker sent back to their lane for a second or
        more (a worker runs its batch's messages at once, so some draw before the bucket has
        refilled; SQS delays are whole seconds)."""
        deadline = time.monotonic() + wait_delayed_s
        delivered = 0
        while delivered < max_batches:
            for lane in LANES:
                messages = self.receive(lane)
                if messages:
                    self.deliver(lane, messages)
                    delivered += 1
                    break
            else:
                if time.monotonic() < deadline and self.delayed() > 0:
                    time.sleep(0.1)
                    continue
                return delivered
        raise AssertionError("the lanes never drained")

    def delayed(self) -> int:
        """Messages delayed in the lanes."""
        sqs = self.client("sqs")
        return sum(
            int(
                sqs.get_queue_attributes(
                    QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
                )["Attributes"]["ApproximateNumberOfMessagesDelayed"]
            )
            for url in self.queue_urls.values()
        )

    # ------------------------------------------------------------------ EventBridge
    def observe_events(self) -> None:
        """A rule on the bus with an SQS target: every event the functions publish lands there."""
        sqs, events = self.client("sqs"), self.client("events")
        url = sqs.create_queue(QueueName="swarm-test-events")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        bus = self.env("finalizer")[EVENT_BUS_NAME]
        events.put_rule(
            Name="observe-all",
            EventBusName=bus,
            EventPattern=json.dumps({"source": [EventBridgeEvents.source]}),
        )
        events.put_targets(Rule="observe-all", EventBusName=bus, Targets=[{"Id": "q", "Arn": arn}])
        self.events_url = url

    def events(self) -> list[dict[str, Any]]:
        """Every event published on the bus since :meth:`observe_events`, oldest first."""
        assert self.events_url is not None, "call observe_events() first"
        sqs = self.client("sqs")
        while True:
            messages = sqs.receive_message(
                QueueUrl=self.events_url, MaxNumberOfMessages=10, VisibilityTimeout=0
            ).get("Messages", [])
            if not messages:
                return list(self.announced)
            for m in messages:
                self.announced.append(json.loads(m["Body"]))
                sqs.delete_message(QueueUrl=self.events_url, ReceiptHandle=m["ReceiptHandle"])

    def set_drain(self, on: bool, *, settled: bool = True) -> None:
        """The operator's switch (the admin writes it, as the operator role may). ``settled``:
        and the functions' caches of it have expired since (as they do a few seconds later)."""
        self.client("ssm").put_parameter(
            Name=self.env("api")[DRAIN_PARAMETER_NAME],
            Value="on" if on else "off",
            Type="String",
            Overwrite=True,
        )
        if settled:
            reset_handler_caches(self.functions)


def _role_id(name: str) -> str:
    """A role unique id (AROA + 17 characters) fixed per role name."""
    return "AROA" + hashlib.sha256(name.encode()).hexdigest()[:17].upper()


@dataclass
class SqsClock:
    """moto's SQS clock, frozen: a message leaves its delay or its visibility timeout only when
    the test advances the clock, never because wall time passed."""

    now_ms: float

    def millis(self) -> float:
        return self.now_ms

    def seconds(self) -> float:
        return self.now_ms / 1000.0

    def advance(self, seconds: float) -> None:
        self.now_ms += seconds * 1000.0


def freeze_sqs_clock(monkeypatch: pytest.MonkeyPatch) -> SqsClock:
    """Replace the clock of moto's SQS backend (and the visibility and delay checks, which the
    local emulator's patch may have rebound to ``time.time``) with a :class:`SqsClock`."""
    from moto.sqs import models

    clock = SqsClock(time.time() * 1000.0)
    monkeypatch.setattr(models, "unix_time_millis", clock.millis)
    monkeypatch.setattr(models, "unix_time", clock.seconds)
    monkeypatch.setattr(models.Message, "visible", property(lambda m: clock.now_ms > m.visible_at))
    monkeypatch.setattr(
        models.Message, "delayed", property(lambda m: clock.now_ms < m.delayed_until)
    )
    return clock


def reset_handler_caches(functions: Mapping[str, Function]) -> None:
    """Every handler's cached wiring dropped: the next invocation is a cold start."""
    for function in functions.values():
        importlib.import_module(function.module)._cache.clear()


def _parse_json_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto parses every template with PyYAML's pure-Python loader before it tries JSON (~0.5 s
    for this one, per test); a synthesized template is JSON, which parses to the same dict."""
    from moto.cloudformation.models import Stack

    yaml_first = Stack.parse_template

    def parse_template(text: str) -> dict[str, Any]:
        try:
            parsed: dict[str, Any] = json.loads(text)
        except ValueError:
            return yaml_first(text)
        return parsed

    monkeypatch.setattr(Stack, "parse_template", staticmethod(parse_template))


def assume(role_arn: str, service: str) -> iam.Credentials:
    """STS credentials of ``role_arn`` as the AWS service ``service`` gets them (the role must
    trust it), as the local stack assumes them (swarm.local.stack)."""
    session = f"local-{role_arn.rsplit('/', 1)[-1]}"[:64]
    return iam.assume(ACCOUNT, REGION, role_arn, session, service)


def _functions(
    deployed: Deployed, admin: ClientFactory, overrides: Mapping[str, str]
) -> dict[str, Function]:
    """Every deployed function by handler module, with the environment CloudFormation gave it,
    the overrides applied to the functions that have the variable, and its role's clients."""
    lam = admin("lambda")
    unused = set(overrides)
    functions: dict[str, Function] = {}
    for physical in deployed.of_type("AWS::Lambda::Function").values():
        conf = lam.get_function(FunctionName=physical)["Configuration"]
        env = dict(conf.get("Environment", {}).get("Variables", {}))
        for name, value in overrides.items():
            if name in env:
                env[name] = value
                unused.discard(name)
        module = conf["Handler"].rpartition(".")[0]
        functions[module.rpartition(".")[2]] = Function(
            name=conf["FunctionName"],
            module=module,
            role_arn=conf["Role"],
            env=env,
            clients=client_factory(None, assume(conf["Role"], "lambda"), region=REGION),
        )
    if unused:
        raise KeyError(f"no function of the template has {', '.join(sorted(unused))}")
    return functions


@contextlib.contextmanager
def control_plane(
    monkeypatch: pytest.MonkeyPatch,
    moto_config: Mapping[str, Any] | None = None,
    **overrides: str,
) -> Iterator[ControlPlane]:
    """The tier's template deployed into a fresh in-process moto (``moto_config``: moto's own
    settings, e.g. to run state machines), IAM enforced, every handler wired to its function.
    ``overrides``: variables of the functions' environments, set on every function that has
    them (a name no function has is an error)."""
    path = template()
    patches.apply_all()
    # what the local stack needs of moto to deploy the template (swarm.local.patches.emulator)
    emulator.patch_event_bus_ref()
    emulator.patch_state_machine_cfn()
    emulator.patch_sqs_no_builtin_esm()
    _parse_json_first(monkeypatch)
    with mock_aws(config=dict(moto_config) if moto_config else None):  # type: ignore[arg-type]
        admin = client_factory(None, iam.create_admin(ACCOUNT), region=REGION)
        iam.enforce()
        try:
            with warnings.catch_warnings():
                # moto skips the resource types it cannot create (listed in
                # docs/explanation/local.md)
                warnings.filterwarnings("ignore", message="Tried to parse", category=UserWarning)
                deployed = deploy(admin, path, STACK, REGION)
            functions = _functions(deployed, admin, overrides)
            _process_environment(monkeypatch, functions)
            host = PlaneHost(functions)
            reset_handler_caches(functions)
            wiring.run_on(host)
            try:
                yield ControlPlane(deployed, functions, host, admin)
            finally:
                wiring.run_on(None)
                reset_handler_caches(functions)
        finally:
            iam.relax()


def _process_environment(
    monkeypatch: pytest.MonkeyPatch, functions: Mapping[str, Function]
) -> None:
    """What the local stack sets process-wide (swarm.local.stack): the Powertools variables every
    function shares (checked), no tracing and no metrics; and no function name, so a handler
    that builds its wiring outside an invocation fails loudly."""
    for name in PROCESS_WIDE:
        values = {f.env[name] for f in functions.values() if name in f.env}
        assert len(values) <= 1, f"{name} differs between functions: {sorted(values)}"
        if values:
            monkeypatch.setenv(name, values.pop())
    # the handler modules were imported (their Powertools objects built) before these were set:
    # give their metrics the deployed namespace, as on AWS (a metric set that fills to 100
    # values is flushed, and Powertools refuses to serialize one without a namespace)
    namespace = os.environ.get("POWERTOOLS_METRICS_NAMESPACE")
    for function in functions.values():
        metrics = getattr(sys.modules.get(function.module), "metrics", None)
        if namespace and metrics is not None:
            monkeypatch.setattr(metrics, "namespace", namespace)
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    monkeypatch.delenv(SWARM_FUNCTION, raising=False)


def units(n: int, tokens: int = 10_000, prefix: str = "u") -> list[dict[str, Any]]:
    return [
        {"unit_id": f"{prefix}{i:04d}", "projected_tokens": tokens + 13 * i, "input": f"unit {i}"}
        for i in range(n)
    ]


def ledger(plane: ControlPlane) -> DynamoDBLedger:
    return DynamoDBLedger(plane.ledger_table, client=plane.client("dynamodb"))
