"""Thin Lambda handlers: parse the event, call the core in swarm/, map the result."""
