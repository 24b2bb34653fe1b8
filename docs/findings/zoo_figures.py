#!/usr/bin/env python
"""The zoo's packing figures (docs/FINDINGS.md, "The zoo"): for one fixed set
of requests, each allocator's footprint as its shim reports it (the library's
own answer), the excess over the request, and where the library keeps a
header.  Run: ``python docs/findings/zoo_figures.py NAME`` (jemalloc needs
GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096 in the environment)."""
import sys

from memspec.adapters import zoo
from memspec.spec.api import AllocationRequest

SIZES = [1, 8, 24, 100, 1000, 4096, 5000, 65536, 100_000, 1 << 20, 3 << 20]
ALIGNS = [16, 256, 4096, 2 << 20]


def main(name: str) -> None:
    inst = zoo.factory(name)(64 << 20)
    a = inst.mechanism.allocator()
    req = fp = hdr = n = 0
    worst = (0.0, None)
    try:
        for align in ALIGNS:
            for size in SIZES:
                x = a.allocate(AllocationRequest(size, align))
                req, fp, n = req + size, fp + x.footprint, n + 1
                hdr += x.address - x.block if x.block is not None else 0
                r = x.footprint / size
                if r > worst[0]:
                    worst = (r, (size, align, x.footprint))
                a.deallocate(x)
    finally:
        inst.close()
    print(f"{name} ({zoo.library_version(name)}): {n} requests, {req} bytes asked, {fp} bytes of footprint "
          f"(+{100 * (fp - req) / req:.2f}%), bytes between block and address (header or alignment) {hdr}, worst ratio {worst[0]:.1f} at "
          f"(size, alignment, footprint) = {worst[1]}")


if __name__ == "__main__":
    main(sys.argv[1])
