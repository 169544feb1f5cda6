"""Reading an archive of trained groups: a Hive-partitioned Parquet dataset, through ``pyarrow.dataset``.

The layout (what the archive writer produces and this reader expects): under the archive's root,
``job_id=<job>/epoch=<n>/<file>.parquet``, each file many groups' rows with every column of the groups
(nested ``top_p_*`` included) plus the lease facts the writer adds. The files may keep the ``job_id``
and ``epoch`` columns or leave them to the path; either way they read as ``job_id: string`` and
``epoch: int64``. Files whose names start with ``.`` or ``_`` (a writer's temporary names) are not
read, as ``pyarrow.dataset`` ignores them by default.

``job`` and ``epochs`` prune partitions (directories that do not match are never opened); the projection
and a ``where`` expression over stored columns go down to the Parquet reader (row groups skipped on
their statistics).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from trajflight.errors import ConfigError, NotFoundError, brief
from trajflight.keys import Partition

__all__ = ["PARTITIONING", "ArchiveSource"]

#: The archive's partitioning: ``job_id=<job>/epoch=<n>/`` with these types.
PARTITIONING = ds.partitioning(pa.schema([("job_id", pa.string()), ("epoch", pa.int64())]), flavor="hive")


class ArchiveSource:
    """An archive at a local path or any ``pyarrow.fs`` URI (``s3://``, ``gs://``, ``hdfs://``, ``file://``).

    Args:
        location: The archive's root.
        job: Only this job's partition (None: every job).
        epochs: Only these epochs (None: every epoch).
        filesystem: The filesystem ``location`` is a path on (for example an ``S3FileSystem`` with an
            ``endpoint_override``); None resolves it from the URI.

    Raises:
        NotFoundError: nothing exists at ``location``. ConfigError: the URI's filesystem is unknown or
        the files are not Parquet.
    """

    def __init__(
        self,
        location: str | os.PathLike[str],
        *,
        job: str | None,
        epochs: frozenset[int] | None,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        self.location = os.fspath(location)
        self.job = job
        self.epochs = epochs
        try:
            self.dataset = ds.dataset(
                self.location, format="parquet", partitioning=PARTITIONING, filesystem=filesystem
            )
        except FileNotFoundError as exc:
            raise NotFoundError(
                f"no archive at {brief(self.location)}: give the directory (or URI) a job archives to"
            ) from exc
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
            raise ConfigError(
                f"cannot open the archive at {brief(self.location)} as a Parquet dataset: {str(exc)[:200]}",
                setting="source",
            ) from exc

    def _partitions(self) -> ds.Expression | None:
        names = self.dataset.schema.names
        if "job_id" not in names:  # an empty archive: no file, no partition field
            return None
        expr: ds.Expression | None = None
        if self.job is not None:
            expr = ds.field("job_id") == self.job
        if self.epochs is not None:
            ep = ds.field("epoch").isin(sorted(self.epochs))
            expr = ep if expr is None else expr & ep
        return expr

    def schema(self) -> pa.Schema:
        """The archive's columns (every file's, unified), the partition fields included; no columns
        while the archive holds no file."""
        if not self.dataset.files:
            return pa.schema([])
        return self.dataset.schema.remove_metadata()

    def _filter(self, where: ds.Expression | None, exclude: set[Partition] | None) -> Any:
        expr = self._partitions()
        if where is not None:
            expr = where if expr is None else expr & where
        for job_id, epoch, ids in _by_job_epoch(exclude or set()):
            skip = ~(
                (ds.field("job_id") == job_id) & (ds.field("epoch") == epoch) & ds.field("group_id").isin(ids)
            )
            expr = skip if expr is None else expr & skip
        return expr

    def tables(
        self,
        columns: Sequence[str] | None,
        where: ds.Expression | None = None,
        exclude: set[Partition] | None = None,
    ) -> Iterator[pa.Table]:
        """The archived rows, projected to ``columns`` (None: all), filtered by ``where`` (an expression
        over stored columns) and the source's job and epochs, without the groups ``exclude`` names (read
        live by the same scan); one table per batch the Parquet scan yields.

        Raises:
            SchemaError-like ``pyarrow`` errors are left to the caller, which names the column.
        """
        if not self.dataset.files:
            return
        names = self.dataset.schema.names
        read = None if columns is None else [c for c in columns if c in names]
        if read == []:
            read = ["group_id"]  # only the row count is needed
        scanner = self.dataset.scanner(columns=read, filter=self._filter(where, exclude))
        for batch in scanner.to_batches():
            if batch.num_rows:
                yield pa.Table.from_batches([batch])


def _by_job_epoch(keys: set[Partition]) -> list[tuple[str, int, list[int]]]:
    groups: dict[tuple[str, int], list[int]] = {}
    for key in keys:
        groups.setdefault((key.job_id, key.epoch), []).append(key.group_id)
    return [(job, epoch, sorted(ids)) for (job, epoch), ids in sorted(groups.items())]
