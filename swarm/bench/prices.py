"""AWS list prices, US East (N. Virginia), for what the local stack's meter counts
(:mod:`swarm.local.billing`): one table, dated, each price with the page that publishes it.

On-demand list prices of the first usage tier, free tiers left out (a bill per unit at scale is
past them). Compiled on :data:`AS_OF` from the pages named (and the rules quoted beside each
price in :mod:`swarm.local.billing`); prices change: check the pages before relying on a figure,
and change a price here, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.local import billing

AS_OF = "2026-12-01"
REGION = "us-east-1"


@dataclass(frozen=True)
class Price:
    usd: float  # US dollars per ``per`` of ``unit``
    per: int
    unit: str
    source: str
    note: str = ""

    @property
    def usd_per_unit(self) -> float:
        return self.usd / self.per


PRICES: dict[str, Price] = {
    billing.DYNAMODB_WRITE: Price(
        0.625,
        1_000_000,
        "write request units (on-demand, Standard table class)",
        "https://aws.amazon.com/dynamodb/pricing/on-demand/",
        "since 2024-11-01 (halved from $1.25)",
    ),
    billing.DYNAMODB_READ: Price(
        0.125,
        1_000_000,
        "read request units (on-demand, Standard table class)",
        "https://aws.amazon.com/dynamodb/pricing/on-demand/",
        "since 2024-11-01 (halved from $0.25)",
    ),
    billing.SQS_REQUESTS: Price(
        0.40,
        1_000_000,
        "requests (standard queues, each 64 KB chunk of a payload one request)",
        "https://aws.amazon.com/sqs/pricing/",
        "the lanes are fair queues (standard queues with a message group); no surcharge "
        "assumed for that",
    ),
    billing.S3_PUT: Price(
        0.005,
        1_000,
        "PUT, COPY, POST and LIST requests (S3 Standard)",
        "https://aws.amazon.com/s3/pricing/",
    ),
    billing.S3_GET: Price(
        0.0004,
        1_000,
        "GET, SELECT and all other requests (S3 Standard)",
        "https://aws.amazon.com/s3/pricing/",
    ),
    billing.S3_DELETE: Price(
        0.0, 1_000, "DELETE and CANCEL requests (free)", "https://aws.amazon.com/s3/pricing/"
    ),
    billing.SFN_TRANSITIONS: Price(
        0.025,
        1_000,
        "state transitions (Standard workflows; one per child a Distributed Map starts)",
        "https://aws.amazon.com/step-functions/pricing/",
    ),
    billing.SFN_EXPRESS_REQUESTS: Price(
        1.00,
        1_000_000,
        "requests (Express workflows)",
        "https://aws.amazon.com/step-functions/pricing/",
    ),
    billing.SFN_EXPRESS_GB_S: Price(
        0.00001667,
        1,
        "GB-seconds (Express workflows: 100 ms, 64 MB increments; first 1,000 GB-hours a "
        "month, $0.06 per GB-hour)",
        "https://aws.amazon.com/step-functions/pricing/",
    ),
    billing.LAMBDA_REQUESTS: Price(
        0.20, 1_000_000, "requests", "https://aws.amazon.com/lambda/pricing/"
    ),
    billing.LAMBDA_GB_S["x86_64"]: Price(
        0.0000166667,
        1,
        "GB-seconds (x86, first 6 billion GB-seconds a month; 1 ms increments)",
        "https://aws.amazon.com/lambda/pricing/",
    ),
    billing.LAMBDA_GB_S["arm64"]: Price(
        0.0000133334,
        1,
        "GB-seconds (Arm, first 7.5 billion GB-seconds a month; 1 ms increments)",
        "https://aws.amazon.com/lambda/pricing/",
    ),
    billing.EVENTS: Price(
        1.00,
        1_000_000,
        "custom events published (each 64 KB chunk of an entry one event)",
        "https://aws.amazon.com/eventbridge/pricing/",
    ),
    billing.SSM_STANDARD: Price(
        0.0,
        10_000,
        "Parameter Store API interactions, standard throughput (free; higher throughput "
        "would be $0.05 per 10,000)",
        "https://aws.amazon.com/systems-manager/pricing/",
    ),
    billing.APIGW_REST: Price(
        3.50,
        1_000_000,
        "REST API requests (first 333 million a month)",
        "https://aws.amazon.com/api-gateway/pricing/",
    ),
    billing.NOT_BILLED: Price(
        0.0,
        1,
        "requests AWS does not charge for (control plane, a Standard workflow's API, errors)",
        "the pricing pages above",
    ),
}


def price_of(key: str) -> Price:
    """The price of a meter's key; a key without one is an error naming it (a new service the
    meter counts needs its price here)."""
    try:
        return PRICES[key]
    except KeyError:
        raise KeyError(
            f"no price for {key!r} in swarm/bench/prices.py: add it, with its source"
        ) from None
