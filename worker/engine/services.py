"""What a worker process shares between its jobs: the sandbox pool, the session sandboxes of shell
jobs, the tools, the model clients."""

from __future__ import annotations

import threading
from typing import Any

from sandfleet.core.config import SandboxConfig
from sandfleet.core.settings import Settings
from sandfleet.worker.bridge.host import CallPolicy, allow_all
from sandfleet.worker.llm.client import ModelClient, make_model_client
from sandfleet.worker.runtime import ProgramRuntime
from sandfleet.worker.sandbox.pool import SandboxPool
from sandfleet.worker.shell.keeper import SessionKeeper
from sandfleet.worker.tools.registry import ToolRegistry


class EngineServices:
    """One per worker process (or per ``sandfleet ask``). Constructing it starts nothing; ``start``
    builds it from settings and begins warming the default sandbox config."""

    def __init__(
        self, settings: Settings, pool: SandboxPool, registry: ToolRegistry, policy: CallPolicy = allow_all
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.registry = registry
        self.runtime = ProgramRuntime(pool, registry, policy)
        self.sessions = SessionKeeper(settings, backend=pool.backend)
        self._models: dict[tuple[str, str | None], ModelClient] = {}
        self._lock = threading.Lock()

    @classmethod
    def start(
        cls,
        settings: Settings,
        *,
        max_sandboxes: int | None = None,
        pool_size: int | None = None,
        registry: ToolRegistry | None = None,
        policy: CallPolicy = allow_all,
        warm: bool = True,
    ) -> EngineServices:
        """Services from settings. Raises ToolLoadError when a tools module cannot be loaded."""
        registry = registry if registry is not None else ToolRegistry.from_modules(settings.tools)
        pool = SandboxPool(
            pool_size=settings.pool_size if pool_size is None else pool_size,
            max_live=max_sandboxes or settings.max_sandboxes,
            follow_demand=settings.pool_follows_demand,
        )
        services = cls(settings, pool, registry, policy)
        if warm and pool.pool_size:
            pool.warm(SandboxConfig())
        return services

    def model_client(self, model: str, base_url: str | None = None) -> ModelClient:
        """A model client per (model, base URL), made once. Raises InvalidSpecError when unusable."""
        key = (model, base_url)
        with self._lock:
            client = self._models.get(key)
            if client is None:
                client = make_model_client(model, self.settings, base_url=base_url)
                self._models[key] = client
            return client

    def close(self) -> None:
        """Destroy the session sandboxes and drain the pool: no container outlives the services."""
        try:
            self.sessions.close()
        finally:
            self.pool.close()

    def __enter__(self) -> EngineServices:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
