"""cdk-nag, cfn-lint, alarms: the template a careful AWS engineer would sign off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from swarm import contract as env
from swarm.contract import DLQ, METRIC_UNITS_DEAD_LETTERED, WORKER
from tests.infra.conftest import Synthesized


def test_cdk_nag_has_no_unacknowledged_findings(synth: Synthesized) -> None:
    # Given the validation report of a synthesis with AwsSolutionsChecks (it would have raised)
    report = json.loads((synth.outdir / "validation-report.json").read_text())
    (nag,) = report["pluginReports"]
    assert nag["pluginName"] == "AwsSolutions"
    # Then nothing is left: no errors, no warnings
    assert nag["conclusion"] == "success"
    assert nag["violations"] == []
    # And every acknowledgment is specific: a construct below the stack, a real reason
    for suppressed in nag["suppressedViolations"]:
        assert suppressed["acknowledgedAt"].count("/") >= 1, suppressed["acknowledgedAt"]
        assert len(suppressed["reason"]) >= 60, suppressed
    reasons = [s["reason"] for s in nag["suppressedViolations"]]
    assert len(set(reasons)) >= 8  # distinct reasons, not one blanket excuse


def test_production_stage_is_nag_clean_too(prod_synth: Synthesized) -> None:
    report = json.loads((prod_synth.outdir / "validation-report.json").read_text())
    assert report["pluginReports"][0]["conclusion"] == "success"


def _acknowledged(synth: Synthesized) -> set[tuple[str, str]]:
    """Every acknowledgment infra/nag.py registered: (construct path, finding id)."""
    metadata = json.loads((synth.outdir / f"{synth.stack.stack_name}.metadata.json").read_text())
    return {
        (path.lstrip("/"), finding)
        for path, entries in metadata.items()
        for entry in entries
        if entry["type"] == "aws:cdk:acknowledged-rules"
        for finding in entry["data"]
    }


def test_no_acknowledgment_outlives_its_finding(
    synth: Synthesized, prod_synth: Synthesized
) -> None:
    """A grant removed leaves no stale acknowledgment (with a reason that is no longer true)."""
    for synthesized in (synth, prod_synth):
        report = json.loads((synthesized.outdir / "validation-report.json").read_text())
        (nag,) = report["pluginReports"]
        used = {(s["acknowledgedAt"], s["acknowledgedId"]) for s in nag["suppressedViolations"]}
        assert _acknowledged(synthesized) == used


def _cfn_lint(*templates: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "cfn-lint"),
            "--non-zero-exit-code",
            "error",
            "--",
            *(str(t) for t in templates),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_cfn_lint_finds_no_errors(synth: Synthesized, prod_synth: Synthesized) -> None:
    templates = [*synth.outdir.glob("*.template.json"), *prod_synth.outdir.glob("*.template.json")]
    assert len(templates) == 2
    result = _cfn_lint(*templates)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alarms_cover_the_failure_modes(synth: Synthesized) -> None:
    alarms = synth.of_type("AWS::CloudWatch::Alarm")
    metrics = {a["Properties"].get("MetricName") for a in alarms.values()}
    assert {
        METRIC_UNITS_DEAD_LETTERED,
        "RunsExhausted",
        "GovernorSaturation",
        "ModelThrottles",
        "5XXError",
        "ExecutionsFailed",
    } <= metrics
    topic = synth.logical_id(synth.stack.observability.topic)
    for alarm in alarms.values():
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic}]
        assert alarm["Properties"]["TreatMissingData"] == "notBreaching"
    assert len(synth.of_type("AWS::CloudWatch::Dashboard")) == 1
    topic_props = synth.resources[topic]["Properties"]
    assert "KmsMasterKeyId" in topic_props


def _alarms_on(synth: Synthesized, metric_name: str) -> list[dict[str, Any]]:
    return [
        a["Properties"]
        for a in synth.of_type("AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("MetricName") == metric_name
    ]


def test_dead_letters_alarm_on_what_the_handlers_record(synth: Synthesized) -> None:
    """The dead-letter handler empties the DLQ within seconds, so its depth never shows a
    dead letter; it (and the worker, when attempts run out) records UnitsDeadLettered instead."""
    # Given the alarm on the metric both emit with Powertools (EMF)
    (alarm,) = _alarms_on(synth, METRIC_UNITS_DEAD_LETTERED)
    # Then it watches exactly what Powertools publishes: namespace POWERTOOLS_METRICS_NAMESPACE
    # and the single dimension "service" = POWERTOOLS_SERVICE_NAME, as each emitter is configured
    for name in (DLQ, WORKER):
        function = synth.stack.functions[name].function
        variables = synth.resources[synth.logical_id(function)]["Properties"]["Environment"][
            "Variables"
        ]
        assert alarm["Namespace"] == variables[env.POWERTOOLS_METRICS_NAMESPACE]
        assert alarm["Dimensions"] == [
            {"Name": "service", "Value": variables[env.POWERTOOLS_SERVICE_NAME]}
        ]
    # And one dead letter in a period pages
    assert alarm["Statistic"] == "Sum"
    assert alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    # And no alarm watches a queue depth the handler keeps at zero
    assert not _alarms_on(synth, "ApproximateNumberOfMessagesVisible")


def test_dead_letter_handler_failures_alarm(synth: Synthesized) -> None:
    """If the handler itself fails, dead letters are neither settled nor counted: page on it."""
    dlq = synth.logical_id(synth.stack.workers.dead_letters.function)
    (alarm,) = [
        a
        for a in _alarms_on(synth, "Errors")
        if a["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": dlq}}]
    ]
    assert alarm["Namespace"] == "AWS/Lambda"
    assert alarm["Threshold"] == 1


def test_powertools_publishes_the_alarmed_metric_as_the_alarm_expects(
    synth: Synthesized, capsys: pytest.CaptureFixture[str]
) -> None:
    """The EMF document the dead-letter handler's Metrics() prints, with its environment."""
    from aws_lambda_powertools import Metrics
    from aws_lambda_powertools.metrics import MetricUnit

    (alarm,) = _alarms_on(synth, METRIC_UNITS_DEAD_LETTERED)
    service = alarm["Dimensions"][0]["Value"]
    metrics = Metrics(namespace=alarm["Namespace"], service=service)
    # Powertools keeps the metric set at class level: a handler test run earlier in this process
    # may have left metrics in it (seen under xdist)
    metrics.clear_metrics()
    metrics.add_metric(METRIC_UNITS_DEAD_LETTERED, MetricUnit.Count, 1)
    metrics.flush_metrics()
    document = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (directive,) = document["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == alarm["Namespace"]
    assert directive["Dimensions"] == [["service"]]
    assert document["service"] == service
    assert [m["Name"] for m in directive["Metrics"]] == [METRIC_UNITS_DEAD_LETTERED]
