"""A multi-node Ray cluster on one machine, grown and shrunk by Ray's real autoscaler.

`ray start --head --autoscaling-config=FILE` with `RAY_FAKE_CLUSTER=1` runs Ray's autoscaler
(the monitor process on the head) with its `fake_multinode` node provider: every node it
launches for pending demand is a real raylet on this machine with the resources its node type
declares (`GPU` included: an actor asking `num_gpus=1` gets `CUDA_VISIBLE_DEVICES` and computes
on CPU), and idle nodes are terminated after `idle_timeout_minutes`. The node types are read
from the repository's `ray_cluster.yaml` (one source of truth): their custom resources and GPU
counts as written, their CPU and object-store figures scaled to a laptop.

Only this cluster's processes are started and stopped: each one runs with the cluster's own
`--temp-dir` on its command line, and `stop()` ends exactly those (never `ray stop`, which
kills every Ray on the machine, nor `ray.cluster_utils.AutoscalingCluster.start()`, which
calls it). Used by the multi-node tests (`tests/cluster/`) and by `docs/laptop-cluster.md`.
Facts about Ray 2.60 behind its autoscaling config (`fake_node_types`): the wheel does not ship
`fake_multi_node/example.yaml`, so every field the launcher validates is written out; the
provider builds each node's GCS address from `provider.gcs_address`, needed when the head's
port is not 6379 (ray/autoscaler/_private/fake_multi_node/node_provider.py).

Every node of such a cluster shares the head's session folder, and with it the folder where
each node's runtime-env agent unpacks a job's `working_dir`. Ray unpacks it with
`overwrite=True` on a node's first use (ray/_private/runtime_env/working_dir.py, `create`;
packaging.py, `download_and_unpack_package` removes the folder and unzips again), which on a
real cluster touches only that node's own disk but here deletes the files the workers of the
nodes that started earlier are importing: a job's actor on a node added while the run started
failed with `ModuleNotFoundError: compassplay.config.run_config` (reproduced 2026-12-04 in
tests/cluster/test_job_submit.py). So each fake worker node gets its own runtime-env folder,
as each real node has its own disk (`OWN_RUNTIME_DIRS`, set in the autoscaler's process).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from compassplay.bench.fake_node_types import (
    REPO_CLUSTER_YAML,
    FakeNodeType,
    autoscaling_config,
    node_types_from_cluster_yaml,
)

log = logging.getLogger(__name__)

# Imported by every Python process started under the head (PYTHONPATH); acts only in Ray's
# autoscaler monitor, where the fake provider builds each worker node's RayParams: the node's
# runtime-env folder is named after its node id instead of the shared `runtime_resources`.
OWN_RUNTIME_DIRS = """\
import os
if os.environ.get("COMPASSPLAY_FAKE_NODE_RUNTIME_DIRS") == "1":
    with open("/proc/self/cmdline", "rb") as _f:
        _monitor = b"autoscaler/_private/monitor.py" in _f.read()
    if _monitor:
        from ray._private import parameter as _parameter
        _init = _parameter.RayParams.__init__

        def _own_runtime_dir(self, *args, **kwargs):
            _init(self, *args, **kwargs)
            node = (kwargs.get("env_vars") or {}).get("RAY_OVERRIDE_NODE_ID_FOR_TESTING")
            if node and kwargs.get("runtime_env_dir_name") is None:
                self.runtime_env_dir_name = "runtime_resources_" + node

        _parameter.RayParams.__init__ = _own_runtime_dir
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_cli() -> str:
    """The `ray` command of this interpreter's environment."""
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else (shutil.which("ray") or "ray")


@dataclass
class FakeCluster:
    """A head node (CPU 0, the autoscaler) whose worker nodes Ray's autoscaler adds and
    removes. `start()` returns the address for `ray.init(address=...)`; `stop()` ends every
    process of this cluster and only those. Seconds throughout."""

    node_types: dict[str, FakeNodeType] = field(default_factory=node_types_from_cluster_yaml)
    idle_timeout_s: float = 6.0
    update_interval_s: int = 1
    dashboard: bool = False
    start_timeout_s: float = 120.0
    temp_dir: Path | None = None
    port: int = 0
    env: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self) -> str:
        """Start the head and its autoscaler; returns the GCS address. Raises RuntimeError
        with `ray start`'s output when the head does not come up."""
        # a short path: Ray's Unix sockets live under it (107 bytes at most)
        self.temp_dir = Path(tempfile.mkdtemp(prefix="cpfc-", dir="/tmp"))
        self.port = self.port or free_port()
        self.dashboard_port = free_port()
        cfg_file = self.temp_dir / "autoscaling.yaml"
        cfg_file.write_text(yaml.safe_dump(autoscaling_config(
            self.node_types, self.address, self.idle_timeout_s)))
        site = self.temp_dir / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(OWN_RUNTIME_DIRS)
        path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
        # a node of a real cluster has the installed package's scripts on PATH (a job's
        # entrypoint `compassplay run` is looked up there); this interpreter's bin folder is
        # that place here, whether or not the caller activated its venv
        scripts = os.pathsep.join(p for p in (str(Path(sys.executable).parent),
                                              os.environ.get("PATH")) if p)
        env = {**os.environ, "PATH": scripts, "RAY_FAKE_CLUSTER": "1",
               "RAY_AUTH_MODE": "disabled",
               "AUTOSCALER_UPDATE_INTERVAL_S": str(int(self.update_interval_s)),
               "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": path,
               "COMPASSPLAY_FAKE_NODE_RUNTIME_DIRS": "1", **self.env}
        cmd = [ray_cli(), "start", "--head", "--num-cpus=0", "--num-gpus=0",
               f"--port={self.port}", "--node-ip-address=127.0.0.1",
               f"--temp-dir={self.temp_dir}", f"--autoscaling-config={cfg_file}",
               "--object-store-memory=100000000", "--disable-usage-stats"]
        cmd += ([f"--dashboard-port={self.dashboard_port}", "--include-dashboard=true",
                 "--dashboard-host=127.0.0.1",
                 # the head's job agent: Ray's fixed default (52365) is often held by another
                 # Ray on the machine, and then the agent serves no HTTP and every job submit
                 # answers "No available agent" (ray/dashboard/agent.py, `run`)
                 f"--dashboard-agent-listen-port={free_port()}"] if self.dashboard
                else ["--include-dashboard=false"])
        log.info("starting a fake multi-node Ray cluster at %s (temp dir %s, node types %s)",
                 self.address, self.temp_dir, ", ".join(self.node_types))
        done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=self.start_timeout_s)
        if done.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start --head failed (rc {done.returncode}):\n"
                               f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        return self.address

    def pids(self) -> list[int]:
        """The processes of this cluster: every process whose command line names its temp dir
        (head and worker raylets, GCS, monitor, actors' workers) or its autoscaling config."""
        if self.temp_dir is None:
            return []
        mark, out = str(self.temp_dir), []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if mark in cmdline:
                out.append(int(entry.name))
        return out

    def raylet_pid(self, node_id: str) -> int:
        """The pid of the raylet of node `node_id` (hex, as `ray.nodes()` lists it).
        LookupError when this cluster runs no such raylet."""
        for pid in self.pids():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (argv and argv[0].endswith(b"/raylet")
                    and f"--node_id={node_id}".encode() in argv):
                return pid
        raise LookupError(f"no raylet of node {node_id} in cluster {self.temp_dir}")

    def kill_node(self, node_id: str) -> list[int]:
        """SIGKILL node `node_id` as a machine lost without warning: its raylet and every
        process under it (the workers holding its actors, their sandboxes, the node's agents)
        at once. The GCS marks the node dead when its health checks fail (about 30 s in Ray
        2.60), the node's actors restart elsewhere, and the autoscaler launches a replacement
        for the demand left pending. Returns the pids killed. (Killing the raylet alone is
        not a lost node: its workers keep serving calls until the GCS marks the node dead.)"""
        raylet = self.raylet_pid(node_id)
        doomed = [raylet, *_descendants(raylet)]
        _signal_all(doomed, signal.SIGKILL)
        log.warning("killed node %s: its raylet (pid %d) and %d processes under it", node_id,
                    raylet, len(doomed) - 1)
        return doomed

    def stop(self, timeout_s: float = 5.0) -> None:
        """End this cluster's processes (SIGTERM, then SIGKILL after `timeout_s`) and remove
        its temp dir."""
        if self.temp_dir is None:
            return
        _signal_all(self.pids(), signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.3)
        _signal_all(self.pids(), signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.temp_dir = None

    def __enter__(self) -> FakeCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` in the process tree (from /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_for(what: str, ok: Callable[[], bool], timeout_s: float, poll_s: float = 0.5) -> float:
    """Poll `ok` until it holds; seconds it took. TimeoutError naming `what` after
    `timeout_s` (logged every 10 s meanwhile)."""
    start = last = time.monotonic()
    while not ok():
        now = time.monotonic()
        if now - start > timeout_s:
            raise TimeoutError(f"{what}: not reached in {timeout_s:.0f} s")
        if now - last > 10:
            log.info("waiting for %s (%.0f s)", what, now - start)
            last = now
        time.sleep(poll_s)
    return time.monotonic() - start


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """`python -m compassplay.bench.fake_cluster [--up] [--dashboard] [--idle-timeout-s S]`:
    print the node types; with `--up`, start a cluster, print its address and hold it until
    Ctrl-C (or SIGTERM), then stop it and only it."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m compassplay.bench.fake_cluster")
    ap.add_argument("--up", action="store_true", help="start a cluster and hold it")
    ap.add_argument("--dashboard", action="store_true", help="start Ray's dashboard too")
    ap.add_argument("--idle-timeout-s", type=float, default=30.0,
                    help="seconds an idle worker node lives before the autoscaler removes it")
    ap.add_argument("--cluster-yaml", type=Path, default=REPO_CLUSTER_YAML)
    args = ap.parse_args(argv)
    types = node_types_from_cluster_yaml(args.cluster_yaml)
    print(json.dumps({n: t.provider_resources() for n, t in types.items()}, indent=1))
    if not args.up:
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cluster = FakeCluster(types, idle_timeout_s=args.idle_timeout_s, dashboard=args.dashboard)
    signal.signal(signal.SIGTERM, _interrupt)
    cluster.start()
    try:
        print(f"RAY_ADDRESS={cluster.address}" + (f"  dashboard {cluster.dashboard_url}"
                                                  if args.dashboard else ""), flush=True)
        print("holding the cluster; Ctrl-C stops it", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        print("cluster stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
