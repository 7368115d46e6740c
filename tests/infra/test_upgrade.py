"""Upgrades CloudFormation can apply (issue 32, point 8): synth refuses a template change that
creates or deletes more than one global secondary index on a table, or changes one in place,
and says how to stage it; a stack deployed from the previous release upgrades, staged, on the
emulator's CloudFormation, which now applies index changes as DynamoDB does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from app import build_app
from infra import indexes
from infra.constants import ROOT
from infra.tables import wanted_indexes
from swarm.local import patches
from swarm.local.clients import REGION
from swarm.local.deploy import LocalOptions, deploy, synthesize
from swarm.local.patches import emulator
from swarm.local.patches.table_updates import index_changes, patch_table_index_updates
from tests.infra.conftest import NO_BUNDLING

#: No release is tagged: the previous release is the last tree before this release's ledger
#: indexes (TenantRuns, then Leases), whose Ledger has OpenRuns only.
PREVIOUS_RELEASE = "9cf5b4f"
STACK = "Swarm-upgrade"

LEDGER = wanted_indexes()["Ledger"]
OPEN_RUNS, TENANT_RUNS, LEASES = (index["IndexName"] for index in LEDGER)
RECORD = indexes.released()


def _plan(
    deployed: dict[str, list[str]] | None = None, rollout: dict[str, list[str]] | None = None
) -> list[str]:
    built = indexes.plan(
        "Ledger", LEDGER, record=RECORD, deployed=deployed or {}, rollout=rollout or {}
    )
    return [index["IndexName"] for index in built]


# ------------------------------------------------------------------ the refusal at synth


def test_the_release_record_is_what_this_code_builds() -> None:
    """The record a release leaves (python -m infra.indexes --write) matches the code, so a
    default synth changes no index: the next index added is the one change an update may make."""
    assert indexes.record_of(wanted_indexes())["tables"] == RECORD
    assert _plan() == [OPEN_RUNS, TENANT_RUNS, LEASES]


def test_two_new_indexes_in_one_update_are_refused_with_the_staging_steps() -> None:
    # Given a stack deployed from the previous release (its ledger has OpenRuns only)
    with pytest.raises(indexes.IndexUpdateError) as refused:
        _plan(deployed={"Ledger": [OPEN_RUNS]})
    message = str(refused.value)
    # Then the message names the table, both indexes, and the first step with its context key
    assert "Ledger" in message
    assert f"create {TENANT_RUNS}, create {LEASES}" in message
    assert "one global secondary index per table" in message
    assert f"""-c index_rollout='{{"Ledger": ["{OPEN_RUNS}", "{TENANT_RUNS}"]}}'""" in message
    # And following it, each step changes one index
    assert _plan(deployed={"Ledger": [OPEN_RUNS]}, rollout={"Ledger": [OPEN_RUNS, TENANT_RUNS]})
    assert _plan(deployed={"Ledger": [OPEN_RUNS, TENANT_RUNS]}) == [OPEN_RUNS, TENANT_RUNS, LEASES]


def test_one_new_index_per_update_passes() -> None:
    assert _plan(deployed={"Ledger": [OPEN_RUNS, TENANT_RUNS]}) == [OPEN_RUNS, TENANT_RUNS, LEASES]


def test_two_deletions_are_refused_too() -> None:
    record = {"Ledger": {i["IndexName"]: i for i in LEDGER}}
    with pytest.raises(indexes.IndexUpdateError, match=f"delete {OPEN_RUNS}, delete {TENANT_RUNS}"):
        indexes.plan("Ledger", LEDGER[2:], record=record, deployed={}, rollout={})
    # staged: one deletion first (the rollout may keep an index the code no longer defines)
    kept = indexes.plan(
        "Ledger", LEDGER[2:], record=record, deployed={}, rollout={"Ledger": [TENANT_RUNS, LEASES]}
    )
    assert [i["IndexName"] for i in kept] == [TENANT_RUNS, LEASES]


def test_an_index_changed_in_place_is_refused() -> None:
    changed = [dict(index) for index in LEDGER]
    changed[2] = {**changed[2], "Projection": {"ProjectionType": "ALL"}}
    with pytest.raises(indexes.IndexUpdateError, match=f"index {LEASES} changes its key schema"):
        indexes.plan("Ledger", changed, record=RECORD, deployed={}, rollout={})


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("{not json", "context deployed_indexes is not JSON"),
        ('["OpenRuns"]', "must map a table to index names"),
        ('{"Books": []}', "names table 'Books'; the tables are Governor, Ledger"),
        ('{"Ledger": "OpenRuns"}', "deployed_indexes.Ledger must be a list of index names"),
    ],
)
def test_bad_context_is_named(value: str, complaint: str) -> None:
    with pytest.raises(indexes.IndexUpdateError, match=complaint):
        indexes.names_from_context(value, indexes.DEPLOYED_CONTEXT, ("Governor", "Ledger"))


def test_rollout_of_an_unknown_index_is_named() -> None:
    with pytest.raises(indexes.IndexUpdateError, match="names Nope, which neither"):
        _plan(rollout={"Ledger": [OPEN_RUNS, "Nope"]})


def test_synth_refuses_the_unstaged_upgrade(tmp_path: Path) -> None:
    """The same refusal through the app, with the context as the CDK CLI passes it (a string)."""
    context = {**NO_BUNDLING, indexes.DEPLOYED_CONTEXT: json.dumps({"Ledger": [OPEN_RUNS]})}
    with pytest.raises(indexes.IndexUpdateError, match="index_rollout"):
        build_app(context, nag=False, outdir=str(tmp_path))


def test_a_rollout_step_builds_only_the_attributes_its_keys_use(tmp_path: Path) -> None:
    context = {
        **NO_BUNDLING,
        indexes.DEPLOYED_CONTEXT: {"Ledger": []},
        indexes.ROLLOUT_CONTEXT: {"Ledger": [OPEN_RUNS]},
    }
    app, stack = build_app(context, nag=False, outdir=str(tmp_path))
    app.synth()
    template = json.loads((tmp_path / f"{stack.stack_name}.template.json").read_text())
    ledger = template["Resources"][stack.get_logical_id(stack.tables.ledger.node.default_child)]
    props = ledger["Properties"]
    assert [i["IndexName"] for i in props["GlobalSecondaryIndexes"]] == [OPEN_RUNS]
    # CloudFormation refuses an attribute definition no key uses
    assert {a["AttributeName"] for a in props["AttributeDefinitions"]} == {
        "pk",
        "sk",
        "watch",
        "sweep_at",
    }


# ------------------------------------------------------------------ the emulator applies them


def test_the_emulator_refuses_what_cloudformation_refuses() -> None:
    assert index_changes("t", LEDGER[:1], LEDGER[:2]) == [{"Create": LEDGER[1]}]
    assert index_changes("t", LEDGER[:2], LEDGER[:1]) == [{"Delete": {"IndexName": TENANT_RUNS}}]
    with pytest.raises(ValueError, match="more than one GSI creation or deletion"):
        index_changes("t", LEDGER[:1], LEDGER)
    moved = {**LEDGER[0], "KeySchema": LEDGER[0]["KeySchema"][:1]}
    with pytest.raises(ValueError, match="cannot update index OpenRuns in place"):
        index_changes("t", LEDGER[:1], [moved])


@dataclass(frozen=True)
class UpgradeOptions(LocalOptions):
    """The local stack's context under its own stage, with the index context of one step."""

    stage: str = "upgrade"
    index_context: dict[str, Any] = field(default_factory=dict)

    def context(self) -> dict[str, Any]:
        return {**super().context(), **self.index_context}


def _previous_release(workdir: Path) -> Path:
    """The previous release's template, synthesized by its own code (git archive)."""
    source = workdir / "source"
    source.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE],
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert archive.returncode == 0, (
        f"the previous release ({PREVIOUS_RELEASE}) is not in this clone's history (a shallow "
        f"clone? `git fetch --unshallow`): {archive.stderr.decode()[-500:]}"
    )
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True, timeout=120)
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, '.'); "
        "from swarm.local.deploy import LocalOptions, synthesize; "
        "print(synthesize(Path(sys.argv[1]), LocalOptions(stage='upgrade')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(workdir / "previous")],
        capture_output=True,
        text=True,
        cwd=source,
        env={**os.environ, "SWARM_SKIP_BUNDLING": "1", "PYTHONPATH": str(source)},
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(result.stdout.strip().splitlines()[-1])


def _ledger_indexes(template: Path) -> list[str]:
    resources = json.loads(template.read_text())["Resources"]
    (ledger,) = [
        r
        for logical_id, r in resources.items()
        if r["Type"] == "AWS::DynamoDB::Table" and logical_id.startswith("TablesLedger")
    ]
    return [i["IndexName"] for i in ledger["Properties"].get("GlobalSecondaryIndexes", [])]


@pytest.fixture
def emulator_cfn(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)
    patches.apply_all()
    emulator.patch_event_bus_ref()
    emulator.patch_state_machine_cfn()
    emulator.patch_sqs_no_builtin_esm()
    patch_table_index_updates()
    with mock_aws(), warnings.catch_warnings():
        # moto skips the resource types it cannot create (listed in docs/explanation/local.md)
        warnings.filterwarnings("ignore", message="Tried to parse", category=UserWarning)
        cache: dict[str, Any] = {}

        def clients(service: str) -> Any:
            if service not in cache:
                cache[service] = boto3.client(service, region_name=REGION)
            return cache[service]

        yield clients


def _table_indexes(clients: Any, name: str) -> list[str]:
    table = clients("dynamodb").describe_table(TableName=name)["Table"]
    return [i["IndexName"] for i in table.get("GlobalSecondaryIndexes", [])]


@pytest.mark.slow
def test_a_stack_of_the_previous_release_upgrades_in_staged_deploys(
    emulator_cfn: Any, tmp_path: Path
) -> None:
    clients = emulator_cfn
    # Given a stack deployed from the previous release's template (its ledger: OpenRuns)
    previous = _previous_release(tmp_path)
    assert _ledger_indexes(previous) == [OPEN_RUNS]
    created = deploy(clients, previous, STACK, REGION)
    (ledger,) = [
        physical
        for logical, physical in created.of_type("AWS::DynamoDB::Table").items()
        if logical.startswith("TablesLedger")
    ]
    # When this release is deployed over it without staging, synth refuses (the first step)
    deployed = {indexes.DEPLOYED_CONTEXT: {"Ledger": [OPEN_RUNS]}}
    with pytest.raises(RuntimeError, match="index_rollout"):
        synthesize(tmp_path / "unstaged", UpgradeOptions(index_context=deployed))
    # And on the emulator's CloudFormation the unstaged template fails as it does on AWS
    unstaged = synthesize(
        tmp_path / "unstaged-forced", UpgradeOptions(index_context={indexes.DEPLOYED_CONTEXT: {}})
    )
    assert _ledger_indexes(unstaged) == [OPEN_RUNS, TENANT_RUNS, LEASES]
    with pytest.raises(ClientError, match="more than one GSI creation or deletion"):
        deploy(clients, unstaged, STACK, REGION)
    assert _table_indexes(clients, ledger) == [OPEN_RUNS]
    # Then staged as the refusal says, each update completes and adds its index
    step = {**deployed, indexes.ROLLOUT_CONTEXT: {"Ledger": [OPEN_RUNS, TENANT_RUNS]}}
    first = synthesize(tmp_path / "step-1", UpgradeOptions(index_context=step))
    upgraded = deploy(clients, first, STACK, REGION)  # raises unless UPDATE_COMPLETE
    assert _table_indexes(clients, ledger) == [OPEN_RUNS, TENANT_RUNS]
    last = synthesize(
        tmp_path / "step-2",
        UpgradeOptions(
            index_context={indexes.DEPLOYED_CONTEXT: {"Ledger": [OPEN_RUNS, TENANT_RUNS]}}
        ),
    )
    upgraded = deploy(clients, last, STACK, REGION)
    assert _table_indexes(clients, ledger) == [OPEN_RUNS, TENANT_RUNS, LEASES]
    # And the stack is this release's: every resource of the template is deployed
    assert set(upgraded.physical) >= {
        logical
        for logical, r in json.loads(last.read_text())["Resources"].items()
        if r["Type"] in {"AWS::Lambda::Function", "AWS::DynamoDB::Table", "AWS::SQS::Queue"}
    }
