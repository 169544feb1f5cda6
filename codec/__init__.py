"""trajflight.codec: trajectory groups <-> Arrow record batches, and Arrow -> torch/numpy via DLPack.

Pure conversion: no I/O, no threads. torch is imported lazily, on the first call that needs it.
"""

from __future__ import annotations

from trajflight.codec._schema import STANDARD_SCHEMA, TrajectorySchema
from trajflight.codec._validate import GroupKey, validate_group

__all__ = ["STANDARD_SCHEMA", "GroupKey", "TrajectorySchema", "validate_group"]
