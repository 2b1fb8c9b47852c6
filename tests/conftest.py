import os

# Engine self-checks (cohort ordering) on in tests.
os.environ.setdefault("KVSIM_DEBUG", "1")

import pytest
from hypothesis import HealthCheck, settings

# CI runs the full property budgets; a developer can lower them with HYPOTHESIS_PROFILE=dev.
settings.register_profile("ci", deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture()
def store():
    """An explorer upload store (a private temporary folder), closed after the test."""
    from sim import explorer as X

    s = X.UploadStore()
    yield s
    s.close()
