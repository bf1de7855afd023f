import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("tiny_lm_training", Path(__file__).with_name("tiny_lm_training.py"))
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return tiny.make_tokenizer()


@pytest.fixture
def tiny_lm():
    return tiny


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
