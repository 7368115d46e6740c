"""The handlers' Logger runs at the configured level under Lambda's INFO filter, and the metric
lines (EMF) are printed whatever that level (issue 32, point 7)."""

from __future__ import annotations

import json
import logging

import pytest
from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from functions import service_logger


def test_configured_level_wins_over_lambdas_filter_level(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given Lambda's filter at INFO (it sets AWS_LAMBDA_LOG_LEVEL, which Powertools prefers)
    monkeypatch.setenv("AWS_LAMBDA_LOG_LEVEL", "INFO")
    monkeypatch.setenv("POWERTOOLS_LOG_LEVEL", "ERROR")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "swarm-test-logger")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "SwarmTest")
    logger = service_logger()
    # Then the Logger drops INFO and WARNING lines and keeps ERROR ones
    assert logging.getLogger(logger.name).level == logging.ERROR
    logger.refresh_sample_rate_calculation()  # what a warm, sampled invocation does first
    assert logging.getLogger(logger.name).level == logging.ERROR
    logger.info("an info line")
    logger.warning("a warning line")
    logger.error("an error line")
    # And a metric flushed meanwhile is printed all the same (EMF: a line without a level)
    metrics = Metrics()
    metrics.add_metric(name="UnitsCompleted", unit=MetricUnit.Count, value=1)
    metrics.flush_metrics()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    messages = [line.get("message") for line in lines]
    assert "an info line" not in messages
    assert "a warning line" not in messages
    assert "an error line" in messages
    emf = [line for line in lines if "_aws" in line]
    assert len(emf) == 1 and emf[0]["UnitsCompleted"] == [1.0]
    assert "level" not in emf[0]  # what Lambda's filter counts as INFO


def test_without_a_configured_level_powertools_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POWERTOOLS_LOG_LEVEL", raising=False)
    monkeypatch.setenv("AWS_LAMBDA_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "swarm-test-logger-2")
    logger = service_logger()
    assert logging.getLogger(logger.name).level == logging.DEBUG
