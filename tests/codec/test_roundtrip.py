"""Property-based round trips: input -> encode -> IPC (as over Flight) -> decode, bit-exact."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ragged_forms import as_form

from trajflight.codec import decode, decode_numpy, encode_group

F32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
TOKEN = st.integers(-(2**31), 2**31 - 1)
FORMS = ["lists", "arrays", "tensors", "tuple-sliced", "nested", "padded"]


@st.composite
def groups(draw: st.DrawFn) -> dict[str, Any]:
    k = draw(st.integers(0, 5))
    lengths = draw(st.lists(st.integers(0, 30), min_size=k, max_size=k))
    ids = [np.array(draw(st.lists(TOKEN, min_size=n, max_size=n)), dtype=np.int32) for n in lengths]
    logprobs = [np.array(draw(st.lists(F32, min_size=n, max_size=n)), dtype=np.float32) for n in lengths]
    form = draw(st.sampled_from(FORMS))
    # nested tensors need at least one row; fall back to lists for empty groups
    form = "lists" if form == "nested" and k == 0 else form
    junk = draw(st.integers(0, 3))
    nullable_f32 = st.one_of(st.none(), F32)
    return {
        "k": k,
        "ids": ids,
        "logprobs": logprobs,
        "kwargs": {
            "job_id": draw(st.text(min_size=1, max_size=8)),
            "epoch": draw(st.integers(0, 2**40)),
            "group_id": draw(st.integers(0, 2**40)),
            "prompt_ids": [draw(st.lists(TOKEN, max_size=6)) for _ in range(k)],
            "response_ids": as_form(ids, np.int32, form, junk, offsets_dtype=np.int64),
            "response_logprobs": as_form(logprobs, np.float32, form, junk, offsets_dtype=np.int64),
            "reward": np.array(draw(st.lists(F32, min_size=k, max_size=k)), dtype=np.float32),
            "advantage": draw(st.lists(nullable_f32, min_size=k, max_size=k)),
            "extra": {
                "tag": draw(st.lists(st.one_of(st.none(), st.text(max_size=5)), min_size=k, max_size=k)),
                "meta": pa.array(
                    [
                        {"turns": t, "tool": s}
                        for t, s in zip(
                            draw(st.lists(st.integers(0, 9), min_size=k, max_size=k)),
                            draw(st.lists(st.text(max_size=3), min_size=k, max_size=k)),
                            strict=True,
                        )
                    ],
                    pa.struct([("turns", pa.int64()), ("tool", pa.string())]),
                ),
                "label": pa.array(
                    draw(st.lists(st.sampled_from(["a", "b"]), min_size=k, max_size=k)), pa.string()
                ).dictionary_encode(),
                "spans": draw(
                    st.lists(
                        st.lists(st.lists(st.integers(-5, 5), max_size=3), max_size=3), min_size=k, max_size=k
                    )
                ),
            },
        },
    }


def _over_the_wire(batch: pa.RecordBatch) -> pa.RecordBatch:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return ipc.open_stream(sink.getvalue()).read_next_batch()


def _bits(values: np.ndarray) -> list[int]:
    return values.astype(np.float32).view(np.uint32).tolist()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups())
def test_round_trip_is_bit_exact(group):
    kwargs = group["kwargs"]
    batch = encode_group(**kwargs)
    received = _over_the_wire(batch)
    assert received.schema == batch.schema
    k = group["k"]
    assert received.num_rows == k

    arrays = decode_numpy(received, fill_nulls={"advantage": 0.0})
    ragged_ids = arrays.ragged["response_ids"]
    ragged_lp = arrays.ragged["response_logprobs"]
    for i in range(k):
        lo, hi = ragged_ids.offsets[i], ragged_ids.offsets[i + 1]
        assert ragged_ids.values[lo:hi].tolist() == group["ids"][i].tolist()
        assert _bits(ragged_lp.values[lo:hi]) == _bits(group["logprobs"][i])
    assert _bits(arrays.arrays["reward"]) == _bits(kwargs["reward"])

    tensors = decode(received, columns=["response_ids", "response_logprobs", "reward"])
    if k:
        for i, row in enumerate(tensors.tensors["response_logprobs"].unbind()):
            assert _bits(row.numpy()) == _bits(group["logprobs"][i])
    padded = decode(received, columns=["response_ids"], layout="padded").padded["response_ids"]
    assert padded.lengths.tolist() == [len(r) for r in group["ids"]]

    advantage = received.column("advantage").to_pylist()
    for got, want in zip(advantage, kwargs["advantage"], strict=True):
        assert (got is None) == (want is None)
        if want is not None:
            assert _bits(np.array([got])) == _bits(np.array([want]))
    extra = kwargs["extra"]
    assert received.column("tag").to_pylist() == extra["tag"]
    assert received.column("meta").to_pylist() == extra["meta"].to_pylist()
    assert received.column("label").to_pylist() == extra["label"].to_pylist()
    assert received.column("spans").to_pylist() == extra["spans"]
    assert received.column("prompt_ids").to_pylist() == kwargs["prompt_ids"]


def test_one_huge_response_round_trips():
    n = 2_000_000
    ids = np.arange(n, dtype=np.int32)
    logprobs = np.linspace(-10, 0, n, dtype=np.float32)
    logprobs[::1000] = np.nan
    logprobs[1::1000] = -np.inf
    offsets = np.array([0, 0, n], dtype=np.int32)
    batch = encode_group(
        job_id="big",
        epoch=0,
        group_id=0,
        prompt_ids=[7],
        response_ids=(ids, offsets),
        response_logprobs=(logprobs, offsets),
        reward=[0.0, 1.0],
    )
    received = _over_the_wire(batch)
    nested = decode(received, columns=["response_logprobs"]).tensors["response_logprobs"]
    assert nested.size(0) == 2
    assert np.array_equal(nested.values().numpy().view(np.uint32), logprobs.view(np.uint32))
