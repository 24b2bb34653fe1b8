"""Targets for ``memspec conform``: ``cuda`` (real driver) and ``cuda-host``
(the host driver emulator).

Each factory returns a fresh :class:`~memspec.spec.api.TargetInstance`:
``mechanism`` (eager ``cuMemAlloc`` allocator + VMM VirtualBacking +
SharedMapping), ``ep`` (streams, event fences, copies, deferred-free queue),
``physical_bytes`` (``total - free`` from ``cuMemGetInfo``, minus what was
in use when the target was made), ``capacity``, ``close``, ``make_foreign``
and ``roles.extra_mechanism`` (both below).  ``extras``, for the tests:

* ``driver``: the checked :class:`~memspec.cuda_impl.driver.Driver`;
* ``emulator``: the :class:`~memspec.cuda_impl.hostdrv.HostDriver` (None on a GPU);
* ``granularity``: the mapping granularity the driver reports;
* ``make_foreign()``: another mechanism instance on the same device and
  context (its handles are *foreign* to ``mechanism``);
* ``make_extra_mechanism()``: an eager-only mechanism (``cuMemAlloc``, no
  VirtualBacking/SharedMapping) on the same device and context, whose
  memory the target's EP can reach: what a system-level harness should
  register as the replacement mechanism (a mechanism on another device,
  e.g. a simulated one, cannot be used through this EP);
* ``faults()``: device faults recorded so far (the emulator's; empty on a GPU,
  where faults surface as ``DeviceFault`` from the EP).
"""

from __future__ import annotations

from typing import Any, Callable

from memspec.spec.api import AllocatorGeometry, MiB, SystemRoles, TargetInstance
from memspec.cuda_impl.context import PrimaryContext
from memspec.cuda_impl.driver import Driver, DriverUnavailable, open_driver
from memspec.cuda_impl.ep import CudaExecutionProvider
from memspec.cuda_impl.mechanism import CudaMechanism

#: default capacity of the emulated device
DEFAULT_HOST_CAPACITY = 1 << 30


def build(
    drv: Driver,
    *,
    capacity: int | None,
    leak_creation_handles: bool = False,
    ep_factory: Callable[..., CudaExecutionProvider] = CudaExecutionProvider,
) -> TargetInstance:
    """Wire a mechanism and an EP on ``drv``'s device 0 into a TargetInstance."""
    ctx = PrimaryContext(drv, 0)
    ep = ep_factory(drv, ctx)
    try:
        mech = CudaMechanism(drv, ctx, leak_creation_handles=leak_creation_handles)
    except BaseException:
        ep.close(force=True)
        raise
    free, total = drv.mem_info()
    baseline = total - free
    foreign: list[CudaMechanism] = []

    def physical_bytes() -> int:
        f, t = drv.mem_info()
        return (t - f) - baseline

    def make_foreign() -> CudaMechanism:
        m = CudaMechanism(drv, ctx)
        foreign.append(m)
        return m

    def make_extra_mechanism() -> CudaMechanism:
        m = CudaMechanism(drv, ctx, vmm=False, name=f"{drv.kind}-eager-extra")
        foreign.append(m)
        return m

    def faults() -> list[Any]:
        return list(drv.emulator.faults) if drv.emulator is not None else []

    def close() -> None:
        """Tear down the EP and every mechanism (force).  Idempotent: each part
        closes once; a part whose close raised stays open and the next
        close() retries it, so nothing is left allocated."""
        errors: list[BaseException] = []
        for part in [ep, mech, *foreign]:
            try:
                part.close(force=True)   # a no-op once that part is closed
            except BaseException as e:  # tear everything down, then report
                errors.append(e)
        if errors:
            raise errors[0]

    cap = total if capacity is None else min(int(capacity), total)
    return TargetInstance(
        mechanism=mech,
        ep=ep,
        physical_bytes=physical_bytes,
        capacity=cap,
        close=close,
        kind="mechanism",
        make_foreign=make_foreign,
        roles=SystemRoles(extra_mechanism=make_extra_mechanism),
        # memspec's own allocator: granularity-rounded, 256-aligned, nothing of its own on the device
        geometry=AllocatorGeometry.page_rounded(mech.granularity()),
        extras={
            "driver": drv,
            "emulator": drv.emulator,
            "granularity": mech.granularity(),
            "make_foreign": make_foreign,
            "make_extra_mechanism": make_extra_mechanism,
            "faults": faults,
        },
    )


def cuda_host(capacity: int | None = None, *, granularity: int = 2 * MiB, **options: Any) -> TargetInstance:
    """The CUDA implementation on the host driver emulator (no GPU needed).
    ``capacity`` is the emulated device's memory (default 1 GiB); other
    options go to :class:`~memspec.cuda_impl.hostdrv.HostDriver` (e.g.
    ``progress="eager"``; the default ``"lazy"`` device runs queued work only
    when the host synchronizes, which keeps fence-ordering bugs observable)."""
    leak = options.pop("leak_creation_handles", False)
    ep_factory = options.pop("ep_factory", CudaExecutionProvider)
    drv = open_driver("host", capacity=DEFAULT_HOST_CAPACITY if capacity is None else int(capacity),
                      granularity=granularity, **options)
    return build(drv, capacity=None, leak_creation_handles=leak, ep_factory=ep_factory)


def cuda(capacity: int | None = None, **options: Any) -> TargetInstance:
    """The CUDA implementation on the real driver.  ``capacity`` caps the bytes
    it may take (OOM beyond it); default: the device's memory.  Raises
    DriverUnavailable with the reason when no CUDA driver/device is present."""
    leak = options.pop("leak_creation_handles", False)
    ep_factory = options.pop("ep_factory", CudaExecutionProvider)
    if options:
        raise TypeError(f"unexpected options for the cuda target: {sorted(options)}")
    try:
        drv = open_driver("cuda")
    except DriverUnavailable as e:
        raise DriverUnavailable(f"target 'cuda' needs a CUDA driver and device: {e} "
                                "(use the 'cuda-host' target to run on the host emulator)") from e
    inst = build(drv, capacity=capacity, leak_creation_handles=leak, ep_factory=ep_factory)
    if capacity is not None:
        # counted from now, so the EP's and mechanism's own setup is not charged to it
        drv.set_limit(int(capacity))
    return inst
