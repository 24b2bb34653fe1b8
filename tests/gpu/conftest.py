"""GPU tests: everything under tests/gpu is marked ``gpu`` and skipped, with the
reason, when no real CUDA driver and device are present (a skip is never a pass)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

_available: tuple[bool, str] | None = None


def _driver() -> tuple[bool, str]:
    global _available
    if _available is None:
        from memspec.cuda_impl.driver import real_driver_available

        _available = real_driver_available()
    return _available


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
    gpu_items = [i for i in items if i.get_closest_marker("gpu")]
    if not gpu_items:
        return
    ok, why = _driver()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA driver and device: {why}")
    for item in gpu_items:
        item.add_marker(skip)
