import pytest

from parallel import run_root


@pytest.fixture(scope="session")
def data_root(request):
    """One synthetic-data cache for the whole run, every worker's: each dataset is generated once
    (cassava.synthetic writes it under a temporary name and renames it whole, so two jobs that
    generate the same one at once leave one complete copy) and read by every later run."""
    root = run_root(request.config) / "data"
    root.mkdir(exist_ok=True)
    return root
