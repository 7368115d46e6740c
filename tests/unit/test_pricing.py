"""Money as exact integers (swarm.core.pricing): prices parsed from dollars per million tokens,
costs of usage rounded up once per attempt, projections of a unit's most expensive attempt."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarm.core.errors import InvalidInput
from swarm.core.pricing import (
    Prices,
    Usage,
    cost_micro,
    parse_usd,
    prices_table_from_env,
    prices_table_to_env,
    projected_cost_micro,
    unit_cost_bound,
    usd,
)

HAIKU = {"as_of": "2026-12-06", "input": 0.80, "output": 4.00, "cache_read": 0.08,
         "cache_write": 1.00}  # fmt: skip


def haiku() -> Prices:
    return Prices.parse(HAIKU)


def test_prices_are_whole_micro_dollars_per_million_tokens() -> None:
    p = haiku()
    assert p == Prices(dt.date(2026, 12, 6), 800_000, 4_000_000, 80_000, 1_000_000)
    assert p.to_usd() == {"as_of": "2026-12-06", "input": "0.800000", "output": "4.000000",
                          "cache_read": "0.080000", "cache_write": "1.000000"}  # fmt: skip


def test_a_cost_is_each_kind_at_its_rate_rounded_up_once() -> None:
    p = haiku()
    # 1,000 in ($0.0008), 500 out ($0.002), 2,000 cache reads ($0.00016), 100 writes ($0.0001)
    assert cost_micro(Usage(1_000, 500, 2_000, 100), p) == 800 + 2_000 + 160 + 100
    # one input token costs 0.8 micro-dollars: a whole micro-dollar, rounded up
    assert cost_micro(Usage(input=1), p) == 1
    # rounded once over the sum, not per kind: 1 in (0.8) + 1 cache read (0.08) = 0.88 -> 1
    assert cost_micro(Usage(input=1, cache_read=1), p) == 1
    assert cost_micro(Usage(), p) == 0


@given(st.integers(0, 10**7), st.integers(0, 10**7), st.integers(0, 10**7), st.integers(0, 10**7))
def test_a_cost_is_exact_never_below_the_price_and_less_than_a_micro_dollar_above(
    i: int, o: int, r: int, w: int
) -> None:
    p = haiku()
    exact = (Decimal(i) * Decimal("0.80") + Decimal(o) * Decimal("4.00")
             + Decimal(r) * Decimal("0.08") + Decimal(w) * Decimal("1.00"))  # fmt: skip
    micro = exact  # dollars per million tokens x tokens = micro-dollars
    got = cost_micro(Usage(i, o, r, w), p)
    assert isinstance(got, int)
    assert micro <= got < micro + 1


def test_a_units_projection_is_its_dearest_split_of_tokens() -> None:
    p = haiku()
    # 1,000 tokens at most, 300 of them output: 700 at the dearest input rate (cache write,
    # $1.00) and 300 at $4.00
    assert unit_cost_bound(1_000, 300, p) == projected_cost_micro(700, 300, p) == 700 + 1_200
    # an agent unit's loop splits its tokens any way: all output
    assert unit_cost_bound(1_000, 1_000, p) == 4_000
    # were input dearer than output, all input
    dear_input = Prices(dt.date(2026, 1, 1), 9_000_000, 1_000_000, 0, 0)
    assert unit_cost_bound(1_000, 300, dear_input) == 9_000


@given(st.integers(1, 10**6), st.integers(0, 10**6), st.data())
def test_no_usage_within_a_units_bounds_costs_more_than_its_projection(
    tokens: int, bound: int, data: st.DataObject
) -> None:
    p = haiku()
    bound = min(bound, tokens)
    output = data.draw(st.integers(0, bound))
    rest = tokens - output
    read = data.draw(st.integers(0, rest))
    write = data.draw(st.integers(0, rest - read))
    usage = Usage(rest - read - write, output, read, write)
    assert cost_micro(usage, p) <= unit_cost_bound(tokens, bound, p)


@pytest.mark.parametrize(
    ("value", "micro"),
    [(0.8, 800_000), (4, 4_000_000), ("0.000001", 1), (Decimal("12.345678"), 12_345_678),
     (0, 0), ("1e-6", 1)],
)  # fmt: skip
def test_dollars_parse_to_micro_dollars_exactly(value: Any, micro: int) -> None:
    assert parse_usd(value, "x") == micro


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (0.1234567, "more than 6 decimal places"),
        ("1.0000001", "more than 6 decimal places"),
        (-1, ">= 0"),
        (True, "a dollar amount"),
        (None, "a dollar amount"),
        ("lots", "a dollar amount"),
        ("nan", "finite"),
        (float("inf"), "finite"),
    ],
)
def test_bad_dollar_amounts_are_refused_naming_the_field(value: Any, says: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_usd(value, "budget_usd")
    assert e.value.field == "budget_usd"
    assert says in e.value.message


def test_a_positive_amount_refuses_zero_and_a_maximum_refuses_more() -> None:
    with pytest.raises(InvalidInput, match="> 0"):
        parse_usd(0, "top_up_usd", positive=True)
    with pytest.raises(InvalidInput, match="at most 10 dollars"):
        parse_usd(10.5, "x", maximum=10)


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"input": 0.1234567}, "model.prices.input", "more than 6 decimal places"),
        ({"output": -4}, "model.prices.output", ">= 0"),
        ({"cache_read": "cheap"}, "model.prices.cache_read", "a dollar amount"),
        ({"cache_write": 20_000}, "model.prices.cache_write", "at most 10,000"),
        ({"as_of": "06/12/2026"}, "model.prices.as_of", "YYYY-MM-DD"),
        ({"as_of": None}, "model.prices.as_of", "YYYY-MM-DD"),
        ({"currency": "EUR"}, "model.prices.currency", "is not a price"),
    ],
)
def test_bad_prices_are_refused_naming_the_key(
    change: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(InvalidInput) as e:
        Prices.parse({**HAIKU, **change})
    assert e.value.field == field
    assert says in e.value.message


def test_a_missing_price_or_block_is_named() -> None:
    with pytest.raises(InvalidInput) as e:
        Prices.parse({k: v for k, v in HAIKU.items() if k != "cache_write"})
    assert e.value.field == "model.prices.cache_write"
    with pytest.raises(InvalidInput) as e:
        Prices.parse([0.8, 4.0])
    assert e.value.field == "model.prices"


def test_the_price_table_travels_in_the_environment_unchanged() -> None:
    table = {"default": haiku()}
    assert prices_table_from_env(prices_table_to_env(table)) == table
    assert prices_table_from_env("") == {}


def test_usd_is_exact_decimal_text() -> None:
    assert usd(0) == "0.000000"
    assert usd(1) == "0.000001"
    assert usd(12_345_678) == "12.345678"
    assert usd(-5) == "-0.000005"


def test_converse_usage_reads_the_cache_fields_and_defaults_to_zero() -> None:
    usage = Usage.of_converse(
        {"inputTokens": 10, "outputTokens": 5, "totalTokens": 45,
         "cacheReadInputTokens": 20, "cacheWriteInputTokens": 10}
    )  # fmt: skip
    assert usage == Usage(10, 5, 20, 10)
    assert usage.tokens == 45
    assert Usage.of_converse({"inputTokens": 3, "outputTokens": 4}) == Usage(3, 4)
