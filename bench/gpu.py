"""Benchmark 6: GPU rows, from the latency step of ``tests/gpu/run.sh``
(``tests/gpu/gpu_tool.py latency``): VMM commit/decommit of 1, 8, 64 pages
through the cuda_impl VirtualBacking vs the raw driver call sequence
(cuMemCreate + cuMemMap + cuMemRelease per page and one cuMemSetAccess; one
cuMemUnmap per page).  Target <= 1.25x.

Only when a CUDA driver answers ``cuInit`` with at least one device;
otherwise every row reads "not run: no CUDA driver" (never counted as met).
``MEMSPEC_BENCH_GPU_TARGET=cuda-host`` runs the same rows on the host driver
emulator instead (to check the plumbing without a GPU; the figures then say
nothing about a GPU and are labelled so).

The growth workload side by side with cuda.core's
``VirtualMemoryResource.modify_allocation`` and PyTorch's
``expandable_segments:True`` has no driver in ``tests/gpu`` yet; on a CUDA
machine those rows say so.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path

from bench.common import NOT_AVAILABLE, NOT_RUN, Row, unavailable

PAGES = (1, 8, 64)
GROWTH = (
    ("gpu growth: cuda.core VirtualMemoryResource.modify_allocation", "side by side"),
    ("gpu growth: PyTorch expandable_segments:True", "side by side"),
)


def _names() -> list[tuple[str, str]]:
    out = []
    for n in PAGES:
        out.append((f"gpu VMM commit {n} page{'s' if n > 1 else ''} vs raw driver", "<= 1.25x"))
        out.append((f"gpu VMM decommit {n} page{'s' if n > 1 else ''} vs raw driver", "<= 1.25x"))
    return out + list(GROWTH)


def cuda_driver() -> str | None:
    """``None`` when a CUDA driver with a device is present, else the reason."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver"
    if lib.cuInit(0) != 0:
        return "no CUDA driver (cuInit failed)"
    n = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value == 0:
        return "no CUDA device"
    return None


def _gpu_tool(repo: Path):
    path = repo / "tests" / "gpu" / "gpu_tool.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("memspec_gpu_tool", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("memspec_gpu_tool", mod)
    spec.loader.exec_module(mod)
    return mod


def run(quick: bool = False, repo: Path | None = None) -> list[Row]:
    target = os.environ.get("MEMSPEC_BENCH_GPU_TARGET", "cuda")
    if target == "cuda":
        why = cuda_driver()
        if why is not None:
            return [unavailable(name, "x", tgt, why, status=NOT_RUN) for name, tgt in _names()]
    repo = repo or Path(__file__).resolve().parents[1]
    tool = _gpu_tool(repo)
    if tool is None or not hasattr(tool, "latency"):
        return [unavailable(name, "x", tgt, "tests/gpu/gpu_tool.py (latency) has not landed") for name, tgt in _names()]
    old = os.environ.get("MEMSPEC_CUDA_DRIVER")
    if target == "cuda-host":
        os.environ["MEMSPEC_CUDA_DRIVER"] = "host"
    try:
        lat = tool.latency(target, reps=3 if quick else 20, sizes=PAGES)
    finally:
        if target == "cuda-host":
            if old is None:
                os.environ.pop("MEMSPEC_CUDA_DRIVER", None)
            else:
                os.environ["MEMSPEC_CUDA_DRIVER"] = old
    label = "" if target == "cuda" else " [host emulator: plumbing check, not a GPU figure]"
    rows = []
    for r in lat:
        n = r["pages"]
        pl = f"page{'s' if n > 1 else ''}"
        for verb in ("commit", "decommit"):
            ratio = r[f"{verb}_ratio"]
            rows.append(Row(f"gpu VMM {verb} {n} {pl} vs raw driver", r[f"{verb}_us"], "us", ratio, "<= 1.25x",
                            (ratio <= 1.25) if target == "cuda" else None, f"raw {r[f'raw_{verb}_us']:.1f} us (median){label}",
                            extra={**r, "target": target}))
    reason = ("no growth workload in tests/gpu yet (cuda.core VirtualMemoryResource / PyTorch not wired)"
              if target == "cuda" else "host emulator: no cuda.core / PyTorch side")
    rows += [unavailable(name, "x", tgt, reason, status=NOT_AVAILABLE if target == "cuda" else NOT_RUN)
             for name, tgt in GROWTH]
    return rows
