"""memspec: an executable spec of device-memory management, its reference and
CUDA implementations, and a conformance suite for allocator plugins.

Import roots: ``memspec.spec`` (the model and the contract),
``memspec.reference``, ``memspec.cuda_impl``, ``memspec.invariants``.
"""

__version__ = "0.1.0"

import os as _os

if _os.environ.get("MEMSPEC_NATIVE"):  # opt-in compiled hot paths (memspec/native.py); pure Python otherwise
    from memspec import native as _native

    _native.enable_from_env()
