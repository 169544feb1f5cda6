"""A held lease: fetch its groups as tensors, drive it to commit, renew it in the background.

:class:`LeasedBatch` is what ``Trainer.lease`` returns. As a context manager it makes the common path one
``with`` block: leaving the block normally drives the batch through ``prepare -> start_training ->
finish_training -> commit`` (whatever is left of it); an exception inside never commits: groups not yet
in training go back to READY, groups in training are left to expire into ``UNKNOWN`` for an operator
(no automatic replay of possibly trained data).

:func:`fetch` reads any :class:`~trajflight._handles.BatchHandle` (a whole lease or a shard of it) in
any process, straight from the storage servers, under the lease's token.

It does not guarantee that renewal wins against a process stalled longer than the lease's time-to-live:
the lease then expires, and every later call on it is refused (that is the point of fencing).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import pyarrow as pa

from trajflight._handles import BatchHandle
from trajflight._session import Session
from trajflight._storage import StoragePool, env_credential, env_tls, read_handle
from trajflight.codec import Layout, TorchBatch, decode
from trajflight.errors import InvalidStateError, LeaseExpiredError, TrajflightError
from trajflight.flight_server import LeaseToken, ShmOpened
from trajflight.keys import Partition

__all__ = ["LeasedBatch", "fetch", "fetch_table"]

_DEFAULT_POOL: StoragePool | None = None
_POOL_LOCK = threading.Lock()


def _default_pool() -> StoragePool:
    global _DEFAULT_POOL
    with _POOL_LOCK:
        if _DEFAULT_POOL is None:
            # A process that was handed a handle reads with its own credential and TLS files.
            _DEFAULT_POOL = StoragePool(tls=env_tls(), credential=env_credential())
        return _DEFAULT_POOL


def fetch_table(handle: BatchHandle, *, timeout: float = 30.0, pool: StoragePool | None = None) -> pa.Table:
    """Read a handle's groups as one Arrow table (rows in group order), from all servers in parallel.

    From servers on this host (shared memory, see :mod:`trajflight._storage`) the table aliases read-only
    mappings of their segments, valid after the groups are committed until the table is dropped; over
    Flight it owns received buffers. Any process may call this with a handle it was sent.

    Raises:
        StaleFenceError: the lease was superseded. NotFoundError: a group is gone (committed or dropped).
    """
    return read_handle(pool or _default_pool(), handle, timeout=timeout)


def fetch(
    handle: BatchHandle,
    *,
    layout: Layout = "jagged",
    device: str | None = None,
    padding_value: float = 0,
    fill_nulls: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
    pool: StoragePool | None = None,
) -> TorchBatch:
    """Read a handle's groups and decode them to torch (see :func:`trajflight.codec.decode`).

    The tensors alias the Arrow buffers: read-only shared-memory mappings on this host (never write
    through them), received buffers over Flight. Groups that are not one contiguous slice (put one by
    one, or from several servers) are joined with one copy; a batch put with ``Writer.put_many`` and
    leased in order is not copied at all.
    """
    table = fetch_table(handle, timeout=timeout, pool=pool)
    return decode(table, layout=layout, device=device, padding_value=padding_value, fill_nulls=fill_nulls)


class LeasedBatch:
    """Groups held under one fenced lease. Thread-safe for reads; drive transitions from one thread.

    Args:
        session: The connection's collaborators (controller, storage, renewals).
        handle: The lease's groups, as opened on their servers.
        ttl: Time-to-live each renewal asks for (default: the job's).
        renew: Renew the lease in the background (at a third of its time-to-live) while it is held.
        opened: Segments the lease's fencing call opened on servers of this host, by location.

    Attributes:
        handle: The picklable handle of the lease (split it with ``handle.split(n)`` for ranks).
        lost: Why the lease was lost, if background renewal found it expired or superseded.
    """

    def __init__(
        self,
        session: Session,
        handle: BatchHandle,
        *,
        ttl: float | None = None,
        renew: bool = True,
        opened: Mapping[str, ShmOpened] | None = None,
    ) -> None:
        self.session = session
        self.handle = handle
        # Segments the lease's fencing call opened on servers of this host: reads need no call of their own.
        self._opened: dict[str, ShmOpened] = dict(opened or {})
        self.ttl = ttl
        self.batch_id: str | None = None
        self.stage = "LEASED"
        self.lost: TrajflightError | None = None
        self.renewals = 0
        self.renew_errors: list[str] = []
        self._renewal: int | None = None
        if renew:
            remaining = ttl if ttl is not None else max(0.3, handle.expires_at - time.time())
            self._renewal = session.renewals.add(self._renew_once, max(0.05, remaining / 3))

    def _renew_once(self) -> bool:
        """One heartbeat (run by the session's renewals); False when the lease is gone for good."""
        try:
            self.session.controller.renew(self.token, ttl=self.ttl)
            self.renewals += 1
            return True
        except TrajflightError as exc:  # expired, superseded or committed: stop, remember why
            self.lost = exc
            return False
        except Exception as exc:  # a transport hiccup: keep trying until the lease really expires
            self.renew_errors.append(repr(exc))
            return True

    # ------------------------------------------------------------------ facts
    @property
    def token(self) -> int:
        """The lease's fencing token."""
        return self.handle.token

    @property
    def partitions(self) -> tuple[Partition, ...]:
        """The leased groups, in order."""
        return self.handle.partitions

    def __len__(self) -> int:
        return len(self.handle.groups)

    # ------------------------------------------------------------------ data
    def fetch_table(self, columns: Sequence[str] | None = None) -> pa.Table:
        """Read the groups (projected to ``columns``) as one Arrow table, from all servers in parallel
        (see :func:`fetch_table`). From servers on this host it reuses the segments opened when the lease
        was taken, with no call to the server."""
        return read_handle(
            self.session.storage,
            self._projected(columns),
            timeout=self.session.timeout,
            opened=self._opened,
        )

    def fetch(
        self,
        columns: Sequence[str] | None = None,
        *,
        layout: Layout = "jagged",
        device: str | None = None,
        padding_value: float = 0,
        fill_nulls: Mapping[str, Any] | None = None,
    ) -> TorchBatch:
        """Read the groups and decode them to torch tensors in one call (see :func:`fetch` and
        ``trajflight.codec.decode``)."""
        return decode(
            self.fetch_table(columns),
            layout=layout,
            device=device,
            padding_value=padding_value,
            fill_nulls=fill_nulls,
        )

    def _projected(self, columns: Sequence[str] | None) -> BatchHandle:
        return self.handle if columns is None else self.handle.select(columns)

    def shards(self, n: int) -> list[BatchHandle]:
        """Per-rank handles balanced by token count, for data-parallel ranks (see ``BatchHandle.split``)."""
        return self.handle.split(n)

    def append(self, partition: Partition | Iterable[Any], columns: pa.Table | pa.RecordBatch) -> None:
        """Add columns (one value per stored row) to one leased group on its storage server, fenced by
        this lease's token. Record them with :meth:`release` (pipeline stages)."""
        part = Partition(*partition)
        meta = next((g for g in self.handle.groups if g.partition == part), None)
        if meta is None:
            raise InvalidStateError(f"group {tuple(part)} is not part of lease {self.token}")
        self.session.storage.client(meta.location).append_columns(
            Partition(*part), columns, LeaseToken(meta.generation)
        )
        self._opened.pop(meta.location, None)  # the group has a new part: read it through the server

    # ------------------------------------------------------------------ transitions
    def _check(self) -> None:
        if self.lost is not None:
            raise LeaseExpiredError(f"lease {self.token} was lost: {self.lost}; lease again") from self.lost

    def prepare(self, batch_id: str | None = None) -> str:
        """LEASED -> PREPARED: the groups form training batch ``batch_id`` (default: a new id)."""
        self._check()
        self.batch_id = batch_id or self.batch_id or f"batch-{uuid.uuid4().hex[:12]}"
        self.session.controller.prepare(self.token, self.batch_id)
        self.stage = "PREPARED"
        return self.batch_id

    def start_training(self) -> None:
        """PREPARED -> TRAINING (prepares first if needed)."""
        if self.batch_id is None:
            self.prepare()
        self._check()
        self.session.controller.start_training(self.token, str(self.batch_id))
        self.stage = "TRAINING"

    def finish_training(self) -> None:
        """TRAINING -> TRAINED."""
        self._check()
        self.session.controller.finish_training(self.token, str(self.batch_id))
        self.stage = "TRAINED"

    def commit(self) -> tuple[Partition, ...]:
        """TRAINED -> COMMITTED, driving the earlier steps first if they were skipped. The controller
        then deletes the groups' data and only afterwards releases their capacity."""
        self._check()
        steps = {
            "LEASED": ["prepare", "start_training", "finish_training", "commit"],
            "PREPARED": ["start_training", "finish_training", "commit"],
            "TRAINING": ["finish_training", "commit"],
        }.get(self.stage, ["commit"])
        if self.batch_id is None:
            self.batch_id = f"batch-{uuid.uuid4().hex[:12]}"
        args = {"token": self.token, "batch_id": self.batch_id}
        # Let go of the mappings first (they live on in the caller's tensors, if any): a segment nobody
        # maps when its groups are deleted goes straight back to the server's pool of warm segments.
        self._opened.clear()
        # The remaining transitions in one round trip; each is still a compare-and-set on the controller.
        committed: tuple[Partition, ...] = self.session.controller.call_many([(s, args) for s in steps])[-1]
        self.stage = "COMMITTED"
        self.close()
        return committed

    def release(self, columns: Iterable[str] = ()) -> tuple[Partition, ...]:
        """Give LEASED/PREPARED groups back to READY, recording columns this holder appended."""
        self._opened.clear()
        released = self.session.controller.release(self.token, columns=tuple(columns))
        self.stage = "RELEASED"
        self.close()
        return released

    def close(self) -> None:
        """Stop renewing (the lease then expires on its own unless committed or released)."""
        if self._renewal is not None:
            self.session.renewals.remove(self._renewal)
            self._renewal = None

    def __enter__(self) -> LeasedBatch:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            if self.stage not in ("COMMITTED", "RELEASED"):
                self.commit()
            return
        # Never commit after an error. Untrained groups go back to READY at once; groups in training
        # are left to expire into UNKNOWN (an operator decides), so renewal stops either way.
        try:
            if self.stage in ("LEASED", "PREPARED") and self.lost is None:
                self.release()
        finally:
            self.close()
