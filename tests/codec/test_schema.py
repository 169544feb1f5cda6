from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trajflight.codec import STANDARD_SCHEMA, TrajectorySchema
from trajflight.codec._schema import _GROUP_SCHEMAS_CACHE, _RECENT_CACHE
from trajflight.errors import SchemaError


def test_standard_schema_has_the_design_columns_and_types():
    s = STANDARD_SCHEMA
    assert s.field("response_ids").type == pa.list_(pa.int32())
    assert s.field("loss_mask").type == pa.list_(pa.uint8())  # not bool: bool has no DLPack export
    assert s.field("top_p_probs").type == pa.list_(pa.list_(pa.float32()))
    assert s.field("finish_reason").type == pa.dictionary(pa.int8(), pa.string())
    assert s.field("advantage").nullable
    assert "advantage" not in s.required
    assert {"job_id", "epoch", "group_id", "sample_index", "response_ids", "reward"} <= s.required


def test_extend_returns_a_new_schema_and_leaves_the_standard_one_alone():
    extended = STANDARD_SCHEMA.extend(("ref_logprobs", pa.list_(pa.float32())), pa.field("tag", pa.string()))
    assert "ref_logprobs" in extended
    assert "ref_logprobs" not in STANDARD_SCHEMA
    assert extended.names[-2:] == ("ref_logprobs", "tag")
    required = STANDARD_SCHEMA.extend(("score", pa.float64()), required=True)
    assert "score" in required.required


def test_extend_refuses_a_duplicate_name():
    with pytest.raises(SchemaError, match="declared twice"):
        STANDARD_SCHEMA.extend(("reward", pa.float64()))


def test_unknown_field_lookup_says_how_to_declare_it():
    with pytest.raises(SchemaError, match=r"schema.extend") as info:
        STANDARD_SCHEMA.field("nope")
    assert info.value.column == "nope"


def test_check_names_missing_and_mistyped_columns():
    arrow = STANDARD_SCHEMA.arrow
    with pytest.raises(SchemaError, match="'reward' is missing") as info:
        STANDARD_SCHEMA.check(arrow.remove(arrow.get_field_index("reward")))
    assert info.value.column == "reward"
    bad = arrow.set(arrow.get_field_index("reward"), pa.field("reward", pa.float64()))
    with pytest.raises(SchemaError, match="'reward' has type double"):
        STANDARD_SCHEMA.check(bad)


def test_telemetry_accepts_any_struct_until_declared():
    assert STANDARD_SCHEMA.accepts("telemetry", pa.struct([("ms", pa.float64())]))
    declared = STANDARD_SCHEMA.with_telemetry(pa.struct([("ms", pa.float32())]))
    assert not declared.accepts("telemetry", pa.struct([("ms", pa.float64())]))
    mistyped = STANDARD_SCHEMA.arrow.append(pa.field("x", pa.int8())).set(
        STANDARD_SCHEMA.arrow.get_field_index("telemetry"),
        pa.field("telemetry", pa.struct([("ms", pa.float64())])),
    )
    with pytest.raises(SchemaError, match="telemetry"):
        declared.check(mistyped)
    with pytest.raises(SchemaError, match="struct"):
        STANDARD_SCHEMA.with_telemetry(pa.int32())  # type: ignore[arg-type]


def test_job_id_may_be_dictionary_encoded():
    assert STANDARD_SCHEMA.accepts("job_id", pa.dictionary(pa.int32(), pa.string()))
    assert not STANDARD_SCHEMA.accepts("job_id", pa.int64())


def test_a_schema_requiring_an_undeclared_column_is_refused():
    with pytest.raises(SchemaError, match="not declared"):
        TrajectorySchema((pa.field("a", pa.int32()),), frozenset({"b"}))


@st.composite
def arrow_schemas(draw: st.DrawFn) -> pa.Schema:
    """Standard-ish Arrow schemas: some columns dropped or retyped, nullability and metadata shuffled."""
    fields = []
    for f in STANDARD_SCHEMA.fields:
        if draw(st.integers(0, 9)) == 0:
            continue  # dropped: refused if required
        type_ = f.type
        if draw(st.integers(0, 9)) == 0:
            type_ = draw(st.sampled_from([pa.float64(), pa.large_list(pa.int32()), pa.string()]))
        metadata = {b"note": draw(st.sampled_from([b"a", b"b"]))} if draw(st.booleans()) else None
        fields.append(pa.field(f.name, type_, nullable=draw(st.booleans()), metadata=metadata))
    if draw(st.booleans()):
        fields.reverse()
    return pa.schema(fields, metadata={b"run": b"1"} if draw(st.booleans()) else None)


def _check_outcome(schema: TrajectorySchema, arrow: pa.Schema) -> Any:
    try:
        schema.check(arrow)
    except SchemaError as exc:
        return (str(exc), exc.column)
    return "accepted"


@settings(max_examples=200, deadline=None)
@given(st.lists(arrow_schemas(), min_size=1, max_size=12))
def test_check_remembers_accepted_schemas_without_changing_any_verdict(arrows):
    """Remembered schemas are found by equality (new but equal objects, other metadata); verdicts hold."""
    remembering = TrajectorySchema(STANDARD_SCHEMA.fields, STANDARD_SCHEMA.required)
    for arrow in arrows + arrows[::-1]:
        copy = pa.schema(list(arrow), metadata=arrow.metadata)  # an equal schema, another object
        fresh = TrajectorySchema(STANDARD_SCHEMA.fields, STANDARD_SCHEMA.required)
        assert _check_outcome(remembering, copy) == _check_outcome(fresh, arrow)
    assert len(remembering._recent.get("check", ())) <= _RECENT_CACHE


def test_check_remembers_a_bounded_number_of_schemas():
    """The memo hangs off the schema and stays bounded (issue 15 dropped its second, hashed level)."""
    schema = STANDARD_SCHEMA.extend()
    for i in range(_RECENT_CACHE + 3):
        schema.check(STANDARD_SCHEMA.arrow.append(pa.field(f"user_{i}", pa.int8())))
    assert len(schema._recent["check"]) == _RECENT_CACHE
    schema.check(STANDARD_SCHEMA.arrow.append(pa.field("user_0", pa.int8())))  # forgotten: checked again
    assert schema._recent["check"][0][0].names[-1] == "user_0"
    assert len(schema._recent["check"]) == _RECENT_CACHE
    assert "check" not in STANDARD_SCHEMA.extend()._recent  # each schema its own memo


def test_group_schemas_are_remembered_per_schema_and_bounded():
    """encode_group's Arrow schemas per column layout live on the schema, at most a bounded number."""
    schema = STANDARD_SCHEMA.extend()
    names = [f.name for f in STANDARD_SCHEMA.fields if f.name in STANDARD_SCHEMA.required]
    types = [STANDARD_SCHEMA.field(n).type for n in names]
    first = schema._group_schema(names, types)
    assert schema._group_schema(names, types) is first
    for i in range(_GROUP_SCHEMAS_CACHE + 3):
        schema._group_schema([*names, f"user_{i}"], [*types, pa.int8()])
    assert len(schema._group_schemas) <= _GROUP_SCHEMAS_CACHE
    assert not STANDARD_SCHEMA.extend()._group_schemas


def test_a_schema_no_longer_used_is_freed_after_encoding_and_validating():
    """issue 15: module-global memo tables (``_encode._BY_NAMES``/``_SCHEMAS`` keyed by ``id(schema)``,
    ``_validate._PLANS``) held every schema they met, with its Arrow schemas, until they filled up; the
    memos now hang off the schema and go with it."""
    import gc

    import numpy as np

    from trajflight.codec import encode_group, validate_group

    schema = STANDARD_SCHEMA.extend(("leak_probe", pa.float64()))
    batch = encode_group(
        job_id="j",
        epoch=0,
        group_id=1,
        prompt_ids=np.arange(3, dtype=np.int32),
        response_ids=[[1, 2], [3]],
        response_logprobs=[[-0.5, -0.5], [-1.0]],
        reward=[1.0, 0.0],
        extra={"leak_probe": [0.5, 0.25]},
        schema=schema,
    )
    validate_group(batch, schema)
    del schema, batch
    gc.collect()
    alive = [o for o in gc.get_objects() if type(o) is TrajectorySchema and "leak_probe" in o]
    assert alive == []
