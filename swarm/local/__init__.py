"""Local emulation: patches that make moto faithful enough to test the control plane on, and
helpers that run an embedded, patched moto server (see docs/local-aws.md)."""
