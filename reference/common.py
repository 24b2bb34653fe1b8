"""Argument checks shared by the reference mechanisms and roles.

Seed 000: *unsupported must not masquerade as a successful no-op* -- and
neither may a malformed request: every check here raises a named error from
:mod:`memspec.spec.errors` *before* any state is touched, so a refused call
leaves the ledger and the device exactly as they were.
"""

from __future__ import annotations

from memspec.spec.errors import InvalidRange, InvalidRequest


def is_int(x: object) -> bool:
    """A real ``int`` (``bool`` is an ``int`` subclass in Python, but a size of
    ``True`` is a bug, not one byte)."""
    return isinstance(x, int) and not isinstance(x, bool)


def check_size(size: object, what: str = "size") -> int:
    """A positive ``int``; anything else (0, negative, float, bool, str) is InvalidRequest."""
    if not is_int(size):
        raise InvalidRequest(f"{what} must be an int, got {type(size).__name__} {size!r}")
    if size <= 0:  # type: ignore[operator]
        raise InvalidRequest(f"{what} must be > 0, got {size}")
    return size  # type: ignore[return-value]


def check_alignment(alignment: object, *, allow_zero: bool = False) -> int:
    """A power of two (or 0 = "no requirement" where allowed)."""
    if not is_int(alignment):
        raise InvalidRequest(f"alignment must be an int, got {type(alignment).__name__} {alignment!r}")
    if allow_zero and alignment == 0:
        return 0
    if alignment <= 0 or alignment & (alignment - 1):  # type: ignore[operator]
        raise InvalidRequest(f"alignment must be a power of two, got {alignment}")
    return alignment  # type: ignore[return-value]


def round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def check_range(start: object, end: object, limit: int, page: int) -> tuple[int, int]:
    """``[start, end)`` inside ``[0, limit)``, non-empty, both ends page aligned.
    Anything else is InvalidRange (seed 000: *commit_range(allocation, range)*)."""
    if not is_int(start) or not is_int(end):
        raise InvalidRange(f"range bounds must be ints, got {start!r}..{end!r}")
    if start < 0 or end <= start:  # type: ignore[operator]
        raise InvalidRange(f"empty, reversed or negative range [{start}, {end})")
    if end > limit:  # type: ignore[operator]
        raise InvalidRange(f"range [{start}, {end}) runs past the reservation's {limit} bytes")
    if start % page or end % page:  # type: ignore[operator]
        raise InvalidRange(f"range [{start}, {end}) is not aligned to the {page}-byte page")
    return start, end  # type: ignore[return-value]
