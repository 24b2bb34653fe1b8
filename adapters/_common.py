"""What the adapters share: the "unavailable" error, target options, and the
one place per adapter that fills ``TargetInstance`` fields beyond the
constructor keywords (``extras`` today; typed fields later)."""

from __future__ import annotations

import importlib
import os
from typing import Any

from memspec.spec.errors import MemspecError


class TargetUnavailable(MemspecError, RuntimeError):
    """A target that cannot run on this machine (no GPU, library not
    installed...).  The message is the reason, printed by ``memspec targets``
    and by ``memspec conform``; tests skip with it."""


def option(name: str, default: str | None = None) -> str | None:
    """A target option: ``MEMSPEC_OPTION_<NAME>`` from the environment
    (``memspec conform`` has no per-target options)."""
    return os.environ.get(f"MEMSPEC_OPTION_{name.upper()}", default)


def require_module(module: str, target: str) -> Any:
    """Import ``module`` or raise TargetUnavailable naming the target."""
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure makes the target unavailable
        raise TargetUnavailable(f"target {target!r} needs {module} ({type(e).__name__}: {e})") from e


def require_gpu(target: str) -> None:
    """Raise TargetUnavailable unless the real CUDA driver initialises with a device."""
    from memspec.cuda_impl.driver import real_driver_available

    ok, why = real_driver_available()
    if not ok:
        raise TargetUnavailable(f"target {target!r} needs a CUDA GPU: {why}")


def load_object(spec: str) -> Any:
    """``package.module:attr`` -> the object (never eval)."""
    mod, sep, attr = spec.partition(":")
    if not sep or not mod or not attr:
        raise ValueError(f"{spec!r} is not of the form package.module:attr")
    obj: Any = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
