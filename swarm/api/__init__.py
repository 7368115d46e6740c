"""The batch API's contract, in one place: every request and response body as a pydantic model
(:mod:`swarm.api.models`) and the routes (:mod:`swarm.api.openapi`).

Everything else is derived from it: the handler and the service validate and answer with these
models, API Gateway's request models (``infra/api.py``) and ``docs/openapi.json`` are generated
from their JSON schemas. It depends on the core and pydantic only, so the handler, the service and
the CDK app can all import it.
"""
