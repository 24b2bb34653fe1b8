"""Focused checks of cuda.core's VirtualMemoryResource, on the real driver or
the host emulator (whichever ``cuda-core-vmm`` gets: ``MEMSPEC_CUDA_DRIVER``).

``python -m memspec.adapters.cuda_core_checks CHECK [--size BYTES]``:

* ``leak``   -- allocate + deallocate, then ``cuMemGetInfo``: the bytes not
  returned (S5: a free answered as done whose bytes did not move);
* ``stream`` -- a copy queued on stream s behind a held stream, then
  ``deallocate(ptr, size, stream=s)``: is the range unmapped while the copy's
  fence is still pending? (S4: *backing is released only after every fence of
  work that used it completed*);
* ``grow``   -- ``modify_allocation`` from 3 to 5 MiB: did the address move,
  what does the Buffer report against what is mapped, does ``deallocate`` of
  the grown buffer succeed, and what does the device hold afterwards.

Each prints its measurements and a verdict line.  Exit status 0 when the
behaviour is the one docs/FINDINGS.md records (measured on the host
emulator), 1 when it differs (on a GPU: the real driver behaves otherwise,
to be recorded), 2 when the check could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Any

from memspec.adapters.cuda_core import cuda_core_vmm, driver_of
from memspec.spec.api import AllocationRequest, MiB

#: seconds before the stream check's watchdog opens the held stream itself
WATCHDOG_S = 5.0


def _target() -> Any:
    return cuda_core_vmm()


def _mapped(inst: Any, address: int) -> bool:
    """Is anything mapped at ``address``? (``cuMemRetainAllocationHandle``, released again)."""
    drv = driver_of(inst)
    res, h = drv.backend.cuMemRetainAllocationHandle(address)
    if res != drv.types.CUresult.CUDA_SUCCESS:
        return False
    drv.backend.cuMemRelease(h)
    return True


def leak(size: int = 4 * MiB) -> dict:
    inst = _target()
    try:
        a = inst.mechanism.allocator()
        before = inst.physical_bytes()
        x = a.allocate(AllocationRequest(size))
        held = inst.physical_bytes() - before
        reported = a.deallocate(x)
        after = inst.physical_bytes() - before
        out = {"driver": driver_of(inst).kind, "size": size, "footprint": x.footprint,
               "held_after_allocate": held, "deallocate_returned": reported, "held_after_deallocate": after,
               "verdict": "REPRODUCED (S5): deallocate left the bytes allocated" if after else "not reproduced"}
        out["as_recorded"] = after == x.footprint
        return out
    finally:
        inst.close()


def stream(size: int = 2 * MiB) -> dict:
    inst = _target()
    ep = inst.ep
    gpu = driver_of(inst).emulator is None
    a = inst.mechanism.allocator()
    x = a.allocate(AllocationRequest(size))
    gate = ep.hold(0)                       # stream 0 (the one deallocate is given) waits on a host word
    fence = ep.write(0, x.address, b"\xab" * 64)
    # a driver that makes the unmap wait for the stream would wait forever on the
    # held stream: a watchdog opens the gate after WATCHDOG_S and says so
    opened_by_watchdog = threading.Event()

    def watchdog() -> None:
        opened_by_watchdog.set()
        gate.open()

    timer = threading.Timer(WATCHDOG_S, watchdog)
    timer.start()
    try:
        a.deallocate(x)                     # cuda.core: deallocate(ptr, size, stream=<stream 0>)
    finally:
        timer.cancel()
    pending = not ep.fence_done(fence)
    mapped = _mapped(inst, x.address)
    out = {"driver": driver_of(inst).kind, "fence_pending_at_release": pending,
           "mapped_after_deallocate": mapped,
           "deallocate_waited_for_the_stream": opened_by_watchdog.is_set()}
    premature = pending and not mapped
    out["verdict"] = ("REPRODUCED (S4): unmapped while the copy queued on the deallocate stream was pending"
                      if premature else
                      f"not reproduced: deallocate blocked until the held stream was opened ({WATCHDOG_S:g} s watchdog)"
                      if out["deallocate_waited_for_the_stream"] else "not reproduced")
    out["as_recorded"] = premature
    if gpu and premature:
        # the queued copy would hit unmapped memory: a sticky context error on a real GPU.
        # Report and leave without running it (the process exit tears the context down).
        print(json.dumps(out, indent=2))
        sys.stdout.flush()
        os._exit(0)
    gate.open()
    try:
        ep.synchronize(0)
        out["queued_copy"] = "completed"
    except Exception as e:  # noqa: BLE001 - the emulator records the fault and reports it here
        out["queued_copy"] = f"{type(e).__name__}: {e}"
    inst.close()
    return out


def grow(first: int = 3 * MiB, new: int = 5 * MiB) -> dict:
    inst = _target()
    try:
        a = inst.mechanism.allocator()
        base = inst.physical_bytes()
        x = a.allocate(AllocationRequest(first))
        y = a.grow(x, new)
        out: dict[str, Any] = {"driver": driver_of(inst).kind, "size": first, "footprint": x.footprint,
                               "new_size": new, "moved": y.address != x.address,
                               "buffer_size_after_grow": y.footprint, "held_after_grow": inst.physical_bytes() - base}
        try:
            a.deallocate(y)
            out["deallocate_after_grow"] = "ok"
        except Exception as e:  # noqa: BLE001
            out["deallocate_after_grow"] = f"{type(e).__name__}: {e}"
        out["held_after_deallocate"] = inst.physical_bytes() - base
        failed = out["deallocate_after_grow"] != "ok"
        out["verdict"] = ("REPRODUCED: the grown buffer cannot be deallocated" if failed
                          else f"deallocate succeeded; {out['held_after_deallocate']} bytes still held")
        out["as_recorded"] = failed
        return out
    finally:
        inst.close()


CHECKS = {"leak": leak, "stream": stream, "grow": grow}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m memspec.adapters.cuda_core_checks", description=__doc__.split("\n\n")[0])
    p.add_argument("check", choices=sorted(CHECKS))
    args = p.parse_args(argv)
    try:
        out = CHECKS[args.check]()
    except Exception as e:  # noqa: BLE001
        print(f"{args.check}: could not run: {type(e).__name__}: {e}")
        return 2
    print(json.dumps(out, indent=2, default=str))
    return 0 if out.get("as_recorded") else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
