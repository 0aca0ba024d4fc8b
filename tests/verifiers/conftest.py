"""Shared fixtures for the sandbox tests: a started pool per isolation mode and a listener.

`sandbox` runs every test that uses it twice: in root mode (skipped unless the tests run as
root) and in rootless mode (an unprivileged user namespace; run as root, the pool starts its
sandboxes as uid 65534, a throwaway unprivileged user, exactly as an ordinary user would).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from compassplay.verifiers.sandbox.pool import PythonSandbox
from tests.verifiers.sandbox_helpers import HOST_SECRET, MODES, require_isolation


@pytest.fixture(scope="module", params=sorted(MODES))
def sandbox(request: pytest.FixtureRequest) -> Iterator[PythonSandbox]:
    mode = MODES[request.param]
    require_isolation(mode)
    os.environ[HOST_SECRET] = "hunter2"
    try:
        with PythonSandbox(workers=2, timeout_s=1.5, memory_mb=256, max_output_bytes=4096,
                           isolation=mode) as sb:
            yield sb
    finally:
        os.environ.pop(HOST_SECRET, None)


@pytest.fixture()
def listener() -> Iterator[socket.socket]:
    """A host TCP listener on loopback; attacks try to reach it from inside."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    yield srv
    srv.close()
