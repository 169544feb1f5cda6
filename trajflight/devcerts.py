"""A private CA and certificates for development and tests: TLS and mutual TLS on loopback in one call.

:func:`make_dev_certs` writes a self-signed CA, a server certificate for the given hosts (as IP or DNS
subject alternative names) and a client certificate, all signed by that CA, with their keys (0600), into
a directory, and returns the :class:`~trajflight.flight_server.TlsConfig` of each side. Certificates are
valid for ``days`` (default 7) from a minute ago; keys are ECDSA P-256.

For development and tests only: the CA's key lies beside the certificates it signed. Production
deployments bring certificates from their own CA. Needs the ``cryptography`` package
(``pip install 'trajflight[tls]'``).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajflight.errors import ConfigError
from trajflight.flight_server import TlsConfig

__all__ = ["DevCerts", "make_dev_certs"]


@dataclass(frozen=True, slots=True)
class DevCerts:
    """What :func:`make_dev_certs` made.

    Attributes:
        directory: Where the PEM files are (``ca.pem``, ``server.pem``, ``server.key``, ``client.pem``,
            ``client.key``).
        server: A server's side: its certificate and key, and the CA its clients' certificates must
            chain to (mutual TLS); drop ``ca`` (``TlsConfig(cert, key)``) for TLS without client
            certificates.
        client: A client's side: the CA that signed the server's certificate, and the client's
            certificate and key.
    """

    directory: Path
    server: TlsConfig
    client: TlsConfig


def _crypto() -> Any:
    try:
        from cryptography import x509
    except ImportError:
        raise ConfigError(
            "trajflight.devcerts needs the cryptography package: pip install 'trajflight[tls]'",
            setting="tls",
        ) from None
    return x509


def make_dev_certs(
    directory: str | os.PathLike[str],
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    days: int = 7,
) -> DevCerts:
    """Make a private CA, a server certificate for ``hosts`` and a client certificate in ``directory``.

    Args:
        directory: Created if missing; existing files of these names are replaced.
        hosts: The server's names: IP addresses and DNS names clients connect to.
        days: Validity of every certificate.

    Raises:
        ConfigError: cryptography is not installed, no host, or ``days`` < 1.
    """
    x509 = _crypto()
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not hosts:
        raise ConfigError("make_dev_certs: give at least one host", setting="hosts")
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ConfigError(f"make_dev_certs: days must be an int >= 1, got {days!r}", setting="days")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)
    end = start + datetime.timedelta(days=days)

    def name(common: str) -> Any:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def builder(subject: str, issuer: str, public_key: Any) -> Any:
        return (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        builder("trajflight dev CA", "trajflight dev CA", ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(common: str, usage: Any, names: Sequence[str] = ()) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = builder(common, "trajflight dev CA", key.public_key()).add_extension(
            x509.BasicConstraints(ca=False, path_length=None), critical=True
        )
        cert = cert.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if names:
            alt = [_alt_name(x509, n) for n in names]
            cert = cert.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        signed = cert.sign(ca_key, hashes.SHA256())
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return signed.public_bytes(serialization.Encoding.PEM), key_pem

    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    server_pem, server_key = leaf("trajflight dev server", ExtendedKeyUsageOID.SERVER_AUTH, hosts)
    client_pem, client_key = leaf("trajflight dev client", ExtendedKeyUsageOID.CLIENT_AUTH)
    for file, data, mode in (
        ("ca.pem", ca_pem, 0o644),
        ("server.pem", server_pem, 0o644),
        ("server.key", server_key, 0o600),
        ("client.pem", client_pem, 0o644),
        ("client.key", client_key, 0o600),
    ):
        path = folder / file
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(path, mode)
    return DevCerts(
        folder,
        server=TlsConfig(server_pem, server_key, ca_pem),
        client=TlsConfig(client_pem, client_key, ca_pem),
    )


def _alt_name(x509: Any, host: str) -> Any:
    """An IP address or DNS subject alternative name for ``host``."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)
