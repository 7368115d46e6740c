"""The swarm control plane: a queue, a fleet, a governor and a ledger for LLM agent work units."""

__version__ = "0.3.0"  # pyproject.toml's version (tests/unit/test_docs.py checks they agree)
