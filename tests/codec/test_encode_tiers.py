"""encode_group's cheap tier against its precise one: the same batch, buffer for buffer, and the same error.

encode_group wraps known-good numpy memory with ``pa.Array.from_buffers`` and lets Arrow's own offset
validation accept it (the ``_fast_*`` builders of codec/_arrays.py); where they are not sure they step
aside and the precise builders (numpy checks, ``pyarrow.array``) build the column or word the error. The
float checks of integer columns given as Python lists have tiers too (codec/_pylists.py): a cheap proof
that the values are Python ints, then the set of their types. These tests generate groups in every
accepted input form (lists, per-sample arrays and tensors, (values, offsets) with int32 or int64 offsets
not starting at 0, Ragged, Padded, nested and 2-D tensors, pyarrow arrays; other dtypes to convert; empty
responses, K=0 and K=1, a shared flat prompt, nulls in advantage, top-p candidates, user columns), valid
and broken, and compare encode_group with the same call forced onto the precise tier alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ragged_forms import as_form

from trajflight import workload
from trajflight.codec import (
    STANDARD_SCHEMA,
    DoublyRagged,
    Padded,
    Ragged,
    _arrays,
    _encode,
    _pylists,
    encode_group,
)
from trajflight.errors import SchemaError

from .test_errors import BAD_INPUTS

TOKEN = st.integers(-(2**31), 2**31 - 1)
F32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
USER_SCHEMA = STANDARD_SCHEMA.extend(("ref_logprobs", pa.list_(pa.float32())), ("score", pa.float64()))
FORMS = [
    "lists",
    "arrays",
    "tensors",
    "tuple",
    "tuple-int64",
    "tuple-sliced",
    "Ragged",
    "Ragged-torch",
    "nested",
    "padded",
    "padded-torch",
    "2d",
    "pyarrow",
]


@contextmanager
def _precise_only() -> Iterator[None]:
    """encode_group with every cheap builder stepping aside (each ``_fast_*`` returns None), and the cheap
    proof that integer values are Python ints never sure."""
    with ExitStack() as stack:
        for module in (_arrays,):
            for name in dir(module):
                if name.startswith("_fast_"):
                    stack.enter_context(mock.patch.object(module, name, return_value=None))
        stack.enter_context(mock.patch.object(_encode, "ragged_columns_agree", return_value=False))
        stack.enter_context(mock.patch.object(_pylists, "_python_ints", return_value=False))
        yield


def input_memory(obj: Any, out: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(address, bytes) of every numpy array and tensor among the inputs, to tell aliased buffers apart."""
    if isinstance(obj, np.ndarray):
        out.append((obj.ctypes.data, obj.nbytes))
    elif isinstance(obj, torch.Tensor):
        for t in (obj.values(), obj.offsets()) if obj.is_nested else (obj,):
            out.append((t.data_ptr(), t.numel() * t.element_size()))
    elif isinstance(obj, Ragged | Padded | DoublyRagged):
        for name in obj.__dataclass_fields__:
            input_memory(getattr(obj, name), out)
    elif isinstance(obj, list | tuple):
        for item in obj:
            input_memory(item, out)
    elif isinstance(obj, dict):
        for item in obj.values():
            input_memory(item, out)
    return out


def _layout(array: pa.Array, inputs: list[tuple[int, int]]) -> list[Any]:
    """Type, length, offset and null count per level, and each buffer: absent, or its size and whether
    (and where) it aliases an input; the addresses of fresh allocations are left out."""
    out: list[Any] = [(str(array.type), len(array), array.offset, array.null_count)]
    for buffer in array.buffers():
        if buffer is None or buffer.size == 0:
            out.append(None if buffer is None else "empty")
            continue
        address = buffer.address
        hits = [("input", i, address - at) for i, (at, n) in enumerate(inputs) if at <= address < at + n]
        out.append((buffer.size, hits[0] if hits else "fresh"))
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        out.append(_layout(array.values, inputs))
    elif pa.types.is_dictionary(array.type):
        out.append(_layout(array.dictionary, inputs))
    return out


def _outcome(kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], pa.RecordBatch | None]:
    """What encode_group makes of ``kwargs``: the error, or the batch described buffer by buffer."""
    try:
        batch = encode_group(**kwargs)
    except SchemaError as exc:
        return ("SchemaError", str(exc), exc.column, exc.row), None
    except Exception as exc:  # none is expected (every refusal is a SchemaError), but it must match too
        return (type(exc).__name__, str(exc)), None
    inputs = input_memory(kwargs, [])
    layout = [_layout(column, inputs) for column in batch.columns]
    return ("batch", batch.schema, batch.to_pydict() if batch.num_rows else {}, layout), batch


def _assert_same(kwargs: dict[str, Any]) -> pa.RecordBatch | None:
    """Both tiers give the same outcome; the batch (None for an error)."""
    cheap, batch = _outcome(kwargs)
    with _precise_only():
        precise, _ = _outcome(kwargs)
    assert cheap[:2] == precise[:2]
    if batch is not None:
        assert cheap[1].equals(precise[1], check_metadata=True)
        _assert_equal_with_nans(cheap[2], precise[2])
        assert cheap[3] == precise[3]
    return batch


def _assert_equal_with_nans(a: Any, b: Any) -> None:
    """``a == b``, where NaN equals NaN (logprobs may hold NaN; they are compared bit for bit elsewhere)."""
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return
    if isinstance(a, dict):
        assert isinstance(b, dict)
        assert a.keys() == b.keys()
        for key in a:
            _assert_equal_with_nans(a[key], b[key])
    elif isinstance(a, list):
        assert isinstance(b, list)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_equal_with_nans(x, y)
    else:
        assert a == b


def _scalars(draw: st.DrawFn, values: list[Any], dtypes: list[Any]) -> Any:
    form = draw(st.sampled_from(["list", "numpy", "tensor"]))
    if form == "list":
        return values
    array = np.array(values, dtype=draw(st.sampled_from(dtypes)))
    return torch.from_numpy(array) if form == "tensor" else array


@st.composite
def groups(draw: st.DrawFn) -> dict[str, Any]:
    """encode_group's keyword arguments for one valid group, in drawn input forms and dtypes."""
    k = draw(st.sampled_from([0, 1, 1, 2, 3, 5]))
    lengths = draw(st.lists(st.integers(0, 6), min_size=k, max_size=k))
    if k and draw(st.booleans()):
        lengths = [lengths[0]] * k  # equal lengths: the 2-D forms apply
    ids = [np.array(draw(st.lists(TOKEN, min_size=n, max_size=n)), dtype=np.int64) for n in lengths]
    logprobs = [np.array(draw(st.lists(F32, min_size=n, max_size=n)), dtype=np.float32) for n in lengths]
    form = draw(st.sampled_from(FORMS))
    junk = draw(st.integers(0, 3))
    kwargs: dict[str, Any] = {
        "job_id": draw(st.text(min_size=1, max_size=6)),
        "epoch": draw(st.integers(0, 2**63 - 1)),
        "group_id": draw(st.integers(0, 2**63 - 1)),
        "response_ids": as_form(ids, draw(st.sampled_from([np.int32, np.int64])), form, junk),
        "response_logprobs": as_form(logprobs, draw(st.sampled_from([np.float32, np.float64])), form, junk),
        "reward": _scalars(draw, draw(st.lists(F32, min_size=k, max_size=k)), [np.float32, np.float64]),
    }
    prompt = np.array(draw(st.lists(TOKEN, max_size=8)), dtype=np.int64)
    kwargs["prompt_ids"] = draw(
        st.sampled_from(
            [
                prompt.astype(np.int32),  # one flat prompt shared by the samples
                prompt,
                torch.from_numpy(prompt.astype(np.int32)),
                prompt.tolist(),
                [prompt[: i + 1].tolist() for i in range(k)],  # one prompt per sample
            ]
        )
    )
    mask = [np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))) for n in lengths]
    mask_dtype = draw(st.sampled_from([None, bool, np.uint8, np.int64]))
    if mask_dtype is not None:
        kwargs["loss_mask"] = as_form(mask, mask_dtype, draw(st.sampled_from(FORMS)), junk)
    if draw(st.booleans()):
        advantage = draw(st.lists(st.one_of(st.none(), F32), min_size=k, max_size=k))
        kwargs["advantage"] = (
            advantage if None in advantage or draw(st.booleans()) else np.array(advantage, dtype=np.float32)
        )
    if draw(st.booleans()):
        kwargs["policy_version"] = _scalars(
            draw, draw(st.lists(st.integers(0, 2**31 - 1), min_size=k, max_size=k)), [np.int64, np.int32]
        )
    else:
        kwargs["policy_version"] = draw(st.integers(0, 2**63 - 1))
    if draw(st.booleans()):
        kwargs["sample_ids"] = [f"s{i}" for i in range(k)]
    if draw(st.booleans()):
        counts = [draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)) for n in lengths]
        kwargs.update(_candidates(counts, shared=draw(st.booleans()), nested=draw(st.booleans())))
    if draw(st.booleans()):
        kwargs["extra"] = {
            "ref_logprobs": as_form(logprobs, np.float32, form, junk),
            "score": np.arange(k, dtype=np.float64),
        }
        kwargs["schema"] = USER_SCHEMA  # declared: a Ragged or tensor input's type is not inferred
    return kwargs


def _candidates(counts: list[list[int]], *, shared: bool, nested: bool) -> dict[str, Any]:
    """top_p_ids/top_p_probs with ``counts[sample][token]`` candidates, as lists or DoublyRagged."""
    if nested:
        return {
            "top_p_ids": [[list(range(c)) for c in row] for row in counts],
            "top_p_probs": [[[0.5] * c for c in row] for row in counts],
        }
    outer = np.concatenate([[0], np.cumsum([len(row) for row in counts])]).astype(np.int32)
    flat = [c for row in counts for c in row]
    inner = np.concatenate([[0], np.cumsum(flat)]).astype(np.int32)
    ids = np.arange(int(inner[-1]), dtype=np.int32)
    probs = np.full(int(inner[-1]), 0.5, dtype=np.float32)
    return {
        "top_p_ids": DoublyRagged(ids, outer, inner),
        "top_p_probs": DoublyRagged(probs, outer.copy(), inner if shared else inner.astype(np.int64)),
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups())
def test_cheap_and_precise_tiers_build_the_same_batch(kwargs: dict[str, Any]):
    batch = _assert_same(kwargs)
    if batch is None:  # refused alike (every drawn group is meant to be valid; the tiers must agree anyway)
        return
    # The key columns are built alike on both tiers (job id scalar kept between calls): check them as such.
    job, epoch, group = kwargs["job_id"], kwargs["epoch"], kwargs["group_id"]
    k = batch.num_rows
    assert batch.column("job_id").to_pylist() == [job] * k
    assert batch.column("epoch").to_pylist() == [epoch] * k
    assert batch.column("group_id").to_pylist() == [group] * k
    assert batch.column("sample_index").to_pylist() == list(range(k))
    ids = kwargs.get("sample_ids") or [f"{job}/{epoch}/{group}/{i}" for i in range(k)]
    assert batch.column("sample_id").to_pylist() == ids


def test_a_user_column_of_another_type_under_the_same_names_gets_its_own_schema(simple_group):
    """The Arrow schema is memoised by column names, then the types compared: a new type is not missed."""
    floats = encode_group(**simple_group, extra={"score": np.arange(3, dtype=np.float64)})
    ints = encode_group(**simple_group, extra={"score": np.arange(3, dtype=np.int64)})
    assert floats.schema.field("score").type == pa.float64()
    assert ints.schema.field("score").type == pa.int64()
    assert ints.column("score").to_pylist() == [0, 1, 2]


# One unusual or broken input each: the cheap tier steps aside; the precise one builds it or words the error.
_IDS = np.arange(11, dtype=np.int32)
_CANDIDATES = np.arange(12, dtype=np.int32)  # one candidate per token
_OFFSETS = np.array([0, 4, 4, 11], dtype=np.int32)
UNUSUAL: dict[str, dict[str, Any]] = {
    "offsets decrease": {"response_ids": (_IDS, np.array([0, 4, 3, 11], dtype=np.int32))},
    "first offset negative": {"response_ids": (_IDS, np.array([-1, 4, 4, 11], dtype=np.int32))},
    "last offset past the values": {"response_ids": (_IDS, np.array([0, 4, 4, 12], dtype=np.int32))},
    "int64 offsets past int32": {"response_ids": (_IDS, np.array([0, 4, 2**32 + 4, 11], dtype=np.int64))},
    "uint32 offsets": {"response_logprobs": (np.zeros(11, np.float32), _OFFSETS.astype(np.uint32))},
    "strided offsets": {"response_ids": (_IDS, np.repeat(_OFFSETS, 2)[::2])},
    "2-D values under offsets": {"response_ids": (_IDS[:10].reshape(5, 2), _OFFSETS)},
    "float token ids": {"response_ids": (_IDS.astype(np.float32), _OFFSETS)},
    "token id past int32": {"response_ids": (_IDS.astype(np.int64) * 2**31, _OFFSETS)},
    "mask of 2": {"loss_mask": (np.full(11, 2, np.int64), _OFFSETS)},
    "mask over 255": {"loss_mask": (np.full(11, 256, np.int64), _OFFSETS)},
    "reward of strings": {"reward": np.array(["a", "b", "c"])},
    "reward 2-D": {"reward": np.zeros((3, 1), np.float32)},
    "reward too short": {"reward": np.zeros(2, np.float32)},
    "reward as a 0-d array": {"reward": np.array(1.0, dtype=np.float32)},
    "policy version past int64": {"policy_version": 2**63},
    "policy version a bool": {"policy_version": True},
    "epoch past int64": {"epoch": 2**63},
    "a lone surrogate in the job id": {"job_id": "job\ud800"},
    "prompt past int32": {"prompt_ids": np.array([1, 2**40], dtype=np.int64)},
    "prompt of floats": {"prompt_ids": np.array([1.5, 2.0])},
    "top-p outer offsets decrease": {  # int64 outer offsets (np.array's default)
        "top_p_ids": DoublyRagged(np.zeros(11, np.int32), np.array([0, 5, 4, 11]), _CANDIDATES)
    },
    "top-p inner offsets past the values": {
        "top_p_ids": DoublyRagged(np.zeros(10, np.int32), _OFFSETS, _CANDIDATES)
    },
}


def _base() -> dict[str, Any]:
    return {
        "job_id": "job",
        "epoch": 1,
        "group_id": 2,
        "prompt_ids": np.arange(5, dtype=np.int32),
        "response_ids": (_IDS, _OFFSETS),
        "response_logprobs": (np.zeros(11, np.float32), _OFFSETS),
        "reward": np.zeros(3, np.float32),
    }


@pytest.mark.parametrize("overrides", UNUSUAL.values(), ids=list(UNUSUAL))
def test_an_unusual_input_gives_the_precise_tiers_outcome(overrides):
    _assert_same({**_base(), **overrides})


@pytest.mark.parametrize(
    ("overrides", "column"), [(c[1], c[2]) for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_the_bad_input_table_gives_the_same_error_on_both_tiers(simple_group, overrides, column):
    kwargs = {**simple_group, **overrides}
    with pytest.raises(SchemaError) as cheap:
        encode_group(**kwargs)
    with _precise_only(), pytest.raises(SchemaError) as precise:
        encode_group(**kwargs)
    assert (str(cheap.value), cheap.value.column, cheap.value.row) == (
        str(precise.value),
        precise.value.column,
        precise.value.row,
    )
    assert cheap.value.column == column


def test_zero_rows_with_an_offset_past_the_values_is_refused():
    """Arrow does not bound the one offset of an empty list array; the cheap tier must not accept it."""
    kwargs = {
        **_base(),
        "response_ids": (_IDS[:10], np.array([11], dtype=np.int32)),
        "response_logprobs": [],
        "reward": [],
    }
    with pytest.raises(SchemaError, match=r"offsets span 11\.\.11 but there are 10 values"):
        encode_group(**kwargs)
    _assert_same(kwargs)


@contextmanager
def _precise_builders_forbidden() -> Iterator[None]:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a precise builder ran on contiguous inputs of the column's dtype")

    with ExitStack() as stack:
        for module, name in (
            (_arrays, "_offsets_int32"),
            (_arrays, "from_python"),
            (_encode, "check_ragged_lengths"),
            (_encode, "check_nulls"),
        ):
            stack.enter_context(mock.patch.object(module, name, refuse))
        yield


@pytest.mark.parametrize("top_p", [False, True], ids=["plain", "top_p"])
def test_the_standard_workload_takes_the_cheap_tier(top_p):
    """What keeps encode_group cheap per group: no numpy offset pass and no batch-level ragged check."""
    group = workload.make_workload(1, 8, seed=0, top_p=top_p)[0]
    with _precise_builders_forbidden():
        batch = group.encode("job", 1, policy_version=3)
    assert _arrays._fast_repeated_row(group.prompt, pa.int32(), 8, column="prompt_ids") is not None
    assert batch.column("response_ids").values.buffers()[1].address == group.response_values.ctypes.data
    assert batch.column("loss_mask").offsets.buffers()[1].address == group.response_offsets.ctypes.data
    assert batch.column("sample_index").to_pylist() == list(range(8))
    assert batch.column("sample_id").to_pylist() == [f"job/1/{group.group_id}/{i}" for i in range(8)]
    _assert_same(group.columns(job_id="job", epoch=1, group_id=group.group_id, policy_version=3))
