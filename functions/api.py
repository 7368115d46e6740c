"""The batch API (API Gateway REST proxy): submit, status, results, resume, manifest uploads,
fleet, drain status.

Routing and translation only: authenticate the caller, parse the body into its model
(:mod:`swarm.service.api_models`), call :mod:`swarm.service.batches`, and answer its result as
JSON, or its error as :class:`swarm.api.models.Error` with the status the error's type maps to.
The routes are :data:`swarm.api.openapi.ROUTES` (a unit test holds the two together).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Literal
from urllib.parse import unquote

from aws_lambda_powertools import Metrics, Tracer
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import service_logger
from swarm.api.models import Approvals as ApprovalsDoc
from swarm.api.models import Decided as DecidedDoc
from swarm.api.models import Error, ErrorCode, Rebound, WaitingCall
from swarm.api.openapi import IDEMPOTENCY_KEY
from swarm.contract import METRIC_SUBMISSIONS_REFUSED, METRIC_SUBMISSIONS_SHED
from swarm.core import agent
from swarm.core.errors import Conflict, InvalidInput, NotFound, ReadDenied
from swarm.core.records import check_id, check_tenant
from swarm.service.api_models import (
    Caller,
    Forbidden,
    TooLarge,
    Unauthenticated,
    caller_of,
    parse_approvals_query,
    parse_decision,
    parse_results_query,
    parse_resume,
    parse_submit,
    parse_transcript_query,
    parse_upload,
    role_name_of,
)
from swarm.service.approvals import Gates
from swarm.service.batches import Batches, Draining, Shedding
from swarm.service.results import Results
from swarm.service.uploads import Uploads
from swarm.settings import ApiSettings, SettingsError
from swarm.wiring import Wiring

logger = service_logger()
tracer = Tracer()
metrics = Metrics()
app = APIGatewayRestResolver()

_cache: dict[str, Any] = {}


def runtime() -> Wiring:
    if "runtime" not in _cache:
        _cache["runtime"] = Wiring.from_env()
    rt: Wiring = _cache["runtime"]
    return rt


def batches() -> Batches:
    if "batches" not in _cache:
        _cache["batches"] = runtime().batches()
    service: Batches = _cache["batches"]
    return service


def results_reader() -> Results:
    if "results" not in _cache:
        _cache["results"] = runtime().results()
    reader: Results = _cache["results"]
    return reader


def approvals_service() -> Gates:
    if "approvals" not in _cache:
        _cache["approvals"] = runtime().approvals()
    service: Gates = _cache["approvals"]
    return service


def uploads() -> Uploads:
    if "uploads" not in _cache:
        _cache["uploads"] = runtime().uploads()
    service: Uploads = _cache["uploads"]
    return service


def _json(status: int, doc: Any, headers: dict[str, str] | None = None) -> Response[str]:
    return Response(
        status_code=status,
        content_type="application/json",
        body=json.dumps(doc),
        headers=headers or {},
    )


def _error(
    status: int, code: ErrorCode, message: str, retry_after: int | None = None
) -> Response[str]:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return _json(status, Error(error=code.value, message=message).model_dump(), headers)


#: the reads one page of approvals may take: it ends there (a next_token goes on), well within
#: API Gateway's 29 s integration timeout
_APPROVALS_PAGE_S = 15.0

_MISCONFIGURED = "the service is misconfigured; its operators are alerted"


@app.exception_handler(InvalidInput)
def _invalid(e: InvalidInput) -> Response[str]:
    return _error(400, ErrorCode.INVALID_REQUEST, str(e))


@app.exception_handler(Forbidden)
def _forbidden(e: Forbidden) -> Response[str]:
    return _error(403, ErrorCode.FORBIDDEN, str(e))


@app.exception_handler(NotFound)
def _not_found(e: NotFound) -> Response[str]:
    return _error(404, ErrorCode.NOT_FOUND, str(e))


@app.exception_handler(Conflict)
def _conflict(e: Conflict) -> Response[str]:
    return _error(409, ErrorCode.CONFLICT, str(e))


@app.exception_handler(TooLarge)
def _too_large(e: TooLarge) -> Response[str]:
    return _error(413, ErrorCode.TOO_LARGE, str(e))


@app.exception_handler(Shedding)
def _shedding(e: Shedding) -> Response[str]:
    metrics.add_metric(METRIC_SUBMISSIONS_SHED, MetricUnit.Count, 1)
    tenant_own = e.shed.reason in ("tenant_queue", "tenant_busy")  # not the fleet's load
    code = ErrorCode.TENANT_QUEUE if tenant_own else ErrorCode.SHEDDING
    return _error(429, code, str(e), e.retry_after_s)


@app.exception_handler(Draining)
def _draining(e: Draining) -> Response[str]:
    metrics.add_metric(METRIC_SUBMISSIONS_REFUSED, MetricUnit.Count, 1)
    return _error(503, ErrorCode.DRAINING, str(e), e.retry_after_s)


@app.exception_handler(SettingsError)
def _misconfigured(e: SettingsError) -> Response[str]:
    logger.error("misconfigured function", error=str(e))
    return _error(500, ErrorCode.MISCONFIGURED, _MISCONFIGURED)


@app.exception_handler(ReadDenied)
def _read_denied(e: ReadDenied) -> Response[str]:
    # one of our own objects the role should read (its grants are in infra/): ours to fix
    logger.error("S3 refused a read", error=str(e), key=e.key, code=e.code)
    return _error(500, ErrorCode.MISCONFIGURED, _MISCONFIGURED)


#: a (tenant, role id) binding is confirmed (a read; the first binding is a conditional write) at
#: most every BINDING_CHECK_S per container (``_cache["bound"]``: when each pair was last confirmed)
BINDING_CHECK_S = 300.0


def _caller() -> Caller:
    identity = app.current_event.request_context.identity
    if not identity.user_arn:
        raise Unauthenticated("sign the request with AWS credentials (SigV4)")
    s = runtime().settings_as(ApiSettings)
    # the deployment's account: this function's own (arn:aws:lambda:<region>:<account>:...)
    account = app.lambda_context.invoked_function_arn.split(":")[4]
    caller = caller_of(
        identity.user_arn,
        identity.user,
        s.tenant_principal_prefix,
        s.operator_principal_prefix,
        account,
    )
    logger.append_keys(tenant=caller.tenant or "(operator)")
    if caller.tenant is not None and caller.role_id is not None:
        pair, now = (caller.tenant, caller.role_id), time.time()
        bound: dict[tuple[str, str], float] = _cache.setdefault("bound", {})
        if now - bound.get(pair, -BINDING_CHECK_S) >= BINDING_CHECK_S:
            if not runtime().bindings().bind(caller.tenant, caller.role_id, now):
                raise Forbidden(
                    f"tenant {caller.tenant!r} is bound to another role of that name (was the "
                    "role deleted and created again?): an operator must re-bind it with "
                    f"`swarm rebind {caller.tenant}`"
                )
            bound[pair] = now
    return caller


def _tenant() -> str:
    """A tenant's route: the caller's tenant (an operator is not one)."""
    tenant = _caller().tenant
    if tenant is None:
        raise Forbidden("operators are not tenants: submit and resume with a tenant's role")
    return tenant


def _operator() -> None:
    """An operator's route: the fleet-wide views and actions."""
    if not _caller().operator:
        prefix = runtime().settings_as(ApiSettings).operator_principal_prefix
        raise Forbidden(
            f"this is an operator's view: call with a role named '{prefix}<name>'; tenants see "
            "their own batches"
        )


def _path_param(value: str) -> str:
    """A path parameter as the caller meant it: a REST API's event carries the path as sent,
    percent-encoded (``/tenants/a%3Db/rebind`` names tenant ``a=b``), and the routes capture
    from it."""
    return unquote(value)


@app.exception_handler(Unauthenticated)
def _unauth(e: Unauthenticated) -> Response[str]:
    return _error(401, ErrorCode.UNAUTHENTICATED, str(e))


@app.post("/batches")
@tracer.capture_method
def submit() -> Response[str]:
    tenant = _tenant()
    body = parse_submit(app.current_event.body)
    key = app.current_event.headers.get(IDEMPOTENCY_KEY)
    submitted = batches().submit_body(tenant, body, key, time.time())
    logger.append_keys(batch_id=submitted.run.run_id)
    doc = batches().describe(submitted.run, time.time())
    location = {"Location": f"/batches/{submitted.run.run_id}"}
    return _json(201 if submitted.created else 200, doc, location)


@app.get("/batches/<batch_id>")
@tracer.capture_method
def status(batch_id: str) -> Response[str]:
    batch_id = _path_param(batch_id)
    tenant = _caller().tenant  # None: an operator, who may read any batch
    logger.append_keys(batch_id=batch_id)
    return _json(200, batches().status(tenant, batch_id, time.time()))


@app.get("/batches/<batch_id>/results")
@tracer.capture_method
def results(batch_id: str) -> Response[str]:
    batch_id = _path_param(batch_id)
    tenant = _caller().tenant  # None: an operator, who may read any batch
    logger.append_keys(batch_id=batch_id)
    query = parse_results_query(app.current_event.query_string_parameters)
    run = batches().run_for(tenant, batch_id)
    return _json(200, results_reader().page(run, query))


@app.get("/batches/<batch_id>/units/<unit_id>/transcript")
@tracer.capture_method
def transcript(batch_id: str, unit_id: str) -> Response[str]:
    batch_id, unit_id = _path_param(batch_id), _path_param(unit_id)
    tenant = _caller().tenant  # None: an operator, who may read any batch
    logger.append_keys(batch_id=batch_id, unit_id=unit_id)
    query = parse_transcript_query(app.current_event.query_string_parameters)
    run = batches().run_for(tenant, batch_id)
    return _json(200, results_reader().transcript(run, unit_id, query.from_turn))


@app.get("/batches/<batch_id>/approvals")
@tracer.capture_method
def approvals(batch_id: str) -> Response[str]:
    batch_id = _path_param(batch_id)
    tenant = _caller().tenant  # None: an operator (a decider is one), who may read any batch
    logger.append_keys(batch_id=batch_id)
    query = parse_approvals_query(app.current_event.query_string_parameters)
    run = batches().run_for(tenant, batch_id)
    deadline = time.monotonic() + _APPROVALS_PAGE_S
    waiting, token = approvals_service().waiting(
        run,
        time.time(),
        query.limit,
        query.next_token,
        extra=lambda call: {"deciders": _deciders_doc(call["tool"])},
        keep_going=lambda: time.monotonic() < deadline,
    )
    calls = [WaitingCall(**w) for w in waiting]
    doc = ApprovalsDoc(batch_id=run.run_id, waiting=calls, next_token=token)
    return _json(200, doc.model_dump(mode="json"))


def _deciders_doc(tool: str) -> list[str] | Literal["tenant"]:
    """Who decides a gated call of ``tool``: the operator role names, or "tenant"."""
    deciders = runtime().settings_as(ApiSettings).deciders_of(tool)
    return sorted(deciders) if deciders else "tenant"


def _may_decide(caller: Caller, role: str | None, tool: str) -> None:
    """Forbidden unless the caller decides gated calls of ``tool``: the roles its entry names
    (cdk.json tools.<name>.approval.deciders), else those of approvals.deciders, else the
    batch's tenant (the caller already reads the batch)."""
    settings = runtime().settings_as(ApiSettings)
    own = settings.tool_deciders(tool)
    deciders = own or settings.deciders()
    if deciders and (not caller.operator or role not in deciders):
        where = (
            f"{tool}'s own decider roles only (cdk.json approval.deciders of its tools entry"
            if own
            else "this deployment's decider roles only (cdk.json approvals.deciders"
        )
        raise Forbidden(
            f"gated calls of {tool} are decided by {where}: {', '.join(sorted(deciders))}): "
            "call with one of them"
        )
    if not deciders and caller.operator:
        raise Forbidden(
            "the batch's tenant decides its gated tool calls (cdk.json approvals.deciders "
            "names no operator role): call with the tenant's role"
        )


@app.post("/batches/<batch_id>/units/<unit_id>/approvals/<tool_use_id>")
@tracer.capture_method
def decide(batch_id: str, unit_id: str, tool_use_id: str) -> Response[str]:
    batch_id, unit_id = _path_param(batch_id), _path_param(unit_id)
    tool_use_id = _path_param(tool_use_id)
    caller = _caller()
    logger.append_keys(batch_id=batch_id, unit_id=unit_id, tool_use_id=tool_use_id)
    run = batches().run_for(caller.tenant, batch_id)  # another tenant's batch: 404
    check_id("unit_id", unit_id)
    if not re.match(agent.NAME_PATTERN, tool_use_id):
        raise InvalidInput("tool_use_id", f"must match {agent.NAME_PATTERN} (a toolUseId)")
    user_arn = app.current_event.request_context.identity.user_arn or ""
    role = role_name_of(user_arn)
    body = parse_decision(app.current_event.body)
    decided = approvals_service().decide(
        run,
        unit_id,
        tool_use_id,
        body.decision,
        body.reason,
        user_arn,
        time.time(),
        # who decides depends on the call's tool: checked once it is found (no such call: 404)
        may_decide=lambda tool: _may_decide(caller, role, tool),
    )
    logger.info("tool call decided", decision=decided.event["decision"], by=user_arn)
    doc = DecidedDoc(**decided.doc(run.run_id, unit_id))
    return _json(200, doc.model_dump(mode="json"))


@app.post("/batches/<batch_id>/resume")
@tracer.capture_method
def resume(batch_id: str) -> Response[str]:
    batch_id = _path_param(batch_id)
    tenant = _tenant()
    logger.append_keys(batch_id=batch_id)
    body = parse_resume(app.current_event.body)
    return _json(200, batches().resume_body(tenant, batch_id, body, time.time()))


@app.post("/uploads")
@tracer.capture_method
def upload() -> Response[str]:
    tenant = _tenant()
    body = parse_upload(app.current_event.body)
    doc = uploads().grant(tenant, body, time.time())
    logger.info("upload URL granted", key=doc["key"], size_bytes=body.size_bytes)
    return _json(200, doc)


@app.post("/tenants/<tenant>/rebind")
@tracer.capture_method
def rebind(tenant: str) -> Response[str]:
    _operator()
    tenant = check_tenant(_path_param(tenant))
    forgot = runtime().bindings().unbind(tenant)
    logger.info("tenant binding forgotten", rebound_tenant=tenant, was_bound=forgot)
    return _json(200, Rebound(tenant=tenant, was_bound=forgot).model_dump(mode="json"))


@app.get("/fleet")
@tracer.capture_method
def fleet() -> Response[str]:
    _operator()
    return _json(200, batches().fleet(time.time()))


@app.get("/drain")
@tracer.capture_method
def drain() -> Response[str]:
    _operator()
    return _json(200, batches().drain_status(time.time()))


@logger.inject_lambda_context(
    correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True
)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)
