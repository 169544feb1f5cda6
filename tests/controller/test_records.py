"""Records: configuration parsing and validation, and the frozen values the ledger hands out."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from trajflight.controller import GroupState, JobConfig, Partition
from trajflight.errors import ConfigError


def test_config_is_frozen_and_picklable():
    cfg = JobConfig.from_mapping({"capacity_bytes": "8GiB", "default_lease_ttl": "1m"})
    assert cfg.default_lease_ttl == 60.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.grant_ttl = 1.0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_config_error_survives_pickling_with_its_setting():
    with pytest.raises(ConfigError) as err:
        JobConfig(max_groups_per_lease=-1)
    again = pickle.loads(pickle.dumps(err.value))
    assert type(again) is ConfigError
    assert again.setting == "max_groups_per_lease"


@pytest.mark.parametrize("bad", [True, 1.5, "3"])
def test_config_rejects_wrong_types(bad):
    with pytest.raises(ConfigError, match="max_staleness"):
        JobConfig(max_staleness=bad)


def test_difference_names_the_first_differing_setting():
    assert JobConfig().difference(JobConfig()) is None
    assert JobConfig().difference(JobConfig(grant_ttl=1.0)) == "grant_ttl"


def test_partition_and_state_values():
    assert Partition("j", 1, 2) == ("j", 1, 2)
    assert GroupState("UNKNOWN") is GroupState.UNKNOWN
