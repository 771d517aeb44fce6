import pytest

from quantlab.models import build_model


@pytest.fixture(scope="session")
def bundles():
    """build_model(name) once per test session (default config: pretrained, deployment form)."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = build_model(name)
        return cache[name]

    return get
