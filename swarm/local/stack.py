"""The whole stack on an embedded, patched moto server, in one process.

:class:`LocalStack` starts moto (:mod:`swarm.local.server`, with every patch of
:mod:`swarm.local.patches`) and the function host (:mod:`swarm.local.functions`), synthesizes
the app and deploys its template through CloudFormation (:mod:`swarm.local.deploy`), then plays
the parts moto does not: API Gateway (:mod:`swarm.local.apiserver`), the Lambda SQS pollers and the
EventBridge rule on the drain parameter (:mod:`swarm.local.poller`). The fan-out state machine
runs on moto's Step Functions interpreter, whose ``lambda:invoke`` reaches the real handlers.

``python -m swarm.local.stack serve`` runs it in the foreground until SIGTERM/SIGINT; ``swarm
local up`` starts that as a background process and waits for it to be ready.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import urllib.request
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from swarm.client import LOCAL_TARGET_FILE, Target
from swarm.contract import (
    NOTES_TABLE_NAME,
    OUTPUT_BUCKET_NAME,
    OUTPUT_DRAIN_PARAMETER,
    OUTPUT_LEDGER_TABLE,
    OUTPUT_TOOL_JOURNALS_TABLE,
)
from swarm.core.agent_driver import KillPoint
from swarm.core.files import write_atomically
from swarm.local import billing
from swarm.local.clients import client_factory
from swarm.local.deploy import (
    LOCAL_MCP_SECRET,
    LOCAL_OPERATOR,
    ROOT,
    Deployed,
    LocalOptions,
    deploy,
    synthesize,
)
from swarm.local.patches import iam
from swarm.local.patches.iam import Credentials
from swarm.local.poller import Receipts
from swarm.settings import ModelsDoc
from swarm.wiring import simulated_quotas

log = logging.getLogger("swarm.local")

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
DEMO_TENANT = "demo"
#: a tenant name: IAM role name characters (the role is ``<tenant prefix><tenant>``)
TENANT_NAME = re.compile(r"^[A-Za-z0-9+=,.@_-]{1,32}$")
STATE_DIR = LOCAL_TARGET_FILE.parent
RUNTIME_FILE = "local-runtime.json"  # pid and endpoints of the running stack (not a Target)
LOG_FILE = "local.log"
DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
#: connections per client: the pollers, the API and the map's children call at once
CLIENT_POOL = 64


@dataclass
class LocalStack:
    options: LocalOptions = field(default_factory=LocalOptions)
    state_dir: Path = STATE_DIR
    api_port: int = 0
    stop_event: threading.Event = field(default_factory=threading.Event)
    #: tests: change the synthesized template before it is deployed (e.g. drop one grant)
    template_edit: Any = None

    def __post_init__(self) -> None:
        self.server: Any = None
        self.api: Any = None
        self.host: Any = None
        self.model: Any = None
        self.pollers: list[Any] = []
        self.receipts = Receipts()
        self.rules: list[Any] = []
        self.schedules: list[Any] = []
        self.threads: list[threading.Thread] = []
        self.deployed: Deployed | None = None
        self.target: Target | None = None
        self.timings: dict[str, float] = {}
        self.endpoint = ""
        self.admin_credentials: Credentials | None = None
        self.function_clients: dict[str, Any] = {}
        self.tenant_prefix = ""
        self.operator_prefix = ""
        self.api_id = ""
        self.mcp: Any = None  # the local MCP server (swarm.local.mcp_server)

    # ------------------------------------------------------------------ start
    def start(self) -> Target:
        from swarm.local import patches
        from swarm.local import server as moto_server
        from swarm.local.patches import emulator

        t0 = time.monotonic()
        if str(ROOT) not in sys.path:  # the handlers: functions/ next to swarm/
            sys.path.insert(0, str(ROOT))
        for name, value in DUMMY_CREDENTIALS.items():
            os.environ.setdefault(name, value)
        os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
        patches.apply_all()
        emulator.apply_all()
        emulator.patch_sqs_deployed_clock(self.options.time_scale)  # SQS counts deployed seconds
        billing.install()  # the bill: every request the application makes (GET /_local/bill)
        billing.METER.enabled = True
        self.server = moto_server.start_server()
        endpoint = self.server.endpoint
        os.environ["MOTO_PORT"] = endpoint.rsplit(":", 1)[1]  # the SFN interpreter calls back here
        config = {"lambda": {"use_docker": False}, "stepfunctions": {"execute_state_machine": True}}
        request = urllib.request.Request(
            endpoint + "/moto-api/config", data=json.dumps(config).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            resp.read()
        # IAM from here on: the emulator's plumbing signs as its own admin user, each function
        # as its own role (see swarm.local.patches.iam)
        self.admin_credentials = iam.create_admin(ACCOUNT)
        billing.METER.exclude(self.admin_credentials.access_key_id)  # the emulator's plumbing
        iam.enforce()
        self.timings["moto_s"] = time.monotonic() - t0
        self.endpoint = endpoint
        clients = client_factory(endpoint, self.admin_credentials, region=REGION, pool=CLIENT_POOL)

        token = self._start_mcp_server()  # its URL is in the context: before synth
        t1 = time.monotonic()
        template = synthesize(self.state_dir / "cdk.out", self.options)
        self.timings["synth_s"] = time.monotonic() - t1
        t2 = time.monotonic()
        self.deployed = deploy(
            clients, template, f"Swarm-{self.options.stage}", REGION, self.template_edit
        )
        self.timings["deploy_s"] = time.monotonic() - t2
        # the MCP server's auth header, which only the worker's role may read
        clients("secretsmanager").create_secret(
            Name=LOCAL_MCP_SECRET, SecretString=f"Authorization: Bearer {token}"
        )
        parent_type, child_type = billing.state_machine_types(self.deployed.template)
        billing.METER.configure(
            time_scale=self.options.time_scale, parent_type=parent_type, child_type=child_type
        )
        self._start_functions(clients)
        self._start_pollers(clients)
        self._start_api(clients)
        outputs = self.deployed.outputs
        self.add_tenant(DEMO_TENANT)
        operator_role = f"{self.operator_prefix}{LOCAL_OPERATOR}"
        iam.ensure_operator_role(
            ACCOUNT,
            REGION,
            operator_role,
            outputs[OUTPUT_DRAIN_PARAMETER],
            self.api_id,
            self.options.stage,
            outputs.get(OUTPUT_TOOL_JOURNALS_TABLE),
        )
        self.target = Target(
            api_url=self.api.url,
            region=REGION,
            drain_parameter=outputs[OUTPUT_DRAIN_PARAMETER],
            aws_endpoint=endpoint,
            tenant=None,
            local_credentials=self.admin_credentials.boto(),
            tenant_prefix=self.tenant_prefix,
            operator_role=operator_role,
            tool_journals_table=outputs.get(OUTPUT_TOOL_JOURNALS_TABLE),
        )
        self.timings["total_s"] = time.monotonic() - t0
        billing.METER.reset()  # the bill starts with the stack ready
        return self.target

    def _functions(self, clients: Any) -> dict[str, dict[str, Any]]:
        """Deployed functions by handler module (``functions.worker`` -> its configuration)."""
        assert self.deployed is not None
        lam = clients("lambda")
        out: dict[str, dict[str, Any]] = {}
        resources = self.deployed.template["Resources"]
        for logical, physical in self.deployed.of_type("AWS::Lambda::Function").items():
            conf = lam.get_function(FunctionName=physical)["Configuration"]
            # moto's CloudFormation ignores Architectures (x86_64 whatever the template says);
            # the bill prices the template's
            architectures = resources[logical]["Properties"].get("Architectures")
            if architectures:
                conf["Architectures"] = architectures
            out[conf["Handler"].rpartition(".")[0]] = conf
        return out

    def redeploy(self) -> str:
        """Synthesize this checkout again and update the running stack in place (what ``swarm
        deploy --local`` does between draining and undraining): queued messages, the ledger and
        the governor keep their state. Idle sandboxes are dropped, so the next invocation of
        each function imports its handler module again (the ``swarm`` library it imports is
        not reloaded: a change there needs a restart, like a change of the emulator). A change
        that replaces a resource this process has wired (a function, role, mapping, queue, state
        machine or the API) needs a restart too."""
        assert self.deployed is not None and self.admin_credentials is not None
        wired = (
            "AWS::Lambda::Function",
            "AWS::Lambda::EventSourceMapping",
            "AWS::IAM::Role",
            "AWS::SQS::Queue",
            "AWS::StepFunctions::StateMachine",
            "AWS::ApiGateway::RestApi",
        )
        before = {t: self.deployed.of_type(t) for t in wired}
        clients = client_factory(
            self.endpoint, self.admin_credentials, region=REGION, pool=CLIENT_POOL
        )
        t0 = time.monotonic()
        template = synthesize(self.state_dir / "cdk.out", self.options)
        self.deployed = deploy(
            clients, template, f"Swarm-{self.options.stage}", REGION, self.template_edit
        )
        replaced = sorted(
            logical
            for t in wired
            for logical, physical in self.deployed.of_type(t).items()
            if before[t].get(logical) != physical
        )
        if replaced:
            raise RuntimeError(
                f"the redeploy replaced {', '.join(replaced)}, which this process has wired: "
                "restart the local stack (`swarm local down && swarm local up`)"
            )
        if self.host is not None:
            self.host.drop_idle()
        return f"local stack redeployed in {time.monotonic() - t0:.1f}s (updated in place)"

    @staticmethod
    def assume(role_arn: str, service: str) -> Credentials:
        """STS credentials of ``role_arn``, as the AWS service ``service`` assumes it."""
        session = f"local-{role_arn.rsplit('/', 1)[-1]}"[:64]
        return iam.assume(ACCOUNT, REGION, role_arn, session, service)

    def role_clients(self, role_arn: str, service: str, caller: str | None = None) -> Any:
        """Clients signed with STS credentials of ``role_arn``, as ``service`` assumes it;
        ``caller``: their name in the bill (:mod:`swarm.local.billing`)."""
        credentials = self.assume(role_arn, service)
        if caller is not None:
            billing.METER.name_caller(credentials.access_key_id, caller)
        return client_factory(self.endpoint, credentials, region=REGION, pool=CLIENT_POOL)

    def add_tenant(self, tenant: str) -> str:
        """The IAM role of ``tenant`` (created if missing), allowed to invoke the API."""
        return iam.ensure_tenant_role(
            ACCOUNT, REGION, self.tenant_prefix, tenant, self.api_id, self.options.stage
        )

    def _start_functions(self, clients: Any) -> None:
        from swarm.adapters.simulated_model import SimulatedModelPlane
        from swarm.local import functions as local_functions
        from swarm.local.patches import emulator

        functions = self._functions(clients)
        self.functions = functions
        # each function runs with its own execution role, the state machine's tasks with its role
        self.function_clients = {
            conf["FunctionName"]: self.role_clients(
                conf["Role"], "lambda", local_functions.FunctionProfile.of(conf).label
            )
            for conf in functions.values()
        }
        sfn = clients("stepfunctions")
        assert self.deployed is not None
        # the interpreter's credentials are process-wide: the stack has one state machine
        [machine] = self.deployed.of_type("AWS::StepFunctions::StateMachine").values()
        role = sfn.describe_state_machine(stateMachineArn=machine)["roleArn"]
        interpreter = self.assume(role, "states")
        billing.METER.name_caller(interpreter.access_key_id, "state machine")
        emulator.INTERPRETER_CREDENTIALS.update(interpreter.boto())
        envs = [f.get("Environment", {}).get("Variables", {}) for f in functions.values()]
        process_env: dict[str, str] = {
            "POWERTOOLS_TRACE_DISABLED": "true",  # no X-Ray daemon here
            # Metrics' metric set is class-level, shared by concurrent sandboxes (local_functions)
            "POWERTOOLS_METRICS_DISABLED": "true",
        }
        for name in local_functions.PROCESS_WIDE:
            values = {e[name] for e in envs if name in e}
            if len(values) > 1:
                raise RuntimeError(f"{name} differs between functions: {sorted(values)}")
            if values:
                process_env[name] = values.pop()
        worker_env = functions["functions.worker"]["Environment"]["Variables"]
        plane = SimulatedModelPlane(
            quota_tpm=int(worker_env["SIM_MODEL_QUOTA_TPM"]),
            failure_rate=float(worker_env["SIM_MODEL_FAILURE_RATE"]),
            seed=int(worker_env["SIM_MODEL_SEED"]),
            seconds_per_1k_tokens=self.options.seconds_per_1k_tokens,
            quotas=simulated_quotas(ModelsDoc.model_validate_json(worker_env["MODELS"])),
            cache_share=self.options.cache_share,
        )
        self.model = local_functions.FaultyModelPlane(plane)
        self.host = local_functions.FunctionHost(
            clients,
            self.model,
            self.options.time_scale,
            self.function_clients,
            profiles={
                conf["FunctionName"]: local_functions.FunctionProfile.of(conf)
                for conf in functions.values()
            },
        )
        local_functions.install(self.host, process_env)

    def _start_pollers(self, clients: Any) -> None:
        from swarm.local.poller import MappingPoller, ParameterRule, ScheduleRule

        assert self.deployed is not None
        lam = clients("lambda")
        roles = {conf["FunctionName"]: conf["Role"] for conf in self.functions.values()}
        for uuid in self.deployed.of_type("AWS::Lambda::EventSourceMapping").values():
            # Lambda polls the queue with the function's role: the poller does too (a session of
            # its own, so the bill tells the mapping's requests from the function's)
            function = lam.get_event_source_mapping(UUID=uuid)["FunctionArn"].rsplit(":", 1)[-1]
            poller = MappingPoller(
                clients,
                uuid,
                REGION,
                self.stop_event,
                self.options.time_scale,
                queue_clients=self.role_clients(roles[function], "lambda", billing.ESM_CALLER),
                receipts=self.receipts,
            )
            self.pollers.append(poller)
            self._thread(poller.run, f"poller-{uuid[:8]}")
        account = clients("sts").get_caller_identity()["Account"]
        for rule in _parameter_rules(self.deployed, clients):
            parameter, target = rule
            watcher = ParameterRule(clients, parameter, target, REGION, account, self.stop_event)
            self.rules.append(watcher)
            self._thread(watcher.run, "drain-rule")
        for expression, target in _schedule_rules(self.deployed, clients):
            schedule = ScheduleRule(
                clients,
                expression,
                target,
                REGION,
                account,
                self.stop_event,
                self.options.time_scale,
            )
            self.schedules.append(schedule)
            self._thread(schedule.run, "schedule-rule")

    def _start_api(self, clients: Any) -> None:
        from swarm.api.gateway import GatewayResponses
        from swarm.local.apiserver import LocalApi

        conf = self.functions["functions.api"]
        env = conf["Environment"]["Variables"]
        self.tenant_prefix = env.get("TENANT_PRINCIPAL_PREFIX", "")
        self.operator_prefix = env.get("OPERATOR_PRINCIPAL_PREFIX", "")
        assert self.deployed is not None
        self.api_id = next(iter(self.deployed.of_type("AWS::ApiGateway::RestApi").values()))
        self.api = LocalApi(
            clients,
            conf["FunctionArn"],
            ACCOUNT,
            REGION,
            self.api_id,
            self.admin,
            port=self.api_port,
            stage=self.options.stage,
            # API Gateway's own errors as the deployed template's gateway responses render them
            responses=GatewayResponses.from_template(self.deployed.template),
        )
        self.api.start()

    def _thread(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    # ------------------------------------------------------------------ tools
    def _tool_calls(self, doc: Any) -> tuple[int, Any]:
        """``POST /_local/tools``: run tool calls as the worker does (swarm.adapters.tools
        RegistryTools: its registry from the worker's deployed TOOL_REGISTRY, Invoke and the MCP
        servers' secrets signed with the worker's own role), until the worker runs agent units
        itself.
        Body ``{"tenant", "batch", "unit", "calls": [{"name", "input", "toolUseId"}]}``."""
        from swarm.adapters.mcp_tools import McpServers
        from swarm.adapters.tools import LambdaToolExecutor, RegistryTools, ToolRegistry
        from swarm.contract import TOOL_REGISTRY
        from swarm.core.agent import ToolCall

        worker = self.functions["functions.worker"]
        variables = worker.get("Environment", {}).get("Variables", {})
        registry = ToolRegistry.from_json(variables.get(TOOL_REGISTRY))
        clients = self.function_clients[worker["FunctionName"]]
        executor = LambdaToolExecutor(registry, lambda _timeout: clients("lambda"))

        def read_secret(secret: str) -> str:  # with the worker's role, as the worker reads it
            return str(clients("secretsmanager").get_secret_value(SecretId=secret)["SecretString"])

        mcp = McpServers(registry.mcp, read_secret=read_secret) if registry.mcp else None
        runner = RegistryTools(registry, executor, mcp)
        tenant, batch, unit = (str(doc.get(k, "")) for k in ("tenant", "batch", "unit"))
        calls = doc.get("calls")
        if not tenant or not batch or not unit or not isinstance(calls, list):
            message = 'give {"tenant", "batch", "unit", "calls": [{"name", "input", "toolUseId"}]}'
            return 400, {"error": "invalid_request", "message": message}
        outcomes = []
        try:
            for i, call in enumerate(calls):
                ident = str(call.get("toolUseId") or f"tooluse_{i}")
                tool_call = ToolCall(
                    0, ident, str(call.get("name")), call.get("input"), f"{batch}/{unit}/{ident}"
                )
                outcome = runner.run(tool_call, tenant)  # a Lambda tool or an MCP server's
                outcomes.append({"status": outcome.status, "content": outcome.value})
        finally:
            if mcp is not None:
                mcp.close()
        return 200, {"outcomes": outcomes}

    def _tool_probes(self) -> list[dict[str, Any]]:
        """``POST /_local/tools/probe``: calls the tools' least privilege must refuse, each made
        with its role under a session named ``probe-...`` (so the audit tells them apart): the
        worker invoking a function that is not a tool, the notes tool reading the ledger, the
        object reader reading results, the calculator reading a tenant's object, the BFCL
        toolset writing into the notes table."""
        from swarm.adapters.client_errors import client_error_type, error_code

        assert self.deployed is not None
        outputs = self.deployed.outputs
        bucket, ledger = outputs[OUTPUT_BUCKET_NAME], outputs[OUTPUT_LEDGER_TABLE]
        conf = {module.rpartition(".")[2]: c for module, c in self.functions.items()}
        notes_conf = conf.get("notes", {}).get("Environment", {}).get("Variables", {})
        notes_table = notes_conf.get(NOTES_TABLE_NAME, "")

        def probe_clients(module: str) -> Any:
            role = conf[module]["Role"]
            session = f"probe-{module}"[:64]
            credentials = iam.assume(ACCOUNT, REGION, role, session, "lambda")
            return client_factory(self.endpoint, credentials, region=REGION)

        probes: list[tuple[str, str, Any]] = [
            (
                "worker",
                "lambda:InvokeFunction on the API function",
                lambda c: c("lambda").invoke(
                    FunctionName=conf["api"]["FunctionName"], Payload=b"{}"
                ),
            ),
            (
                "notes",
                "dynamodb:GetItem on the ledger",
                lambda c: c("dynamodb").get_item(
                    TableName=ledger, Key={"pk": {"S": "run#x"}, "sk": {"S": "books"}}
                ),
            ),
            (
                "object_read",
                "s3:GetObject under results/",
                lambda c: c("s3").get_object(Bucket=bucket, Key="results/b-x/attempts/x.json"),
            ),
            (
                "calculator",
                "s3:GetObject of a tenant's object",
                lambda c: c("s3").get_object(Bucket=bucket, Key="manifests/uploads/demo/x"),
            ),
            (
                "bfcl",
                "dynamodb:PutItem on the notes table",
                lambda c: c("dynamodb").put_item(
                    TableName=notes_table, Item={"pk": {"S": "t#x"}, "sk": {"S": "n#x"}}
                ),
            ),
        ]
        results = []
        for module, what, call in probes:
            if module not in conf:
                continue
            try:
                call(probe_clients(module))
                code = "allowed"
            except client_error_type() as error:
                code = error_code(error) or "error"
            results.append({"role": module, "call": what, "code": code})
        return results

    def _start_mcp_server(self) -> str:
        """Start the local MCP server (swarm.local.mcp_server) and register it in the options;
        its port is kept in the state directory, so a restart synthesizes the same context.
        Returns its bearer token (new at each start)."""
        import secrets

        from swarm.local.mcp_server import LocalMcpServer
        from swarm.local.server import free_port

        token = secrets.token_urlsafe(24)
        port_file = self.state_dir / "mcp.port"
        port = int(port_file.read_text()) if port_file.is_file() else 0
        self.mcp = LocalMcpServer(token=token)
        try:
            url = self.mcp.start(port or free_port())
        except RuntimeError:  # the kept port is taken: another
            self.mcp = LocalMcpServer(token=token)
            url = self.mcp.start(free_port())
        port_file.write_text(url.rsplit(":", 1)[1].split("/", 1)[0])
        self.options = replace(self.options, mcp_url=url)
        return token

    # ------------------------------------------------------------------ admin (/_local/...)
    def admin(
        self, method: str, path: str, doc: Any, query: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        plane = self.model.plane if self.model else None
        batch = (query or {}).get("batch")
        if path == "/_local/model" and method == "GET" and plane is not None and batch:
            counters = plane.of_run(batch)
            return 200, {
                "batch_id": batch,
                **asdict(counters),
                "crashed_workers": self.model.crashed(batch) if self.model else 0,
                "held_calls": self.model.held(batch) if self.model else 0,
                "log": [call.as_dict() for call in plane.log(batch)],
                "kills": self.model.kills(batch) if self.model is not None else {},
            }
        if path == "/_local/model" and method == "GET" and plane is not None:
            return 200, {
                **asdict(plane.total),
                "quota_tpm": plane.quota_tpm,
                "seed": plane.seed,
                "failure_rate": plane.failure_rate,
                "storming": plane.storming,
                "crashed_workers": self.model.crashed() if self.model else 0,
            }
        if path == "/_local/model/storm" and method == "POST" and plane is not None:
            quota, seconds = int(doc["quota_tpm"]), float(doc["seconds"])
            plane.storm(quota, time.time() + seconds)
            return 200, {"quota_tpm": quota, "until_s": seconds}
        if path == "/_local/receipts" and method == "GET" and batch:
            # when the lanes' pollers received each unit's messages (a unit requeued by the
            # governor is received again)
            return 200, {"batch_id": batch, "received": self.receipts.of_run(batch)}
        if path == "/_local/mcp" and method == "GET" and self.mcp is not None:
            # the local MCP server's books: effects and calls per idempotency key
            report = self.mcp.tally.report(f"{batch}/" if batch else "")
            return 200, {"url": self.mcp.url, **report}
        if path == "/_local/faults" and method == "POST" and self.model is not None:
            if isinstance(doc.get("batch_id"), str) and isinstance(doc.get("kill"), list):
                try:
                    points = [KillPoint(p) for p in doc["kill"]]
                except ValueError:
                    known = ", ".join(p.value for p in KillPoint)
                    message = f"kill: a list of points of a turn ({known})"
                    return 400, {"error": "invalid_request", "message": message}
                self.model.arm_kills(doc["batch_id"], points)
                return 200, {"kill": [p.value for p in points], "batch_id": doc["batch_id"]}
            if isinstance(doc.get("batch_id"), str) and ("hold" in doc or "release" in doc):
                if doc.get("hold") is True:
                    self.model.hold(doc["batch_id"])
                    return 200, {"holding": True, "batch_id": doc["batch_id"]}
                if doc.get("release") is True:
                    held = self.model.release(doc["batch_id"])
                    return 200, {"released": held, "batch_id": doc["batch_id"]}
            crashes, batch_id = int(doc.get("worker_crashes", 0)), doc.get("batch_id")
            if crashes < 1 or not isinstance(batch_id, str):
                message = (
                    "give worker_crashes >= 1 and the batch_id (and optionally unit_id), or "
                    'the batch_id and "hold": true or "release": true'
                )
                return 400, {"error": "invalid_request", "message": message}
            self.model.arm_crashes(crashes, batch_id, doc.get("unit_id"))
            return 200, {"armed": crashes, "batch_id": batch_id}
        if path == "/_local/tenants" and method == "POST":
            tenant = (doc or {}).get("tenant")
            if not isinstance(tenant, str) or not TENANT_NAME.match(tenant):
                message = 'give {"tenant": NAME}: letters, digits and +=,.@_- (at most 32)'
                return 400, {"error": "invalid_request", "message": message}
            return 200, {"tenant": tenant, "role_arn": self.add_tenant(tenant)}
        if path == "/_local/redeploy" and method == "POST":
            try:
                return 200, {"message": self.redeploy()}
            except Exception as e:
                log.exception("redeploy failed")
                return 409, {"error": "redeploy_failed", "message": str(e)}
        if path == "/_local/tools" and method == "POST":
            return self._tool_calls(doc or {})
        if path == "/_local/tools/probe" and method == "POST":
            return 200, {"probes": self._tool_probes()}
        if path == "/_local/iam" and method == "GET":
            return 200, iam.AUDIT.report()
        if path == "/_local/bill" and method == "GET":
            return 200, billing.METER.snapshot()
        if path == "/_local/bill/reset" and method == "POST":
            billing.METER.reset()
            return 200, {"reset": True, "since": billing.METER.snapshot()["since"]}
        if path == "/_local/status" and method == "GET":
            return 200, {
                "pollers": [
                    {
                        "uuid": p.uuid,
                        "function": p._mapping.get("FunctionArn", "").rsplit(":", 1)[-1],
                        "queue": p._mapping.get("EventSourceArn", "").rsplit(":", 1)[-1],
                        "enabled": p.enabled,
                        "receiving": p.receiving,
                        "in_flight": p.in_flight,
                        "max_concurrency": p.max_concurrency,
                        **p.stats.as_dict(),
                    }
                    for p in self.pollers
                ],
                "drain_rule": [{"fired": r.fired, "errors": r.errors} for r in self.rules],
                "schedules": [
                    {
                        "rate": r.expression,
                        "period_s": r.period_s,
                        "fired": r.fired,
                        "errors": r.errors,
                    }
                    for r in self.schedules
                ],
                "invocations": dict(self.host.invocations) if self.host else {},
                "longest_invocation_s": dict(self.host.longest_s) if self.host else {},
                "timings": self.timings,
                "time_scale": self.options.time_scale,
            }
        return 404, {"error": "not_found", "message": f"no local route {method} {path}"}

    # ------------------------------------------------------------------ stop
    def stop(self, timeout_s: float = 20.0) -> None:
        self.stop_event.set()
        if self.api is not None:
            self.api.stop()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        from swarm.local import functions as local_functions

        local_functions.uninstall()
        if self.server is not None:
            self.server.stop()
        if self.mcp is not None:
            self.mcp.stop()


def _parameter_rules(deployed: Deployed, clients: Any) -> list[tuple[str, str]]:
    """(parameter name, target function ARN) for each EventBridge rule on an SSM parameter."""
    rules = []
    lam = clients("lambda")
    for _logical, resource in deployed.template["Resources"].items():
        if resource["Type"] != "AWS::Events::Rule":
            continue
        props = resource["Properties"]
        pattern = props.get("EventPattern", {})
        if pattern.get("source") != ["aws.ssm"] or props.get("State") != "ENABLED":
            continue
        for name in pattern.get("detail", {}).get("name", []):
            parameter = deployed.physical[name["Ref"]] if isinstance(name, dict) else name
            for target in props.get("Targets", []):
                target_logical = target["Arn"]["Fn::GetAtt"][0]
                function = deployed.physical[target_logical]
                arn = lam.get_function(FunctionName=function)["Configuration"]["FunctionArn"]
                rules.append((parameter, arn))
    return rules


def _schedule_rules(deployed: Deployed, clients: Any) -> list[tuple[str, str]]:
    """(rate expression, target function ARN) for each enabled EventBridge schedule rule."""
    rules = []
    lam = clients("lambda")
    for resource in deployed.template["Resources"].values():
        props = resource.get("Properties", {})
        if resource["Type"] != "AWS::Events::Rule" or "ScheduleExpression" not in props:
            continue
        if props.get("State", "ENABLED") != "ENABLED":
            continue
        for target in props.get("Targets", []):
            function = deployed.physical[target["Arn"]["Fn::GetAtt"][0]]
            arn = lam.get_function(FunctionName=function)["Configuration"]["FunctionArn"]
            rules.append((str(props["ScheduleExpression"]), arn))
    return rules


# ------------------------------------------------------------------ the background process


def runtime_file(state_dir: Path) -> Path:
    return state_dir / RUNTIME_FILE


class StopStarting(BaseException):
    """SIGTERM or SIGINT while the stack starts: raised in the main thread, where ``start``
    runs (a synthesis subprocess is killed on its way out)."""


def serve(options: LocalOptions, state_dir: Path, api_port: int = 0) -> int:
    """Run the stack until SIGTERM/SIGINT; write the Target (``local.json``) once ready."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)
    # a record's exception is logged at debug level by the batch processor: keep it
    logging.getLogger("aws_lambda_powertools.utilities.batch.base").setLevel(logging.DEBUG)
    # moto warns once per resource type its CloudFormation skips (listed in
    # docs/explanation/local.md)
    warnings.filterwarnings("ignore", message="Tried to parse", category=UserWarning)
    stack = LocalStack(options, state_dir, api_port)
    stopping, starting = threading.Event(), threading.Event()
    starting.set()

    def on_signal(signum: int, frame: Any) -> None:
        stopping.set()
        if starting.is_set():  # nothing served yet: stop starting (once: not again mid-stop)
            starting.clear()
            raise StopStarting

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # the pid first, so `swarm local down` (a test suite's cleanup) stops a stack still starting
    state_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(runtime_file(state_dir), json.dumps({"pid": os.getpid()}) + "\n")
    try:
        target = stack.start()
        starting.clear()
    except StopStarting:
        log.info("stopped while starting")
        stack.stop()
        runtime_file(state_dir).unlink(missing_ok=True)
        return 0
    except Exception:
        log.exception("the local stack failed to start")
        stack.stop()
        runtime_file(state_dir).unlink(missing_ok=True)
        return 1
    info = {
        "pid": os.getpid(),
        "api_url": target.api_url,
        "aws_endpoint": target.aws_endpoint,
        "time_scale": options.time_scale,
        "timings": stack.timings,
    }
    write_atomically(runtime_file(state_dir), json.dumps(info, indent=2) + "\n")
    target.save(state_dir / LOCAL_TARGET_FILE.name)  # last: its presence means "ready"
    log.info("local stack ready: %s", json.dumps(info))
    print(f"swarm local stack ready: API {target.api_url}", flush=True)
    while not stopping.wait(0.5):
        pass
    log.info("stopping the local stack")
    stack.stop()
    for path in (state_dir / LOCAL_TARGET_FILE.name, runtime_file(state_dir)):
        path.unlink(missing_ok=True)
    return 0


#: the timings of :class:`LocalOptions` ``serve`` takes (``swarm bench cost`` runs the deployed
#: ones on the local clock)
TIMING_OPTIONS: dict[str, str] = {
    "--worker-timeout-s": "worker_timeout_s",
    "--governor-max-wait-s": "governor_max_wait_s",
    "--finalizer-poll-s": "finalizer_poll_s",
    "--finalizer-max-poll-s": "finalizer_max_poll_s",
    "--sweeper-rate-minutes": "sweeper_rate_minutes",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swarm.local.stack")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve")
    p.add_argument("--state-dir", type=Path, default=STATE_DIR)
    p.add_argument("--time-scale", type=float, default=LocalOptions.time_scale)
    p.add_argument("--failure-rate", type=float, default=None)
    p.add_argument("--model-seed", type=int, default=None)
    p.add_argument("--port", type=int, default=0)
    for flag, name in TIMING_OPTIONS.items():
        default = getattr(LocalOptions, name)
        p.add_argument(flag, type=type(default), default=default)
    args = parser.parse_args(argv)
    options = LocalOptions(
        time_scale=args.time_scale,
        failure_rate=args.failure_rate,
        model_seed=args.model_seed,
        **{name: getattr(args, name) for name in TIMING_OPTIONS.values()},
    )
    return serve(options, args.state_dir, args.port)


if __name__ == "__main__":
    sys.exit(main())
