"""What a worker process shares between its jobs: the sandbox pool, the session sandboxes of shell
jobs, the tools, the model clients, and the sessions of its MCP servers (started once, stopped
with the services)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sandfleet.core.artifacts import ArtifactStore, MemoryArtifactStore
from sandfleet.core.config import SandboxConfig
from sandfleet.core.contracts import JobSpec
from sandfleet.core.errors import InvalidSpecError, ReplayScriptError
from sandfleet.core.settings import Settings
from sandfleet.worker.cancel.model import cancellable
from sandfleet.worker.engine.shell.keeper import SessionKeeper
from sandfleet.worker.llm.bounds import BoundedModelClient, MemoryLedger, UsageLedger, resolve_limits
from sandfleet.worker.llm.client import ModelClient, ModelTrust, make_model_client
from sandfleet.worker.program.bridge import CallPolicy, allow_all
from sandfleet.worker.program.runtime import ProgramRuntime
from sandfleet.worker.sandbox.backends import backend_named
from sandfleet.worker.sandbox.pool import SandboxPool
from sandfleet.worker.tools.registry import ToolRegistry

logger = logging.getLogger("sandfleet.engine")

# Model clients kept for reuse, the oldest dropped first: a job chooses its model's name (one per
# distinct ``replay:FILE?latency=S``, say), and a client is cheap to make again.
MAX_CACHED_MODEL_CLIENTS = 256

if TYPE_CHECKING:
    from sandfleet.worker.approval.gate import ApprovalService
    from sandfleet.worker.mcp.catalog import ToolCatalog
    from sandfleet.worker.mcp.sessions import McpSessions


@dataclass(frozen=True)
class EngineOptions:
    """What a caller chooses of a process's engine services beyond the settings (the defaults are a
    worker's: the settings' tools and pool, every call allowed, files kept in memory, job models named
    by submitters).

    ``registry``: the Python tools offered (default: the modules of ``settings.tools``). ``policy``:
    the operator's hook asked before each tool call. ``mcp``: MCP sessions the caller started and
    stops (default: those of ``settings.mcp_config``, started and stopped by the services).
    ``artifacts``: where programs' files are kept. ``job_model_trust``: who writes a job's ``model``
    field. ``pool_size``, ``max_sandboxes`` (None or 0: the settings') and ``warm`` (warm the
    default sandbox config at start) shape the sandbox pool ``start`` makes.
    """

    registry: ToolRegistry | None = None
    policy: CallPolicy = allow_all
    mcp: McpSessions | None = None
    artifacts: ArtifactStore | None = None
    job_model_trust: ModelTrust = ModelTrust.SUBMITTER
    pool_size: int | None = None
    max_sandboxes: int | None = None
    warm: bool = True


DEFAULT_OPTIONS = EngineOptions()


class EngineServices:
    """One per worker process (or per ``sandfleet ask``). Constructing it starts nothing; ``start``
    builds it from settings, connects the MCP servers and begins warming the default sandbox config.

    ``registry`` is every tool offered right now: the Python tools given, plus the tools of the MCP
    servers in ``mcp`` that are up. ``artifacts`` keeps the files programs hand back (a worker's is
    the fleet's store, sandfleet/core/artifacts.py; by default they are kept in memory).

    ``job_model_trust`` says who writes a job's ``model`` field: on a worker a submitter (the default:
    ``replay:FILE`` reaches only SANDFLEET_REPLAY_SCRIPTS_DIR), in ``sandfleet ask`` and ``compare``
    the user of the process (``ModelTrust.OPERATOR``: any file). The default model of the settings is
    always the operator's.
    """

    def __init__(
        self,
        settings: Settings,
        pool: SandboxPool,
        registry: ToolRegistry,
        options: EngineOptions = DEFAULT_OPTIONS,
        *,
        owns_mcp: bool = False,
    ) -> None:
        """The services over a pool and registry made already (``start`` makes them from settings):
        of ``options`` only the policy, MCP sessions, artifact store and model trust are read here."""
        self.settings = settings
        self.job_model_trust = options.job_model_trust
        self.artifacts: ArtifactStore = (
            options.artifacts if options.artifacts is not None else MemoryArtifactStore()
        )
        self.pool = pool
        self.mcp = options.mcp
        self._owns_mcp = owns_mcp
        self._catalog: ToolCatalog | None = None
        if self.mcp is not None:
            from sandfleet.worker.mcp.catalog import ToolCatalog

            self._catalog = ToolCatalog(registry, self.mcp)
        self._python_tools = registry
        self.runtime = ProgramRuntime(pool, registry, options.policy)
        self.sessions = SessionKeeper(settings, backend=pool.backend)
        self._models: dict[tuple[str, str | None, ModelTrust], ModelClient] = {}
        # Human approval of gated calls (sandfleet/worker/approval/gate.py ApprovalService): set by a fleet
        # worker, None elsewhere (``sandfleet ask``), where jobs with gated tools are refused.
        self.approvals: ApprovalService | None = None
        self._lock = threading.Lock()
        # What each job spent on the model; the worker puts a ledger in the job records here.
        self.usage_ledger: UsageLedger = MemoryLedger()

    @classmethod
    def start(cls, settings: Settings, options: EngineOptions = DEFAULT_OPTIONS) -> EngineServices:
        """Services from settings and the caller's ``options``. With ``settings.mcp_config`` (and no
        ``options.mcp``) its servers are started here and stopped by :meth:`close`.

        Raises:
            ToolLoadError: a tools module cannot be loaded, or the MCP config is malformed.
        """
        registry = (
            options.registry if options.registry is not None else ToolRegistry.from_modules(settings.tools)
        )
        mcp, owns_mcp = options.mcp, False
        if mcp is None and settings.mcp_config:  # a malformed config is refused before anything starts
            from sandfleet.worker.mcp.config import load_mcp_config
            from sandfleet.worker.mcp.sessions import McpSessions

            mcp, owns_mcp = McpSessions.for_settings(load_mcp_config(settings.mcp_config), settings), True
        pool = SandboxPool(
            pool_size=settings.pool_size if options.pool_size is None else options.pool_size,
            max_live=options.max_sandboxes or settings.max_sandboxes,
            follow_demand=settings.pool_follows_demand,
            # a local engine through the thin client (docker/engine_api.py): ~1.7 ms of the worker's
            # CPU a sandbox less than the SDK over requests; "restricted" and remote engines: the SDK
            backend=backend_named(thin=True),
        )
        services = cls(settings, pool, registry, replace(options, mcp=mcp), owns_mcp=owns_mcp)
        if owns_mcp and mcp is not None:
            mcp.start()
        if options.warm and pool.pool_size:
            pool.warm(SandboxConfig())
        return services

    @property
    def registry(self) -> ToolRegistry:
        """Every tool offered now (the runtime serves programs from the same registry)."""
        if self._catalog is None:
            return self._python_tools
        registry = self._catalog.registry()
        self.runtime.registry = registry
        return registry

    def require_tools(self, names: Iterable[str]) -> None:
        """Raises ToolServerUnavailableError when a named tool's MCP server is down (transient)."""
        if self._catalog is not None:
            self._catalog.require(names)

    def model_client(
        self, model: str, base_url: str | None = None, *, trust: ModelTrust = ModelTrust.SUBMITTER
    ) -> ModelClient:
        """A model client per (model, base URL, trust), made once; ``trust``: who named the model
        (make_model_client). Raises InvalidSpecError when unusable."""
        key = (model, base_url, trust)
        with self._lock:
            client = self._models.get(key)
            if client is None:
                client = make_model_client(model, self.settings, trust=trust, base_url=base_url)
                if len(self._models) >= MAX_CACHED_MODEL_CLIENTS:  # names are the jobs': keep it bounded
                    del self._models[next(iter(self._models))]
                self._models[key] = client
        return cancellable(
            client
        )  # inside a delivery: a cancel abandons its calls (sandfleet/worker/cancel/)

    def job_model(self, spec: JobSpec, job_id: str, base_url: str | None = None) -> BoundedModelClient:
        """The job's model client, within its ``model_limits`` (sandfleet/worker/llm/bounds.py).

        Raises:
            InvalidSpecError: the model is unusable, or the limits are beyond the operator's policy.
        """
        limits = resolve_limits(spec.model_limits, self.settings)
        if spec.model:
            inner = self.model_client(spec.model, base_url, trust=self.job_model_trust)
        else:
            inner = self._default_model(base_url)
        return BoundedModelClient(inner, limits, job_id, self.usage_ledger)

    def _default_model(self, base_url: str | None) -> ModelClient:
        """The settings' model. Its name is the operator's, so its ``replay:`` may name any file; but a
        job reads the error, so a broken script's words go to the log when jobs are a submitter's."""
        try:
            return self.model_client(self.settings.model, base_url, trust=ModelTrust.OPERATOR)
        except ReplayScriptError as e:
            if self.job_model_trust is ModelTrust.OPERATOR:
                raise
            logger.error("the default model %s (SANDFLEET_MODEL) is unusable: %s", self.settings.model, e)
            raise InvalidSpecError(
                "this worker's default model (SANDFLEET_MODEL) is unusable; the worker's log says why"
            ) from None

    def close(self) -> None:
        """Destroy the session sandboxes and drain the pool (no container outlives the services), then
        stop the MCP servers started here."""
        try:
            self.sessions.close()
        finally:
            try:
                self.pool.close()
            finally:
                if self.mcp is not None and self._owns_mcp:
                    self.mcp.stop()

    def __enter__(self) -> EngineServices:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
