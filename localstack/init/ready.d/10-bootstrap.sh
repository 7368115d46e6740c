#!/usr/bin/env bash
# Runs inside LocalStack once it is ready: the drain parameter's default, for `swarm drain status`.
set -euo pipefail
STAGE="${SWARM_STAGE:-dev}"
awslocal ssm put-parameter --name "/swarm/${STAGE}/drain" --value off --type String --overwrite >/dev/null || true
echo "swarm: LocalStack ready for stage ${STAGE}"
