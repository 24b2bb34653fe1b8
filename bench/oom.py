"""Benchmark: ``memspec oom explain`` on pasted logs of 50 MB (issue 17: answered in < 2 s).

Four 50 MB inputs, each ending with a real-format OOM message: a training
log (ordinary lines), a run of digits (the quadratic case of issue 15 item
9), a log whose every line mentions GPU memory, and nothing but OOM messages
back to back (the parser reads the first MiB of message text closely and
counts the rest).  The figure is the
wall time of parse + triage; the ratio compares it with one C-level pass over
the same bytes (``bytes.count``) measured in the same run.
"""

from __future__ import annotations

import time

from bench.common import Row

MB = 1_000_000
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "39.39 GiB of which 1.10 GiB is free. Process 23187 has 27.30 GiB memory in use. Of the allocated memory "
       "8.10 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated.\n")


def inputs(size: int) -> dict[str, bytes]:
    log = b"2026-01-01 12:00:00 INFO step 1234 loss 0.1234 lr 3e-4 throughput 123.4 samples/s grad_norm 1.02\n"
    mem = b"step 1234 gpu memory in use 22.31 GiB, reserved 23.00 GiB, allocated 21.90 GiB (free 0.35 GiB)\n"
    tail = OOM.encode()
    return {
        "training log": log * ((size - len(tail)) // len(log)) + tail,
        "digits": b"7" * (size - len(tail) - 1) + b"\n" + tail,
        "memory on every line": mem * ((size - len(tail)) // len(mem)) + tail,
        "OOM messages back to back": tail * (size // len(tail)),
    }


def run(quick: bool = False) -> list[Row]:
    from memspec.triage import oom as lib

    size = 2 * MB if quick else 50 * MB
    rows = []
    for name, data in inputs(size).items():
        best = base = float("inf")
        for _ in range(1 if quick else 2):
            t0 = time.perf_counter()
            data.count(b"\n")
            base = min(base, time.perf_counter() - t0)
            t0 = time.perf_counter()
            f = lib.parse(data)
            v = lib.triage(f)
            best = min(best, time.perf_counter() - t0)
        assert v.cause == "other-processes", (name, v.cause)
        rows.append(Row(f"oom explain: {size // MB} MB {name}", best, "s", best / base if base else None,
                        "< 2 s", best < 2.0, f"verdict {v.cause}; ratio vs one bytes.count pass"))
    return rows


if __name__ == "__main__":
    for r in run():
        print(f"{r.name}: {r.value:.3f} s (x{r.ratio:.0f} a bytes.count pass) met={r.met}")
