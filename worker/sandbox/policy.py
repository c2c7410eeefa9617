"""The operator's policy: what a job may ask of its sandbox. Checked before any container starts."""

from __future__ import annotations

import fnmatch

from sandfleet.core.allowlist import AllowListError, parse_rules, uncovered
from sandfleet.core.config import SandboxConfig
from sandfleet.core.errors import PolicyViolationError
from sandfleet.core.settings import Settings
from sandfleet.core.sizes import format_size


def check_sandbox_policy(config: SandboxConfig, settings: Settings) -> None:
    """Raise PolicyViolationError naming the setting when ``config`` asks for more than allowed."""
    networks = settings.policy_networks
    if config.network not in networks:
        raise PolicyViolationError(
            f"sandbox network {config.network!r} is not allowed by the operator (allowed: {', '.join(networks)})"
        )
    if config.network == "restricted":
        check_allow_hosts(config, settings)
    ceiling = settings.policy_max_memory
    if config.memory_limit > ceiling:
        raise PolicyViolationError(
            f"sandbox memory_limit {format_size(config.memory_limit)} is above the operator's ceiling of "
            f"{format_size(ceiling)}"
        )
    images = settings.policy_images
    if images and not any(fnmatch.fnmatchcase(config.image, allowed) for allowed in images):
        raise PolicyViolationError(
            f"sandbox image {config.image!r} is not allowed by the operator (allowed: {', '.join(images)})"
        )
    runtimes = settings.policy_runtimes
    if runtimes and config.docker_runtime not in runtimes:
        raise PolicyViolationError(
            f"sandbox runtime {config.docker_runtime!r} is not allowed by the operator (allowed: {', '.join(runtimes)})"
        )
    if config.persistent:
        raise PolicyViolationError("jobs run in single-use sandboxes: persistent is not allowed")


def check_allow_hosts(config: SandboxConfig, settings: Settings) -> None:
    """A restricted sandbox's allow-list must be within the operator's (SANDFLEET_POLICY_ALLOW_HOSTS)."""
    try:
        widest = parse_rules(settings.policy_allow_hosts)
    except AllowListError as e:
        raise PolicyViolationError(f"the operator's SANDFLEET_POLICY_ALLOW_HOSTS is malformed: {e}") from None
    if not widest:
        raise PolicyViolationError(
            "network 'restricted' needs the operator to allow hosts (SANDFLEET_POLICY_ALLOW_HOSTS is empty)"
        )
    wider = uncovered(parse_rules(config.allow_hosts), widest)
    if wider:
        raise PolicyViolationError(
            f"sandbox allow_hosts {', '.join(map(str, wider))} "
            f"{'is' if len(wider) == 1 else 'are'} not allowed by the operator "
            f"(allowed: {', '.join(map(str, widest))}); jobs may only narrow that list"
        )
