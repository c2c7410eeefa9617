"""The one typed settings object. Environment prefix ``SANDFLEET_``; no other module reads os.environ.

The model's key and base URL also come from the names every OpenAI-compatible tool uses
(``OPENAI_API_KEY``, ``OPENAI_BASE_URL``).
"""

from __future__ import annotations

import posixpath
import re
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BeforeValidator, Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sandfleet.core.sizes import parse_size

DEFAULT_REDIS_URL = "redis://localhost:6379/0"
DEFAULT_REDIS_WAIT_REPLICAS = 1  # replicas that acknowledge a final record before its job counts as done
DEFAULT_REDIS_WAIT_TIMEOUT_MS = 2000
DEFAULT_MODEL = "openai:gpt-5-mini"
DEFAULT_RETENTION_S = 7 * 24 * 3600
DEFAULT_VISIBILITY_TIMEOUT_S = 3600
DEFAULT_MODEL_REQUEST_TIMEOUT_S = 60.0
DEFAULT_MODEL_MAX_RETRIES = 4
DEFAULT_POOL_SIZE = 2
DEFAULT_MAX_SANDBOXES = 4
DEFAULT_MAX_DELIVERIES = 3
DEFAULT_CONCURRENCY = 32  # jobs in flight per worker; most wait on the model and hold no container
DEFAULT_TRANSIENT_RETRIES = 5
DEFAULT_TRANSIENT_BACKOFF_S = 5.0
DEFAULT_TRANSIENT_BACKOFF_MAX_S = 300.0
DEFAULT_WORKER_STATE_DIR = "~/.sandfleet/worker"
DEFAULT_CLIENT_STATE_DIR = "~/.sandfleet/client"
DEFAULT_APPROVER_KEY = "~/.sandfleet/approver/key.pem"
# ~165 bytes a job in SQLite (with its index): 100,000 jobs are ~16 MB (sandfleet/producer/ledger.py)
DEFAULT_CLIENT_LEDGER_MAX_JOBS = 100_000
DEFAULT_POLICY_MAX_MEMORY = "8G"
DEFAULT_POLICY_IMAGES = ("sandfleet/sandbox:py3.11", "sandfleet/sandbox-ds:py3.11")
# The runtimes deploy/bootstrap.sh registers and SandboxConfig.docker_runtime picks for its classes.
DEFAULT_POLICY_RUNTIMES = ("runc", "runsc", "runsc-net", "runsc-egress")
DEFAULT_POLICY_WORKDIRS = ("/workspace",)
# Ceilings of the other limits: twice SandboxConfig's defaults, as the memory one (8G for 4G) is.
DEFAULT_POLICY_MAX_CPUS = 4.0
DEFAULT_POLICY_MAX_DISK = "2G"
DEFAULT_POLICY_MAX_PIDS = 512
DEFAULT_POLICY_MAX_SANDBOX_TIMEOUT_S = 600.0
DEFAULT_MAX_SESSIONS = 2  # shell jobs' session sandboxes per worker, apart from max_sandboxes
DEFAULT_POLICY_MAX_EXEC_TIMEOUT_S = 600.0
DEFAULT_ARTIFACT_MAX_FILE_BYTES = 32 * 1024**2
DEFAULT_ARTIFACT_MAX_JOB_BYTES = 64 * 1024**2
DEFAULT_ARTIFACT_MAX_FILES = 100
ARTIFACT_STORES = ("redis", "filesystem")
DEFAULT_APPROVAL_TIMEOUT_S = 3600.0  # a request nobody decides is denied after an hour
DEFAULT_APPROVAL_WORKSPACE_MAX_BYTES = 32 * 1024**2  # a suspended shell job's /workspace archive
DEFAULT_APPROVAL_GRACE_S = 3.0  # how long a program waits for a decision before its job is suspended
DEFAULT_MODEL_MAX_COMPLETION_TOKENS = 4096  # per model reply, when the job sets none
DEFAULT_POLICY_MAX_COMPLETION_TOKENS = 32_768
DEFAULT_MODEL_TIME_BUDGET_S = 600.0  # model time per job (every delivery), when the job sets none
DEFAULT_POLICY_MAX_MODEL_TIME_S = 3600.0
DEFAULT_METRICS_PORT = 0  # off
DEFAULT_MCP_PING_INTERVAL_S = 10.0
DEFAULT_MCP_PING_TIMEOUT_S = 20.0
DEFAULT_MCP_REFRESH_INTERVAL_S = 1.0  # a server flooding list_changed costs one listing per second
DEFAULT_WEBHOOK_TIMEOUT_S = 10.0
DEFAULT_WEBHOOK_RETRIES = 5
DEFAULT_WEBHOOK_BACKOFF_S = 1.0
DEFAULT_WEBHOOK_OUTBOX_MAX_AGE_S = 3600.0  # the outbox keeps trying a committed webhook this long


def _comma_list(value: Any) -> Any:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``: lists are comma-separated in the environment."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


# A list setting: comma-separated in the environment (not JSON), a list in Python.
CommaList = Annotated[list[str], NoDecode, BeforeValidator(_comma_list)]


class Settings(BaseSettings):
    """Fleet settings, shared by producers and workers. Times are seconds."""

    model_config = SettingsConfigDict(env_prefix="SANDFLEET_", extra="ignore", populate_by_name=True)

    redis_url: str = Field(
        DEFAULT_REDIS_URL,
        description="the broker: redis://, rediss:// (TLS) or sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]"
        "/DB?master=NAME (sandfleet/core/redis_connect.py)",
    )
    results_redis_url: str | None = Field(
        None,
        description="records, audit, artifacts, approvals, cancel requests and keys, in the same forms; "
        "unset: the broker's Redis",
    )
    redis_ca_file: str | None = Field(
        None, description="the CA bundle rediss:// servers are verified against (unset: the system's)"
    )
    redis_wait_replicas: int = Field(
        DEFAULT_REDIS_WAIT_REPLICAS,
        ge=0,
        description="replicas that must acknowledge a final record (WAIT) before its message is acked, "
        "when the server has replicas; 0: no WAIT",
    )
    redis_wait_timeout_ms: int = Field(
        DEFAULT_REDIS_WAIT_TIMEOUT_MS, ge=1, description="how long the WAIT after a final record blocks"
    )
    key_prefix: str = Field("sandfleet", description="prefix of every Redis key")
    tools: CommaList = Field(default_factory=list, description="tool modules (import paths or files)")
    mcp_config: str | None = Field(
        None, description="an mcpServers JSON file: the MCP servers whose tools workers offer"
    )
    mcp_ping_interval_s: float = Field(
        DEFAULT_MCP_PING_INTERVAL_S,
        gt=0,
        le=3600,
        description="how often a worker pings each MCP server it holds; a down server is retried as often",
    )
    mcp_ping_timeout_s: float = Field(
        DEFAULT_MCP_PING_TIMEOUT_S,
        gt=0,
        le=3600,
        description="a ping unanswered this long marks the MCP server down (restarted or reconnected)",
    )
    mcp_refresh_interval_s: float = Field(
        DEFAULT_MCP_REFRESH_INTERVAL_S,
        ge=0,
        le=3600,
        description="at least this long between two listings of one MCP server after list_changed",
    )
    data_dir: str = Field(
        "~/.sandfleet/data", description="folder the example tools read (orders.csv, files)"
    )
    model: str = Field(DEFAULT_MODEL, description="default model, provider:model (or replay:FILE)")
    model_base_url: str | None = Field(
        None,
        validation_alias=AliasChoices("SANDFLEET_MODEL_BASE_URL", "OPENAI_BASE_URL"),
        description="any OpenAI-compatible endpoint; unset: the provider's own",
    )
    model_api_key: str | None = Field(
        None,
        validation_alias=AliasChoices("SANDFLEET_MODEL_API_KEY", "OPENAI_API_KEY"),
        description="the model endpoint's key",
    )
    model_request_timeout_s: float = Field(
        DEFAULT_MODEL_REQUEST_TIMEOUT_S, description="seconds per model request"
    )
    model_max_retries: int = Field(
        DEFAULT_MODEL_MAX_RETRIES, description="retries of a rate-limited or failed model request"
    )
    replay_scripts_dir: str | None = Field(
        None,
        description="the folder whose files a job's replay:FILE model may name on a worker (unset: "
        "workers refuse replay: models from jobs)",
    )

    pool_size: int = Field(DEFAULT_POOL_SIZE, ge=0, description="warm containers kept per sandbox config")
    pool_follows_demand: bool = Field(
        True,
        description="warm more than pool_size while recent demand is higher (up to max_sandboxes, "
        "while memory allows); false keeps exactly pool_size",
    )
    max_sandboxes: int = Field(DEFAULT_MAX_SANDBOXES, ge=1, description="live containers per worker")
    max_sessions: int = Field(
        DEFAULT_MAX_SESSIONS,
        ge=1,
        description="shell jobs' session sandboxes per worker (not in max_sandboxes)",
    )
    wheelhouse_dir: str | None = Field(
        None, description="host folder of wheels, mounted read-only into session sandboxes for installs"
    )

    retention_s: int = Field(
        DEFAULT_RETENTION_S, description="seconds job records and audit streams are kept"
    )
    visibility_timeout_s: int = Field(
        DEFAULT_VISIBILITY_TIMEOUT_S, description="seconds before an unacknowledged job is redelivered"
    )
    max_deliveries: int = Field(DEFAULT_MAX_DELIVERIES, description="deliveries of one job before it fails")
    transient_retries: int = Field(
        DEFAULT_TRANSIENT_RETRIES, ge=0, description="retries of a job whose sandbox or model was unavailable"
    )
    transient_backoff_s: float = Field(
        DEFAULT_TRANSIENT_BACKOFF_S, gt=0, description="first retry delay; doubles each retry"
    )
    transient_backoff_max_s: float = Field(
        DEFAULT_TRANSIENT_BACKOFF_MAX_S, gt=0, description="longest retry delay"
    )
    worker_state_dir: str = Field(
        DEFAULT_WORKER_STATE_DIR,
        description="the worker host's own folder: its signing keys live in keys/{worker}.pem (mode 0600)",
    )
    trusted_keys: str | None = Field(
        None,
        description="a key set from `sandfleet keys export`: verify audit chains with these keys only "
        "(readers; workers too, before they use a checkpoint, a stored outcome or a committed webhook, "
        "plus their own key). Unset: readers use the keys registered in Redis, workers only the keys "
        "made on their own host (set it on fleets of several hosts)",
    )
    # The submitting user's own state (sandfleet/producer/ledger.py, sandfleet/producer/submitter.py).
    client_state_dir: str = Field(
        DEFAULT_CLIENT_STATE_DIR,
        description="the submitting user's folder: the ledger of the specs it submitted (ledger.sqlite3) "
        "and its submitter token (submitter.token, mode 0600)",
    )
    client_ledger_max_jobs: int = Field(
        DEFAULT_CLIENT_LEDGER_MAX_JOBS,
        ge=0,
        description="jobs the ledger remembers, the oldest dropped first; 0: no ledger (results are then "
        "checked against the spec only in the process that submitted them)",
    )
    submitter_token: str | None = Field(
        None,
        min_length=16,
        description="the secret that makes this client the creator of its batches (share it to add jobs "
        "to one batch from several machines); unset: made once in client_state_dir/submitter.token",
    )

    # Operator policy: what a job may ask of its sandbox.
    policy_networks: CommaList = Field(default_factory=lambda: ["none"], description="networks jobs may use")
    policy_max_memory: Annotated[int, BeforeValidator(parse_size)] = Field(
        parse_size(DEFAULT_POLICY_MAX_MEMORY),
        description="the most memory a job's sandbox may ask for (bytes; 8G in the environment)",
    )
    policy_images: CommaList = Field(
        default_factory=lambda: list(DEFAULT_POLICY_IMAGES),
        description="images jobs may use: names, or patterns with * (sandfleet/custom-*:py3.11); empty: the default",
    )
    policy_runtimes: CommaList = Field(
        default_factory=lambda: list(DEFAULT_POLICY_RUNTIMES),
        description="Docker runtimes jobs may use (backend and runtime); empty: the default ones",
    )
    policy_allow_sudo: bool = Field(False, description="jobs may run their programs as root (allow_sudo)")
    policy_allow_writable_rootfs: bool = Field(
        False, description="jobs may have a writable root filesystem (read_only_rootfs=false)"
    )
    policy_env_names: CommaList = Field(
        default_factory=list,
        description="environment variables jobs may set in their sandbox: names and globs (fnmatch); "
        "empty: none",
    )
    policy_workdirs: CommaList = Field(
        default_factory=lambda: list(DEFAULT_POLICY_WORKDIRS),
        description="folders a job's workdir may be (or be below); empty: the default",
    )
    policy_max_cpus: float = Field(
        DEFAULT_POLICY_MAX_CPUS, gt=0, description="the most CPUs a job's sandbox may ask for (cpu_limit)"
    )
    policy_max_disk: Annotated[int, BeforeValidator(parse_size)] = Field(
        parse_size(DEFAULT_POLICY_MAX_DISK),
        description="the largest disk_limit a job may ask for (bytes; 2G in the environment)",
    )
    policy_max_pids: int = Field(
        DEFAULT_POLICY_MAX_PIDS, ge=8, description="the largest pids_limit a job may ask for"
    )
    policy_max_sandbox_timeout_s: float = Field(
        DEFAULT_POLICY_MAX_SANDBOX_TIMEOUT_S,
        gt=0,
        description="the longest sandbox timeout a job may ask for (seconds)",
    )
    policy_max_exec_timeout_s: float = Field(
        DEFAULT_POLICY_MAX_EXEC_TIMEOUT_S, gt=0, description="the longest one sandbox_exec may run (seconds)"
    )

    policy_allow_hosts: CommaList = Field(
        default_factory=list,
        description="the widest allow-list of network 'restricted' (names, *.suffix, optional :port); "
        "jobs may only narrow it; empty: no job may use restricted",
    )

    # The egress proxy of network "restricted" (sandfleet/worker/egress/).
    egress_network: str = Field("sandfleet-egress", description="the Docker network of restricted sandboxes")
    egress_bridge: str = Field("sfegress0", max_length=15, description="its bridge interface on the host")
    egress_subnet: str = Field(
        "10.213.213.0/24", description="its subnet; the proxy listens on the first address"
    )
    egress_proxy_port: int = Field(3128, ge=1, le=65535, description="the proxy's port on that address")
    egress_state_dir: str = Field(
        "/run/sandfleet-egress",
        description="the proxy's folders (one per network: config, allow-lists, denials)",
    )
    egress_hosts_file: str = Field(
        "/etc/hosts", description="names the proxy resolves before DNS (a private mirror, a test service)"
    )
    egress_pip_index_url: str | None = Field(
        None,
        description="PIP_INDEX_URL of restricted sandboxes, e.g. a private mirror's https://HOST/simple "
        "(its host must be allowed); unset: pip's default, pypi.org and files.pythonhosted.org",
    )
    egress_ca_file: str | None = Field(
        None,
        description="a PEM bundle on the worker host, mounted read-only into restricted sandboxes and "
        "trusted by pip (PIP_CERT), requests and Python's ssl (SSL_CERT_FILE) instead of the image's CAs",
    )
    egress_allow_destinations: CommaList = Field(
        default_factory=list,
        description="CIDRs the proxy may connect to although internal (loopback, link-local, private, "
        "CGNAT, special-purpose, the worker host's own and its Docker networks), e.g. a private mirror's "
        "10.20.0.5/32; empty: none",
    )
    egress_dns_servers: CommaList = Field(
        default_factory=list,
        description="IP addresses of the DNS servers the proxy asks (after its hosts file); empty: the "
        "worker host's resolv.conf",
    )

    @field_validator("egress_allow_destinations")
    @classmethod
    def _destination_cidrs(cls, v: list[str]) -> list[str]:
        import ipaddress  # here, not at the top: the import block is where merges meet

        cidrs = []
        for entry in v:
            try:
                cidrs.append(str(ipaddress.ip_network(entry, strict=True)))
            except ValueError as e:
                raise ValueError(
                    f"SANDFLEET_EGRESS_ALLOW_DESTINATIONS: {entry!r} is not an IP address or CIDR with its "
                    f"host bits clear (e.g. 10.20.0.0/16, 192.168.1.5, fd00::/8): {e}"
                ) from None
        return cidrs

    @field_validator("egress_dns_servers")
    @classmethod
    def _dns_addresses(cls, v: list[str]) -> list[str]:
        import ipaddress

        for entry in v:
            try:
                ipaddress.ip_address(entry)
            except ValueError:
                raise ValueError(
                    f"SANDFLEET_EGRESS_DNS_SERVERS: {entry!r} is not an IP address (Squid asks port 53 of "
                    "each, e.g. 10.0.0.2,2001:db8::53)"
                ) from None
        return v

    @field_validator("egress_pip_index_url")
    @classmethod
    def _index_url(cls, v: str | None) -> str | None:
        if v and not re.fullmatch(r"https?://[^/\s:]+(:\d+)?(/\S*)?", v):
            raise ValueError(
                f"give the index as https://HOST[:PORT]/PATH (a PEP 503 simple index), not {v!r}"
            )
        return v or None

    # Artifacts: files a program writes under /workspace/out/ (sandfleet/core/artifacts.py). The caps
    # are the operator's ceilings; a job may ask for less (JobSpec.artifacts).
    artifact_max_file_bytes: Annotated[int, BeforeValidator(parse_size)] = Field(
        DEFAULT_ARTIFACT_MAX_FILE_BYTES, ge=0, description="the largest artifact file kept (bytes; 32M)"
    )
    artifact_max_job_bytes: Annotated[int, BeforeValidator(parse_size)] = Field(
        DEFAULT_ARTIFACT_MAX_JOB_BYTES, ge=0, description="artifact bytes kept per job (bytes; 64M)"
    )
    artifact_max_files: int = Field(DEFAULT_ARTIFACT_MAX_FILES, ge=0, description="artifact files per job")
    artifact_store: str = Field(
        "redis",
        description="where artifacts are kept: redis (with the records' retention) or filesystem "
        "(artifact_dir, e.g. a shared volume, for large files)",
    )
    artifact_dir: str = Field(
        "~/.sandfleet/artifacts", description="the filesystem store's folder, shared by workers and readers"
    )

    @field_validator("artifact_store")
    @classmethod
    def _known_store(cls, v: str) -> str:
        if v not in ARTIFACT_STORES:
            raise ValueError(f"unknown artifact store {v!r}: use {' or '.join(ARTIFACT_STORES)}")
        return v

    # Human approval of bridged calls (sandfleet/core/approvals.py, sandfleet/worker/approval/).
    approval_tools: CommaList = Field(
        default_factory=list,
        description="tools whose calls need a person's approval: names and globs (fnmatch), MCP tools included",
    )
    approval_timeout_s: float = Field(
        DEFAULT_APPROVAL_TIMEOUT_S, gt=0, description="a request not decided in this long is denied (seconds)"
    )
    approval_grace_s: float = Field(
        DEFAULT_APPROVAL_GRACE_S,
        ge=0,
        description="seconds a program waits for a decision before its container is destroyed and the job suspended",
    )
    approval_workspace_max_bytes: Annotated[int, BeforeValidator(parse_size)] = Field(
        DEFAULT_APPROVAL_WORKSPACE_MAX_BYTES,
        ge=0,
        description="the largest /workspace archive a shell job waiting for a decision may save (bytes; "
        "32M; larger: the job fails, no container is kept)",
    )
    approval_redact: CommaList = Field(
        default_factory=list,
        description="argument field names shown as *** wherever a call is seen: approval requests and "
        "their webhook, tool_call and function_call audit events, results (the chain keeps the call's "
        "SHA-256)",
    )
    approvers_file: str | None = Field(
        None,
        description="on each worker: the approvers whose signed decisions it accepts (a file the operator "
        "controls, edited by `sandfleet approvers add/revoke`); unset: no decision is accepted",
    )
    approval_allow_unsigned: bool = Field(
        False,
        description="on a worker: also accept decisions no approver signed (their name is the one given, "
        "unproven); a signature that does not verify is refused all the same",
    )
    approver_key: str = Field(
        DEFAULT_APPROVER_KEY,
        description="on an approver's machine: the private key (mode 0600) `sandfleet approvals "
        "approve/deny` sign decisions with; made by `sandfleet approvers keygen`",
    )
    approval_webhook_url: str | None = Field(
        None, description="POSTed (JSON, HMAC-signed) when a request starts waiting"
    )
    approval_webhook_secret: str | None = Field(
        None, description="the HMAC-SHA256 key of the webhook's X-Sandfleet-Signature header"
    )

    # Bounds on model use (JobSpec.model_limits; sandfleet/core/model_limits.py).
    model_max_completion_tokens: int = Field(
        DEFAULT_MODEL_MAX_COMPLETION_TOKENS, ge=1, description="tokens one model reply may have, by default"
    )
    model_max_job_tokens: int | None = Field(
        None, ge=1, description="prompt + completion tokens per job by default; unset: no budget"
    )
    model_time_budget_s: float = Field(
        DEFAULT_MODEL_TIME_BUDGET_S, gt=0, description="seconds a job may wait on the model, by default"
    )
    model_token_limit_param: Literal["auto", "max_completion_tokens", "max_tokens"] = Field(
        "auto",
        description="the request field of the completion-token limit; auto: max_completion_tokens for "
        "api.openai.com (its reasoning models refuse max_tokens), max_tokens for other endpoints",
    )
    policy_max_completion_tokens: int = Field(
        DEFAULT_POLICY_MAX_COMPLETION_TOKENS, ge=1, description="the most completion tokens a job may ask for"
    )
    policy_max_job_tokens: int | None = Field(
        None, ge=1, description="the largest token budget a job may ask for; unset: any"
    )
    policy_max_model_time_s: float = Field(
        DEFAULT_POLICY_MAX_MODEL_TIME_S, gt=0, description="the longest model-time budget a job may ask for"
    )

    # Observability and notifications.
    metrics_port: int = Field(
        DEFAULT_METRICS_PORT, ge=0, le=65535, description="Prometheus metrics port of each worker; 0: off"
    )
    metrics_address: str = Field("127.0.0.1", description="address the metrics server listens on")
    webhook_secret: str | None = Field(
        None, description="HMAC-SHA256 key signing completion webhooks; unset: webhooks are not sent"
    )
    policy_webhook_hosts: CommaList = Field(
        default_factory=list,
        description="hosts completion webhooks may be sent to (names, *.suffix, optional :port); empty: none",
    )
    webhook_timeout_s: float = Field(DEFAULT_WEBHOOK_TIMEOUT_S, gt=0, description="per POST")
    webhook_retries: int = Field(DEFAULT_WEBHOOK_RETRIES, ge=0, description="further POSTs after a failure")
    webhook_backoff_s: float = Field(
        DEFAULT_WEBHOOK_BACKOFF_S, gt=0, description="first wait between POSTs; doubles each retry"
    )
    webhook_outbox_max_age_s: float = Field(
        DEFAULT_WEBHOOK_OUTBOX_MAX_AGE_S,
        gt=0,
        description="how long after its commit any live worker still sends an undelivered webhook",
    )

    @field_validator("policy_networks")
    @classmethod
    def _known_networks(cls, v: list[str]) -> list[str]:
        unknown = [n for n in v if n not in ("none", "restricted", "full")]
        if unknown:
            raise ValueError(f"unknown network(s) {', '.join(unknown)}: use none, restricted or full")
        return v or ["none"]

    @field_validator("policy_images", "policy_runtimes", "policy_workdirs")
    @classmethod
    def _never_empty(cls, v: list[str], info: ValidationInfo) -> list[str]:
        """An empty list is the default, never "anything" (deny by default: widening is spelled out)."""
        defaults = {
            "policy_images": DEFAULT_POLICY_IMAGES,
            "policy_runtimes": DEFAULT_POLICY_RUNTIMES,
            "policy_workdirs": DEFAULT_POLICY_WORKDIRS,
        }
        return v or list(defaults[str(info.field_name)])

    @field_validator("policy_workdirs")
    @classmethod
    def _absolute_workdirs(cls, v: list[str]) -> list[str]:
        relative = [d for d in v if not d.startswith("/")]
        if relative:
            raise ValueError(f"workdirs must be absolute folders, got {', '.join(relative)}")
        return [posixpath.normpath(d) for d in v]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once from the environment."""
    return Settings()
