#!/usr/bin/env bash
# The whole check on this host: make it ready (deploy/bootstrap.sh, with the data-science image that
# some tests use), lint, check formatting and types, then run the test suite under branch coverage
# and print its total. Extra arguments go to pytest (e.g. `bash deploy/test.sh tests/fleet -x`).
#
#   SANDFLEET_SKIP_CHECKS=1   run only the tests (no ruff, no mypy)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${SANDFLEET_VENV:-$REPO/.venv}
cd "$REPO"

step() { printf '\033[1m[test]\033[0m %s\n' "$*" >&2; }

SANDFLEET_DATA_SCIENCE=1 bash "$REPO/deploy/bootstrap.sh"

if [ "${SANDFLEET_SKIP_CHECKS:-0}" != 1 ]; then
  step "ruff check"
  "$VENV/bin/ruff" check .
  step "ruff format --check"
  "$VENV/bin/ruff" format --check .
  step "mypy (strict for sandfleet.core and the producer)"
  "$VENV/bin/mypy"
fi

if [ $# -eq 0 ]; then
  # The Docker-free level must really be Docker-free: run it with no engine reachable at all.
  step "pytest -m 'not docker' with no Docker engine reachable"
  DOCKER_HOST=unix:///nonexistent/docker.sock "$VENV/bin/pytest" -q -m "not docker" -p no:cacheprovider
fi

step "pytest under branch coverage"
status=0
"$VENV/bin/coverage" run -m pytest "$@" || status=$?
"$VENV/bin/coverage" report --format=total >/dev/null 2>&1 \
  && step "branch coverage of sandfleet (this process; worker subprocesses not counted): $("$VENV/bin/coverage" report --format=total)%"
exit "$status"
