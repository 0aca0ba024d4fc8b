import pytest
import ray


@pytest.fixture(scope="module")
def ray_local():
    """A real local Ray instance shared by the tests of one module."""
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
