"""The local stack runs the deployed system on a faster clock: every timer follows the scale."""

from __future__ import annotations

from typing import Any

import pytest

from swarm.adapters.aws import SqsLanes, SsmDrainSwitch
from swarm.contract import FUNCTION_ENV, OPTIONAL_VARS
from swarm.core.backpressure import ShedPolicy
from swarm.core.governor import GovernorConfig
from swarm.core.ports import MAX_SQS_VISIBILITY_S, requeue_delay, sqs_seconds
from swarm.service.worker import WorkerTimings
from swarm.settings import Settings
from swarm.wiring import QUEUE_LEASE_S, Wiring

VALUES = {
    "SWARM_FUNCTION": "worker",
    "STAGE": "dev",
    "STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:fanout",
    "MODELS": '{"default":"m","catalog":{"m":{"model_id":"m","tpm":300000,"share":0.95,'
    '"burndown":1}}}',
    "GOVERNOR_MAX_WAIT_SECONDS": "20",
    "LEASE_SECONDS": "720",
    "BUNDLE_WINDOW_SECONDS": "10",
    "BUNDLE_UNITS": "5",
    "BUNDLE_STRETCH": "0.1",
    "BUNDLE_MAX_WINDOW_SECONDS": "45",
    "MAX_ATTEMPTS": "3",
    "MAX_BUDGET_TOKENS": "1000000000",
    "DEFAULT_BUDGET_TOKENS": "6000000",
    "RESULTS_URL_SECONDS": "300",
    "UPLOAD_URL_SECONDS": "300",
    "UNITS_PER_CHILD": "100",
    "OPERATOR_PRINCIPAL_PREFIX": "swarm-operator-",
    "MODEL_ADAPTER": "simulated",
    "SIM_MODEL_QUOTA_TPM": "300000",
    "SIM_MODEL_FAILURE_RATE": "0.04",
    "SIM_MODEL_SEED": "7",
    "POWERTOOLS_LOG_LEVEL": "INFO",
}


def settings(function: str) -> Settings:
    env = {}
    for name in FUNCTION_ENV[function]:  # type: ignore[index]
        if name in OPTIONAL_VARS:
            continue
        if name.startswith(("LANE_RESERVE_",)):
            env[name] = "0.1"
        elif name.startswith("SHED_DEPTH_"):
            env[name] = "1000"
        else:
            env[name] = VALUES.get(name, f"value-{name.lower()}")
    env["SWARM_FUNCTION"] = function
    return Settings.from_env(env)


class NoClients:
    def __call__(self, service: str) -> Any:
        return object()


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_every_timer_of_the_worker_follows_the_time_scale(scale: float) -> None:
    # Given the worker's wiring on a clock `scale` times faster
    runtime = Wiring(settings("worker"), NoClients(), time_scale=scale)

    # When its services are built
    worker = runtime.worker()
    governor = runtime.governor_config()
    default = GovernorConfig(quota_tpm=300_000)

    # Then every duration is the deployed one divided by the scale (rates multiplied)
    assert worker.config.lease_s == 720 / scale
    assert worker.config.max_wait_s == 20 / scale
    assert worker.config.retry_backoff_s == WorkerTimings.retry_backoff_s / scale
    assert worker.config.requeue_delay_s == WorkerTimings.requeue_delay_s / scale
    # the bundles' windows too (the stretch is a fraction of a unit's wait: unscaled)
    bundling = runtime.bundling()
    assert (bundling.window_s, bundling.max_window_s) == (10 / scale, 45 / scale)
    assert (bundling.max_units, bundling.stretch) == (5, 0.1)
    assert governor.throttle_cooldown_s == default.throttle_cooldown_s / scale
    assert governor.recovery_per_s == default.recovery_per_s * scale
    drain = runtime.drain_switch()
    assert isinstance(drain, SsmDrainSwitch) and drain.ttl_s == SsmDrainSwitch.ttl_s / scale
    # and the quota itself is untouched here (the local context scales it in the template)
    assert governor.quota_tpm == 300_000


def test_the_api_sheds_on_the_scaled_throttle_window_and_fan_out_leases_follow() -> None:
    api = Wiring(settings("api"), NoClients(), time_scale=10.0)
    assert api.batches().config.shed_policy.throttle_window_s == ShedPolicy.throttle_window_s / 10
    fanout = Wiring(settings("fanout"), NoClients(), time_scale=10.0)
    assert fanout.fanout().queue_lease_s == QUEUE_LEASE_S / 10


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_the_lanes_round_their_callers_durations_up_to_whole_sqs_seconds(scale: float) -> None:
    # Given the worker's lanes on a clock `scale` times faster than SQS's
    lanes = Wiring(settings("worker"), NoClients(), time_scale=scale).lanes()
    assert isinstance(lanes, SqsLanes) and lanes.time_scale == scale
    # Then a duration on that clock is rounded up to whole SQS seconds on AWS's: a quarter of
    # a deployed second waits one, 2.5 deployed seconds three, never more than SQS takes
    for deployed, sqs in [(0.25, 1), (1.0, 1), (2.5, 3), (42.3, 43), (900.0, 900), (5_000.0, 900)]:
        assert sqs_seconds(deployed / scale, scale) == sqs
    assert sqs_seconds(0.0, scale) == 0 and sqs_seconds(-1.0, scale) == 0  # no delay
    # a requeue is never undelayed: at least one SQS second
    assert sqs_seconds(requeue_delay(0.0), scale) == 1
    assert sqs_seconds(50_000.0, scale, MAX_SQS_VISIBILITY_S) == MAX_SQS_VISIBILITY_S
