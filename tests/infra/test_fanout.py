"""The fan-out state machine: Distributed Map over the S3 manifest, loaded from the ASL file."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra.constants import FANOUT_ASL, ROOT
from infra.fanout import definition_substitutions
from infra.local_definition import local_definitions
from tests.infra.conftest import Synthesized
from tests.infra.helpers import arn

ASL_VALIDATOR = ROOT / "node_modules" / ".bin" / "asl-validator"
PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9]+)\}")


def _substituted(synth: Synthesized) -> dict[str, Any]:
    """The ASL as Step Functions will see it, with plain strings for the tokens."""
    substitutions = definition_substitutions(
        config=synth.config,
        bucket_name="swarm-batches-bucket",
        fanout_arn="arn:aws:lambda:us-east-1:123456789012:function:swarm-fanout",
        finalizer_arn="arn:aws:lambda:us-east-1:123456789012:function:swarm-finalizer",
    )
    text = PLACEHOLDER.sub(lambda m: substitutions[m.group(1)], FANOUT_ASL.read_text())
    definition: dict[str, Any] = json.loads(text)
    return definition


def _state_machine(synth: Synthesized) -> dict[str, Any]:
    props: dict[str, Any] = synth.resources[synth.logical_id(synth.stack.fanout.state_machine)][
        "Properties"
    ]
    return props


def test_definition_comes_from_the_asl_file_with_every_placeholder_substituted(
    synth: Synthesized,
) -> None:
    props = _state_machine(synth)
    placeholders = set(PLACEHOLDER.findall(FANOUT_ASL.read_text()))
    assert set(props["DefinitionSubstitutions"]) == placeholders
    subs = props["DefinitionSubstitutions"]
    assert subs["FanoutFunctionArn"] == arn(synth, synth.stack.fanout.admit.function)
    assert subs["FinalizerFunctionArn"] == arn(synth, synth.stack.fanout.finalizer.function)
    assert subs["BucketName"] == {"Ref": synth.logical_id(synth.stack.storage.bucket)}
    assert subs["MaxConcurrency"] == str(synth.config.fanout.max_concurrency)
    # The definition itself is the file, shipped as an asset
    assert "DefinitionS3Location" in props or "DefinitionString" in props


def test_distributed_map_reads_the_manifest_and_writes_results(synth: Synthesized) -> None:
    fan_out = _substituted(synth)["States"]["FanOut"]
    assert fan_out["Type"] == "Map"
    assert fan_out["ItemProcessor"]["ProcessorConfig"]["Mode"] == "DISTRIBUTED"
    assert fan_out["ItemProcessor"]["ProcessorConfig"]["ExecutionType"] == "EXPRESS"
    assert fan_out["ItemReader"]["Resource"] == "arn:aws:states:::s3:getObject"
    assert fan_out["ItemReader"]["ReaderConfig"] == {"InputType": "JSON"}
    assert fan_out["ItemReader"]["Parameters"]["Key.$"] == "$.manifest_key"
    assert fan_out["MaxConcurrency"] == synth.config.fanout.max_concurrency
    assert fan_out["ToleratedFailurePercentage"] == synth.config.fanout.tolerated_failure_percentage
    assert fan_out["ResultWriter"]["Resource"] == "arn:aws:states:::s3:putObject"
    assert fan_out["ResultWriter"]["Parameters"]["Prefix"] == "results/"
    assert "ItemBatcher" not in fan_out  # moto rejects it; one unit per admission anyway
    item = fan_out["ItemProcessor"]["States"]["AdmitAndEnqueue"]
    assert item["Resource"] == "arn:aws:states:::lambda:invoke"
    assert fan_out["Next"] == "Finalize"


def test_state_machine_logs_all_and_traces(synth: Synthesized) -> None:
    props = _state_machine(synth)
    assert props["StateMachineType"] == "STANDARD"
    assert props["TracingConfiguration"] == {"Enabled": True}
    assert props["LoggingConfiguration"]["Level"] == "ALL"
    assert props["LoggingConfiguration"]["IncludeExecutionData"] is False


def test_asl_passes_asl_validator(synth: Synthesized, tmp_path: Path) -> None:
    if not ASL_VALIDATOR.exists():
        pytest.skip("node_modules not installed (npm ci)")
    path = tmp_path / "fanout.asl.json"
    path.write_text(json.dumps(_substituted(synth)))
    result = subprocess.run(
        [str(ASL_VALIDATOR), "--json-path", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_asl_validator_catches_a_broken_map(synth: Synthesized, tmp_path: Path) -> None:
    """The validator is not a rubber stamp: an out-of-range percentage fails."""
    if not ASL_VALIDATOR.exists():
        pytest.skip("node_modules not installed (npm ci)")
    definition = _substituted(synth)
    definition["States"]["FanOut"]["ToleratedFailurePercentage"] = 101
    path = tmp_path / "broken.asl.json"
    path.write_text(json.dumps(definition))
    result = subprocess.run(
        [str(ASL_VALIDATOR), "--json-path", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode != 0


def test_local_definition_for_moto(synth: Synthesized) -> None:
    # Given a resolver standing in for the deployed stack's physical values
    def resolve(value: Any) -> str:
        text = json.dumps(value)
        if "Storage" in text:
            return "local-bucket"
        return f"arn:aws:lambda:us-east-1:123456789012:function:{abs(hash(text))}"

    # When the local runtime builds the definition moto can run
    (definition,) = local_definitions(synth.template, synth.outdir, resolve).values()
    fan_out = json.loads(definition)["States"]["FanOut"]
    # Then only the settings moto cannot run differ from the deployed ones
    assert fan_out["ItemProcessor"]["ProcessorConfig"]["ExecutionType"] == "STANDARD"
    assert fan_out["ToleratedFailurePercentage"] == float(
        synth.config.fanout.tolerated_failure_percentage
    )
    assert isinstance(fan_out["ToleratedFailurePercentage"], float)
    assert fan_out["MaxConcurrency"] == synth.config.fanout.max_concurrency
    assert fan_out["ItemReader"]["Parameters"]["Bucket"] == "local-bucket"
    assert fan_out["ItemSelector"]["unit.$"] == "$$.Map.Item.Value"  # context paths survive
