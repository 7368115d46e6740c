"""Small readers over a synthesized template."""

from __future__ import annotations

from typing import Any

from tests.infra.conftest import Synthesized


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def statements_of_role(synth: Synthesized, role: Any) -> list[dict[str, Any]]:
    """Every statement of every AWS::IAM::Policy attached to ``role``."""
    role_id = synth.logical_id(role)
    found: list[dict[str, Any]] = []
    for policy in synth.of_type("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            found += policy["Properties"]["PolicyDocument"]["Statement"]
    return found


def actions_on(statements: list[dict[str, Any]], resource: Any) -> set[str]:
    """Actions granted on a resource (compared as the template writes it)."""
    actions: set[str] = set()
    for statement in statements:
        if statement["Effect"] == "Allow" and resource in as_list(statement["Resource"]):
            actions |= set(as_list(statement["Action"]))
    return actions


def all_actions(statements: list[dict[str, Any]]) -> set[str]:
    return {a for s in statements if s["Effect"] == "Allow" for a in as_list(s["Action"])}


def arn(synth: Synthesized, construct: Any) -> dict[str, Any]:
    return {"Fn::GetAtt": [synth.logical_id(construct), "Arn"]}


def ref(synth: Synthesized, construct: Any) -> dict[str, Any]:
    return {"Ref": synth.logical_id(construct)}


def references(value: Any, logical_id: str) -> bool:
    """Whether an intrinsic expression mentions ``logical_id`` anywhere."""
    if isinstance(value, dict):
        if value.get("Ref") == logical_id:
            return True
        getatt = value.get("Fn::GetAtt")
        if isinstance(getatt, list) and getatt and getatt[0] == logical_id:
            return True
        return any(references(v, logical_id) for v in value.values())
    if isinstance(value, list):
        return any(references(v, logical_id) for v in value)
    return False
