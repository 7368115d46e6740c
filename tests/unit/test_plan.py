"""`swarm plan`: the fleet a quota and a workload call for, from a manifest or a size range."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from swarm.sim.workload import Workload
from tests.unit.helpers import run_cli


def _manifest(tmp_path: Path, body: Any, name: str = "units.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(body))
    return path


def lab61_units() -> list[dict[str, Any]]:
    """Lab 6.1's 400 units as a manifest `swarm submit` takes."""
    w = Workload()
    return [
        {"unit_id": w.unit_id(i), "projected_tokens": w.tokens(i), "input": f"work unit {i}"}
        for i in range(w.units)
    ]


def test_plan_from_a_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Given Lab 6.1's units as a batch file with its budget
    path = _manifest(tmp_path, {"units": lab61_units(), "budget": 6_000_000})
    args = ["plan", "--manifest", str(path), "--seeds", "3", "--usd-per-mtok", "3"]
    code, out, _ = run_cli([*args, "--json"], capsys)
    doc = json.loads(out)
    assert code == 0
    # Then N* is the book's, and each lane gets the workers that keep the quota busy
    assert doc["n_star"] == 119
    assert doc["concurrency_per_lane"] == 146 and doc["reserved_concurrency"] == 438
    assert doc["fits_account"] and doc["problem"] is None
    # the expected makespan is the simulated batch on that fleet (seed 0: Lab 6.1's failures)
    expected = doc["expected"]
    assert expected["workers_per_lane"] == 146
    assert (expected["makespan_s"], expected["floor_s"]) == (1_524, 1_293)
    assert expected["spent"] == 4_905_337 and expected["runs_completed"] == 3
    spread = expected["makespan_over_seeds_s"]
    assert spread["min"] <= 1_524 <= spread["max"]
    # spend: first attempts plus a 4% failure rate's retries, and its cost
    assert doc["first_attempt_tokens"] == 4_797_958
    assert doc["expected_spend"] == round(4_797_958 * (1 + 0.04 + 0.04**2))
    assert doc["model_cost_usd"] == round(expected["spent_over_seeds"]["mean"] * 3 / 1e6, 2)
    # and the cdk.json values to deploy it
    context = doc["cdk_context"]
    assert context["quota_tpm"] == 300_000 and context["governor_share"] == 0.95
    assert {c["max_concurrency"] for c in context["lanes"].values()} == {146}
    assert context["worker"] == {"reserved_concurrency": 438}
    assert doc["cdk_context_auto"]["worker"]["concurrency"] == "auto"
    assert doc["cdk_context_auto"]["worker"]["unit_profile"]["small_tokens"] == 8_702
    # The text says the same for a person
    code, out, _ = run_cli(args, capsys)
    assert code == 0
    for line in (
        "N* = 119 workers",
        "recommended worker concurrency per lane: high 146, normal 146, low 146 "
        "(worker reserved concurrency 438)",
        "expected makespan: 1,524s on seed 0, 1.18x its floor of 1,293s",
        "model cost: $",
        '"reserved_concurrency": 438',
        '"concurrency": "auto"',
    ):
        assert line in out


def test_plan_from_a_size_range_and_another_quota(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--units", "100", "--min-tokens", "2000", "--max-tokens", "4000"]
    code, out, _ = run_cli([*args, "--quota-tpm", "600000", "--seeds", "2", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["units"] == 100 and doc["quota_tpm"] == 600_000
    # small units hold a worker long for their tokens: many workers keep the quota busy
    assert doc["concurrency_per_lane"] > doc["n_star"] > 0
    assert doc["model_cost_usd"] is None
    code, out, _ = run_cli(["plan", "--seeds", "1"], capsys)
    assert code == 0 and "model cost: give --usd-per-mtok" in out


def test_a_fleet_the_account_cannot_reserve_is_planned_within_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "--seeds", "2", "--account-concurrency-limit", "300", "--json"]
    code, out, _ = run_cli(args, capsys)
    doc = json.loads(out)
    assert code == 0 and not doc["fits_account"]
    assert "can reserve at most 200" in doc["problem"]
    # the best the account allows: (300 - 100) / 3 lanes = 66 workers per lane, worker-bound
    within = doc["within_account"]
    assert within["workers_per_lane"] == 66
    assert within["makespan_s"] > doc["expected"]["makespan_s"]


def test_a_budget_too_small_is_planned_as_exhausted(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["plan", "--seeds", "2", "--budget", "2500000"], capsys)
    assert code == 0
    assert "the budget runs out in 2 of 2 seeds: run.exhausted with" in out
    code, out, _ = run_cli(["plan", "--seeds", "2", "--json"], capsys)
    doc = json.loads(out)
    assert doc["budget_covering_every_seed"] == doc["expected"]["spent_over_seeds"]["max"]


@pytest.mark.parametrize(
    ("body", "extra", "message"),
    [
        ([{"unit_id": "a", "projected_tokens": 0, "input": "x"}], [], "units[0].projected_tokens"),
        (
            [{"unit_id": "a", "projected_tokens": True, "input": "x"}],
            [],
            "units[0].projected_tokens: must be a whole number of tokens, got True",
        ),
        ([{"unit_id": "bad id!", "projected_tokens": 5}], [], "units[0].unit_id"),
        (["not a unit"], [], "units[0]: must be an object"),
        ([{"unit_id": "a", "projected_tokens": 5}] * 2, [], "unit id 'a' appears more than once"),
        ({"manifest": {"key": "manifests/uploads/acme/u.json"}}, [], "has no units"),
        ([], [], "has no units"),
        (
            [{"unit_id": "a", "projected_tokens": 400_000}],
            [],
            "--manifest: units[0].projected_tokens: 400,000 tokens from lane normal can never",
        ),
        ([{"unit_id": "a", "projected_tokens": 5}], ["--units", "9"], "leave out --units"),
    ],
)
def test_a_bad_manifest_gets_a_clear_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    body: Any,
    extra: list[str],
    message: str,
) -> None:
    path = _manifest(tmp_path, body)
    code, _, err = run_cli(["plan", "--manifest", str(path), "--seeds", "1", *extra], capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_an_unreadable_manifest_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["plan", "--manifest", str(tmp_path / "none.json")], capsys)
    assert code == 2 and "--manifest: cannot read" in err
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{nope")
    code, _, err = run_cli(["plan", "--manifest", str(garbage)], capsys)
    assert code == 2 and "--manifest" in err and "is not JSON" in err
