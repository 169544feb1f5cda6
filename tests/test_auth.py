"""The token module: minting, verifying, roles and scopes, under a fake clock (no I/O, no servers)."""

from __future__ import annotations

import pickle

import jwt
import pytest

from trajflight.auth import (
    Claims,
    Credential,
    Keyring,
    RefreshingCredential,
    Role,
    authorize,
    is_loopback,
    load_keyring,
    mint_for_client,
    parse_bearer,
    unverified_expiry,
)
from trajflight.errors import AuthenticationError, ConfigError, PermissionDeniedError

SECRET = "k1:" + "s" * 32
T0 = 1_800_000_000.0


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def keyring(secret: str = SECRET, clock: Clock | None = None) -> Keyring:
    return Keyring.from_secret(secret, clock=clock or Clock())


def test_a_minted_token_verifies_with_its_claims():
    ring = keyring()
    cred = ring.mint("trainer-0", "trainer", ["job-a"], ttl=60)
    claims = ring.verify(cred)
    assert (claims.sub, claims.role, claims.jobs, claims.kid) == ("trainer-0", Role.TRAINER, ("job-a",), "k1")
    assert claims.exp - claims.iat == 60
    assert jwt.get_unverified_header(cred.reveal())["kid"] == "k1"
    assert unverified_expiry(cred) == claims.exp


def test_a_plane_mints_for_clients_what_its_caller_scoped_and_nothing_without_a_secret():
    """``mint_for_client``: the one body of ``LocalCluster.mint`` and ``RayCluster.mint``."""
    ring = keyring()
    claims = ring.verify(mint_for_client(ring, "writer", ["job-a"], ttl=90))
    assert (claims.sub, claims.role, claims.jobs, claims.exp - claims.iat) == (
        "writer-client",
        Role.WRITER,
        ("job-a",),
        90,
    )
    every = ring.verify(mint_for_client(ring, jobs=[], sub="ops"))  # no job: every job
    assert (every.sub, every.role, every.jobs, every.exp - every.iat) == ("ops", Role.ADMIN, ("*",), 3600)
    with pytest.raises(ConfigError, match="no deployment secret") as info:
        mint_for_client(None, "reader")
    assert info.value.setting == "secret"
    with pytest.raises(ConfigError, match="unknown role"):
        mint_for_client(ring, "root")


def test_every_token_has_its_own_id():
    ring = keyring()
    assert ring.verify(ring.mint("a", "reader")).jti != ring.verify(ring.mint("a", "reader")).jti


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (None, "missing"),
        ("", "missing"),
        ("not-a-token", "malformed"),
        ("a.b.c", "malformed"),
        ("x" * 9000, "malformed"),
    ],
)
def test_unusable_tokens_are_refused_with_their_reason(token, reason):
    with pytest.raises(AuthenticationError) as info:
        keyring().verify(token)
    assert info.value.reason == reason


def test_a_token_of_another_secret_has_a_bad_signature_and_the_message_never_shows_it():
    other = Keyring.from_secret("k1:" + "t" * 32, clock=Clock())
    cred = other.mint("w", "writer")
    with pytest.raises(AuthenticationError) as info:
        keyring().verify(cred)
    assert info.value.reason == "bad_signature"
    assert cred.reveal() not in str(info.value)
    assert cred.reveal().split(".")[2] not in str(info.value)


def test_an_expired_token_is_refused_at_its_expiry_not_before():
    clock = Clock()
    ring = keyring(clock=clock)
    cred = ring.mint("w", "writer", ttl=30)
    clock.now = T0 + 29.9
    ring.verify(cred)
    clock.now = T0 + 30
    with pytest.raises(AuthenticationError, match="expired") as info:
        ring.verify(cred)
    assert info.value.reason == "expired"


def test_rotation_old_key_verifies_until_dropped_then_is_revoked():
    clock = Clock()
    old = keyring(clock=clock)
    cred = old.mint("w", "writer")
    rotated = Keyring.from_secret("k2:" + "n" * 32 + "\n" + SECRET, clock=clock)
    assert rotated.signing_kid == "k2"
    assert rotated.verify(cred).kid == "k1"  # the old key still verifies
    assert rotated.verify(rotated.mint("w", "writer")).kid == "k2"
    dropped = Keyring.from_secret("k2:" + "n" * 32, clock=clock)
    with pytest.raises(AuthenticationError, match="revoked or unknown key") as info:
        dropped.verify(cred)
    assert info.value.reason == "revoked"


def test_a_forged_header_algorithm_is_malformed():
    token = jwt.encode({"sub": "x"}, "", algorithm="none", headers={"kid": "k1"})
    with pytest.raises(AuthenticationError) as info:
        keyring().verify(token)
    assert info.value.reason == "malformed"


def test_missing_claims_are_malformed():
    ring = keyring()
    key = ring._keys["k1"]
    token = jwt.encode({"iss": "trajflight", "sub": "x"}, key, algorithm="HS256", headers={"kid": "k1"})
    with pytest.raises(AuthenticationError) as info:
        ring.verify(token)
    assert info.value.reason == "malformed"


def test_a_bare_secret_gets_a_derived_kid_and_short_secrets_are_refused():
    ring = Keyring.from_secret("x" * 32)
    assert len(ring.signing_kid) == 12
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        Keyring.from_secret("short")
    with pytest.raises(ConfigError):
        Keyring.from_secret("")


@pytest.mark.parametrize(
    ("kwargs", "setting"), [({"role": "root"}, "role"), ({"jobs": []}, "jobs"), ({"ttl": 0}, "ttl")]
)
def test_minting_refuses_bad_arguments(kwargs, setting):
    args = {"role": "writer", "jobs": ["j"], "ttl": 10.0, **kwargs}
    with pytest.raises(ConfigError) as info:
        keyring().mint("w", args["role"], args["jobs"], ttl=args["ttl"])
    assert info.value.setting == setting


def claims(role: Role, jobs: tuple[str, ...] = ("job-a",)) -> Claims:
    return Claims("me", role, jobs, T0, T0 + 60, "id", "k1")


def test_authorize_checks_role_then_job_and_admin_has_every_role():
    authorize(claims(Role.TRAINER), "commit", [Role.TRAINER], ["job-a"])
    authorize(claims(Role.ADMIN), "commit", [Role.TRAINER], ["job-a"])
    authorize(claims(Role.READER, ("*",)), "list", [Role.READER], ["any-job"])
    authorize(None, "fence", [Role.ADMIN], ["job-a"])  # no authentication configured
    with pytest.raises(PermissionDeniedError, match="needs role admin") as info:
        authorize(claims(Role.TRAINER), "fence", [Role.ADMIN], ["job-a"])
    assert (info.value.reason, info.value.operation) == ("role", "fence")
    with pytest.raises(PermissionDeniedError, match="outside the credential's jobs") as info:
        authorize(claims(Role.TRAINER), "commit", [Role.TRAINER], ["job-b"])
    assert info.value.reason == "job"


def test_credentials_never_show_in_repr_str_or_keyring_repr():
    ring = keyring()
    cred = ring.mint("w", "writer")
    for text in (repr(cred), str(cred), f"{cred}", repr([cred]), repr(ring)):
        assert cred.reveal() not in text
        assert "s" * 16 not in text
    assert pickle.loads(pickle.dumps(cred)) == cred
    assert "hidden" in repr(RefreshingCredential(lambda: cred))


def test_bearer_headers_parse_and_bad_schemes_are_malformed():
    assert parse_bearer(None) is None
    assert parse_bearer(["Bearer abc"]) == "abc"
    with pytest.raises(AuthenticationError) as info:
        parse_bearer(["Basic abc"])
    assert info.value.reason == "malformed"


def test_a_refreshing_credential_fetches_again_past_half_its_life():
    clock = Clock()
    ring = keyring(clock=clock)
    fetched = []

    def fetch() -> Credential:
        fetched.append(clock.now)
        return ring.mint("w", "writer", ttl=100)

    source = RefreshingCredential(fetch, clock=clock)
    first = source.current()
    clock.now = T0 + 49
    assert source.current() is first
    clock.now = T0 + 50
    assert source.current() is not first
    assert fetched == [T0, T0 + 50]


def test_load_keyring_reads_the_file_then_the_environment(tmp_path):
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    assert load_keyring(path, environ={}).signing_kid == "k1"
    assert load_keyring(None, environ={"TRAJFLIGHT_SECRET": "k9:" + "z" * 20}).signing_kid == "k9"
    assert load_keyring(None, environ={}) is None
    with pytest.raises(ConfigError, match="cannot read"):
        load_keyring(tmp_path / "absent", environ={})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.5", True), ("::1", True), ("localhost", True), ("0.0.0.0", False),
     ("10.0.0.1", False), ("example.org", False)],
)  # fmt: skip
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_docs_auth_md_gives_every_operation_its_roles():
    """docs/auth.md renders both role tables; an operation added or changed without it fails here."""
    import re
    from pathlib import Path

    from trajflight.controller import ROLES as CONTROLLER
    from trajflight.flight_server import ROLES as STORAGE

    text = (Path(__file__).resolve().parents[1] / "docs" / "auth.md").read_text()
    controller_part, storage_part = text.split("Controller (Flight endpoint", 1)[1].split(
        "Storage server (Flight", 1
    )
    for table, part in ((CONTROLLER, controller_part), (STORAGE, storage_part.split("\n\n", 2)[1])):
        documented: dict[str, set[str]] = {}
        for ops, roles in re.findall(r"^\| (`.+?) \| ([a-z, ]+) \|$", part, flags=re.M):
            for op in re.findall(r"`([a-z_]+)`", ops):
                documented[op] = set(roles.split(", "))
        assert {op: {r.value for r in roles} for op, roles in table.items()} == documented


def test_a_verified_token_is_remembered_but_its_expiry_is_checked_at_every_use():
    clock = Clock()
    ring = keyring(clock=clock)
    cred = ring.mint("w", "writer", ttl=10)
    assert ring.verify(cred) is ring.verify(cred)  # decoded once
    clock.now = T0 + 10
    with pytest.raises(AuthenticationError, match="expired"):
        ring.verify(cred)
    forged = cred.reveal()[:-2] + ("AA" if not cred.reveal().endswith("AA") else "BB")
    with pytest.raises(AuthenticationError) as info:  # a token that differs is verified afresh
        ring.verify(forged)
    assert info.value.reason in {"bad_signature", "malformed"}
