"""trajflight.codec: trajectory groups <-> Arrow record batches, and Arrow -> torch/numpy via DLPack.

Pure conversion: no I/O, no threads. torch is imported lazily, by the calls that need it.

* :data:`STANDARD_SCHEMA` / :class:`TrajectorySchema`: the columns of a group, extensible.
* :func:`encode_group`: what rollout code holds -> one ``pyarrow.RecordBatch`` per group.
* :func:`encode_groups` / :class:`EncodedGroups`: many groups -> one joined record batch (one copy), each
  group a zero-copy slice of it, with its rows and stored bytes.
* :func:`with_partitions`: groups encoded elsewhere, their key columns set to the partitions they were
  granted.
* :func:`decode` / :func:`decode_numpy`: one or many groups -> torch tensors / numpy arrays.
* :func:`validate_group`: typed checks of data that comes from outside; :func:`validate_groups` the same
  of many groups at once.
"""

from __future__ import annotations

from trajflight.codec._containers import DoublyRagged, NumpyBatch, Padded, Ragged, TorchBatch
from trajflight.codec._decode import Layout, decode, decode_numpy
from trajflight.codec._encode import default_sample_ids, encode_group
from trajflight.codec._encode_many import EncodedGroups, encode_groups
from trajflight.codec._partitions import with_partitions
from trajflight.codec._schema import STANDARD_SCHEMA, TrajectorySchema
from trajflight.codec._validate import validate_group
from trajflight.codec._validate_many import validate_groups

__all__ = [
    "STANDARD_SCHEMA",
    "DoublyRagged",
    "EncodedGroups",
    "Layout",
    "NumpyBatch",
    "Padded",
    "Ragged",
    "TorchBatch",
    "TrajectorySchema",
    "decode",
    "decode_numpy",
    "default_sample_ids",
    "encode_group",
    "encode_groups",
    "validate_group",
    "validate_groups",
    "with_partitions",
]
