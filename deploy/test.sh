#!/usr/bin/env bash
# The whole test suite on this host: make it ready (deploy/bootstrap.sh, with the data-science image
# that some tests use), then run pytest. Extra arguments go to pytest.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${SANDFLEET_VENV:-$REPO/.venv}
cd "$REPO"

SANDFLEET_DATA_SCIENCE=1 bash "$REPO/deploy/bootstrap.sh"
exec "$VENV/bin/pytest" "$@"
