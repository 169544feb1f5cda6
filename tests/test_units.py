from __future__ import annotations

import pytest

from trajflight.errors import ConfigError
from trajflight.units import format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GiB", 8 * 2**30),
        ("64MiB", 64 * 2**20),
        ("1.5 KiB", 1536),
        ("10MB", 10**7),
        ("512", 512),
        (4096, 4096),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("30s", 30.0), ("250ms", 0.25), ("5m", 300.0), ("1h", 3600.0), (2, 2.0)]
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["8 parsecs", "-1GiB", "lots", True])
def test_bad_sizes_name_the_setting(bad):
    with pytest.raises(ConfigError, match="capacity") as info:
        parse_size(bad, setting="capacity")
    assert info.value.setting == "capacity"


@pytest.mark.parametrize("bad", ["3 fortnights", "-2s", ""])
def test_bad_durations_name_the_setting(bad):
    with pytest.raises(ConfigError, match="ttl"):
        parse_duration(bad, setting="ttl")


def test_format_size():
    assert format_size(512) == "512 B"
    assert format_size(3 * 2**20) == "3.0 MiB"
