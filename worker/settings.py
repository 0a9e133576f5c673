"""Process settings: one typed class per concern, read once at process start and passed down.

Nothing here touches the environment at import time; `Settings.load()` does, once, in the
entry point. Secrets are `SecretStr` (their repr is masked) and URLs that may carry a password
are masked in `repr()` and in `Settings.redacted()`, the only summary meant for printing.
Field docstrings become the descriptions the README configuration table is generated from
(`python -m worker.settings_doc`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, SecretStr, field_serializer, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from models.config import Vocation


def mask_url(url: str) -> str:
    """`url` with any password in its user-info replaced by `***` (for logs and repr)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _config(prefix: str) -> SettingsConfigDict:
    # Attribute docstrings become field descriptions; empty variables count as unset so that
    # `FOO=` in a .env or a manifest means "default", not "the empty string".
    return SettingsConfigDict(
        env_prefix=prefix,
        extra="ignore",
        use_attribute_docstrings=True,
        env_ignore_empty=True,
        frozen=True,
    )


class TemporalSettings(BaseSettings):
    """Where the Temporal service is and how to reach it (names as in the `temporal` CLI)."""

    model_config = _config("TEMPORAL_")

    address: str = "127.0.0.1:7233"
    """gRPC endpoint (host:port) of the Temporal frontend or Temporal Cloud."""
    namespace: str = "default"
    """Temporal namespace of all mnemoflow workflows."""
    task_queue: str = "mnemoflow"
    """Task queue of the workflows and the Milvus/Redis activities."""
    llm_task_queue: str | None = None
    """Separate task queue for the LLM activities (slice, tune, induct); unset = task_queue."""
    tls: bool = False
    """Use TLS (implied by an API key or client certificate)."""
    tls_client_cert_path: Path | None = None
    """PEM client certificate for mTLS."""
    tls_client_key_path: Path | None = None
    """PEM private key of the client certificate."""
    tls_server_ca_cert_path: Path | None = None
    """PEM CA bundle to verify the server with (unset = system roots)."""
    tls_server_name: str | None = None
    """Override of the TLS server name (SNI)."""
    api_key: SecretStr | None = None
    """API key (Temporal Cloud); sent as a bearer token, never logged."""

    @property
    def uses_tls(self) -> bool:
        """Whether the connection must be encrypted."""
        return self.tls or self.api_key is not None or self.tls_client_cert_path is not None


class MilvusSettings(BaseSettings):
    """The fragment store (Milvus Lite server, standalone or distributed: by URI only)."""

    model_config = _config("MILVUS_")

    uri: str = "http://127.0.0.1:19530"
    """URI of the Milvus server."""
    token: SecretStr | None = None
    """Milvus token ("user:password" or an API key); never logged."""
    collection: str = "mnemoflow_fragments"
    """Collection holding every user's fragments (the user id is the partition key)."""
    embedding: Literal["use", "hashing"] = "use"
    """Embedder: "use" = the offline multilingual Universal Sentence Encoder (512 dims);
    "hashing" = a deterministic hashing embedder, for tests only."""

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, mask_url(value) if name == "uri" else value

    @field_serializer("uri")
    def _masked_uri(self, uri: str) -> str:
        # Dumps are printouts too; like SecretStr, a password never leaves through them.
        return mask_url(uri)


class RedisSettings(BaseSettings):
    """The read model the agent's hot path reads (rebuildable from the workflows)."""

    model_config = _config("REDIS_")

    url: str = "redis://127.0.0.1:6379/0"
    """Redis URL (a password in it is masked in every printout)."""
    key_prefix: str = "mnemoflow:"
    """Prefix of every key mnemoflow writes."""

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, mask_url(value) if name == "url" else value

    @field_serializer("url")
    def _masked_url(self, url: str) -> str:
        return mask_url(url)


class DeepSeekSettings(BaseSettings):
    """The DeepSeek chat model used by the LLM activities."""

    model_config = _config("DEEPSEEK_")

    api_key: SecretStr | None = None
    """DeepSeek API key; setting it selects DeepSeek when MNEMOFLOW_MODELS=auto."""
    base_url: str = "https://api.deepseek.com"
    """Base URL of the DeepSeek (or a compatible) API."""
    model: str = "deepseek-chat"
    """Chat model name."""
    timeout_s: float = 60.0
    """Per-request timeout in seconds (Temporal's retry policy does the retrying)."""


class MnemoflowSettings(BaseSettings):
    """The process itself: which memory models, where data lives, ports, concurrency."""

    model_config = _config("MNEMOFLOW_")

    models: Literal["auto", "heuristic", "deepseek"] = "auto"
    """Memory models: "auto" = DeepSeek when DEEPSEEK_API_KEY is set, else the offline
    deterministic heuristic models; "heuristic"; "deepseek"."""
    vocation: Vocation = Vocation.CUSTOMER_SERVICE
    """Default memory preset for new users: customer service, collaborative creation,
    accompany."""
    data_dir: Path = Path(".run")
    """Directory of the embedded dev stack (SQLite, Redis and Milvus files, stack.json)."""
    health_port: int | None = None
    """Port of the HTTP health endpoint for probes (unset = no endpoint)."""
    metrics_port: int | None = None
    """Port of the Prometheus /metrics endpoint (unset = no endpoint)."""
    http_host: str = "0.0.0.0"
    """Address the health and metrics endpoints bind to (0.0.0.0 = every interface, as
    Kubernetes probes and scrapes reach the pod IP)."""
    sdk_metrics_port: int | None = None
    """Loopback port of the Temporal SDK's own Prometheus exporter, whose page /metrics
    appends (unset = any free port)."""
    connect_retry_s: float = 2.0
    """Pause between attempts to reach Temporal at start (the worker keeps trying, not ready,
    until it connects or is told to stop)."""
    heuristic_latency_s: float = 0.0
    """Simulated latency of each heuristic model call, for tests and demos of slow LLMs."""
    worker_role: Literal["all", "workflow", "llm"] = "all"
    """What `mnemoflow worker` polls: "all" = workflows and every activity; "workflow" = the
    workflows and the Milvus/Redis activities; "llm" = only the LLM activities, on
    TEMPORAL_LLM_TASK_QUEUE (both split roles need that queue set)."""
    llm_activities_per_second: float | None = None
    """Rate limit of the LLM activities across every worker of their task queue (enforced by
    Temporal; only applied when they have a queue of their own; unset = no limit)."""
    max_concurrent_activities: int = 64
    """Activities one worker runs at once (they are async and I/O bound)."""
    pseudonymous_user_keys: bool = False
    """Show hashed user ids instead of raw ones in search attributes and logs."""

    @field_validator("vocation", mode="before")
    @classmethod
    def _spaces_or_underscores(cls, value: Any) -> Any:
        # "customer_service" is easier to write in a shell or a manifest than a quoted space.
        return value.replace("_", " ") if isinstance(value, str) else value


ResolvedModels = Literal["heuristic", "deepseek"]


class Settings(BaseModel):
    """All settings of one process."""

    model_config = {"frozen": True}

    temporal: TemporalSettings
    milvus: MilvusSettings
    redis: RedisSettings
    deepseek: DeepSeekSettings
    mnemoflow: MnemoflowSettings

    @classmethod
    def load(cls) -> Settings:
        """Read every concern from the environment (call once, at process start)."""
        settings = cls(
            temporal=TemporalSettings(),
            milvus=MilvusSettings(),
            redis=RedisSettings(),
            deepseek=DeepSeekSettings(),
            mnemoflow=MnemoflowSettings(),
        )
        settings.resolved_models()  # fail at start, not at the first LLM activity
        return settings

    def resolved_models(self) -> ResolvedModels:
        """Which memory models to run, with `auto` decided by the presence of an API key."""
        choice = self.mnemoflow.models
        if choice == "auto":
            return "deepseek" if self.deepseek.api_key is not None else "heuristic"
        if choice == "deepseek" and self.deepseek.api_key is None:
            raise ValueError("MNEMOFLOW_MODELS=deepseek needs DEEPSEEK_API_KEY")
        return choice

    def redacted(self) -> dict[str, dict[str, Any]]:
        """A printable summary: secrets only as "set"/"unset", URL passwords masked."""
        out: dict[str, dict[str, Any]] = {}
        for section in type(self).model_fields:
            values: dict[str, Any] = {}
            for name, value in getattr(self, section):
                if isinstance(value, SecretStr):
                    values[name] = "set"
                elif value is None and name in _SECRET_FIELDS:
                    values[name] = "unset"
                elif isinstance(value, str):  # StrEnum included: print its plain value
                    values[name] = mask_url(str(value)) if "://" in value else str(value)
                elif isinstance(value, Path):
                    values[name] = str(value)
                else:
                    values[name] = value
            out[section] = values
        out["mnemoflow"]["models (resolved)"] = self.resolved_models()
        return out


#: Field names whose type is a secret (reported as set/unset even when unset).
_SECRET_FIELDS = frozenset({"api_key", "token"})

#: (section attribute, settings class) in documentation order.
SECTIONS: tuple[tuple[str, type[BaseSettings]], ...] = (
    ("temporal", TemporalSettings),
    ("milvus", MilvusSettings),
    ("redis", RedisSettings),
    ("deepseek", DeepSeekSettings),
    ("mnemoflow", MnemoflowSettings),
)
