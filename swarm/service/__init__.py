"""The application layer: what each Lambda function does, as plain code over ports.

Handlers in ``functions/`` parse an event, call one of these services and map the result; the
services hold the control plane's behaviour (submission, fan-out, the worker's loop, dead letters,
finalization, draining) and depend only on the core and on the ports in :mod:`swarm.core.ports`, so
they run the same on AWS adapters, on moto, and on the in-memory implementations of
:mod:`swarm.core.memory` in the unit tests.
"""
