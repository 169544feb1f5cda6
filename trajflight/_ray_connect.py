"""Reaching a Ray data plane: its ``ray://NAMESPACE/NAME`` address, joining the running Ray cluster, the
controller actor's client, and this process's Ray node id.

:func:`connect_ray_plane` is what ``trajflight.connect("ray://...")`` calls; :class:`~trajflight._ray_plane.
RayCluster` (which deploys a plane) builds on the same pieces. Ray is imported only when a plane is
reached (``pip install 'trajflight[ray]'``).

It does not start anything: a plane must be running (``RayCluster``) for its address to answer.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from trajflight.controller import ControllerClient, RayTransport, import_ray
from trajflight.errors import InvalidRequestError, NotFoundError, UnavailableError

__all__ = ["SCHEME", "connect_ray_plane", "current_node_id", "loopback_addresses", "parse_ray_address"]

SCHEME = "ray://"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


# ---------------------------------------------------------------------------------------- addresses


def parse_ray_address(address: str) -> tuple[str, str]:
    """Split ``ray://NAMESPACE/NAME`` into ``(namespace, name)``.

    Both parts are non-empty and made of letters, digits, ``-``, ``_`` and ``.``.

    Raises:
        InvalidRequestError: anything else, saying what the address should look like.
    """
    expected = "expected ray://NAMESPACE/NAME (what RayCluster.address returns)"
    if not isinstance(address, str) or not address.startswith(SCHEME):
        raise InvalidRequestError(f"not a Ray data plane address: {address!r}; {expected}")
    parts = address[len(SCHEME) :].split("/")
    if len(parts) == 1 and ":" in parts[0]:
        raise InvalidRequestError(
            f"{address!r} looks like a Ray Client address (ray://HOST:PORT); {expected}. To use Ray Client, "
            "call ray.init('ray://HOST:PORT') yourself, then trajflight.connect('ray://NAMESPACE/NAME')"
        )
    if len(parts) != 2 or not all(parts) or not all(set(p) <= _NAME_CHARS for p in parts):
        raise InvalidRequestError(f"malformed Ray data plane address {address!r}; {expected}")
    return parts[0], parts[1]


def current_node_id() -> str:
    """The Ray node id of this process (a Ray worker, or a driver with Ray initialised).

    Raises:
        UnavailableError: Ray is not initialised in this process.
    """
    ray = import_ray()
    if not ray.is_initialized():
        raise UnavailableError("Ray is not initialised in this process: ray.init(...) or connect first")
    node_id: str = ray.get_runtime_context().get_node_id()
    return node_id


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


@contextlib.contextmanager
def loopback_addresses(active: bool) -> Iterator[None]:
    """While active, make Ray keep loopback addresses as they are.

    Ray resolves ``127.0.0.1`` (a node address, a GCS address) to the machine's outward IP unless
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` was set before ``import ray`` (the opt-in flag of
    ray-project/ray#31166, for ray-project/ray#30770): a Ray bound to loopback would then be unreachable
    (``ray.init`` hangs). Ray reads the flag into
    ``ray_constants.ENABLE_RAY_CLUSTER`` at import, so it is turned off here for the ``ray.init`` call.
    """
    try:
        from ray._private import ray_constants
    except ImportError:  # a private module of Ray: without it, Ray's own resolution decides
        active = False
    if not active or not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        yield
        return
    enabled = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = enabled


def _cluster_host() -> str | None:
    """Host of the GCS that ``ray.init(address="auto")`` would join (``RAY_ADDRESS``, else the cluster
    recorded or running on this machine), or ``None`` when unknown or ambiguous."""
    address = os.environ.get("RAY_ADDRESS") or None
    if address is None:
        try:  # Ray's own lookup for "auto": the recorded cluster, else the one GCS process running here
            from ray._private.services import find_bootstrap_address, find_gcs_addresses

            address = find_bootstrap_address(None)
            if address is None:
                found = sorted(find_gcs_addresses())  # type: ignore[no-untyped-call]
                address = found[0] if len(found) == 1 else None
        except Exception:  # private helpers of Ray: without them, Ray's own resolution decides
            return None
    if not address or "://" in address:
        return None
    return address.rsplit(":", 1)[0]


def _join_ray(ray: Any, namespace: str) -> None:
    """Join the running Ray cluster from a process that is not part of it yet."""
    try:
        with loopback_addresses(_cluster_host() in _LOOPBACK):
            ray.init(
                address="auto",  # RAY_ADDRESS when set, else the cluster last started on this machine
                namespace=namespace,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
    except ConnectionError as exc:
        raise UnavailableError(
            f"no running Ray cluster to join ({exc}); start the data plane first (RayCluster), set "
            "RAY_ADDRESS to its GCS address (host:port), or call ray.init(...) before trajflight.connect"
        ) from None


def connect_ray_plane(address: str, *, timeout: float = 30.0) -> ControllerClient:
    """A controller client of the Ray data plane at ``ray://NAMESPACE/NAME``.

    In a process where Ray is not initialised, joins the running cluster first (``ray.init(address=
    "auto")``: ``RAY_ADDRESS`` if set, else the cluster recorded or running on this machine) and leaves
    it joined for the life of the process. That join has no deadline of its own (``ray.init`` has
    none): set ``RAY_ADDRESS`` where several Ray clusters run on one machine.

    Raises:
        InvalidRequestError: a malformed address. UnavailableError: no Ray cluster to join, or Ray is not
        installed. NotFoundError: no controller of that name in that namespace.
    """
    namespace, name = parse_ray_address(address)
    ray = import_ray()
    if not ray.is_initialized():
        _join_ray(ray, namespace)
    try:
        actor = ray.get_actor(name, namespace=namespace)
    except ValueError:
        raise NotFoundError(
            f"no trajflight controller {name!r} in Ray namespace {namespace!r} of the Ray cluster at "
            f"{ray.get_runtime_context().gcs_address}; is the data plane running (RayCluster), and is this "
            "the right cluster (RAY_ADDRESS)?"
        ) from None
    return ControllerClient(RayTransport(actor), timeout=timeout)
