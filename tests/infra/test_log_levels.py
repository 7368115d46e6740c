"""A log level cannot silence the alarms: Lambda's filter keeps the metric (EMF) lines, and the
configured level still reaches the handlers' Logger (issue 32, point 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.context import cdk_json_context
from swarm import contract as env
from tests.infra.conftest import Synthesized, synthesize

#: Lambda's application log levels, most detailed first: a filter at one of these keeps every
#: line at it and below (docs: "Log-level filtering"); a line without a level counts as INFO
LAMBDA_LEVELS = ["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"]


def _keeps_info(level: str) -> bool:
    return LAMBDA_LEVELS.index(level) <= LAMBDA_LEVELS.index("INFO")


def _functions(synthesized: Synthesized) -> dict[str, dict[str, object]]:
    functions = {
        k: v["Properties"]
        for k, v in synthesized.of_type("AWS::Lambda::Function").items()
        if env.SWARM_FUNCTION in v["Properties"].get("Environment", {}).get("Variables", {})
    }
    assert len(functions) == 7
    return functions


@pytest.fixture(scope="module")
def error_synth(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """The quietest level config allows: the one that used to drop every metric line."""
    observability = {**cdk_json_context()["observability"], "log_level": "ERROR"}
    return synthesize(
        Path(tmp_path_factory.mktemp("cdk-error")), {"observability": observability}, nag=False
    )


def test_lambda_filter_keeps_metrics_at_the_quietest_level(error_synth: Synthesized) -> None:
    # Given observability.log_level ERROR
    for name, props in _functions(error_synth).items():
        logging = props["LoggingConfig"]
        assert isinstance(logging, dict)
        # Then Lambda's filter still passes INFO, the level it gives Powertools' EMF lines
        assert logging["LogFormat"] == "JSON", name
        assert _keeps_info(logging.get("ApplicationLogLevel", "INFO")), (name, logging)
        # And the configured level reaches the Logger (functions.service_logger applies it)
        variables = props["Environment"]["Variables"]  # type: ignore[index]
        assert variables[env.POWERTOOLS_LOG_LEVEL] == "ERROR", name


def test_default_stage_keeps_metrics_too(synth: Synthesized) -> None:
    configured = synth.config.observability.log_level
    for name, props in _functions(synth).items():
        logging = props["LoggingConfig"]
        assert isinstance(logging, dict)
        assert _keeps_info(logging.get("ApplicationLogLevel", "INFO")), (name, logging)
        variables = props["Environment"]["Variables"]  # type: ignore[index]
        assert variables[env.POWERTOOLS_LOG_LEVEL] == configured, name


@pytest.mark.parametrize(
    ("configured", "lambda_level"),
    [("DEBUG", "DEBUG"), ("INFO", "INFO"), ("WARNING", "INFO"), ("ERROR", "INFO")],
)
def test_lambda_filter_is_never_above_info(configured: str, lambda_level: str) -> None:
    from infra.functions import lambda_log_level

    # DEBUG passes debug lines; every other level filters at INFO, which keeps the metrics
    assert lambda_log_level(configured).value == lambda_level
