import os
import sys

import pytest

from networks import conv_relu_pool_net
from tftrt_py.engine import Builder

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "gpu"))  # gpu_bert: its networks run on the CPU too


@pytest.fixture
def conv_engine():
    return Builder().build_engine(conv_relu_pool_net())
