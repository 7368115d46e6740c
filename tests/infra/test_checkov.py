"""checkov on the synthesized templates, as cdk-nag runs on every synth: no failing check, and
every check skipped on a resource (infra/checkov.py) says why (issue 32, point 12c)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra.constants import ROOT
from tests.infra.conftest import Synthesized

#: installed by `make setup` in a venv of its own (its pins conflict with the project's)
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"


def _checkov(template: Path) -> dict[str, Any]:
    assert CHECKOV.exists(), f"{CHECKOV.relative_to(ROOT)} is missing: run `make setup`"
    result = subprocess.run(
        [
            str(CHECKOV),
            "--framework",
            "cloudformation",
            "--file",
            str(template),
            "--output",
            "json",
            "--compact",
            "--skip-download",  # offline: no Prisma Cloud guideline mapping
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": ""},
    )
    # exit 1: failed checks (reported below); anything else but 0 is checkov itself failing
    assert result.returncode in (0, 1), result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert isinstance(report, dict), report  # one framework, one report
    return report


@pytest.fixture(scope="module")
def reports(synth: Synthesized, prod_synth: Synthesized) -> list[dict[str, Any]]:
    return [
        _checkov(synthesized.outdir / f"{synthesized.stack.stack_name}.template.json")
        for synthesized in (synth, prod_synth)
    ]


def test_checkov_finds_no_failing_check(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        failed = [
            (f["check_id"], f["resource"], f["check_name"])
            for f in report["results"]["failed_checks"]
        ]
        assert failed == []
        assert report["summary"]["parsing_errors"] == 0
        assert report["summary"]["passed"] > 100  # it did read the template's resources


def test_every_skipped_check_has_its_own_reason(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        skipped = report["results"]["skipped_checks"]
        assert skipped, "no acknowledgment reached checkov (Metadata: checkov: skip)"
        reasons = {check["check_result"]["suppress_comment"] for check in skipped}
        for reason in reasons:
            assert len(reason) >= 80, reason
        assert len(reasons) >= 15  # a reason per check and function, not one blanket excuse


def test_a_check_without_a_reason_fails(synth: Synthesized, tmp_path: Path) -> None:
    """The run above could pass by not seeing the resources: without the acknowledgments the
    same template fails exactly on the checks infra/checkov.py skips."""
    template = json.loads((synth.outdir / f"{synth.stack.stack_name}.template.json").read_text())
    acknowledged: set[tuple[str, str]] = set()
    for logical_id, resource in template["Resources"].items():
        metadata = resource.get("Metadata", {})
        for entry in metadata.pop("checkov", {}).get("skip", []):
            acknowledged.add((entry["id"], logical_id))
    bare = tmp_path / "bare.template.json"
    bare.write_text(json.dumps(template))
    report = _checkov(bare)
    failed = {
        (f["check_id"], f["resource"].split(".", 1)[1]) for f in report["results"]["failed_checks"]
    }
    assert failed == acknowledged
