"""The reservation a put asks for before it encodes: never less than what the encoded group is charged."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trajflight._sizing import keyed_bound, reservations
from trajflight.codec import Padded, encode_group, encode_groups, with_partitions
from trajflight.keys import Partition
from trajflight.workload import make_workload

JOB, EPOCH = "job-sizing", 3
GIDS = (0, 7, 2**63 - 1)  # the default sample ids grow with the group id's digits


def _charges(columns: dict[str, Any], job: str = JOB) -> tuple[int, int]:
    """The most ``columns`` are charged, put alone (any group id) and put with another group."""
    alone = max(
        encode_group(job_id=job, epoch=EPOCH, group_id=g, **columns).get_total_buffer_size() for g in GIDS
    )
    groups = [{**columns, "group_id": 2**63 - 1}, {**columns, "group_id": 5}]
    together = max(encode_groups(job_id=job, epoch=EPOCH, groups=groups).nbytes)
    return alone, together


def _assert_bounds(columns: dict[str, Any], job: str = JOB) -> tuple[int, int]:
    alone, together = _charges(columns, job)
    (one,) = reservations([columns], job_id=job, epoch=EPOCH)
    two = reservations([columns, columns], job_id=job, epoch=EPOCH)
    assert one >= alone
    assert min(two) >= together
    return one - alone, min(two) - together


def _workload(**more: Any) -> dict[str, Any]:
    (g,) = make_workload(1, 8, seed=1, response_median=64, top_p=True)
    return g.columns(policy_version=0, **more)


def _rows(g: Any, values: np.ndarray) -> list[np.ndarray]:
    return [values[a:b] for a, b in itertools.pairwise(g.response_offsets)]


def _forms() -> dict[str, Callable[[], dict[str, Any]]]:
    (g,) = make_workload(1, 8, seed=2, response_median=64)
    v, lp, off = g.response_values, g.logprobs, g.response_offsets
    pad = np.zeros((8, 100), np.int32)
    lengths = np.minimum(np.diff(off), 100)
    off64 = torch.from_numpy(off.astype(np.int64))
    return {
        "numpy (values, offsets)": lambda: _workload(),
        "python lists": lambda: {
            "prompt_ids": g.prompt.tolist(),
            "response_ids": [r.tolist() for r in _rows(g, v)],
            "response_logprobs": [r.tolist() for r in _rows(g, lp)],
            "reward": g.reward.tolist(),
            "policy_version": 0,
        },
        "per-sample arrays, per-sample versions": lambda: {
            "prompt_ids": [g.prompt] * 8,
            "response_ids": _rows(g, v),
            "response_logprobs": _rows(g, lp),
            "reward": g.reward,
            "policy_version": np.arange(8),
        },
        "other dtypes (converted)": lambda: {
            "prompt_ids": g.prompt.astype(np.int64),
            "response_ids": (v.astype(np.int64), off.astype(np.int64)),
            "response_logprobs": (lp.astype(np.float64), off),
            "loss_mask": (g.loss_mask.astype(bool), off),
            "reward": g.reward.astype(np.float64),
            "policy_version": 0,
        },
        "padded": lambda: {
            "prompt_ids": g.prompt,
            "response_ids": Padded(pad, lengths),
            "response_logprobs": Padded(pad.astype(np.float32), lengths),
            "reward": g.reward,
            "policy_version": 0,
        },
        "tensors": lambda: {
            "prompt_ids": torch.from_numpy(g.prompt),
            "response_ids": torch.nested.nested_tensor_from_jagged(torch.from_numpy(v), off64),
            "response_logprobs": torch.nested.nested_tensor_from_jagged(torch.from_numpy(lp), off64),
            "reward": torch.from_numpy(g.reward),
            "policy_version": 0,
        },
        "2-D arrays": lambda: {
            "prompt_ids": np.tile(g.prompt, (8, 1)),
            "response_ids": np.ones((8, 30), np.int32),
            "response_logprobs": np.ones((8, 30), np.float32),
            "reward": [1.0] * 8,
            "policy_version": 0,
        },
        "pyarrow arrays, chunked and cast": lambda: {
            "prompt_ids": pa.array([g.prompt.tolist()] * 8, pa.list_(pa.int64())),
            "response_ids": pa.array([[1, 2, 3]] * 20, pa.list_(pa.int32())).slice(5, 8),
            "response_logprobs": pa.chunked_array([pa.array([[0.1, 0.2, 0.3]] * 4)] * 2),
            "reward": pa.array([1.0] * 30, pa.float32()).slice(3, 8),
            "policy_version": pa.array(range(8)),
        },
        "optional columns": lambda: _workload(
            finish_reason=["stop", "length"] * 4,
            telemetry=[{"ttft_ms": 12.5, "engine": "vllm", "steps": 3}] * 8,
            sample_ids=[f"sample-{i}" for i in range(8)],
            advantage=[None, 1.0] * 4,
        ),
        "telemetry as columns": lambda: _workload(
            telemetry={"ttft": np.arange(8, dtype=np.float32), "engine": ["a"] * 8}
        ),
        "python top-p candidates": lambda: {
            "prompt_ids": [1, 2],
            "response_ids": [[1, 2]] * 8,
            "response_logprobs": [[0.1, 0.2]] * 8,
            "reward": [0.0] * 8,
            "policy_version": 0,
            "top_p_ids": [[[1, 2], [3]]] * 8,
            "top_p_probs": [[[0.5, 0.5], [1.0]]] * 8,
        },
        "user columns": lambda: _workload(
            extra={
                "ref": (lp, off),
                "tag": "x",
                "score": list(range(8)),
                "emb": np.ones((8, 4), np.float16),
                "names": ["a" * i for i in range(8)],
                "nested": [{"a": [1, 2], "b": "q"}] * 8,
                "maybe": [None, 1.0] * 4,
                "flag": np.array([True] * 8),
                "tensor": pa.FixedShapeTensorArray.from_numpy_ndarray(np.ones((8, 2, 2), np.float32)),
            }
        ),
        "zero samples": lambda: {
            "prompt_ids": [],
            "response_ids": [],
            "response_logprobs": [],
            "reward": [],
            "policy_version": 0,
        },
        "empty responses": lambda: {
            "prompt_ids": [1],
            "response_ids": [[]] * 3,
            "response_logprobs": [[]] * 3,
            "reward": [0.0] * 3,
            "policy_version": 0,
        },
    }


FORMS = _forms()


@pytest.mark.parametrize("form", FORMS)
def test_a_reservation_covers_the_encoded_group_alone_and_with_others(form: str) -> None:
    _assert_bounds(FORMS[form]())


def test_a_reservation_covers_a_job_id_of_any_characters() -> None:
    _assert_bounds(_workload(), job="ジョブ-ü" * 5)


def test_numpy_inputs_are_reserved_within_a_few_bytes_a_sample() -> None:
    """Exact but for validity bitmaps, offsets shared by columns and the default ids' longest group id."""
    for samples in (1, 8, 16):
        groups = make_workload(3, samples, seed=3, response_median=256)
        for g in groups:
            columns = g.columns(policy_version=0)
            batch = encode_group(job_id=JOB, epoch=EPOCH, group_id=2**63 - 1, **columns)
            (one,) = reservations([columns], job_id=JOB, epoch=EPOCH)
            assert 0 <= one - batch.get_total_buffer_size() <= 16 * samples + 64


def test_groups_encoded_together_are_each_reserved_the_dictionary_they_share() -> None:
    """encode_groups gives the groups one dictionary per column and charges each group all of it."""
    (g,) = make_workload(1, 1, seed=4, response_median=8)
    reasons = [f"reason-{i:03d}" for i in range(60)]
    groups = [g.columns(policy_version=0, finish_reason=[r]) for r in reasons]
    encoded = encode_groups(
        job_id=JOB, epoch=EPOCH, groups=[{**c, "group_id": i} for i, c in enumerate(groups)]
    )
    reserved = reservations(groups, job_id=JOB, epoch=EPOCH)
    assert all(r >= n for r, n in zip(reserved, encoded.nbytes, strict=True))


def test_a_batch_given_encoded_is_reserved_what_its_keys_become() -> None:
    (g,) = make_workload(1, 8, seed=5, response_median=64)
    bare = g.encode("other-job", 1).drop_columns(["job_id", "epoch", "group_id"])
    keyed = with_partitions(bare, [Partition("a-much-longer-job-id-than-before", 9, 2**63 - 1)])
    bound = keyed_bound(bare.get_total_buffer_size(), bare.num_rows, "a-much-longer-job-id-than-before")
    assert bound >= keyed.get_total_buffer_size()


_lengths = st.lists(st.integers(0, 40), min_size=0, max_size=9)


@settings(max_examples=60, deadline=None)
@given(
    lengths=_lengths, form=st.sampled_from(["lists", "arrays", "pairs", "pairs64"]), gid=st.sampled_from(GIDS)
)
def test_ragged_shapes_of_every_form_are_covered(lengths: list[int], form: str, gid: int) -> None:
    rng = np.random.default_rng(len(lengths))
    rows = [rng.integers(0, 1000, n).astype(np.int32) for n in lengths]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = np.concatenate(rows) if rows else np.zeros(0, np.int32)
    if form == "lists":
        ragged: Any = [r.tolist() for r in rows]
        floats: Any = [r.astype(np.float32).tolist() for r in rows]
    elif form == "arrays":
        ragged, floats = rows, [r.astype(np.float32) for r in rows]
    else:
        dtype = np.int64 if form == "pairs64" else np.int32
        ragged = (values.astype(dtype), offsets.astype(dtype))
        floats = (values.astype(np.float32), offsets)
    columns = {
        "prompt_ids": [[1, 2, 3]] * len(lengths),
        "response_ids": ragged,
        "response_logprobs": floats,
        "reward": np.zeros(len(lengths), np.float32),
        "policy_version": 0,
    }
    batch = encode_group(job_id=JOB, epoch=EPOCH, group_id=gid, **columns)
    (one,) = reservations([columns], job_id=JOB, epoch=EPOCH)
    assert one >= batch.get_total_buffer_size()
    if lengths:
        encoded = encode_groups(job_id=JOB, epoch=EPOCH, groups=[{**columns, "group_id": gid}])
        assert one >= encoded.nbytes[0]
