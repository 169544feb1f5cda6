"""The error family: stable codes, structured fields that survive pickling (Ray)."""

from __future__ import annotations

import pickle

import pytest

from trajflight import errors


def _leaves() -> list[type[errors.TrajflightError]]:
    return [getattr(errors, name) for name in errors.__all__ if name.endswith("Error")]


@pytest.mark.parametrize("cls", _leaves(), ids=lambda c: c.__name__)
def test_codes_map_back_to_their_class(cls):
    assert errors.error_class_for_code(cls.code) is cls


def test_codes_are_unique():
    codes = [cls.code for cls in _leaves()]
    assert len(codes) == len(set(codes))


def test_unknown_codes_fall_back_to_the_root():
    assert errors.error_class_for_code("no-such-code") is errors.TrajflightError


def test_fields_survive_pickling():
    err = errors.SchemaError("column 'x' row 3 is bad", column="x", row=3)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is errors.SchemaError
    assert (back.column, back.row, str(back)) == ("x", 3, "column 'x' row 3 is bad")
    capacity = pickle.loads(pickle.dumps(errors.CapacityExceededError("full", retry_after=2.5)))
    assert capacity.retry_after == 2.5


def test_every_error_is_a_trajflight_error():
    assert all(issubclass(cls, errors.TrajflightError) for cls in _leaves())
    assert issubclass(errors.ConfigError, errors.InvalidRequestError)
