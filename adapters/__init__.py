"""Adapters: allocators that users actually ship, put under the conformance suite.

One module per ecosystem, each target an entry point of ``memspec.targets``:

* :mod:`.cuda_core` -- ``cuda-core-vmm`` (cuda.core's ``VirtualMemoryResource``;
  on CPU over the host driver emulator) and ``cuda-core-mr`` (any cuda.core
  ``MemoryResource``, GPU only);
* :mod:`.cupy_pool` -- ``cupy-pool`` (CuPy's ``MemoryPool``, GPU only);
* :mod:`.torch_caching` -- ``torch-caching`` (PyTorch's CUDA caching allocator,
  GPU only) and :mod:`.torch_differential` (one trace on PyTorch and on the
  ``pytorch`` preset, compared step by step);
* :mod:`.c_plugin` -- ``c:path/to/libplugin.so``, plugins written against
  ``adapters/c/memspec_plugin.h``.

A target that cannot run here raises :class:`~._common.TargetUnavailable`
with the reason; ``memspec targets`` lists it as unavailable with that reason.
"""
