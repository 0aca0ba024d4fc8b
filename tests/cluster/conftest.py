"""A multi-node Ray cluster on this machine, grown by Ray's real autoscaler
(`compassplay.bench.fake_cluster`), shared by the tests of one module: node types from
ray_cluster.yaml, worker nodes launched on demand and removed after 6 idle seconds."""

import pytest
import ray

from compassplay.bench.fake_cluster import FakeCluster


@pytest.fixture(scope="module")
def fake_cluster(request):
    """The module's cluster; a module's `CLUSTER_ENV` (a dict) adds Ray settings to it, and
    `CLUSTER_DASHBOARD = True` starts Ray's dashboard (the Jobs API) on the head."""
    cluster = FakeCluster(idle_timeout_s=6.0,
                          env=dict(getattr(request.module, "CLUSTER_ENV", {})),
                          dashboard=bool(getattr(request.module, "CLUSTER_DASHBOARD", False)))
    cluster.start()
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.stop()
