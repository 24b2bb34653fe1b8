"""cuda.core 1.2.2 ``VirtualMemoryResource.deallocate(ptr, size, stream=s)``
validates ``s`` and ignores it: the range is unmapped at once, while work
queued on ``s`` still uses it (the queued copy then faults).

Standalone on CPU: cuda.core's own code over memspec's host driver emulator,
whose device runs queued work only when the host synchronizes.
``python docs/findings/cuda_core_vmm_stream.py`` -> exit 1 while the bug is there.
"""
import ctypes
import sys

from memspec.adapters.cuda_core import HostStream, cuda_core_driver, host_vmm
from memspec.cuda_impl.hostdrv import HostDriver

emu = HostDriver(capacity=1 << 30)
emu.cuInit(0)
_, dev = emu.cuDeviceGet(0)
_, ctx = emu.cuDevicePrimaryCtxRetain(dev)
emu.cuCtxSetCurrent(ctx)
_, stream = emu.cuStreamCreate(1)
src = ctypes.create_string_buffer(b"\xab" * 64)
with cuda_core_driver(emu, host=True):
    mr = host_vmm()
    buf = mr.allocate(2 << 20)
    emu.cuMemcpyHtoDAsync(buf.handle, ctypes.addressof(src), 64, stream)    # work on s uses the buffer
    mr.deallocate(buf.handle, buf.size, stream=HostStream(stream))         # "free after s's work"
    unmapped = emu.cuMemRetainAllocationHandle(buf.handle)[0] != emu.CUresult.CUDA_SUCCESS
(res,) = emu.cuStreamSynchronize(stream)                                    # now the copy runs
print(f"unmapped before the stream's work ran: {unmapped}; the queued copy then returned {res.name}")
print("REPRODUCED: deallocate ignored its stream" if unmapped else "not reproduced (fixed)")
sys.exit(1 if unmapped else 0)
