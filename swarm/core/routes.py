"""The models a deployment registers (cdk.json ``models``), as the services route units to them.

Bedrock's quotas are per model, so each model has a governor of its own (``gov#<name>...`` in
the governor table): a unit draws from, and trues up to, its model's bucket, and a throttle of
one model cuts only that model's rate. A unit names its model in its request
(``input.model``, :data:`swarm.core.prompts.MODEL_FIELD`), or takes the registry's default.
docs/explanation/governor.md, "Models".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from swarm.core.errors import InvalidInput
from swarm.core.ports import Governor
from swarm.core.pricing import Prices
from swarm.core.prompts import MODEL_FIELD, unit_model


@dataclass(frozen=True)
class ModelRoute:
    """One model of the registry: its name, its Bedrock id, its governor."""

    name: str
    #: the id requests carry to the model plane (Bedrock's model id or inference profile); None:
    #: the plane's own (a plane of one model: the simulator, tests)
    model_id: str | None
    governor: Governor
    #: its prices (cdk.json models.catalog.<name>.prices): its units' projected costs and each
    #: attempt's priced usage. None: unpriced (spend in tokens only)
    prices: Prices | None = None


@dataclass(frozen=True)
class ModelRoutes:
    """The registry: every model by name, and the default a unit without a name takes."""

    default: str
    routes: Mapping[str, ModelRoute]

    def __post_init__(self) -> None:
        if self.default not in self.routes:
            raise ValueError(f"the default model {self.default!r} is not among the routes")

    @classmethod
    def single(
        cls, governor: Governor, prices: Prices | None = None, name: str = "default"
    ) -> ModelRoutes:
        """One model, answered by the plane's own model: a deployment before the registry."""
        return cls(name, {name: ModelRoute(name, None, governor, prices)})

    @property
    def names(self) -> list[str]:
        return sorted(self.routes)

    def name_of(self, prompt: Any) -> str:
        """The model ``prompt`` (a unit's input) names, or the default."""
        return unit_model(prompt) or self.default

    def of(self, prompt: Any, field: str = "input") -> ModelRoute:
        """The route of the model ``prompt`` names; InvalidInput naming ``<field>.model`` when
        the registry has no such model (a unit accepted under another registry)."""
        name = self.name_of(prompt)
        route = self.routes.get(name)
        if route is None:
            raise InvalidInput(
                f"{field}.{MODEL_FIELD}",
                f"{name!r} is not a model of this deployment (models: {', '.join(self.names)})",
            )
        return route

    def check(
        self, prompt: Any, allowed: frozenset[str] | None, field: str = "input"
    ) -> ModelRoute:
        """:meth:`of`, and the tenant may use it (``allowed``: the tenant's models; None: all)."""
        route = self.of(prompt, field)
        if allowed is not None and route.name not in allowed:
            granted = ", ".join(sorted(allowed)) or "none"
            raise InvalidInput(
                f"{field}.{MODEL_FIELD}",
                f"the tenant may not use model {route.name!r} (its models: {granted})",
            )
        return route
