"""The driver's Ray session: start or join Ray, and call an actor while it restarts.

An embedded Ray starts its dashboard (`cluster.dashboard`; off with the environment variable
COMPASSPLAY_RAY_DASHBOARD=0) on `cluster.dashboard_port`, or on the next free port when that
one is taken, and prints its URL.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections.abc import Callable

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError

from compassplay.config import RunConfig
from compassplay.errors import RunError
from compassplay.executors.interrupt import reclaim_signals

log = logging.getLogger(__name__)

DASHBOARD_ENV = "COMPASSPLAY_RAY_DASHBOARD"
PORT_TRIES = 20  # ports tried from cluster.dashboard_port on


def call_when_up(method, *args, timeout_s: float = 300.0,
                 poll: Callable[[], None] = lambda: None):
    """`ray.get(method.remote(*args))`, waiting while the actor restarts (at most `timeout_s`);
    `poll()` runs about once a second (the driver's Ctrl-C check raises from it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ref = method.remote(*args)
            while not ray.wait([ref], timeout=1.0)[0]:
                poll()
                if time.monotonic() > deadline:
                    raise RunError(f"{method._method_name}() got no answer in {timeout_s:.0f} s")
            return ray.get(ref)
        except (ActorUnavailableError, ActorDiedError):
            if time.monotonic() > deadline:
                raise
            poll()
            time.sleep(0.5)


def init_ray(cfg: RunConfig) -> bool:
    """Connect to `cluster.address` / RAY_ADDRESS, or start an embedded local Ray.

    Returns True when this call started an embedded Ray (the caller shuts it down)."""
    if ray.is_initialized():
        return False
    address = cfg.cluster.address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ctx = ray.init(address=address, log_to_driver=True)
        reclaim_signals()
        announce_dashboard(getattr(ctx, "dashboard_url", None))
        return False
    c = cfg.cluster
    need = (c.proposer.num_cpus + c.solver.num_cpus + c.verifier.num_cpus * c.num_verifiers
            + c.scorer.num_cpus * cfg.scorer.num_scorers
            + c.learner.num_cpus * cfg.learner.num_ranks
            + (c.eval.num_cpus if cfg.eval.every_steps else 0.0))
    dash = dashboard_wanted(cfg)
    extra: dict = {}
    if dash:
        port = first_free_port(c.dashboard_host, c.dashboard_port)
        if port != c.dashboard_port:
            log.warning("cluster.dashboard_port %d is taken: the Ray dashboard uses %d",
                        c.dashboard_port, port)
        extra = {"dashboard_host": c.dashboard_host, "dashboard_port": port}
    try:
        ctx = ray.init(num_cpus=max(os.cpu_count() or 1, int(need + 0.999)),
                       include_dashboard=dash, log_to_driver=True, **extra)
    except ValueError as exc:  # the port was taken between our check and Ray's bind
        if "occupied" not in str(exc):
            raise
        raise RunError(f"cluster.dashboard_port: {exc} (or set cluster.dashboard=false)"
                       ) from None
    reclaim_signals()
    if dash:
        announce_dashboard(getattr(ctx, "dashboard_url", None))
    return True


def dashboard_wanted(cfg: RunConfig) -> bool:
    """`cluster.dashboard`, unless COMPASSPLAY_RAY_DASHBOARD=0."""
    return cfg.cluster.dashboard and os.environ.get(DASHBOARD_ENV, "1") != "0"


def first_free_port(host: str, port: int, tries: int = PORT_TRIES) -> int:
    """`port`, or the first of the next `tries - 1` ports that `host` can bind; RunError
    naming cluster.dashboard_port when none can."""
    for p in range(port, min(port + tries, 65536)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, p))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise RunError(f"cluster.dashboard_host={host!r}: cannot bind ({exc})"
                                   ) from None
                continue
        return p
    raise RunError(f"cluster.dashboard_port: ports {port}-{port + tries - 1} on {host} are all "
                   "taken; set another port, or cluster.dashboard=false")


def announce_dashboard(url: str | None) -> None:
    """Print (and log) the dashboard's URL, with where the token is when Ray asks for one."""
    if not url:
        return
    url = url if url.startswith("http") else f"http://{url}"
    auth = ("; it asks for the cluster's token: `ray get-auth-token`"
            if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else "")
    print(f"Ray dashboard: {url}{auth}", flush=True)
    log.info("Ray dashboard: %s", url)
