"""The package as installed: under Bazel the tests run against the wheel pip installed into a
virtual environment (launch_env.sh), never against the build tree."""
import importlib.metadata
import os

import weft


def test_the_package_under_test_is_the_installed_one():
    venv = os.environ.get("WEFT_TEST_INSTALLED")
    if not venv:
        return  # run by hand against bazel-bin
    assert weft.__file__.startswith(venv + "/"), weft.__file__
    assert importlib.metadata.version("weft") == weft.__version__
