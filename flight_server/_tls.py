"""TLS for every Flight endpoint: the PEM material of one side (server or client), and its pyarrow form.

A server with a :class:`TlsConfig` serves ``grpc+tls://``; with a ``ca`` it also demands a client
certificate signed by that CA (mutual TLS) and refuses connections without one. A client's ``ca`` is the
CA its servers' certificates must chain to (``None``: the system's roots); its ``cert`` and ``key`` are
presented to servers that demand mutual TLS. Same-host shared memory is not TLS: its files and socket live
in the server's private (0700) arena directory, reachable only by processes of the server's user.

It does not make certificates (``trajflight.devcerts`` makes a private CA for development and tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pyarrow.flight as flight

from trajflight.errors import ConfigError

__all__ = ["TlsConfig"]


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """One side's TLS material, PEM-encoded (``repr`` never shows the key).

    Attributes:
        cert: This side's certificate chain: required on a server; on a client, for mutual TLS.
        key: The private key of ``cert``.
        ca: Server: the CA client certificates must chain to (mutual TLS on); client: the CA the server's
            certificate must chain to (``None``: the system's roots).
    """

    cert: bytes | None = None
    key: bytes | None = None
    ca: bytes | None = None

    def __post_init__(self) -> None:
        for name in ("cert", "key", "ca"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bytes):
                raise ConfigError(f"tls {name}: expected PEM bytes, got {type(value).__name__}", setting=name)
        if (self.cert is None) != (self.key is None):
            raise ConfigError("tls: give cert and key together (or neither)", setting="tls")

    def __repr__(self) -> str:
        key = "<hidden>" if self.key else None
        return f"TlsConfig(cert={self.cert is not None}, key={key}, ca={self.ca is not None})"

    @classmethod
    def from_files(
        cls,
        cert: str | os.PathLike[str] | None = None,
        key: str | os.PathLike[str] | None = None,
        ca: str | os.PathLike[str] | None = None,
    ) -> TlsConfig:
        """Read the PEM files (any may be ``None``).

        Raises:
            ConfigError: a file cannot be read (naming it), or cert without key.
        """

        def read(path: str | os.PathLike[str] | None, setting: str) -> bytes | None:
            if path is None:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as exc:
                raise ConfigError(
                    f"tls {setting}: cannot read {os.fspath(path)!r}: {exc.strerror}", setting=setting
                ) from None

        return cls(read(cert, "cert"), read(key, "key"), read(ca, "ca"))

    def server_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``pyarrow.flight.FlightServerBase`` for this server side.

        Raises:
            ConfigError: no certificate and key (a TLS server needs both).
        """
        if self.cert is None or self.key is None:
            raise ConfigError("a TLS server needs cert and key", setting="tls")
        return {
            "tls_certificates": [flight.CertKeyPair(self.cert, self.key)],
            "verify_client": self.ca is not None,
            "root_certificates": self.ca,
        }

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``pyarrow.flight.FlightClient`` for this client side."""
        out: dict[str, Any] = {}
        if self.ca is not None:
            out["tls_root_certs"] = self.ca
        if self.cert is not None:
            out["cert_chain"], out["private_key"] = self.cert, self.key
        return out


def scheme(tls: TlsConfig | None) -> str:
    """``grpc+tls`` with TLS, else ``grpc``."""
    return "grpc" if tls is None else "grpc+tls"


def client_kwargs(location: str, tls: TlsConfig | None) -> dict[str, Any]:
    """A client's TLS keyword arguments for ``location``.

    Raises:
        ConfigError: TLS material for a plaintext ``grpc://`` location (it would be ignored silently).
    """
    if tls is None:
        return {}
    if not location.startswith("grpc+tls://"):
        raise ConfigError(
            f"tls is set but {location[:100]!r} is not a grpc+tls:// location; connect to the server's "
            "TLS location or drop tls",
            setting="tls",
        )
    return tls.client_kwargs()
