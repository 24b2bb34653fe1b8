"""Benchmark 6: GPU rows, produced by ``tests/gpu/run.sh`` on a CUDA machine.

Only when a CUDA driver answers ``cuInit`` with at least one device; otherwise
each row reads "not run: no CUDA driver" (never counted as met).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import tempfile
from pathlib import Path

from bench.common import NOT_RUN, Row, unavailable

ROWS = (
    ("gpu VMM commit+decommit 1 page vs raw driver", "<= 1.25x"),
    ("gpu VMM commit+decommit 8 pages vs raw driver", "<= 1.25x"),
    ("gpu VMM commit+decommit 64 pages vs raw driver", "<= 1.25x"),
    ("gpu growth: cuda.core VirtualMemoryResource", "side by side"),
    ("gpu growth: PyTorch expandable_segments", "side by side"),
)


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


def run(quick: bool = False, repo: Path | None = None) -> list[Row]:
    why = cuda_driver()
    if why is not None:
        return [unavailable(name, "x", tgt, why, status=NOT_RUN) for name, tgt in ROWS]
    repo = repo or Path(__file__).resolve().parents[1]
    script = repo / "tests" / "gpu" / "run.sh"
    if not script.is_file():
        return [unavailable(name, "x", tgt, "tests/gpu/run.sh has not landed") for name, tgt in ROWS]
    return run_script(script, quick)


def run_script(script: Path, quick: bool) -> list[Row]:
    """Run ``tests/gpu/run.sh`` with ``MEMSPEC_BENCH_JSON`` naming a file for its rows."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "gpu-rows.json"
        env = dict(os.environ, MEMSPEC_BENCH_JSON=str(out))
        if quick:
            env["MEMSPEC_BENCH_QUICK"] = "1"
        proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=900)
        if not out.is_file():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
            return [unavailable(name, "x", tgt, f"run.sh (exit {proc.returncode}) wrote no rows: {tail[0][:100]}")
                    for name, tgt in ROWS]
        data = json.loads(out.read_text())
    rows = []
    for r in data if isinstance(data, list) else data.get("rows", []):
        rows.append(Row(r["name"], r.get("value"), r.get("unit", ""), r.get("ratio"), r.get("target", ""),
                        r.get("met"), r.get("note", ""), extra=r.get("extra", {})))
    return rows
