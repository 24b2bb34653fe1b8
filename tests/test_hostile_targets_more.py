"""More hostile targets: what a target may do to the process it runs in (fork,
close the harness's pipe) and values that lie about themselves.  Each test
failed (or hung) before the fix it guards.  A hang here is a call that cannot
finish (a read of a pipe nobody writes), never a slow one; the processes a
target leaves behind end when the test closes that pipe.

The targets are named ``tests.test_hostile_targets_more:NAME`` (with
``--machine tests.hostile_targets:TOY``)."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from memspec.invariants import runner  # noqa: E402
from memspec.invariants.guard import supervise  # noqa: E402
from memspec.spec import api  # noqa: E402
from tests.hostile_targets import TOY_CAPACITY, ToyAllocator, ToyEP, ToyMechanism  # noqa: E402

TOY = "tests.hostile_targets:TOY"
HERE = "tests.test_hostile_targets_more"

#: a pipe the test holds the write end of: a process blocked reading it ends
#: when the test closes that end (set per test, before the fork)
_HOLD: list = []


def _block_forever() -> None:
    """Read the held pipe: a call that cannot finish while the test runs."""
    os.read(_HOLD[0], 1)


def _fork_and_linger() -> None:
    """Fork a grandchild that keeps every inherited descriptor -- the
    harness's pipe among them -- open until the test ends."""
    if os.fork() == 0:
        try:
            os.close(_HOLD[1])
            _block_forever()
        finally:
            os._exit(0)


class _ForkingAllocator(ToyAllocator):
    def allocate(self, request):
        if self.next == 256:   # the first allocation of each example
            _fork_and_linger()
        return super().allocate(request)


class _ClosingAllocator(ToyAllocator):
    calls = 0

    def allocate(self, request):
        _ClosingAllocator.calls += 1
        if _ClosingAllocator.calls == 2:
            # "clean up" every descriptor but our own: the harness's pipe goes too
            for fd in range(3, 1024):
                if fd != _HOLD[0]:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            _block_forever()
        return super().allocate(request)


def _toy_with(cls):
    def factory(capacity=None):
        ep = ToyEP()
        return api.TargetInstance(mechanism=ToyMechanism(cls(ep)), ep=ep, capacity=capacity or TOY_CAPACITY)
    return factory


toy_forks = _toy_with(_ForkingAllocator)
toy_closes_fds_then_hangs = _toy_with(_ClosingAllocator)


@pytest.fixture
def hold():
    # the module the harness resolves the targets in (pytest may have imported
    # this file under another name: its globals would be another module's)
    held = importlib.import_module(HERE)._HOLD
    r, w = os.pipe()
    held[:] = _HOLD[:] = [r, w]
    try:
        yield
    finally:
        held.clear()
        _HOLD.clear()
        os.close(w)   # every process left blocked on the pipe reads its end and exits
        os.close(r)


def _conform(target, **kw):
    kw.setdefault("examples", 5)
    kw.setdefault("steps", 5)
    kw.setdefault("out_dir", None)
    kw.setdefault("timeout", 60)
    return runner.conform(f"{HERE}:{target}", "mechanism", machine=TOY, **kw)


# --------------------------------------------------------------------------
# The process: a fork of the target's holds the pipe; a target closes it
# --------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_supervise_ends_with_its_child_though_a_grandchild_holds_the_pipe(hold):
    def work(ch):
        _fork_and_linger()
        ch.send({"t": "hello"})

    end = supervise(work, timeout=5)
    assert end.death is None
    assert [m["t"] for m in end.messages] == ["hello", "done"]


@pytest.mark.timeout(60)
def test_a_target_that_forks_a_lingering_process_is_judged_not_hung(hold):
    (res,) = _conform("toy_forks")
    assert not res.errors and not res.failures, (res.errors, res.failures)
    assert res.plan.stats.steps > 0


@pytest.mark.timeout(60)
def test_a_target_that_closes_the_harness_pipe_then_hangs_is_a_hang(hold):
    _ClosingAllocator.calls = 0
    (res,) = _conform("toy_closes_fds_then_hangs", timeout=0.5)
    assert len(res.failures) == 1, (res.errors, res.failures)
    f = res.failures[0]
    assert f.cause == "hang" and "did not return within" in f.reason, f.reason
