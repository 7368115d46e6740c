"""CDK infrastructure: one stack composing one construct per capability."""
