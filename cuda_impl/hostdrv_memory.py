"""Host driver emulator: the memory calls (memory information, virtual memory management,
linear device memory and host memory), a mixin of :class:`~memspec.cuda_impl.hostdrv.HostDriver`.

Part of :mod:`memspec.cuda_impl.hostdrv` (split along its sections, each module
under 1,200 lines); every name here is a name of that module: import from there.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from cuda.bindings import driver as _cu

from memspec.cuda_impl.hostdrv_state import (HOSTALLOC_DEVICEMAP, HOST_VA_LIMIT, MAP_ANONYMOUS, MAP_FIXED,
    MAP_NORESERVE, MAP_PRIVATE, MAP_SHARED, PROT_NONE, PROT_READ, PROT_WRITE, R, SUCCESS, _HOST_PROT, _HostBlock,
    _Linear, _Mapping, _Page, _Physical, _i, _n, _sys_mmap, _sys_mprotect, _sys_munmap, _too_big)


class _MemoryCalls:
    """HostDriver's memory calls (its state and helpers are HostDriver's)."""

    # ----------------------------------------------------------------------
    # Memory information
    # ----------------------------------------------------------------------
    def cuMemGetInfo(self):
        with self._lock:
            self._count("cuMemGetInfo")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, 0, 0)
            return (SUCCESS, self.capacity - self.used, self.capacity)

    def cuMemGetAllocationGranularity(self, prop: Any, option: Any):
        with self._lock:
            self._count("cuMemGetAllocationGranularity")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, 0)
            bad = self._check_prop(prop)
            if bad is not None:
                return (bad, 0)
            opt = _i(option)
            if opt == int(_cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM):
                return (SUCCESS, self.granularity)
            if opt == int(_cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED):
                return (SUCCESS, self.recommended_granularity)
            return (R.CUDA_ERROR_INVALID_VALUE, 0)

    # ----------------------------------------------------------------------
    # Virtual memory management
    # ----------------------------------------------------------------------
    def cuMemCreate(self, size: int, prop: Any, flags: int):
        with self._lock:
            self._count("cuMemCreate")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, None)
            bad = self._check_prop(prop)
            if bad is not None:
                return (bad, None)
            if _too_big(size):
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            size = _n(size)
            if size is None or size <= 0 or not self._aligned(size) or _i(flags) != 0:
                return (R.CUDA_ERROR_INVALID_VALUE, None)
            if self.used + size > self.capacity:
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            fd = os.memfd_create("memspec-physical", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, size)
            except OSError:
                os.close(fd)
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            h = next(self._handles)
            self._physical[h] = _Physical(h, size, fd)
            self.used += size
            return (SUCCESS, _cu.CUmemGenericAllocationHandle(h))

    def cuMemRelease(self, handle: Any):
        with self._lock:
            self._count("cuMemRelease")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            phys = self._physical.get(_i(handle))
            if phys is None or phys.refs == 0:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            phys.refs -= 1
            if phys.refs == 0 and phys.mappings == 0:
                self._free_physical(phys)
            return (SUCCESS,)

    def cuMemRetainAllocationHandle(self, addr: Any):
        with self._lock:
            self._count("cuMemRetainAllocationHandle")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, None)
            a = _i(addr)
            page = self._pages.get(a - a % self.granularity)
            if page is None:
                return (R.CUDA_ERROR_INVALID_VALUE, None)
            page.mapping.phys.refs += 1
            return (SUCCESS, _cu.CUmemGenericAllocationHandle(page.mapping.phys.handle))

    def cuMemAddressReserve(self, size: int, alignment: int, addr: Any, flags: int):
        with self._lock:
            self._count("cuMemAddressReserve")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, None)
            if _too_big(size) and _n(alignment) is not None and _i(flags) == 0:
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)   # more address space than the host has
            size, alignment = _n(size), _n(alignment)
            if size is None or alignment is None or size <= 0 or not self._aligned(size) or _i(flags) != 0:
                return (R.CUDA_ERROR_INVALID_VALUE, None)
            if alignment < 0 or (alignment and (alignment & (alignment - 1) or not self._aligned(alignment))):
                return (R.CUDA_ERROR_INVALID_VALUE, None)
            align = max(alignment, self.granularity)
            if size + align > HOST_VA_LIMIT:
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)   # more address space than the host has
            # the hint is not honoured (the driver need not honour it either)
            try:
                raw = _sys_mmap(0, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)
            except OSError:
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            base = (raw + align - 1) // align * align
            if base > raw:
                _sys_munmap(raw, base - raw)
            tail = raw + size + align - (base + size)
            if tail:
                _sys_munmap(base + size, tail)
            self._reservations[base] = size
            return (SUCCESS, _cu.CUdeviceptr(base))

    def cuMemAddressFree(self, ptr: Any, size: int):
        with self._lock:
            self._count("cuMemAddressFree")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            base, size = _i(ptr), _n(size)
            if size is None or self._reservations.get(base) != size:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            if next(iter(self._mappings.irange(base, base + size - 1)), None) is not None:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            try:
                _sys_munmap(base, size)
            except OSError:
                return (R.CUDA_ERROR_UNKNOWN,)   # nothing changed: the reservation stays
            del self._reservations[base]
            return (SUCCESS,)

    def cuMemMap(self, ptr: Any, size: int, offset: int, handle: Any, flags: int):
        with self._lock:
            self._count("cuMemMap")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            va, size, offset = _i(ptr), _n(size), _n(offset)
            if size is None or offset is None or size <= 0 or _i(flags) != 0 or not self._aligned(va, size, offset):
                return (R.CUDA_ERROR_INVALID_VALUE,)
            phys = self._physical.get(_i(handle))
            if phys is None or phys.refs == 0 or offset + size > phys.size:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            if self._reservation_of(va, size) is None:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            g = self.granularity
            if any((va + o) in self._pages for o in range(0, size, g)):
                return (R.CUDA_ERROR_INVALID_VALUE,)
            try:
                _sys_mmap(va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, phys.fd, offset)
            except OSError:
                return (R.CUDA_ERROR_OUT_OF_MEMORY,)
            m = _Mapping(va, size, phys, offset)
            self._mappings[va] = m
            for o in range(0, size, g):
                self._pages[va + o] = _Page(m)
            phys.mappings += 1
            return (SUCCESS,)

    def cuMemUnmap(self, ptr: Any, size: int):
        with self._lock:
            self._count("cuMemUnmap")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            va, size = _i(ptr), _n(size)
            m = self._mappings.get(va)
            if m is None or m.size != size:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            try:
                _sys_mmap(va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED)
            except OSError:
                return (R.CUDA_ERROR_OUT_OF_MEMORY,)   # nothing changed: still mapped
            del self._mappings[va]
            for o in range(0, size, self.granularity):
                del self._pages[va + o]
            phys = m.phys
            phys.mappings -= 1
            if phys.refs == 0 and phys.mappings == 0:
                self._free_physical(phys)
            return (SUCCESS,)

    def cuMemSetAccess(self, ptr: Any, size: int, desc: Any, count: int):
        with self._lock:
            self._count("cuMemSetAccess")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            va, size = _i(ptr), _n(size)
            descs = list(desc) if isinstance(desc, (list, tuple)) else [desc]
            if size is None or _n(count) != len(descs) or not descs or size <= 0 or not self._aligned(va, size):
                return (R.CUDA_ERROR_INVALID_VALUE,)
            flags = None
            for d in descs:
                try:
                    if int(d.location.type) != int(_cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE):
                        return (R.CUDA_ERROR_INVALID_VALUE,)
                    if not 0 <= int(d.location.id) < self.device_count:
                        return (R.CUDA_ERROR_INVALID_DEVICE,)
                    f = int(d.flags)
                except (AttributeError, TypeError, ValueError):
                    return (R.CUDA_ERROR_INVALID_VALUE,)
                if f not in _HOST_PROT:
                    return (R.CUDA_ERROR_INVALID_VALUE,)
                flags = f
            g = self.granularity
            pages = [self._pages.get(va + o) for o in range(0, size, g)]
            if any(p is None for p in pages):
                return (R.CUDA_ERROR_INVALID_VALUE,)
            try:
                _sys_mprotect(va, size, _HOST_PROT[flags])
            except OSError:
                return (R.CUDA_ERROR_OUT_OF_MEMORY,)
            for p in pages:
                p.access = flags
            return (SUCCESS,)

    def cuMemGetAccess(self, location: Any, ptr: Any):
        with self._lock:
            self._count("cuMemGetAccess")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, 0)
            a = _i(ptr)
            p = self._pages.get(a - a % self.granularity)
            if p is None:
                return (R.CUDA_ERROR_INVALID_VALUE, 0)
            return (SUCCESS, p.access)

    # ----------------------------------------------------------------------
    # Linear device memory and host memory
    # ----------------------------------------------------------------------
    def cuMemAlloc(self, bytesize: int):
        with self._lock:
            self._count("cuMemAlloc")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, None)
            if not self._ctx_ok():
                return (R.CUDA_ERROR_INVALID_CONTEXT, None)
            if _too_big(bytesize):
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            n = _n(bytesize)
            if n is None or n <= 0:
                return (R.CUDA_ERROR_INVALID_VALUE, None)
            g = self.granularity
            size = -(-n // g) * g
            if self.used + size > self.capacity or size + g > HOST_VA_LIMIT:
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            fd = os.memfd_create("memspec-linear", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, size)
                raw = _sys_mmap(0, size + g, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)
            except OSError:
                os.close(fd)
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            base = (raw + g - 1) // g * g
            try:
                _sys_mmap(base, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0)
            except OSError:
                _sys_munmap(raw, size + g)
                os.close(fd)
                return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
            if base > raw:
                _sys_munmap(raw, base - raw)
            if raw + g - base:
                _sys_munmap(base + size, raw + g - base)
            self._linear[base] = _Linear(base, size, fd)
            self.used += size
            return (SUCCESS, _cu.CUdeviceptr(base))

    def cuMemFree(self, dptr: Any):
        with self._lock:
            self._count("cuMemFree")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            if not self._ctx_ok():
                return (R.CUDA_ERROR_INVALID_CONTEXT,)
            blk = self._linear.get(_i(dptr))
            if blk is None:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            del self._linear[blk.base]
            _sys_munmap(blk.base, blk.size)
            os.close(blk.fd)
            self.used -= blk.size
            return (SUCCESS,)

    def cuMemHostAlloc(self, bytesize: int, flags: int):
        with self._lock:
            self._count("cuMemHostAlloc")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, 0)
            if not self._ctx_ok():
                return (R.CUDA_ERROR_INVALID_CONTEXT, 0)
            if _too_big(bytesize):
                return (R.CUDA_ERROR_OUT_OF_MEMORY, 0)
            n = _n(bytesize)
            if n is None or n <= 0:
                return (R.CUDA_ERROR_INVALID_VALUE, 0)
            try:
                buf = (ctypes.c_char * n)()
            except (MemoryError, OverflowError, ValueError):
                return (R.CUDA_ERROR_OUT_OF_MEMORY, 0)
            base = ctypes.addressof(buf)
            self._host[base] = _HostBlock(base, n, int(flags), buf)
            return (SUCCESS, base)

    def cuMemFreeHost(self, p: Any):
        with self._lock:
            self._count("cuMemFreeHost")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED,)
            base = _i(p)
            if base not in self._host:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            del self._host[base]
            return (SUCCESS,)

    def cuMemHostGetDevicePointer(self, p: Any, flags: int):
        with self._lock:
            self._count("cuMemHostGetDevicePointer")
            if not self._initialized:
                return (R.CUDA_ERROR_NOT_INITIALIZED, None)
            a = _i(p)
            blk = self._block_of(self._host, a)
            if blk is None or not blk.flags & HOSTALLOC_DEVICEMAP or _i(flags) != 0:
                return (R.CUDA_ERROR_INVALID_VALUE, None)
            return (SUCCESS, _cu.CUdeviceptr(a))   # unified addressing: same value
