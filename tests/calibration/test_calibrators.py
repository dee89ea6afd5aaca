"""Calibrators on known distributions: the histogram they read and the range each picks."""
import numpy as np
import pytest

from tftrt_py.calibration import CALIBRATORS, Histogram, get_calibrator
from tftrt_py.calibration.calibrators import CHUNK, NUM_BINS, entropy_amax, minmax_amax, percentile_amax

RNG = np.random.default_rng(11)


def histogram(data, batches=4):
    h = Histogram()
    for part in np.array_split(np.asarray(data, np.float32), batches):
        h.add(part)
    return h


def test_histogram_grows_its_range_and_keeps_every_count():
    h = Histogram()
    h.add([0.0, 0.0])  # zeros first: bin 0 whatever the range becomes
    h.add(RNG.uniform(-1, 1, 1000))
    h.add(RNG.uniform(-4, 4, 1000))
    assert h.counts.shape == (NUM_BINS,) and h.counts.sum() == pytest.approx(2002)
    assert h.upper == h.amax and 3.9 < h.amax <= 4
    assert h.counts[:NUM_BINS // 4].sum() > h.counts[NUM_BINS // 4:].sum()  # the [-1, 1] batch sits low
    h.add([np.inf, np.nan])  # non-finite values are not counted
    assert h.counts.sum() == pytest.approx(2002)


@pytest.mark.parametrize("size", [10_000, 3 * CHUNK + 17])  # one chunk, and several with a part of one
def test_histogram_counts_each_value_in_the_bin_of_its_magnitude_and_only_finite_ones(size):
    values = RNG.uniform(-3, 3, size).astype(np.float32)
    values[::97] = np.float16(12.5)  # the max: the last bin
    h = Histogram()
    h.add(values.astype(np.float16))
    given = np.concatenate([values, [np.nan, -np.inf]])
    h.add(given)
    np.testing.assert_array_equal(given[:-2], values)  # read, not written
    a = np.abs(values.astype(np.float16).astype(np.float32))
    want = np.bincount(np.minimum((a * np.float32(NUM_BINS / 12.5)).astype(np.int64), NUM_BINS - 1),
                       minlength=NUM_BINS)
    want += np.bincount(np.minimum((np.abs(values) * np.float32(NUM_BINS / 12.5)).astype(np.int64), NUM_BINS - 1),
                        minlength=NUM_BINS)
    np.testing.assert_array_equal(h.counts, want)
    assert h.amax == h.upper == 12.5


def test_a_calibrator_that_reads_only_the_max_keeps_only_the_max():
    h = Histogram(binned=get_calibrator("minmax").binned)
    h.add([0.5, -2.0, np.inf])
    h.add([1.0])
    assert (h.amax, h.counts.sum()) == (2.0, 0.0) and get_calibrator("minmax").amax(h) == 2.0
    assert get_calibrator("entropy").binned and get_calibrator("percentile").binned


def test_entropy_keeps_the_whole_range_of_a_uniform_distribution():
    h = histogram(RNG.uniform(-1, 1, 200_000))
    assert entropy_amax(h) == pytest.approx(h.amax, rel=1e-6)


def test_entropy_clips_heavy_tails():
    body = RNG.standard_normal(100_000)
    outliers = RNG.choice([-1.0, 1.0], 50) * RNG.uniform(20, 40, 50)
    h = histogram(np.concatenate([body, outliers]))
    amax = entropy_amax(h)
    assert 2.5 < amax < 0.25 * h.amax  # the body's range, not the outliers'
    cauchy = histogram(RNG.standard_cauchy(100_000))
    assert entropy_amax(cauchy) < 0.2 * cauchy.amax


def test_entropy_keeps_a_tensor_far_from_zero_whole():
    # Every threshold past the data's lowest bin quantizes it without loss (KL = 0): the largest wins,
    # not the one at the tensor's minimum that would clip almost everything.
    h = histogram(RNG.uniform(5.0, 6.0, 50_000))
    assert entropy_amax(h) == pytest.approx(h.amax, rel=1e-6)


@pytest.mark.parametrize("data", [RNG.standard_normal(50_000), RNG.standard_t(2, 20_000), RNG.uniform(5, 6, 5_000),
                                  RNG.integers(-3, 4, 3_000), RNG.uniform(-1, 1, 200),
                                  np.concatenate([RNG.standard_normal(50_000), [-60.0, 45.0]])],
                         ids=["normal", "heavy tails", "far from zero", "few values", "sparse", "two outliers"])
def test_entropy_judges_every_threshold_as_its_definition_does(data):
    """The divergences of all thresholds at once (prefix sums) are KL(P || Q) of each threshold by itself, to
    rounding, and the threshold picked is the definition's: the least divergence, the largest among equals."""
    from tftrt_py.calibration.calibrators import START_BIN, _comparable, _divergences, _kl_divergence

    h = histogram(data)
    counts = h.counts
    outliers = np.concatenate([np.cumsum(counts[::-1])[::-1], [0.0]])
    below = np.concatenate([[0.0], np.cumsum(counts)])
    thresholds = np.arange(START_BIN, NUM_BINS + 1)
    thresholds = thresholds[_comparable(thresholds, counts, below, outliers)]
    one_by_one = np.array([_kl_divergence(counts[:i], outliers[i], 128) for i in thresholds])
    np.testing.assert_allclose(_divergences(counts, below, outliers, thresholds, 128), one_by_one, rtol=1e-9,
                               atol=1e-12)
    least = one_by_one.min()
    assert entropy_amax(h) == h.edges[thresholds[one_by_one == least].max()]


def test_minmax_and_percentile():
    data = np.concatenate([RNG.uniform(-1, 1, 100_000), [-7.0]])
    h = histogram(data)
    assert minmax_amax(h) == 7.0
    assert 0.99 < percentile_amax(h) < 1.01  # one value in 100001 is beyond the 99.99th percentile
    assert percentile_amax(histogram(RNG.uniform(-2, 2, 1000))) <= 2.0


def test_empty_and_zero_histograms_give_zero():
    for name in CALIBRATORS:
        assert get_calibrator(name).amax(Histogram()) == 0.0
        assert get_calibrator(name).amax(histogram(np.zeros(10), batches=1)) == 0.0


def test_calibrators_by_name():
    assert {name: c.header for name, c in CALIBRATORS.items()} == {
        "entropy": "EntropyCalibration2", "minmax": "MinMaxCalibration", "percentile": "PercentileCalibration"}
    assert get_calibrator("MinMax").name == "minmax"
    with pytest.raises(ValueError, match="unknown calibration algorithm 'kl'; use one of entropy, minmax, percentile"):
        get_calibrator("kl")



class HostDevice:
    """A backend's device statistics (Backend.finite_abs_max, Backend.bin_counts) computed with numpy: the cupy
    backend's kernels are held to these by tests/engine/gpu/test_calibration_on_gpu.py."""

    @staticmethod
    def finite_abs_max(a):
        finite = np.abs(a[np.isfinite(a)])
        return float(finite.max()) if finite.size else -1.0

    @staticmethod
    def bin_counts(a, scale, bins):
        finite = np.abs(a[np.isfinite(a)]).astype(np.float32)
        return np.bincount(np.minimum(finite * np.float32(scale), np.float32(bins - 1)).astype(np.int64),
                           minlength=bins)


def test_a_histogram_counts_a_device_array_from_its_devices_statistics_as_it_counts_a_host_array():
    """Zeros first (every finite value in bin 0), then ranges that grow; NaN and inf left out; a batch of only
    non-finite values counts nothing."""
    rng = np.random.default_rng(4)
    host, device = Histogram(), Histogram()
    batches = [np.zeros(100, np.float32), np.array([np.nan, np.inf], np.float32)]
    batches += [rng.standard_normal(5_003).astype(np.float32) * (1 + i) for i in range(3)]
    batches[-1][:3] = [np.nan, -np.inf, 0.0]
    for a in batches:
        host.add(a)
        device.add(a, HostDevice)
        assert device.upper == host.upper and device.amax == host.amax
        np.testing.assert_array_equal(device.counts, host.counts)
    assert host.counts.sum() == pytest.approx(100 + 5_003 * 3 - 2)
