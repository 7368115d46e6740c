"""The control plane as a construct (issue 36, point 3): SwarmStack keeps its logical ids, a
user's own stack holds it nag-, cfn-lint- and checkov-clean (examples/existing_app), its
acknowledgments stay on its own resources, and its settings are refused naming the key."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam

from infra.config import CONFIG_KEYS, ConfigError, SwarmConfig
from infra.constants import ROOT
from infra.context import cdk_json_context
from infra.control_plane import SwarmControlPlane
from infra.functions import fanout_state_machine_name
from tests.infra.conftest import NO_BUNDLING, Synthesized
from tests.infra.test_checkov import _checkov
from tests.infra.test_compliance import _cfn_lint

EXAMPLE = ROOT / "examples" / "existing_app"
RECORD = Path(__file__).with_name("logical_ids_before_construct.json")


def _shipped() -> dict[str, Any]:
    """cdk.json's control plane settings (no feature flags, no CDK keys)."""
    return {k: v for k, v in cdk_json_context().items() if k in CONFIG_KEYS}


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("existing_app", EXAMPLE / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """examples/existing_app synthesized as its app.py does it (cdk-nag on: it raises on a
    finding left), with the tests' no-bundling context."""
    outdir = tmp_path_factory.mktemp("example")
    _example().build_app(NO_BUNDLING, outdir=str(outdir)).synth()
    return outdir, json.loads((outdir / "TeamApp.template.json").read_text())


def test_swarm_stack_keeps_every_logical_id_of_the_release_before_the_construct(
    synth: Synthesized,
) -> None:
    """CloudFormation replaces a resource whose logical id changes: the tables with their data,
    the queues with their units. The construct is built with the id ``Default``, which CDK leaves
    out of logical ids, so every resource keeps its id and type."""
    record = json.loads(RECORD.read_text())
    built = {name: resource["Type"] for name, resource in synth.resources.items()}
    lost = {name: kind for name, kind in record["resources"].items() if built.get(name) != kind}
    assert lost == {}, f"logical ids changed (the resources would be replaced): {sorted(lost)}"
    assert set(record["outputs"]) <= set(synth.template["Outputs"])
    # an API Gateway deployment's id ends with a hash of the API (its path metadata included):
    # CDK makes a new one on any change of the API, by design; there is still exactly one
    deployments = [n for n, kind in built.items() if kind == "AWS::ApiGateway::Deployment"]
    assert len(deployments) == 1 and deployments[0].startswith(*record["api_deployments"])
    # the tables and queues above are the construct's, reached through the stack
    plane = synth.stack.control_plane
    for construct in (plane.ledger_table, plane.governor_table, plane.dead_letter_queue):
        assert synth.logical_id(construct) in record["resources"]


def test_the_example_adds_the_construct_to_a_team_stack_nag_clean(
    example: tuple[Path, dict[str, Any]],
) -> None:
    outdir, template = example
    (nag,) = json.loads((outdir / "validation-report.json").read_text())["pluginReports"]
    assert nag["conclusion"] == "success" and nag["violations"] == []
    resources = template["Resources"]
    # the team's own resources sit beside the control plane's, under their own ids
    own = {n for n in resources if n.startswith(("Alerts", "OnCall", "DeadLettersAlarm"))}
    assert {"AWS::SNS::Topic", "AWS::KMS::Key", "AWS::IAM::Role", "AWS::CloudWatch::Alarm"} <= {
        resources[n]["Type"] for n in own
    }
    # its alarm on the construct's dead-letter queue goes to the team's topic
    (alarm,) = [r for n, r in resources.items() if n.startswith("DeadLettersAlarm")]
    (topic,) = [n for n, r in resources.items() if r["Type"] == "AWS::SNS::Topic" and "Alerts" in n]
    assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic}]
    (queue_dimension,) = alarm["Properties"]["Dimensions"]
    assert queue_dimension["Value"]["Fn::GetAtt"][0].startswith("SwarmLanesDeadLetters")
    # its on-call role may write the construct's drain parameter, and nothing else of it
    (policy,) = [r for n, r in resources.items() if n.startswith("OnCallDefaultPolicy")]
    text = json.dumps(policy["Properties"]["PolicyDocument"])
    assert "ssm:PutParameter" in text and "SwarmDrainParameter" in text
    # the control plane's names come from the stack and the construct's id
    (machine,) = [r for r in resources.values() if r["Type"] == "AWS::StepFunctions::StateMachine"]
    assert machine["Properties"]["StateMachineName"] == "TeamApp-Swarm-fanout"
    assert {"ApiUrl", "StateMachineArn"} <= set(template["Outputs"])


def test_the_example_passes_cfn_lint_and_checkov(example: tuple[Path, dict[str, Any]]) -> None:
    outdir, _ = example
    result = _cfn_lint(outdir / "TeamApp.template.json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = _checkov(outdir / "TeamApp.template.json")
    failed = [(f["check_id"], f["resource"]) for f in report["results"]["failed_checks"]]
    assert failed == []
    assert report["summary"]["passed"] > 100


def test_the_acknowledgments_do_not_cover_the_users_own_resources(tmp_path: Path) -> None:
    """The construct acknowledges findings on its own roles only: a role of the user's in the
    same stack with ``Resource: *`` still fails cdk-nag, named by its path."""
    module = _example()
    app = cdk.App(context={**module.cdk_json_context(), **NO_BUNDLING}, outdir=str(tmp_path))
    stack = module.TeamStack(app, "TeamApp")
    careless = iam.Role(stack, "Careless", assumed_by=iam.AccountPrincipal(stack.account))
    careless.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=["*"]))
    cdk.Validations.of(app).add_plugins(module.AwsSolutionsChecks(app))
    with pytest.raises(Exception, match="ValidationFailed") as failed:
        app.synth()
    report = str(failed.value)
    assert "TeamApp/Careless/DefaultPolicy/Resource" in report
    assert "AwsSolutions-IAM5[Resource::*]" in report
    # the one finding: nothing of the control plane's, nothing else of the team's
    assert "TeamApp/Swarm" not in report and report.count("aws-cdk-lib.") == 1, report


def test_settings_from_a_context_object_are_refused_naming_the_key() -> None:
    shipped = _shipped()
    app = cdk.App(context={"swarm": {**shipped, "max_attempts": 0}})
    with pytest.raises(ConfigError, match=r"context key 'swarm\.max_attempts'"):
        SwarmConfig.from_context(app, key="swarm")
    with pytest.raises(ConfigError, match=r"context key 'team' is required"):
        SwarmConfig.from_context(app, key="team")
    with pytest.raises(ConfigError, match=r"unknown context key\(s\): settings\.colour"):
        SwarmConfig.from_mapping({**shipped, "colour": "blue"}, key="settings")
    lanes = {**shipped["lanes"], "high": {**shipped["lanes"]["high"], "max_concurrency": 1}}
    with pytest.raises(ConfigError, match=r"lanes"):
        SwarmConfig.from_mapping({**shipped, "lanes": lanes})
    assert SwarmConfig.from_mapping(shipped) == SwarmConfig.from_context(cdk.App(context=shipped))


def test_the_construct_runs_the_checks_a_bare_model_skips() -> None:
    """``SwarmConfig.model_validate`` does not run the timing checks across the state machine
    and the API (load_config does): the construct runs them on whatever config it gets."""
    shipped = _shipped()
    api = {**shipped["api"], "timeout_seconds": 28}
    config = SwarmConfig.model_validate({**shipped, "api": api})
    stack = cdk.Stack(cdk.App(context=NO_BUNDLING), "Team")
    with pytest.raises(ConfigError, match=r"api\.timeout_seconds=28"):
        SwarmControlPlane(stack, "Swarm", config=config)
    with pytest.raises(TypeError, match=r"SwarmConfig\.from_context"):
        SwarmControlPlane(stack, "Other", config=shipped)  # type: ignore[arg-type]


def test_a_state_machine_name_past_step_functions_limit_is_refused_naming_the_fix() -> None:
    stack = cdk.Stack(cdk.App(), "Team")
    assert fanout_state_machine_name(stack) == "Team-fanout"
    assert fanout_state_machine_name(stack, "Swarm") == "Team-Swarm-fanout"
    with pytest.raises(ConfigError, match="shorter id"):
        fanout_state_machine_name(stack, "S" * 80)


def test_two_control_planes_of_two_stages_share_one_stack(tmp_path: Path) -> None:
    """Every name the construct fixes before deploy comes from its stack, its id or its stage:
    two of them (stages blue and green) in one stack get their own state machine, drain switch
    and log group."""
    flags = {k: v for k, v in cdk_json_context().items() if k.startswith("@")}
    app = cdk.App(context={**flags, **NO_BUNDLING}, outdir=str(tmp_path))
    stack = cdk.Stack(app, "Two")
    for stage in ("blue", "green"):
        config = SwarmConfig.from_mapping({**_shipped(), "stage": stage})
        SwarmControlPlane(stack, stage.capitalize(), config=config)
    app.synth()
    resources = json.loads((tmp_path / "Two.template.json").read_text())["Resources"]

    def names(kind: str, key: str) -> list[Any]:
        return sorted(
            str(r["Properties"].get(key)) for r in resources.values() if r["Type"] == kind
        )

    assert names("AWS::StepFunctions::StateMachine", "StateMachineName") == [
        "Two-Blue-fanout",
        "Two-Green-fanout",
    ]
    assert names("AWS::SSM::Parameter", "Name") == ["/swarm/blue/drain", "/swarm/green/drain"]
    state_logs = [n for n in names("AWS::Logs::LogGroup", "LogGroupName") if "states" in n]
    assert len(state_logs) == len(set(state_logs)) == 2
