"""Reads spanning several servers: one stream per server, in parallel, under one deadline."""

from __future__ import annotations

import contextlib
import socket

import pyarrow as pa
import pytest
from flight_testkit import make_group, serving

from trajflight.errors import DeadlineExceededError, NotFoundError
from trajflight.flight_server import StorageClient, get_parallel
from trajflight.keys import Partition


def test_get_parallel_returns_one_table_per_server_in_request_order():
    with serving() as (_, left), serving() as (_, right):
        keys_l = [Partition("j", 0, g) for g in range(0, 4)]
        keys_r = [Partition("j", 0, g) for g in range(4, 8)]
        for key in keys_l:
            left.put_groups([(key, make_group(key))])
        for key in keys_r:
            right.put_groups([(key, make_group(key))])
        tables = get_parallel([(left, keys_l), (right, keys_r)], columns=["group_id", "response_ids"])
    assert [t.column("group_id").to_pylist()[::8] for t in tables] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    expected = pa.Table.from_batches([make_group(keys_r[0])]).column("response_ids").combine_chunks()
    assert tables[1].slice(0, 8).column("response_ids").combine_chunks().equals(expected)


def test_get_parallel_raises_the_first_error_in_request_order():
    with serving() as (_, left), serving() as (_, right):
        key = Partition("j", 0, 1)
        right.put_groups([(key, make_group(key))])
        with pytest.raises(NotFoundError):
            get_parallel([(left, [key]), (right, [key])])


def test_get_parallel_has_one_deadline_for_all_streams():
    with contextlib.ExitStack() as stack, serving() as (_, live):
        key = Partition("j", 0, 1)
        live.put_groups([(key, make_group(key))])
        silent = stack.enter_context(socket.socket())  # accepts TCP, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        dead = stack.enter_context(StorageClient(f"grpc://127.0.0.1:{silent.getsockname()[1]}"))
        with pytest.raises(DeadlineExceededError):
            get_parallel([(live, [key]), (dead, [key])], timeout=0.5)


def test_run_parallel_is_the_one_fan_out_results_in_order_first_error_after_all_ended():
    """One parallel-call helper for the transport and the face (issue 15 merged ``_in_parallel`` into
    it): results in call order, and the first error in call order once every call has ended."""
    import threading

    from trajflight.flight_server import run_parallel

    assert run_parallel([]) == []
    assert run_parallel([lambda: 7]) == [7]
    ended = threading.Event()

    def slow() -> int:
        ended.wait(10)
        return 2

    def fail() -> int:
        raise NotFoundError("first")

    def late() -> int:
        ended.set()
        raise DeadlineExceededError("second")

    with pytest.raises(NotFoundError, match="first"):
        run_parallel([slow, fail, late])
    assert ended.is_set()  # the last call ran although an earlier one failed
    assert run_parallel([lambda i=i: i * i for i in range(5)]) == [0, 1, 4, 9, 16]
