"""The whole stack without an AWS account: the synthesized template deployed into an embedded,
patched moto server (:mod:`swarm.local.stack`), with the parts moto does not play (API Gateway,
the Lambda pollers, EventBridge rules, the functions themselves). See docs/explanation/local.md."""
