"""A step's payload traffic as Ray's object directory reports it (`executors.ray.traffic`):
small returns are inline in the driver, large ones sit in the producer's object store."""

import pytest
import ray

from compassplay.executors.ray.traffic import step_traffic

pytestmark = pytest.mark.ray


@ray.remote(num_cpus=0)
class Producer:
    def make(self, n: int) -> bytes:
        return b"x" * n

    def take(self, payload: bytes) -> int:
        return len(payload)


def test_inline_payloads_pass_the_driver_and_large_ones_do_not(ray_local):
    a, b = Producer.remote(), Producer.remote()
    small, big = a.make.remote(1_000), a.make.remote(2_000_000)
    result = b.take.remote(big)
    assert ray.get(result) == 2_000_000 and ray.get(b.take.remote(small)) == 1_000
    row = step_traffic(3, {"propose": small, "solve": [big, None], "learn": result}, result)
    assert row["step"] == 3
    assert row["stages"]["propose"]["inline_bytes"] == row["stages"]["propose"]["bytes"] >= 1_000
    solve = row["stages"]["solve"]
    assert solve["objects"] == 1 and solve["bytes"] >= 2_000_000 and solve["inline_bytes"] == 0
    assert solve["copies"] == 0 and row["cross_node_bytes"] == 0  # one node
    assert row["stages"]["learn"]["objects"] == 0  # the result is counted as the result
    assert row["driver_bytes"] == row["stages"]["propose"]["bytes"] + row["result_bytes"]
    assert 0 < row["driver_share"] < 0.01
