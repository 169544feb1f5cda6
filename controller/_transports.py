"""How a :class:`~._client.ControllerClient` reaches its host: in this process, or the Ray actor.

A transport carries one command as its operation name and keyword arguments (the form the Flight wire and
the journal use too; the host parses it back into its command, :mod:`._commands`), plus the three client
operations the hosts serve with methods of their own: the long-polling ``acquire``, ``checkpoint`` and
``restore`` (the client passes bytes: it writes and reads checkpoint files in its own process). A call
may carry a ``wait``: the host parks it while capacity refuses it (``LocalController.run``). Errors
are the ledger's own classes, plus :class:`~trajflight.errors.DeadlineExceededError` and, for Ray,
:class:`~trajflight.errors.UnavailableError` (the actor is gone or restarting; a call may have run
although it failed, as with any Ray actor call).
"""

from __future__ import annotations

from typing import Any, Protocol

from trajflight.errors import DeadlineExceededError, UnavailableError

from ._commands import client_call
from ._host import LocalController
from ._ray_host import import_ray
from ._records import Lease

__all__ = ["LocalTransport", "RayTransport", "Transport", "poll_window"]


def poll_window(wait: float, timeout: float) -> float:
    """The part of ``wait`` a host may park a call of deadline ``timeout`` (seconds) for: it leaves the
    reply a quarter of the deadline (at most 1 s) to arrive, so that "nothing came" is the host's answer
    rather than a deadline error."""
    return min(wait, max(0.0, timeout - min(1.0, timeout / 4)))


class Transport(Protocol):
    """How a :class:`ControllerClient` reaches its host."""

    def invoke(self, method: str, kwargs: dict[str, Any], timeout: float, wait: float = 0.0) -> Any:
        """Run one ledger call, parked up to ``wait`` seconds while capacity refuses it; typed errors."""
        ...

    def acquire(self, kwargs: dict[str, Any], wait: float, timeout: float) -> Lease | None:
        """Long-poll acquire."""
        ...

    def checkpoint(self, job_id: str, path: str | None, timeout: float) -> bytes:
        """Take (and maybe write) a job checkpoint."""
        ...

    def restore(self, source: bytes | str, kwargs: dict[str, Any], timeout: float) -> dict[str, int]:
        """Restore a job from checkpoint bytes or a file."""
        ...


class LocalTransport:
    """Calls into a :class:`LocalController` of this process."""

    def __init__(self, host: LocalController) -> None:
        self.host = host

    def invoke(self, method: str, kwargs: dict[str, Any], timeout: float, wait: float = 0.0) -> Any:
        """Run one client operation (a command of route ``CALL``) on the local host, parked up to ``wait``
        seconds while capacity refuses it."""
        return self.host.run(client_call(method, kwargs), timeout=timeout, wait=wait)

    def acquire(self, kwargs: dict[str, Any], wait: float, timeout: float) -> Lease | None:
        """Long-poll acquire on the local host; ``wait`` is cut to ``timeout``."""
        return self.host.acquire(kwargs, wait=wait, timeout=timeout)

    def checkpoint(self, job_id: str, path: str | None, timeout: float) -> bytes:
        """Take (and maybe write) a job checkpoint on the local host."""
        return self.host.checkpoint(job_id, path, timeout=timeout)

    def restore(self, source: bytes | str, kwargs: dict[str, Any], timeout: float) -> dict[str, int]:
        """Restore a job on the local host from checkpoint bytes or a file."""
        return self.host.restore(source, timeout=timeout, **kwargs)


class RayTransport:
    """Calls into the controller actor through its handle."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._ray = import_ray()

    def _get(self, ref: Any, timeout: float) -> Any:
        ray = self._ray
        try:
            status, value = ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref)
            raise DeadlineExceededError(
                f"the controller actor did not answer within {timeout:.3g}s; the call may still run; retry "
                "(every call but acquire is idempotent)"
            ) from None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise UnavailableError(
                f"the controller actor is unavailable ({type(exc).__name__}); it may be restarting: retry "
                "after a moment"
            ) from None
        if status == "err":
            raise value
        return value

    def invoke(self, method: str, kwargs: dict[str, Any], timeout: float, wait: float = 0.0) -> Any:
        """Run one ledger call in the actor, parked up to ``wait`` seconds while capacity refuses it; raise
        the ledger's error, a deadline or an unavailable host."""
        return self._get(self.actor.invoke.remote(method, kwargs, poll_window(wait, timeout)), timeout)

    def invoke_many(self, calls: list[tuple[str, dict[str, Any]]], timeout: float) -> list[Any]:
        """Run several calls in one actor round trip; return each result, or raise the first error."""
        out = []
        for status, value in self._get_raw(self.actor.invoke_many.remote(calls), timeout):
            if status == "err":
                raise value
            out.append(value)
        return out

    def _get_raw(self, ref: Any, timeout: float) -> Any:
        ray = self._ray
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise DeadlineExceededError(
                f"the controller actor did not answer within {timeout:.3g}s"
            ) from None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise UnavailableError(
                f"the controller actor is unavailable ({type(exc).__name__}); retry"
            ) from None

    def acquire(self, kwargs: dict[str, Any], wait: float, timeout: float) -> Lease | None:
        """Long-poll acquire in the actor (other callers proceed while it waits)."""
        result: Lease | None = self._get(
            self.actor.acquire.remote(kwargs, poll_window(wait, timeout)), timeout
        )
        return result

    def checkpoint(self, job_id: str, path: str | None, timeout: float) -> bytes:
        """Take (and maybe write, on the actor's node) a job checkpoint."""
        data: bytes = self._get(self.actor.checkpoint.remote(job_id, path), timeout)
        return data

    def restore(self, source: bytes | str, kwargs: dict[str, Any], timeout: float) -> dict[str, int]:
        """Restore a job in the actor from checkpoint bytes or a file on the actor's node."""
        out: dict[str, int] = self._get(self.actor.restore.remote(source, kwargs), timeout)
        return out

    def info(self, timeout: float) -> dict[str, Any]:
        """The actor's incarnation, pid and last recovery count."""
        out: dict[str, Any] = self._get_raw(self.actor.info.remote(), timeout)
        return out
