"""The controller's same-host endpoint: its actions over a Unix socket, beside its Flight endpoint.

A controller call over Flight (``do_action``) pays gRPC and its Python shims on both sides, about 0.3 to
0.6 ms here; the same request over a Unix socket about 0.04 ms (BENCHMARKS.md, *The controller's
same-host socket*). A writer pays one or two controller calls per put, a trainer one per lease and one per
commit, so clients on the controller's host (rollout workers and trainers of one machine, ``trajflight
up``'s users) send their calls over the socket instead.

The socket carries exactly the actions and typed-JSON bodies of the Flight endpoint (``call``, ``many``,
``acquire``, ``token``, ``info``; ``docs/wire-format.md``), answered by the same server code
(:meth:`ControlServer._respond <trajflight._control.ControlServer>`), with the framing, the error records
and the once-per-connection bearer token of the storage servers' same-host channel
(:class:`~trajflight.flight_server.LocalChannelServer`). ``checkpoint`` and ``restore`` stay on Flight
(their bytes may exceed the socket's frame).

Access is first the filesystem's: the socket lives in a fresh 0700 directory of the controller's user, so
only that user's processes can connect. Where the controller authenticates, a connection must present a
token the deployment's keyring verifies before anything else, and each request is checked against the
operation's role as over Flight. There is no TLS on it: it never leaves the host.

A client uses it only where the controller's ``info`` names the socket, reports this host's
:func:`~trajflight.flight_server.host_id`, and the socket is reachable from this process
(:mod:`trajflight._control_client`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable

from trajflight.auth import Claims
from trajflight.errors import TrajflightError
from trajflight.flight_server import LocalChannelServer

__all__ = ["ControlSocket", "verifying"]

Handler = Callable[[str, bytearray, bytearray, Claims | None], bytes]


class ControlSocket:
    """The socket of one control server: a private directory, the channel server, and its cleanup.

    Args:
        handler: Runs one action (raises Flight errors, as ``do_action`` does).
        authenticate: Verifies the token a connection presents (the keyring's ``verify``, counting a
            refusal); None: the controller does not authenticate.
    """

    def __init__(self, handler: Handler, authenticate: Callable[[str], Claims] | None) -> None:
        self.directory = tempfile.mkdtemp(prefix="trajflight-control-")  # 0700, this user's
        self.path = os.path.join(self.directory, "control.sock")
        try:
            self._server = LocalChannelServer(self.path, handler, authenticate=authenticate)
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def caller_gone(self) -> bool:
        """Whether the client of the request this thread serves has closed its connection."""
        return self._server.caller_gone()

    def close(self) -> None:
        """Stop serving, drop the connections and remove the directory (idempotent)."""
        self._server.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def verifying(verify: Callable[[str], Claims], on_refusal: Callable[[str], None]) -> Callable[[str], Claims]:
    """``verify``, counting each refused token as the Flight middleware does (``unauthenticated``)."""

    def authenticate(token: str) -> Claims:
        try:
            return verify(token)
        except TrajflightError:
            on_refusal("unauthenticated")
            raise

    return authenticate
