"""Money: prices, a call's usage and its cost, as exact integers (docs/explanation/ledger.md,
"Money").

Prices are given as US dollars per million tokens (decimals, at most 6 places: cdk.json's
``model.prices``) and kept as whole *micro-dollars* per million tokens, so a cost is an integer
sum of products, divided once and rounded up to a whole micro-dollar per attempt (or per agent
turn): never a float anywhere in the ledger or the API's arithmetic.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from swarm.core.errors import InvalidInput

#: micro-dollars in a dollar; prices are per this many tokens too
MICRO: Final = 1_000_000
#: the decimals a dollar amount may have: one micro-dollar
USD_PLACES: Final = 6
#: the most a price may be, in dollars per million tokens (a typo guard: the dearest Bedrock
#: text model is well below this)
MAX_PRICE_USD: Final = 10_000
#: the four rates of a price table, in the contract's order
RATES: Final = ("input", "output", "cache_read", "cache_write")


def parse_usd(value: Any, field: str, *, positive: bool = False, maximum: int | None = None) -> int:
    """A dollar amount (a JSON number or a decimal string, at most 6 decimal places) as whole
    micro-dollars; ``positive``: more than 0, else at least 0; ``maximum``: in dollars. A bad
    amount is an :class:`InvalidInput` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise InvalidInput(field, f"must be a dollar amount (a number), got {value!r}")
    try:
        # str() of a float is its shortest exact repr (0.8 -> "0.8"): no binary noise
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise InvalidInput(field, f"must be a dollar amount (a number), got {value!r}") from None
    if not amount.is_finite():
        raise InvalidInput(field, f"must be a finite dollar amount, got {value!r}")
    micro = amount * MICRO
    if micro != micro.to_integral_value():
        raise InvalidInput(
            field,
            f"{value!r} has more than {USD_PLACES} decimal places: give whole micro-dollars "
            f"(e.g. {amount.quantize(Decimal(1).scaleb(-USD_PLACES))})",
        )
    if amount < 0 or (positive and amount == 0):
        raise InvalidInput(field, f"must be {'> 0' if positive else '>= 0'}, got {value!r}")
    if maximum is not None and amount > maximum:
        raise InvalidInput(field, f"must be at most {maximum:,} dollars, got {value!r}")
    return int(micro)


def usd(micro: int) -> str:
    """Whole micro-dollars as an exact decimal text of dollars, e.g. ``"1.250000"``."""
    sign = "-" if micro < 0 else ""
    whole, frac = divmod(abs(micro), MICRO)
    return f"{sign}{whole}.{frac:06d}"


def usd_decimal(micro: int) -> Decimal:
    """Whole micro-dollars as an exact Decimal of dollars (the API's figures)."""
    return Decimal(micro).scaleb(-USD_PLACES)


@dataclass(frozen=True)
class Prices:
    """A model's on-demand prices as of a date: whole micro-dollars per million tokens of each
    kind (input, output, cache read, cache write)."""

    as_of: dt.date
    input: int
    output: int
    cache_read: int
    cache_write: int

    def __post_init__(self) -> None:
        for rate in RATES:
            value = getattr(self, rate)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidInput(
                    f"prices.{rate}", f"must be whole micro-dollars >= 0, got {value!r}"
                )

    @classmethod
    def parse(cls, doc: Any, field: str = "model.prices") -> Prices:
        """The contract's ``prices`` block: ``as_of`` (an ISO date) and each rate in US dollars
        per million tokens (at most 6 decimal places). Errors name ``<field>.<key>``."""
        if not isinstance(doc, Mapping):
            raise InvalidInput(
                field,
                'must be an object: {"as_of": "YYYY-MM-DD", "input": ..., "output": ..., '
                '"cache_read": ..., "cache_write": ...} in US dollars per million tokens',
            )
        unknown = sorted(set(doc) - {"as_of", *RATES})
        if unknown:
            raise InvalidInput(
                f"{field}.{unknown[0]}",
                f"is not a price; give as_of and {', '.join(RATES)} (dollars per million tokens)",
            )
        for name in ("as_of", *RATES):
            if name not in doc:
                raise InvalidInput(f"{field}.{name}", "is missing")
        raw = doc["as_of"]
        try:
            as_of = dt.date.fromisoformat(raw) if isinstance(raw, str) else None
        except ValueError:
            as_of = None
        if as_of is None:
            raise InvalidInput(
                f"{field}.as_of", f"must be the date the prices were read, YYYY-MM-DD: got {raw!r}"
            )
        rates = {
            rate: parse_usd(doc[rate], f"{field}.{rate}", maximum=MAX_PRICE_USD) for rate in RATES
        }
        return cls(as_of=as_of, **rates)

    def to_doc(self) -> dict[str, Any]:
        """As kept (the environment, the ledger's spec and attempts): the date and the rates in
        whole micro-dollars per million tokens."""
        return {"as_of": self.as_of.isoformat(), **{rate: getattr(self, rate) for rate in RATES}}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Prices:
        return cls(
            as_of=dt.date.fromisoformat(str(doc["as_of"])),
            **{rate: int(doc[rate]) for rate in RATES},
        )

    def to_usd(self) -> dict[str, Any]:
        """As the contract's ``prices`` block: dollars per million tokens, exact decimal text."""
        return {"as_of": self.as_of.isoformat(), **{r: usd(getattr(self, r)) for r in RATES}}


@dataclass(frozen=True)
class Usage:
    """What a model call reports: its input, output, cache read and cache write tokens."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    def __post_init__(self) -> None:
        for kind in RATES:
            value = getattr(self, kind)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidInput(f"usage.{kind}", f"must be a whole number >= 0, got {value!r}")

    @property
    def tokens(self) -> int:
        return self.input + self.output + self.cache_read + self.cache_write

    @classmethod
    def of_converse(cls, usage: Mapping[str, Any]) -> Usage:
        """Bedrock Converse's ``usage`` (``inputTokens``, ``outputTokens``,
        ``cacheReadInputTokens``, ``cacheWriteInputTokens``; absent: 0)."""
        return cls(
            input=int(usage.get("inputTokens", 0) or 0),
            output=int(usage.get("outputTokens", 0) or 0),
            cache_read=int(usage.get("cacheReadInputTokens", 0) or 0),
            cache_write=int(usage.get("cacheWriteInputTokens", 0) or 0),
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, k) + getattr(other, k) for k in RATES))


def ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def cost_micro(usage: Usage, prices: Prices) -> int:
    """What ``usage`` costs at ``prices``, in whole micro-dollars: each kind of token at its own
    rate, summed exactly, rounded up once (so an attempt is never billed below its price)."""
    total = sum(getattr(usage, kind) * getattr(prices, kind) for kind in RATES)
    return ceil_div(total, MICRO)


def projected_cost_micro(input_bound: int, output_bound: int, prices: Prices) -> int:
    """The most an attempt of ``input_bound`` input tokens and ``output_bound`` output tokens can
    cost: its input at the dearest input rate (input, cache read or cache write: the provider
    decides which are cached), its output at the output rate, rounded up."""
    if min(input_bound, output_bound) < 0:
        raise InvalidInput("projection", "input and output bounds must be >= 0")
    dearest_input = max(prices.input, prices.cache_read, prices.cache_write)
    return ceil_div(input_bound * dearest_input + output_bound * prices.output, MICRO)


@dataclass(frozen=True)
class Priced:
    """A settlement's money: the cost of the usage it bills, and the prices it was priced at."""

    cost_micro: int
    prices: Prices

    def __post_init__(self) -> None:
        if not isinstance(self.cost_micro, int) or self.cost_micro < 0:
            raise InvalidInput("cost_micro", f"must be whole micro-dollars >= 0, got {self!r}")


def priced(usage: Usage, prices: Prices | None) -> Priced | None:
    """``usage`` priced at ``prices`` (None: the deployment has no prices)."""
    return None if prices is None else Priced(cost_micro(usage, prices), prices)


def prices_table_from_env(text: str | None) -> dict[str, Prices]:
    """The worker's environment's price table (``SWARM_MODEL_PRICES``: JSON, a model name to its
    prices as :meth:`Prices.to_doc` keeps them); empty when not set."""
    if not text:
        return {}
    doc = json.loads(text)
    return {str(name): Prices.from_doc(p) for name, p in doc.items()}


def prices_table_to_env(table: Mapping[str, Prices]) -> str:
    return json.dumps({name: p.to_doc() for name, p in table.items()}, separators=(",", ":"))


def unit_cost_bound(tokens: int, output_bound: int, prices: Prices) -> int:
    """The most one attempt of a unit that bills at most ``tokens`` (input and output together),
    at most ``output_bound`` of them output, can cost: what a budget in dollars reserves for it.
    An agent unit's loop splits its tokens any way: give ``output_bound = tokens``."""
    output_bound = max(0, min(tokens, output_bound))
    return max(
        projected_cost_micro(tokens - output_bound, output_bound, prices),
        projected_cost_micro(tokens, 0, prices),
    )
