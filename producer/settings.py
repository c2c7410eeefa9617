"""The one typed settings object. Environment prefix ``SANDFLEET_``; no other module reads os.environ.

The model's key and base URL also come from the names every OpenAI-compatible tool uses
(``OPENAI_API_KEY``, ``OPENAI_BASE_URL``).
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_REDIS_URL = "redis://localhost:6379/0"
DEFAULT_MODEL = "openai:gpt-5-mini"
DEFAULT_RETENTION_S = 7 * 24 * 3600
DEFAULT_VISIBILITY_TIMEOUT_S = 3600
DEFAULT_MODEL_REQUEST_TIMEOUT_S = 60.0
DEFAULT_MODEL_MAX_RETRIES = 4
DEFAULT_POOL_SIZE = 2
DEFAULT_MAX_SANDBOXES = 4
DEFAULT_MAX_DELIVERIES = 3


class Settings(BaseSettings):
    """Fleet settings, shared by producers and workers. Times are seconds."""

    model_config = SettingsConfigDict(env_prefix="SANDFLEET_", extra="ignore", populate_by_name=True)

    redis_url: str = DEFAULT_REDIS_URL
    key_prefix: str = "sandfleet"
    tools: str = Field("", description="comma-separated tool modules (import paths or files)")
    data_dir: str = Field(
        "~/.sandfleet/data", description="folder the example tools read (orders.csv, files)"
    )
    model: str = DEFAULT_MODEL
    model_base_url: str | None = Field(
        None, validation_alias=AliasChoices("SANDFLEET_MODEL_BASE_URL", "OPENAI_BASE_URL")
    )
    model_api_key: str | None = Field(
        None, validation_alias=AliasChoices("SANDFLEET_MODEL_API_KEY", "OPENAI_API_KEY")
    )
    model_request_timeout_s: float = DEFAULT_MODEL_REQUEST_TIMEOUT_S
    model_max_retries: int = DEFAULT_MODEL_MAX_RETRIES

    pool_size: int = Field(DEFAULT_POOL_SIZE, ge=0, description="warm containers kept per sandbox config")
    max_sandboxes: int = Field(DEFAULT_MAX_SANDBOXES, ge=1, description="live containers per worker")

    retention_s: int = DEFAULT_RETENTION_S
    visibility_timeout_s: int = DEFAULT_VISIBILITY_TIMEOUT_S
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    transient_retries: int = Field(
        5, ge=0, description="retries of a job whose sandbox or model was unavailable"
    )
    transient_backoff_s: float = Field(5.0, gt=0, description="first retry delay; doubles each retry")
    transient_backoff_max_s: float = Field(300.0, gt=0, description="longest retry delay")
    audit_secret: str = Field("sandfleet-dev-audit-key", description="HMAC key of the audit hash chain")

    # Operator policy: what a job may ask of its sandbox.
    policy_networks: str = Field("none", description="comma-separated networks jobs may use")
    policy_max_memory: str = "8G"
    policy_images: str = Field(
        "sandfleet/sandbox:py3.11,sandfleet/sandbox-ds:py3.11",
        description="comma-separated images jobs may use",
    )
    policy_runtimes: str = Field("", description="comma-separated Docker runtimes jobs may use; empty: any")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once from the environment."""
    return Settings()
