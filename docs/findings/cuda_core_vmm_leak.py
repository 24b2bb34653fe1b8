"""cuda.core 1.2.2 ``VirtualMemoryResource``: ``deallocate`` never returns the
physical memory (the ``cuMemCreate`` reference taken by ``allocate`` is never
released), so ``cuMemGetInfo`` stays short by every allocation ever freed.

Standalone on CPU: cuda.core's own code over memspec's host driver emulator.
``python docs/findings/cuda_core_vmm_leak.py`` -> exit 1 while the bug is there.
"""
import sys

from memspec.adapters.cuda_core import cuda_core_driver, host_vmm
from memspec.cuda_impl.hostdrv import HostDriver

emu = HostDriver(capacity=1 << 30)
emu.cuInit(0)
with cuda_core_driver(emu, host=True):
    mr = host_vmm()                       # VirtualMemoryResource(0) without Device(0)
    free0 = emu.cuMemGetInfo()[1]
    buf = mr.allocate(4 << 20)
    mr.deallocate(buf.handle, buf.size)
    short = free0 - emu.cuMemGetInfo()[1]
print(f"after allocate(4 MiB) + deallocate, cuMemGetInfo is {short} bytes short")
print("REPRODUCED: the creation handle was never released" if short else "not reproduced (fixed)")
sys.exit(1 if short else 0)
