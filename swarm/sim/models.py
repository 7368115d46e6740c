"""Several models in the simulator and the planner: the registry's catalog, a unit mix across
it, and money as exact integers.

The catalog has cdk.json's ``models`` shape (docs/explanation/planner.md, "Several models")::

    "models": {"default": "haiku",
               "catalog": {"haiku": {"model_id": "...", "tpm": 300000, "rpm": 1000,
                                     "output_burndown": 1, "governor_share": 0.95,
                                     "prices": {"as_of": "2026-12-01", "input": 0.80,
                                                "output": 4.00, "cache_read": 0.08,
                                                "cache_write": 1.00}}}}

read from a cdk.json (``context.models``) or from a file holding the ``models`` object (or just
its body). Each model has its own quota (``tpm``; ``rpm`` when given, else no request bucket),
its output burndown (default: the rate Bedrock documents for its model id) and its governed
share (default: the fleet's). Prices are US dollars per million tokens with at most 6 decimal
places, kept here as whole micro-dollars per million tokens, so a cost is an exact integer.

A unit mix (``haiku=0.8,sonnet=0.2``) sends that fraction of a workload's units to each model:
the counts by largest remainder, which unit goes where drawn from the workload's seed. A unit
of ``t`` tokens writes ``floor(t x output_share)`` of them (its output) and reads the rest; its
draw from its model's governor counts the output ``output_burndown`` times
(:func:`swarm.core.burndown.call_draw`), and one request from the request bucket.

Pure: standard library and :mod:`swarm.core` only (no infra).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm.core.burndown import call_draw, check_burndown, documented_burndown
from swarm.core.errors import InvalidInput
from swarm.core.pricing import Prices, Usage, cost_micro

#: micro-dollars in a dollar: prices and costs are whole micro-dollars
MICRO = 1_000_000
#: tokens a price is quoted for
PER_TOKENS = 1_000_000
#: the share of a one-call unit's tokens that is output when ``--output-share`` is not given
DEFAULT_OUTPUT_SHARE = 0.2

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def dollars(micros: int) -> str:
    """Whole micro-dollars printed as dollars, exactly (``$1,234.567891``; cents at least)."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), MICRO)
    digits = f"{frac:06d}".rstrip("0")
    digits = digits + "0" * max(0, 2 - len(digits))
    return f"{sign}${whole:,}.{digits}"


@dataclass(frozen=True)
class ModelSpec:
    """One catalog entry, as the simulator needs it."""

    name: str
    model_id: str
    tpm: int
    rpm: int | None
    output_burndown: float
    governor_share: float | None  # None: the fleet's share
    prices: Prices | None  # None: no cost for this model

    def share(self, fleet_share: float) -> float:
        return fleet_share if self.governor_share is None else self.governor_share


def _whole(value: Any, field: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(field, f"must be a whole number of {what} >= 1, got {value!r}")
    return value


def parse_model(name: str, doc: Any, field: str) -> ModelSpec:
    if not isinstance(doc, Mapping):
        raise InvalidInput(field, f"must be an object (model_id, tpm, ...), got {doc!r}")
    model_id = doc.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        raise InvalidInput(f"{field}.model_id", "is missing: give the Bedrock model id")
    if "tpm" not in doc:
        raise InvalidInput(
            f"{field}.tpm", "is missing: give the model's quota in tokens per minute"
        )
    tpm = _whole(doc["tpm"], f"{field}.tpm", "tokens per minute")
    rpm = doc.get("rpm")
    if rpm is not None:
        rpm = _whole(rpm, f"{field}.rpm", "requests per minute (or null: no request bucket)")
    burndown = doc.get("output_burndown")
    if burndown is None:
        burndown = documented_burndown(model_id)
    else:
        try:
            burndown = check_burndown(burndown)
        except ValueError as e:
            raise InvalidInput(f"{field}.output_burndown", str(e)) from None
    share = doc.get("governor_share")
    if share is not None and (
        isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1
    ):
        raise InvalidInput(f"{field}.governor_share", f"must be in (0, 1], got {share!r}")
    prices = doc.get("prices")
    return ModelSpec(
        name=name,
        model_id=model_id,
        tpm=tpm,
        rpm=rpm,
        output_burndown=burndown,
        governor_share=None if share is None else float(share),
        prices=None if prices is None else Prices.parse(prices, f"{field}.prices"),
    )


@dataclass(frozen=True)
class Catalog:
    default: str
    models: Mapping[str, ModelSpec]

    def __getitem__(self, name: str) -> ModelSpec:
        return self.models[name]


def parse_catalog(doc: Any, where: str = "models") -> Catalog:
    """The ``models`` object (``default`` and ``catalog``); errors name ``where.key...``."""
    if not isinstance(doc, Mapping):
        raise InvalidInput(where, f"must be an object with default and catalog, got {doc!r}")
    catalog = doc.get("catalog")
    if not isinstance(catalog, Mapping) or not catalog:
        raise InvalidInput(
            f"{where}.catalog", "is missing or empty: give at least one model by name"
        )
    models: dict[str, ModelSpec] = {}
    for name, entry in catalog.items():
        if not _NAME.match(str(name)):
            raise InvalidInput(
                f"{where}.catalog.{name}",
                "is not a model name: letters, digits, '.', '_' and '-', at most 64",
            )
        models[name] = parse_model(name, entry, f"{where}.catalog.{name}")
    default = doc.get("default")
    if default is None and len(models) == 1:
        default = next(iter(models))
    if not isinstance(default, str) or default not in models:
        raise InvalidInput(
            f"{where}.default",
            f"must name a model of the catalog ({', '.join(models)}), got {default!r}",
        )
    return Catalog(default=default, models=models)


def load_catalog(path: Path) -> Catalog:
    """The catalog from a cdk.json (``context.models``), a file with a ``models`` object, or a
    file that is the ``models`` object itself."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InvalidInput("--models", f"cannot read {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidInput(
            "--models", f"{path} is not valid JSON ({e.msg} at line {e.lineno})"
        ) from None
    if isinstance(doc, dict) and isinstance(doc.get("context"), dict):
        if "models" not in doc["context"]:
            raise InvalidInput(
                "--models", f"{path} has a context without models: add context.models"
            )
        return parse_catalog(doc["context"]["models"], "context.models")
    if isinstance(doc, dict) and "models" in doc:
        return parse_catalog(doc["models"], "models")
    if isinstance(doc, dict) and "catalog" in doc:
        return parse_catalog(doc, "models")
    raise InvalidInput(
        "--models",
        f"{path} has no models: give a cdk.json (context.models) or a file with a models "
        "object (default and catalog)",
    )


@dataclass(frozen=True)
class Mix:
    """The fraction of a workload's units each model takes (in the mix's order)."""

    parts: tuple[tuple[str, float], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.parts)

    def text(self) -> str:
        return ",".join(f"{name}={fraction:g}" for name, fraction in self.parts)

    def counts(self, units: int) -> dict[str, int]:
        """Units per model: ``units x fraction`` rounded by largest remainder (ties: the mix's
        order), so the counts add up to ``units``."""
        floors = {name: math.floor(units * f) for name, f in self.parts}
        left = units - sum(floors.values())
        by_rest = sorted(
            range(len(self.parts)),
            key=lambda i: -(units * self.parts[i][1] - floors[self.parts[i][0]]),
        )
        for i in by_rest[:left]:
            floors[self.parts[i][0]] += 1
        return floors

    def assign(self, units: int, seed: int) -> tuple[str, ...]:
        """The model of each unit, by index: the counts, shuffled on the workload's seed."""
        names = [name for name, n in self.counts(units).items() for _ in range(n)]
        random.Random(f"{seed}:models").shuffle(names)
        return tuple(names)


def parse_mix(text: str, catalog: Catalog | None) -> Mix:
    """``name=fraction,...``: every name in the catalog (None: any model name, the deployment
    checks them), once; fractions in (0, 1] adding up to 1 (to within 1e-9)."""
    parts: list[tuple[str, float]] = []
    for piece in (p.strip() for p in text.split(",")):
        name, eq, value = piece.partition("=")
        name = name.strip()
        if not eq or not name:
            raise InvalidInput(
                "--mix", f"{piece!r} is not name=fraction: give e.g. haiku=0.8,sonnet=0.2"
            )
        if catalog is not None and name not in catalog.models:
            raise InvalidInput(
                "--mix",
                f"{name!r} is not a model of the catalog: use one of {', '.join(catalog.models)}",
            )
        if name in dict(parts):
            raise InvalidInput("--mix", f"{name!r} appears more than once")
        try:
            fraction = float(value)
        except ValueError:
            fraction = math.nan
        if not 0 < fraction <= 1:
            raise InvalidInput(
                "--mix", f"{name}'s fraction must be a number in (0, 1], got {value.strip()!r}"
            )
        parts.append((name, fraction))
    total = math.fsum(f for _, f in parts)
    if abs(total - 1) > 1e-9:
        raise InvalidInput("--mix", f"the fractions add up to {total:g}, not 1: make them sum to 1")
    return Mix(tuple(parts))


@dataclass(frozen=True)
class Models:
    """The models a simulated fleet runs on: the catalog, the mix, and the output share of a
    one-call unit's tokens."""

    catalog: Catalog
    mix: Mix
    output_share: float = DEFAULT_OUTPUT_SHARE
    #: each unit's model by index, when the units name theirs (a manifest's ``input.model``);
    #: else the mix assigns them
    per_unit: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.output_share <= 1:
            raise InvalidInput("output_share", f"must be in [0, 1], got {self.output_share!r}")
        for name in (*self.mix.names, *self.per_unit):
            if name not in self.catalog.models:
                raise InvalidInput("mix", f"{name!r} is not a model of the catalog")
        if self.per_unit and set(self.per_unit) != set(self.mix.names):
            raise InvalidInput("mix", "give the units' own models with Models.named")

    @classmethod
    def named(
        cls, catalog: Catalog, per_unit: Sequence[str], output_share: float = DEFAULT_OUTPUT_SHARE
    ) -> Models:
        """Units that name their models (by index); the mix is what they add up to."""
        if not per_unit:
            raise InvalidInput("units", "a workload needs at least one unit")
        counts: dict[str, int] = {}
        for name in per_unit:
            counts[name] = counts.get(name, 0) + 1
        mix = Mix(tuple((name, n / len(per_unit)) for name, n in counts.items()))
        return cls(catalog, mix, output_share, tuple(per_unit))

    def assign(self, units: int, seed: int) -> tuple[str, ...]:
        """Each unit's model, by index: its own, or the mix's draw on the seed."""
        if not self.per_unit:
            return self.mix.assign(units, seed)
        if len(self.per_unit) != units:
            raise InvalidInput(
                "units", f"{len(self.per_unit)} units name their models, the workload has {units}"
            )
        return self.per_unit

    @classmethod
    def default(cls, catalog: Catalog, output_share: float = DEFAULT_OUTPUT_SHARE) -> Models:
        """Every unit on the catalog's default model."""
        return cls(catalog, Mix(((catalog.default, 1.0),)), output_share)

    @property
    def used(self) -> tuple[ModelSpec, ...]:
        return tuple(self.catalog[name] for name in self.mix.names)

    def output_tokens(self, tokens: int) -> int:
        """The output part of a one-call unit of ``tokens`` billed tokens."""
        return math.floor(tokens * self.output_share)

    def draw(self, model: str, tokens: int) -> int:
        """A one-call unit's draw from its model's bucket, in quota tokens."""
        spec = self.catalog[model]
        return call_draw(tokens, self.output_tokens(tokens), spec.output_burndown)

    def cost_micro_usd(self, model: str, attempt_tokens: Sequence[int]) -> int | None:
        """What these attempts of ``model``'s units cost (None: the model has no prices)."""
        prices = self.catalog[model].prices
        if prices is None:
            return None
        return sum(
            cost_micro(Usage(input=t - self.output_tokens(t), output=self.output_tokens(t)), prices)
            for t in attempt_tokens
        )
