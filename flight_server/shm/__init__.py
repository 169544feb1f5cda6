"""trajflight.flight_server.shm: the same-host wing of the storage server (shared memory, Unix socket)."""
