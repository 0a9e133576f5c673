"""Process settings: one typed class per concern, read once at process start and passed down.

Nothing here touches the environment at import time; `Settings.load()` does, once, in the
entry point. Secrets are `SecretStr` (their repr is masked) and the credentials a URL may carry
(user-info password, `?password=`/`?token=`-like parameters; `worker.redact`) are masked in
`repr()`, in dumps and in `Settings.redacted()`, the only summary meant for printing.
Field docstrings become the descriptions the README configuration table is generated from
(`python -m mnemoflow.worker.settings_doc`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    SecretStr,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from mnemoflow.models.config import Vocation
from mnemoflow.models.ids import resolve_user_keys
from mnemoflow.worker.redact import masked

#: What redis-py connects to (`redis.from_url`).
_REDIS_SCHEMES = ("redis", "rediss", "unix")
#: What pymilvus connects to: a server URI with one of these schemes, or a Milvus Lite file.
_MILVUS_SCHEMES = ("http", "https", "tcp", "grpc", "unix")


def redis_url_problem(url: str) -> str | None:
    """Why redis-py could not use `url` (None when it can), without repeating the URL: it
    may carry a password."""
    parsed = urlparse(url)
    if parsed.scheme.lower() not in _REDIS_SCHEMES:
        return "not a Redis URL (redis://host:port/db, rediss://... or unix:///path)"
    if parsed.scheme.lower() != "unix" and not parsed.hostname:
        return "the Redis URL has no host"
    return None


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


class _MaskedURLs(BaseSettings):
    """Settings whose strings may be URLs with credentials: masked in repr and in dumps
    (dumps are printouts too; like SecretStr, a credential never leaves through them)."""

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, masked(value)

    @model_serializer(mode="wrap")
    def _masked_dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        return {k: masked(v) for k, v in data.items()} if isinstance(data, dict) else data


#: A key id: short, printable, and free of the separators of the key list.
_KID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def parse_keys(text: str, source: str) -> dict[str, bytes]:
    """`kid:base64key` items (comma or whitespace separated) or a JSON object `{kid: base64}`.

    Errors name the source and the key id, never the key material.
    """
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{source}: not valid JSON ({err.msg})") from None
        if not isinstance(items, dict) or not all(isinstance(v, str) for v in items.values()):
            raise ValueError(f"{source}: the JSON form is an object of key id -> base64 key")
        pairs = list(items.items())
    else:
        pairs = []
        for item in re.split(r"[,\s]+", text):
            kid, sep, encoded = item.partition(":")
            if not sep:
                raise ValueError(f"{source}: expected kid:base64key items, got one without ':'")
            pairs.append((kid, encoded))
    keys: dict[str, bytes] = {}
    for kid, encoded in pairs:
        if not _KID.fullmatch(kid):
            raise ValueError(f"{source}: key id {kid[:64]!r} is not 1-64 of [A-Za-z0-9._-]")
        if kid in keys:
            raise ValueError(f"{source}: key id {kid!r} is listed twice")
        try:  # standard or URL-safe alphabet, padding optional
            std = encoded.strip().replace("-", "+").replace("_", "/")
            key = base64.b64decode(std + "=" * (-len(std) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{source}: key {kid!r} is not valid base64") from None
        if len(key) != 32:
            raise ValueError(f"{source}: key {kid!r} has {len(key)} bytes; AES-256 needs 32")
        keys[kid] = key
    return keys


class EncryptionSettings(BaseSettings):
    """Payload encryption (AES-256-GCM) and the codec server that lets operators read it.

    Read with the Temporal settings (every client and worker connects with the same codec);
    encryption is off when no key is configured.
    """

    # A validation error must not echo the input: it holds the key material.
    model_config = SettingsConfigDict(**_config("MNEMOFLOW_"), hide_input_in_errors=True)

    encryption_keys: SecretStr | None = None
    """Payload encryption keys: "kid1:base64key,kid2:base64key" or a JSON object
    {"kid": "base64key"}; 32-byte keys. Unset (and no keys file) = payloads unencrypted.
    Never logged."""
    encryption_keys_file: Path | None = None
    """File with more keys in the same format (a mounted secret); its keys are listed before
    those of MNEMOFLOW_ENCRYPTION_KEYS."""
    encryption_active_key: str | None = None
    """Key id new payloads are encrypted with (unset = the last key listed); the others only
    decrypt, so keep a retired key for as long as histories sealed with it are kept."""
    codec_token: SecretStr | None = None
    """Bearer token the codec server (`mnemoflow codec-server`) requires; never logged."""
    codec_host: str = "127.0.0.1"
    """Address the codec server binds to."""
    codec_port: int = Field(8234, ge=1, le=65535)
    """Port of the codec server."""
    codec_cors_origins: str | None = None
    """Comma-separated origins of the Temporal Web UIs allowed to call the codec server
    (e.g. https://temporal.example.com); unset = no cross-origin access."""

    user_data_keys: bool = True
    """Crypto-shredding: seal each user's payloads with a data key of their own (wrapped by the
    key above, kept in Redis, never in Temporal), which forget destroys; off = every payload
    is sealed with the master key, and forget cannot make Temporal's copies unreadable."""
    data_keys_url: SecretStr | None = None
    """Redis URL of the wrapped data keys (unset = REDIS_URL, the read model's Redis); never
    logged."""
    data_keys_prefix: str | None = None
    """Key prefix of the data keys in that Redis (unset = REDIS_KEY_PREFIX)."""
    data_keys_cache_s: float = Field(30.0, ge=0, allow_inf_nan=False)
    """How long a process keeps an unwrapped data key it has not used in memory. It never
    decides from it that the key still exists: every encode and decode asks Redis, so a
    destroyed key is unusable in every process once the forget returned (docs/PRIVACY.md)."""

    _keys: dict[str, bytes] = PrivateAttr(default_factory=dict)

    @field_validator("data_keys_url")
    @classmethod
    def _data_keys_url(cls, value: SecretStr | None) -> SecretStr | None:
        problem = None if value is None else redis_url_problem(value.get_secret_value())
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _load_keys(self) -> EncryptionSettings:
        # Read (and validate) the key material once, when the settings are read: a bad key
        # fails the process at start, not at its first payload.
        keys: dict[str, bytes] = {}
        if self.encryption_keys_file is not None:
            try:
                text = self.encryption_keys_file.read_text()
            except OSError as err:
                raise ValueError(f"MNEMOFLOW_ENCRYPTION_KEYS_FILE: {err.strerror}") from None
            keys = parse_keys(text, "MNEMOFLOW_ENCRYPTION_KEYS_FILE")
        if self.encryption_keys is not None:
            more = parse_keys(self.encryption_keys.get_secret_value(), "MNEMOFLOW_ENCRYPTION_KEYS")
            for kid, key in more.items():
                if keys.get(kid, key) != key:
                    raise ValueError(f"key id {kid!r} has different keys in the file and the env")
            keys |= more
        if self.encryption_active_key is not None and self.encryption_active_key not in keys:
            raise ValueError(
                f"MNEMOFLOW_ENCRYPTION_ACTIVE_KEY={self.encryption_active_key!r} names no "
                f"configured key (configured: {', '.join(keys) or 'none'})"
            )
        self._keys = keys
        return self

    @property
    def enabled(self) -> bool:
        """Whether payloads are encrypted."""
        return bool(self._keys)

    def key_material(self) -> dict[str, bytes]:
        """Key id -> 32-byte key, in the order listed (empty = encryption off)."""
        return dict(self._keys)

    def active_key_id(self, keys: dict[str, bytes]) -> str:
        """The key id new payloads are sealed with: the configured one, else the last listed."""
        return self.encryption_active_key or list(keys)[-1]

    def with_data_keys_store(self, url: str, prefix: str) -> EncryptionSettings:
        """These settings with the data keys in Redis at `url` unless set explicitly (what
        `Settings.load` does with the read model's Redis)."""
        if not self.enabled or not self.user_data_keys:
            return self
        update: dict[str, Any] = {}
        if self.data_keys_url is None:
            update["data_keys_url"] = SecretStr(url)
        if self.data_keys_prefix is None:
            update["data_keys_prefix"] = prefix
        return self.model_copy(update=update) if update else self

    @property
    def data_keys_on(self) -> bool:
        """Whether payloads of users are sealed with per-user data keys."""
        return self.enabled and self.user_data_keys and self.data_keys_url is not None

    def cors_origins(self) -> list[str]:
        """The allowed Web UI origins."""
        return [
            o.strip().rstrip("/") for o in (self.codec_cors_origins or "").split(",") if o.strip()
        ]

    def redacted(self) -> dict[str, Any]:
        """A printable summary: key ids but never key material or the token."""
        keys = self._keys
        return {
            "encryption": "on" if keys else "off",
            "key ids": list(keys),
            "active key": self.active_key_id(keys) if keys else None,
            "codec_token": "set" if self.codec_token is not None else "unset",
            "codec": f"{self.codec_host}:{self.codec_port}",
            "codec_cors_origins": self.cors_origins(),
            "user data keys": "on" if self.data_keys_on else "off",
        }


class TemporalSettings(_MaskedURLs):
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
    encryption: EncryptionSettings = Field(default_factory=EncryptionSettings)
    """Payload encryption of every client and worker; set through the MNEMOFLOW_ENCRYPTION_*
    variables below (this variable only takes their JSON form)."""

    @property
    def uses_tls(self) -> bool:
        """Whether the connection must be encrypted."""
        return self.tls or self.api_key is not None or self.tls_client_cert_path is not None


class MilvusSettings(_MaskedURLs):
    """The fragment store (Milvus Lite server, standalone or distributed: by URI only)."""

    # Errors never echo the input: a URI may carry credentials.
    model_config = SettingsConfigDict(**_config("MILVUS_"), hide_input_in_errors=True)

    uri: str = "http://127.0.0.1:19530"
    """URI of the Milvus server."""
    token: SecretStr | None = None
    """Milvus token ("user:password" or an API key); never logged."""
    collection: str = "mnemoflow_fragments"
    """Collection holding every user's fragments (the user id is the partition key)."""
    flush_rows: int = Field(default=64, ge=0)
    """Rows a worker writes before it flushes the collection (searches over unflushed rows are
    brute force on Milvus Lite; rows are durable either way); 0 = never flush, for standalone
    Milvus."""
    embedding: Literal["use", "hashing"] = "use"
    """Embedder: "use" = the offline multilingual Universal Sentence Encoder (512 dims);
    "hashing" = a deterministic hashing embedder, for tests only."""

    @field_validator("uri")
    @classmethod
    def _milvus_uri(cls, value: str) -> str:
        # pymilvus's own rule, checked at start instead of at the worker's first connection.
        parsed = urlparse(value)
        if parsed.scheme.lower() in _MILVUS_SCHEMES:
            if parsed.scheme.lower() != "unix" and not parsed.hostname:
                raise ValueError("the Milvus URI has no host")
            return value
        if value.endswith(".db"):  # a Milvus Lite file
            return value
        raise ValueError(
            "not a Milvus URI: expected http(s)://host:port (or tcp, grpc, unix) or a Milvus "
            "Lite file ending in .db"
        )


class RedisSettings(_MaskedURLs):
    """The read model the agent's hot path reads (rebuildable from the workflows)."""

    # Errors never echo the input: a URL may carry a password.
    model_config = SettingsConfigDict(**_config("REDIS_"), hide_input_in_errors=True)

    url: str = "redis://127.0.0.1:6379/0"
    """Redis URL (a password in it is masked in every printout)."""
    key_prefix: str = "mnemoflow:"
    """Prefix of every key mnemoflow writes."""

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        problem = redis_url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class DeepSeekSettings(_MaskedURLs):
    """The DeepSeek chat model used by the LLM activities."""

    model_config = _config("DEEPSEEK_")

    api_key: SecretStr | None = None
    """DeepSeek API key; setting it selects DeepSeek when MNEMOFLOW_MODELS=auto."""
    base_url: str = "https://api.deepseek.com"
    """Base URL of the DeepSeek (or a compatible) API."""
    model: str = "deepseek-chat"
    """Chat model name."""
    timeout_s: float = Field(60.0, gt=0, allow_inf_nan=False)
    """Per-request timeout in seconds (Temporal's retry policy does the retrying)."""


class MnemoflowSettings(_MaskedURLs):
    """The process itself: which memory models, where data lives, ports, concurrency."""

    model_config = _config("MNEMOFLOW_")

    models: Literal["auto", "heuristic", "deepseek"] = "auto"
    """Memory models: "auto" = DeepSeek when DEEPSEEK_API_KEY is set, else the offline
    deterministic heuristic models; "heuristic"; "deepseek"."""
    vocation: Vocation = Vocation.CUSTOMER_SERVICE
    """Memory preset new users start with: customer service, collaborative creation,
    accompany. Read by every MemoryClient built from settings (the agent application through
    worker.memory_client, the CLI); it travels in the user workflow's input, so set it where
    users are first seen."""
    data_dir: Path = Path(".run")
    """Directory of the embedded dev stack (SQLite, Redis and Milvus files, stack.json)."""
    health_port: int | None = Field(None, ge=1, le=65535)
    """Port of the HTTP health endpoint for probes (unset = no endpoint)."""
    metrics_port: int | None = Field(None, ge=1, le=65535)
    """Port of the Prometheus /metrics endpoint (unset = no endpoint)."""
    http_host: str = "0.0.0.0"
    """Address the health and metrics endpoints bind to (0.0.0.0 = every interface, as
    Kubernetes probes and scrapes reach the pod IP)."""
    sdk_metrics_port: int | None = Field(None, ge=1, le=65535)
    """Loopback port of the Temporal SDK's own Prometheus exporter, whose page /metrics
    appends (unset = any free port)."""
    connect_retry_s: float = Field(2.0, gt=0, allow_inf_nan=False)
    """Pause between attempts to reach Temporal at start (the worker keeps trying, not ready,
    until it connects or is told to stop)."""
    heuristic_latency_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Simulated latency of each heuristic model call, for tests and demos of slow LLMs."""
    worker_role: Literal["all", "workflow", "llm"] = "all"
    """What `mnemoflow worker` polls: "all" = workflows and every activity; "workflow" = the
    workflows and the Milvus/Redis activities; "llm" = only the LLM activities, on
    TEMPORAL_LLM_TASK_QUEUE (both split roles need that queue set)."""
    llm_activities_per_second: float | None = Field(None, gt=0, allow_inf_nan=False)
    """Rate limit of the LLM activities across every worker of their task queue (enforced by
    Temporal; only applied when they have a queue of their own; unset = no limit)."""
    max_concurrent_activities: int = Field(64, ge=1)
    """Activities one worker runs at once (they are async and I/O bound)."""
    graceful_shutdown_s: float = Field(20.0, gt=0, allow_inf_nan=False)
    """After SIGTERM, how long running activities get to finish before they are cancelled
    (Kubernetes' terminationGracePeriodSeconds must be longer)."""
    deployment_name: str | None = None
    """Worker Versioning: the Temporal worker deployment this worker is a version of (e.g.
    "mnemoflow"); unset = versioning off. Workflows default to auto-upgrade: a user workflow
    is long-lived and continues as new, so pinning would keep old versions running for as
    long as their users do; changes stay replay-safe through `workflow.patched`. A new
    version gets work once it is made current (`temporal worker deployment
    set-current-version`)."""
    build_id: str | None = None
    """Worker Versioning: this worker's build id in MNEMOFLOW_DEPLOYMENT_NAME (the Helm chart
    passes the image tag); required when the deployment name is set."""
    pseudonymous_user_keys: bool | None = None
    """Keep raw user ids out of what operators see: workflow ids and the MnemoflowUser search
    attribute carry hashes (search attributes are not encrypted by the payload codec). Needs
    MNEMOFLOW_USER_KEY_SECRET. Unset = on whenever encryption keys are configured; set it to
    false to keep readable ids (a deployment that already has users keeps their workflow ids
    only that way)."""
    user_key_secret: SecretStr | None = None
    """Secret of the keyed hash (HMAC-SHA256) behind pseudonymous user keys; with it, an
    operator computes a user's search value with `mnemoflow user-key USER`."""

    @model_validator(mode="after")
    def _versioning_complete(self) -> MnemoflowSettings:
        # A deployment name without a build id would make every rollout the same version.
        if self.deployment_name is not None and self.build_id is None:
            raise ValueError("MNEMOFLOW_DEPLOYMENT_NAME needs MNEMOFLOW_BUILD_ID (the image tag)")
        return self

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

    @model_validator(mode="after")
    def _roles_have_their_queue(self) -> Settings:
        # The split roles poll one side of two queues; without a second queue there is no
        # side to pick (worker.app.worker_plans), so refuse at start instead of at polling.
        role = self.mnemoflow.worker_role
        llm, main = self.temporal.llm_task_queue, self.temporal.task_queue
        if role != "all" and (llm is None or llm == main):
            raise ValueError(
                f"MNEMOFLOW_WORKER_ROLE={role} needs TEMPORAL_LLM_TASK_QUEUE set to a queue "
                "other than TEMPORAL_TASK_QUEUE"
            )
        return self

    @classmethod
    def load(cls) -> Settings:
        """Read every concern from the environment (call once, at process start)."""
        temporal, redis = TemporalSettings(), RedisSettings()
        # Per-user data keys live in the read model's Redis unless configured elsewhere.
        encryption = temporal.encryption.with_data_keys_store(redis.url, redis.key_prefix)
        if encryption is not temporal.encryption:
            temporal = temporal.model_copy(update={"encryption": encryption})
        settings = cls(
            temporal=temporal,
            milvus=MilvusSettings(),
            redis=redis,
            deepseek=DeepSeekSettings(),
            mnemoflow=MnemoflowSettings(),
        )
        settings.resolved_models()  # fail at start, not at the first LLM activity
        settings.user_key_secret()
        return settings

    def user_key_secret(self) -> bytes | None:
        """The pseudonymous-key secret when that mode is on (ValueError if it lacks one): the
        rule every MemoryClient follows too (`models.ids.resolve_user_keys`)."""
        m = self.mnemoflow
        secret = m.user_key_secret.get_secret_value() if m.user_key_secret is not None else None
        return resolve_user_keys(
            secret,
            m.pseudonymous_user_keys,
            encrypted=self.temporal.encryption.enabled,
            refuse_unused_secret=False,
        )

    def resolved_models(self) -> ResolvedModels:
        """Which memory models to run, with `auto` decided by the presence of an API key."""
        choice = self.mnemoflow.models
        if choice == "auto":
            return "deepseek" if self.deepseek.api_key is not None else "heuristic"
        if choice == "deepseek" and self.deepseek.api_key is None:
            raise ValueError("MNEMOFLOW_MODELS=deepseek needs DEEPSEEK_API_KEY")
        return choice

    def redacted(self) -> dict[str, dict[str, Any]]:
        """A printable summary: secrets only as "set"/"unset", URL credentials masked."""
        out: dict[str, dict[str, Any]] = {}
        for section in type(self).model_fields:
            values: dict[str, Any] = {}
            for name, value in getattr(self, section):
                if isinstance(value, SecretStr):
                    values[name] = "set"
                elif isinstance(value, EncryptionSettings):
                    values[name] = value.redacted()
                elif value is None and name in _SECRET_FIELDS:
                    values[name] = "unset"
                elif isinstance(value, str):  # StrEnum included: print its plain value
                    values[name] = masked(str(value))
                elif isinstance(value, Path):
                    values[name] = str(value)
                else:
                    values[name] = value
            out[section] = values
        out["mnemoflow"]["models (resolved)"] = self.resolved_models()
        return out


#: Field names whose type is a secret (reported as set/unset even when unset).
_SECRET_FIELDS = frozenset(
    {"api_key", "token", "encryption_keys", "codec_token", "user_key_secret", "data_keys_url"}
)

#: (section attribute, settings class) in documentation order.
SECTIONS: tuple[tuple[str, type[BaseSettings]], ...] = (
    ("temporal", TemporalSettings),
    ("milvus", MilvusSettings),
    ("redis", RedisSettings),
    ("deepseek", DeepSeekSettings),
    ("mnemoflow", MnemoflowSettings),
    ("temporal.encryption", EncryptionSettings),
)
