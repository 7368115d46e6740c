"""Load cdk.json's context in code, so `python app.py`, pytest and `npx cdk synth` agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def cdk_json_context(path: Path = ROOT / "cdk.json") -> dict[str, Any]:
    context = json.loads(path.read_text())["context"]
    assert isinstance(context, dict)
    return context
