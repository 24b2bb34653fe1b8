"""The device's primary context, retained while anything made in it lives.

Seed 000: *Establish provider/context pinning: the context is not destroyed
while an allocation is still alive.*  Every live allocation, reservation,
physical handle, queued release and open execution provider holds one pin;
the first pin retains the primary context (``cuDevicePrimaryCtxRetain``) and
the last unpin releases it (``cuDevicePrimaryCtxRelease``), so the driver's
own reference count is non-zero exactly while something is pinned.
"""

from __future__ import annotations

import threading
from typing import Any

from memspec.cuda_impl.driver import Driver


class PrimaryContext:
    """Pins on device ``ordinal``'s primary context, counted."""

    def __init__(self, drv: Driver, ordinal: int = 0) -> None:
        self.drv = drv
        self.ordinal = ordinal
        self.device = drv.cuDeviceGet(ordinal)
        self._ctx: Any = None
        self._pins = 0
        self._lock = threading.Lock()

    @property
    def pins(self) -> int:
        return self._pins

    def pin(self) -> None:
        with self._lock:
            if self._pins == 0:
                self._ctx = self.drv.cuDevicePrimaryCtxRetain(self.device)
                self.drv.cuCtxSetCurrent(self._ctx)
            self._pins += 1

    def unpin(self) -> None:
        with self._lock:
            if self._pins <= 0:
                raise RuntimeError("primary context unpinned more often than pinned")
            self._pins -= 1
            if self._pins == 0:
                self.drv.cuDevicePrimaryCtxRelease(self.device)
                self._ctx = None

    def make_current(self) -> None:
        """Make the context current on the calling thread (contexts are per
        thread in CUDA; a drop may run on any thread).  Requires a pin."""
        with self._lock:
            if self._pins == 0:
                raise RuntimeError("primary context is not retained")
            self.drv.cuCtxSetCurrent(self._ctx)
