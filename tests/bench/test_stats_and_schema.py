"""The benchmark's own arithmetic: medians and spreads, percentiles, peak memory, the schema validator."""

from __future__ import annotations

import os

import pytest

from trajflight.bench._schema import SchemaViolation, validate
from trajflight.bench._stats import PeakMemory, Stats, percentile


def test_stats_of_repeated_measurements() -> None:
    s = Stats.of([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.min, s.max, s.n) == (2.5, 1.0, 10.0, 4)
    assert s.q1 <= s.median <= s.q3


def test_stats_of_one_measurement_and_of_none() -> None:
    assert Stats.of([4.0]) == Stats(4.0, 4.0, 4.0, 4.0, 4.0, 1)
    with pytest.raises(ValueError, match="no measurement"):
        Stats.of([])


def test_percentiles_interpolate_between_ranks() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0


def test_peak_memory_sees_an_allocation_that_is_freed_again() -> None:
    with PeakMemory([os.getpid()]) as probe:
        block = bytearray(64 << 20)  # touched: bytearray zero-fills
        del block
    assert probe.peak > 0
    assert probe.growth >= 32 << 20


@pytest.mark.parametrize(
    ("schema", "document", "message"),
    [
        ({"type": "integer"}, True, "expected integer"),
        ({"type": "number", "exclusiveMinimum": 0}, 0, "is not > 0"),
        ({"type": "object", "required": ["a"]}, {}, "missing required 'a'"),
        ({"type": "object", "additionalProperties": False}, {"b": 1}, "unexpected property 'b'"),
        ({"enum": ["ok"]}, "bad", "not one of"),
        ({"type": "array", "items": {"type": "string"}}, ["x", 1], r"\$\[1\]"),
    ],
)
def test_validator_names_the_first_mismatch(schema: dict, document: object, message: str) -> None:
    with pytest.raises(SchemaViolation, match=message):
        validate(document, schema)


def test_validator_follows_local_refs() -> None:
    schema = {"$defs": {"pos": {"type": "number", "minimum": 1}}, "type": "object",
              "properties": {"x": {"$ref": "#/$defs/pos"}}}  # fmt: skip
    validate({"x": 2}, schema)
    with pytest.raises(SchemaViolation, match=r"\$\.x"):
        validate({"x": 0}, schema)
