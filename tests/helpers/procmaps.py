"""What this process maps, from ``/proc/self/maps``: for tests that check decoded data aliases a mapping."""

from __future__ import annotations


def mapped_ranges(directory: str, *, name_part: str = "") -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of files under ``directory`` whose path has ``name_part``."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            if directory in line and name_part in line:
                lo, hi = line.split()[0].split("-")
                out.append((int(lo, 16), int(hi, 16)))
    return out


def inside(address: int, ranges: list[tuple[int, int]]) -> bool:
    """Whether ``address`` lies in one of ``ranges``."""
    return any(lo <= address < hi for lo, hi in ranges)
