"""The swarm control plane: a queue, a fleet, a governor and a ledger for LLM agent work units."""

__version__ = "0.1.0"
