import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models run fastest on one thread (and do not fight other processes for cores)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
