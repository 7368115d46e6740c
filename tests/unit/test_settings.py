"""One settings model per function: exactly the variables the contract gives it, each required
unless optional, and a clear error for a missing, malformed or unconfigured variable."""

from __future__ import annotations

import json
from typing import Any

import pytest

from swarm import contract as env
from swarm.contract import FUNCTION_ENV, FUNCTIONS, OPTIONAL_VARS, FunctionName
from swarm.core.pricing import Prices, prices_table_to_env
from swarm.core.records import Lane
from swarm.core.tenancy import TenantLimits, TenantPolicy
from swarm.settings import (
    FUNCTION_SETTINGS,
    ApiSettings,
    FanoutSettings,
    Settings,
    SettingsError,
    WorkerSettings,
    variables,
)
from swarm.wiring import Wiring

VALUES = {
    env.STAGE: "dev",
    env.POWERTOOLS_LOG_LEVEL: "INFO",
    env.STATE_MACHINE_ARN: "arn:aws:states:us-east-1:123456789012:stateMachine:fanout",
    env.MODELS: json.dumps(
        {
            "default": "haiku",
            "catalog": {
                "haiku": {
                    "model_id": "anthropic.claude-test",
                    "tpm": 300000,
                    "share": 0.95,
                    "burndown": 1.0,
                },
                "sonnet": {
                    "model_id": "us.anthropic.claude-sonnet-4-test",
                    "tpm": 200000,
                    "share": 0.9,
                    "burndown": 5.0,
                },
            },
        }
    ),
    env.GOVERNOR_MAX_WAIT_SECONDS: "20",
    env.LEASE_SECONDS: "720",
    env.APPROVAL_TIMEOUT_SECONDS: "86400",
    env.BUNDLE_WINDOW_SECONDS: "10",
    env.BUNDLE_UNITS: "5",
    env.BUNDLE_STRETCH: "0.1",
    env.BUNDLE_MAX_WINDOW_SECONDS: "45",
    env.MAX_ATTEMPTS: "3",
    env.MAX_BUDGET_TOKENS: "1000000000",
    env.DEFAULT_BUDGET_TOKENS: "6000000",
    env.RESULTS_URL_SECONDS: "300",
    env.UPLOAD_URL_SECONDS: "300",
    env.UNITS_PER_CHILD: "100",
    env.OPERATOR_PRINCIPAL_PREFIX: "swarm-operator-",
    env.SWEEP_INTERVAL_SECONDS: "900",
    env.MODEL_ADAPTER: "simulated",
    env.SIM_MODEL_QUOTA_TPM: "300000",
    env.SIM_MODEL_FAILURE_RATE: "0.04",
    env.SIM_MODEL_SEED: "7",
}


def environment(function: FunctionName) -> dict[str, str]:
    """The function's environment as the stack sets it, optional variables left empty."""
    values: dict[str, str] = {}
    for name in FUNCTION_ENV[function]:
        if name in OPTIONAL_VARS:
            values[name] = ""
        elif name.startswith("LANE_RESERVE_"):
            values[name] = "0.1"
        elif name.startswith("SHED_DEPTH_"):
            values[name] = "1000"
        else:
            values[name] = VALUES.get(name, f"value-of-{name.lower()}")
    values[env.SWARM_FUNCTION] = function
    return values


def test_every_function_has_a_model() -> None:
    assert set(FUNCTION_SETTINGS) == set(FUNCTIONS)


@pytest.mark.parametrize("function", FUNCTIONS)
def test_each_model_reads_exactly_its_functions_variables(function: FunctionName) -> None:
    model = FUNCTION_SETTINGS[function]
    assert len(set(FUNCTION_ENV[function])) == len(FUNCTION_ENV[function])
    assert variables(model) == set(FUNCTION_ENV[function])
    # every one required, but for the optional ones
    for name, field in model.model_fields.items():
        assert field.is_required() == (field.alias not in OPTIONAL_VARS), name


@pytest.mark.parametrize("function", FUNCTIONS)
def test_from_env_builds_the_named_functions_model(function: FunctionName) -> None:
    settings = Settings.from_env(environment(function))
    assert type(settings) is FUNCTION_SETTINGS[function]
    assert settings.function == function
    assert type(FUNCTION_SETTINGS[function].from_env(environment(function))) is type(settings)


def test_a_functions_model_refuses_another_functions_environment() -> None:
    with pytest.raises(SettingsError, match="SWARM_FUNCTION='fanout'"):
        WorkerSettings.from_env(environment("fanout"))


def test_missing_and_malformed_variables_are_named() -> None:
    with pytest.raises(SettingsError, match="not a function name"):
        Settings.from_env({env.SWARM_FUNCTION: "cron"})
    missing = environment("worker") | {env.LEASE_SECONDS: ""}
    with pytest.raises(SettingsError, match="for the worker function: LEASE_SECONDS"):
        Settings.from_env(missing)
    with pytest.raises(SettingsError, match="MODELS='lots'"):
        Settings.from_env(environment("api") | {env.MODELS: "lots"})
    unknown = json.dumps({"default": "opus", "catalog": json.loads(VALUES[env.MODELS])["catalog"]})
    with pytest.raises(SettingsError, match="default 'opus' is not in the catalog"):
        Settings.from_env(environment("api") | {env.MODELS: unknown})


def test_optional_variables_left_empty_are_unset() -> None:
    api = ApiSettings.from_env(environment("api"))
    assert api.governor_capacity is None
    assert api.governor_config().capacity is None
    sized = ApiSettings.from_env(environment("api") | {env.GOVERNOR_CAPACITY: "500000"})
    assert sized.governor_config().capacity == 500_000


def test_the_api_reads_every_tenants_limits_and_names_a_bad_value() -> None:
    # Given the tenants' limits as synth resolves them (one tenant named apart)
    doc = {
        "defaults": {
            "lanes": ["normal", "low"],
            "max_queued_units": 500,
            "guaranteed_units": 50,
            "max_budget_per_batch": None,
        },
        "overrides": {
            "vip": {
                "lanes": ["high"],
                "max_queued_units": None,
                "guaranteed_units": 0,
                "max_budget_per_batch": 10,
            }
        },
    }
    # When the API function reads its environment
    api = ApiSettings.from_env(environment("api") | {env.TENANT_LIMITS: json.dumps(doc)})
    # Then each tenant gets its limits, and every other tenant the defaults
    policy = api.tenant_policy()
    assert policy.of("vip") == TenantLimits(frozenset({Lane.HIGH}), None, 0, 10)
    assert policy.of("anyone") == TenantLimits(frozenset({Lane.NORMAL, Lane.LOW}), 500, 50, None)
    # and unset (empty), no tenant has limits of its own
    assert ApiSettings.from_env(environment("api")).tenant_policy() == TenantPolicy()
    # and a malformed value fails the cold start naming the variable
    with pytest.raises(SettingsError, match="TENANT_LIMITS"):
        ApiSettings.from_env(environment("api") | {env.TENANT_LIMITS: '{"defaults": {}}'})


def _wiring(function: FunctionName) -> Wiring:
    def clients(service: str) -> Any:
        return object()

    return Wiring(Settings.from_env(environment(function)), clients)


def test_the_wiring_names_what_a_function_was_not_given() -> None:
    fanout = _wiring("fanout")
    assert isinstance(fanout.settings, FanoutSettings)
    with pytest.raises(SettingsError, match=r"the fanout function has no .*MODEL_ADAPTER"):
        fanout.model()
    with pytest.raises(SettingsError, match="the fanout function has no EVENT_BUS_NAME"):
        fanout.events()
    with pytest.raises(SettingsError, match="the dlq function has no QUEUE_URL_HIGH"):
        _wiring("dlq").lanes()
    with pytest.raises(SettingsError, match=r"the worker function has no .*SHED_DEPTH_HIGH"):
        _wiring("worker").batches()
    assert _wiring("api").settings_as(ApiSettings).tenant_principal_prefix


def test_each_model_has_its_own_governor_config_and_a_bad_burndown_is_named() -> None:
    worker = WorkerSettings.from_env(environment("worker"))
    haiku = worker.governor_config()  # the default model's
    assert (haiku.quota_tpm, haiku.share, haiku.output_burndown) == (300000, 0.95, 1.0)
    sonnet = ApiSettings.from_env(environment("api")).governor_config("sonnet")
    assert (sonnet.quota_tpm, sonnet.share, sonnet.output_burndown) == (200000, 0.9, 5.0)
    bad = json.loads(VALUES[env.MODELS])
    bad["catalog"]["sonnet"]["burndown"] = 0.5
    with pytest.raises(SettingsError, match=r"MODELS.*burndown.*greater than or equal to 1"):
        Settings.from_env(environment("worker") | {env.MODELS: json.dumps(bad)})


def test_a_models_rpm_reaches_its_governors_config_and_its_buckets_name() -> None:
    from swarm.wiring import governor_name

    worker = WorkerSettings.from_env(environment("worker"))
    config = worker.governor_config()
    assert config.rpm is None  # absent: no request bucket, the bucket's name without one
    assert governor_name(config, "haiku") == "haiku-q300000-s0.95-c300000"
    models = json.loads(VALUES[env.MODELS])
    models["catalog"]["haiku"]["rpm"] = 1000
    given = WorkerSettings.from_env(environment("worker") | {env.MODELS: json.dumps(models)})
    assert given.governor_config().rpm == 1_000
    assert governor_name(given.governor_config(), "haiku") == "haiku-q300000-s0.95-c300000-r1000"
    models["catalog"]["haiku"]["rpm"] = 0
    with pytest.raises(SettingsError, match=r"MODELS.*rpm.*greater than or equal to 1"):
        Settings.from_env(environment("worker") | {env.MODELS: json.dumps(models)})


def test_the_prices_reach_the_wiring_in_one_place_and_a_bad_table_is_named() -> None:
    prices = Prices.parse(
        {"as_of": "2026-12-06", "input": 0.8, "output": 4, "cache_read": 0.08, "cache_write": 1}
    )
    table = prices_table_to_env({"sonnet": prices})
    for function in ("worker", "api"):
        settings = Settings.from_env(environment(function) | {env.MODEL_PRICES: table})
        assert Wiring(settings, lambda service: object()).prices() == {"sonnet": prices}
    # empty: no model has prices (spend in tokens only)
    assert _wiring("worker").prices() == {}
    # a function without prices in its environment is told so
    with pytest.raises(SettingsError, match="MODEL_PRICES"):
        _wiring("fanout").prices()
    with pytest.raises(SettingsError, match="MODEL_PRICES is not a price table"):
        Settings.from_env(environment("worker") | {env.MODEL_PRICES: '{"default": {"input": 1}}'})


def test_the_api_reads_each_tools_deciders_else_the_deployments() -> None:
    settings = ApiSettings.model_construct(
        approval_deciders="swarm-operator-approver",
        approval_tool_deciders="calculator=swarm-operator-legal;notes_write,pay=a-b,c=d",
    )
    assert settings.deciders_of("calculator") == {"swarm-operator-legal"}
    assert settings.deciders_of("pay") == {"a-b", "c=d"}  # a role name may hold "="
    assert settings.deciders_of("notes_read") == {"swarm-operator-approver"}
    assert settings.tool_deciders("notes_read") == frozenset()
    nobody = ApiSettings.model_construct(approval_deciders="", approval_tool_deciders="")
    assert nobody.deciders_of("notes_write") == frozenset()  # the batch's tenant
