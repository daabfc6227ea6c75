import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# "ci": fast and deterministic enough for every push; "thorough": for local runs and the GPU box.
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=400, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
# Under compute-sanitizer every launch is slow: a handful of examples per property.
settings.register_profile("sanitize", max_examples=4, deadline=None, derandomize=True,
                          suppress_health_check=list(HealthCheck))
PROFILE = os.environ.get("PYDSA_HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)


def examples(n: int) -> int:
    """Examples for a property whose CI budget is n: ten times more in the thorough profile, the
    profile's handful under the sanitizer."""
    return {"thorough": 10 * n, "sanitize": min(n, 8)}.get(PROFILE, n)

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")

# The same tests run on the host backend everywhere and on the GPU where there is one.
DEVICES = [pytest.param("cpu", id="host"),
           pytest.param("cuda", id="gpu", marks=[pytest.mark.gpu, gpu])]


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)
