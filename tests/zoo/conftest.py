"""The zoo's fixture: each model measured once per session (tests/zoo/measure.py), whatever test asks first."""
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "zoo: converts a model-zoo model end to end (deselect with -m 'not zoo')")


@pytest.fixture(scope="session")
def zoo_result(tmp_path_factory):
    """zoo_result(name) -> zoo.measure.ModelResult of zoo model `name`."""
    from zoo.measure import measure

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = measure(name, str(tmp_path_factory.mktemp(f"zoo_{name}")))
        return cache[name]

    return get
