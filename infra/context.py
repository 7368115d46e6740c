"""Load cdk.json's context in code, so `python app.py`, pytest and `npx cdk synth` agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.constants import ROOT

CDK_JSON = ROOT / "cdk.json"


def cdk_json_context(path: Path = CDK_JSON) -> dict[str, Any]:
    """The ``context`` object of cdk.json (defaults and feature flags)."""
    document = json.loads(path.read_text())
    context = document.get("context")
    if not isinstance(context, dict):
        raise ValueError(f"{path.name} has no 'context' object")
    return context
