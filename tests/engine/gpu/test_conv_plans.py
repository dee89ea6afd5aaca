"""cuDNN plans timed per convolution on the GPU: at most `cudnn_runtime_plans` of them runtime-compiled (with 0, a
graph that has only runtime-compiled plans gives none, and the next fusion variant is tried)."""
import pytest

from tftrt_py.engine.backends.cupy import _device
from tftrt_py.engine.backends.cupy.context import RunContext
from tftrt_py.engine.backends.cupy.ops.conv import ConvGeom, CudnnConvGraph

from gpu_helpers import GPU, healthy_gpu  # noqa: F401 (autouse fixture)

pytestmark = GPU

#: ResNet-50's 1x1 expansion convolutions with bias, residual and ReLU fused (batch 8): on an H100 (cuDNN 9.19)
#: every plan of these is runtime-compiled.
CASES = {"stage1": (8, 56, 64, 256), "stage4": (8, 7, 512, 2048)}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("runtime_limit", [0, 1])
def test_at_most_runtime_limit_runtime_compiled_plans(case, runtime_limit):
    if _device.cudnn_module() is None:
        pytest.skip("nvidia-cudnn-frontend is not installed")
    n, hw, c, cout = CASES[case]
    geom = ConvGeom(n, (hw, hw), c, cout, (1, 1), 1, (1, 1), (1, 1), (0, 0), (0, 0), (hw, hw))
    rc = RunContext(None)
    graph = CudnnConvGraph(geom, "float16", True, n, {"type": "relu"}, "all", False, 1 << 30, rc.cudnn)
    plans = graph.plans(2, None, runtime_limit)
    runtime = [i for i, _, _ in plans if graph._runtime_compiled(i)]
    assert len(runtime) <= runtime_limit
    assert plans or runtime_limit == 0, "no plan built"
    assert len(plans) == len({i for i, _, _ in plans})
