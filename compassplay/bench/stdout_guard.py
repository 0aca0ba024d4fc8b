"""Keep a bench's `--json` stdout to the one JSON object.

vLLM logs to stdout (its engine and worker processes too), and DeepSpeed's accelerator probe
prints there on import; a caller that parses `compassplay bench ... --json` would read those
lines first. While a bench runs, file descriptor 1 (this process's and every child's it starts)
points at stderr; the JSON is printed after it is restored.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Within the block, everything written to fd 1 or `sys.stdout` goes to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
