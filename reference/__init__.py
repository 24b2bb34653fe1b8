"""Pure-Python reference implementation of every role of seed 000 on an
honest simulated device.  Imports only ``memspec.spec.api`` and
``memspec.spec.errors`` from the spec (checked by tests/test_layering.py; rules in docs/ARCHITECTURE.md).

Modules, by role:

* ``device``     -- SimDevice: lazily backed physical pages, page table with
                    rw/ro permissions, streams, fences, explicit clock, recorded faults;
                    RangeAllocator (best fit over sortedcontainers).
* ``eager``      -- EagerAllocator (DeviceAllocator); footprint = size rounded up to the page.
* ``vmm``        -- VaSpace (reservation table) and ReferenceVirtualBacking.
* ``shared``     -- ReferenceSharedMapping (handles, refcounts, read-only, copy-on-write).
* ``mechanism``  -- ReferenceMechanism bundles: full / eager_only / vmm_only.
* ``governor``   -- ReferenceGovernor: grants, leases, pressure tickets.
* ``ep``         -- ReferenceEP: copies, kernels, fences, deferred-free queue.
* ``handles``    -- RefAllocation / RefReservation: owning handles whose drop only enqueues.
* ``manager``    -- ReferenceManager (ProcessMemoryManager) and ReferenceBinding (MemoryBinding).
* ``holders``    -- ModelResidency and KvPageStore.
* ``system``     -- build_system(instance) -> ReferenceSystem (SystemUnderTest).
* ``targets``    -- the ``reference``, ``reference-eager``, ``reference-vmm`` target factories.
* ``caching``, ``caching_stats``, ``caching_export``, ``caching_snapshot``, ``caching_targets``
                 -- seed 003's caching allocator, its statistics, its snapshot export,
                    snapshot load/replay/drawing, and its conformance targets.
"""
