"""Human sizes and durations for configuration (``64MiB``, ``30s``).

Parsing is strict: an unknown unit or a negative value raises :class:`~trajflight.errors.ConfigError`
naming the setting, never a silent default.
"""

from __future__ import annotations

import re

from trajflight.errors import ConfigError

__all__ = ["format_size", "parse_duration", "parse_size"]

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_DURATION_UNITS = {"": 1.0, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: str | int | float, *, setting: str = "size") -> int:
    """Parse a byte size such as ``8GiB``, ``64MB`` or ``1024`` into an int number of bytes.

    Raises:
        ConfigError: the value is negative, not a number or has an unknown unit.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{setting}: expected a size such as '64MiB', got {value!r}", setting=setting)
    if isinstance(value, int | float):
        number, unit = float(value), ""
    else:
        match = _NUMBER_UNIT.match(value)
        if match is None:
            raise ConfigError(f"{setting}: expected a size such as '64MiB', got {value!r}", setting=setting)
        number, unit = float(match.group(1)), match.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise ConfigError(
            f"{setting}: unknown size unit {unit!r} in {value!r}; use B, KiB, MiB, GiB, TiB (or KB, MB, GB)",
            setting=setting,
        )
    if number < 0:
        raise ConfigError(f"{setting}: a size cannot be negative, got {value!r}", setting=setting)
    return int(number * _SIZE_UNITS[unit])


def parse_duration(value: str | int | float, *, setting: str = "duration") -> float:
    """Parse a duration such as ``30s``, ``250ms``, ``5m`` or ``1.5`` (seconds) into float seconds.

    Raises:
        ConfigError: the value is negative, not a number or has an unknown unit.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{setting}: expected a duration such as '30s', got {value!r}", setting=setting)
    if isinstance(value, int | float):
        number, unit = float(value), ""
    else:
        match = _NUMBER_UNIT.match(value)
        if match is None:
            raise ConfigError(f"{setting}: expected a duration such as '30s', got {value!r}", setting=setting)
        number, unit = float(match.group(1)), match.group(2).lower()
    if unit not in _DURATION_UNITS:
        raise ConfigError(
            f"{setting}: unknown duration unit {unit!r} in {value!r}; use ms, s, m or h", setting=setting
        )
    if number < 0:
        raise ConfigError(f"{setting}: a duration cannot be negative, got {value!r}", setting=setting)
    return number * _DURATION_UNITS[unit]


def format_size(num_bytes: float) -> str:
    """Format a byte count for people: ``format_size(3 * 2**20) == '3.0 MiB'``."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
