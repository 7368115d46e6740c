"""The strict local stack refuses what the template does not grant: remove one grant from the
synthesized template, deploy it, and the call that needed it fails with AccessDenied where AWS
would fail it, while everything else still works.

The scenario removes ``sqs:SendMessage`` from the fan-out function's role (the map's item step
admits a unit, then sends it to its lane), submits a one-unit batch through the signed API, and
checks that the emulator refused exactly that call, on that lane's ARN, and that the unit never
reached a worker. It runs in a child process: the local stack patches moto and Lambda process-wide.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ROLE_PREFIX = "AdmitRole"  # the fan-out (map item) function's role
ACTION = "sqs:SendMessage"


def drop_action(template: dict[str, Any], role_prefix: str, action: str) -> int:
    """Remove ``action`` from every policy attached to the role whose logical id starts with
    ``role_prefix``; returns how many statements lost it."""
    removed = 0
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::IAM::Policy":
            continue
        roles = [r.get("Ref", "") for r in resource["Properties"].get("Roles", [])]
        if not any(r.startswith(role_prefix) for r in roles):
            continue
        statements = resource["Properties"]["PolicyDocument"]["Statement"]
        for st in list(statements):
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            if action in actions:
                actions = [a for a in actions if a != action]
                removed += 1
                if actions:
                    st["Action"] = actions
                else:
                    statements.remove(st)
    return removed


def scenario(state_dir: Path) -> dict[str, Any]:
    """In this (child) process: deploy without the grant, submit one unit, report."""
    from swarm.client import Client
    from swarm.local.deploy import LocalOptions
    from swarm.local.patches import iam
    from swarm.local.stack import LocalStack

    dropped: list[int] = []
    stack = LocalStack(
        LocalOptions(time_scale=10.0, model_seed=1),
        state_dir,
        template_edit=lambda t: dropped.append(drop_action(t, ROLE_PREFIX, ACTION)),
    )
    target = stack.start()
    try:
        client = Client(target, timeout_s=60)
        unit = {"unit_id": "u-1", "projected_tokens": 1000, "input": "hello"}
        batch = client.submit({"units": [unit]})["batch_id"]
        deadline = time.monotonic() + 60
        refused: list[dict[str, str]] = []
        while time.monotonic() < deadline and not refused:
            refused = [
                d
                for d in iam.AUDIT.report()["denied"]
                if d["action"] == ACTION and f"/Swarm-local-{ROLE_PREFIX}" in d["principal"]
            ]
            time.sleep(0.5)
        return {
            "dropped": dropped,
            "refused": refused,
            "status": client.status(batch),
            "worker_invocations": stack.host.invocations.get(
                next(n for n in stack.function_clients if "Worker" in n), 0
            )
            if stack.host
            else 0,
        }
    finally:
        stack.stop()


def test_a_grant_removed_from_the_template_is_refused_where_aws_would(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.scale.test_strict_stack", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["dropped"] == [1]
    lanes = {d["resource"].rsplit(":", 1)[-1] for d in report["refused"]}
    assert report["refused"] and all("Lane" in lane for lane in lanes), report["refused"]
    # the unit was admitted but never enqueued: no worker ran, nothing completed
    assert report["worker_invocations"] == 0
    assert report["status"]["counts"]["completed"] == 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        out = scenario(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(scratch))
    print(json.dumps(out, default=str))
