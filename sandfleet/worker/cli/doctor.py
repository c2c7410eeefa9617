"""``sandfleet doctor``: is this host ready? One row per check, with the fix for whatever is missing.

Exit status 1 when the sandbox cannot run (no Docker SDK, no engine, no runc, no sandbox image), or
when something asked for with ``--require-gvisor`` / ``--require-redis`` is missing. Redis is needed by
the fleet (submit, worker) but not by a sandbox, so by default it is reported without failing.
"""

from __future__ import annotations

from dataclasses import asdict
from urllib.parse import urlsplit, urlunsplit

import click

from sandfleet.core.console import echo, echo_json
from sandfleet.core.errors import SandfleetError
from sandfleet.core.settings import Settings, get_settings
from sandfleet.worker.cli.doctor_checks import Check as Check
from sandfleet.worker.cli.doctor_mcp import fleet_mcp_checks, mcp_checks
from sandfleet.worker.images.build import DATA_SCIENCE_TAG, SANDBOX_TAG

REDIS_TIMEOUT_S = 2.0
FIX_ENGINE = "start the engine: bash deploy/bootstrap.sh (as root), or start dockerd yourself"


def sdk_check() -> Check:
    from sandfleet.worker.sandbox.docker import backend as engine

    found = engine.sdk()
    if found is None:
        return Check(
            "Docker SDK", False, "the 'docker' package is not installed", "pip install 'sandfleet[worker]'"
        )
    return Check("Docker SDK", True, f"docker {found.__version__}")


def engine_checks(require_gvisor: bool) -> list[Check]:
    """Engine, runtimes and images: the sandbox's needs."""
    from sandfleet.worker.sandbox.docker.backend import engine_info

    try:
        info = engine_info()
    except SandfleetError as e:
        return [Check("Docker engine", False, str(e), FIX_ENGINE)]
    version = f"Docker {info.server_version} (API {info.api_version})"
    engine = Check("Docker engine", True, f"{version}, cgroup v{info.cgroup_version}, {info.ncpu} CPUs")
    return [engine, *runtime_checks(info.runtimes, require_gvisor), *image_checks(info.images)]


def runtime_checks(runtimes: tuple[str, ...], require_gvisor: bool) -> list[Check]:
    # Docker lists containerd's shim names too; they are aliases of runc.
    registered = ", ".join(r for r in runtimes if not r.startswith("io.containerd")) or "none"
    return [
        Check(
            "runtime runc",
            "runc" in runtimes,
            f"registered: {registered}",
            "" if "runc" in runtimes else "reinstall docker.io (runc ships with it)",
        ),
        Check(
            "runtime runsc (gVisor)",
            "runsc" in runtimes,
            f"registered: {registered}",
            ""
            if "runsc" in runtimes
            else "apt-get install runsc, then bash deploy/bootstrap.sh registers it",
            required=require_gvisor,
        ),
    ]


def image_checks(tags: frozenset[str]) -> list[Check]:
    return [
        Check(
            f"image {SANDBOX_TAG}",
            SANDBOX_TAG in tags,
            "present" if SANDBOX_TAG in tags else "missing",
            "" if SANDBOX_TAG in tags else "sandfleet images build",
        ),
        Check(
            f"image {DATA_SCIENCE_TAG}",
            DATA_SCIENCE_TAG in tags,
            "present" if DATA_SCIENCE_TAG in tags else "missing (only jobs that ask for it need it)",
            "" if DATA_SCIENCE_TAG in tags else "sandfleet images build --data-science",
            required=False,
        ),
    ]


def redis_check(url: str, required: bool, settings: Settings | None = None) -> Check:
    import redis

    from sandfleet.core.redis_connect import RedisUrlError, connect

    settings = settings or get_settings()

    shown = hide_password(url)
    try:
        client = connect(
            url, settings, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S
        )
        try:
            client.ping()
            version = client.info("server").get("redis_version", "?")
        finally:
            client.close()
    except (redis.RedisError, RedisUrlError) as e:
        return Check(
            "Redis (fleet)",
            False,
            f"{shown}: {e}",
            "start redis-server (bash deploy/bootstrap.sh) or set SANDFLEET_REDIS_URL",
            required=required,
        )
    return Check("Redis (fleet)", True, f"{shown}: Redis {version}", required=required)


def model_check(settings: Settings) -> Check:
    """Informational: a job needs a key or a base URL, unless its model is ``replay:FILE``."""
    if settings.model_base_url:
        detail = f"{settings.model}, base URL {settings.model_base_url}"
    elif settings.model_api_key:
        detail = f"{settings.model}, API key set"
    else:
        return Check(
            "model endpoint",
            False,
            f"{settings.model}: no API key or base URL (replay:FILE models still work)",
            "set OPENAI_API_KEY, or SANDFLEET_MODEL_BASE_URL for a compatible server",
            required=False,
        )
    return Check("model endpoint", True, detail, required=False)


def signing_keys_check(settings: Settings) -> Check:
    """Informational: the worker signing keys on this host, and whether only their owner can read them."""
    from pathlib import Path

    folder = Path(settings.worker_state_dir).expanduser() / "keys"
    files = sorted(folder.glob("*.pem")) if folder.is_dir() else []
    if not files:
        return Check(
            "signing keys",
            True,
            f"none yet in {folder}: a worker makes its key on first start",
            required=False,
        )
    exposed = [f.name for f in files if f.stat().st_mode & 0o077]
    if exposed:
        return Check(
            "signing keys",
            False,
            f"readable by others: {', '.join(exposed)} in {folder}",
            f"chmod 600 {folder}/*.pem, then rotate them (sandfleet keys rotate WORKER): they may be copied",
            required=False,
        )
    return Check("signing keys", True, f"{len(files)} worker key(s) in {folder}, mode 0600", required=False)


def hide_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def checks_ok(checks: list[Check], name: str) -> bool:
    return any(c.check == name and c.ok for c in checks)


def status_word(item: Check) -> str:
    if item.ok:
        return "ok"
    return "missing" if item.required else "warning"


def render_table(checks: list[Check]) -> str:
    width = max(len(c.check) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c.check:<{width}}  {status_word(c):<7}  {c.detail}")
        if c.fix and not c.ok:
            lines.append(f"{'':<{width}}  {'':<7}  fix: {c.fix}")
    return "\n".join(lines)


def exit_status(checks: list[Check]) -> int:
    return 1 if any(c.required and not c.ok for c in checks) else 0


@click.command()
@click.option(
    "--json", "as_json", is_flag=True, help="Print a JSON list of {check, ok, detail, fix, required}."
)
@click.option("--require-gvisor", is_flag=True, help="Fail when runsc is not registered (else a warning).")
@click.option("--require-redis", is_flag=True, help="Fail when Redis is unreachable (else a warning).")
@click.option(
    "--mcp-config",
    "mcp_config",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Check the MCP servers of this file (default: SANDFLEET_MCP_CONFIG).",
)
def doctor(as_json: bool, require_gvisor: bool, require_redis: bool, mcp_config: str | None) -> None:
    """Check the Docker engine, runtimes, images, Redis, the model endpoint and the MCP servers.

    MCP servers: those of --mcp-config, connected from here, and those each live worker holds, as it
    reported them with its last heartbeat (up with its last ping, or down since when and why).

    Exits 1 when the sandbox cannot run here (or a --require-* check fails, or the MCP config is
    malformed).
    """
    settings = get_settings()
    sdk = sdk_check()
    checks = [sdk]
    if sdk.ok:
        checks += engine_checks(require_gvisor)
    checks += [
        redis_check(settings.redis_url, require_redis, settings),
        *(
            [redis_check(settings.results_redis_url, require_redis, settings)]
            if settings.results_redis_url
            else []
        ),
        model_check(settings),
        signing_keys_check(settings),
    ]
    if mcp_config or settings.mcp_config:
        checks += mcp_checks(mcp_config or settings.mcp_config or "")
    if checks_ok(checks, "Redis (fleet)"):
        checks += fleet_mcp_checks(settings)
    if as_json:
        echo_json([asdict(c) for c in checks], indent=2)
    else:  # details quote MCP servers' and the engine's replies: escaped
        echo(render_table(checks))
    raise SystemExit(exit_status(checks))
