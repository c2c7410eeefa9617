#!/usr/bin/env bash
# Make this host ready for Sandfleet, idempotently: Docker engine (with gVisor registered),
# Redis, the project's virtual environment, and the sandbox images.
#
# A second run on a ready host only checks (a few seconds). An engine that already runs is used
# as it is. As root on Debian/Ubuntu, missing packages are installed from the distribution and
# dockerd is started in the background (no systemd needed); anywhere else the script says what to
# install and stops.
#
#   SANDFLEET_VENV          virtual environment to create/use (default: <repo>/.venv)
#   SANDFLEET_SKIP_IMAGES   1: do not build the sandbox images
#   SANDFLEET_DATA_SCIENCE  1: also build sandfleet/sandbox-ds:py3.11 (numpy, pandas, matplotlib)
#   SANDFLEET_DEBIAN_MIRROR Debian mirror for the base image (default: apt's, else deb.debian.org)
#   SANDFLEET_DOCKERD_LOG, SANDFLEET_REDIS_LOG   log files (default: /var/log/sandfleet-*.log)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${SANDFLEET_VENV:-$REPO/.venv}
DOCKERD_LOG=${SANDFLEET_DOCKERD_LOG:-/var/log/sandfleet-dockerd.log}
REDIS_LOG=${SANDFLEET_REDIS_LOG:-/var/log/sandfleet-redis.log}
DOCKERD_PIDFILE=${SANDFLEET_DOCKERD_PIDFILE:-/var/run/docker.pid}
REDIS_PORT=6379
DEBIAN_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
ALL_PACKAGES="docker.io runsc crun redis-server debootstrap iptables python3-venv linux-libc-dev squid-openssl docker-compose openssl faketime"

say() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*" >&2; }
warn() { printf '\033[1;33m[bootstrap] warning:\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[bootstrap] error:\033[0m %s\n' "$*" >&2; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }
is_debian_like() { [ -r /etc/os-release ] && grep -qiE '^(ID|ID_LIKE)=.*(debian|ubuntu)' /etc/os-release; }
is_ubuntu() { [ -r /etc/os-release ] && grep -qiE '^ID=ubuntu' /etc/os-release; }
docker_ready() { command -v docker >/dev/null && docker info >/dev/null 2>&1; }
redis_ready() { (exec 3<>"/dev/tcp/127.0.0.1/$REDIS_PORT") 2>/dev/null; }

# The distribution packages this host still lacks, one per line.
missing_packages() {
  command -v dockerd >/dev/null || echo docker.io
  command -v runsc >/dev/null || echo runsc
  # Registered as runtime "crun" beside runc, for benchmarks/oci_runtimes.py's A/B; Sandfleet never uses it.
  command -v crun >/dev/null || echo crun
  command -v redis-server >/dev/null || echo redis-server
  command -v debootstrap >/dev/null || echo debootstrap
  command -v iptables >/dev/null || echo iptables
  command -v ip >/dev/null || echo iproute2  # the egress proxy's destination rule reads the host's addresses
  # The egress proxy of network "restricted" (sandfleet/worker/egress/): Squid built with OpenSSL (ssl_bump peek).
  [ -x /usr/sbin/squid ] || command -v squid >/dev/null || echo squid-openssl
  # The multi-host fleet's secured Redis (sandfleet/fleet/redis_security.py) makes its CA with openssl.
  command -v openssl >/dev/null || echo openssl
  # libfaketime: a host whose clock is off (tests/hosts/test_host_clock.py runs one worker under it).
  command -v faketime >/dev/null || echo faketime
  command -v git >/dev/null || echo git  # mcp-server-git, the MCP tests' third-party server
  command -v docker-compose >/dev/null || echo docker-compose  # tests/compose: the compose stack, for real
  # A real browser for the Flower tests (tests/flower), driven by selenium through chromedriver.
  command -v chromium >/dev/null || echo chromium
  command -v chromedriver >/dev/null || echo chromium-driver
  python3 -c 'import ensurepip, venv' 2>/dev/null || echo python3-venv
  # The kernel's syscall numbers, against which the sandbox's seccomp table is tested.
  [ -f /usr/include/asm-generic/unistd.h ] || echo linux-libc-dev
  # debootstrap verifies Debian's archive with Debian's key, which Ubuntu does not install.
  if is_ubuntu && [ ! -f "$DEBIAN_KEYRING" ]; then echo debian-archive-keyring; fi
}

install_packages() {
  local missing; missing=$(missing_packages | tr '\n' ' ')
  missing=${missing% }
  [ -z "$missing" ] && return 0
  if ! is_root || ! is_debian_like; then
    if docker_ready; then
      warn "not installed: $missing (needed: redis-server for the fleet, debootstrap to build images as root)"
      return 0
    fi
    die "no Docker engine is reachable and these are missing: $missing.
  On Debian/Ubuntu run this script as root, or install them yourself (apt-get install $ALL_PACKAGES),
  start dockerd with runsc registered as a runtime, and run it again. Elsewhere: install Docker Engine,
  gVisor (runsc), redis-server and debootstrap with your package manager."
  fi
  say "installing $missing (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d keeps postinst scripts from starting services (there is no init system to ask).
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  local pkg optional=" runsc crun chromium chromium-driver docker-compose "
  # shellcheck disable=SC2086 # word splitting of the package list is intended
  if ! apt-get install -y -qq --no-install-recommends $missing >/dev/null; then
    # runsc is optional (gVisor): install the rest one by one and only warn about it.
    for pkg in $missing; do
      if ! apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null; then
        [[ $optional == *" $pkg "* ]] || die "apt-get install $pkg failed"
        warn "could not install $pkg (optional: without runsc, backend gvisor is refused; without chromium, the Flower browser tests)"
      fi
    done
  fi
  rm -f /usr/sbin/policy-rc.d
  trap - EXIT
}

# Register runsc three times: "runsc" with no network at all (what network=none needs under this gVisor
# release), "runsc-net" with gVisor's own network stack, for full, and "runsc-egress" with
# --network=host for restricted: the sandbox's sockets are then the host kernel's inside the
# container's own network namespace, where the egress filter holds (sandfleet/worker/egress/network.py).
# Registers crun too when it is installed (benchmarks only: no sandbox config names it).
# Keeps every other daemon setting. Prints "changed" when it wrote the file.
register_runtimes() {
  local runsc; runsc=$(command -v runsc) || return 0
  python3 - "$runsc" "$(command -v crun || true)" <<'PY'
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
    "runsc-egress": {"path": sys.argv[1], "runtimeArgs": ["--network=host"]},
    **({"crun": {"path": sys.argv[2]}} if sys.argv[2] else {}),
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

# The pid in dockerd's pid file if that process is alive and is dockerd (pids get reused).
dockerd_pid() {
  local pid
  [ -f "$DOCKERD_PIDFILE" ] || return 1
  pid=$(cat "$DOCKERD_PIDFILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] && echo "$pid"
}

start_dockerd() {
  local pid
  if ! pid=$(dockerd_pid); then
    if [ -f "$DOCKERD_PIDFILE" ]; then
      # A killed dockerd leaves its pid file, and a new one refuses to start while it exists.
      say "removing stale $DOCKERD_PIDFILE"; rm -f "$DOCKERD_PIDFILE"
    fi
    say "starting dockerd (log: $DOCKERD_LOG)"
    mkdir -p "$(dirname "$DOCKERD_LOG")"
    nohup dockerd --pidfile "$DOCKERD_PIDFILE" >>"$DOCKERD_LOG" 2>&1 </dev/null &
    pid=$!
  else
    say "dockerd (pid $pid) is starting; waiting for it"
  fi
  for _ in $(seq 1 120); do
    docker_ready && return 0
    kill -0 "$pid" 2>/dev/null || { tail -20 "$DOCKERD_LOG" >&2; die "dockerd exited; see $DOCKERD_LOG"; }
    sleep 0.5
  done
  tail -20 "$DOCKERD_LOG" >&2
  die "dockerd did not answer within 60 s; see $DOCKERD_LOG"
}

# Whether the engine knows runsc-egress and, when crun is installed, crun.
runtimes_registered() {
  local known; known=$(docker info --format '{{json .Runtimes}}' 2>/dev/null) || return 1
  [[ $known == *'"runsc-egress"'* ]] || return 1
  ! command -v crun >/dev/null || [[ $known == *'"crun"'* ]]
}

ensure_docker() {
  if docker_ready; then
    # An engine already runs: use it as it is. Register runsc only when we may and it is missing;
    # SIGHUP makes dockerd reload daemon.json (runtimes are reloadable) without a restart.
    if is_root && command -v runsc >/dev/null \
        && ! runtimes_registered; then
      local pid
      if [ -n "$(register_runtimes)" ] && pid=$(dockerd_pid); then
        say "registered runsc (and crun); reloading dockerd's configuration"
        kill -HUP "$pid"
        sleep 1
      fi
    fi
    return 0
  fi
  is_root || die "no Docker engine is reachable, and starting one needs root (or start dockerd yourself)."
  register_runtimes >/dev/null
  start_dockerd
}

ensure_redis() {
  # The demo and a local fleet use this one; tests start their own servers on free ports.
  redis_ready && return 0
  if ! command -v redis-server >/dev/null; then
    warn "redis-server is not installed: the fleet (submit, worker) needs it; the sandbox does not"
    return 0
  fi
  local dir=/var/lib/sandfleet-redis
  is_root || dir=${XDG_STATE_HOME:-$HOME/.local/state}/sandfleet-redis
  mkdir -p "$dir"
  say "starting redis-server on 127.0.0.1:$REDIS_PORT (AOF on, data: $dir, log: $REDIS_LOG)"
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --appendonly yes --dir "$dir" \
    --maxmemory-policy noeviction --daemonize yes --logfile "$REDIS_LOG" >/dev/null
  for _ in $(seq 1 50); do redis_ready && return 0; sleep 0.1; done
  die "redis-server did not come up on port $REDIS_PORT; see $REDIS_LOG"
}

ensure_venv() {
  local stamp="$VENV/.sandfleet-installed"
  local constraints="$REPO/deploy/constraints.txt"  # the versions CI last passed with
  local want; want=$(cat "$REPO/pyproject.toml" "$constraints" | sha256sum | cut -c1-16)
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtual environment $VENV"
    python3 -m venv "$VENV"
  fi
  # Editable install: code changes need nothing; only a changed pyproject.toml or constraints reinstall.
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || [ ! -x "$VENV/bin/sandfleet" ]; then
    local log="$VENV/sandfleet-install.log"
    say "installing sandfleet into $VENV (log: $log)"
    if ! { "$VENV/bin/python" -m pip install -c "$constraints" pip \
        && "$VENV/bin/python" -m pip install -c "$constraints" -e "$REPO[all,dev]"; } >"$log" 2>&1; then
      tail -30 "$log" >&2
      die "installing the project failed; see $log"
    fi
    echo "$want" > "$stamp"
  fi
}

ensure_images() {
  [ "${SANDFLEET_SKIP_IMAGES:-0}" = 1 ] && return 0
  local args=(--if-changed)
  [ "${SANDFLEET_DATA_SCIENCE:-0}" = 1 ] && args+=(--data-science)
  "$VENV/bin/sandfleet" images build "${args[@]}"
}

# The distribution's own squid service (port 3128, every address) must not run: Sandfleet's egress
# proxy is started by the worker with its own configuration on the egress network's gateway only.
disable_distribution_squid() {
  is_root || return 0
  if command -v systemctl >/dev/null && systemctl is-enabled squid >/dev/null 2>&1; then
    say "disabling the distribution's squid service (the worker runs its own egress proxy)"
    systemctl disable --now squid >/dev/null 2>&1 || warn "could not disable the squid service"
  fi
}

# Restricted sandboxes log each packet their filter refuses through NFLOG (sandfleet/worker/egress/nflog.py).
# Debian's kernels load these modules on demand; loading them here makes a missing one visible early.
# Without them a restricted sandbox refuses to start (fail closed), nothing else is affected.
load_nflog_modules() {
  is_root || return 0
  command -v modprobe >/dev/null || return 0
  for module in nfnetlink_log xt_NFLOG; do
    grep -qw "^$module" /proc/modules 2>/dev/null && continue
    modprobe "$module" 2>/dev/null || true  # built in (as here) or absent: the worker's check decides
  done
}

main() {
  install_packages
  disable_distribution_squid
  load_nflog_modules
  ensure_docker
  ensure_redis
  ensure_venv
  ensure_images
  say "ready ($(docker version --format 'Docker {{.Server.Version}}' 2>/dev/null); run $VENV/bin/sandfleet doctor for details)"
}

# Run when executed; only define the functions when sourced (tests exercise them one by one).
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
