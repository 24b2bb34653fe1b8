"""memspec: an executable spec of device-memory management, its reference and
CUDA implementations, and a conformance suite for allocator plugins.

Import roots: ``memspec.spec`` (the model and the contract),
``memspec.reference``, ``memspec.cuda_impl``, ``memspec.invariants``.
"""

__version__ = "0.1.0"
