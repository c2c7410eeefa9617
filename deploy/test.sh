#!/usr/bin/env bash
# The whole check on this host: make it ready (deploy/bootstrap.sh, with the data-science image that
# some tests use), lint, check formatting and types, then run the test suite under branch coverage
# and print its total. Extra arguments go to one pytest run instead (e.g. `bash deploy/test.sh tests/fleet -x`).
#
#   SANDFLEET_SKIP_CHECKS=1       run only the tests (no ruff, no mypy)
#   SANDFLEET_TEST_PROCESSES=N    test processes for the Docker-bound tests (default 4)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${SANDFLEET_VENV:-$REPO/.venv}
cd "$REPO"
TEST_PROCESSES=${SANDFLEET_TEST_PROCESSES:-4}
DOCKER_FREE_PROCESSES=4  # quiet host, stop 32: 59 s at 4 against 79 s at 2 (66 vs 79 s with no __pycache__, as on a clean clone); 6 gave 66 s.
# With the bytecode warm (below), load 4-7: 53 s at 4, 59 s at 6, 69 s at 3 (its tests wait as much as they compute)

step() { printf '\033[1m[test]\033[0m %s\n' "$*" >&2; }

SANDFLEET_DATA_SCIENCE=1 bash "$REPO/deploy/bootstrap.sh"

# Every test process collects every test module, and collecting is mostly pytest rewriting the
# modules' asserts (~230): with PYTHONDONTWRITEBYTECODE set (as on this project's hosts) nothing is
# cached, so each of the 4 + 4 processes of the two levels paid ~8 s of CPU for it under coverage.
# Python and pytest read a cache whatever that variable says: one collection writes it (the package's
# bytecode too) for all of them, beside the checks (mypy uses one core), and only here, so the tests'
# own processes keep the environment as it is; a failure here is reported by the real collection.
# Measured side by side from a clean tree (2 cores, load 3-5): the Docker-free level 52 s and 91 s of
# CPU against 66-124 s and 117-122 s (this collection: 5.5 s); the Docker-bound level's 4 processes
# start with 16 s of CPU instead of 38 s.
warm_bytecode() {
  env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -m compileall -q sandfleet >/dev/null 2>&1 || true
  env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/pytest" -q --collect-only -p no:cacheprovider >/dev/null 2>&1 || true
}
warming=""
if [ $# -eq 0 ]; then
  step "bytecode of the package and the tests' rewritten asserts (one collection, beside the checks)"
  warm_bytecode &
  warming=$!
fi

if [ "${SANDFLEET_SKIP_CHECKS:-0}" != 1 ]; then
  step "ruff check"
  "$VENV/bin/ruff" check .
  step "ruff format --check"
  "$VENV/bin/ruff" format --check .
  step "mypy (strict for sandfleet.core and the producer)"
  "$VENV/bin/mypy"
fi

COVERAGE=(--cov=sandfleet --cov-branch --cov-report=)
if [ $# -gt 0 ]; then
  step "pytest $* under branch coverage"
  exec "$VENV/bin/pytest" "${COVERAGE[@]}" --cov-report=term:skip-covered "$@"
fi

# Each test runs once: the Docker-free level with no engine reachable at all (so it must really be
# Docker-free), then every test that needs the engine. Both in parallel (pytest-xdist): most of a
# Docker-bound test's time is spent waiting for containers, workers and timeouts, not on the cores.
# --dist loadscope keeps each module in one process, so a module's fixtures (a fleet, say) start once
# and its tests never race each other for a port or a listing.
# (Not loadgroup: pytest-xdist 3.8 marks groups by rewriting an item's node id, which pytest 9 no
# longer reads, so its groups never formed. Nor a scheduler handing out the longest module first with
# the smoke module split by test: tried at stop 31, 12m56s against 12m42s.)
if [ -n "$warming" ]; then wait "$warming"; fi
step "pytest -m 'not docker' with no Docker engine reachable ($DOCKER_FREE_PROCESSES processes)"
status=0
# --dist worksteal: an idle process takes queued tests from a busy one, so the level does not end on
# one process working through a batch of slow tests (MCP server restarts, Sentinel set-ups) while the
# others wait. Quiet host, a clean clone's caches, coverage on, alternated: 51.4-53.3 s against
# 62.7-66 s with the default load scheduling (CPU 76-82 s against 80-82 s).
DOCKER_HOST=unix:///nonexistent/docker.sock "$VENV/bin/pytest" -q -m "not docker" -p no:cacheprovider \
  -n "$DOCKER_FREE_PROCESSES" --dist worksteal "${COVERAGE[@]}" || status=$?

step "pytest -m docker ($TEST_PROCESSES processes)"
"$VENV/bin/pytest" -q -m docker -p no:cacheprovider -n "$TEST_PROCESSES" --dist loadscope --durations=25 \
  --junitxml=artifacts/junit-docker.xml "${COVERAGE[@]}" --cov-append || status=$?

"$VENV/bin/coverage" report --format=total >/dev/null 2>&1 \
  && step "branch coverage of sandfleet (test processes; worker subprocesses not counted): $("$VENV/bin/coverage" report --format=total)%"
exit "$status"
