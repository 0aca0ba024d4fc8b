import pytest
import ray


@pytest.fixture(scope="module")
def ray_local():
    """A real local Ray instance shared by the tests of one module, as `ray start --head`
    makes it on a 2-core laptop: the laptop configs must fit in 2 CPUs."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # a 2-core laptop
    yield
    ray.shutdown()
