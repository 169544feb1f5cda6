"""The optional dependencies of analytics, imported when first used, with an install hint."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pyarrow as pa

from trajflight.errors import ConfigError

__all__ = ["HINT", "arrow_table", "require"]

HINT = "pip install 'trajflight[analytics]'"


def require(name: str) -> ModuleType:
    """Import ``name`` (``duckdb`` or ``polars``) or raise a :class:`ConfigError` that says how to get it.

    Raises:
        ConfigError: the module is not installed (``setting`` is the module's name).
    """
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ConfigError(f"{name} is not installed: {HINT} brings duckdb and polars", setting=name) from exc


def arrow_table(relation: Any) -> pa.Table:
    """A DuckDB relation's result as a ``pyarrow.Table``, across DuckDB versions (``to_arrow_table``
    since 1.4, whose ``fetch_arrow_table`` warns it is deprecated; ``arrow()`` gave a table before)."""
    fetch = getattr(relation, "to_arrow_table", None)
    table = fetch() if fetch is not None else relation.arrow()
    return table if isinstance(table, pa.Table) else table.read_all()
