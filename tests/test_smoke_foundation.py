"""The contract types behave as documented."""

import pytest

from memspec.spec import api, errors


def test_identity_never_reused():
    src = api.IdentitySource("t")
    ids = {src.new() for _ in range(1000)}
    assert len(ids) == 1000
    other = api.IdentitySource("t")
    assert other.creator != src.creator


def test_handles_compare_by_identity_not_address():
    src = api.IdentitySource("t")
    dev = api.DeviceKey("sim")
    a = api.DeviceAllocation(0x1000, 10, 512, src.new(), dev)
    b = api.DeviceAllocation(0x1000, 10, 512, src.new(), dev)
    assert a != b and a == a and len({a, b}) == 2


def test_error_classes_distinct():
    assert len(set(errors.ALL_ERRORS.values())) == len(errors.ALL_ERRORS)
    e = errors.OutOfMemory("x", requested=5, free=3)
    assert (e.requested, e.free, e.reserved) == (5, 3, None)
    with pytest.raises(MemoryError):
        raise e
