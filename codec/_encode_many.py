"""``encode_groups`` and :class:`EncodedGroups`: many groups of one job and epoch as one joined batch.

A writer that puts a batch of groups stores them in one shared-memory segment as one record batch.
Encoding them one by one pays encode_group's fixed cost per group, and joining the batches one more copy;
:func:`encode_groups` builds the joined batch directly, with one copy of the payload (BENCHMARKS.md,
"The codec", has what the merged tier saves).

Two tiers, as in :mod:`trajflight.codec._arrays`:

* the merged tier (:mod:`trajflight.codec._encode_merged`) takes the common form (numpy arrays as
  ``SyntheticGroup.columns()`` gives them), merges the groups into one pseudo-group and runs
  :func:`encode_group` once on it; it never refuses, it steps aside;
* the precise tier runs :func:`encode_group` per group, which raises the group's own error (named here
  with the group), compares the groups' Arrow schemas, and joins the batches with one copy
  (``pyarrow.concat_batches``).

Sizes per group come from :mod:`trajflight.codec._nbytes`.

Memory: unlike :func:`encode_group`, the result does not alias the caller's arrays: the joined batch's
buffers are copies (one per payload byte), owned by the result; only a dictionary column's dictionary
(``finish_reason`` given as a pyarrow dictionary array) may be shared with one that every group used.
CUDA tensors go through :func:`encode_group`'s staging (the precise tier).

It does not guarantee that a dictionary column's slice equals the group's own batch buffer for buffer:
joining unifies the groups' dictionaries, so a slice holds the same values under the union dictionary.
Nor does it check group ids against other calls: it refuses an id given twice in one call only.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import pyarrow as pa

from trajflight.codec._encode import _check_key, encode_group
from trajflight.codec._encode_merged import merged
from trajflight.codec._nbytes import group_nbytes
from trajflight.codec._schema import STANDARD_SCHEMA, TrajectorySchema
from trajflight.errors import InvalidRequestError, SchemaError, TrajflightError

__all__ = ["EncodedGroups", "encode_groups"]

_INT64_MAX = int(np.iinfo(np.int64).max)
# What a group's mapping may hold: encode_group's keyword arguments but those given to encode_groups.
_CALL_ARGUMENTS = ("job_id", "epoch", "schema")
_GROUP_ARGUMENTS = frozenset(inspect.signature(encode_group).parameters) - frozenset(_CALL_ARGUMENTS)
_REQUIRED = ("group_id", "prompt_ids", "response_ids", "response_logprobs", "reward")
_REQUIRED_SET = frozenset(_REQUIRED)


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class EncodedGroups(Sequence[pa.RecordBatch]):
    """Groups encoded together: one joined record batch, and each group as a zero-copy slice of it.

    A read-only sequence of the groups' record batches, in input order: ``result[i]`` is
    ``joined.slice(start_i, rows[i])`` (built on first use, then kept), ``result[a:b]`` a list of them.

    Attributes:
        joined: Every group's rows in order, in one record batch (each column one contiguous array). Its
            buffers are owned by this result (copies, not aliases, of the inputs); the slices alias them.
        rows: Samples per group.
        nbytes: Per group, the bytes its rows occupy in ``joined``'s buffers, as storage capacity counts
            them: per column, the validity bytes its rows cover, its fixed-width values, ``rows + 1``
            offsets of every list/string level and the child entries those offsets span (a dictionary
            column counts its whole dictionary for every group). Counted per column (a buffer two columns
            share counts for each, as IPC writes each column its own) and with one offset more per level
            than Arrow's ``RecordBatch.nbytes`` of the slice (which leaves the last offset out), so never
            smaller than what a copy of the group's rows alone holds.
    """

    joined: pa.RecordBatch
    rows: tuple[int, ...]
    nbytes: tuple[int, ...]
    _batches: tuple[pa.RecordBatch, ...] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if len(self.nbytes) != len(self.rows) or sum(self.rows) != self.joined.num_rows:
            raise InvalidRequestError(
                f"EncodedGroups: {len(self.rows)} row counts summing to {sum(self.rows)} and "
                f"{len(self.nbytes)} sizes do not describe a joined batch of {self.joined.num_rows} rows; "
                "build it with encode_groups"
            )

    def _slices(self) -> tuple[pa.RecordBatch, ...]:
        """The groups' slices of ``joined``, built on first use and kept."""
        batches = self._batches
        if batches is None:
            starts = np.zeros(len(self.rows), dtype=np.int64)
            np.cumsum(self.rows[:-1], out=starts[1:])
            batches = tuple(map(self.joined.slice, starts.tolist(), self.rows))
            object.__setattr__(self, "_batches", batches)  # racing threads build equal tuples
        return batches

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> pa.RecordBatch: ...

    @overload
    def __getitem__(self, index: slice) -> list[pa.RecordBatch]: ...

    def __getitem__(self, index: int | slice) -> pa.RecordBatch | list[pa.RecordBatch]:
        if isinstance(index, slice):
            return list(self._slices()[index])
        return self._slices()[index]

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return iter(self._slices())

    def __repr__(self) -> str:
        return (
            f"EncodedGroups({len(self.rows)} groups, {self.joined.num_rows} rows, {sum(self.nbytes)} bytes, "
            f"{self.joined.num_columns} columns)"
        )


def encode_groups(
    *,
    job_id: str,
    epoch: int,
    groups: Sequence[Mapping[str, Any]],
    schema: TrajectorySchema = STANDARD_SCHEMA,
) -> EncodedGroups:
    """Encode several groups of one job and epoch into one joined record batch.

    ``encode_groups(job_id=j, epoch=e, groups=gs)[i]`` equals ``encode_group(job_id=j, epoch=e, **gs[i])``
    (same rows, same Arrow schema) for every input :func:`encode_group` accepts; a dictionary column
    (``finish_reason``) holds the same values under the union of the groups' dictionaries. Every input
    it refuses is refused here with the same exception type and a message naming the group.

    Memory: ``joined``'s buffers are copies (one per payload byte), owned by the result; unlike
    :func:`encode_group`, nothing aliases the inputs (but a dictionary all groups shared), so the caller
    may reuse its buffers as soon as this returns.

    Args:
        job_id: The training run, for every group.
        epoch: The job's incarnation, for every group.
        groups: One mapping per group: ``group_id`` plus :func:`encode_group`'s column keyword arguments
            (``prompt_ids``, ``response_ids``, ..., ``extra``). All groups must come out with one Arrow
            schema (all with or all without ``advantage``, top-p columns, the same user columns, ...).
            Group ids must differ (the same id twice in one call is a caller's bug).
        schema: The job's schema.

    Returns:
        The :class:`EncodedGroups`: the joined batch, the groups as slices of it, rows and bytes per group.

    Raises:
        InvalidRequestError: ``groups`` is not a non-empty sequence of mappings.
        SchemaError: ``job_id``, ``epoch`` or ``schema`` refused as encode_group refuses them; a mapping
            holds ``job_id``, ``epoch`` or ``schema``, a key encode_group does not take or lacks
            ``group_id`` or a required column (where a call of encode_group would raise Python's
            ``TypeError``); a group id is repeated; a group refused by encode_group (its error with the
            group named in the message, ``group`` set to its position, ``column`` and ``row`` kept);
            groups of different Arrow schemas (naming the first that differs from group 0); more than
            2**31 - 1 list entries in one column of the joined batch. Other exceptions encode_group
            raises for a group propagate with a note naming the group.
    """
    _check_key(job_id, epoch, 0)  # job_id and epoch once, before any group is named
    if not isinstance(schema, TrajectorySchema):
        raise SchemaError(
            f"schema must be a TrajectorySchema (STANDARD_SCHEMA or STANDARD_SCHEMA.extend(...)), got "
            f"{type(schema).__name__}"
        )
    ids = _group_ids(job_id, epoch, groups)
    encoded = merged(job_id, epoch, groups, ids, schema)
    if encoded is None:
        encoded = _encode_each(job_id, epoch, groups, ids, schema)
    joined, rows = encoded
    return EncodedGroups(joined, rows, group_nbytes(joined, rows))


def _name(index: int, group_id: object) -> str:
    return f"group {index} (group_id {group_id!r})"


def _group_ids(job_id: str, epoch: int, groups: object) -> list[int]:
    """The checked group ids; refuses what no group may be (see :func:`encode_groups`' Raises)."""
    if not isinstance(groups, Sequence) or isinstance(groups, str | bytes):
        raise InvalidRequestError(
            f"groups must be a sequence (a list) of mappings, one per group, got {type(groups).__name__}"
        )
    if not groups:
        raise InvalidRequestError("encode_groups got an empty list of groups; pass at least one group")
    ids: list[int] = []
    first: dict[int, int] = {}
    checked: frozenset[object] | None = None  # the keys of the last group whose keys passed
    for i, group in enumerate(groups):
        if type(group) is not dict and not isinstance(group, Mapping):
            raise InvalidRequestError(
                f"groups[{i}] has type {type(group).__name__}; each group is a mapping (a dict) of group_id "
                "and encode_group's column keyword arguments"
            )
        keys = group.keys()
        if checked is None or keys != checked:  # a batch's groups usually share their keys: checked once
            if not _GROUP_ARGUMENTS.issuperset(keys) or not keys >= _REQUIRED_SET:
                _refuse_keys(i, group)
            checked = frozenset(keys)
        gid = group["group_id"]
        if type(gid) is not int or gid < 0 or gid > _INT64_MAX:
            try:
                gid = _check_key(job_id, epoch, gid).group_id
            except SchemaError as exc:
                raise SchemaError(f"{_name(i, gid)}: {exc.message}", **exc.fields, group=i) from None
        if gid in first:
            raise SchemaError(
                f"{_name(i, gid)} repeats the group_id of group {first[gid]}: a group id names one group of "
                "the job and epoch; give each group its own id",
                column="group_id",
                group=i,
            )
        first[gid] = i
        ids.append(gid)
    return ids


def _refuse_keys(index: int, group: Mapping[Any, Any]) -> None:
    name = _name(index, group["group_id"]) if "group_id" in group else f"group {index}"
    for key in group:
        if key in _CALL_ARGUMENTS:
            raise SchemaError(
                f"{name} holds {key!r}: it is the same for every group; pass {key}= to encode_groups itself",
                column=key if key != "schema" else None,
                group=index,
            )
        if key not in _GROUP_ARGUMENTS:
            raise SchemaError(
                f"{name} holds {key!r}, which is not an argument of encode_group; a group takes group_id and "
                f"{', '.join(sorted(_GROUP_ARGUMENTS - {'group_id'}))} (user columns go in extra=)",
                column=key if isinstance(key, str) else None,
                group=index,
            )
    missing = next(n for n in _REQUIRED if n not in group)
    raise SchemaError(
        f"{name} has no {missing!r}: every group needs group_id, prompt_ids, response_ids, "
        "response_logprobs and reward",
        column=missing,
        group=index,
    )


# --- The precise tier ----------------------------------------------------------------------------------


def _encode_each(
    job_id: str, epoch: int, groups: Sequence[Mapping[str, Any]], ids: list[int], schema: TrajectorySchema
) -> tuple[pa.RecordBatch, tuple[int, ...]]:
    """encode_group per group (its errors, naming the group), then one copy to join the batches."""
    batches: list[pa.RecordBatch] = []
    for i, group in enumerate(groups):
        try:
            batch = encode_group(job_id=job_id, epoch=epoch, schema=schema, **group)
        except TrajflightError as exc:
            raise type(exc)(f"{_name(i, ids[i])}: {exc.message}", **{**exc.fields, "group": i}) from exc
        except Exception as exc:  # not a typed refusal: the same exception, told which group raised it
            exc.add_note(f"raised by encode_group for {_name(i, ids[i])} of encode_groups")
            raise
        if batches and not batch.schema.equals(batches[0].schema, check_metadata=True):
            raise _schema_differs(i, ids[i], batches[0].schema, batch.schema)
        batches.append(batch)
    try:
        # One copy of every buffer, one array per column (dictionaries unified), even for one batch.
        joined = pa.concat_batches(batches)
    except pa.ArrowException as exc:
        raise SchemaError(
            f"the {len(batches)} groups do not fit one record batch ({exc}); encode them in several calls"
        ) from exc
    return joined, tuple(b.num_rows for b in batches)


def _field(field: pa.Field) -> str:
    """A field's type, nullability and metadata, in words."""
    nullable = "nullable" if field.nullable else "not null"
    return f"{field.type} ({nullable}{', metadata ' + repr(field.metadata) if field.metadata else ''})"


def _schema_differs(index: int, group_id: int, first: pa.Schema, other: pa.Schema) -> SchemaError:
    """The error for group ``index``, whose Arrow schema ``other`` is not group 0's ``first``."""
    lacks = [n for n in first.names if n not in other.names]
    adds = [n for n in other.names if n not in first.names]
    if lacks or adds:
        what = (f"has columns {adds} that group 0 has not; " if adds else "") + (
            f"lacks columns {lacks} that group 0 has" if lacks else ""
        )
    elif first.names != other.names:
        what = f"has its columns in another order ({other.names}, group 0: {first.names})"
    else:
        differ = [(a, b) for a, b in zip(first, other, strict=True) if not a.equals(b, check_metadata=True)]
        if differ:
            ours, theirs = differ[0]
            what = f"has column {theirs.name!r} as {_field(theirs)}, group 0 as {_field(ours)}"
        else:
            what = f"has schema metadata {other.metadata!r}, group 0 {first.metadata!r}"
    return SchemaError(
        f"{_name(index, group_id)} {what.rstrip('; ')}: one call encodes groups of one Arrow schema; put "
        "groups of different columns (or column types) in separate encode_groups calls",
        group=index,
    )
