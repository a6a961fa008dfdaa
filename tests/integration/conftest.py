import pytest


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """One synthetic-data cache for the whole session: generated once, read by every run."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """The local Cloud Storage server (scripts/local_gcs.py), one for the whole session; every
    test makes buckets of its own."""
    from scripts.local_gcs import LocalGCS

    with LocalGCS(tmp_path_factory.mktemp("gcs")) as server:
        yield server


@pytest.fixture
def gcs(gcs_server):
    """The server, with the faults and latency a test injected cleared after it."""
    yield gcs_server
    gcs_server.clear_faults()
