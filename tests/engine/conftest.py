import pytest

from networks import conv_relu_pool_net
from tftrt_py.engine import Builder


@pytest.fixture
def conv_engine():
    return Builder().build_engine(conv_relu_pool_net())
