"""The numpy backend's kernels: the reference numerics (and the calibration engine's)."""
import numpy as np
import pytest

from tftrt_py.engine.reference import ELEMENTWISE_FNS

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("exponent", [np.float32(3.0), np.array([3.0], np.float32), 3])
def test_a_cube_is_within_an_ulp_of_numpys_power(exponent):
    x = RNG.standard_normal((4, 5, 6)).astype(np.float32)
    got, want = ELEMENTWISE_FNS["pow"](x, exponent), np.power(x, exponent)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_max_ulp(got, want.astype(np.float32), maxulp=2)


@pytest.mark.parametrize("a, b", [
    (np.array([2.0, 3.0], np.float32), np.float32(2.5)),  # other exponents
    (np.array([2, 3], np.int32), np.int32(3)),  # integers
    (np.float32(2.0), np.array([[3.0]], np.float32)),  # an exponent that broadcasts the base
    (np.array([2.0, 4.0], np.float32), np.array([3.0, 0.5], np.float32)),  # exponents per element
    (np.array([1.1, -2.3], np.float16), np.float16(3.0)),  # float16: one rounding, not three
])
def test_other_powers_are_numpys(a, b):
    got, want = ELEMENTWISE_FNS["pow"](a, b), np.power(a, b)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
