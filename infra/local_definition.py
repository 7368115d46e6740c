"""The state machine definition as the local emulator (moto) needs it.

moto's CloudFormation creates ``AWS::StepFunctions::StateMachine`` from ``DefinitionString`` only:
it ignores ``DefinitionS3Location`` (what ``DefinitionBody.from_file`` synthesizes) and
``DefinitionSubstitutions``. So the local runtime deploys the template, then calls
``update_state_machine`` with :func:`local_definitions`: the ASL file from the cloud assembly, the
substitutions resolved to the deployed physical values, and the settings moto cannot run rewritten
(see docs/explanation/local.md). This touches the local copy only; ``cdk deploy`` ships the
template.

(moto's ``Fn::Sub`` is no way round: it uses ``string.Template``, which turns ``$$.Map.Item``
into ``$.Map.Item``.) No boto3 here: the caller supplies the resolver.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: substitution -> what moto needs instead of the deployed value
LOCAL_REWRITES: Mapping[str, Callable[[str], str]] = {
    # moto cannot parse EXPRESS child executions inside a Distributed Map
    "MapExecutionType": lambda _value: "STANDARD",
    # moto rejects an integer ToleratedFailurePercentage; a float parses (and is ignored)
    "ToleratedFailurePercentage": lambda value: str(float(value)),
}

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_]+)\}")

#: Resolves one CloudFormation value (``{"Ref": id}``, ``{"Fn::GetAtt": [id, "Arn"]}``...) to the
#: deployed value, e.g. from ``describe_stack_resources`` and the function ARNs.
Resolver = Callable[[Any], str]


def local_definitions(
    template: Mapping[str, Any], assembly_dir: Path, resolve: Resolver
) -> dict[str, str]:
    """``{state machine logical id: definition JSON for update_state_machine}``."""
    definitions: dict[str, str] = {}
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] != "AWS::StepFunctions::StateMachine":
            continue
        props = resource["Properties"]
        if "DefinitionS3Location" in props:
            body = _asset_text(assembly_dir, props["DefinitionS3Location"]["Key"])
        else:
            body = props["DefinitionString"]
            if not isinstance(body, str):
                raise ValueError(f"{logical_id}: DefinitionString is not a plain string")
        values = {
            name: value if isinstance(value, str) else resolve(value)
            for name, value in props.get("DefinitionSubstitutions", {}).items()
        }
        for name, rewrite in LOCAL_REWRITES.items():
            if name in values:
                values[name] = rewrite(values[name])

        missing = set(_PLACEHOLDER.findall(body)) - set(values)
        if missing:
            raise KeyError(f"{logical_id}: no substitution for {', '.join(sorted(missing))}")
        text = _substitute(body, values)
        definitions[logical_id] = json.dumps(json.loads(text))  # fail here, not in moto
    return definitions


def _substitute(body: str, values: Mapping[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], body)


def _asset_text(assembly_dir: Path, object_key: str) -> str:
    """The file asset uploaded as ``object_key``, found through the assets manifests."""
    for manifest in assembly_dir.glob("*.assets.json"):
        for asset in json.loads(manifest.read_text()).get("files", {}).values():
            keys = {d.get("objectKey") for d in asset.get("destinations", {}).values()}
            if object_key in keys:
                return (assembly_dir / str(asset["source"]["path"])).read_text()
    raise FileNotFoundError(f"no file asset with object key {object_key} in {assembly_dir}")
