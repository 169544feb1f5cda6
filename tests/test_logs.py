"""The one logging setup (trajflight.logs): JSON and text lines carry job, partition and lease token."""

from __future__ import annotations

import io
import json
import logging

import pytest

from trajflight import logs
from trajflight.errors import ConfigError
from trajflight.keys import Partition


@pytest.fixture
def restore_root_logging():
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def _record(message: str = "lease 7 expired", **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("trajflight.controller", logging.INFO, __file__, 1, message, (), None)
    for name, value in extra.items():
        setattr(record, name, value)
    return record


def test_context_names_the_partition_and_fills_job_and_epoch_from_it():
    ctx = logs.context(partition=Partition("grpo", 3, 17), token=42)
    assert ctx == {"partition": "grpo/3/17", "job": "grpo", "epoch": 3, "token": 42}
    assert logs.context(partition=("j", 1, 2)) == {"partition": "j/1/2", "job": "j", "epoch": 1}
    assert logs.context(job="j") == {"job": "j"}  # fields left None are omitted
    assert logs.context() == {}


def test_a_json_line_has_the_message_and_the_context_fields():
    record = _record(**logs.context(partition=Partition("grpo", 3, 17), token=42))
    line = logs.JsonFormatter().format(record)
    body = json.loads(line)
    assert body["message"] == "lease 7 expired"
    assert body["level"] == "INFO"
    assert body["logger"] == "trajflight.controller"
    assert (body["job"], body["epoch"], body["partition"], body["token"]) == ("grpo", 3, "grpo/3/17", 42)
    assert body["ts"].endswith("+00:00")  # UTC
    assert "\n" not in line


def test_a_json_line_without_context_has_no_context_fields_and_keeps_tracebacks():
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    body = json.loads(logs.JsonFormatter().format(record))
    assert not set(logs.CONTEXT_FIELDS) & set(body)
    assert "ValueError: boom" in body["exc"]


def test_a_text_line_ends_with_the_context_in_brackets():
    line = logs.TextFormatter().format(_record(**logs.context(job="j", token=9)))
    assert line.endswith("INFO trajflight.controller lease 7 expired [job=j token=9]")
    assert "[" not in logs.TextFormatter().format(_record())


def test_setup_logging_replaces_its_own_handler_and_refuses_unknown_levels(restore_root_logging):
    out = io.StringIO()
    logs.setup_logging("info", json_lines=True, stream=out)
    logs.setup_logging("INFO", json_lines=True, stream=out)  # idempotent: one handler, one line per record
    logging.getLogger("trajflight.test").info("hello", extra=logs.context(job="j"))
    lines = out.getvalue().splitlines()
    assert [json.loads(line)["job"] for line in lines] == ["j"]
    with pytest.raises(ConfigError, match="unknown log level"):
        logs.setup_logging("chatty")


def test_setup_from_env_uses_what_env_for_sets(monkeypatch, restore_root_logging):
    env = logs.env_for("debug", json_lines=True)
    assert env == {logs.LEVEL_ENV: "DEBUG", logs.JSON_ENV: "1"}
    assert logs.env_for(None) == {}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    logs.setup_from_env()
    assert logging.getLogger().level == logging.DEBUG
    handler = next(h for h in logging.getLogger().handlers if h.get_name() == "trajflight")
    assert isinstance(handler.formatter, logs.JsonFormatter)


def test_ray_cluster_checks_its_log_level_early_and_hands_it_to_its_actors():
    from trajflight._ray_plane import RayCluster

    with pytest.raises(ConfigError, match="unknown log level"):
        RayCluster(servers=1, log_level="chatty")
    plane = RayCluster(servers=1, log_level="info", log_json=True)  # not started: no Ray needed
    assert plane._runtime_env() == {"runtime_env": {"env_vars": {logs.LEVEL_ENV: "INFO", logs.JSON_ENV: "1"}}}
    assert RayCluster(servers=1)._runtime_env() == {}  # by default the actors log as Ray sets them up
