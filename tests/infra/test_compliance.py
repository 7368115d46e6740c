"""cdk-nag, cfn-lint, alarms: the template a careful AWS engineer would sign off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
        "ApproximateNumberOfMessagesVisible",  # DLQ depth
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
    dlq_alarms = [
        a
        for a in alarms.values()
        if a["Properties"].get("MetricName") == "ApproximateNumberOfMessagesVisible"
    ]
    assert len(dlq_alarms) == 3
    assert all(a["Properties"]["Threshold"] == 1 for a in dlq_alarms)
    assert len(synth.of_type("AWS::CloudWatch::Dashboard")) == 1
    topic_props = synth.resources[topic]["Properties"]
    assert "KmsMasterKeyId" in topic_props
