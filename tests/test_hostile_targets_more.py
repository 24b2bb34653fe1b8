"""More hostile targets: what a target may do to the process it runs in (fork
processes that outlive it, close the harness's pipe, interrupt its process
group), fields of its instance that are not what they say (capacity, kind),
and answers that lie about themselves (ints equal to everything, identities
whose hash raises, at the mechanism and the caching level).  Each test failed
(or hung) before the fix it guards.  A hang here is a call that cannot
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
    harness's pipe among them -- open until the test ends (it says its pid
    on the held pipe's second pair, when there is one)."""
    if os.fork() == 0:
        try:
            os.close(_HOLD[1])
            if len(_HOLD) == 4:
                os.write(_HOLD[3], b"%d\n" % os.getpid())
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
    pr, pw = os.pipe()   # the lingering processes' pids
    held[:] = _HOLD[:] = [r, w, pr, pw]
    try:
        yield
    finally:
        held.clear()
        _HOLD.clear()
        os.close(w)   # every process left blocked on the pipe reads its end and exits
        os.close(r)
        os.close(pr)
        os.close(pw)


def _lingering_pids() -> list:
    os.set_blocking(_HOLD[2], False)
    try:
        data = os.read(_HOLD[2], 1 << 16)
    except BlockingIOError:
        data = b""
    return [int(x) for x in data.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


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
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_the_processes_a_target_forks_do_not_outlive_its_run(hold):
    import time

    (res,) = _conform("toy_forks")
    pids = _lingering_pids()
    assert pids
    # killed with the run's process group: each is gone (or a zombie) as soon as the kill lands;
    # before, each lived on, blocked on the held pipe, until the test closed it
    until = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < until:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)]


def toy_factory_interrupts_its_group(capacity=None):
    import signal

    os.kill(0, signal.SIGINT)     # its process group: once the supervisor's too
    return _toy_with(ToyAllocator)(capacity)


def test_a_target_that_interrupts_its_process_group_does_not_interrupt_the_harness():
    import subprocess

    code = ("import signal, sys; sys.path.insert(0, %r)\n"
            # SIGINT as an interactive Python has it: a suite started in the background by a
            # non-interactive shell inherits SIGINT ignored, and the target's interrupt then does nothing
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from memspec.invariants import runner\n"
            "res = runner.conform(%r, 'mechanism', machine=%r, examples=2, steps=3, out_dir=None, timeout=60)\n"
            "print('RESULT', [(r.level, r.errors) for r in res])\n") % (ROOT, f"{HERE}:toy_factory_interrupts_its_group", TOY)
    # a session of its own: on the code before the fix the SIGINT reached this process's group
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       start_new_session=True)
    # the harness ran to its result (before the fix: a KeyboardInterrupt traceback, exit 130), and the
    # factory's own interrupt is its error
    assert p.returncode == 0, p.stderr[-2000:]
    assert "RESULT [('mechanism', [" in p.stdout and "KeyboardInterrupt" in p.stdout, p.stdout[-2000:]
    assert "Traceback" not in p.stderr, p.stderr[-2000:]


@pytest.mark.timeout(60)
def test_a_target_that_closes_the_harness_pipe_then_hangs_is_a_hang(hold):
    _ClosingAllocator.calls = 0
    (res,) = _conform("toy_closes_fds_then_hangs", timeout=0.5)
    assert len(res.failures) == 1, (res.errors, res.failures)
    f = res.failures[0]
    assert f.cause == "hang" and "did not return within" in f.reason, f.reason


# --------------------------------------------------------------------------
# Values that lie: an int equal to everything, an identity whose hash raises
# --------------------------------------------------------------------------

class EqualsEverything(int):
    """An int that says it equals whatever it is compared with."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__


class RaisingIdentity:
    """A handle identity whose hash, equality and repr raise."""

    def __hash__(self):
        raise RuntimeError("__hash__ of the target's identity exploded")

    def __eq__(self, other):
        raise RuntimeError("__eq__ of the target's identity exploded")

    def __repr__(self):
        raise RuntimeError("__repr__ of the target's identity exploded")


class _LyingAllocator:
    def __init__(self, inner, mode):
        self._inner, self._mode = inner, mode

    def __getattr__(self, k):
        return getattr(self._inner, k)

    def allocate(self, request):
        import dataclasses

        a = self._inner.allocate(request)
        if self._mode == "size":
            return dataclasses.replace(a, size=EqualsEverything(1))
        if self._mode == "identity":
            return dataclasses.replace(a, identity=RaisingIdentity())
        return a

    def deallocate(self, allocation):
        got = self._inner.deallocate(allocation)
        return EqualsEverything(0) if self._mode == "free" else got


class _LyingMechanism:
    def __init__(self, inner, mode):
        self._inner, self._alloc = inner, _LyingAllocator(inner.allocator(), mode)

    def __getattr__(self, k):
        return getattr(self._inner, k)

    def allocator(self):
        return self._alloc


def _reference_lying(mode):
    def factory(capacity=None):
        from memspec.reference.targets import reference_eager

        inst = reference_eager(capacity) if capacity is not None else reference_eager()
        inst.mechanism = _LyingMechanism(inst.mechanism, mode)
        return inst
    return factory


reference_size_equals_everything = _reference_lying("size")
reference_identity_hash_raises = _reference_lying("identity")
reference_free_equals_everything = _reference_lying("free")


def _conform_reference(target):
    return runner.conform(f"{HERE}:{target}", "mechanism", examples=5, steps=10, out_dir=None, timeout=60)


def _failed(res):
    return {(f.invariant, f.cause) for f in res.failures}


def test_an_allocation_whose_size_equals_everything_is_a_failure_not_a_pass():
    (res,) = _conform_reference("reference_size_equals_everything")
    assert not res.errors, res.errors
    assert ("S8", "outcome") in _failed(res), res.failures


def test_an_identity_whose_hash_raises_is_the_targets_failure_not_a_spec_error():
    (res,) = _conform_reference("reference_identity_hash_raises")
    assert not res.errors, res.errors   # was: "spec error: allocate: following branch ... raised RuntimeError"
    assert ("S8", "outcome") in _failed(res), res.failures


def test_a_free_that_answers_an_int_equal_to_everything_is_blamed_on_the_free():
    (res,) = _conform_reference("reference_free_equals_everything")
    assert not res.errors, res.errors
    assert ("S1", "outcome") in _failed(res), res.failures


# --------------------------------------------------------------------------
# A factory's fields: the capacity and the kind are plain values
# --------------------------------------------------------------------------

class StrEqualToEverything(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


def _reference_with(**fields):
    def factory(capacity=None):
        from memspec.reference.targets import reference_eager

        inst = reference_eager(capacity) if capacity is not None else reference_eager()
        for k, v in fields.items():
            setattr(inst, k, v)
        return inst
    return factory


reference_capacity_negative = _reference_with(capacity=-1)              # was: ERROR "spec error: mechanism.init"
reference_capacity_nan = _reference_with(capacity=float("nan"))         # was: a mechanism level run (FAIL S8)
reference_capacity_bool = _reference_with(capacity=True)                # was: FAIL S8.capacity
reference_capacity_huge = _reference_with(capacity=1 << 200)            # was: "harness error: malformed result"
reference_kind_equal_to_everything = _reference_with(kind=StrEqualToEverything("caching"))


@pytest.mark.parametrize("target, words", [
    ("reference_capacity_negative", "has capacity -1 "),
    ("reference_capacity_nan", "has capacity nan of type float"),
    ("reference_capacity_bool", "has capacity True of type bool"),
    ("reference_capacity_huge", "has capacity 1606938044"),
    ("reference_kind_equal_to_everything", "of type StrEqualToEverything"),
])
def test_a_bad_capacity_or_kind_is_the_targets_error_before_any_level(target, words):
    results = runner.conform(f"{HERE}:{target}", "all", examples=3, steps=5, out_dir=None, timeout=60)
    assert [(r.level, len(r.errors), r.failures) for r in results] == [("all", 1, [])], \
        [(r.level, r.errors, r.failures) for r in results]
    (err,) = results[0].errors
    assert words in err, err
    assert "(a positive int below 2**63, or None)" in err or "(one of mechanism, caching)" in err, err
    assert "spec error" not in err and "harness error" not in err


# --------------------------------------------------------------------------
# The caching level: a block handle and a figure that lie
# --------------------------------------------------------------------------

class _Block:
    """A block handle of the target's own, wrapping the reference's."""

    def __init__(self, inner, **fields):
        self._inner = inner
        self.address, self.size = inner.address, inner.size
        self.requested_size, self.stream = inner.requested_size, inner.stream
        self.__dict__.update(fields)


class _LyingCaching:
    def __init__(self, inner, mode):
        self._inner, self._mode = inner, mode

    def __getattr__(self, k):
        return getattr(self._inner, k)

    def malloc(self, size, stream=0):
        b = self._inner.malloc(size, stream)
        if self._mode == "size":    # every field an int equal to everything: the block says it is 1 byte
            return _Block(b, address=EqualsEverything(b.address), size=EqualsEverything(1),
                          requested_size=EqualsEverything(b.requested_size), stream=EqualsEverything(b.stream))
        if self._mode == "address":
            return _Block(b, address=str(b.address))
        return b

    def free(self, block):
        return self._inner.free(getattr(block, "_inner", block))

    def record_stream(self, block, stream):
        return self._inner.record_stream(getattr(block, "_inner", block), stream)

    def empty_cache(self):
        got = self._inner.empty_cache()
        return EqualsEverything(0) if self._mode == "empty" else got

    def memory_stats(self):
        got = self._inner.memory_stats()
        if self._mode == "stats":    # every figure an int equal to everything (0)
            return {k: EqualsEverything(0) if type(v) is int else v for k, v in got.items()}
        return got


def _caching_lying(mode):
    def factory(capacity=None):
        from memspec.reference.caching_targets import pytorch_preset

        inst = pytorch_preset(capacity) if capacity is not None else pytorch_preset()
        inst.allocator = _LyingCaching(inst.allocator, mode)
        return inst
    return factory


caching_block_equal_to_everything = _caching_lying("size")      # was: PASS
caching_block_str_address = _caching_lying("address")           # was: ERROR "spec error: malloc: following branch ..."
caching_empty_cache_equal_to_everything = _caching_lying("empty")  # was: PASS
caching_stats_equal_to_everything = _caching_lying("stats")     # was: PASS


@pytest.mark.parametrize("target, inv", [
    ("caching_block_equal_to_everything", "C4"),
    ("caching_block_str_address", "C4"),
    ("caching_empty_cache_equal_to_everything", "C6"),
    ("caching_stats_equal_to_everything", "C1"),
])
def test_a_caching_answer_that_lies_or_is_not_an_int_is_a_failure(target, inv):
    (res,) = runner.conform(f"{HERE}:{target}", "caching", examples=10, steps=10, out_dir=None, timeout=60)
    assert not res.errors, res.errors
    assert inv in {f.invariant for f in res.failures}, res.failures


# --------------------------------------------------------------------------
# conform --corpus runs the target's code too: supervised
# --------------------------------------------------------------------------

@pytest.mark.parametrize("target, words", [
    ("toy_factory_os_exits", "exited with status 0"),
    ("toy_factory_exits_0", "raised SystemExit: 0"),
])
def test_corpus_with_a_factory_that_exits_0_is_an_error_never_green(target, words):
    import subprocess

    p = subprocess.run([sys.executable, "-m", "memspec", "conform", "--corpus", f"tests.hostile_targets:{target}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])   # was 0, nothing printed
    assert words in p.stderr and target in p.stderr, p.stderr[-2000:]


# --------------------------------------------------------------------------
# memspec targets probes every plugin's factory: supervised, its text escaped
# --------------------------------------------------------------------------

def toy_factory_raises_markup(capacity=None):
    raise RuntimeError("[/] an unbalanced closing tag [bold]")


_TARGETS_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from memspec.invariants import discovery
from memspec.invariants.discovery import TargetRef
import tests.hostile_targets as H
import tests.test_hostile_targets_more as M

refs = [TargetRef("exits-0", H.toy_factory_os_exits, "test"), TargetRef("markup", M.toy_factory_raises_markup, "test"),
        TargetRef("bad-import", None, "test", error="ImportError: [/] no module"), TargetRef("toy", H.toy, "test")]
discovery.list_targets = lambda: refs
from memspec.commands import targets
print("RC", targets.main([]))
"""


def test_targets_lists_a_factory_that_exits_or_raises_markup_and_goes_on():
    import subprocess

    p = subprocess.run([sys.executable, "-c", _TARGETS_SCRIPT.format(root=ROOT)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    # was: exit status 0 with nothing listed (the factory's os._exit ended memspec), and a MarkupError
    assert p.returncode == 0 and "RC 0" in p.stdout, (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    out = " ".join(p.stdout.replace("│", " ").split())
    assert "exits-0: unavailable: probing it: the process exited with status 0" in out, out
    assert "markup: unavailable: RuntimeError: [/] an unbalanced closing tag [bold]" in out, out
    assert "bad-import: import failed: ImportError: [/] no module" in out, out
    assert "toy mechanism allocator, ep available" in out, out


# --------------------------------------------------------------------------
# A thread of the target's holding the interpreter lock between calls
# --------------------------------------------------------------------------

def _holds_the_gil_forever(ch) -> None:
    """A thread takes the interpreter lock into C and sleeps there (``PyDLL``: the lock is not released),
    while the main thread is between calls, in the harness's own code: no call is ever inside."""
    import ctypes
    import threading

    threading.Thread(target=lambda: ctypes.PyDLL(None).sleep(3600), daemon=True).start()
    while True:   # the harness's code: it needs the lock, which it never gets back
        pass


def _busy_outside_calls(ch) -> None:
    """Slow, CPU-bound work between calls (a long spec check, a shrink): not stuck."""
    import time

    end = time.process_time() + 2.0
    while time.process_time() < end:
        pass


@pytest.mark.timeout(120)
def test_a_thread_holding_the_interpreter_lock_between_calls_is_a_hang_not_a_hang_forever():
    from memspec.invariants.guard import supervise

    end = supervise(_holds_the_gil_forever, timeout=5.0, idle=1.0)
    assert end.hang and "no target call and used no CPU" in (end.death or ""), end.death


@pytest.mark.timeout(120)
def test_cpu_bound_work_outside_calls_is_not_taken_for_stuck():
    from memspec.invariants.guard import supervise

    end = supervise(_busy_outside_calls, timeout=5.0, idle=0.5)
    assert not end.hang and end.death is None, end.death


# --------------------------------------------------------------------------
# A target that signals its parent; a target that floods the harness's pipe
# --------------------------------------------------------------------------

def toy_signals_its_parent(capacity=None):
    """At its third allocation the target sends ``MEMSPEC_TEST_SIGNAL`` to its parent process."""
    import signal

    sig = getattr(signal, os.environ["MEMSPEC_TEST_SIGNAL"])

    class _Signalling(ToyAllocator):
        calls = 0

        def allocate(self, request):
            _Signalling.calls += 1
            if _Signalling.calls == 3:
                os.kill(os.getppid(), sig)
            return super().allocate(request)

    return _toy_with(_Signalling)(capacity)


def _conform_in_a_process(target: str, env: dict):  # type: ignore[no-untyped-def]
    import subprocess

    code = ("import sys; sys.path.insert(0, %r)\n"
            "from memspec.invariants import runner\n"
            "res = runner.conform(%r, 'mechanism', machine=%r, examples=3, steps=5, out_dir=None, timeout=60)\n"
            "print('RESULT', [(r.level, r.errors, [(f.cause, f.reason) for f in r.failures]) for r in res])\n"
            ) % (ROOT, target, TOY)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          start_new_session=True, env={**os.environ, **env})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGSTOP"])
def test_a_target_that_signals_its_parent_does_not_stop_the_harness(sig):
    """Before: the target's parent was the harness itself -- SIGTERM ended ``memspec conform`` (exit 143)
    and SIGSTOP stopped it for good.  Now the parent is a shield that ignores what it can and is continued
    when stopped: the run goes on to its verdict, here a clean one (the toy keeps every rule)."""
    p = _conform_in_a_process(f"{HERE}:toy_signals_its_parent", {"MEMSPEC_TEST_SIGNAL": sig})
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert "RESULT [('mechanism', [], [])]" in p.stdout, p.stdout[-2000:]


@pytest.mark.timeout(300)
def test_a_target_that_kills_its_parent_is_a_crash_of_the_target_not_of_the_harness():
    p = _conform_in_a_process(f"{HERE}:toy_signals_its_parent", {"MEMSPEC_TEST_SIGNAL": "SIGKILL"})
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert "RESULT [('mechanism', [], [('crash', 'the process died of signal SIGKILL" in p.stdout, p.stdout[-2000:]


@pytest.mark.timeout(120)
def test_a_line_without_end_on_the_harness_pipe_is_dropped_not_kept(monkeypatch):
    """The pipe is in reach of the target's code: 32 MiB written into it with no newline are dropped
    as they arrive (the cap, 1 MiB here), and the messages after them still read."""
    import tracemalloc

    from memspec.invariants import guard

    monkeypatch.setattr(guard, "MAX_MESSAGE", 1 << 20)

    def work(ch):
        block = b"x" * (1 << 16)
        for _ in range(512):
            os.write(ch.fd, block)
        os.write(ch.fd, b"\n")
        ch.send({"t": "hello"})

    tracemalloc.start()
    try:
        end = supervise(work, timeout=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert end.death is None, end.death
    assert [m["t"] for m in end.messages] == ["hello", "done"]
    assert peak < 8 << 20, peak   # before: the 32 MiB line was kept whole (and joined: twice that)


@pytest.mark.timeout(300)
def test_a_target_that_prints_without_end_fills_no_log():
    """The worker's stdout and stderr pass through its shield, capped: 40 MiB of prints come out as the
    cap's 4 MiB and a line saying what was dropped; the print before them, and the run, are intact.
    Before: all 40 MiB reached the harness's output."""
    import subprocess

    code = ("import os, sys; sys.path.insert(0, %r)\n"
            "from memspec.invariants import guard\n"
            "def work(ch):\n"
            "    print('hello from the target', flush=True)\n"
            "    block = 'y' * (1 << 20)\n"
            "    for _ in range(20):\n"
            "        sys.stdout.write(block); sys.stderr.write(block)\n"
            "    sys.stdout.flush(); sys.stderr.flush()\n"
            "    ch.send({'t': 'hello'})\n"
            "end = guard.supervise(work, timeout=120)\n"
            "print('RESULT', end.death, [m['t'] for m in end.messages], getattr(guard, 'MAX_TARGET_OUTPUT', None))\n"
            ) % (ROOT,)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, timeout=240)
    out, err = p.stdout.decode(), p.stderr.decode()
    assert p.returncode == 0, err[-2000:]
    assert out.startswith("hello from the target\n"), out[:200]
    assert len(out) + len(err) < (4 << 20) + 4096, (len(out), len(err))
    assert f"RESULT None ['hello', 'done'] {4 << 20}" in out, out[-300:]
    assert "the target's output past 4194304 bytes was dropped" in err, err[-300:]
