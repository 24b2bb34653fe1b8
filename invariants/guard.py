"""Calling untrusted target code: the per-call guard and the supervisor.

A conformance run executes code the harness does not trust (the target's
factory, its mechanism, its roles).  Two layers keep a misbehaving target
from turning a run green, hanging it or killing it -- with no signal
injected into the Python code that runs (no ``SIGALRM``):

* :class:`CallGuard` runs one call and turns *anything* it raises
  (``SystemExit`` and other ``BaseException`` included) into a value the
  engine judges.  Before each call it writes into a :class:`Watch` -- a few
  bytes of memory shared with the supervising process -- a call counter,
  "inside a call", and the invariant and action a hang here is blamed on.
  That costs a ``struct.pack_into``, no system call.
* :func:`supervise` runs the whole conformance work in a forked child and
  watches it: a call that stays inside the target longer than the timeout
  (also in C code: ``ctypes``, a blocking read), a segfault, ``os._exit``,
  or a child that dies any other way is reported by the parent from what
  the child had already said (the level, the example's steps so far) and
  the Watch; the parent then carries on with the next level or target.

In a process without a supervisor (a reproduction, a random walk in the
foreground, the benchmarks) :class:`CallGuard` in ``"thread"`` mode runs
calls on a worker thread and waits with a timeout, abandoning a hung one.
A random walk uses ``"watched"`` mode instead (:meth:`CallGuard.run_watched`):
a whole run goes to the worker thread once and its calls are direct, each
bumping a counter the waiting thread polls -- the :class:`Watch` protocol
between two threads -- so a step pays no thread hand-off per call.
"""

from __future__ import annotations

import json
import mmap
import os
import queue
import select
import signal
import struct
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from memspec.invariants.errors import HangResult

# --------------------------------------------------------------------------
# The watch: what the child is doing, in shared memory
# --------------------------------------------------------------------------

_LAYOUT = struct.Struct("<QI4xd32s96s")   # calls started, inside a call, seconds allowed, blame, what
_HEAD = struct.Struct("<QI")              # calls started, inside a call

#: seconds a target's factory (and the wiring of a level around it) may take
#: at least: a first call imports the target's modules
BUILD_SECONDS = 20.0


class Watch:
    """A shared-memory slot (``mmap`` made before ``fork``): the child writes,
    the supervisor reads."""

    def __init__(self) -> None:
        self.mem = mmap.mmap(-1, _LAYOUT.size)
        self.calls = 0
        self._said: tuple = ()   # (blame, what, limit) written last

    def enter(self, blame: str, what: str, limit: float) -> None:
        self.calls += 1
        said = self._said
        if said and said[0] is blame and said[1] is what and said[2] == limit:
            # the same call site again (a step's data reads): only the counter and "inside"
            _HEAD.pack_into(self.mem, 0, self.calls, 1)
            return
        self._said = (blame, what, limit)
        _LAYOUT.pack_into(self.mem, 0, self.calls, 1, limit, blame.encode("utf-8", "replace")[:32],
                          what.encode("utf-8", "replace")[:96])

    def leave(self) -> None:
        struct.pack_into("<I", self.mem, 8, 0)

    def read(self) -> tuple[int, bool, float, str, str]:
        calls, inside, limit, blame, what = _LAYOUT.unpack_from(self.mem, 0)
        dec = lambda b: b.rstrip(b"\0").decode("utf-8", "replace")  # noqa: E731
        return calls, bool(inside), limit, dec(blame), dec(what)


#: one encoder for every message (``json.dumps`` with options builds a new one per call)
_ENCODE = json.JSONEncoder(default=repr, separators=(",", ":")).encode

_LOG_HEAD = struct.Struct("<QQ")   # bytes of step lines written, steps of the run so far


class StepLog:
    """The current example's steps, in memory shared with the supervisor
    (``mmap`` made before ``fork``, like the :class:`Watch`).

    The supervised child appends each step -- one JSON line, written before
    the call into the target -- and starts over at each example; the
    supervisor reads it only when the child died, to report the steps up to
    the call that never came back.  A step costs a slice assignment and a
    ``struct.pack_into``: no system call, and no wake-up of the supervisor
    (which, on the pipe, parsed every step of every example to keep the
    same record).  A step that does not fit (an example of more than
    ``size`` bytes of steps) is not written here: ``append`` says so and the
    caller sends it on the channel instead, where the supervisor keeps it
    after the ones here."""

    #: the log of this process when it is a supervised child
    current: "StepLog | None" = None
    SIZE = 4 << 20   # anonymous shared memory: pages are only committed as they are written

    def __init__(self, size: int | None = None) -> None:
        size = size or StepLog.SIZE
        self.mem = mmap.mmap(-1, size)
        self.size = size
        self.used = 0

    def reset(self) -> None:
        """A new example: its steps start here."""
        self.used = 0
        struct.pack_into("<Q", self.mem, 0, 0)

    def append(self, msg: dict, steps: int) -> bool:
        """Write one step (``steps``: the run's step count with it); False
        when it does not fit (the caller sends it on the channel)."""
        data = (_ENCODE(msg) + "\n").encode()
        start = _LOG_HEAD.size + self.used
        end = start + len(data)
        if end > self.size:
            return False
        self.mem[start:end] = data
        self.used += len(data)
        _LOG_HEAD.pack_into(self.mem, 0, self.used, steps)   # the line is complete before it is counted
        return True

    def read(self) -> tuple[list, int]:
        """``(steps as parsed dicts, the run's step count)`` -- untrusted:
        ``json.loads`` only; a line that does not parse is left out."""
        used, steps = _LOG_HEAD.unpack_from(self.mem, 0)
        used = min(used, self.size - _LOG_HEAD.size)
        out = []
        for line in bytes(self.mem[_LOG_HEAD.size:_LOG_HEAD.size + used]).split(b"\n"):
            if not line:
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                out.append(msg)
        return out, steps


# --------------------------------------------------------------------------
# The per-call guard
# --------------------------------------------------------------------------

class CallGuard:
    """Run implementation calls; ``call`` returns ``(value, None)`` or
    ``(None, error)`` for anything the call raised (a hang, in thread mode, is
    a :class:`~memspec.invariants.errors.HangResult` error).

    ``blame``/``what`` name the invariant a hang or crash in the next calls
    is blamed on and what they are doing; the engine sets them before it
    calls the target.

    Modes: ``"direct"`` (under a supervisor: the call runs on the caller's
    thread and the :class:`Watch` says it is inside the target), ``"thread"``
    (no supervisor: a persistent worker thread runs the call and the caller
    waits at most ``timeout`` seconds), ``"watched"`` (the calls run directly
    inside a unit of work that :meth:`run_watched` put on a worker thread;
    the thread waiting for it sees a call that stays inside the target too
    long), ``"auto"`` (direct when a watch is installed in this process,
    else thread).
    """

    #: the watch of this process when it is a supervised child
    watch: Watch | None = None

    def __init__(self, timeout: float = 5.0, mode: str = "auto") -> None:
        self.timeout = float(timeout)
        if mode == "auto" or mode == "signal":   # "signal" is gone: no injected exceptions
            mode = "direct" if CallGuard.watch is not None else "thread"
        self.mode = mode
        self.blame = ""
        self.what = ""
        #: seconds the next calls may take when not ``timeout`` (building a target)
        self.limit: float | None = None
        self._worker: _Worker | None = None
        #: ``"watched"`` mode: calls started, and how deep inside calls the worker is
        self.calls = 0
        self.depth = 0
        self._owner: int | None = None

    def install(self) -> None:
        """Kept for callers of the former signal mode: nothing to install."""

    def uninstall(self) -> None:
        """Kept for callers of the former signal mode: nothing to undo."""

    def _hung(self) -> HangResult:
        r = HangResult(f"did not return within {self.timeout:g} s")
        # Once a target has hung, shrinking replays the hang many times: wait
        # less from now on (a call that takes this long already failed once).
        self.timeout = max(0.05, min(self.timeout, self.timeout / 4))
        return r

    def call(self, fn: Callable, *args: Any, **kwargs: Any) -> tuple[Any, BaseException | None]:
        mode = self.mode
        if mode == "watched":
            if threading.get_ident() != self._owner:
                # a unit of work abandoned in a hang came back: it must not
                # touch the target or the counters of the work after it
                raise Abandoned("this unit of work was abandoned in a hang")
            self.calls += 1
            self.depth += 1
            try:
                return fn(*args, **kwargs), None
            except BaseException as e:  # noqa: BLE001 - a target may raise anything, SystemExit included
                return None, e
            finally:
                self.depth -= 1
        if mode != "direct":
            return self._thread_call(fn, args, kwargs)
        w = CallGuard.watch
        if w is not None:
            w.enter(self.blame, self.what, self.limit or self.timeout)
        try:
            return fn(*args, **kwargs), None
        except BaseException as e:  # noqa: BLE001 - a target may raise anything, SystemExit included
            return None, e
        finally:
            if w is not None:
                w.leave()

    def _new_worker(self) -> _Worker:
        """A worker thread of this guard's, told to end when the guard is collected (else every guard a
        long run or a test session makes would leave its thread waiting for work for good)."""
        w = self._worker = _Worker()
        weakref.finalize(self, w.jobs.put, None)
        return w

    def _thread_call(self, fn: Callable, args: tuple, kwargs: dict) -> tuple[Any, BaseException | None]:
        if self._worker is None:
            self._new_worker()
        box: list = []
        ev = threading.Event()
        self._worker.jobs.put((fn, args, kwargs, box, ev))
        if not ev.wait(self.limit or self.timeout):
            self._worker = None  # abandoned: it is stuck in the target
            return None, self._hung()
        return box[0]


    def run_watched(self, fn: Callable, *args: Any, poll: float | None = None) -> tuple[Any, BaseException | None]:
        """``"watched"`` mode: run ``fn(*args)`` -- a unit of work whose
        target calls go through this guard -- on the worker thread and wait
        for it, polling the guard's call counter every ``poll`` seconds.  A
        call that stays inside the target longer than its allowance
        (``limit`` or ``timeout``) is a hang: the worker is abandoned and
        ``(None, HangResult)`` returned, with ``blame``/``what`` naming the
        call, as the hung worker left them.  ``poll`` defaults to a tenth of
        the timeout (10-250 ms): each wake-up takes the GIL from the worker."""
        if self.mode != "watched":
            raise ValueError(f"run_watched needs a guard in 'watched' mode, not {self.mode!r}")
        if self._worker is None:
            self._new_worker()
        box: list = []
        ev = threading.Event()
        self.depth = 0
        self._owner = self._worker.ident
        self._worker.jobs.put((fn, args, {}, box, ev))
        if poll is None:
            poll = min(0.25, max(0.01, self.timeout / 10))
        last, since = -1, time.monotonic()
        while not ev.wait(poll):
            calls, inside = self.calls, self.depth > 0
            now = time.monotonic()
            if calls != last or not inside:
                last, since = calls, now
            elif now - since > (self.limit or self.timeout):
                self._worker = self._owner = None  # abandoned: it is stuck in the target
                return None, self._hung()
        return box[0]


class Abandoned(BaseException):
    """Raised in a unit of work that :meth:`CallGuard.run_watched` abandoned
    when it calls the guard again (its target call came back after all)."""


class _Worker:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        t = threading.Thread(target=self._loop, name="memspec-call", daemon=True)
        t.start()
        self.ident = t.ident

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:   # its guard is gone (an abandoned worker reads this once its call returns)
                return
            _run_job(*job)
            del job   # nothing of the call (its guard among it) stays referenced while the thread waits


def _run_job(fn: Callable, args: tuple, kwargs: dict, box: list, ev: threading.Event) -> None:
    try:
        box.append((fn(*args, **kwargs), None))
    except BaseException as e:  # noqa: BLE001
        box.append((None, e))
    ev.set()


# --------------------------------------------------------------------------
# The supervisor
# --------------------------------------------------------------------------

class Channel:
    """The child's end: one JSON object per line to the supervisor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, msg: dict) -> None:
        data = (_ENCODE(msg) + "\n").encode()
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]


@dataclass
class Ending:
    """How a supervised child ended: ``messages`` it sent (parsed), and
    when it did not finish its work, ``death`` (what killed it) with the
    :class:`Watch` reading at that moment (``inside``, ``blame``, ``what``)."""

    messages: list = field(default_factory=list)
    death: str | None = None
    #: when the child died: the steps of its last example from its :class:`StepLog`
    #: (parsed, untrusted), and the run's step count it had written with them
    log: list = field(default_factory=list)
    log_steps: int = 0
    hang: bool = False
    blame: str = ""
    what: str = ""


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"the process died of signal {name}" + (" (a segmentation fault)" if sig == signal.SIGSEGV else "")
    if os.WIFEXITED(status):
        return f"the process exited with status {os.WEXITSTATUS(status)} (os._exit or the like)"
    return f"the process ended with wait status {status}"


def fork(child: Callable[[], int]) -> int:
    """The one way memspec forks (the supervisor here, ``memspec prove``'s
    fresh processes in :mod:`~memspec.invariants.forked`): in the child,
    ``child()`` runs with the fault handler off (a crash is the parent's to
    report, not a stack dump on the terminal) and the process leaves with
    ``os._exit`` of its result -- 3 if it raised anything, ``SystemExit``
    included --, so it never returns into the parent's stack or runs the
    parent's exit handlers.  Returns the child's pid (the caller reaps it)."""
    pid = os.fork()
    if pid == 0:  # the child
        code = 3
        try:
            try:
                import faulthandler

                faulthandler.disable()
            except Exception:  # noqa: BLE001
                pass
            code = child()
        except BaseException:  # noqa: BLE001 - the exit status says it; nothing may unwind into the parent's code
            code = 3
        finally:
            os._exit(code)
    return pid


def _own_group() -> None:
    """In a supervised child: a process group of its own (a signal the target
    sends its group -- ``os.kill(0, SIGINT)`` -- reaches no supervisor, and
    the processes it forks are killed with the child), and, on Linux, death
    with the thread that forked it (Ctrl-C reaches the supervisor only now:
    the child must not outlive it)."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    _die_with_parent()


def _die_with_parent() -> None:
    """On Linux: SIGKILL when the thread that forked this process ends."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _deaf() -> None:
    """In the shield: every signal that can be ignored is (the supervisor ends it with SIGKILL, which
    cannot): a target's ``os.kill(os.getppid(), SIGTERM)`` then changes nothing, where a dying shield
    would end the worker at some later point of its run, not at the call that sent it."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            continue
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (OSError, ValueError, RuntimeError):
            pass


#: the most bytes of a worker's own output (its stdout and stderr together: the target's prints and
#: warnings) the shield passes on; past it, one line says how much was dropped (a target printing
#: without end fills no log and no disk, and never blocks on a full pipe: the rest is read and dropped)
MAX_TARGET_OUTPUT = 4 << 20


def _relay(pid: int, pipes: dict[int, int]) -> int:
    """In the shield: pass what the worker writes on ``pipes`` (read end -> the shield's own descriptor,
    1 or 2) on, up to :data:`MAX_TARGET_OUTPUT` bytes, until the worker ``pid`` ends; return its wait
    status.  The worker's end is seen on its pidfd where there is one (else every 50 ms)."""
    try:
        ends = [os.pidfd_open(pid)]
    except (AttributeError, OSError):
        ends = []
    passed = dropped = 0
    live = dict(pipes)

    def pass_on(rd: int) -> bool:
        nonlocal passed, dropped
        try:
            data = os.read(rd, 1 << 16)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            del live[rd]
            return False
        keep = data[:max(0, MAX_TARGET_OUTPUT - passed)]
        passed += len(keep)
        dropped += len(data) - len(keep)
        try:
            view = memoryview(keep)
            while view:
                view = view[os.write(live[rd], view):]
        except OSError:   # the shield's own output is gone (a closed pipe): the rest is dropped
            passed = MAX_TARGET_OUTPUT
        return True

    status = None
    while status is None:
        try:
            ready, _, _ = select.select(list(live) + ends, [], [], None if ends else 0.05)
        except InterruptedError:
            continue
        for rd in ready:
            if rd in live:
                pass_on(rd)
        wpid, st = os.waitpid(pid, os.WNOHANG)
        if wpid:
            status = st
    for rd in list(live):   # what it wrote before it ended (bounded: a process it forked may write on)
        os.set_blocking(rd, False)
        for _ in range(256):
            if not pass_on(rd):
                break
    if dropped:
        try:
            os.write(2, f"memspec: the target's output past {MAX_TARGET_OUTPUT} bytes was dropped "
                        f"({dropped} bytes so far)\n".encode())
        except OSError:
            pass
    return status


def _end_as(status: int) -> int:
    """In the shield (below): end the way the worker ended (its wait ``status``) -- of the same signal,
    or with the same exit status -- so the supervisor reads the worker's ending from the shield's."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        except (OSError, ValueError):
            pass
        return 128 + sig
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 3


def _kill_group(pid: int) -> None:
    """SIGKILL to the supervised child's process group (``pid``'s, while the
    child is unreaped), else to the child alone."""
    try:
        os.killpg(pid, signal.SIGKILL)
        return
    except OSError:
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


#: a supervised child outside every target call that makes no call and uses no CPU for
#: max(IDLE_SECONDS, IDLE_FACTOR x the call allowance) is stuck (a thread of the target's holding
#: the interpreter lock in C between calls): the harness's own code between calls never waits
IDLE_SECONDS = 300.0
IDLE_FACTOR = 20


#: the longest message line the supervisor keeps (bytes): a longer one is dropped as it arrives, as a
#: line that does not parse is (the pipe is in reach of the target's code, which may write without end)
MAX_MESSAGE = 64 << 20


def _cpu_and_state(pid: int) -> tuple[int, str] | None:
    """``pid``'s CPU ticks (user + system, every thread) and its state letter, from
    ``/proc/PID/stat`` (None where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        rest = data[data.rindex(b")") + 2:].split()
        return int(rest[11]) + int(rest[12]), rest[0].decode("ascii", "replace")
    except (OSError, ValueError, IndexError):
        return None


def supervise(work: Callable[[Channel], None], *, timeout: float, on_message: Callable[[dict], None] | None = None,
              poll: float = 0.05, deadline: float | None = None, idle: float | None = -1.0) -> Ending:
    """Run ``work(channel)`` in a forked child; return how it ended.

    The child must send ``{"t": "done"}`` when its work is complete; a child
    that ends without it died.  A child whose Watch says it has been inside
    one target call for longer than the call's allowance (``timeout`` unless
    the child said otherwise) is killed (``SIGKILL``:
    it cannot be caught, also not by code blocked in C) and reported as hung.
    Messages are untrusted text: parsed with ``json.loads`` only; a line that
    does not parse is ignored.  ``deadline`` (a ``time.monotonic()`` value):
    a child still running then is killed the same way and reported as hung,
    wherever it is (a target that stopped its own process between calls, a
    thread of the target's holding the GIL): the bound of a time-budgeted run.
    The child's exit ends the watch, not the end of its pipe: a process the
    target forked may hold the pipe open, and a target may close it and
    carry on (its calls are watched until the child ends).
    ``idle`` (seconds; default max(:data:`IDLE_SECONDS`, :data:`IDLE_FACTOR`
    x ``timeout``), ``None``: off): a child outside every target call that
    makes no new call and uses no CPU that long -- not runnable, so not
    merely starved by a busy machine -- is stuck (a thread of the target's
    holding the interpreter lock in C while the harness is between calls,
    which no call's allowance sees) and is killed and reported as hung.

    The work runs one process further down: the supervised child is a shield
    that only waits for the worker it forks and ends as it ended.  The
    target's parent (``os.getppid()``) is that shield, never the supervisor:
    a signal the target sends its parent is ignored there (SIGSTOP: the
    shield is continued), and SIGKILL ends the target's own run (a crash,
    reported with the signal), never memspec.
    """
    watch = Watch()
    log = StepLog()
    worker = mmap.mmap(-1, 8)   # the worker's pid, for the stuck check's CPU reading
    r, w = os.pipe()

    def child() -> int:
        _own_group()
        os.close(r)
        out = {fd: os.pipe() for fd in (1, 2)}   # the worker's stdout and stderr, relayed (and capped) here
        gpid = fork(lambda: work_in_worker(out))
        os.close(w)
        for rd, wr in out.values():
            os.close(wr)
        _deaf()
        return _end_as(_relay(gpid, {rd: fd for fd, (rd, _wr) in out.items()}))

    def work_in_worker(out: dict[int, tuple[int, int]]) -> int:
        shield = os.getppid()
        _die_with_parent()
        if os.getppid() != shield:   # the shield ended before the line above
            return 3
        for fd, (rd, wr) in out.items():
            os.dup2(wr, fd)
            os.close(wr)
            os.close(rd)
        struct.pack_into("<Q", worker, 0, os.getpid())
        CallGuard.watch = watch
        StepLog.current = log
        ch = Channel(w)
        try:
            work(ch)
            ch.send({"t": "done"})
        except BaseException as e:  # noqa: BLE001 - reported, never propagated into the parent's stack
            try:
                ch.send({"t": "fatal", "error": f"{type(e).__name__}: {e}"})
            except BaseException:  # noqa: BLE001
                return 3
        return 0

    pid = fork(child)
    try:
        os.setpgid(pid, pid)   # as the child does (whichever runs first)
    except OSError:
        pass
    os.close(w)
    end = Ending()
    parts: list = [b""]
    last_calls, since = -1, time.monotonic()
    idle_bound = max(IDLE_SECONDS, IDLE_FACTOR * timeout) if idle is not None and idle < 0 else idle
    idle_mark: tuple = ()
    idle_since = next_idle_check = time.monotonic()
    done = False
    eof = False
    nap = 0.001
    held = 0   # bytes of the line arriving (past MAX_MESSAGE: it is being dropped)

    def take(chunk: bytes) -> None:
        nonlocal parts, done, held
        if b"\n" not in chunk:   # a long line still arriving: keep the pieces, join once (not quadratic)
            held += len(chunk)
            # a line past any message's size (a target writing into the pipe) is dropped as it arrives
            if held <= MAX_MESSAGE:
                parts.append(chunk)
            else:
                parts = [b""]
            return
        head, _, rest = chunk.partition(b"\n")
        parts.append(head)
        *lines, tail = rest.split(b"\n")
        lines.insert(0, b"" if held + len(head) > MAX_MESSAGE else b"".join(parts))
        parts, held = [tail], len(tail)
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if msg.get("t") == "done":
                done = True
            end.messages.append(msg)
            if on_message is not None:
                on_message(msg)

    try:
        while True:
            if not eof:
                ready, _, _ = select.select([r], [], [], poll)
                if ready:
                    chunk = os.read(r, 1 << 16)
                    if chunk:
                        take(chunk)
                    else:
                        eof = True
            else:
                # the pipe is closed (the child ended, or the target closed it):
                # what ends the watch is the child's exit
                time.sleep(nap)
                nap = min(poll, nap * 2)
            # The child's exit -- not the pipe's end -- ends the watch: a
            # process the target forked holds the pipe open as long as it lives.
            # (WNOWAIT: left unreaped, the child keeps its process group's id for the kill below)
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                for _ in range(256):   # what the child wrote before it ended (bounded: a grandchild may write on)
                    if eof or not select.select([r], [], [], 0)[0]:
                        break
                    chunk = os.read(r, 1 << 16)
                    if chunk:
                        take(chunk)
                    else:
                        eof = True
                break
            try:   # the shield, stopped by the target (SIGSTOP, which it cannot ignore), waits on
                if os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG) is not None:
                    os.kill(pid, signal.SIGCONT)
            except ChildProcessError:   # it has just ended (a zombie has no stop to report): seen next round
                pass
            calls, inside, limit, blame, what = watch.read()
            now = time.monotonic()
            allowed = limit if limit > 0 else timeout
            if calls != last_calls or not inside:
                last_calls, since = calls, now
            elif now - since > allowed:
                end.hang, end.blame, end.what = True, blame, what
                end.death = f"a call into the target did not return within {allowed:g} s ({what})"
                break
            if idle_bound is not None and now >= next_idle_check:
                next_idle_check = now + min(1.0, idle_bound / 4)
                cpu = _cpu_and_state(struct.unpack_from("<Q", worker, 0)[0] or pid)
                mark = (calls, cpu[0] if cpu else None)
                if cpu is None or inside or cpu[1] == "R" or mark != idle_mark:
                    idle_mark, idle_since = mark, now
                elif now - idle_since > idle_bound:
                    end.hang, end.blame, end.what = True, "", ""
                    end.death = (f"the process made no target call and used no CPU for {idle_bound:g} s while "
                                 "outside every call (stuck: e.g. a thread of the target's holding the "
                                 "interpreter lock)")
                    break
            if deadline is not None and now > deadline:
                end.hang, end.blame, end.what = True, blame if inside else "", what if inside else ""
                end.death = "the process did not finish within its time bound" + (f" ({what})" if inside else "")
                break
    finally:
        # Ctrl-C or a bug of the caller's included: the child must not outlive the supervisor, nor
        # the processes a target forked (its process group; the child, unreaped, still holds its id)
        os.close(r)
        _kill_group(pid)
        _, status = os.waitpid(pid, 0)
        if not done and end.death is None:
            _calls, inside, _limit, end.blame, end.what = watch.read()
            end.death = _describe_status(status) + (f" inside the target ({end.what})" if inside else "")
        if end.death is not None:
            end.log, end.log_steps = log.read()
        watch.mem.close()
        log.mem.close()
        worker.close()
    return end
