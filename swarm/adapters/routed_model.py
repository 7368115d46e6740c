"""A model plane per model id, behind one: Bedrock's adapter holds one model id (and what
CountTokens knows of it), and a deployment registers several (cdk.json ``models``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from swarm.core.ports import ConverseCall, ModelPlane, ModelRequest, ModelResult


@dataclass(frozen=True)
class RoutedModelPlane:
    #: each registered model id's plane
    planes: Mapping[str, ModelPlane]
    #: the plane of a request that names no model (the registry's default)
    default: ModelPlane

    def _of(self, model_id: str | None) -> ModelPlane:
        if model_id is None:
            return self.default
        plane = self.planes.get(model_id)
        if plane is None:  # the worker routes only registered models (swarm.core.routes)
            raise ValueError(f"no model plane for {model_id!r}: not a registered model")
        return plane

    def invoke(self, request: ModelRequest) -> ModelResult:
        return self._of(request.model_id).invoke(request)

    def converse(self, call: ConverseCall) -> Mapping[str, Any]:
        return self._of(call.model_id).converse(call)
