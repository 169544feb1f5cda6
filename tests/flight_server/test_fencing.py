"""Fencing enforced by the server itself: epochs per job, lease generations per group, roles."""

from __future__ import annotations

import pyarrow as pa
import pytest
from flight_testkit import make_group, serving

from trajflight.auth import Keyring
from trajflight.errors import (
    AlreadyExistsError,
    AuthenticationError,
    PermissionDeniedError,
    SchemaError,
    StaleFenceError,
)
from trajflight.flight_server import GroupRead, LeaseToken, StorageClient
from trajflight.keys import Partition

KEY = Partition("job-a", 1, 5)
SECRET = "k1:0123456789abcdef0123456789abcdef"


def _ref(values: float = 0.5, n: int = 8) -> pa.Table:
    return pa.table({"ref_logprob": pa.array([values] * n, pa.float32())})


def test_put_under_a_fenced_epoch_is_refused_by_the_server():
    old = Partition("job-a", 0, 1)
    with serving() as (_, client):
        assert client.fence("job-a", 1)["min_epoch"] == 1
        with pytest.raises(StaleFenceError, match="epoch 0 of job 'job-a' is fenced") as info:
            client.put_groups([(old, make_group(old))])
        assert (info.value.min_epoch, info.value.epoch) == (1, 0)
        client.put_groups([(KEY, make_group(KEY))])  # the new incarnation writes
        other_job = Partition("job-b", 0, 1)
        client.put_groups([(other_job, make_group(other_job))])  # fences are per job


def test_fences_only_move_forward_and_purge_gives_bytes_back():
    old = Partition("job-a", 0, 1)
    with serving() as (_, client):
        client.put_groups([(old, make_group(old))])
        client.fence("job-a", 2)
        assert client.fence("job-a", 1)["min_epoch"] == 2
        assert client.stats()["groups"] == 1  # fenced data stays until purged or deleted
        result = client.fence("job-a", 2, purge=True)
        assert result["purged_groups"] == 1
        assert result["bytes_freed"] > 0
        assert client.stats()["bytes"] == 0


def test_reads_with_a_stale_token_are_refused_and_newer_reads_raise_the_fence():
    with serving() as (_, client):
        client.put_groups([(KEY, make_group(KEY))])
        client.get([GroupRead(KEY, LeaseToken(1))])
        client.get([GroupRead(KEY, LeaseToken(2))])  # a re-grant reads: generation 2 is now the highest
        with pytest.raises(StaleFenceError, match="generation 1 is older than generation 2") as info:
            client.get([GroupRead(KEY, LeaseToken(1))])
        assert (info.value.generation, info.value.highest) == (1, 2)
        assert client.get([KEY]).num_rows == 8  # tokenless reads (analysts) stay open


def test_delete_needs_a_token_no_older_than_the_highest_seen():
    with serving() as (_, client):
        client.put_groups([(KEY, make_group(KEY))])
        client.advance_generation([GroupRead(KEY, LeaseToken(4))])
        with pytest.raises(StaleFenceError, match="needs the holder's lease token"):
            client.delete([GroupRead(KEY)])
        with pytest.raises(StaleFenceError, match="generation 3 is older"):
            client.delete([GroupRead(KEY, LeaseToken(3))])
        assert client.stats()["groups"] == 1
        assert client.delete([GroupRead(KEY, LeaseToken(4))])["deleted"] == 1
        again = client.delete([GroupRead(KEY, LeaseToken(4))])  # idempotent for the GC's retries
        assert again["deleted"] == 0
        assert again["missing"][0]["group_id"] == KEY.group_id
        with pytest.raises(StaleFenceError):  # the fence outlives the data
            client.delete([GroupRead(KEY, LeaseToken(2))])


def test_column_append_is_fenced_and_keeps_existing_columns():
    group = make_group(KEY)
    with serving() as (_, client):
        client.put_groups([(KEY, group)])
        client.append_columns(KEY, _ref(), LeaseToken(3))
        with pytest.raises(StaleFenceError, match="column append"):
            client.append_columns(KEY, pa.table({"adv2": pa.array([1.0] * 8, pa.float32())}), LeaseToken(2))
        table = client.get([KEY])
        assert table.column_names[-1] == "ref_logprob"
        assert table.drop_columns(["ref_logprob"]).equals(pa.Table.from_batches([group]))
        assert client.get([KEY], columns=["ref_logprob"]).column(0).to_pylist() == [0.5] * 8


def test_column_append_refuses_existing_columns_wrong_lengths_and_stale_tokens():
    with serving() as (_, client):
        client.put_groups([(KEY, make_group(KEY))])
        with pytest.raises(AlreadyExistsError, match="already has column 'reward'"):
            client.append_columns(KEY, pa.table({"reward": pa.array([1.0] * 8, pa.float32())}), LeaseToken(1))
        with pytest.raises(SchemaError, match="3 rows"):
            client.append_columns(KEY, _ref(n=3), LeaseToken(1))
        assert client.stats()["reserved_bytes"] == 0
        client.advance_generation([GroupRead(KEY, LeaseToken(9))])
        with pytest.raises(StaleFenceError):
            client.append_columns(KEY, _ref(), LeaseToken(8))


def test_a_restored_job_reaches_old_epoch_groups_under_new_generations():
    """Regression: a restore re-offers READY groups of the old epoch; fencing that epoch (for puts) must
    not lock their new holders out of reads and appends, while old holders stay refused."""
    with serving() as (_, client):
        client.put_groups([(KEY, make_group(KEY))])
        client.get([GroupRead(KEY, LeaseToken(3))])  # the old incarnation's lease
        client.fence("job-a", KEY.epoch + 1)  # the job restarts under a larger epoch
        with pytest.raises(StaleFenceError, match="fenced"):
            client.put_groups(
                [(Partition("job-a", KEY.epoch, 99), make_group(Partition("job-a", KEY.epoch, 99)))]
            )
        client.advance_generation([GroupRead(KEY, LeaseToken(10))])  # re-offered under a new lease
        assert client.get([GroupRead(KEY, LeaseToken(10))]).num_rows == 8
        client.append_columns(KEY, _ref(), LeaseToken(10))
        with pytest.raises(StaleFenceError):
            client.get([GroupRead(KEY, LeaseToken(3))])


def test_with_a_deployment_secret_only_tokens_of_the_right_role_write_fence_and_delete():
    ring = Keyring.from_secret(SECRET)
    with serving(keyring=ring, credential=ring.mint("w", "writer", ["job-a"])) as (server, writer):
        with (
            StorageClient(server.location, timeout=20) as anonymous,
            pytest.raises(AuthenticationError, match="no credential"),
        ):
            anonymous.put_groups([(KEY, make_group(KEY))])
        writer.put_groups([(KEY, make_group(KEY))])
        with pytest.raises(PermissionDeniedError, match="needs role admin"):
            writer.delete([GroupRead(KEY, LeaseToken(7))])
        with pytest.raises(PermissionDeniedError, match="needs role admin"):
            writer.fence("job-a", 5)
        admin = ring.mint("controller", "admin")
        with StorageClient(server.location, timeout=20, credential=admin) as controller:
            controller.fence("job-a", 1)
            assert controller.delete([GroupRead(KEY, LeaseToken(7))])["deleted"] == 1


def test_advance_generation_names_the_groups_the_server_does_not_hold():
    """Regression (fault suite): a storage server restarted empty fenced a lease of groups it had lost
    without a word, so over Flight the trainer's lease never learned they were gone (they cycled READY
    -> LEASED for ever); ``shm_open`` refused them. The answer now lists them."""
    lost = Partition("job-a", 1, 6)
    with serving() as (_, client):
        client.put_groups([(KEY, make_group(KEY))])
        result = client.advance_generation([GroupRead(KEY, LeaseToken(3)), GroupRead(lost, LeaseToken(3))])
        assert result["raised"] == 2
        assert result["missing"] == [{"job_id": "job-a", "epoch": 1, "group_id": 6}]
        assert client.advance_generation([GroupRead(KEY, LeaseToken(4))])["missing"] == []
