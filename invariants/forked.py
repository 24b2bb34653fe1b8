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
"""

from __future__ import annotations

import traceback
from typing import Any, Callable


class ForkedJobError(RuntimeError):
    """A job raised in its process, or its process ended without a result."""


def forkable() -> bool:
    import multiprocessing as mp

    return "fork" in mp.get_all_start_methods()


def _child(job: Callable[[Any], Any], item: Any, conn: Any) -> None:
    try:
        out: tuple[bool, Any] = (True, job(item))
    except BaseException:  # noqa: BLE001 - reported to the parent, with the traceback
        out = (False, traceback.format_exc())
    try:
        conn.send(out)
    except Exception:  # noqa: BLE001 - e.g. a result that cannot be pickled
        conn.send((False, traceback.format_exc()))
    conn.close()


def in_fresh_processes(job: Callable[[Any], Any], items: list[Any], jobs: int,
                       on_done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """``job(item)`` for every item, in the items' order, each in a process
    forked for it alone, at most ``jobs`` at a time, started in the items'
    order.  ``on_done(index, result)`` is called as each finishes.  A job that
    raises (or whose process dies) raises :class:`ForkedJobError` here, naming
    the item, after the other running processes are stopped."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("fork")
    results: dict[int, Any] = {}
    todo = list(range(len(items)))
    running: dict[Any, tuple[int, Any]] = {}
    try:
        while todo or running:
            while todo and len(running) < max(1, jobs):
                i = todo.pop(0)
                reader, writer = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(job, items[i], writer), daemon=True)
                proc.start()
                writer.close()
                running[reader] = (i, proc)
            for reader in wait(list(running)):
                i, proc = running.pop(reader)
                try:
                    ok, value = reader.recv()
                except EOFError:
                    proc.join()
                    raise ForkedJobError(f"job {i} ({items[i]!r:.200}): its process ended without a result "
                                         f"(exit code {proc.exitcode})") from None
                finally:
                    reader.close()
                proc.join()
                if not ok:
                    raise ForkedJobError(f"job {i} ({items[i]!r:.200}) failed in its process:\n{value}")
                results[i] = value
                if on_done is not None:
                    on_done(i, value)
    finally:
        for reader, (_i, proc) in running.items():
            proc.terminate()
            proc.join()
            reader.close()
    return [results[i] for i in range(len(items))]
