"""Settings: environment parsing, model selection, secrets kept out of printouts, README table."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from mnemoflow.models.config import Vocation
from mnemoflow.worker import settings_doc
from mnemoflow.worker.client import tls_config
from mnemoflow.worker.redact import mask_url
from mnemoflow.worker.settings import SECTIONS, Settings, TemporalSettings

PREFIXES = ("TEMPORAL_", "MILVUS_", "REDIS_", "DEEPSEEK_", "MNEMOFLOW_")
README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from an environment without any mnemoflow variable."""
    for name in list(os.environ):
        if name.startswith(PREFIXES):
            monkeypatch.delenv(name)


def test_defaults() -> None:
    s = Settings.load()
    assert s.temporal.address == "127.0.0.1:7233"
    assert s.temporal.namespace == "default"
    assert s.temporal.task_queue == "mnemoflow"
    assert s.temporal.llm_task_queue is None
    assert s.redis.key_prefix == "mnemoflow:"
    assert s.deepseek.model == "deepseek-chat"
    assert s.mnemoflow.data_dir == Path(".run")
    assert s.mnemoflow.vocation is Vocation.CUSTOMER_SERVICE
    assert s.resolved_models() == "heuristic"
    assert tls_config(s.temporal) is False


def test_environment_is_read_at_load_not_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPORAL_ADDRESS", "temporal.example:7233")
    monkeypatch.setenv("TEMPORAL_LLM_TASK_QUEUE", "mnemoflow-llm")
    monkeypatch.setenv("TEMPORAL_TLS", "true")
    monkeypatch.setenv("MILVUS_EMBEDDING", "hashing")
    monkeypatch.setenv("REDIS_KEY_PREFIX", "mf:")
    monkeypatch.setenv("DEEPSEEK_TIMEOUT_S", "12.5")
    monkeypatch.setenv("MNEMOFLOW_MAX_CONCURRENT_ACTIVITIES", "8")
    monkeypatch.setenv("MNEMOFLOW_VOCATION", "collaborative_creation")
    monkeypatch.setenv("MNEMOFLOW_PSEUDONYMOUS_USER_KEYS", "1")
    monkeypatch.setenv("MNEMOFLOW_USER_KEY_SECRET", "k")
    monkeypatch.setenv("MNEMOFLOW_HEALTH_PORT", "8081")
    s = Settings.load()
    assert s.temporal.address == "temporal.example:7233"
    assert s.temporal.llm_task_queue == "mnemoflow-llm"
    assert s.temporal.uses_tls
    assert s.milvus.embedding == "hashing"
    assert s.redis.key_prefix == "mf:"
    assert s.deepseek.timeout_s == 12.5
    assert s.mnemoflow.max_concurrent_activities == 8
    assert s.mnemoflow.vocation is Vocation.COLLABORATIVE_CREATION
    assert s.mnemoflow.pseudonymous_user_keys is True
    assert s.mnemoflow.health_port == 8081


def test_empty_variable_means_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPORAL_LLM_TASK_QUEUE", "")
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "")
    s = Settings.load()
    assert s.temporal.llm_task_queue is None
    assert s.temporal.namespace == "default"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MILVUS_EMBEDDING", "word2vec"),
        ("MNEMOFLOW_MODELS", "gpt"),
        ("MNEMOFLOW_VOCATION", "pirate"),
        ("MNEMOFLOW_MAX_CONCURRENT_ACTIVITIES", "many"),
    ],
)
def test_invalid_values_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        Settings.load()


def test_auto_models_follow_the_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.load().resolved_models() == "heuristic"
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-test")
    assert Settings.load().resolved_models() == "deepseek"
    monkeypatch.setenv("MNEMOFLOW_MODELS", "heuristic")
    assert Settings.load().resolved_models() == "heuristic"


def test_deepseek_without_key_fails_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNEMOFLOW_MODELS", "deepseek")
    with pytest.raises(ValueError, match="DEEPSEEK_API_KEY"):
        Settings.load()


def test_secrets_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {
        "TEMPORAL_API_KEY": "temporal-secret-123",
        "MILVUS_TOKEN": "root:milvus-secret-456",
        "DEEPSEEK_API_KEY": "sk-deepseek-secret-789",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("REDIS_URL", "redis://default:redis-secret-000@cache.example:6380/1")
    monkeypatch.setenv("MILVUS_URI", "https://user:milvus-uri-secret@milvus.example:443")
    s = Settings.load()
    printouts = [
        repr(s),
        str(s),
        repr(s.redis),
        repr(s.milvus),
        json.dumps(s.redacted(), default=str),
        s.model_dump_json(),
    ]
    for text in printouts:
        for secret in [*secrets.values(), "redis-secret-000", "milvus-uri-secret"]:
            assert secret not in text
    summary = s.redacted()
    assert summary["temporal"]["api_key"] == "set"
    assert summary["redis"]["url"] == "redis://default:***@cache.example:6380/1"
    # ...while the values themselves stay usable.
    assert s.redis.url.endswith("@cache.example:6380/1")
    assert s.deepseek.api_key is not None
    assert s.deepseek.api_key.get_secret_value() == secrets["DEEPSEEK_API_KEY"]


def test_unset_secrets_are_reported_as_unset() -> None:
    summary = Settings.load().redacted()
    assert summary["deepseek"]["api_key"] == "unset"
    assert summary["milvus"]["token"] == "unset"


def test_mask_url_leaves_plain_urls_alone() -> None:
    assert mask_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert mask_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"


def test_mask_url_masks_credential_query_parameters_and_keeps_the_rest() -> None:
    url = "redis://u:p@ss@h:1/0?db=2&password=x&Access_Token=y;api_key=z&sig=s&timeout=5"
    expected = (
        "redis://u:***@h:1/0?db=2&password=***&Access_Token=***;api_key=***&sig=***&timeout=5"
    )
    assert mask_url(url) == expected


def test_api_key_implies_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPORAL_API_KEY", "k")
    temporal = TemporalSettings()
    assert temporal.uses_tls
    assert tls_config(temporal) is not False


def test_every_field_is_documented() -> None:
    for _, cls in SECTIONS:
        for name, info in cls.model_fields.items():
            assert info.description, f"{cls.__name__}.{name} has no docstring"


def test_readme_table_in_sync() -> None:
    readme = README.read_text()
    assert readme == settings_doc.render(readme), "run `make docs` to regenerate the table"
    for _, cls in SECTIONS:
        prefix = str(cls.model_config.get("env_prefix"))
        for name in cls.model_fields:
            assert f"`{prefix}{name.upper()}`" in readme


def test_pseudonymous_keys_need_their_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNEMOFLOW_PSEUDONYMOUS_USER_KEYS", "1")
    with pytest.raises(ValueError, match="MNEMOFLOW_USER_KEY_SECRET"):
        Settings.load()
    monkeypatch.setenv("MNEMOFLOW_USER_KEY_SECRET", "operator-secret")
    assert Settings.load().user_key_secret() == b"operator-secret"
    assert "operator-secret" not in str(Settings.load().redacted())


async def test_a_worker_closes_the_models_it_built_and_only_those(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mnemoflow.activities.embeddings import HashingEmbeddings
    from mnemoflow.activities.llm.deepseek import close_chat_model, deepseek_chat_model
    from mnemoflow.activities.llm.langchain_models import LangChainMemoryModels
    from mnemoflow.devstack.processes import free_port
    from mnemoflow.worker.app import Components, resolve

    base_url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("DEEPSEEK_API_KEY", "test-key")
    monkeypatch.setenv("DEEPSEEK_BASE_URL", base_url)
    settings = Settings.load()
    # Stores handed in (and so not closed): only the models' ownership is exercised.
    given = Components(embeddings=HashingEmbeddings(), store=object(), read_model=object())
    built_res = resolve(settings, given)
    built = built_res.models
    assert isinstance(built, LangChainMemoryModels)
    mine = LangChainMemoryModels(deepseek_chat_model("test-key", base_url=base_url))
    mine_res = resolve(settings, replace(given, models=mine))
    assert built_res.owned == [built] and mine_res.owned == []
    for res in (built_res, mine_res):
        await res.aclose()
    chat = built.chat_model
    assert chat.http_async_client.is_closed and chat.http_client.is_closed
    assert not mine.chat_model.http_async_client.is_closed, "models passed in are the caller's"
    await close_chat_model(mine.chat_model)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        # A worker whose LLM activities never run (a queue-wide rate of 0 or less).
        ("MNEMOFLOW_LLM_ACTIVITIES_PER_SECOND", "0"),
        ("MNEMOFLOW_LLM_ACTIVITIES_PER_SECOND", "-1"),
        ("MNEMOFLOW_LLM_ACTIVITIES_PER_SECOND", "nan"),
        # A tight reconnect loop (25,789 attempts in 6 s with 0).
        ("MNEMOFLOW_CONNECT_RETRY_S", "0"),
        ("MNEMOFLOW_CONNECT_RETRY_S", "-2"),
        ("MNEMOFLOW_CONNECT_RETRY_S", "inf"),
        # 0 silently became the SDK's 100; negatives ended in a raw TypeError.
        ("MNEMOFLOW_MAX_CONCURRENT_ACTIVITIES", "0"),
        ("MNEMOFLOW_MAX_CONCURRENT_ACTIVITIES", "-4"),
        ("DEEPSEEK_TIMEOUT_S", "-5"),
        ("DEEPSEEK_TIMEOUT_S", "0"),
        ("DEEPSEEK_TIMEOUT_S", "nan"),
        ("MNEMOFLOW_HEURISTIC_LATENCY_S", "-3"),
        ("MNEMOFLOW_HEURISTIC_LATENCY_S", "inf"),
        ("MNEMOFLOW_GRACEFUL_SHUTDOWN_S", "inf"),
        ("MNEMOFLOW_DATA_KEYS_CACHE_S", "inf"),
        ("MNEMOFLOW_HEALTH_PORT", "99999"),
        ("MNEMOFLOW_HEALTH_PORT", "-1"),
        ("MNEMOFLOW_HEALTH_PORT", "0"),
        ("MNEMOFLOW_METRICS_PORT", "65536"),
        ("MNEMOFLOW_SDK_METRICS_PORT", "-1"),
        ("MNEMOFLOW_CODEC_PORT", "70000"),
        ("REDIS_URL", "notaurl"),
        ("REDIS_URL", "http://cache.example:6379"),
        ("REDIS_URL", "redis://"),
        ("MILVUS_URI", "notauri"),
        ("MILVUS_URI", "http://"),
        ("MNEMOFLOW_WORKER_ROLE", "llm"),
        ("MNEMOFLOW_WORKER_ROLE", "workflow"),
    ],
)
def test_unusable_values_are_refused_at_load(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """Probe 9, F6: each of these started a worker that misbehaved, or failed later with a
    traceback; now `Settings.load` refuses them, naming the variable."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as err:
        Settings.load()
    from mnemoflow.ops.cli import config_problems

    problems = config_problems(err.value)
    assert len(problems) == 1 and name in problems[0], problems


def test_split_roles_with_their_queue_and_usable_values_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The refusals above stop at the boundary: the smallest usable values still load."""
    for name, value in {
        "MNEMOFLOW_WORKER_ROLE": "llm",
        "TEMPORAL_LLM_TASK_QUEUE": "mnemoflow-llm",
        "MNEMOFLOW_LLM_ACTIVITIES_PER_SECOND": "0.5",
        "MNEMOFLOW_CONNECT_RETRY_S": "0.05",
        "MNEMOFLOW_MAX_CONCURRENT_ACTIVITIES": "1",
        "MNEMOFLOW_HEURISTIC_LATENCY_S": "0",
        "MNEMOFLOW_HEALTH_PORT": "65535",
        "MNEMOFLOW_METRICS_PORT": "1",
        "REDIS_URL": "unix:///run/redis.sock",
        "MILVUS_URI": "./fragments.db",
    }.items():
        monkeypatch.setenv(name, value)
    s = Settings.load()
    assert s.mnemoflow.worker_role == "llm" and s.mnemoflow.llm_activities_per_second == 0.5
    assert s.mnemoflow.max_concurrent_activities == 1 and s.mnemoflow.health_port == 65535
    monkeypatch.setenv("REDIS_URL", "rediss://:pw@cache.example:6380/1")
    monkeypatch.setenv("MILVUS_URI", "https://user:pw@milvus.example:443")
    assert Settings.load().redis.url.startswith("rediss://")


def test_a_refused_url_is_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The error names the variable, not the value: a URL may carry a password."""
    monkeypatch.setenv("REDIS_URL", "http://default:redis-secret-111@cache.example:6379")
    monkeypatch.setenv("MILVUS_URI", "ftp://root:milvus-secret-222@milvus.example")
    with pytest.raises(ValidationError) as err:
        Settings.load()
    assert "redis-secret-111" not in str(err.value)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    with pytest.raises(ValidationError) as err:
        Settings.load()
    assert "milvus-secret-222" not in str(err.value)
