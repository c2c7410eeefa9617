"""The options of one sandbox, of the code-action loop and of the tool-calling loop: contracts users write.

All are strict: an unknown option is refused with the list of valid ones, and well-known names
from other tools (``network_mode``, ``mem_limit``, ``cpus`` ...) get a hint towards ours.
"""

from __future__ import annotations

import os
import posixpath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from sandfleet.core.allowlist import AllowListError, parse_rules
from sandfleet.core.sizes import format_size, parse_size

DEFAULT_IMAGE = "sandfleet/sandbox:py3.11"
DATA_SCIENCE_IMAGE = "sandfleet/sandbox-ds:py3.11"

MIN_MEMORY_BYTES = 32 * 1024**2
MAX_MEMORY_BYTES = 1024**4
MIN_DISK_BYTES = 1024**2
MAX_DISK_BYTES = 1024**4
MAX_PIDS = 32768
MAX_SANDBOX_TIMEOUT_S = 24 * 3600.0


def _size(value: Any) -> int:
    return parse_size(value)


ByteSize = Annotated[int, BeforeValidator(_size)]

# Names other sandbox tools use, and what to write here instead.
_HINTS = {
    "network_mode": 'use `network` ("none", "restricted" or "full")',
    "networking": 'use `network` ("none", "restricted" or "full")',
    "net": 'use `network` ("none", "restricted" or "full")',
    "mem_limit": "use `memory_limit` (e.g. 512M, 4G)",
    "memory": "use `memory_limit` (e.g. 512M, 4G)",
    "mem": "use `memory_limit` (e.g. 512M, 4G)",
    "memswap_limit": "use `memory_limit`: swap is always off",
    "cpus": "use `cpu_limit` (a number of CPUs, e.g. 1.5)",
    "cpu": "use `cpu_limit` (a number of CPUs, e.g. 1.5)",
    "nano_cpus": "use `cpu_limit` (a number of CPUs, e.g. 1.5)",
    "pids": "use `pids_limit`",
    "disk": "use `disk_limit` (e.g. 1G)",
    "storage": "use `disk_limit` (e.g. 1G)",
    "read_only": "use `read_only_rootfs`",
    "readonly": "use `read_only_rootfs`",
    "environment": "use `env` (a mapping of names to strings)",
    "working_dir": "use `workdir`",
    "cwd": "use `workdir`",
    "sudo": "use `allow_sudo`",
    "user": "use `allow_sudo` (programs run as the unprivileged sandbox user unless it is set)",
    "timeout_seconds": "use `timeout` (seconds)",
    "lang": "there is no language option: sandboxes run Python",
    "allowed_hosts": "use `allow_hosts` (names the sandbox may reach with network 'restricted')",
    "allowlist": "use `allow_hosts` (names the sandbox may reach with network 'restricted')",
    "allow_list": "use `allow_hosts` (names the sandbox may reach with network 'restricted')",
    "domains": "use `allow_hosts` (names the sandbox may reach with network 'restricted')",
    "hosts": "use `allow_hosts` (names the sandbox may reach with network 'restricted')",
    "proxy": "there is no proxy option: network 'restricted' goes through the worker host's egress proxy",
}


def _refuse_unknown(model: type[BaseModel], data: Any) -> Any:
    """Refuse unknown keys with every valid option listed, and a hint for known misspellings."""
    if not isinstance(data, dict):
        return data
    valid = list(model.model_fields)
    unknown = [k for k in data if k not in valid]
    if unknown:
        parts = []
        for key in unknown:
            hint = _HINTS.get(str(key).lower().replace("-", "_"))
            parts.append(f"{key!r} ({hint})" if hint else repr(key))
        raise ValueError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(parts)}; "
            f"valid options are: {', '.join(valid)}"
        )
    return data


class SandboxConfig(BaseModel):
    """How one sandbox is made. Every default is the locked-down choice.

    Sizes accept bytes or ``512M``/``1G``; times are seconds.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False)

    backend: Literal["docker", "gvisor"] = "docker"
    image: str = DEFAULT_IMAGE
    cpu_limit: float = 2.0
    memory_limit: ByteSize = 4 * 1024**3
    disk_limit: ByteSize = 1024**3
    pids_limit: int = 256
    network: Literal["none", "restricted", "full"] = "none"
    persistent: bool = False
    timeout: float = 300.0
    workdir: str = "/workspace"
    env: dict[str, str] = Field(default_factory=dict)
    allow_sudo: bool = False
    runtime: str | None = None
    read_only_rootfs: bool = True
    allow_hosts: tuple[str, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _known_options(cls, data: Any) -> Any:
        return _refuse_unknown(cls, data)

    @field_validator("allow_hosts", mode="before")
    @classmethod
    def _hosts_listed(cls, v: Any) -> Any:
        if isinstance(v, str):  # ``-o allow_hosts=pypi.org,files.pythonhosted.org``
            return [part for part in (p.strip() for p in v.split(",")) if part]
        return v

    @field_validator("allow_hosts")
    @classmethod
    def _hosts_valid(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        try:
            return tuple(str(rule) for rule in parse_rules(v))
        except AllowListError as e:
            raise ValueError(str(e)) from None

    @model_validator(mode="after")
    def _hosts_fit_network(self) -> SandboxConfig:
        if self.network == "restricted" and not self.allow_hosts:
            raise ValueError(
                "network 'restricted' needs allow_hosts: the names the sandbox may reach, e.g. "
                "['pypi.org', 'files.pythonhosted.org'] (nothing else is reachable)"
            )
        if self.allow_hosts and self.network != "restricted":
            raise ValueError(f"allow_hosts applies to network 'restricted' only, not {self.network!r}")
        return self

    @field_validator("cpu_limit")
    @classmethod
    def _cpu_in_range(cls, v: float) -> float:
        host = os.cpu_count() or 1
        if not 0.01 <= v <= host:
            raise ValueError(f"cpu_limit must be between 0.01 and {host} (this host's CPUs), got {v}")
        return v

    @field_validator("memory_limit")
    @classmethod
    def _memory_in_range(cls, v: int) -> int:
        if not MIN_MEMORY_BYTES <= v <= MAX_MEMORY_BYTES:
            raise ValueError(
                f"memory_limit must be between {format_size(MIN_MEMORY_BYTES)} and "
                f"{format_size(MAX_MEMORY_BYTES)}, got {v} bytes"
            )
        return v

    @field_validator("disk_limit")
    @classmethod
    def _disk_in_range(cls, v: int) -> int:
        if not MIN_DISK_BYTES <= v <= MAX_DISK_BYTES:
            raise ValueError(
                f"disk_limit must be between {format_size(MIN_DISK_BYTES)} and "
                f"{format_size(MAX_DISK_BYTES)}, got {v} bytes"
            )
        return v

    @field_validator("pids_limit")
    @classmethod
    def _pids_in_range(cls, v: int) -> int:
        if not 8 <= v <= MAX_PIDS:
            raise ValueError(f"pids_limit must be between 8 and {MAX_PIDS}, got {v}")
        return v

    @field_validator("timeout")
    @classmethod
    def _timeout_in_range(cls, v: float) -> float:
        if not 0 < v <= MAX_SANDBOX_TIMEOUT_S:
            raise ValueError(f"timeout must be between 0 and {MAX_SANDBOX_TIMEOUT_S:.0f} seconds, got {v}")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir_absolute(cls, v: str) -> str:
        norm = posixpath.normpath(v)
        if not v.startswith("/") or norm in ("/", "/proc", "/sys", "/dev") or ".." in v.split("/"):
            raise ValueError(f"workdir must be an absolute path below / (not /proc, /sys, /dev), got {v!r}")
        return norm

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not name or "=" in name or "\0" in name or not name.replace("_", "a").isalnum():
                raise ValueError(f"env names must be letters, digits and '_', got {name!r}")
        return v

    @field_validator("image")
    @classmethod
    def _image_named(cls, v: str) -> str:
        if not v or any(c.isspace() for c in v):
            raise ValueError(f"image must be an image reference like {DEFAULT_IMAGE}, got {v!r}")
        return v

    @property
    def docker_runtime(self) -> str:
        """The Docker runtime name: ``runtime`` if given, else runsc for gvisor, else runc.

        gVisor is registered three times (see deploy/bootstrap.sh): ``runsc`` has no network at all,
        ``runsc-net`` has gVisor's own network stack for full, ``runsc-egress`` uses the sandbox's
        own (filtered) network namespace for restricted (sandfleet/worker/egress/network.py).
        """
        if self.runtime:
            return self.runtime
        if self.backend == "gvisor":
            return {"none": "runsc", "restricted": "runsc-egress"}.get(self.network, "runsc-net")
        return "runc"

    @property
    def is_gvisor(self) -> bool:
        return self.docker_runtime.startswith("runsc")

    def fingerprint(self) -> str:
        """A short stable hash of every option: sandboxes with equal fingerprints are interchangeable."""
        import hashlib

        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


class CodeActionSettings(BaseModel):
    """Caps of the code-action loop for one job. Times are seconds, sizes bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    exec_timeout: float = Field(120.0, gt=0, le=3600)
    max_repairs: int = Field(1, ge=0, le=10)
    max_tool_calls: int = Field(50, ge=0, le=100_000)
    tool_timeout: float = Field(60.0, gt=0, le=3600, description="seconds one tool call may take on the host")
    max_request_bytes: ByteSize = Field(1024**2, ge=1024, le=256 * 1024**2)
    max_response_bytes: ByteSize = Field(64 * 1024**2, ge=1024, le=1024**3)
    max_output_bytes: ByteSize = Field(1024**2, ge=1024, le=256 * 1024**2)

    @model_validator(mode="before")
    @classmethod
    def _known_options(cls, data: Any) -> Any:
        return _refuse_unknown(cls, data)


class ToolLoopSettings(BaseModel):
    """Caps of the tool-calling loop of shell and chat jobs. Times are seconds, sizes bytes.

    The tool-call budget works as in code-action: every call counts (failed and unknown ones too) and
    a call past ``max_tool_calls`` is refused with ``ToolBudgetExceededError``; the model then gets one
    turn to answer, and a reply asking for more calls ends the job (limit ``tool_calls``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_turns: int = Field(20, ge=1, le=1000, description="model replies per job")
    max_tool_calls: int = Field(50, ge=0, le=100_000, description="tool calls per job")
    max_tokens: int = Field(
        500_000, ge=1000, le=1_000_000_000, description="prompt + completion tokens per job"
    )
    wall_timeout: float = Field(600.0, gt=0, le=MAX_SANDBOX_TIMEOUT_S, description="seconds per job")
    max_result_bytes: ByteSize = Field(
        256 * 1024, ge=1024, le=64 * 1024**2, description="of one tool result shown to the model"
    )
    exec_timeout: float = Field(
        120.0, gt=0, le=3600, description="shell: the longest one sandbox_exec may run"
    )
    idle_timeout: float = Field(
        300.0, gt=0, le=MAX_SANDBOX_TIMEOUT_S, description="shell: sandbox destroyed after this long unused"
    )
    max_output_bytes: ByteSize = Field(
        32 * 1024, ge=1024, le=16 * 1024**2, description="shell: of each output stream, head and tail"
    )

    @model_validator(mode="before")
    @classmethod
    def _known_options(cls, data: Any) -> Any:
        return _refuse_unknown(cls, data)
