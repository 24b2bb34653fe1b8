"""cuda.core 1.2.2 ``VirtualMemoryResource.modify_allocation``: a buffer grown
(3 -> 5 MiB) cannot be deallocated on the host emulator: the grown Buffer's
size is the unaligned new size and its range is two mappings (and, after the
slow path, two retained handles), but ``deallocate`` unmaps ``(ptr, size)`` in
one ``cuMemUnmap``.  The emulator refuses that (CUDA_ERROR_INVALID_VALUE, rule
R3: unmap exactly what one cuMemMap mapped); what the real driver answers is
for the GPU run to record (tests/gpu/run.sh, step cuda-core-grow).

``python docs/findings/cuda_core_vmm_grow.py`` -> exit 1 while it fails.
"""
import sys

from memspec.adapters.cuda_core import cuda_core_driver, host_vmm
from memspec.cuda_impl.hostdrv import HostDriver

emu = HostDriver(capacity=1 << 30)
emu.cuInit(0)
with cuda_core_driver(emu, host=True):
    mr = host_vmm()
    buf = mr.allocate(3 << 20)                       # 4 MiB mapped (2 MiB granularity)
    old = buf.handle
    grown = mr.modify_allocation(buf, 5 << 20)       # the emulator never honours the address hint: slow path
    print(f"moved: {grown.handle != old}; Buffer.size {grown.size}; device holds "
          f"{emu.cuMemGetInfo()[2] - emu.cuMemGetInfo()[1]} bytes")
    try:
        mr.deallocate(grown.handle, grown.size)
        failed = None
    except Exception as e:  # noqa: BLE001
        failed = f"{type(e).__name__}: {e}"
print(f"REPRODUCED: deallocate of the grown buffer failed: {failed}" if failed else "not reproduced (deallocate ok)")
sys.exit(1 if failed else 0)
