"""Synthesize the app and deploy its template into moto through CloudFormation.

Steps (each listed in docs/explanation/local.md):

1. Synthesize ``app.py``'s stack with the local context (stage ``local``, time-scaled quota,
   short worker timeout and finalizer poll) and bundling skipped: the local function host imports
   ``functions/`` and ``swarm/`` from this repository, the same code the asset packs. Synthesis
   runs in a child process (jsii starts a node runtime) and is cached by a hash of the sources
   and the context.
2. Emulate ``cdk bootstrap``: the asset bucket and the ``/cdk-bootstrap/hnb659fds/version``
   parameter the template's ``BootstrapVersion`` parameter reads.
3. Upload every file asset of ``*.assets.json`` to moto's S3 (directories zipped).
4. ``create_stack`` with the template as synthesized (no rewrite of the template itself).
5. Apply the state machine definition from :func:`infra.local_definition.local_definitions`
   (moto ignores ``DefinitionS3Location`` and ``DefinitionSubstitutions``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm.core.records import LANES

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP_QUALIFIER = "hnb659fds"
BOOTSTRAP_VERSION = "30"
SYNTH_TIMEOUT_S = 300
STACK_TIMEOUT_S = 120

#: the real model's latency the simulated plane imitates, before time scaling
BASE_SECONDS_PER_1K_TOKENS = 0.5


#: the local stack's MCP server: its registry entry, and the secret holding its auth header
LOCAL_MCP_ENTRY = "local_mcp"
LOCAL_MCP_SECRET = "swarm-local/mcp-auth"
LOCAL_MCP_TOOLS = ["tally_write", "tally_read", "slow", "fail"]  # swarm.local.mcp_server's
#: its calls' timeout, real seconds (cdk.json's default is 10): the server is a thread of the
#: stack's one GIL-bound process, whose stalls are not time-scaled. In the e2e tier (2026-12-07)
#: that stack's API requests waited up to 21.7 s, and one call of the MCP kill scenario answered
#: an error (its cause was not logged then; the worker logs a failed call now): this is twice
#: that wait
LOCAL_MCP_TIMEOUT_S = 45
LOCAL_OPERATOR = "local"  # the local operator role: <operator prefix>local
#: the local stack's tool whose calls only its operator role decides (approval.deciders): the
#: notes source's second write tool, granted to every tenant
LOCAL_GATED_TOOL = "notes_publish"


@dataclass(frozen=True)
class LocalOptions:
    """How the local stack differs from the deployed one (all through the app's context)."""

    time_scale: float = 10.0  # quota x scale, model latency / scale
    stage: str = "local"
    #: the lanes' visibility timeout and the claims' lease are 6 x this (144 s locally): the
    #: emulator's stalls are not time-scaled, and a claim outlasting its lease is a lost attempt
    #: the books did not plan. Measured while a 10,000-unit batch fans out (every DynamoDB call
    #: of the process under one lock): worker messages held up to 19-22 s on the local clock
    #: with a unit a message, 24.4 s with bundles (up to 25 units an invocation, whose draws the
    #: governor client makes one at a time and whose outcomes wait for the slowest), 35.8 s and
    #: 46.8 s and 56.2 s with bundles of up to 20; with the schema's minimum of 10 s (a 6 s lease)
    #: a unit of that batch ran twice in CI. The lease is kept at least twice the longest message
    #: measured (tests/scale/test_big_batch.py prints the margin); 90 (a 54 s lease) left 1.15x
    #: against 46.8 s, 180 (108 s) 1.92x against 56.2 s. Not what `cdk deploy` ships (cdk.json's
    #: worker.timeout_seconds)
    worker_timeout_s: int = 240
    governor_max_wait_s: float = 5.0
    finalizer_poll_s: int = 1
    #: the finalize loop's longest wait for its run's closer (deployed: 300 s; this is the same on
    #: the local clock). A poll's task times out this long after it starts, its Lambda
    #: invocation included (moto times it as AWS does), and a poll that times out loses its
    #: answer: a run it found closed is written only by a later poll that ends in time. With 3 s,
    #: on a busy emulator (load 11 on the 2 cores), a run was found closed by 5 polls in a row
    #: before one ended in time, and in a CI run three closed runs had no results after 30 s
    finalizer_max_poll_s: int = 30
    sweeper_rate_minutes: int = 1  # the schema's minimum: the sweeper looks every 6 s at x10
    #: the most map children at once (cdk.json's fanout.max_concurrency, if lower): the emulator
    #: runs every child's fan-out invocation inside its one process, and 100 children admitting
    #: 100 units each (a 10,000-unit batch) starve its request threads (measured: the API's GET
    #: unanswered for 60 s, the children's invokes refused a connection)
    map_concurrency: int = 10
    failure_rate: float | None = None  # None: cdk.json's
    model_seed: int | None = None  # the simulated model's seed; None: cdk.json's
    #: the simulated model's prompt cache: the share of a call's input that is its cacheable
    #: prefix (swarm.adapters.simulated_model; 0: no cache tokens)
    cache_share: float = 0.0
    #: the local MCP server's URL (swarm.local.mcp_server, started by the stack): registered as
    #: the tool entry ``local_mcp`` (its four tools, its auth header in the secret
    #: ``LOCAL_MCP_SECRET``) and granted to every tenant; None: no MCP entry
    mcp_url: str | None = None

    def context(self) -> dict[str, Any]:
        from infra.context import cdk_json_context

        base = cdk_json_context()
        model = json.loads(json.dumps(base["model"]))
        model["simulated"]["quota_tpm"] = int(model["simulated"]["quota_tpm"] * self.time_scale)
        if self.failure_rate is not None:
            model["simulated"]["failure_rate"] = self.failure_rate
        if self.model_seed is not None:
            model["simulated"]["seed"] = self.model_seed
        worker = {
            **base["worker"],
            "timeout_seconds": self.worker_timeout_s,
            "governor_max_wait_seconds": self.governor_max_wait_s,
        }
        fanout = {
            **base["fanout"],
            "finalizer_poll_seconds": self.finalizer_poll_s,
            "finalizer_max_poll_seconds": max(self.finalizer_poll_s, self.finalizer_max_poll_s),
            "sweeper_rate_minutes": self.sweeper_rate_minutes,
            "max_concurrency": min(int(base["fanout"]["max_concurrency"]), self.map_concurrency),
        }
        # every tenant may use every lane here (cdk.json grants `high` to no tenant by default:
        # a deployment names the tenants that may, in tenants.overrides), so the demo and the
        # scenarios can submit to `high` under any tenant name
        tenants = json.loads(json.dumps(base["tenants"]))
        tenants["defaults"]["lanes"] = [lane.value for lane in LANES]
        # every quota runs time_scale times faster, with the clock
        if "models" in base:
            scaled: dict[str, Any] = {"models": scaled_models(base["models"], self.time_scale)}
        else:  # one model, without a registry
            scaled = {"quota_tpm": int(base["quota_tpm"] * self.time_scale)}
            if base.get("quota_rpm") is not None:
                scaled["quota_rpm"] = max(1, int(base["quota_rpm"] * self.time_scale))
        operator = f"{base['api']['operator_principal_prefix']}{LOCAL_OPERATOR}"
        gated = {"source": "notes", "approval": {"deciders": [operator]}}
        tools = {**base["tools"], LOCAL_GATED_TOOL: gated}
        tenants["defaults"]["tools"] = [*tenants["defaults"]["tools"], LOCAL_GATED_TOOL]
        extra: dict[str, Any] = {"tools": tools}
        if self.mcp_url is not None:  # http to localhost: accepted on the local stage only
            # its tools listed: the API then refuses a name the server lacks, as for any tool
            server = {
                "url": self.mcp_url,
                "auth_secret": LOCAL_MCP_SECRET,
                "tools": LOCAL_MCP_TOOLS,
            }
            entry = {"mcp": server, "timeout_seconds": LOCAL_MCP_TIMEOUT_S}
            extra["tools"] = {**tools, LOCAL_MCP_ENTRY: entry}
            tenants["defaults"]["tools"] = [*tenants["defaults"]["tools"], LOCAL_MCP_ENTRY]
        return {
            "stage": self.stage,
            **scaled,
            "model": model,
            "worker": worker,
            "fanout": fanout,
            "tenants": tenants,
            **extra,
        }

    @property
    def seconds_per_1k_tokens(self) -> float:
        return BASE_SECONDS_PER_1K_TOKENS / self.time_scale


# ------------------------------------------------------------------ synth


def worker_timeout_bounds() -> tuple[int, int]:
    """cdk.json's bounds of ``worker.timeout_seconds`` (infra.config.WorkerConfig), which the
    local stack's synthesis enforces (``swarm local up --worker-timeout-s`` checks them first,
    naming its option)."""
    from infra.config import WorkerConfig

    metadata = WorkerConfig.model_fields["timeout_seconds"].metadata
    low = next(m.ge for m in metadata if hasattr(m, "ge"))
    high = next(m.le for m in metadata if hasattr(m, "le"))
    return int(low), int(high)


def scaled_models(models: dict[str, Any], time_scale: float) -> dict[str, Any]:
    """cdk.json's ``models`` with each model's quotas (per minute) ``time_scale`` times larger:
    a local minute is ``time_scale`` times shorter."""
    scaled = json.loads(json.dumps(models))
    for entry in scaled["catalog"].values():
        for key in ("tpm", "rpm"):
            if entry.get(key) is not None:
                entry[key] = max(1, int(entry[key] * time_scale))
    return dict(scaled)


def _sources_digest(context: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(context, sort_keys=True).encode())
    files = [ROOT / "app.py", ROOT / "cdk.json"]
    for folder in ("infra", "statemachines", "functions", "swarm"):
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".json"))
    for path in files:
        if "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def synthesize(outdir: Path, options: LocalOptions) -> Path:
    """Synthesize into ``outdir`` (reused when nothing changed); returns the template's path."""
    context = options.context()
    stamp = outdir / "swarm-local.digest"
    digest = _sources_digest(context)
    outdir = outdir.resolve()
    template = outdir / f"Swarm-{options.stage}.template.json"
    if template.exists() and stamp.exists() and stamp.read_text() == digest:
        return template
    env = {
        **os.environ,
        "SWARM_SKIP_BUNDLING": "1",
        "CDK_DISABLE_VERSION_CHECK": "1",
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        "JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION": "1",
        "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
    }
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from app import build_app; "
        "build_app(json.loads(sys.argv[2]), nag=False, outdir=sys.argv[3])[0].synth()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), json.dumps(context), str(outdir)],
        capture_output=True,
        text=True,
        timeout=SYNTH_TIMEOUT_S,
        env=env,
        cwd=ROOT,
        check=False,
    )
    if result.returncode != 0 or not template.exists():
        raise RuntimeError(f"synth failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    stamp.write_text(digest)
    return template


# ------------------------------------------------------------------ deploy


@dataclass(frozen=True)
class Deployed:
    stack_name: str
    outputs: dict[str, str]
    physical: dict[str, str]  # logical id -> physical id
    types: dict[str, str]  # logical id -> resource type
    template: dict[str, Any]

    def of_type(self, resource_type: str) -> dict[str, str]:
        return {k: v for k, v in self.physical.items() if self.types.get(k) == resource_type}


def _zip_dir(src: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(src.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                zf.write(path, path.relative_to(src))
    return buf.getvalue()


def _fill(text: str, account: str, region: str) -> str:
    return (
        text.replace("${AWS::AccountId}", account)
        .replace("${AWS::Region}", region)
        .replace("${AWS::Partition}", "aws")
    )


def bootstrap(clients: Any, account: str, region: str) -> str:
    """What ``cdk bootstrap`` leaves in an account, as far as the template needs it."""
    bucket = f"cdk-{BOOTSTRAP_QUALIFIER}-assets-{account}-{region}"
    s3 = clients("s3")
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=bucket)
    clients("ssm").put_parameter(
        Name=f"/cdk-bootstrap/{BOOTSTRAP_QUALIFIER}/version",
        Value=BOOTSTRAP_VERSION,
        Type="String",
        Overwrite=True,
    )
    return bucket


def upload_assets(clients: Any, assembly: Path, account: str, region: str) -> int:
    s3 = clients("s3")
    count = 0
    for manifest in sorted(assembly.glob("*.assets.json")):
        for asset in json.loads(manifest.read_text()).get("files", {}).values():
            source = assembly / asset["source"]["path"]
            if asset["source"].get("packaging") == "zip" or source.is_dir():
                body = _zip_dir(source)
            else:
                body = source.read_bytes()
            for dest in asset["destinations"].values():
                bucket = _fill(dest["bucketName"], account, region)
                with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
                    s3.create_bucket(Bucket=bucket)
                s3.put_object(Bucket=bucket, Key=dest["objectKey"], Body=body)
                count += 1
    return count


def _stack_exists(cfn: Any, stack_name: str) -> bool:
    try:
        status = cfn.describe_stacks(StackName=stack_name)["Stacks"][0]["StackStatus"]
    except Exception:  # moto: ValidationError "Stack ... does not exist"
        return False
    return bool(status != "DELETE_COMPLETE")


def deploy(
    clients: Any,
    template_path: Path,
    stack_name: str,
    region: str,
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> Deployed:
    """Create the stack from the synthesized template, or update it in place when it exists (a
    redeploy: resources whose properties did not change keep their state, queued messages
    included). ``edit`` (tests) may change the template first, e.g. drop a grant."""
    from infra.local_definition import local_definitions

    assembly = template_path.parent
    account = clients("sts").get_caller_identity()["Account"]
    bootstrap(clients, account, region)
    upload_assets(clients, assembly, account, region)
    cfn = clients("cloudformation")
    template = json.loads(template_path.read_text())
    if edit is not None:
        edit(template)
    body = json.dumps(template)
    existing = _stack_exists(cfn, stack_name)
    change = cfn.update_stack if existing else cfn.create_stack
    change(
        StackName=stack_name,
        TemplateBody=body,
        Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"],
    )
    wanted = "UPDATE_COMPLETE" if existing else "CREATE_COMPLETE"
    deadline = time.monotonic() + STACK_TIMEOUT_S
    while True:
        stack = cfn.describe_stacks(StackName=stack_name)["Stacks"][0]
        status = stack["StackStatus"]
        if not status.endswith("IN_PROGRESS"):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"stack {stack_name} still {status} after {STACK_TIMEOUT_S}s")
        time.sleep(0.2)
    if status != wanted:
        raise RuntimeError(f"stack {stack_name}: {status} {stack.get('StackStatusReason', '')}")
    physical: dict[str, str] = {}
    types: dict[str, str] = {}
    for res in cfn.describe_stack_resources(StackName=stack_name)["StackResources"]:
        logical = res.get("LogicalResourceId")
        # a resource type moto's CloudFormation skips (listed in docs/explanation/local.md)
        if not logical:
            continue
        physical[logical] = res.get("PhysicalResourceId", "")
        types[logical] = template["Resources"].get(logical, {}).get("Type", "")
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    deployed = Deployed(stack_name, outputs, physical, types, template)

    lam = clients("lambda")

    def resolve(value: Any) -> str:
        if isinstance(value, dict) and "Ref" in value:
            return physical[value["Ref"]]
        if isinstance(value, dict) and "Fn::GetAtt" in value:
            logical, attribute = value["Fn::GetAtt"]
            if types.get(logical) == "AWS::Lambda::Function" and attribute == "Arn":
                arn: str = lam.get_function(FunctionName=physical[logical])["Configuration"][
                    "FunctionArn"
                ]
                return arn
        raise ValueError(f"cannot resolve {value!r} locally")

    sfn = clients("stepfunctions")
    for logical, definition in local_definitions(template, assembly, resolve).items():
        sfn.update_state_machine(stateMachineArn=physical[logical], definition=definition)
    return deployed
