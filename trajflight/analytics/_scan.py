"""``scan``: one reader over live groups (a data plane) and archived ones (a Parquet dataset).

A :class:`Scan` is a plan, not data: nothing is read until ``to_table``, ``to_batches``,
``to_duckdb`` or ``to_polars``; each of those reads the sources again (a live source is listed again).

What it does not guarantee: a snapshot. Live groups are read chunk by chunk as they are when read
(see :mod:`._live`); a group both archived and still stored (the archive writes before the delete) is
read once, from the data plane, and the archive's copy is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from trajflight.analytics._archive import ArchiveSource
from trajflight.analytics._deps import arrow_table, require
from trajflight.analytics._derived import DERIVED, DERIVED_COLUMNS, add_derived, inputs_of
from trajflight.analytics._live import LiveSource
from trajflight.codec import STANDARD_SCHEMA
from trajflight.errors import InvalidRequestError, SchemaError, brief

__all__ = ["LIVE_SCHEMES", "Scan", "scan"]

Source = str | os.PathLike[str]
#: Address schemes read as a live data plane; anything else is an archive location.
LIVE_SCHEMES = ("grpc://", "grpc+tcp://", "ray://")


@dataclass(frozen=True, slots=True)
class _Plan:
    schema: pa.Schema  # what the scan yields
    stored: pa.Schema  # the sources' stored columns, unified
    compute: tuple[str, ...]  # derived columns to make (output ones and those ``where`` names)
    read: tuple[str, ...] | None  # stored columns to read (None: all)
    live_extra: tuple[str, ...]  # stored columns a post-read ``where`` needs, beyond ``read``
    where_cols: frozenset[str]  # the stored columns ``where`` names
    push_where: bool  # the archive takes ``where`` itself


def _epochs(epochs: int | Sequence[int] | None) -> frozenset[int] | None:
    if epochs is None:
        return None
    if isinstance(epochs, bool | str | bytes):
        raise InvalidRequestError(f"epochs must be an int or a sequence of ints, got {brief(epochs)}")
    if isinstance(epochs, int):
        return frozenset((epochs,))
    if not all(isinstance(e, int) and not isinstance(e, bool) for e in epochs):
        raise InvalidRequestError(f"epochs must be an int or a sequence of ints, got {brief(epochs)}")
    return frozenset(epochs)


def _referenced(where: pc.Expression, schema: pa.Schema) -> set[str]:
    """The top-level columns of ``schema`` that ``where`` names (pyarrow does not list an expression's
    fields: a column is named when the expression no longer binds without it)."""
    try:
        schema.empty_table().filter(where)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise InvalidRequestError(
            f"where {brief(str(where))} does not apply to the scanned columns ({str(exc)[:200]}); it may "
            f"name stored columns and the derived ones ({', '.join(DERIVED_COLUMNS)})"
        ) from exc
    named = set()
    for i, name in enumerate(schema.names):
        try:
            schema.remove(i).empty_table().filter(where)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            named.add(name)
    return named


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


class Scan:
    """Trajectory rows from live and archived sources, projected, with optional derived columns.

    Made by :func:`scan`; read with :meth:`to_table`, :meth:`to_batches`, :meth:`to_duckdb` or
    :meth:`to_polars`. Every read yields the same columns (:attr:`schema`); a column a group or file
    lacks is null there.
    """

    def __init__(
        self,
        live: Sequence[LiveSource],
        archives: Sequence[ArchiveSource],
        *,
        columns: Sequence[str] | None,
        derived: bool | Sequence[str],
        where: pc.Expression | str | None,
    ) -> None:
        if where is not None and not isinstance(where, pc.Expression | str):
            raise InvalidRequestError(
                f"where must be a pyarrow.compute expression (pc.field('reward') > 0) or a SQL string, "
                f"got {type(where).__name__}"
            )
        if columns is not None and (isinstance(columns, str) or len(set(columns)) != len(columns)):
            raise InvalidRequestError(f"columns must be a list of distinct names, got {brief(columns)}")
        self._live = list(live)
        self._archives = list(archives)
        self._columns = None if columns is None else list(columns)
        self._derived = derived
        self._where = where
        self._plan: _Plan | None = None
        self._listed = False

    # ---------------------------------------------------------------------------------------- plan

    def _stored(self) -> pa.Schema:
        schemas = [s.schema() for s in self._live] + [a.schema() for a in self._archives]
        schemas = [s for s in schemas if s.names]
        if not schemas:  # nothing stored or archived yet: the standard columns, so queries still bind
            return STANDARD_SCHEMA.arrow
        try:
            return pa.unify_schemas(schemas, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise SchemaError(
                f"the sources' columns do not agree in type ({str(exc)[:300]}); scan one job at a time "
                "(job=...)"
            ) from exc

    def _derivable(self, stored: pa.Schema) -> list[str]:
        return [d for d in DERIVED_COLUMNS if all(c in stored.names for c in DERIVED[d].inputs)]

    def _make_plan(self) -> _Plan:
        stored = self._stored()
        derivable = self._derivable(stored)
        if self._derived is True:
            extra = derivable
        elif self._derived is False:
            extra = []
        else:
            extra = list(self._derived)
            for name in extra:
                if name not in DERIVED:
                    raise InvalidRequestError(
                        f"no derived column {brief(name)}; the derived columns are "
                        f"{', '.join(DERIVED_COLUMNS)}"
                    )
        names = list(stored.names) if self._columns is None else list(self._columns)
        out: list[tuple[str, bool]] = []  # (name, derived) in the order yielded
        for name in [*names, *(d for d in extra if d not in names)]:
            if name in stored.names and name not in extra:
                out.append((name, False))
            elif name in DERIVED:
                out.append((name, True))
            else:
                raise SchemaError(
                    f"no source has a column {brief(name)}; stored: {brief(', '.join(stored.names))}; "
                    f"derived: {', '.join(DERIVED_COLUMNS)}",
                    column=name[:100],
                )
        out_stored = [n for n, d in out if not d]
        out_derived = [n for n, d in out if d]
        for name in out_derived:
            missing = [c for c in DERIVED[name].inputs if c not in stored.names]
            if missing:
                raise SchemaError(
                    f"derived column {name} needs the stored column {missing[0]}, which no source has",
                    column=name,
                )
        where_stored: set[str] = set()
        where_derived: set[str] = set()
        if isinstance(self._where, pc.Expression):
            full = stored
            for name in derivable:
                if name not in full.names:
                    full = full.append(pa.field(name, DERIVED[name].type))
            named = _referenced(self._where, full)
            where_derived = {n for n in named if n in DERIVED and n not in stored.names}
            where_stored = named - where_derived
        compute = tuple(d for d in DERIVED_COLUMNS if d in out_derived or d in where_derived)
        fields = [pa.field(n, DERIVED[n].type) if d else stored.field(n).with_nullable(True) for n, d in out]
        read: tuple[str, ...] | None = None  # every stored column
        if self._columns is not None:
            read = tuple(dict.fromkeys([*out_stored, *inputs_of(compute)]))
        push = isinstance(self._where, pc.Expression) and not where_derived
        extra_cols = tuple(sorted(where_stored - set(read or ()))) if read is not None else ()
        return _Plan(pa.schema(fields), stored, compute, read, extra_cols, frozenset(where_stored), push)

    def select(self, columns: Sequence[str]) -> Scan:
        """A scan of the same sources and filter that yields ``columns`` (stored or derived) only.

        It shares the sources, so a live source already listed for this scan's :attr:`schema` is not
        listed again for the new scan's first read.

        Raises:
            InvalidRequestError: ``columns`` is not a list of distinct names.
        """
        return Scan(self._live, self._archives, columns=columns, derived=False, where=self._where)

    @property
    def schema(self) -> pa.Schema:
        """The columns every read yields: the projected stored ones, then the derived ones asked for.

        Raises:
            UnavailableError: a live source cannot be reached (it is listed to learn its columns).
            SchemaError: a column named in ``columns`` exists in no source.
        """
        return self.plan().schema

    def plan(self) -> _Plan:
        """The read plan (listing live sources once to learn their columns)."""
        if self._plan is None:
            self._plan = self._make_plan()
        return self._plan

    # ---------------------------------------------------------------------------------------- reads

    def _conform(self, table: pa.Table, plan: _Plan, filter_here: bool, con: Any) -> pa.Table:
        for name in set(plan.read or ()) | set(inputs_of(plan.compute)):
            if name not in table.schema.names:
                table = table.append_column(
                    pa.field(name, plan.stored.field(name).type),
                    pa.nulls(table.num_rows, plan.stored.field(name).type),
                )
        table = add_derived(table, plan.compute)
        if filter_here and isinstance(self._where, pc.Expression):
            table = table.filter(self._where)
        for f in plan.schema:
            if f.name not in table.schema.names:
                table = table.append_column(f, pa.nulls(table.num_rows, f.type))
        table = table.select(plan.schema.names).cast(plan.schema)
        if isinstance(self._where, str) and table.num_rows:
            table = self._sql_filter(con, table)
        return table

    def _sql_filter(self, con: Any, table: pa.Table) -> pa.Table:
        duckdb = require("duckdb")
        try:
            out = arrow_table(con.from_arrow(table).filter(self._where))
        except duckdb.Error as exc:
            raise InvalidRequestError(
                f"DuckDB refused where {brief(self._where)}: {_first_line(exc)}; a SQL where "
                "sees the scan's columns (name the ones it needs in columns)"
            ) from exc
        return out.cast(table.schema)

    def _tables(self) -> Iterator[pa.Table]:
        plan = self.plan()
        if self._listed:
            for source in self._live:
                source.refresh()
        self._listed = True
        con = require("duckdb").connect() if isinstance(self._where, str) else None
        live_read = None if plan.read is None else (*plan.read, *plan.live_extra)
        seen = set()
        for source in self._live:
            for table in source.tables(live_read):
                yield self._conform(table, plan, True, con)
            seen |= source.read_keys
        for archive in self._archives:
            # The Parquet reader takes ``where`` when this archive has every stored column it names.
            push = plan.push_where and plan.where_cols <= set(archive.schema().names)
            where = self._where if push and isinstance(self._where, pc.Expression) else None
            try:
                for table in archive.tables(plan.read if push else live_read, where, seen):
                    yield self._conform(table, plan, not push, con)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise SchemaError(f"reading the archive {brief(archive.location)}: {str(exc)[:300]}") from exc

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        """The rows as record batches of :attr:`schema`, read source by source (live first).

        The batches own their memory (nothing aliases a storage server).
        """
        for table in self._tables():
            yield from table.to_batches()

    def to_reader(self) -> pa.RecordBatchReader:
        """The rows as a ``pyarrow.RecordBatchReader`` (one pass), for tools that stream Arrow."""
        return pa.RecordBatchReader.from_batches(self.schema, self.to_batches())

    def to_table(self) -> pa.Table:
        """Every row as one ``pyarrow.Table`` of :attr:`schema` (owning its memory)."""
        return pa.Table.from_batches(list(self.to_batches()), schema=self.schema)

    def to_duckdb(self, con: Any = None) -> Any:
        """The rows as a DuckDB relation on ``con`` (a ``duckdb.DuckDBPyConnection``; None: a new
        in-memory database), read now (the relation holds a table, not the sources).

        Raises:
            ConfigError: duckdb is not installed.
        """
        duckdb = require("duckdb")
        con = duckdb.connect() if con is None else con
        table = self.to_table()
        return con.from_arrow(table)

    def to_polars(self) -> Any:
        """The rows as a ``polars.LazyFrame``, read now (projection, filter and derived columns applied
        by the scan before Polars sees them).

        Raises:
            ConfigError: polars is not installed.
        """
        polars = require("polars")
        return polars.from_arrow(self.to_table()).lazy()

    def __repr__(self) -> str:
        sources = [s.address for s in self._live] + [a.location for a in self._archives]
        return f"Scan({brief(sources)}, columns={brief(self._columns)}, derived={brief(self._derived)})"


def scan(
    source: Source | Sequence[Source],
    *,
    job: str | None = None,
    epochs: int | Sequence[int] | None = None,
    columns: Sequence[str] | None = None,
    where: pc.Expression | str | None = None,
    derived: bool | Sequence[str] = False,
    filesystem: pafs.FileSystem | None = None,
    timeout: float = 30.0,
) -> Scan:
    """Read trajectory rows from live groups and/or an archive, without taking or touching a lease.

    Args:
        source: A data plane address (``grpc://host:port`` of an embedded data plane, ``ray://ns/name``
            of a Ray one): its live groups, read from every storage server with projection done on the
            server, through tokenless reads that change no lease, token, generation or state; or an
            archive location (a local path or any ``pyarrow.fs`` URI, ``s3://bucket/prefix``): a
            Hive-partitioned Parquet dataset ``job_id=<job>/epoch=<n>/``, read through
            ``pyarrow.dataset``. Or a list of those, read in that order (live ones first); a group both
            live and archived is read once.
        job: Only this job (None: every job).
        epochs: Only this epoch or these epochs (None: all).
        columns: The columns to yield, in order; stored and derived names alike (a derived name is
            computed from its inputs, which are read but not yielded). None: every stored column.
        where: A row filter: a ``pyarrow.compute`` expression (``pc.field("reward") > 0.5``) over stored
            and derived columns, pushed down to the Parquet reader when it names stored columns only
            (live groups are filtered as they arrive: storage servers do not filter), or a SQL boolean
            expression (``"reward > 0.5"``, needs duckdb) over the scan's yielded columns.
        derived: True appends every derived column (:data:`DERIVED_COLUMNS`) whose inputs exist, a list
            appends those named; False (the default) only those ``columns`` names. Each is defined in the
            docstring of :func:`trajflight.analytics.add_derived`.
        filesystem: The ``pyarrow.fs`` filesystem of archive paths (for an S3 ``endpoint_override``);
            None resolves each URI's own.
        timeout: Deadline of each call to the data plane, seconds.

    Returns:
        A :class:`Scan` (nothing is read yet, except that a live source's servers are listed when its
        columns are first needed).

    Raises:
        InvalidRequestError: a bad argument (``where`` of another type, ``epochs`` not ints, duplicate
            columns). NotFoundError: no archive at a location. Later, on read: SchemaError (a column no
            source has), UnavailableError (the data plane cannot be reached).
    """
    if timeout <= 0:
        raise InvalidRequestError(f"timeout must be > 0 seconds, got {brief(timeout)}")
    sources = [source] if isinstance(source, str | os.PathLike) else list(source)
    if not sources:
        raise InvalidRequestError("scan needs a source: a data plane address or an archive location")
    if job is not None and (not isinstance(job, str) or not job):
        raise InvalidRequestError(f"job must be a non-empty string, got {brief(job)}")
    eps = _epochs(epochs)
    live: list[LiveSource] = []
    archives: list[ArchiveSource] = []
    for s in sources:
        if isinstance(s, str) and s.startswith(LIVE_SCHEMES):
            live.append(LiveSource(s, job=job, epochs=eps, timeout=timeout))
        elif isinstance(s, str | os.PathLike):
            archives.append(ArchiveSource(s, job=job, epochs=eps, filesystem=filesystem))
        else:
            raise InvalidRequestError(f"a source is an address or a path, got {type(s).__name__}")
    return Scan(live, archives, columns=columns, derived=derived, where=where)
