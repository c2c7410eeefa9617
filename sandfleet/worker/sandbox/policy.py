"""The operator's policy: what a job may ask of its sandbox. Checked before any container starts.

Deny by default, for every SandboxConfig option a job could use to widen its sandbox: network and
allow_hosts, image, runtime (and so backend), allow_sudo, read_only_rootfs=false, env, workdir,
persistent, and the cpu, memory, disk, pids and timeout limits. A job may only narrow what the
operator allows (``SANDFLEET_POLICY_*``); every refusal names the option and the variable that would
allow it, with that variable's value on this host. Nothing else is judged here: whether the options
are well formed is SandboxConfig's business, whether the host can make the sandbox the backend's.

The same policy applies to replays (``replay_sandbox``): a replay on an auditor's machine runs under
that machine's policy, not under whatever the record says the worker's was.
"""

from __future__ import annotations

import fnmatch
import posixpath
from typing import Any

from pydantic import ValidationError

from sandfleet.core.allowlist import AllowListError, parse_rules, uncovered
from sandfleet.core.config import SandboxConfig
from sandfleet.core.errors import PolicyViolationError
from sandfleet.core.settings import Settings
from sandfleet.core.sizes import format_size
from sandfleet.core.validation_text import describe_validation_error

ENV_PREFIX = str(Settings.model_config.get("env_prefix", ""))  # the variables are named after the fields


def check_sandbox_policy(config: SandboxConfig, settings: Settings) -> None:
    """Raise PolicyViolationError naming every option of ``config`` beyond the operator's policy."""
    problems = policy_problems(config, settings)
    if problems:
        raise PolicyViolationError("; ".join(problems))


def policy_problems(config: SandboxConfig, settings: Settings) -> list[str]:
    """One sentence per option of ``config`` that asks for more than ``settings`` allow; empty: allowed."""
    problems: list[str] = []
    refuse = problems.append
    if config.network != "none" and config.network not in settings.policy_networks:
        refuse(f"sandbox network {config.network!r} {_not_allowed('policy_networks', settings)}")
    elif config.network == "restricted" and (problem := allow_hosts_problem(config, settings)):
        refuse(problem)
    if not any(fnmatch.fnmatchcase(config.image, allowed) for allowed in settings.policy_images):
        refuse(f"sandbox image {config.image!r} {_not_allowed('policy_images', settings)}")
    if config.docker_runtime not in settings.policy_runtimes:
        chosen = "" if config.runtime else f" (backend {config.backend})"
        refuse(
            f"sandbox runtime {config.docker_runtime!r}{chosen} {_not_allowed('policy_runtimes', settings)}"
        )
    if config.allow_sudo and not settings.policy_allow_sudo:
        refuse(f"sandbox allow_sudo {_not_allowed('policy_allow_sudo', settings)}")
    if not config.read_only_rootfs and not settings.policy_allow_writable_rootfs:
        refuse(f"sandbox read_only_rootfs=false {_not_allowed('policy_allow_writable_rootfs', settings)}")
    if config.persistent:  # the pool's and the reaper's premise (DESIGN.md principle 3): never for a job
        refuse("sandbox persistent is not allowed: jobs run in single-use sandboxes (no setting allows it)")
    names = [n for n in config.env if not any(fnmatch.fnmatchcase(n, g) for g in settings.policy_env_names)]
    if names:
        refuse(f"sandbox env {', '.join(sorted(names))} {_not_allowed('policy_env_names', settings)}")
    if not any(_within(config.workdir, folder) for folder in settings.policy_workdirs):
        refuse(f"sandbox workdir {config.workdir!r} {_not_allowed('policy_workdirs', settings)}")
    ceilings: list[tuple[str, float, float, str]] = [
        ("cpu_limit", config.cpu_limit, settings.policy_max_cpus, "policy_max_cpus"),
        ("memory_limit", config.memory_limit, settings.policy_max_memory, "policy_max_memory"),
        ("disk_limit", config.disk_limit, settings.policy_max_disk, "policy_max_disk"),
        ("pids_limit", config.pids_limit, settings.policy_max_pids, "policy_max_pids"),
        ("timeout", config.timeout, settings.policy_max_sandbox_timeout_s, "policy_max_sandbox_timeout_s"),
    ]
    for option, asked, ceiling, field in ceilings:
        if asked > ceiling:
            refuse(
                f"sandbox {option} {_shown(option, asked)} is above the operator's ceiling of "
                f"{_shown(option, ceiling)} ({variable(field)})"
            )
    return problems


def allow_hosts_problem(config: SandboxConfig, settings: Settings) -> str | None:
    """A restricted sandbox's allow-list must be within the operator's (SANDFLEET_POLICY_ALLOW_HOSTS)."""
    try:
        widest = parse_rules(settings.policy_allow_hosts)
    except AllowListError as e:
        return f"the operator's SANDFLEET_POLICY_ALLOW_HOSTS is malformed: {e}"
    if not widest:
        return (
            "network 'restricted' needs the operator to allow hosts (SANDFLEET_POLICY_ALLOW_HOSTS is empty)"
        )
    wider = uncovered(parse_rules(config.allow_hosts), widest)
    if not wider:
        return None
    return (
        f"sandbox allow_hosts {', '.join(map(str, wider))} "
        f"{'is' if len(wider) == 1 else 'are'} not allowed by the operator "
        f"(SANDFLEET_POLICY_ALLOW_HOSTS={','.join(map(str, widest))}); jobs may only narrow that list"
    )


def replay_sandbox(recorded: dict[str, Any], settings: Settings) -> SandboxConfig:
    """The sandbox a replay of a recorded job gets on this machine: the recorded options with network
    ``none``, under this machine's policy (``settings``). Raises PolicyViolationError otherwise.

    Network is narrowed, not refused: every tool answer of a replay comes from the record, the
    original run's traffic is not part of it and cannot be reproduced, and a replay is no reason for
    an auditor's machine to reach anything; narrowed, a job that ran with restricted or full network
    can still be replayed (a program that needed the network shows DIFFERENT). Every other option
    beyond the local policy is refused instead: narrowing sudo, a writable root, the env, the workdir
    or a limit would change what the program can do and report DIFFERENT for a record that may be
    genuine; refused, the auditor sees which local variable would allow it.
    """
    try:
        config = SandboxConfig.model_validate({**recorded, "network": "none", "allow_hosts": []})
    except ValidationError as e:
        problems = describe_validation_error(e, root="options")
        raise PolicyViolationError(f"the recorded sandbox options are not valid here: {problems}") from None
    check_sandbox_policy(config, settings)
    return config


def variable(field: str) -> str:
    """The environment variable of a Settings field: ``policy_allow_sudo`` -> SANDFLEET_POLICY_ALLOW_SUDO."""
    return ENV_PREFIX + field.upper()


def _not_allowed(field: str, settings: Settings) -> str:
    """``is not allowed by the operator (SANDFLEET_X=value)``, the variable's value as on this host."""
    value = getattr(settings, field)
    if isinstance(value, bool):
        setting = f"{variable(field)}={str(value).lower()}"
    elif not value:
        setting = f"{variable(field)} is empty"
    else:
        setting = f"{variable(field)}={','.join(value)}"
    return f"is not allowed by the operator ({setting})"


def _within(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or below it (both normalised: SandboxConfig refuses ``..``)."""
    folder = posixpath.normpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _shown(option: str, value: float) -> str:
    if option in ("memory_limit", "disk_limit"):
        return format_size(int(value))
    if option == "timeout":
        return f"{value:g} s"
    return f"{value:g}"
