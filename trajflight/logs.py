"""One logging setup for every entry point, and the context fields log lines carry.

Every command (``trajflight server``, ``up``, ``demo``, ``bench``), the control server and the Ray actors'
constructors call :func:`setup_logging` (or :func:`setup_from_args` with the options
:func:`add_arguments` registers: ``--log-level``, ``--log-json``). Log calls that concern a job, a group or
a lease pass :func:`context` as ``extra=``: the text format appends ``job=... partition=... token=...``,
the JSON format (one object per line) has them as fields ``job``, ``partition``, ``token``.

Standard library only (a base module). It logs no request headers and no credentials: callers pass only
the fields :func:`context` takes, and the formatters print only those (plus the message).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import IO, Any

from trajflight.errors import ConfigError

__all__ = [
    "CONTEXT_FIELDS",
    "JsonFormatter",
    "TextFormatter",
    "add_arguments",
    "context",
    "env_for",
    "setup_from_args",
    "setup_from_env",
    "setup_logging",
]

CONTEXT_FIELDS = ("job", "epoch", "partition", "token", "server")
"""The context a log line may name, in the order it is printed (see :func:`context`)."""

_HANDLER_NAME = "trajflight"


def context(
    *,
    job: str | None = None,
    epoch: int | None = None,
    partition: Any = None,
    token: int | None = None,
    server: str | None = None,
) -> dict[str, Any]:
    """The ``extra=`` mapping of a log call about a job, a group, a lease or a server.

    ``partition`` is anything with ``job_id``, ``epoch`` and ``group_id`` (a ``Partition``) or a
    ``(job_id, epoch, group_id)`` tuple; it is printed ``job/epoch/group`` and fills ``job`` and
    ``epoch`` when they are not given. Fields left ``None`` are omitted from the line.
    """
    out: dict[str, Any] = {}
    if partition is not None:
        if hasattr(partition, "group_id"):
            parts = (partition.job_id, partition.epoch, partition.group_id)
        else:
            parts = tuple(partition)
        out["partition"] = "/".join(str(p) for p in parts)
        if job is None and len(parts) == 3:
            job, epoch = str(parts[0]), epoch if epoch is not None else parts[1]
    for name, value in (("job", job), ("epoch", epoch), ("token", token), ("server", server)):
        if value is not None:
            out[name] = value
    return out


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in CONTEXT_FIELDS if getattr(record, name, None) is not None}


class TextFormatter(logging.Formatter):
    """Text lines: ``2026-12-02 07:30:00,123 INFO trajflight.controller lease 7 ... [job=j token=7]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """The line, with the record's context fields appended in brackets."""
        line = super().format(record)
        fields = _fields(record)
        if not fields:
            return line
        suffix = " ".join(f"{k}={v}" for k, v in fields.items())
        head, nl, tail = line.partition("\n")  # a traceback stays below the first line
        return f"{head} [{suffix}]{nl}{tail}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, the context
    fields present (``job``, ``epoch``, ``partition``, ``token``, ``server``) and ``exc`` (a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (values that are not JSON types are written as their ``str``)."""
        out: dict[str, Any] = {
            "ts": _dt.datetime.fromtimestamp(record.created, _dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, default=str)


def _level(level: str | int) -> int:
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    value = logging.getLevelName(str(level).upper())
    if not isinstance(value, int):
        raise ConfigError(
            f"unknown log level {str(level)[:40]!r}; use DEBUG, INFO, WARNING, ERROR or CRITICAL",
            setting="log_level",
        )
    return value


def setup_logging(
    level: str | int = "WARNING", *, json_lines: bool = False, stream: IO[str] | None = None
) -> None:
    """Send log records of ``level`` and above to ``stream`` (stderr), as text or as JSON lines.

    Idempotent: a second call replaces the handler the first installed (on the root logger), and
    leaves other handlers alone.

    Raises:
        ConfigError: ``level`` is not a logging level name or number.
    """
    value = _level(level)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler.get_name() == _HANDLER_NAME:
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root.addHandler(handler)
    root.setLevel(value)


def add_arguments(parser: argparse.ArgumentParser, *, default: str = "WARNING") -> None:
    """Register ``--log-level`` and ``--log-json`` on a command's parser."""
    parser.add_argument(
        "--log-level", default=default, help=f"Python logging level for stderr (default {default})"
    )
    parser.add_argument(
        "--log-json", action="store_true", help="log one JSON object per line (job, partition, token fields)"
    )


LEVEL_ENV = "TRAJFLIGHT_LOG_LEVEL"
JSON_ENV = "TRAJFLIGHT_LOG_JSON"


def env_for(level: str | int | None, json_lines: bool = False) -> dict[str, str]:
    """The environment that makes :func:`setup_from_env` in another process (a Ray actor) set this
    logging up; empty when ``level`` is None.

    Raises:
        ConfigError: ``level`` is not a logging level.
    """
    if level is None:
        return {}
    return {LEVEL_ENV: logging.getLevelName(_level(level)), JSON_ENV: "1" if json_lines else "0"}


def setup_from_env() -> None:
    """:func:`setup_logging` from ``TRAJFLIGHT_LOG_LEVEL`` and ``TRAJFLIGHT_LOG_JSON`` (``1``: JSON
    lines), what :func:`env_for` sets for a process started elsewhere; nothing when the level is unset.

    Raises:
        ConfigError: an unknown level.
    """
    level = os.environ.get(LEVEL_ENV)
    if level:
        setup_logging(level, json_lines=os.environ.get(JSON_ENV, "0") == "1")


def setup_from_args(args: argparse.Namespace | Mapping[str, Any]) -> None:
    """:func:`setup_logging` from the options of :func:`add_arguments`.

    Raises:
        ConfigError: an unknown ``--log-level``.
    """
    values = args if isinstance(args, Mapping) else vars(args)
    setup_logging(values.get("log_level", "WARNING"), json_lines=bool(values.get("log_json", False)))
