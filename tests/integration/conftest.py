import pytest


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """One synthetic-data cache for the whole session: generated once, read by every run."""
    return tmp_path_factory.mktemp("data")

