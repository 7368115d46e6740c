"""`swarm sim run` and `swarm plan` with --models, --mix and --output-share, and their errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.unit.helpers import run_cli

PRICES = {
    "as_of": "2026-12-01",
    "input": 0.80,
    "output": 4.00,
    "cache_read": 0.08,
    "cache_write": 1,
}
CATALOG: dict[str, Any] = {
    "default": "router",
    "catalog": {
        "router": {
            "model_id": "anthropic.claude-3-5-haiku-20241022-v1:0",
            "tpm": 1_000_000,
            "rpm": 60,
            "prices": PRICES,
        },
        "writer": {
            "model_id": "us.anthropic.claude-sonnet-4-20250514-v1:0",
            "tpm": 200_000,
            "rpm": 10_000,
            "prices": {**PRICES, "input": 3, "output": 15},
        },
    },
}
#: many small calls of a few seconds each
SMALL = ["--units", "600", "--min-tokens", "200", "--max-tokens", "400", "--base-seconds", "5"]
SMALL += ["--seed", "1", "--failure-rate", "0"]
MIX = ["--mix", "router=0.5,writer=0.5", "--output-share", "0.6"]


@pytest.fixture
def cdk_json(tmp_path: Path) -> Path:
    """A cdk.json with the registry's models block."""
    path = tmp_path / "cdk.json"
    path.write_text(json.dumps({"app": "python3 app.py", "context": {"models": CATALOG}}))
    return path


def test_sim_run_prints_each_models_figures(
    cdk_json: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["sim", "run", *SMALL, "--workers", "200", "--models", str(cdk_json), *MIX]
    code, out, _ = run_cli([*args, "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    models = {m["model"]: m for m in doc["models"]}
    router, writer = models["router"], models["writer"]
    assert (router["units"], writer["units"]) == (300, 300)
    assert (router["binding"], writer["binding"]) == ("RPM", "TPM")
    assert writer["quota_tokens"] == writer["billed_tokens"] + 4 * writer["output_tokens"]
    assert router["billed_tokens"] + writer["billed_tokens"] == doc["spent"]
    assert doc["cost_micro_usd"] == router["cost_micro_usd"] + writer["cost_micro_usd"]
    # the router's requests set the end: its last attempt ends the run
    assert router["makespan_share"] == 1.0 and router["last_end_s"] == doc["elapsed_s"]
    code, text, _ = run_cli(args, capsys)
    assert code == 0
    assert "model router: 300 units, 300 requests" in text and "| binding: RPM |" in text
    assert "model writer: 300 units" in text and "| binding: TPM |" in text
    assert f"cost: ${doc['cost_micro_usd'] / 1e6:.6f}".rstrip("0") in text


def test_sim_run_names_the_workers_when_the_fleet_is_short(
    cdk_json: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["sim", "run", *SMALL, "--workers", "20", "--models", str(cdk_json), *MIX, "--json"]
    code, out, _ = run_cli(args, capsys)
    assert code == 0
    binding = {m["model"]: m["binding"] for m in json.loads(out)["models"]}
    assert binding == {"router": "RPM", "writer": "workers"}


def test_plan_prints_the_binding_limit_n_star_share_and_cost_per_model(
    cdk_json: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", *SMALL, "--models", str(cdk_json), *MIX, "--seeds", "2"]
    code, out, _ = run_cli([*args, "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    models = {m["model"]: m for m in doc["models"]}
    router, writer = models["router"], models["writer"]
    assert (router["binding"], writer["binding"]) == ("RPM", "TPM")
    assert (router["n_star"], writer["n_star"]) == (8, 24)
    assert doc["n_star"] == 32 and doc["concurrency_per_lane"] >= 32
    assert 0 < writer["makespan_share"] < router["makespan_share"] == 1.0
    assert doc["cost_micro_usd"] == router["cost_micro_usd"] + writer["cost_micro_usd"]
    assert doc["cost_usd"].startswith("$")
    assert doc["cdk_context"]["lanes"]["normal"]["max_concurrency"] == doc["concurrency_per_lane"]
    code, text, _ = run_cli(args, capsys)
    assert code == 0
    assert "binding: RPM | N* = 8 (Little's law)" in text
    assert "binding: TPM | N* = 24 (Little's law)" in text
    assert "(100% of the makespan)" in text
    assert f"cost: {doc['cost_usd']} on seed 1 (router $" in text


def test_plan_on_lab61s_model_is_todays_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Lab 6.1's quota as the catalog's one model: the same N*, fleet and makespan as --quota-tpm
    path = tmp_path / "models.json"
    lab = {"model_id": "m", "tpm": 300_000, "output_burndown": 1, "prices": PRICES}
    path.write_text(json.dumps({"models": {"default": "lab", "catalog": {"lab": lab}}}))
    code, out, _ = run_cli(["plan", "--models", str(path), "--seeds", "1", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert (doc["n_star"], doc["concurrency_per_lane"]) == (119, 146)
    (lab_doc,) = doc["models"]
    assert lab_doc["binding"] == "TPM" and lab_doc["attempts"] == 409
    code, out, _ = run_cli(["plan", "--seeds", "1", "--json"], capsys)
    plain = json.loads(out)
    assert (plain["n_star"], plain["concurrency_per_lane"]) == (119, 146)
    assert doc["expected"] == plain["expected"]


def _write(tmp_path: Path, body: Any) -> Path:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(body))
    return path


@pytest.mark.parametrize(
    "command", [["sim", "run"], ["sim", "sweep", "--workers", "10"], ["plan", "--seeds", "1"]]
)
@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--mix", "router=0.5,opus=0.5"], "--mix: 'opus' is not a model of the catalog"),
        (["--mix", "router=0.5,writer=0.4"], "--mix: the fractions add up to 0.9, not 1"),
        (["--quota-tpm", "1000"], "--quota-tpm: with --models each model's quota is its tpm"),
        (["--turns", "3"], "--turns: agent units are not simulated on several models"),
        (["--output-share", "1.5"], "argument --output-share: 1.5 is out of range"),
    ],
)
def test_bad_model_options_are_clear_errors(
    command: list[str],
    extra: list[str],
    says: str,
    cdk_json: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_cli([*command, "--models", str(cdk_json), *extra], capsys)
    assert code == 2 and says in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            {"models": {"default": "a", "catalog": {"a": {"model_id": "a"}}}},
            "models.catalog.a.tpm: is missing: give the model's quota in tokens per minute",
        ),
        (
            {
                "context": {
                    "models": {"default": "a", "catalog": {"a": {"model_id": "a", "tpm": 0}}}
                }
            },
            "context.models.catalog.a.tpm: must be a whole number of tokens per minute >= 1",
        ),
        ({"context": {"quota_tpm": 1}}, "--models: "),
        ([1, 2], "has no models: give a cdk.json (context.models)"),
    ],
)
def test_a_bad_catalog_file_is_a_clear_error(
    body: Any, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["sim", "run", "--models", str(_write(tmp_path, body))], capsys)
    assert code == 2 and says in err


def test_model_options_need_the_catalog_and_fit_the_command(
    cdk_json: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["sim", "run", "--mix", "a=1"], capsys)
    assert code == 2 and "--mix: needs --models FILE" in err
    code, _, err = run_cli(["plan", "--output-share", "0.5"], capsys)
    assert code == 2 and "--output-share: needs --models FILE" in err
    code, _, err = run_cli(["sim", "run", "--models", str(tmp_path / "none.json")], capsys)
    assert code == 2 and "--models: cannot read" in err
    args = ["plan", "--models", str(cdk_json), "--usd-per-mtok", "3"]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "--usd-per-mtok: with --models each model's prices" in err
    state = tmp_path / "s.json"
    args = ["sim", "run", "--models", str(cdk_json), "--state", str(state), "--kill-at", "9"]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "kill and resume are not simulated on several models" in err


def _units(tmp_path: Path, writer_model: Any = "writer") -> Path:
    """Small router calls and large writer units, each naming its model (input.model)."""
    units = [
        {"unit_id": f"r{i}", "projected_tokens": 200 + i % 200, "input": {"model": "router"}}
        for i in range(300)
    ]
    units += [
        {"unit_id": f"w{i}", "projected_tokens": 4_000 + 50 * i, "input": {"model": writer_model}}
        for i in range(20)
    ]
    units.append({"unit_id": "plain", "projected_tokens": 300, "input": "no model: the default"})
    return _write(tmp_path, {"units": units, "budget": 1_000_000})


def test_plan_runs_each_manifest_unit_on_the_model_it_names(
    cdk_json: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", "--manifest", str(_units(tmp_path)), "--models", str(cdk_json)]
    args += ["--base-seconds", "5", "--seeds", "1"]
    code, out, _ = run_cli([*args, "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    models = {m["model"]: m for m in doc["models"]}
    # the unit naming no model runs on the catalog's default (router)
    assert (models["router"]["units"], models["writer"]["units"]) == (301, 20)
    assert doc["units_name_their_models"] and doc["budget"] == 1_000_000
    assert (models["router"]["binding"], models["writer"]["binding"]) == ("RPM", "TPM")
    code, text, _ = run_cli(args, capsys)
    assert "units on the models they name: router 301, writer 20" in text


def test_a_manifest_naming_models_needs_the_catalog_and_no_mix(
    cdk_json: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = ["plan", "--manifest", str(_units(tmp_path)), "--seeds", "1"]
    code, _, err = run_cli(manifest, capsys)
    assert code == 2 and "--manifest: units[0].input.model: names model 'router'" in err
    code, _, err = run_cli([*manifest, "--models", str(cdk_json), "--mix", "router=1"], capsys)
    assert code == 2 and "--mix: the manifest's units name their models" in err
    unknown = ["plan", "--manifest", str(_units(tmp_path, "opus")), "--models", str(cdk_json)]
    code, _, err = run_cli(unknown, capsys)
    assert code == 2
    assert "--manifest: units[300].input.model: 'opus' is not a model of the catalog" in err
    bad = ["plan", "--manifest", str(_units(tmp_path, 7)), "--models", str(cdk_json)]
    code, _, err = run_cli(bad, capsys)
    assert code == 2 and "--manifest: units[300].input.model: must be a model name" in err


def test_sweep_on_models_adds_up_their_n_star(
    cdk_json: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["sim", "sweep", *SMALL, "--models", str(cdk_json), *MIX, "--workers", "20,400"]
    code, out, _ = run_cli([*args, "--policy", "largest-first", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    # the router's 8 and the writer's 24 (as swarm plan --models says)
    assert doc["n_star"] == 32
    # the router's 300 requests at 0.95 a second end the run at either fleet size: 20 workers
    # cover its N* and the writer's units finish first
    elapsed = {row["workers"]: row["elapsed_s"] for row in doc["rows"]}
    assert elapsed[20] == elapsed[400] >= math.ceil(300 / 0.95)
