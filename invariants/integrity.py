"""Data integrity: the harness writes a distinct pattern into every region
a caller can see and reads it back later, through the target's own EP.

Which regions exist and whom to blame comes from the machine
(``Machine.regions``); nothing here knows a machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from memspec.invariants.errors import HangResult, SpecError
from memspec.spec.errors import DeviceFault, MemspecError

STAMP = 16          # bytes per stamp
FULL_LIMIT = 4096   # ranges up to this size get a full pattern
MAX_STAMPS = 2      # page stamps per range otherwise (start, end, sampled page boundaries): each
                    # stamp may materialise a simulated page, so keep them few
VERIFY_PER_STEP = 2 # ranges re-verified per step (round robin): flat per-step cost


def _pattern(ref: int, gen: int, offset: int, n: int) -> bytes:
    """A distinct, position-dependent pattern for ``ref`` (so a copy of one
    range into another, or a shifted mapping, is also caught)."""
    seed = ((ref * 0x9E3779B1) ^ (gen * 0x85EBCA77) ^ (offset * 0xC2B2AE3D)) & 0xFFFFFFFFFFFFFFFF
    block = seed.to_bytes(8, "little") + (ref & 0xFFFFFFFF).to_bytes(4, "little") + (offset & 0xFFFFFFFF).to_bytes(4, "little")
    reps = n // 16 + 1
    return (block * reps)[:n]


@dataclass
class _Region:
    ref: int
    gen: int
    spans: list  # [(address, size)] written
    blame_fault: str
    blame_mismatch: str
    probe: bool = False  # not patterned: only checked to be readable (no fault)
    want: list | None = None  # the pattern of each span (computed once)

    def patterns(self) -> list:
        if self.want is None:
            self.want = [_pattern(self.ref, self.gen, addr, n) for addr, n in self.spans]
        return self.want


class Integrity:
    """Writes a distinct pattern into every live allocation and committed
    range through the EP's copies, and verifies it later.

    Which ranges are live, and whom to blame, the machine says
    (``Machine.regions(state, ref, obj) -> DataRegion | None``); the bytes are written and read through the
    target's EP on a stream of the harness's own (synchronized at once, so the
    harness's copies never race the spec's fences).  Per step only the ranges
    the step touched or bound are (re)written and ``VERIFY_PER_STEP`` others
    are verified round robin, so the cost per step does not grow with the
    live set; :meth:`verify_all` scans everything at the end of a run.

    Blame: a :class:`DeviceFault` writing a range the spec says is backed is
    blamed on the region's ``blame_fault``; a changed byte on its
    ``blame_mismatch``.
    """

    def __init__(self, run: Any, ep: Any, regions: Callable) -> None:
        self.run = run
        self.ep = ep
        self.describe = regions
        self.regions: dict[int, _Region] = {}
        self.order: list[int] = []
        self.cursor = 0
        self.gen = 0
        self.stream: int | None = None

    def _stream(self) -> int:
        if self.stream is None:
            s, err = self.run.guard.call(self.ep.new_stream)
            if err is not None:
                self.run.fail(self.run.machine.ep_blame or "EP", "unexpected-exception" if not isinstance(err, MemspecError) else "data",
                              f"EP new_stream() raised {type(err).__name__}: {err}")
            self.stream = s
        return self.stream

    def _spans(self, address: int, size: int, page: int) -> list:
        if size <= FULL_LIMIT:
            return [(address, size)]
        spans = [(address, STAMP), (address + size - STAMP, STAMP)]
        page = max(int(page or 0), STAMP)
        first = (address // page + 1) * page
        n = (address + size - first) // page if first < address + size else 0
        step = max(1, n // MAX_STAMPS + (1 if n % MAX_STAMPS else 0)) if n else 1
        p = first
        while p + STAMP <= address + size - STAMP and len(spans) < MAX_STAMPS + 2:
            spans.append((p, STAMP))
            p += page * step
        return spans

    def _write(self, region: _Region) -> None:
        if region.probe:
            self._verify(region)
            return
        s = self._stream()
        done: list = []
        # one guarded call writes every stamp and runs the copies (so they
        # never race the spec's fences); ``done`` says which span failed
        _, err = self.run.guard.call(self._write_spans, s, region, done)
        if err is not None:
            addr, n = region.spans[len(done) if len(done) < len(region.spans) else 0]
            self._io_fail(region, addr, n, "writing", err)

    def _write_spans(self, s: int, region: _Region, done: list) -> None:
        write = self.ep.write
        for (addr, _n), data in zip(region.spans, region.patterns()):
            write(s, addr, data)
            done.append(addr)
        self.ep.synchronize(s)

    def _read_spans(self, s: int, spans: list, got: list) -> None:
        read = self.ep.read
        for addr, n in spans:
            got.append(read(s, addr, n))

    def _verify(self, region: _Region) -> None:
        s = self._stream()
        got: list = []
        spans = region.spans
        _, err = self.run.guard.call(self._read_spans, s, spans, got)
        if err is not None:
            addr, n = spans[len(got)] if len(got) < len(spans) else spans[-1]
            self._io_fail(region, addr, n, "reading", err)
        if region.probe:
            return
        for (addr, n), data, want in zip(spans, got, region.patterns()):
            if data != want and bytes(data) != want:
                self.run.fail(region.blame_mismatch, "data",
                              f"bytes of #{region.ref} at {addr:#x}+{n} changed behind its back (expected the harness's "
                              f"pattern, read {bytes(data)[:16].hex()}...): overlapping or prematurely reused memory")

    def _io_fail(self, region: _Region, addr: int, n: int, verb: str, err: BaseException) -> None:
        if isinstance(err, HangResult):
            self.run.fail(region.blame_fault, "hang", f"{verb} #{region.ref} at {addr:#x}+{n} through the EP hangs")
        if isinstance(err, DeviceFault):
            self.run.fail(region.blame_fault, "data",
                          f"{verb} #{region.ref} at {addr:#x}+{n} faulted ({err}) although the spec says it is backed")
        cause = "unexpected-exception" if not isinstance(err, MemspecError) else "data"
        self.run.fail(region.blame_fault, cause, f"{verb} #{region.ref} at {addr:#x}+{n} raised {type(err).__name__}: {err}")

    def refresh(self, ref: int) -> None:
        """Re-read the spec's view of ``ref``: (re)write it if its backed ranges changed, drop it if dead."""
        run = self.run
        refs = getattr(run.sut, "refs", None)
        obj = refs.get(ref) if refs is not None else None
        try:
            loc = self.describe(run.state, ref, obj)
            if loc is not None:
                if loc.extent is not None:
                    spans = self._spans(loc.extent[0], loc.extent[1], loc.page)
                else:
                    spans = _page_spans(*loc.pages)
        except Exception as e:  # noqa: BLE001
            raise SpecError(f"locating the data of #{ref} raised {type(e).__name__}: {e}") from e
        old = self.regions.get(ref)
        if loc is None:
            if old is not None:
                del self.regions[ref]
            return
        blame_fault, blame_mismatch = loc.blame_fault, loc.blame_mismatch
        if old is not None and old.spans == spans:
            old.blame_fault, old.blame_mismatch = blame_fault, blame_mismatch
            return
        sample = run.plan.integrity_sample
        probe = bool(sample > 1 and (ref * 2654435761) % 4093 % sample)  # outside the sample: read, don't write
        if old is not None:
            # Only ranges still covered keep their pattern: verify the spans
            # that remain, then rewrite the new layout.
            keep = [sp for sp in old.spans if sp in spans]
            if keep:
                self._verify(_Region(ref, old.gen, keep, blame_fault, blame_mismatch, old.probe))
        self.gen += 1
        region = _Region(ref, self.gen, spans, blame_fault, blame_mismatch, probe)
        self.regions[ref] = region
        if old is None:
            self.order.append(ref)
        self._write(region)

    def after_step(self, touched: tuple, bound: tuple) -> None:
        refresh = self.refresh
        for r in bound:
            refresh(r)
        for r in touched:
            if r is not None and r not in bound:
                refresh(r)
        # round-robin verification of a few others
        order = self.order
        regions = self.regions
        checked = 0
        tries = 0
        while order and checked < VERIFY_PER_STEP and tries < 2 * VERIFY_PER_STEP:
            tries += 1
            cursor = self.cursor
            if cursor >= len(order):
                cursor = self.cursor = 0
            ref = order[cursor]
            if ref not in regions:
                # dead: swap-remove
                order[cursor] = order[-1]
                order.pop()
                continue
            self.cursor = cursor + 1
            refresh(ref)  # liveness may have changed by a step that did not name it
            region = regions.get(ref)
            if region is not None:
                self._verify(region)
            checked += 1

    def verify_all(self) -> None:
        for ref in list(self.regions):
            self.refresh(ref)
            region = self.regions.get(ref)
            if region is not None:
                self._verify(region)


def _page_spans(address: int, pages: Any, page: int) -> list:
    """Stamps at the start and end of committed pages (sampled to MAX_STAMPS pages)."""
    idx = sorted(pages)
    if len(idx) > MAX_STAMPS:
        stride = len(idx) / MAX_STAMPS
        idx = [idx[int(i * stride)] for i in range(MAX_STAMPS)]
    spans = []
    for i in idx:
        base = address + i * page
        spans.append((base, STAMP))
        spans.append((base + page - STAMP, STAMP))
    return spans


def make_integrity(run: Any) -> Integrity | None:
    """The run's data checks, when the machine describes regions and the
    target has an EP of its own (``TargetInstance.ep``: only the target's EP
    reaches the target's memory; without one the checks are N/A)."""
    ep = getattr(run.instance, "ep", None)
    regions = getattr(run.machine, "regions", None)
    if ep is None or regions is None:
        return None
    return Integrity(run, ep, regions)
