"""Ctrl-C for a run: the first press stops it cleanly, a second exits at once.

`graceful_stop(resume_hint)` installs handlers for SIGINT and SIGTERM (so `ray job stop` and
`kill` stop a run the same way) in the main thread and yields a `StopRequest`.

- In plain Python/torch code (the local executor, model preparation) the first signal raises
  `RunInterrupted` where the main thread is; `finally` blocks close the sandbox and the log.
- Inside `stop.deferred()` (the Ray driver: an exception raised inside Ray's blocking calls
  corrupts them) the first signal only sets the flag; the driver's wait loops poll
  `stop.check()` about once a second, drop the in-flight step, kill the actors and shut an
  embedded Ray down.

`ray.init` installs Ray's own failure-signal handler for SIGTERM in C (it prints "*** SIGTERM
received" and ends the process), over ours; `reclaim_signals()` installs ours again and the Ray
session calls it after each `ray.init`, so `ray job stop` stops a run as Ctrl-C does.

Checkpoints are written atomically, so the last one stays; the message names the resume
command. A second signal, during that clean-up, ends the process at once with exit code 130
(seen by a watcher thread, so even while the main thread is blocked in C).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from compassplay.errors import RunInterrupted

EXIT_CODE = 130  # the shell's code for "terminated by SIGINT"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_active: list[StopRequest] = []  # the StopRequests of the graceful_stop blocks now open


def interrupted(resume_hint: str) -> RunInterrupted:
    """The error a stopped run ends with: what was kept and the command that resumes."""
    return RunInterrupted(f"run interrupted; the last checkpoint is kept. "
                          f"Resume with: {resume_hint}")


class StopRequest:
    """Counts stop signals; `check()` raises RunInterrupted once one has arrived."""

    def __init__(self, resume_hint: str = "") -> None:
        self.resume_hint = resume_hint
        self.presses = 0
        self._immediate = True

    @property
    def requested(self) -> bool:
        return self.presses > 0

    def check(self) -> None:
        """Raise RunInterrupted if a stop was requested (call from the driver's loops)."""
        if self.presses:
            raise interrupted(self.resume_hint)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Within the block a first signal only sets the flag; the code polls `check()`."""
        before, self._immediate = self._immediate, False
        try:
            yield
        finally:
            self._immediate = before

    def handle(self, signum: int, frame) -> None:
        self.presses += 1
        if self.presses > 1:  # the watcher thread usually got there first
            _exit_now()
        print(f"\n{signal.Signals(signum).name}: stopping the run (dropping the step in "
              "flight, shutting actors down); press Ctrl-C again to exit at once",
              file=sys.stderr, flush=True)
        if self._immediate:
            raise interrupted(self.resume_hint)


@contextmanager
def graceful_stop(resume_hint: str) -> Iterator[StopRequest]:
    """Within the block, SIGINT/SIGTERM stop the run once, then exit the process."""
    stop = StopRequest(resume_hint)
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signal handlers live in the main thread only (tests run from threads)
        return
    previous = {s: signal.signal(s, stop.handle) for s in STOP_SIGNALS}
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    old_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_count_deliveries, args=(read_fd,), daemon=True,
                     name="compassplay-second-interrupt").start()
    _active.append(stop)
    try:
        yield stop
    finally:
        _active.remove(stop)
        signal.set_wakeup_fd(old_wakeup)
        os.close(write_fd)  # the watcher reads EOF and ends
        for s, h in previous.items():
            signal.signal(s, h)


def reclaim_signals() -> None:
    """Install the innermost open `graceful_stop`'s handlers again (after a library such as
    Ray replaced them at the C level, where `signal.getsignal` does not see it). No-op outside
    a `graceful_stop` block or off the main thread."""
    if _active and threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            signal.signal(s, _active[-1].handle)


def _count_deliveries(read_fd: int) -> None:
    """Python runs signal handlers only when the main thread executes bytecode, and merges
    signals that arrive before it does; the wakeup fd gets one byte per delivery, at once, so
    this thread sees a second Ctrl-C even while the main thread is blocked in C (Ray, torch)."""
    seen = 0
    try:
        while True:
            data = os.read(read_fd, 64)
            if not data:
                return
            seen += sum(1 for b in data if b in STOP_SIGNALS)
            if seen >= 2:
                _exit_now()
    finally:
        os.close(read_fd)


def _exit_now() -> None:
    print("second interrupt: exiting now", file=sys.stderr, flush=True)
    os._exit(EXIT_CODE)
