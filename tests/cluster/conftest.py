"""A multi-node Ray cluster on this machine, grown by Ray's real autoscaler
(`compassplay.bench.fake_cluster`), shared by the tests of one module: node types from
ray_cluster.yaml, worker nodes launched on demand and removed after they idle a few seconds."""

import pytest
import ray

from compassplay.bench.fake_cluster import FakeCluster


@pytest.fixture(scope="module")
def fake_cluster(request):
    """The module's cluster. Module attributes tune it: `CLUSTER_ENV` (a dict) adds Ray
    settings, `CLUSTER_DASHBOARD = True` starts Ray's dashboard (the Jobs API) on the head,
    `CLUSTER_IDLE_TIMEOUT_S` (default 6) is how long a worker node idles before the
    autoscaler removes it, `CLUSTER_RUNTIME_ENV` is this driver's job runtime env."""
    mod = request.module
    cluster = FakeCluster(idle_timeout_s=float(getattr(mod, "CLUSTER_IDLE_TIMEOUT_S", 6.0)),
                          env=dict(getattr(mod, "CLUSTER_ENV", {})),
                          dashboard=bool(getattr(mod, "CLUSTER_DASHBOARD", False)))
    cluster.start()
    try:
        ray.init(address=cluster.address, log_to_driver=False,
                 runtime_env=getattr(mod, "CLUSTER_RUNTIME_ENV", None))
        yield cluster
    finally:
        ray.shutdown()
        cluster.stop()
