#!/usr/bin/env bash
# Make this host ready for Sandfleet, idempotently: Docker engine (with gVisor registered),
# Redis, the project's virtual environment, and the sandbox images.
#
# A second run on a ready host only checks (seconds). Uses an engine that already runs; installs
# Debian's packages only as root on Debian/Ubuntu, and says what to install anywhere else.
#
#   SANDFLEET_VENV        virtual environment to create/use (default: <repo>/.venv)
#   SANDFLEET_SKIP_IMAGES set to 1 to skip building the sandbox images
#   SANDFLEET_DATA_SCIENCE set to 1 to also build sandfleet/sandbox-ds:py3.11
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${SANDFLEET_VENV:-$REPO/.venv}
DOCKERD_LOG=${SANDFLEET_DOCKERD_LOG:-/var/log/sandfleet-dockerd.log}
REDIS_LOG=${SANDFLEET_REDIS_LOG:-/var/log/sandfleet-redis.log}
APT_PACKAGES=(docker.io runsc redis-server debootstrap iptables python3-venv)

say() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[bootstrap] error:\033[0m %s\n' "$*" >&2; exit 1; }

is_debian_like() { [ -r /etc/os-release ] && grep -qiE '^(ID|ID_LIKE)=.*(debian|ubuntu)' /etc/os-release; }

docker_ready() { docker info >/dev/null 2>&1; }

install_packages() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v runsc >/dev/null || missing+=(runsc)
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v nsenter >/dev/null || missing+=(util-linux)
  python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! is_debian_like; then
    die "missing: ${missing[*]}. Install them (Debian/Ubuntu: apt-get install ${APT_PACKAGES[*]}), start dockerd with runsc registered as a runtime, then run this again."
  fi
  say "installing ${missing[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d keeps postinst scripts from trying to start services on systemd-less hosts.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
}

# Register runsc twice: "runsc" with no network at all (what network=none needs under this gVisor
# release) and "runsc-net" with gVisor's own network stack, for restricted/full. Keeps any other
# daemon settings. Prints "changed" when it wrote the file.
register_runsc() {
  local runsc; runsc=$(command -v runsc) || return 0
  python3 - "$runsc" <<'PY'
import json, os, sys
path = "/etc/docker/daemon.json"
cfg = {}
if os.path.exists(path):
    with open(path) as f:
        text = f.read().strip()
    cfg = json.loads(text) if text else {}
runtimes = cfg.setdefault("runtimes", {})
want = {
    "runsc": {"path": sys.argv[1], "runtimeArgs": ["--network=none"]},
    "runsc-net": {"path": sys.argv[1]},
}
if all(runtimes.get(k) == v for k, v in want.items()):
    sys.exit(0)
runtimes.update(want)
os.makedirs("/etc/docker", exist_ok=True)
with open(path + ".tmp", "w") as f:
    json.dump(cfg, f, indent=2)
os.replace(path + ".tmp", path)
print("changed")
PY
}

start_dockerd() {
  local pidfile=/var/run/docker.pid
  if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    say "removing stale $pidfile"; rm -f "$pidfile"
  fi
  say "starting dockerd (log: $DOCKERD_LOG)"
  nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
  for _ in $(seq 1 120); do docker_ready && return 0; sleep 0.5; done
  tail -20 "$DOCKERD_LOG" >&2
  die "dockerd did not come up within 60 s; see $DOCKERD_LOG"
}

ensure_docker() {
  if docker_ready; then
    # An engine already runs: use it. Register runsc only if we may and it is missing.
    if [ "$(id -u)" -eq 0 ] && command -v runsc >/dev/null && ! docker info --format '{{json .Runtimes}}' | grep -q '"runsc"'; then
      if [ -n "$(register_runsc)" ]; then
        say "registered runsc; reloading dockerd"
        pkill -HUP -x dockerd || true
        sleep 1
      fi
    fi
    return 0
  fi
  install_packages
  [ "$(id -u)" -eq 0 ] || die "no Docker engine is reachable and starting one needs root (or start dockerd yourself)."
  register_runsc >/dev/null
  start_dockerd
}

ensure_redis() {
  # Tests start their own Redis servers; the demo and a local fleet use this one on 6379.
  command -v redis-server >/dev/null || install_packages
  if ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
    say "starting redis-server on 127.0.0.1:6379 (AOF on, log: $REDIS_LOG)"
    redis-server --bind 127.0.0.1 --port 6379 --appendonly yes --dir /var/lib/redis \
      --maxmemory-policy noeviction --daemonize yes --logfile "$REDIS_LOG" >/dev/null
  fi
}

ensure_venv() {
  local stamp="$VENV/.sandfleet-installed"
  local want; want=$(cat "$REPO/pyproject.toml" | sha256sum | cut -c1-16)
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtual environment $VENV"
    python3 -m venv "$VENV"
  fi
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "installing sandfleet into $VENV"
    "$VENV/bin/pip" install -q --upgrade pip >/dev/null
    "$VENV/bin/pip" install -q -e "$REPO[all,dev]"
    echo "$want" > "$stamp"
  fi
}

ensure_images() {
  [ "${SANDFLEET_SKIP_IMAGES:-0}" = 1 ] && return 0
  local args=()
  [ "${SANDFLEET_DATA_SCIENCE:-0}" = 1 ] && args+=(--data-science)
  "$VENV/bin/sandfleet" images build --if-changed "${args[@]}"
}

main() {
  mkdir -p /var/lib/redis 2>/dev/null || true
  ensure_docker
  ensure_redis
  ensure_venv
  ensure_images
  say "ready"
}

main "$@"
