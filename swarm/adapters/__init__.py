"""Adapters: the core's ports (:mod:`swarm.core.ports`) on AWS services, and the simulated model
plane. AWS clients are injected (tests, the local runtime) or created on first use (Lambda), never
at import time; botocore errors are recognised by error code (:mod:`.client_errors`).

DynamoDB, two tables: the governor's (:mod:`.dynamodb_governor`, docs/explanation/governor.md) and
the ledger's (:mod:`.dynamodb_ledger`, :mod:`.dynamodb_items`, :mod:`.dynamodb_watch`,
docs/explanation/ledger.md); :mod:`.dynamodb` holds what they share.
"""
