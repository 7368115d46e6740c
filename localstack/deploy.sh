#!/usr/bin/env bash
# Deploy the stack into LocalStack with cdklocal (needs Docker, a LocalStack token, and
# `npm install -g aws-cdk-local` or `npx cdklocal`). Usage: localstack/deploy.sh [stage]
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE="${1:-dev}"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}"
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}"
export CDK_DISABLE_VERSION_CHECK=1 JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20
docker compose -f localstack/docker-compose.yml up -d
for _ in $(seq 1 60); do
  if curl -fs http://127.0.0.1:4566/_localstack/health >/dev/null; then break; fi
  sleep 2
done
npx cdklocal bootstrap -c stage="${STAGE}"
npx cdklocal deploy -c stage="${STAGE}" --require-approval never
echo "deployed Swarm-${STAGE}; point the CLI at it with: swarm --stack Swarm-${STAGE} (AWS_ENDPOINT_URL=http://127.0.0.1:4566)"
