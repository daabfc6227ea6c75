import os

import pytest
import torch
from hypothesis import HealthCheck, settings

TESTS = os.path.dirname(os.path.abspath(__file__))
CLONE = os.path.dirname(TESTS)


def _why_pydsa_cannot_be_imported() -> str | None:
    """Why pydsa cannot be imported here, with where the tests can run, or None. First what the tests need most:
    compiled modules where Python finds pydsa (after a wheel install, `python -m pytest` in the clone finds the
    clone's sources first, which have none); then the import itself (a namesake in the way, a stale build)."""
    import importlib.machinery
    import importlib.metadata as md
    import importlib.util
    compiled = tuple("_read" + suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES)
    spec = importlib.util.find_spec("pydsa")
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    if folders and not any(os.path.isfile(os.path.join(f, name)) for f in folders for name in compiled):
        try:
            installed = [str(f.locate()) for f in md.distribution("dsa-kernels").files or ()
                         if f.parts[0] == "pydsa" and f.name in compiled]
        except md.PackageNotFoundError:
            installed = []
        if installed:
            return (f"the tests import pydsa from the sources at {folders[0]}, which have no compiled modules and hide "
                    f"the installed pydsa at {os.path.dirname(installed[0])} (Python puts the current directory first "
                    f"on sys.path). Run them from outside the clone, where they test the installed package: cd /tmp "
                    f"&& python -m pytest -q {TESTS}; or build the clone editable instead: pip install "
                    f"--no-build-isolation -e {CLONE} (or bash {CLONE}/setup.sh), then run them from anywhere.")
        return (f"pydsa at {folders[0]} has no compiled modules and none is installed: build the clone first, pip "
                f"install --no-build-isolation -e {CLONE} (or bash {CLONE}/setup.sh), then python -m pytest -q {TESTS}.")
    try:
        import pydsa  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


def pytest_configure(config):
    """Every test imports pydsa: when it cannot be imported, one message saying why and where the tests run, not
    one traceback per test module."""
    why = _why_pydsa_cannot_be_imported()
    if why is not None:
        pytest.exit(f"pydsa cannot be imported, so no test can run: {why}", returncode=4)


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
_needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")


def gpu(test):
    """A test that runs on the GPU only: marked `gpu` (the GPU suite, pytest -m gpu, selects it) and skipped
    where there is no GPU."""
    return pytest.mark.gpu(_needs_gpu(test))


# The same tests run on the host backend everywhere and on the GPU where there is one.
DEVICES = [pytest.param("cpu", id="host"),
           pytest.param("cuda", id="gpu", marks=[pytest.mark.gpu, _needs_gpu])]


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)
