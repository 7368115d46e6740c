"""cdk.json context: validated at synth, errors name the key and what is allowed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app import build_app
from infra.config import ConfigError, load_config, worker_timing_problem
from infra.constants import ROOT
from infra.context import cdk_json_context
from swarm.adapters.bedrock import DEFAULT_READ_TIMEOUT_S
from swarm.api.models import MAX_MANIFEST_UNITS
from swarm.core.errors import InvalidInput
from swarm.core.pricing import prices_table_from_env
from swarm.core.records import LANES, Lane
from swarm.core.tenancy import TenantLimits, check_batch_size
from swarm.sim.engine import FleetConfig
from swarm.sim.plan import plan
from swarm.sim.workload import Workload
from tests.infra.conftest import NO_BUNDLING, Synthesized, synthesize

ASSET_HASH = re.compile(r"\b[0-9a-f]{64}\b")


def _context(**overrides: Any) -> dict[str, Any]:
    """cdk.json with ``overrides``; one that gives the one model's keys (``quota_tpm``,
    ``model.bedrock_model_id``) is the configuration without ``models`` (a deployment before
    the registry): cdk.json's default model, given that way."""
    context = {**cdk_json_context(), **overrides}
    model = overrides.get("model", {})
    legacy = {"quota_tpm", "quota_rpm"} & set(overrides) or {
        "bedrock_model_id",
        "output_burndown",
        "prices",
    } & set(model)
    if legacy and "models" not in overrides:
        # null: over cdk.json's too, when the test synthesizes an app (its context is merged)
        models, context["models"] = context["models"], None
        default = models["catalog"][models["default"]]
        context.setdefault("quota_tpm", default["tpm"])
        context["model"] = {"bedrock_model_id": default["model_id"], **context["model"]}
    return context


def test_cdk_json_defaults_are_valid() -> None:
    config = load_config(cdk_json_context())
    assert config.stage == "dev"
    assert not config.production


def test_cdk_json_defaults_deploy_on_a_fresh_account() -> None:
    """After `cdk bootstrap` on a new account: no account-level API Gateway logging role yet,
    and a Lambda concurrency quota that may be as low as 10."""
    context = cdk_json_context()
    config = load_config(context)
    # The stage logs, so the stack sets the region's CloudWatch role for API Gateway itself
    assert config.api.create_cloudwatch_role is True
    # Nothing reserved: AWS keeps 100 unreserved, so a reservation needs a quota above 100
    assert context["worker"]["reserved_concurrency"] is None
    assert config.worker.reserved_concurrency is None
    # The usual quota is the default; the user sets what Service Quotas says
    assert config.account_concurrency_limit == 1000


def _worker(**overrides: Any) -> dict[str, Any]:
    return {**cdk_json_context()["worker"], **overrides}


def _fanout(**overrides: Any) -> dict[str, Any]:
    return {**cdk_json_context()["fanout"], **overrides}


def _api(**overrides: Any) -> dict[str, Any]:
    return {**cdk_json_context()["api"], **overrides}


def _lanes(high: int, normal: int, low: int) -> dict[str, Any]:
    lanes = cdk_json_context()["lanes"]
    return {
        "high": {**lanes["high"], "max_concurrency": high},
        "normal": {**lanes["normal"], "max_concurrency": normal},
        "low": {**lanes["low"], "max_concurrency": low},
    }


@pytest.mark.parametrize(
    ("overrides", "keys", "allowed"),
    [
        # AWS keeps 100 concurrent executions unreserved: a new account (quota 10) can reserve none
        (
            {"account_concurrency_limit": 10, "worker": _worker(reserved_concurrency=20)},
            ("worker.reserved_concurrency", "account_concurrency_limit"),
            "at most 0 can be reserved",
        ),
        # the usual quota of 1,000 leaves at most 900 to reserve
        (
            {
                "account_concurrency_limit": 1000,
                "worker": _worker(reserved_concurrency=901),
                "lanes": _lanes(10, 6, 4),
            },
            ("worker.reserved_concurrency", "account_concurrency_limit"),
            "at most 900 can be reserved",
        ),
        # the lanes' pollers would need more concurrency than the reservation allows
        (
            {"worker": _worker(reserved_concurrency=12), "lanes": _lanes(6, 4, 4)},
            ("worker.reserved_concurrency", "lanes.*.max_concurrency"),
            "lanes' max_concurrency add up to 14",
        ),
        # unreserved: the lanes' pollers, the map's children, the API and the dead-letter
        # mapping would need more than the whole account quota
        (
            {"account_concurrency_limit": 10, "worker": _worker(reserved_concurrency=None)},
            ("account_concurrency_limit", "lanes.high.max_concurrency", "fanout.max_concurrency"),
            "add up to 222",
        ),
        # the lanes alone fit (20 of 120), but the map's 100 children come from the same pool
        (
            {
                "account_concurrency_limit": 120,
                "api": _api(throttle_burst_limit=10, throttle_rate_limit=10),
            },
            ("fanout.max_concurrency", "account_concurrency_limit=120"),
            "add up to 132",
        ),
        # reserved: the lanes fit the reservation, the rest not what it leaves unreserved
        (
            {"account_concurrency_limit": 1000, "worker": _worker(reserved_concurrency=900)},
            ("fanout.max_concurrency", "api.throttle_burst_limit", "worker.reserved_concurrency"),
            "the 100 left unreserved",
        ),
    ],
)
def test_concurrency_that_cannot_fit_the_account_fails_synth_naming_the_key(
    overrides: dict[str, Any], keys: tuple[str, ...], allowed: str
) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(_context(**overrides))
    message = str(error.value)
    for key in keys:
        assert key in message
    assert allowed in message
    assert "unknown context key" not in message


@pytest.mark.parametrize(
    "overrides",
    [
        # a new account's quota of 10: nothing reserved; 2 + 2 + 2 workers, 1 map child, 1 API
        # request, 2 dead-letter workers
        {
            "account_concurrency_limit": 10,
            "lanes": _lanes(2, 2, 2),
            "fanout": _fanout(max_concurrency=1),
            "api": _api(throttle_burst_limit=1, throttle_rate_limit=1),
        },
        # the usual quota: up to 900 reserved, the lanes within the reservation, the map's
        # children, the API and the dead-letter mapping within the 100 left (48 + 50 + 2)
        {
            "account_concurrency_limit": 1000,
            "worker": _worker(reserved_concurrency=900),
            "fanout": _fanout(max_concurrency=48),
            "api": _api(throttle_burst_limit=50),
        },
        {"worker": _worker(reserved_concurrency=20)},  # exactly the lanes' 10 + 6 + 4
        {
            "account_concurrency_limit": "320",
            "worker": _worker(reserved_concurrency=20),  # leaves 300 for 100 + 100 + 2
        },
    ],
)
def test_concurrency_that_fits_the_account_is_accepted(overrides: dict[str, Any]) -> None:
    load_config(_context(**overrides))


def test_every_concurrency_the_stack_can_start_is_counted_against_the_account() -> None:
    # Given the shipped defaults (nothing reserved)
    budget = load_config(cdk_json_context()).concurrency_budget()
    # Then the lanes' workers, the map's children, the API's burst and the dead-letter mapping
    # share the account's pool: 10 + 6 + 4 + 100 + 100 + 2 of 1,000
    assert [(d.key, d.peak) for d in budget.counted] == [
        ("lanes.high.max_concurrency", 10),
        ("lanes.normal.max_concurrency", 6),
        ("lanes.low.max_concurrency", 4),
        ("fanout.max_concurrency", 100),
        ("api.throttle_burst_limit", 100),
        ("its mapping's least", 2),
    ]
    assert (budget.total, budget.pool) == (222, 1000)
    # and the functions whose throttles are retried are listed beside them, 1 each
    assert [d.peak for d in budget.retried] == [1, 1, 1]
    # A reserved worker takes the lanes out of the pool: the rest must fit what it leaves
    reserved = load_config(_context(worker=_worker(reserved_concurrency=300))).concurrency_budget()
    assert (reserved.total, reserved.pool) == (202, 700)
    # The API's steady rate starts requests too: a rate above the burst counts
    fast = load_config(_context(api=_api(throttle_rate_limit=150.5))).concurrency_budget()
    assert fast.counted[4].peak == 151


@pytest.mark.parametrize("limit", [10, 12, 50, 120])
def test_a_small_account_is_refused_with_values_that_fit(limit: int) -> None:
    # Given the shipped defaults on an account whose quota is too small for them
    with pytest.raises(ConfigError) as error:
        load_config(_context(account_concurrency_limit=limit))
    message = str(error.value)
    assert "values that fit: " in message
    # When the proposed values are applied
    proposed = message.split("values that fit: ")[1].split(" (docs/how-to/small-accounts.md)")[0]
    values = dict(item.split("=") for item in proposed.split(", "))
    lanes = cdk_json_context()["lanes"]
    for lane in LANES:
        key = f"lanes.{lane.value}.max_concurrency"
        if key in values:
            lanes = {
                **lanes,
                lane.value: {**lanes[lane.value], "max_concurrency": int(values[key])},
            }
    fanout = _fanout(max_concurrency=int(values.get("fanout.max_concurrency", 100)))
    api = _api(
        throttle_burst_limit=int(values.get("api.throttle_burst_limit", 100)),
        throttle_rate_limit=int(values.get("api.throttle_rate_limit", 50)),
    )
    config = load_config(
        _context(account_concurrency_limit=limit, lanes=lanes, fanout=fanout, api=api)
    )
    # Then they fit the account exactly, the higher lanes never below the lower ones
    budget = config.concurrency_budget()
    assert budget.total == limit
    given = [config.lane_concurrency(lane) for lane in LANES]
    assert given == sorted(given, reverse=True) and min(given) >= 2


def test_an_account_too_small_for_any_values_is_refused_saying_so() -> None:
    # 3 lanes x 2 + 1 map child + 1 API request + 2 dead-letter workers = 10 at the least
    with pytest.raises(ConfigError) as error:
        load_config(_context(account_concurrency_limit=9))
    message = str(error.value)
    assert "no values fit: at their least they need 10" in message
    assert "Service Quotas" in message


SMALL_ACCOUNT = re.compile(r"<!-- small-account-recipe -->\s*```json\n(.*?)```", re.DOTALL)


def small_account_recipe() -> dict[str, Any]:
    """The small-account recipe of docs/how-to/small-accounts.md, exactly as printed."""
    match = SMALL_ACCOUNT.search((ROOT / "docs" / "how-to" / "small-accounts.md").read_text())
    assert match is not None, "docs/how-to/small-accounts.md lost its small-account recipe"
    recipe: dict[str, Any] = json.loads(match.group(1))
    return recipe


def test_the_readmes_small_account_recipe_fits_a_quota_of_10(tmp_path: Path) -> None:
    # Given the small-account recipe merged into cdk.json's context
    recipe = small_account_recipe()
    assert recipe["account_concurrency_limit"] == 10
    config = load_config(_context(**recipe))
    # Then every concurrency a throttle would hurt fits the 10: 2 + 2 + 2 + 1 + 1 + 2
    budget = config.concurrency_budget()
    assert [d.peak for d in budget.counted] == [2, 2, 2, 1, 1, 2]
    assert (budget.total, budget.pool) == (10, 10)
    assert config.reserved_concurrency is None  # nothing can be reserved below 100
    # and it synthesizes, nag-clean (synthesis raises on a finding), and cfn-lint finds no error
    synthesized = synthesize(tmp_path, recipe, nag=True)
    report = json.loads((tmp_path / "validation-report.json").read_text())
    assert report["pluginReports"][0]["conclusion"] == "success"
    mappings = synthesized.of_type("AWS::Lambda::EventSourceMapping").values()
    assert sorted(m["Properties"]["ScalingConfig"]["MaximumConcurrency"] for m in mappings) == [
        2, 2, 2, 2,
    ]  # fmt: skip
    machine = next(iter(synthesized.of_type("AWS::StepFunctions::StateMachine").values()))
    assert machine["Properties"]["DefinitionSubstitutions"]["MaxConcurrency"] == "1"
    stage = next(iter(synthesized.of_type("AWS::ApiGateway::Stage").values()))
    settings = stage["Properties"]["MethodSettings"][0]
    assert (settings["ThrottlingBurstLimit"], settings["ThrottlingRateLimit"]) == (1, 1)
    templates = list(tmp_path.glob("*.template.json"))
    lint = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--non-zero-exit-code", "error", "--"]
        + [str(t) for t in templates],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_recommended_feature_flags_and_offline_settings_are_in_cdk_json() -> None:
    document = json.loads((ROOT / "cdk.json").read_text())
    assert document["app"] == ".venv/bin/python app.py"
    assert document["notices"] is False
    context = document["context"]
    assert context["cli-telemetry"] is False
    assert context["@aws-cdk/aws-apigateway:disableCloudWatchRole"] is True
    assert context["@aws-cdk/aws-stepfunctions:useDistributedMapResultWriterV2"] is True
    assert sum(key.startswith("@aws-cdk") for key in context) > 50


@pytest.mark.parametrize(
    ("overrides", "key", "allowed"),
    [
        ({"quota_tpm": 0}, "quota_tpm", "greater than or equal to 1"),
        ({"quota_tpm": "lots"}, "quota_tpm", "valid integer"),
        ({"governor_share": 1.5}, "governor_share", "less than or equal to 1"),
        ({"stage": "Prod!"}, "stage", "pattern"),
        (
            {"model": {**cdk_json_context()["model"], "adapter": "openai"}},
            "model.adapter",
            "'simulated' or 'bedrock'",
        ),
        (
            {
                "lanes": {
                    "high": {"max_concurrency": 2, "shed_depth": 10},
                    "normal": {"max_concurrency": 5, "shed_depth": 10},
                    "low": {"max_concurrency": 2, "shed_depth": 10},
                }
            },
            "lanes",
            "must not increase from high to normal to low",
        ),
        (
            {
                "lanes": {
                    "high": {"max_concurrency": 1, "shed_depth": 10},
                    "normal": {"max_concurrency": 2, "shed_depth": 10},
                    "low": {"max_concurrency": 2, "shed_depth": 10},
                }
            },
            "lanes.high.max_concurrency",
            "greater than or equal to 2",
        ),
        (
            {
                "lanes": {
                    "high": {"max_concurrency": 10, "shed_depth": 100},
                    "normal": {"max_concurrency": 6, "shed_depth": 500},
                    "low": {"max_concurrency": 4, "shed_depth": 50},
                }
            },
            "lanes",
            "shed_depth must not increase from high to normal to low",
        ),
        (
            {"observability": {**cdk_json_context()["observability"], "log_retention_days": 10}},
            "observability",
            "use one of 1, 3, 5, 7, 14, 30",
        ),
        ({"max_receive_count": 2, "max_attempts": 3}, "(context)", "max_receive_count=2"),
        ({"quota_tmp": 5}, "quota_tmp", "allowed keys: stage"),
        ({"lanes": "{not json"}, "lanes", "not valid JSON"),
    ],
)
def test_bad_context_fails_synth_naming_the_key(
    overrides: dict[str, Any], key: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as error:
        build_app({**NO_BUNDLING, **overrides}, nag=False)
    message = str(error.value)
    assert key in message
    assert allowed in message


def test_cli_style_string_values_are_accepted() -> None:
    """`npx cdk synth -c quota_tpm=400000 -c lanes='{...}'` passes strings."""
    lanes = json.dumps(cdk_json_context()["lanes"])
    config = load_config(_context(quota_tpm="400000", lanes=lanes))
    assert config.quota_tpm == 400000
    assert (
        config.lanes.high.max_concurrency == cdk_json_context()["lanes"]["high"]["max_concurrency"]
    )


def _normalized(template: dict[str, Any]) -> str:
    """The template with asset hashes masked: they cover functions/ and swarm/ sources, which
    may change between two synths of one session (edits while the tests run)."""
    return ASSET_HASH.sub("<asset-hash>", json.dumps(template, sort_keys=True))


def test_python_app_py_builds_the_same_template_as_pytest(
    synth: Synthesized, tmp_path: Path
) -> None:
    # Given `python app.py` run the way the CLI runs it (context through the environment)
    environment = {
        **os.environ,
        "CDK_OUTDIR": str(tmp_path),
        "CDK_CONTEXT_JSON": json.dumps(NO_BUNDLING),
    }
    result = subprocess.run(
        [sys.executable, "app.py"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # Then the template is byte-for-byte what pytest synthesized
    template = json.loads((tmp_path / "Swarm-dev.template.json").read_text())
    assert _normalized(template) == _normalized(synth.template)


@pytest.mark.slow
def test_cdk_cli_synth_builds_the_same_template(synth: Synthesized, tmp_path: Path) -> None:
    """`npx cdk synth` offline: same template (bundling skipped, as in every test)."""
    cdk = ROOT / "node_modules" / ".bin" / "cdk"
    if not cdk.exists():
        pytest.skip("node_modules not installed (npm ci)")
    environment = {
        **os.environ,
        "CDK_DISABLE_VERSION_CHECK": "1",
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        "SWARM_SKIP_BUNDLING": "1",
    }
    result = subprocess.run(
        [
            str(cdk),
            "synth",
            "--quiet",
            "--output",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "feature flags" not in result.stderr.lower()
    template = json.loads((tmp_path / "Swarm-dev.template.json").read_text())
    assert _normalized(template) == _normalized(synth.template)


# -- the worker's batch must fit its Lambda timeout --------------------------------------------


def _bedrock(**bedrock: Any) -> dict[str, Any]:
    model = cdk_json_context()["model"]
    return {**model, "adapter": "bedrock", "bedrock": {**model["bedrock"], **bedrock}}


def test_the_shipped_defaults_fit_the_worker_timeout() -> None:
    # a batch's messages run at once: 20 s governor wait + 2 s ledger and governor calls = 22 s
    # of 120 s; the simulated model answers at once on AWS
    config = load_config(cdk_json_context())
    assert worker_timing_problem(config) is None
    assert config.model.bedrock.read_timeout_seconds == DEFAULT_READ_TIMEOUT_S == 180


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # Bedrock with the shipped worker: 20 + 180 + 10 + 5 + 2 = 217 s in 120 s
        (
            {"model": _bedrock()},
            (
                "a message of the worker's batch may take worker.governor_max_wait_seconds=20 + "
                "model.bedrock.read_timeout_seconds=180 + 10 s to connect + 5 s to count the "
                "input's tokens + 2 s of ledger and governor calls = 217 s, more than "
                "worker.timeout_seconds=120 (the batch's messages run at once)",
                "raise worker.timeout_seconds to 217 or more, or lower "
                "worker.governor_max_wait_seconds or model.bedrock.read_timeout_seconds",
            ),
        ),
        # the simulated model: the governor's wait alone, 29 + 2 s in 30 s
        (
            {"worker": _worker(governor_max_wait_seconds=29, timeout_seconds=30)},
            (
                "worker.governor_max_wait_seconds=29 + 2 s of ledger and governor calls = 31 s, "
                "more than worker.timeout_seconds=30",
                "raise worker.timeout_seconds to 31 or more, or lower "
                "worker.governor_max_wait_seconds",
            ),
        ),
        # one call longer than Lambda allows: 20 + 900 + 10 + 5 + 2 = 937 s
        (
            {
                "model": _bedrock(read_timeout_seconds=900),
                "worker": _worker(batch_size=1, timeout_seconds=900),
            },
            (
                "= 937 s, more than worker.timeout_seconds=900",
                "that is more than Lambda's 900 s: lower worker.governor_max_wait_seconds or "
                "model.bedrock.read_timeout_seconds",
            ),
        ),
    ],
)
def test_a_worker_batch_that_cannot_fit_its_timeout_fails_synth_with_the_numbers(
    overrides: dict[str, Any], expected: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as error:
        build_app({**NO_BUNDLING, **overrides}, nag=False)
    message = str(error.value)
    for text in expected:
        assert text in message


@pytest.mark.parametrize(
    "overrides",
    [
        # one Converse call per message, the batch's at once: 20 + 10 + 5 + 180 + 2 = 217 s
        {"model": _bedrock(), "worker": _worker(timeout_seconds=240)},
        {"model": _bedrock(), "worker": _worker(batch_size=10, timeout_seconds=217)},
        # a faster model's shorter read timeout: 20 + 10 + 5 + 60 + 2 = 97 s in 120 s
        {"model": _bedrock(read_timeout_seconds=60)},
    ],
)
def test_bedrock_configurations_that_fit_are_accepted(overrides: dict[str, Any]) -> None:
    load_config(_context(**overrides))


@pytest.mark.parametrize(
    ("bedrock", "allowed"),
    [
        ({"read_timeout_seconds": 10}, "greater than or equal to 30"),
        ({"read_timeout_seconds": 1000}, "less than or equal to 900"),
        ({"read_timeout_seconds": "soon"}, "valid integer"),
        ({"read_timeout": 200}, "Extra inputs are not permitted"),
    ],
)
def test_the_bedrock_read_timeout_is_validated(bedrock: dict[str, Any], allowed: str) -> None:
    model = {**cdk_json_context()["model"], "bedrock": bedrock}
    with pytest.raises(ConfigError) as error:
        load_config(_context(model=model))
    assert "model.bedrock.read" in str(error.value) and allowed in str(error.value)


def test_a_model_override_without_bedrock_gets_the_default_read_timeout() -> None:
    model = {k: v for k, v in cdk_json_context()["model"].items() if k != "bedrock"}
    assert load_config(_context(model=model)).model.bedrock.read_timeout_seconds == 180


def test_the_local_stacks_context_passes_every_synth_check_the_timing_included() -> None:
    """The local context sets the worker's timeout (LocalOptions.worker_timeout_s, 240 s: the
    lanes' visibility timeout and the claims' lease follow it, 144 s on the local clock): a
    batch's units run at once, so one governor wait (5 s) and 2 s fit."""
    from swarm.local.deploy import LocalOptions

    local = _context(**LocalOptions().context())
    config = load_config(local)
    timeout = LocalOptions().worker_timeout_s
    assert config.worker.timeout_seconds == timeout and worker_timing_problem(config) is None
    # the lease (6 x the timeout, on the local clock) at least twice the longest worker message
    # `make test-scale` measured (56.2 s, 2026-12-06; tests/scale/test_big_batch.py prints it)
    assert 6 * timeout / LocalOptions().time_scale >= 2 * 56.2
    with pytest.raises(
        ConfigError, match=rf"= {timeout + 1} s, more than worker\.timeout_seconds={timeout}"
    ):
        load_config(
            {**local, "worker": {**local["worker"], "governor_max_wait_seconds": timeout - 1}}
        )


def test_the_local_stack_lets_every_tenant_use_every_lane_and_keeps_the_rest_of_tenants() -> None:
    from swarm.local.deploy import LOCAL_GATED_TOOL, LocalOptions

    shipped = cdk_json_context()["tenants"]
    config = load_config(_context(**LocalOptions().context()))
    local = config.tenants
    assert local.defaults.lanes == (Lane.HIGH, Lane.NORMAL, Lane.LOW)
    assert "high" not in shipped["defaults"]["lanes"]
    # only the lanes differ from what cdk.json ships, and the tool only the operator decides
    kept = {**local.defaults.doc(), "tools": list(local.defaults.tools)}
    granted = [*shipped["defaults"]["tools"], LOCAL_GATED_TOOL]
    assert {**kept, "lanes": shipped["defaults"]["lanes"]} == {
        **shipped["defaults"],
        "tools": granted,
    }
    assert config.tool_deciders() == {LOCAL_GATED_TOOL: ["swarm-operator-local"]}


def test_the_worker_gets_the_read_timeout(prod_synth: Synthesized) -> None:
    worker = prod_synth.logical_id(prod_synth.stack.workers.worker.function)
    variables = prod_synth.resources[worker]["Properties"]["Environment"]["Variables"]
    assert variables["BEDROCK_READ_TIMEOUT_SECONDS"] == "180"
    assert variables["MODEL_ADAPTER"] == "bedrock"


@pytest.mark.parametrize(
    ("fanout", "message"),
    [
        ({"sweeper_rate_minutes": 0}, "sweeper_rate_minutes=0 must be a whole number of minutes"),
        ({"sweeper_rate_minutes": 1441}, "from 1 to 1440"),
        ({"sweeper_rate_minutes": 2.5}, "fanout.sweeper_rate_minutes"),
        ({"finalizer_polls_per_execution": 1501}, "25,000"),
        ({"finalizer_polls_per_execution": 0}, "fanout.finalizer_polls_per_execution"),
        ({"units_per_child": 0}, "units_per_child=0 must be a whole number from 1 to 500"),
        ({"units_per_child": 501}, "within its Lambda timeout"),
        ({"units_per_child": 2.5}, "fanout.units_per_child"),
        ({"finalizer_max_poll_seconds": 0}, "fanout.finalizer_max_poll_seconds"),
        ({"finalizer_max_poll_seconds": 3601}, "fanout.finalizer_max_poll_seconds"),
    ],
)
def test_the_sweeper_rate_and_the_poll_limit_are_checked(
    fanout: dict[str, Any], message: str
) -> None:
    base = cdk_json_context()["fanout"]
    with pytest.raises(ConfigError, match="context key 'fanout") as error:
        load_config(_context(fanout={**base, **fanout}))
    assert message in str(error.value)


def test_the_sweeper_rate_and_the_poll_limit_have_defaults() -> None:
    base = dict(cdk_json_context()["fanout"])
    base.pop("sweeper_rate_minutes", None)
    base.pop("finalizer_polls_per_execution", None)
    base.pop("units_per_child", None)
    base.pop("finalizer_max_poll_seconds", None)
    config = load_config(_context(fanout=base))
    assert config.fanout.sweeper_rate_minutes == 15
    assert config.fanout.finalizer_polls_per_execution == 1000
    assert config.fanout.units_per_child == 100
    assert config.fanout.finalizer_max_poll_seconds == 300


def test_the_api_writes_chunks_of_the_configured_size(synth: Synthesized) -> None:
    # the API function writes the manifest; cdk.json's fanout.units_per_child reaches it
    variables = {
        env["SWARM_FUNCTION"]: env
        for r in synth.resources.values()
        if r["Type"] == "AWS::Lambda::Function"
        and "SWARM_FUNCTION" in (env := r["Properties"].get("Environment", {}).get("Variables", {}))
    }
    api = variables.pop("api")
    assert api["UNITS_PER_CHILD"] == str(synth.config.fanout.units_per_child) == "100"
    # and no other function needs it (a resume's manifest is the API's too)
    assert variables and all("UNITS_PER_CHILD" not in v for v in variables.values())


# ------------------------------------------------------------ worker.concurrency: "auto"

#: Lab 6.1's units as `swarm plan` measures them (swarm.core.scheduling.UnitProfile)
SEED_PROFILE = {
    "mean_tokens": 11994.895,
    "mean_seconds": 299.4225,
    "small_tokens": 8702,
    "small_seconds": 267,
}


def _auto(profile: dict[str, Any] | None = None, **worker: Any) -> dict[str, Any]:
    """cdk.json with worker.concurrency "auto": the lanes keep only their shed depths; one
    model at the seed's quota (300k TPM: the registry's models' rates add up)."""
    context = cdk_json_context()
    lanes = {lane: {"shed_depth": c["shed_depth"]} for lane, c in context["lanes"].items()}
    auto = {"concurrency": "auto", "unit_profile": profile or SEED_PROFILE, **worker}
    return _context(lanes=lanes, worker={**context["worker"], **auto}, quota_tpm=300_000)


#: the map's and the API's concurrency lowered to fit the 124 an 876 reservation leaves
SMALL_FRONT = {
    "fanout": {**cdk_json_context()["fanout"], "max_concurrency": 61},
    "api": {**cdk_json_context()["api"], "throttle_burst_limit": 61},
}


def test_auto_concurrency_derives_the_lanes_and_the_reservation_from_the_quota() -> None:
    # Given the seed's quota (300k TPM at 95%) and Lab 6.1's unit profile
    config = load_config(_auto())
    # Then each lane may run the workers that keep the quota busy while small units run:
    # 4,750 tokens/s x 267 s / 8,702 tokens = 145.7 -> 146 (N* = 119 on the mean unit)
    sizing = config.sizing()
    assert sizing is not None and (sizing.n_star, sizing.per_lane) == (119, 146)
    assert [config.lane_concurrency(lane) for lane in LANES] == [146, 146, 146]
    assert config.reserved_concurrency == 438  # the three lanes' pollers, all reserved
    # and a doubled quota doubles the fleet (876 reserved: the map's children, the API and the
    # dead-letter mapping within the 124 it leaves)
    doubled = load_config({**_auto(), "quota_tpm": 600_000, **SMALL_FRONT})
    assert doubled.lane_concurrency(Lane.NORMAL) == 292


def test_auto_concurrency_is_what_swarm_plan_prints() -> None:
    """The same arithmetic at synth as in `swarm plan`: its "auto" values derive exactly its
    explicit ones."""
    # Given a plan for a manifest-like workload on another quota
    workload = Workload(units=120, min_tokens=2_000, max_tokens=30_000, seed=5)
    fleet = FleetConfig(quota_tpm=450_000, share=0.9, budget=10_000_000)
    planned = plan(workload, fleet, seeds=1)
    auto = planned.cdk_context_auto()
    explicit = planned.cdk_context()
    # When cdk.json takes the plan's "auto" values
    context = _auto(auto["worker"]["unit_profile"])
    context.update(quota_tpm=auto["quota_tpm"], governor_share=auto["governor_share"])
    config = load_config(context)
    # Then synth derives the plan's explicit values
    for lane in LANES:
        assert config.lane_concurrency(lane) == explicit["lanes"][lane.value]["max_concurrency"]
    assert config.reserved_concurrency == explicit["worker"]["reserved_concurrency"]


@pytest.mark.parametrize(
    ("context", "keys"),
    [
        # the derived values cannot also be given
        (
            lambda: {**_auto(), "lanes": cdk_json_context()["lanes"]},
            ("lanes.high.max_concurrency", "worker.concurrency"),
        ),
        (lambda: _auto(reserved_concurrency=400), ("worker.reserved_concurrency",)),
        # "auto" needs the profile it sizes the fleet for
        (lambda: _auto(unit_profile=None), ("worker.unit_profile", "swarm plan")),
        (
            lambda: _auto({**SEED_PROFILE, "small_tokens": 0}),
            ("worker.unit_profile.small_tokens",),
        ),
        # by hand, every lane needs its max_concurrency
        (
            lambda: _context(lanes={**cdk_json_context()["lanes"], "low": {"shed_depth": 2000}}),
            ("lanes.low.max_concurrency", '"auto"'),
        ),
        (
            lambda: _context(worker={**cdk_json_context()["worker"], "concurrency": "max"}),
            ("worker.concurrency", "'auto'"),
        ),
    ],
)
def test_auto_concurrency_refuses_what_contradicts_it(context: Any, keys: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(context())
    for key in keys:
        assert key in str(error.value)


def test_auto_concurrency_must_fit_a_fresh_account_unless_told_otherwise() -> None:
    # Given a 3M TPM quota: 1,458 workers per lane, 4,374 reserved
    big = {**_auto(), "quota_tpm": 3_000_000}
    # Then a fresh account's 1,000 concurrent executions (900 reservable) refuse it at synth
    with pytest.raises(ConfigError) as error:
        load_config(big)
    message = str(error.value)
    for words in ("worker.concurrency", "1458 workers per lane", "account_concurrency_limit"):
        assert words in message
    assert "MaximumConcurrency of 1000" in message  # one event source mapping's most
    # A 600k TPM quota needs 292 per lane, 876 reserved: fits the fresh account's 900, but
    # the 124 it leaves cannot hold 100 map children, 100 API requests and 2 dead-letter workers
    with pytest.raises(ConfigError) as error:
        load_config({**_auto(), "quota_tpm": 600_000})
    assert "the 124 left unreserved" in str(error.value)
    assert "fanout.max_concurrency=61, api.throttle_burst_limit=61" in str(error.value)
    # ...which it takes with the values proposed
    fits = load_config({**_auto(), "quota_tpm": 600_000, **SMALL_FRONT})
    assert fits.reserved_concurrency == 876
    # 900k TPM: 438 per lane, 1,314 reserved: refused by default...
    with pytest.raises(ConfigError, match="can reserve at most 900"):
        load_config({**_auto(), "quota_tpm": 900_000})
    # ...and accepted once the user says the account allows more (1,314 + 202 <= 1,600)
    raised = load_config({**_auto(), "quota_tpm": 900_000, "account_concurrency_limit": 1600})
    assert raised.reserved_concurrency == 1314


def test_auto_concurrency_reaches_the_template(tmp_path: Path) -> None:
    synthesized = synthesize(tmp_path, _auto(), nag=False)
    mappings = synthesized.stack.workers.mappings
    for lane in LANES:
        props = synthesized.resources[synthesized.logical_id(mappings[lane])]["Properties"]
        assert props["ScalingConfig"] == {"MaximumConcurrency": 146}
    worker = synthesized.stack.workers.worker.function
    props = synthesized.resources[synthesized.logical_id(worker)]["Properties"]
    assert props["ReservedConcurrentExecutions"] == 438


# --- tenants: every tenant's lanes, queue cap and share, budget per batch (swarm.core.tenancy)
def _tenants(overrides: dict[str, Any] | None = None, **defaults: Any) -> dict[str, Any]:
    shipped = cdk_json_context()["tenants"]
    return {
        "defaults": {**shipped["defaults"], **defaults},
        "overrides": overrides or {},
    }


@pytest.mark.parametrize(
    ("tenants", "key", "allowed"),
    [
        (
            _tenants(lanes=["high", "turbo"]),
            "tenants.defaults.lanes.1",
            "'high', 'normal' or 'low'",
        ),
        (_tenants(lanes=[]), "tenants.defaults.lanes", "at least 1"),
        (_tenants(lanes=["low", "low"]), "tenants.defaults", "lists a lane twice"),
        (
            _tenants(max_queued_units=0),
            "tenants.defaults.max_queued_units",
            "greater than or equal to 1",
        ),
        (
            _tenants(max_queued_units=500, guaranteed_units=600),
            "tenants.defaults",
            "guaranteed_units=600 is above max_queued_units=500",
        ),
        (
            _tenants(max_budget_per_batch=10**12),
            "tenants.defaults.max_budget_per_batch",
            "above budget.max_tokens",
        ),
        (
            _tenants({"acme": {"max_queued_units": 500}}),
            "overrides.acme",
            "guaranteed_units=1000 is above max_queued_units=500",
        ),
        (
            _tenants({"acme": {"guaranteed_units": 5000}}),
            "tenants.overrides.acme.guaranteed_units",
            "the shed_depth of the lowest lane it may use",
        ),
        (_tenants({"acme": {"lanes": ["fast"]}}), "tenants.overrides.acme.lanes.0", "'high'"),
        (_tenants({"acme": {"budget": 5}}), "tenants.overrides.acme.budget", "Extra inputs"),
        (_tenants({"a/b": {}}), "overrides.a/b", "not a tenant name"),
        ({"defaults": {"lanes": ["low"]}}, "tenants.defaults.guaranteed_units", "is required"),
        (
            _tenants({f"tenant-{i:03d}": {"lanes": ["low"]} for i in range(40)}),
            "tenants",
            "bytes of the API function's environment",
        ),
    ],
)
def test_bad_tenant_limits_fail_synth_naming_the_key(
    tenants: dict[str, Any], key: str, allowed: str
) -> None:
    # Given a cdk.json whose tenants block is wrong in one way
    # When the app is synthesized
    with pytest.raises(ConfigError) as error:
        build_app({**NO_BUNDLING, "tenants": tenants}, nag=False)
    # Then synth fails with a message naming the key and what is allowed
    message = str(error.value)
    assert key in message, message
    assert allowed in message, message


def test_tenant_overrides_take_the_defaults_for_what_they_leave_out() -> None:
    # Given an override that only restricts one tenant's lanes and budget
    context = _context(
        tenants=_tenants({"acme": {"lanes": ["low"], "max_budget_per_batch": 5_000_000}})
    )
    # When the context is loaded
    config = load_config(context)
    # Then the tenant gets its own lanes and budget, the defaults' queue cap and share
    acme = config.tenants.of("acme")
    assert acme.lanes == (Lane.LOW,) and acme.max_budget_per_batch == 5_000_000
    defaults = config.tenants.defaults
    assert (acme.max_queued_units, acme.guaranteed_units) == (
        defaults.max_queued_units,
        defaults.guaranteed_units,
    )
    # and every other tenant the defaults
    assert config.tenants.of("someone") == defaults
    doc = json.loads(config.tenants.env_value())
    assert doc["overrides"]["acme"]["lanes"] == ["low"]
    assert doc["defaults"]["lanes"] == ["normal", "low"]  # high is granted per tenant


def test_the_api_function_gets_the_resolved_tenant_limits(synth: Synthesized) -> None:
    # Given the shipped cdk.json
    # When it is synthesized
    variables = {
        env["SWARM_FUNCTION"]: env
        for r in synth.resources.values()
        if r["Type"] == "AWS::Lambda::Function"
        and "SWARM_FUNCTION" in (env := r["Properties"].get("Environment", {}).get("Variables", {}))
    }
    # Then the API function carries every tenant's limits, as the settings read them back
    api = variables.pop("api")
    assert json.loads(api["TENANT_LIMITS"]) == json.loads(synth.config.tenants.env_value())
    # and the high lane is a tenant's only where an override grants it
    assert json.loads(api["TENANT_LIMITS"])["defaults"]["lanes"] == ["normal", "low"]
    # and no other function has them
    assert variables and all("TENANT_LIMITS" not in v for v in variables.values())


@pytest.mark.parametrize(
    ("worker", "key"),
    [
        ({"bundle_units": 0}, "worker.bundle_units"),
        ({"bundle_units": 26}, "worker.bundle_units"),
        ({"bundle_window_seconds": -1}, "worker.bundle_window_seconds"),
        ({"bundle_window_seconds": 61}, "worker.bundle_window_seconds"),
        ({"bundle_stretch": -0.1}, "worker.bundle_stretch"),
        ({"bundle_stretch": 1.5}, "worker.bundle_stretch"),
        ({"bundle_max_window_seconds": -1}, "worker.bundle_max_window_seconds"),
        # the longest window below the shortest
        ({"bundle_max_window_seconds": 5}, "worker.bundle_max_window_seconds"),
        # a window longer than the governor honours a booking (300k tokens at 4,750 a second)
        ({"bundle_max_window_seconds": 64}, "worker.bundle_max_window_seconds"),
    ],
)
def test_a_bundle_setting_out_of_range_fails_synth_naming_the_key(
    worker: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(_context(worker=_worker(**worker)))


def test_a_bundle_window_longer_than_the_governor_honours_a_booking_fails_synth() -> None:
    # a bucket that fills in ~3.2 s (300,000 tokens at 6M tokens a minute x 0.95): a bundle's
    # first unit, presenting its booking up to a window late, would find it thrown away
    worker = _worker()
    del worker["bundle_max_window_seconds"]
    small = _context(quota_tpm=6_000_000, governor_capacity_tokens=300_000, worker=worker)
    with pytest.raises(ConfigError, match=r"worker\.bundle_window_seconds=10 is above 3\.2 s"):
        load_config(small)
    # a window within it, or a bigger bucket, deploys
    load_config({**small, "worker": {**worker, "bundle_window_seconds": 3}})
    load_config({**small, "governor_capacity_tokens": 1_000_000})


def test_the_bundle_settings_are_read_from_cdk_json() -> None:
    worker = _worker(bundle_units=3, bundle_window_seconds=4.5)
    del worker["bundle_stretch"], worker["bundle_max_window_seconds"]
    config = load_config(_context(worker=worker))
    assert (config.worker.bundle_units, config.worker.bundle_window_seconds) == (3, 4.5)
    # without a stretch or a longest window, the window alone
    assert (config.worker.bundle_stretch, config.worker.longest_bundle_window_seconds) == (0, 4.5)
    defaults = load_config(cdk_json_context()).worker
    assert (defaults.bundle_units, defaults.bundle_window_seconds) == (20, 10)
    assert (defaults.bundle_stretch, defaults.longest_bundle_window_seconds) == (0.25, 45)


def test_the_api_function_ends_within_api_gateways_integration_timeout(
    synth: Synthesized,
) -> None:
    # Given the API function as deployed: its timeout (every retry inside it runs within it)
    handler = synth.stack.front_door.handler.function
    timeout = synth.resources[synth.logical_id(handler)]["Properties"]["Timeout"]
    # Then with a cold start's INIT (at most 10 s) it answers within API Gateway's 29 s: the
    # caller never gets a 504 while the function goes on accepting its submission
    assert timeout == synth.config.api.timeout_seconds == 19
    assert timeout + 10 <= 29


@pytest.mark.parametrize(("timeout", "accepted"), [(19, True), (20, False), (29, False)])
def test_an_api_timeout_past_api_gateways_fails_synth_naming_the_key(
    timeout: int, accepted: bool
) -> None:
    context = _context(api=_api(timeout_seconds=timeout))
    if accepted:
        assert load_config(context).api.timeout_seconds == timeout
        return
    with pytest.raises(ConfigError) as error:
        load_config(context)
    message = str(error.value)
    assert f"api.timeout_seconds={timeout} + 10 s of Lambda INIT = {timeout + 10} s" in message
    assert "set api.timeout_seconds to 19 or less" in message


def test_the_default_tenant_cap_takes_the_largest_manifest_the_api_accepts() -> None:
    # Given the shipped tenant defaults (docs/how-to/budgets-and-tenants.md,
    # docs/explanation/scale.md: 100,000 units is one batch)
    limits = load_config(cdk_json_context()).tenants.defaults
    policy = TenantLimits(max_queued_units=limits.max_queued_units)
    # Then a manifest of MAX_MANIFEST_UNITS passes the cap's size check (it was a 400 at 20,000)
    check_batch_size("acme", policy, MAX_MANIFEST_UNITS)
    # and one unit more than the cap would still be refused, naming `units`
    with pytest.raises(InvalidInput) as error:
        check_batch_size("acme", policy, MAX_MANIFEST_UNITS + 1)
    assert error.value.field == "units"
    # and 100,000 units at the default quota (~12,000 tokens each) run well within SQS's 14 days
    config = load_config(cdk_json_context())
    default = config.governor_config(config.registry.default)  # the slower one, alone
    units_per_s = default.rate / 12_000
    assert MAX_MANIFEST_UNITS / units_per_s < 14 * 86_400 / 4


# -- model.output_burndown: quota tokens per output token (docs/explanation/governor.md, "Output
# burndown") --


def _model(**model: Any) -> dict[str, Any]:
    return {**cdk_json_context()["model"], **model}


@pytest.mark.parametrize(
    ("model", "burndown"),
    [
        ({}, 1.0),  # the shipped model, Claude 3.5 Haiku: output counted once
        ({"bedrock_model_id": "us.anthropic.claude-sonnet-4-20250514-v1:0"}, 5.0),
        ({"bedrock_model_id": "anthropic.claude-opus-4-1-20250805-v1:0"}, 5.0),
        ({"bedrock_model_id": "amazon.nova-pro-v1:0"}, 1.0),
        # given: it wins over the documented value, either way
        ({"bedrock_model_id": "amazon.nova-pro-v1:0", "output_burndown": 2.5}, 2.5),
        (
            {"bedrock_model_id": "anthropic.claude-sonnet-4-20250514-v1:0", "output_burndown": 1},
            1.0,
        ),
        ({"output_burndown": None}, 1.0),
    ],
)
def test_the_output_burndown_defaults_to_what_bedrock_documents_for_the_model(
    model: dict[str, Any], burndown: float
) -> None:
    config = load_config(_context(model=_model(**model)))  # one model, without the registry
    assert config.governor_config(config.registry.default).output_burndown == burndown
    # and it reaches every function that draws from or reads the governor
    from infra.control_plane import _static_environment

    models = json.loads(_static_environment(config, "worker")["MODELS"])
    assert models["catalog"][models["default"]]["burndown"] == burndown


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        (0.5, "greater than or equal to 1"),
        (0, "greater than or equal to 1"),
        (500, "less than or equal to 100"),
        ("five", "valid number"),
    ],
)
def test_a_bad_output_burndown_is_refused_naming_the_key(value: Any, allowed: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(_context(model=_model(output_burndown=value)))
    assert "model.output_burndown" in str(error.value) and allowed in str(error.value)


# -- prices: dollars per million tokens, dated, per model (docs/explanation/ledger.md, "Money") --


def test_the_shipped_prices_reach_the_api_and_the_worker_as_micro_dollars() -> None:
    from infra.control_plane import _static_environment

    config = load_config(cdk_json_context())
    haiku = config.registry.catalog["haiku"].parsed_prices
    sonnet = config.registry.catalog["sonnet"].parsed_prices
    assert haiku is not None and haiku.as_of.isoformat() == "2026-12-06"
    assert sonnet is not None and sonnet.as_of.isoformat() == "2026-12-06"
    # Claude 3.5 Haiku on Bedrock: $0.80 in, $4.00 out, $0.08 cache reads, $1.00 cache writes
    assert (haiku.input, haiku.output, haiku.cache_read, haiku.cache_write) == (
        800_000, 4_000_000, 80_000, 1_000_000,
    )  # fmt: skip
    # Claude Sonnet 4: $3.00 in, $15.00 out, $0.30 cache reads, $3.75 cache writes
    assert (sonnet.input, sonnet.output, sonnet.cache_read, sonnet.cache_write) == (
        3_000_000, 15_000_000, 300_000, 3_750_000,
    )  # fmt: skip
    for function in ("api", "worker"):
        table = prices_table_from_env(_static_environment(config, function)["MODEL_PRICES"])
        assert table == {"haiku": haiku, "sonnet": sonnet}  # by the registry's names
    # a deployment without prices: none, and budgets in dollars are refused
    catalog = {
        name: {k: v for k, v in entry.items() if k != "prices"}
        for name, entry in cdk_json_context()["models"]["catalog"].items()
    }
    bare = load_config(_context(models={**cdk_json_context()["models"], "catalog": catalog}))
    assert bare.prices_env() == ""


@pytest.mark.parametrize(
    ("prices", "key", "says"),
    [
        ({"input": 0.1234567}, "model.prices.input", "more than 6 decimal places"),
        ({"output": -1}, "model.prices.output", ">= 0"),
        ({"as_of": "yesterday"}, "model.prices.as_of", "YYYY-MM-DD"),
        ({"currency": "EUR"}, "model.prices.currency", "is not a price"),
        ({"cache_write": None}, "model.prices.cache_write", "a dollar amount"),
    ],
)
def test_bad_prices_are_refused_at_synth_naming_the_key(
    prices: dict[str, Any], key: str, says: str
) -> None:
    shipped = cdk_json_context()["models"]["catalog"]["haiku"]["prices"]
    # one model without the registry: model.prices
    with pytest.raises(ConfigError) as error:
        load_config(_context(model=_model(prices={**shipped, **prices})))
    assert f"context key '{key}'" in str(error.value) and says in str(error.value)
    # a model of the registry: models.catalog.<name>.prices
    haiku = {**cdk_json_context()["models"]["catalog"]["haiku"], "prices": {**shipped, **prices}}
    with pytest.raises(ConfigError) as error:
        load_config(_context(models=_models(haiku=haiku)))
    key = key.replace("model.", "models.catalog.haiku.")
    assert f"context key '{key}'" in str(error.value) and says in str(error.value), error.value


def test_every_function_of_the_governor_gets_every_models_quota(prod_synth: Synthesized) -> None:
    worker = prod_synth.logical_id(prod_synth.stack.workers.worker.function)
    governed = {
        name: resource["Properties"]["Environment"]["Variables"]
        for name, resource in prod_synth.resources.items()
        if resource["Type"] == "AWS::Lambda::Function"
        and "MODELS" in resource["Properties"].get("Environment", {}).get("Variables", {})
    }
    assert worker in governed and len(governed) == 3  # the worker, the fan-out, the API
    for variables in governed.values():
        models = json.loads(variables["MODELS"])
        assert models["default"] == "haiku"
        haiku, sonnet = models["catalog"]["haiku"], models["catalog"]["sonnet"]
        assert (haiku["tpm"], haiku["share"], haiku["burndown"]) == (300_000, 0.95, 1.0)
        # Claude Sonnet 4: Bedrock's documented burndown, the default share
        assert (sonnet["tpm"], sonnet["share"], sonnet["burndown"]) == (200_000, 0.95, 5.0)


# -- models: the registry of the models units may name (docs/explanation/governor.md, "Models") ----


def _models(**catalog: Any) -> dict[str, Any]:
    shipped = cdk_json_context()["models"]
    return {**shipped, "catalog": {**shipped["catalog"], **catalog}}


def test_the_shipped_registry_has_a_default_and_each_models_own_quota() -> None:
    config = load_config(cdk_json_context())
    assert config.registry.default == "haiku" and set(config.registry.catalog) == {
        "haiku",
        "sonnet",
    }
    haiku, sonnet = config.governor_config("haiku"), config.governor_config("sonnet")
    assert (haiku.quota_tpm, haiku.output_burndown) == (300_000, 1.0)
    # Claude Sonnet 4, a cross-region inference profile: Bedrock's documented burndown of 5
    assert (sonnet.quota_tpm, sonnet.output_burndown) == (200_000, 5.0)
    assert haiku.share == sonnet.share == config.governor_share  # the top-level share


@pytest.mark.parametrize(
    ("context", "says"),
    [
        (
            {"models": {**cdk_json_context()["models"], "default": "opus"}},
            "'models': default: 'opus' is not in catalog (models: haiku, sonnet)",
        ),
        ({"models": _models(Opus={"model_id": "a.b", "tpm": 1})}, "'Opus' is not a model name"),
        (
            {
                "models": _models(
                    twin={"model_id": "anthropic.claude-3-5-haiku-20241022-v1:0", "tpm": 1_000}
                )
            },
            "catalog.twin.model_id: 'anthropic.claude-3-5-haiku-20241022-v1:0' is model 'haiku'",
        ),
        ({"models": _models(small={"model_id": "a.b"})}, "models.catalog.small.tpm"),
        (
            {"models": _models(small={"model_id": "a.b", "tpm": 10, "output_burndown": 0.5})},
            "models.catalog.small.output_burndown",
        ),
        (
            {"quota_tpm": 300_000, "models": cdk_json_context()["models"]},
            "'quota_tpm': with models",
        ),
        ({"models": None}, "quota_tpm is required without models"),
    ],
)
def test_a_bad_registry_is_refused_naming_the_key(context: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config({**cdk_json_context(), **context})
    assert says in str(error.value), str(error.value)


@pytest.mark.parametrize(
    ("models", "says"),
    [
        (["haiku", "opus"], "'tenants.defaults.models[1]': 'opus' is not a model of the registry"),
        (["sonnet"], "'tenants.defaults.models': must include the default model 'haiku'"),
        (["haiku", "haiku"], "'tenants.defaults.models': lists a model twice"),
    ],
)
def test_a_tenants_models_must_be_registered_and_include_the_default(
    models: list[str], says: str
) -> None:
    tenants = cdk_json_context()["tenants"]
    context = {
        **cdk_json_context(),
        "tenants": {**tenants, "defaults": {**tenants["defaults"], "models": models}},
    }
    with pytest.raises(ConfigError) as error:
        load_config(context)
    assert says in str(error.value), str(error.value)
    # and a tenant held to the default model reaches the API's limits
    context["tenants"]["defaults"]["models"] = ["haiku"]
    limits = json.loads(load_config(context).tenants.env_value())
    assert limits["defaults"]["models"] == ["haiku"]


# -- rpm: each model's request bucket (docs/explanation/governor.md, "Requests per minute") --------


def test_a_models_rpm_reaches_the_governor_and_is_off_when_absent() -> None:
    from infra.control_plane import _static_environment

    shipped = load_config(cdk_json_context())
    assert shipped.governor_config("haiku").rpm is None  # absent: requests not governed
    assert shipped.governor_config("sonnet").rpm == 200
    models = json.loads(_static_environment(shipped, "worker")["MODELS"])
    assert models["catalog"]["haiku"]["rpm"] is None and models["catalog"]["sonnet"]["rpm"] == 200
    # one model without the registry: quota_rpm
    config = load_config(_context(quota_rpm=1_000))
    assert config.governor_config(config.registry.default).rpm == 1_000


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (0, "greater than or equal to 1"),
        (1.5, "valid integer"),
        ("many", "valid integer"),
        (True, "valid integer"),
        # 1 x 0.95 holds less than one request above the low lane's reserve
        (1, "too few for one request"),
    ],
)
def test_a_bad_rpm_is_refused_naming_the_key(value: Any, says: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(_context(quota_rpm=value))
    assert "quota_rpm" in str(error.value) and says in str(error.value), str(error.value)
    sonnet = {**cdk_json_context()["models"]["catalog"]["sonnet"], "rpm": value}
    with pytest.raises(ConfigError) as error:
        load_config(_context(models=_models(sonnet=sonnet)))
    assert "models.catalog.sonnet.rpm" in str(error.value), str(error.value)
    assert says in str(error.value), str(error.value)


def test_a_tenant_cap_in_dollars_reaches_the_api_in_micro_dollars_and_needs_priced_models() -> None:
    # Given a tenant capped at $12.50 a batch (and no cap in tokens)
    context = _context(tenants=_tenants({"acme": {"max_budget_usd_per_batch": 12.5}}))
    # When the context is loaded
    doc = json.loads(load_config(context).tenants.env_value())
    # Then the API function's limits carry it exactly, in micro-dollars, for that tenant only
    assert doc["overrides"]["acme"]["max_budget_micro_per_batch"] == 12_500_000
    assert "max_budget_micro_per_batch" not in doc["defaults"]
    # A cap finer than a micro-dollar, or not above 0, fails naming the key
    for bad in (0.0000001, 0):
        with pytest.raises(ConfigError) as error:
            load_config(_context(tenants=_tenants(max_budget_usd_per_batch=bad)))
        assert "tenants.defaults.max_budget_usd_per_batch" in str(error.value)
    # Capped in dollars only, its budgets must be in dollars: a model without prices it may
    # use fails synth, naming the model's prices key
    catalog = cdk_json_context()["models"]["catalog"]
    unpriced = {
        "default": "haiku",
        "catalog": {
            **catalog,
            "sonnet": {k: v for k, v in catalog["sonnet"].items() if k != "prices"},
        },
    }
    with pytest.raises(ConfigError) as error:
        load_config(_context(models=unpriced, tenants=_tenants(max_budget_usd_per_batch=100)))
    message = str(error.value)
    assert "tenants.defaults.max_budget_usd_per_batch" in message, message
    assert "models.catalog.sonnet.prices" in message, message
    # ... unless the tenant also has a cap in tokens, or may not use that model
    load_config(
        _context(
            models=unpriced,
            tenants=_tenants(max_budget_usd_per_batch=100, max_budget_per_batch=10**6),
        )
    )
    load_config(
        _context(models=unpriced, tenants=_tenants(max_budget_usd_per_batch=100, models=["haiku"]))
    )
