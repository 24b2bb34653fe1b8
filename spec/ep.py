"""The Execution Provider's ordering: streams, fences, the deferred-free queue.

Seed 000: *The CPU no longer referencing a buffer does not mean the GPU has
finished with it ... Freeing immediately would cause a device
use-after-free.  The safe flow is*::

    owning handle Drop
        ↓
    enter the EP/context deferred-free queue
        ↓
    wait for the related stream/fence to finish
        ↓
    allocator actually frees
        ↓
    update mapped-zone refund and Governor charge

*RAII is therefore workable, but Drop should be responsible for enqueuing,
not for synchronizing the whole GPU on an arbitrary thread or freeing
immediately.*

Model of the device: work launched on a stream is known complete once that
stream (or every stream) was synchronized, or once the implementation
reported one of its fences done; until then it may or may not have
completed.  ``poll`` therefore asks the EP, just before polling, which queued
releases have every fence done; those (and only those) must run.  Each run
frees through the mechanism that *created* the object (S1), never before its
fences (S4), and refunds the holder's charge.
"""

from __future__ import annotations

from typing import Any

from memspec.spec import kernels as K
from memspec.spec.core import Domain, Returns, action, outcomes
from memspec.spec.state import QueueEntry, Seen, Stream, SysState, add, new_ref


# --------------------------------------------------------------------------
# Fences
# --------------------------------------------------------------------------


def launch(s: SysState, stream: int) -> int:
    """Record one work item on ``stream``; return a fresh fence ref for it."""
    st = s.streams[stream]
    st.launched += 1
    ref = new_ref(s)
    s.fences[ref] = (stream, st.launched)
    return ref


def fence_known_done(s: SysState, fence: int) -> bool:
    stream, item = s.fences[fence]
    return s.streams[stream].completed >= item


def learn_done(s: SysState, fence: int) -> None:
    """The implementation reported ``fence`` done: its stream completed at
    least that far (work on a stream completes in order)."""
    stream, item = s.fences[fence]
    st = s.streams[stream]
    st.completed = max(st.completed, item)


# --------------------------------------------------------------------------
# The deferred-free queue
# --------------------------------------------------------------------------


def enqueue(s: SysState, entry: QueueEntry) -> None:
    """Drop: put a release on the queue.  Never frees (S7)."""
    s.queue[entry.seq] = entry
    if not entry.exact:
        s.inexact_entries += 1
    for h, n in entry.refund.items():
        add(s.queued_bytes_by, h, n)


def new_entry(s: SysState, what: str, fences: list[int], creator: int, refund: dict[str, int],
              physical: int, owned: int | None = None, exact: bool = True) -> QueueEntry:
    s.queue_seq += 1
    return QueueEntry(s.queue_seq, what, list(fences), creator, dict(refund), physical, owned, exact)


def releasing_mechanism(s: SysState, entry: QueueEntry) -> int:
    """S1: *an allocation may only be released by the mechanism/context that
    created it* -- the creator, whatever is installed now."""
    return entry.creator


def run_entry(s: SysState, entry: QueueEntry) -> None:
    """The queue runs one release: the creator mechanism frees, then the
    Governor refunds the charge (*Q->>A: actually deallocate; Q->>G:
    release/refund charge*).  Records what S1, S4 and S7 check."""
    via = releasing_mechanism(s, entry)
    if via != entry.creator:
        s.misreleased += 1
    if not all(fence_known_done(s, f) for f in entry.fences):
        s.premature_frees += 1
    if not s.in_poll:
        s.frees_outside_poll += 1
    del s.queue[entry.seq]
    if not entry.exact:
        s.inexact_entries -= 1
    if entry.on_run is not None:
        entry.on_run()
    for h, n in entry.refund.items():
        s.queued_bytes_by[h] -= n
        refund(s, h, n)
        s.physical_by[h] = s.physical_by.get(h, 0) - n
    if entry.owned is not None and entry.owned in s.owned:
        o = s.owned[entry.owned]
        o.state = "freed"


def refund(s: SysState, holder: str, n: int) -> None:
    """Governor: release a charge of ``n`` bytes after the physical bytes were freed."""
    led = K.refund(K.Ledger(s.capacity, s.free, s.granted, s.charged), n)
    s.free, s.granted, s.charged = led.free, led.granted, led.charged
    s.charged_by[holder] = s.charged_by.get(holder, 0) - n


def queue_snapshot(s: SysState) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(entry seq, its fence refs) for every queued release, oldest first."""
    return tuple((seq, tuple(e.fences)) for seq, e in s.queue.items())


PENDING = Domain("the queued releases and their fences (read from the state, not drawn)",
                 lambda s, c: queue_snapshot(s))


def done_flags(sut: Any, pending: tuple[tuple[int, tuple[int, ...]], ...]) -> list[bool]:
    """Ask the EP which queued releases have every fence done."""
    return [all(sut.ep.fence_done(sut.ref(f)) for f in fences) for _seq, fences in pending]


def flags_ok(s: SysState, pending: Any, done: Any) -> bool:
    """The EP's answer: one flag per queued release; a fence the spec knows
    complete must be reported done."""
    if not isinstance(done, (list, tuple)) or len(done) != len(pending):
        return False
    for (_seq, fences), flag in zip(pending, done):
        if not flag and all(fence_known_done(s, f) for f in fences):
            return False
    return True


def known_flags(s: SysState, pending: Any) -> list[bool]:
    return [all(fence_known_done(s, f) for f in fences) for _seq, fences in pending]


def run_done(s: SysState, pending: Any, done: Any) -> int:
    """Run the releases reported done (learning that their fences are done)."""
    s.in_poll = True
    try:
        ran = 0
        for (seq, fences), flag in zip(pending, done):
            if flag and seq in s.queue:
                for f in fences:
                    learn_done(s, f)
                run_entry(s, s.queue[seq])
                ran += 1
        return ran
    finally:
        s.in_poll = False


def ran_ok(s: SysState, pending: Any, done: Any, ran: Any) -> bool:
    """``poll``'s count: exactly the releases reported done (at least, when
    some queued object may be released in several pieces)."""
    if type(ran) is not int:
        return False
    want = sum(1 for f in done if f)
    exact = all(s.queue[seq].exact for seq, _ in pending if seq in s.queue)
    return ran == want if exact else ran >= want


# --------------------------------------------------------------------------
# Actions
# --------------------------------------------------------------------------


@action(role="ExecutionProvider", perform=lambda sut: sut.ep.new_stream(),
        enabled=lambda s: len(s.streams) < 4, invariants=())
def new_stream(s: SysState) -> Any:
    """Create a stream on the provider context.

    Returns the stream's id (an int).
    """

    def then(v: int) -> int:
        ref = new_ref(s)
        s.streams[ref] = Stream(ref)
        return ref

    return outcomes(Returns("a stream id", lambda v: isinstance(v, int), then, lambda: len(s.streams)), blame="S7")


def _perform_sync(sut: Any, stream: int | None) -> None:
    sut.ep.synchronize(None if stream is None else sut.ref(stream))


def _draw_stream_or_all(s: SysState, c: Any) -> int | None:
    if not s.streams or c.integer(0, 3) == 0:
        return None
    keys = list(s.streams)
    return keys[c.integer(0, len(keys) - 1)]


@action(role="ExecutionProvider",
        params={"stream": Domain("a stream, or None for every stream", _draw_stream_or_all)},
        perform=_perform_sync, invariants=("S4",))
def synchronize(s: SysState, stream: int | None) -> Any:
    """Let the device run a stream's queued work (every stream's, for None).

    Returns None; afterwards every fence of that work is done.  The work
    reads only memory that is still backed: a release that ran before its
    fence would make it fault here (DeviceFault), which no branch allows.
    """

    def then(_v: Any) -> None:
        for st in (s.streams.values() if stream is None else [s.streams[stream]]):
            st.completed = st.launched

    return outcomes(Returns("None", lambda v: v is None, then, lambda: None), blame="S4")


def _perform_poll(sut: Any, pending: Any) -> Seen:
    done = done_flags(sut, pending)
    ran = sut.ep.poll()
    return Seen(None, {"done": done, "ran": ran})


@action(role="ExecutionProvider", params={"pending": PENDING}, perform=_perform_poll,
        invariants=("S1", "S4", "S11"), weight=2)
def poll(s: SysState, pending: Any) -> Any:
    """Run the queued releases whose fences are all done; return how many ran.

    Just before polling, the EP is asked which queued releases have every
    fence done (a fence of work on a synchronized stream must be reported
    done).  Exactly those run: each frees through the mechanism that created
    it (S1, also after the installed mechanism was replaced) and refunds its
    charge; the others stay queued (S4: *wait for the related stream/fence
    to finish*).
    """
    blame = "S1" if any(e.creator != s.registry.installed for e in s.queue.values()) else "S4"

    def accepts(v: Any) -> bool:
        return isinstance(v, Seen) and flags_ok(s, pending, v["done"]) and ran_ok(s, pending, v["done"], v["ran"])

    def then(v: Seen) -> None:
        run_done(s, pending, v["done"])

    return outcomes(
        Returns("the number of releases whose fences were done", accepts, then,
                lambda: Seen(None, {"done": known_flags(s, pending), "ran": sum(known_flags(s, pending))})),
        blame=blame,
    )


ACTIONS = [new_stream, synchronize, poll]
