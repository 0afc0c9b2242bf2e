"""Every rank runs the same tests in the same order (ops are matched across ranks), inside
one weft session."""
import os
import tempfile

import pytest

import weft


def pytest_configure(config):
    # Ranks share a machine: give each its own temporary root (pytest's default one would
    # be cleaned up by one rank while another writes to it).
    if not config.option.basetemp:
        rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
        root = os.environ.get("TEST_TMPDIR") or tempfile.gettempdir()
        config.option.basetemp = tempfile.mkdtemp(prefix=f"weft-pytest-rank{rank}-", dir=root)


@pytest.fixture(scope="session", autouse=True)
def weft_session():
    weft.init()
    yield
    weft.shutdown()
