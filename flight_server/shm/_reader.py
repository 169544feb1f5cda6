"""What a same-host reader holds after ``shm_open``: the groups' segments, read again with no further call.

:class:`ShmOpened` parses the server's answer (segments, each group's parts and fence-board entry), maps
segments read-only on first read and slices, joins and projects the groups from them with no copy of
their data. :class:`~._client.ShmClient` decides when an open may be read again (the fence board,
:mod:`._fences`) and when the server must be asked.

It does not check tokens itself: that is the server's (at ``shm_open``) and the board's job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from trajflight.errors import SchemaError, TrajflightError
from trajflight.flight_server._segments import concat_groups
from trajflight.flight_server._wire import GroupRead
from trajflight.flight_server.shm._fences import BoardQuery
from trajflight.flight_server.shm._segment import map_segment
from trajflight.keys import Partition

__all__ = ["ShmOpened"]


class ShmOpened:
    """Segment handles of groups as the server's ``shm_open`` gave them; reads them with no further call.

    Holds, per group, its lease generation and its parts (segment, first row, rows), and the column names
    of each segment. Segments are mapped read-only on first read and the mappings kept while this object
    lives (each mapping locks its segment against reuse while it lives, see :func:`~._segment.map_segment`).
    The server checked the tokens when it answered; :meth:`StorageClient.shm_get` checks every later
    read, and every read after :meth:`map` mapped a segment for it, on the server's fence board (each
    group's ``[slot, tag]`` from the answer; see ``_fences``) and opens again when anything changed: a
    re-granted lease, a delete, an append.
    """

    __slots__ = (
        "_board",
        "_covers",
        "_fences",
        "_groups",
        "_maps",
        "_needed",
        "_segments",
        "_tables",
        "_whole",
        "board_path",
        "mapped",
        "reads",
    )

    def __init__(
        self,
        segments: Sequence[tuple[str, int, tuple[str, ...] | None, int]],
        groups: Mapping[Partition, tuple[int | None, tuple[tuple[int, int, int], ...]]],
        fences: Mapping[Partition, tuple[int, int]] | None = None,
        board_path: str | None = None,
        reads: Sequence[GroupRead] = (),
    ) -> None:
        self._segments = list(segments)
        self._groups = dict(groups)
        self._tables: dict[int, pa.Table] = {}
        self._maps: dict[str, Any] = {}  # path -> read-only mapping (streams of one slab share it)
        self.mapped = 0
        """Segments mapped so far (a read that mapped one must check its groups after it)."""
        self._fences = dict(fences or {})
        self.board_path = board_path
        self.reads: tuple[GroupRead, ...] = tuple(reads)
        """The reads it was opened for; passing this very tuple back reads with no per-group work."""
        # Per-open results for those reads, computed once (a trainer reads its lease several times).
        self._board: BoardQuery | bool | None = False
        self._covers: dict[tuple[str, ...] | None, bool] = {}
        self._whole: pa.Table | None = None
        self._needed: list[int] | None = None  # the segments of ``reads``, once

    @classmethod
    def from_reply(cls, reads: Sequence[GroupRead], reply: Mapping[str, Any]) -> ShmOpened:
        """Parse a ``shm_open`` reply to ``reads`` (groups answer in the order asked)."""
        segments = [
            (
                str(s["path"]),
                int(s["capacity"]),
                None if s.get("columns") is None else tuple(s["columns"]),
                int(s.get("offset", 0)),
            )
            for s in reply["segments"]
        ]
        answered = reply["groups"]
        if len(answered) != len(reads):
            raise TrajflightError(f"shm_open: {len(answered)} groups answered for {len(reads)} asked")
        groups = {
            r.key: (
                None if r.token is None else r.token.generation,
                tuple((int(a), int(o), int(n)) for a, o, n in g["parts"]),
            )
            for r, g in zip(reads, answered, strict=True)
        }
        fences = {
            r.key: (int(g["fence"][0]), int(g["fence"][1]))
            for r, g in zip(reads, answered, strict=True)
            if g.get("fence") is not None
        }
        return cls(segments, groups, fences, reply.get("fences"), reads)

    def board_query(self, reads: Sequence[GroupRead]) -> BoardQuery | None:
        """The fence-board check of the reads (each one's ``(slot, tag)`` at its lease generation); None
        when some read has no board slot or no token (the server must check it). Prepared once for
        :attr:`reads`."""
        if reads is self.reads:
            if self._board is False:
                self._board = self.board_query(list(reads))
            return self._board  # type: ignore[return-value]
        entries, generations = [], []
        for r in reads:
            fence = self._fences.get(r.key)
            if fence is None or r.token is None:
                return None
            entries.append(fence)
            generations.append(r.token.generation)
        return BoardQuery(entries, generations)

    def same_parts(self, other: ShmOpened, reads: Sequence[GroupRead]) -> bool:
        """Whether ``other`` (a later open) holds every read group in the same segments and places."""

        def parts(opened: ShmOpened, key: Partition) -> list[tuple[str, int, int, int]] | None:
            found = opened._groups.get(key)
            if found is None:
                return None
            return [(opened._segments[at][0], opened._segments[at][3], o, n) for at, o, n in found[1]]

        for r in reads:
            mine = parts(self, r.key)
            if mine is None or mine != parts(other, r.key):
                return False
        return True

    def covers(self, reads: Sequence[GroupRead], columns: Sequence[str] | None) -> bool:
        """Whether every read (same key and generation) and every named column is in this open."""
        if reads is self.reads:
            wanted = None if columns is None else tuple(columns)
            covered = self._covers.get(wanted)
            if covered is None:
                covered = self._covers[wanted] = self.covers(list(reads), columns)
            return covered
        for r in reads:
            found = self._groups.get(r.key)
            if found is None or found[0] != (None if r.token is None else r.token.generation):
                return False
            if columns is not None:
                stored: set[str] = set()
                for at, _, _ in found[1]:
                    names = self._segments[at][2]
                    if names is None:  # a server that does not list columns: ask it
                        return False
                    stored.update(names)
                if not stored.issuperset(columns):
                    return False
        return True

    def map(self, reads: Sequence[GroupRead]) -> int:
        """Map (and so lock against reuse) every segment the reads need; returns how many were mapped now.

        Nothing is parsed: a segment mapped now may hold another group (see ``StorageClient.shm_get``),
        which the caller rules out before :meth:`read`.

        Raises:
            NotFoundError: a segment file is gone (the group was deleted, or its server restarted).
        """
        before = self.mapped
        if reads is self.reads:
            if self._needed is None:
                self._needed = self._segments_of(reads)
            needed = self._needed
        else:
            needed = self._segments_of(reads)
        for at in needed:
            self._mapping(at)
        return self.mapped - before

    def _segments_of(self, reads: Sequence[GroupRead]) -> list[int]:
        """The segments holding the reads' parts, each once, in order of first use."""
        found = (self._groups.get(r.key) for r in reads)
        return list(dict.fromkeys(at for parts in found if parts is not None for at, _, _ in parts[1]))

    def _mapping(self, at: int) -> Any:
        path, capacity, _, _ = self._segments[at]
        mm = self._maps.get(path)
        if mm is None:
            mm = self._maps[path] = map_segment(path, capacity)
            self.mapped += 1
        return mm

    def _stream(self, at: int) -> pa.Table:
        found = self._tables.get(at)
        if found is None:
            path, _, _, start = self._segments[at]
            buffer = pa.py_buffer(self._mapping(at))
            try:
                found = self._tables[at] = ipc.open_stream(
                    buffer.slice(start) if start else buffer
                ).read_all()
            except pa.ArrowInvalid as exc:
                raise SchemaError(f"shm read: segment {path} is not an IPC stream: {exc}") from None
        return found

    def read(self, reads: Sequence[GroupRead], columns: Sequence[str] | None) -> pa.Table:
        """The groups of ``reads`` (which :meth:`covers`) as one table, projected to ``columns``.

        Consecutive single-part groups that are consecutive rows of one segment are read as one slice: a
        batch put together and read in order is one chunk (no copy).
        """
        if reads is self.reads:
            if self._whole is None:
                self._whole = self.read(list(reads), None)
            return self._whole if columns is None else self._whole.select(list(columns))
        runs: list[list[int]] = []  # [segment index, first row, rows]
        tables: list[pa.Table] = []

        def flush() -> None:
            for at, offset, rows in runs:
                tables.append(self._stream(at).slice(offset, rows))
            runs.clear()

        for r in reads:
            parts = self._groups[r.key][1]
            if len(parts) == 1:
                at, offset, rows = parts[0]
                if runs and runs[-1][0] == at and runs[-1][1] + runs[-1][2] == offset:
                    runs[-1][2] += rows
                else:
                    runs.append([at, offset, rows])
                continue
            flush()
            table: pa.Table | None = None
            for at, offset, rows in parts:
                piece = self._stream(at).slice(offset, rows)
                if table is None:
                    table = piece
                else:
                    for name, column in zip(piece.column_names, piece.columns, strict=True):
                        table = table.append_column(piece.schema.field(name), column)
            if table is None:  # pragma: no cover - a stored group has at least one part
                raise TrajflightError("shm_open: a group without parts")
            tables.append(table)
        flush()
        if columns is not None:
            tables = [t.select(list(columns)) for t in tables]
        return concat_groups(tables)
