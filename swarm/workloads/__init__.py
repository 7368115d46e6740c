"""Workloads nobody here wrote, as agent units: each module imports its benchmark's own package
(not a dependency of the control plane's runtime), so nothing under swarm.core, swarm.service or
the Lambda functions imports this package."""
