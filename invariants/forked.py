"""Run independent jobs each in a process of its own, forked from this one.

``memspec prove`` and its self-test run every proof group (and every planted
break) in a fresh process: Z3's search depends on every term its process
built before, and a break must be judged as if it were planted alone.

Why not ``multiprocessing.Pool(maxtasksperchild=1)``: the pool forks its
replacement workers from a helper thread while another helper thread
unpickles results, and unpickling may import a module.  A child forked at
that moment inherits the module's import lock held by a thread that does not
exist in the child, and hangs at its first import of that module (seen: a
caching-agreement worker blocked in ``_lock_unlock_module`` with 0 CPU, the
run stuck at 91/92 tasks).  Here every fork happens on the calling thread, and
no other thread of ours runs, so no lock can be held across a fork.

The fork itself is :func:`memspec.invariants.guard.fork`, the one the
conformance supervisor uses.  What differs is the transport: a job here is
memspec's own code on memspec's own data (no target is imported or called),
so its result comes back pickled through a pipe; anything that ran a
target's code speaks JSON lines to :func:`~memspec.invariants.guard.supervise`
instead, and nothing a target sends is ever unpickled.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import traceback
from typing import Any, Callable

from memspec.invariants.guard import fork


class ForkedJobError(RuntimeError):
    """A job raised in its process, or its process ended without a result."""


def forkable() -> bool:
    return hasattr(os, "fork")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _job_main(job: Callable[[Any], Any], item: Any, r: int, w: int) -> int:
    os.close(r)
    try:
        out: tuple[bool, Any] = (True, job(item))
    except BaseException:  # noqa: BLE001 - reported to the parent, with the traceback
        out = (False, traceback.format_exc())
    try:
        data = pickle.dumps(out)
    except Exception:  # noqa: BLE001 - e.g. a result that cannot be pickled
        data = pickle.dumps((False, traceback.format_exc()))
    _write_all(w, data)
    os.close(w)
    return 0


def _exit_text(status: int) -> str:
    if os.WIFEXITED(status):
        return f"exit code {os.WEXITSTATUS(status)}"
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"wait status {status}"


def in_fresh_processes(job: Callable[[Any], Any], items: list[Any], jobs: int,
                       on_done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """``job(item)`` for every item, in the items' order, each in a process
    forked for it alone, at most ``jobs`` at a time, started in the items'
    order.  ``on_done(index, result)`` is called as each finishes.  A job that
    raises (or whose process dies) raises :class:`ForkedJobError` here, naming
    the item, after the other running processes are stopped."""
    results: dict[int, Any] = {}
    todo = list(range(len(items)))
    running: dict[int, tuple[int, int, list[bytes]]] = {}   # read end -> (item index, pid, bytes so far)
    try:
        while todo or running:
            while todo and len(running) < max(1, jobs):
                i = todo.pop(0)
                r, w = os.pipe()
                pid = fork(lambda i=i, r=r, w=w: _job_main(job, items[i], r, w))
                os.close(w)
                running[r] = (i, pid, [])
            ready, _, _ = select.select(list(running), [], [])
            for r in ready:
                i, pid, parts = running[r]
                chunk = os.read(r, 1 << 20)
                if chunk:
                    parts.append(chunk)
                    continue
                del running[r]
                os.close(r)
                _, status = os.waitpid(pid, 0)
                data = b"".join(parts)
                if not data:
                    raise ForkedJobError(f"job {i} ({items[i]!r:.200}): its process ended without a result "
                                         f"({_exit_text(status)})")
                try:
                    ok, value = pickle.loads(data)   # written by our own job code in a fork of this process
                except Exception as e:  # noqa: BLE001 - a process that died while writing its result
                    raise ForkedJobError(f"job {i} ({items[i]!r:.200}): its process ended with a partial result "
                                         f"({_exit_text(status)}; {type(e).__name__})") from None
                if not ok:
                    raise ForkedJobError(f"job {i} ({items[i]!r:.200}) failed in its process:\n{value}")
                results[i] = value
                if on_done is not None:
                    on_done(i, value)
    finally:
        for r, (_i, pid, _parts) in running.items():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            os.close(r)
    return [results[i] for i in range(len(items))]
