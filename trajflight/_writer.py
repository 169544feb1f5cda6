"""A rollout worker's side of the public client: :class:`Writer`, and the one route of a put.

:class:`Writer` (made by ``Client.writer``) stores finished GRPO groups: ``put`` one, ``put_many`` several
in one controller operation and one storage call per server. Every put takes the same steps: the
controller grants the groups' partitions for reservations bounded from the inputs
(:mod:`trajflight._sizing`); each group is encoded once, under its partition (its real key, the default
sample ids of that partition), or, given encoded, keyed with ``codec.with_partitions``; the storage
servers store the groups; one controller operation publishes them, charged what they take (for ``put``
of a writer made with ``grant_ahead=True``, the same operation grants its next partition ahead,
:mod:`trajflight._ahead`, so that a steady-state put makes one controller call). When capacity
is full the put waits up to its deadline, then raises :class:`~trajflight.errors.CapacityExceededError`
(backpressure, never an unbounded queue): it waits on the controller (``allocate(wait=...)``), which
grants it as soon as capacity is released; a controller that refuses at once is asked again after its
``retry_after`` hint.

It does not retry: a put that fails after its partitions were granted leaves them to expire (the job's
``grant_ttl``), and the groups already stored with them are deleted then; the caller puts again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from trajflight._ahead import Ahead
from trajflight._session import Session
from trajflight._sizing import keyed_bound, keyed_bounds, reservations
from trajflight.codec import EncodedGroups, encode_group, encode_groups, with_partitions
from trajflight.controller import GroupInfo, Publication, PutGrant
from trajflight.errors import (
    CapacityExceededError,
    DeadlineExceededError,
    InvalidRequestError,
    NotFoundError,
    StaleFenceError,
)
from trajflight.keys import Partition

__all__ = ["Writer"]

T = TypeVar("T")


def _stored_bytes(batch: pa.RecordBatch) -> int:
    """The bytes a group asks capacity for: its buffers' total size, or for a slice of a larger batch
    (one group of an :class:`~trajflight.codec.EncodedGroups`) the bytes its rows take.

    Not ``RecordBatch.nbytes`` for every batch: it walks every list column's offsets to count only the
    referenced values, a cost per group that a large ``put_many`` feels. For a batch that owns
    its buffers the whole buffers are what a storage server copies, so this is also the closer figure,
    and never smaller; a slice's buffers are its parent's, which would ask capacity for every group.
    """
    if _is_slice(batch):
        return int(batch.nbytes)
    return int(batch.get_total_buffer_size())


def _is_slice(batch: pa.RecordBatch) -> bool:
    """Whether ``batch`` views part of larger buffers, judged by its ``reward`` column (every group has
    it): an offset, or a data buffer longer than its rows need (beyond Arrow's 64-byte padding)."""
    index = batch.schema.get_field_index("reward")
    if index < 0:
        return False
    column = batch.column(index)
    data = column.buffers()[1]
    width = column.type.bit_width // 8
    return column.offset > 0 or (data is not None and width > 0 and data.size > len(column) * width + 64)


def _tokens_of(batch: pa.RecordBatch) -> int:
    """Response tokens of a group (for token-budgeted leases), from the offsets with no kernel call."""
    if "response_ids" not in batch.schema.names or batch.num_rows == 0:
        return 0
    offsets = batch.column("response_ids").offsets.to_numpy(zero_copy_only=False)
    return int(offsets[-1] - offsets[0])


class Writer:
    """A registered rollout worker of one job and epoch. Thread-safe.

    Args:
        session: The connection's collaborators (controller, storage).
        job_id: The job.
        epoch: The epoch it writes under (a restarted job fences older ones).
        writer_id: Stable id (default: a random one).
        policy_version: Weights version its groups are generated with (updated by :meth:`ack_policy`).
        put_timeout: Default deadline of a put, including waits for capacity.
        grant_ahead: Each ``put`` asks, with its publication, for the grant of the next one and holds it
            (:mod:`trajflight._ahead`): a steady-state put makes one controller call instead of two. The
            held grant is charged to the job's capacity (bytes and one group) until a put uses it, it
            expires (the job's ``grant_ttl``) or :meth:`close` gives it back, so a job's usage is back to
            zero only once its writers are closed. Off by default.
        node: The node it runs on; the controller places its groups on a storage server of that node
            when one has room (``Client.writer`` passes the client's: this process's Ray node id on a Ray
            data plane, else this host's ``host_id``: hostname and boot id, as storage
            servers report it for the transport's choice).
    """

    def __init__(
        self,
        session: Session,
        job_id: str,
        epoch: int,
        *,
        node: str,
        writer_id: str | None = None,
        policy_version: int = 0,
        put_timeout: float = 60.0,
        grant_ahead: bool = False,
    ) -> None:
        self.session = session
        self.job_id = job_id
        self.epoch = epoch
        self.writer_id = writer_id or f"writer-{uuid.uuid4().hex[:8]}"
        self.policy_version = policy_version
        self.put_timeout = put_timeout
        self.node = node
        self._ahead = Ahead() if grant_ahead else None
        session.controller.register_writer(
            job_id, epoch, self.writer_id, node=self.node, policy_version=policy_version
        )

    def ack_policy(self, version: int) -> None:
        """Acknowledge new weights: later groups carry ``version``."""
        self.session.controller.ack_policy(self.job_id, self.epoch, self.writer_id, version)
        self.policy_version = version

    def put(
        self, batch: pa.RecordBatch | None = None, *, timeout: float | None = None, **group: Any
    ) -> GroupInfo:
        """Store one finished group and make it READY; returns its metadata.

        The partition is granted first, for a reservation bounded from the inputs
        (:mod:`trajflight._sizing`): with ``grant_ahead``, a grant this writer holds where one is large
        enough and fresh (:mod:`trajflight._ahead`), else one asked of the controller; the group is then
        encoded once, under its partition. Publishing charges the encoded group's bytes and gives the
        rest of the reservation back; with ``grant_ahead`` the same controller operation grants the
        writer's next partition ahead (held until a later put uses it, or :meth:`close` gives it back).

        Args:
            batch: A record batch of the group (its key columns are set to the granted partition), or
                ``None`` and the group's columns as keyword arguments of
                :func:`trajflight.codec.encode_group` (``prompt_ids``, ``response_ids``,
                ``response_logprobs``, ``reward``, ...; no ``job_id``/``epoch``/``group_id``: the
                controller assigns the partition). Without ``sample_ids``, the samples get the default ids
                of that partition (``"{job_id}/{epoch}/{group_id}/{sample_index}"``).
            timeout: Deadline of the whole put, waits for capacity included (default ``put_timeout``).

        Raises:
            CapacityExceededError: capacity stayed full until the deadline (``retry_after`` hints when to
                try again); nothing was stored.
            StaleFenceError: the epoch was fenced (the job restarted): stop this worker.
            LeaseExpiredError: the partition's grant expired (the job's ``grant_ttl``) before the data
                reached its storage server, which refuses it since the controller gave the partition up;
                nothing was stored: put the group again.
            SchemaError: bad group data, naming the column and row; nothing was stored (the partition
                granted for it expires unused after the job's ``grant_ttl``).
            InvalidRequestError: a record batch and columns at once, or a reserved column.
        """
        deadline = time.monotonic() + (self.put_timeout if timeout is None else timeout)
        if batch is not None:
            if group:
                raise InvalidRequestError("pass either a record batch or the group's columns, not both")
            reserved = keyed_bound(_stored_bytes(batch), batch.num_rows, self.job_id)
            grant = self._held(reserved) or self._allocate(reserved, deadline)
            key = grant.partition
            stored: pa.RecordBatch = with_partitions(batch, [key])
        else:
            columns = self._group_columns(group)
            (reserved,) = reservations([columns], job_id=self.job_id, epoch=self.epoch)
            grant = self._held(reserved) or self._allocate(reserved, deadline)
            key = grant.partition
            stored = encode_group(job_id=key.job_id, epoch=key.epoch, group_id=key.group_id, **columns)
        nbytes = _charged(_stored_bytes(stored), reserved)
        self.session.storage.put_groups(
            grant.location,
            [(key, stored)],
            writer=self.writer_id,
            timeout=max(0.001, deadline - time.monotonic()),
        )
        arguments = self._publication(grant, stored, nbytes, tuple(stored.schema.names))
        if self._ahead is None:
            info: GroupInfo = self.session.controller.publish(grant.partition, **arguments)
            return info
        published = self.session.controller.publish_ahead(
            [Publication(grant.partition, **arguments)],
            job_id=self.job_id,
            epoch=self.epoch,
            writer_id=self.writer_id,
            ahead=self._ahead.request(reserved),
            timeout=max(0.001, deadline - time.monotonic()),
        )
        self._ahead.hold(published.grants, published.granted_at)
        return published.groups[0]

    def close(self) -> None:
        """Give back the grants this writer holds ahead (:mod:`trajflight._ahead`), so that their capacity
        is refunded once their partitions' deletes are confirmed rather than when they expire. The writer
        stays usable (a later put allocates). Grants the controller already dropped (a new epoch, a
        deleted partition) are skipped. Without ``grant_ahead`` it does nothing."""
        for grant in self._ahead.release() if self._ahead is not None else ():
            with contextlib.suppress(NotFoundError, StaleFenceError):  # dropped already: nothing to give
                self.session.controller.abandon(grant.partition, token=grant.token)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _held(self, nbytes: int) -> PutGrant | None:
        """A grant held ahead for a group of ``nbytes`` (``None``: allocate one)."""
        return None if self._ahead is None else self._ahead.take(nbytes)

    def _group_columns(self, group: Mapping[str, Any]) -> dict[str, Any]:
        """A group's columns as given to :meth:`put`, checked, with the writer's policy version by default."""
        for reserved in ("job_id", "epoch", "group_id"):
            if reserved in group:
                raise InvalidRequestError(f"put() assigns {reserved}; leave it out of the group's columns")
        return {"policy_version": self.policy_version, **group}

    def _allocate(self, nbytes: int, deadline: float) -> PutGrant:
        """A placed partition from the controller, waiting for capacity until ``deadline``."""
        controller = self.session.controller
        return self._waiting(
            lambda wait, timeout: controller.allocate(
                self.job_id, self.epoch, self.writer_id, nbytes=nbytes, wait=wait, timeout=timeout
            ),
            deadline,
        )

    def _allocate_many(self, sizes: Sequence[int], deadline: float) -> list[PutGrant]:
        """Placed partitions for groups of ``sizes``, in order, waiting for capacity until ``deadline``.

        One controller operation grants every group that fits. When capacity runs out part way, the rest
        is asked for again at once: capacity may have come back meanwhile; if not, the controller holds
        the call until it does, as for :meth:`_allocate`. Grants already made are held while it waits
        (they expire ``grant_ttl`` after they were made).
        """
        controller = self.session.controller
        grants: list[PutGrant] = []

        def rest(wait: float, timeout: float) -> list[PutGrant]:
            out: list[PutGrant] = controller.allocate_many(
                self.job_id,
                self.epoch,
                self.writer_id,
                nbytes=sizes[len(grants) :],
                wait=wait,
                timeout=timeout,
            )
            return out

        while len(grants) < len(sizes):
            grants += self._waiting(rest, deadline)
        return grants

    def _waiting(self, ask: Callable[[float, float], T], deadline: float) -> T:
        """``ask(wait, timeout)`` of the controller until capacity lets it through or ``deadline`` passes.

        The controller holds the call until capacity is released, up to the put's deadline less the time
        its reply needs; its refusal then is final. A controller that refused long before that (one that
        does not wait) is asked again after the refusal's ``retry_after`` hint, as long as the deadline
        allows.
        """
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceededError(f"put of a group to job {self.job_id!r} did not finish in time")
            asked = time.monotonic()
            try:
                return ask(remaining, remaining)
            except CapacityExceededError as exc:
                # A waiting controller answers after about 3/4 of the time left (the reply keeps the rest).
                if time.monotonic() - asked >= remaining / 4:
                    raise _refused_until_deadline(exc) from exc
                time.sleep(_capacity_wait(exc, deadline))

    def _publication(
        self,
        grant: PutGrant,
        batch: pa.RecordBatch,
        nbytes: int,
        columns: tuple[str, ...],
        figures: tuple[int, int] | None = None,
    ) -> dict[str, Any]:
        """The arguments of ``publish`` for a stored group with ``columns``, beside its partition;
        ``figures`` are its (tokens, oldest policy version) where already known (:func:`_group_figures`)."""
        tokens, version = figures or (_tokens_of(batch), _policy_version(batch, self.policy_version))
        return {
            "token": grant.token,
            "rows": batch.num_rows,
            "nbytes": nbytes,
            "tokens": tokens,
            "policy_version": version,
            "columns": columns,
        }

    def put_many(
        self,
        batches: Sequence[pa.RecordBatch] | Sequence[Mapping[str, Any]],
        *,
        timeout: float | None = None,
    ) -> list[GroupInfo]:
        """Store several finished groups (record batches of one schema) and make them READY, in order.

        The groups get their partitions from the controller in one operation for all of them, for
        reservations bounded from their inputs, as :meth:`put` does; when capacity runs out part way,
        the put holds the partitions already granted, waits for capacity as :meth:`put` does and asks for
        the rest (so a batch larger than the free capacity completes as trainers commit, but one larger
        than the whole capacity waits until its deadline). Groups given as columns are then encoded
        together, each under its partition. The groups bound for one storage server are sent in one call
        (through shared memory on this host: one segment, so a trainer leasing them in order reads them
        with no copy to join them; over Flight: one stream, published all together). Groups become READY
        only after every storage call succeeded, all in one controller operation that publishes every
        group or none; if a storage call fails, or the deadline passes first, none of this call is
        published, and groups already stored are deleted when their unpublished allocations expire (as for
        a failed :meth:`put`): put the batch again. The deadline covers the publication too. An empty list
        stores nothing and returns ``[]``.

        Args:
            batches: The groups: record batches, or mappings of each group's columns (what :meth:`put`
                takes as keyword arguments), which are encoded together with
                :func:`~trajflight.codec.encode_groups` (cheaper than group by group). Batches from
                ``encode_groups`` (an :class:`~trajflight.codec.EncodedGroups`) are already joined: their
                key columns are set on the joined batch at once, and on shared memory it is written as it
                is, with no copy to join them.
            timeout: Deadline of the whole put, waits for capacity included (default ``put_timeout``).

        Raises:
            Like :meth:`put`; InvalidRequestError: a list mixing record batches and mappings.
        """
        if not batches:
            return []
        deadline = time.monotonic() + (self.put_timeout if timeout is None else timeout)
        grants, groups, reserved = self._granted(batches, deadline)
        encoded = groups if isinstance(groups, EncodedGroups) else None
        if encoded is not None:
            sizes = list(encoded.nbytes)
            names = [tuple(encoded.joined.schema.names)] * len(grants)
            figures = _group_figures(encoded, self.policy_version)
        else:
            sizes = [_stored_bytes(b) for b in groups]
            names, figures = [tuple(b.schema.names) for b in groups], None
        sizes = [_charged(n, r) for n, r in zip(sizes, reserved, strict=True)]
        by_location: dict[str, list[tuple[Partition, pa.RecordBatch]]] = {}
        for grant, batch in zip(grants, groups, strict=True):
            by_location.setdefault(grant.location, []).append((grant.partition, batch))
        for location, placed in by_location.items():
            self.session.storage.put_groups(
                location,
                placed,
                writer=self.writer_id,
                timeout=max(0.001, deadline - time.monotonic()),
                joined=encoded.joined if encoded is not None and len(by_location) == 1 else None,
            )
        # Every group is stored: publish them all in one controller operation (all of them or none).
        items = [
            Publication(
                grant.partition,
                **self._publication(grant, batch, nbytes, cols, None if figures is None else figures[i]),
            )
            for i, (grant, batch, nbytes, cols) in enumerate(zip(grants, groups, sizes, names, strict=True))
        ]
        return self.session.controller.publish_many(items, timeout=max(0.001, deadline - time.monotonic()))

    def _granted(
        self, batches: Sequence[Any], deadline: float
    ) -> tuple[list[PutGrant], EncodedGroups | list[pa.RecordBatch], list[int]]:
        """The groups' grants, made for reservations bounded from what was given, the groups under their
        granted partitions, and the reservations: groups given as columns encoded together under them,
        an :class:`EncodedGroups` keyed on its joined batch, record batches keyed one by one."""
        if any(isinstance(b, Mapping) for b in batches):
            columns = self._columns_of(batches)
            reserved = reservations(columns, job_id=self.job_id, epoch=self.epoch)
            grants = self._allocate_many(reserved, deadline)
            ids = [g.partition.group_id for g in grants]
            groups = [{**c, "group_id": i} for c, i in zip(columns, ids, strict=True)]
            return grants, encode_groups(job_id=self.job_id, epoch=self.epoch, groups=groups), reserved
        if isinstance(batches, EncodedGroups):
            reserved = keyed_bounds(batches.nbytes, batches.rows, self.job_id)
            grants = self._allocate_many(reserved, deadline)
            return grants, with_partitions(batches, [g.partition for g in grants]), reserved
        reserved = keyed_bounds(
            [_stored_bytes(b) for b in batches], [b.num_rows for b in batches], self.job_id
        )
        grants = self._allocate_many(reserved, deadline)
        return grants, with_partitions(batches, [g.partition for g in grants]), reserved

    def _columns_of(self, groups: Sequence[Any]) -> list[dict[str, Any]]:
        """Groups given as mappings of their columns, checked as :meth:`put` checks them."""
        columns = []
        for i, group in enumerate(groups):
            if not isinstance(group, Mapping):
                raise InvalidRequestError(
                    f"put_many() got mappings of groups' columns and, as item {i}, a {type(group).__name__}; "
                    "pass all groups as record batches or all as mappings of their columns"
                )
            columns.append(self._group_columns(group))
        return columns

    async def put_many_async(
        self,
        batches: Sequence[pa.RecordBatch] | Sequence[Mapping[str, Any]],
        *,
        timeout: float | None = None,
    ) -> list[GroupInfo]:
        """The ``asyncio`` twin of :meth:`put_many`."""
        return await asyncio.to_thread(self.put_many, batches, timeout=timeout)

    async def put_async(
        self, batch: pa.RecordBatch | None = None, *, timeout: float | None = None, **group: Any
    ) -> GroupInfo:
        """The ``asyncio`` twin of :meth:`put` (same implementation, run off the event loop)."""
        return await asyncio.to_thread(self.put, batch, timeout=timeout, **group)


def _charged(nbytes: int, reserved: int) -> int:
    """What a stored group is charged: its encoded bytes, which its reservation bounds.

    Raises:
        InvalidRequestError: the bound was short (a bug of :mod:`trajflight._sizing`): nothing is stored,
            and the partition expires unused.
    """
    if nbytes > reserved:
        raise InvalidRequestError(
            f"the group encoded to {nbytes} bytes, more than the {reserved} reserved for it from its inputs: "
            "a bug of trajflight's reservation bound (trajflight._sizing); please report it with the "
            "inputs' types, and pass the group as an encoded record batch meanwhile"
        )
    return nbytes


def _capacity_wait(exc: CapacityExceededError, deadline: float) -> float:
    """Seconds to wait before asking for capacity again, as ``exc`` hints; raise if past ``deadline``."""
    wait = _retry_after(exc)
    if time.monotonic() + wait > deadline:
        raise _refused_until_deadline(exc) from exc
    return wait


def _retry_after(exc: CapacityExceededError) -> float:
    return float(getattr(exc, "retry_after", 1.0) or 1.0)


def _refused_until_deadline(exc: CapacityExceededError) -> CapacityExceededError:
    """The refusal a put raises when capacity stayed full until its deadline (the job's hint kept)."""
    return CapacityExceededError(
        f"{exc.message} (waited until the put's deadline; retry later or raise capacity)",
        retry_after=_retry_after(exc),
    )


def _policy_version(batch: pa.RecordBatch, default: int) -> int:
    """The oldest weights version of a group's samples (``default`` without the column)."""
    if "policy_version" not in batch.schema.names or batch.num_rows == 0:
        return default
    column = batch.column("policy_version")
    if column.null_count:
        return int(pa.compute.min(column).as_py())
    return int(column.to_numpy(zero_copy_only=False).min())


def _group_figures(encoded: EncodedGroups, default: int) -> list[tuple[int, int]] | None:
    """Per group, (response tokens, oldest policy version) of groups encoded together, read from their
    joined batch at once rather than group by group (as :func:`_tokens_of` and :func:`_policy_version`
    read one); ``None`` where a group has no rows or the versions hold nulls, to read them group by group."""
    rows = np.asarray(encoded.rows, dtype=np.int64)
    if not len(rows) or not rows.all():
        return None
    joined = encoded.joined
    names = joined.schema.names
    bounds = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(rows, out=bounds[1:])
    tokens = [0] * len(rows)
    if "response_ids" in names:
        offsets = joined.column("response_ids").offsets.to_numpy(zero_copy_only=False)
        tokens = np.diff(offsets[bounds]).tolist()
    versions = [default] * len(rows)
    if "policy_version" in names:
        column = joined.column("policy_version")
        if column.null_count:
            return None
        versions = np.minimum.reduceat(column.to_numpy(zero_copy_only=False), bounds[:-1]).tolist()
    return list(zip(tokens, versions, strict=True))
