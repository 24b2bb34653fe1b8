"""Test configuration: the Hypothesis profile (``ci`` unless HYPOTHESIS_PROFILE says otherwise), and the
``fresh_process`` marker."""

import os
import subprocess
import sys

import pytest

from memspec import profiles

profiles.load()


_CHILD = "MEMSPEC_TEST_IN_FRESH_PROCESS"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "fresh_process: run this test in a fresh interpreter (Z3's search, hence its time, depends on "
                   "the terms earlier tests left in its global context; the verdict does not)")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked ``fresh_process`` runs alone in a new ``python -m pytest`` (its pass or failure is the
    child's); in that child it runs as usual."""
    if pyfuncitem.get_closest_marker("fresh_process") is None or os.environ.get(_CHILD):
        return None
    root = str(pyfuncitem.config.rootpath)
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                        "--durations=0", "--durations-min=1e9", pyfuncitem.nodeid],
                       cwd=root, capture_output=True, text=True, env={**os.environ, _CHILD: "1"}, timeout=850)
    if p.returncode != 0:
        pytest.fail(f"in a fresh interpreter ({pyfuncitem.nodeid}), exit {p.returncode}:\n"
                    f"{p.stdout[-6000:]}\n{p.stderr[-2000:]}", pytrace=False)
    return True
