"""Data integrity: the harness writes a distinct pattern into every region
a caller can see and reads it back later, through the target's own EP.

Which regions exist and whom to blame comes from the machine
(``Machine.regions``); nothing here knows a machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    #: an alias: the shared bytes' key, and the address of the key's offset 0
    key: Any = None
    base: int = 0
    writable: bool | None = True  # as DataRegion.writable: None = some of it writable
    version: Any = None

    def patterns(self) -> list:
        if self.want is None:
            self.want = [_pattern(self.ref, self.gen, addr, n) for addr, n in self.spans]
        return self.want


@dataclass
class _Shared:
    """The bytes behind every alias of one key (a physical handle mapped at
    several addresses): the generation of the pattern last written through
    one of them, the spans (relative to the key) it covers, the aliases."""

    kid: int
    gen: int | None = None
    written: set = field(default_factory=set)
    aliases: dict = field(default_factory=dict)   # ref -> None (ordered)
    version: Any = None
    writer: int | None = None


#: other aliases verified when one is written, dropped or copied (bounded cost)
MAX_ALIASES = 3


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

    Aliases (``DataRegion.alias``): every region with the same key shows the
    same bytes.  A new alias must read what was last written through another;
    a writable one is then stamped with a new pattern, read back through up
    to ``MAX_ALIASES`` others at once (a write through one alias is visible
    through every other); when an alias goes, one that remains is read back
    (the bytes survive until the last alias goes).  A read-only alias
    (``writable=False``) is never stamped; when it appears, a write at each
    of its stamps (every page, sampled as below, and its end) must be
    refused with an error of the contract and leave the bytes unchanged.  A region that stops being an alias and declares ``copy_of`` that
    key (copy-on-write) must hold the key's bytes at that moment; then the
    copy and the source are each written and the other read back (neither
    write shows through the other).  ``DataRegion.version`` changes when a
    caller's own write changed the bytes: the harness re-stamps instead of
    comparing.

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
        self.shared: dict[Any, _Shared] = {}
        #: re-verify round robin on one step in ``verify_every``
        #: (``Plan.integrity_verify_every``; the random walk's stated sample)
        self.verify_every = max(1, int(getattr(run.plan, "integrity_verify_every", 1) or 1))
        self._until_verify = 0
        #: ``_spans`` of each (extent, page) seen in this run (a pure
        #: function of them; the spans lists are only read)
        self._span_memo: dict = {}

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

    # -- raw IO ------------------------------------------------------------
    def _put(self, region: _Region, spans: list, datas: list) -> None:
        s = self._stream()
        done: list = []
        # one guarded call writes every stamp and runs the copies (so they
        # never race the spec's fences); ``done`` says which span failed
        _, err = self.run.guard.call(self._write_spans, s, spans, datas, done)
        if err is not None:
            addr, n = spans[len(done) if len(done) < len(spans) else 0]
            self._io_fail(region, addr, n, "writing", err)

    def _write_spans(self, s: int, spans: list, datas: list, done: list) -> None:
        write = self.ep.write
        for (addr, _n), data in zip(spans, datas):
            write(s, addr, data)
            done.append(addr)
        self.ep.synchronize(s)

    def _get(self, region: _Region, spans: list) -> list:
        s = self._stream()
        got: list = []
        _, err = self.run.guard.call(self._read_spans, s, spans, got)
        if err is not None:
            addr, n = spans[len(got)] if len(got) < len(spans) else spans[-1]
            self._io_fail(region, addr, n, "reading", err)
        return got

    def _read_spans(self, s: int, spans: list, got: list) -> None:
        read = self.ep.read
        for addr, n in spans:
            got.append(read(s, addr, n))

    def _compare(self, region: _Region, spans: list, wants: list, what: str) -> None:
        got = self._get(region, spans)
        for (addr, n), data, want in zip(spans, got, wants):
            if data != want and bytes(data) != want:
                self.run.fail(region.blame_mismatch, "data",
                              f"bytes of #{region.ref} at {addr:#x}+{n}: {what} (read {bytes(data)[:16].hex()}..., "
                              f"expected {want[:16].hex()}...)")

    def _io_fail(self, region: _Region, addr: int, n: int, verb: str, err: BaseException) -> None:
        if isinstance(err, HangResult):
            self.run.fail(region.blame_fault, "hang", f"{verb} #{region.ref} at {addr:#x}+{n} through the EP hangs")
        if isinstance(err, DeviceFault):
            self.run.fail(region.blame_fault, "data",
                          f"{verb} #{region.ref} at {addr:#x}+{n} faulted ({err}) although the spec says it is backed")
        cause = "unexpected-exception" if not isinstance(err, MemspecError) else "data"
        self.run.fail(region.blame_fault, cause, f"{verb} #{region.ref} at {addr:#x}+{n} raised {type(err).__name__}: {err}")

    # -- own regions ---------------------------------------------------------
    def _write(self, region: _Region) -> None:
        if region.key is not None:
            self._stamp_shared(region)
            return
        if region.probe:
            self._verify(region)
            return
        self._put(region, region.spans, region.patterns())

    def _verify(self, region: _Region) -> None:
        if region.key is not None:
            self._verify_alias(region, "differ from those written through an alias of the same memory "
                                       "(an alias that shows other or stale bytes)")
            return
        if region.probe:
            self._get(region, region.spans)
            return
        self._compare(region, region.spans, region.patterns(),
                      "changed behind its back (expected the harness's pattern): overlapping or prematurely reused memory")

    # -- aliases -------------------------------------------------------------
    def _alias_spans(self, region: _Region) -> tuple[list, list]:
        """The spans of ``region`` its key's last pattern covers, and that pattern."""
        sh = self.shared.get(region.key)
        if sh is None or sh.gen is None:
            return [], []
        spans, wants = [], []
        for addr, n in region.spans:
            rel = addr - region.base
            if (rel, n) in sh.written:
                spans.append((addr, n))
                wants.append(_pattern(sh.kid, sh.gen, rel, n))
        return spans, wants

    def _verify_alias(self, region: _Region, what: str) -> None:
        spans, wants = self._alias_spans(region)
        if not spans:
            self._get(region, region.spans)   # nothing known yet: readable at least
            return
        sh = self.shared[region.key]
        who = f"#{sh.writer}" if sh.writer is not None and sh.writer != region.ref else "itself"
        self._compare(region, spans, wants, what + f" (last written through {who})")

    def _stamp_shared(self, region: _Region) -> None:
        """Write a new pattern of ``region``'s key through it, then read it
        back through up to ``MAX_ALIASES`` other aliases."""
        sh = self.shared[region.key]
        if not region.writable or region.probe:
            self._verify_alias(region, "differ from those written through an alias of the same memory")
            return
        self.gen += 1
        sh.gen, sh.writer = self.gen, region.ref
        sh.written = {(addr - region.base, n) for addr, n in region.spans}
        self._put(region, region.spans, [_pattern(sh.kid, sh.gen, addr - region.base, n) for addr, n in region.spans])
        self._check_others(sh, region.ref, f"a write through alias #{region.ref} is not visible here")

    def _check_others(self, sh: _Shared, but: int | None, what: str) -> None:
        n = 0
        for other in list(sh.aliases):
            if other == but:
                continue
            r = self.regions.get(other)
            if r is None or r.key is None:
                continue
            self._verify_alias(r, what)
            n += 1
            if n >= MAX_ALIASES:
                break

    def _drop(self, ref: int, old: _Region) -> None:
        """``ref`` is no longer an alias: one that remains must still show the bytes."""
        sh = self.shared.get(old.key)
        if sh is None:
            return
        sh.aliases.pop(ref, None)
        if sh.aliases:
            self._check_others(sh, None, f"the bytes did not survive alias #{ref} going (other aliases remain)")

    def refresh(self, ref: int) -> None:
        """Re-read the spec's view of ``ref``: (re)write it if its backed ranges changed, drop it if dead."""
        run = self.run
        refs = getattr(run.sut, "refs", None)
        obj = refs.get(ref) if refs is not None else None
        try:
            loc = self.describe(run.state, ref, obj)
        except Exception as e:  # noqa: BLE001
            raise SpecError(f"locating the data of #{ref} raised {type(e).__name__}: {e}") from e
        extent = None
        if loc is not None:
            extent = loc.extent
            if getattr(loc, "locate", None) is not None:
                extent = self._located(ref, loc)
                if extent is None:
                    loc = None
        try:
            if loc is not None:
                if extent is not None:
                    k = (extent[0], extent[1], loc.page)
                    spans = self._span_memo.get(k)
                    if spans is None:
                        spans = self._span_memo[k] = self._spans(extent[0], extent[1], loc.page)
                else:
                    spans = _page_spans(*loc.pages)
                alias = getattr(loc, "alias", None)
                key = alias[0] if alias is not None else None
                base = (extent[0] if extent is not None else loc.pages[0]) - (alias[1] if alias else 0)
                version = getattr(loc, "version", None)
                writable = getattr(loc, "writable", True)
                copy_of = getattr(loc, "copy_of", None)
        except Exception as e:  # noqa: BLE001
            raise SpecError(f"locating the data of #{ref} raised {type(e).__name__}: {e}") from e
        old = self.regions.get(ref)
        if loc is None:
            if old is not None:
                del self.regions[ref]
                if old.key is not None:
                    self._drop(ref, old)
            return
        blame_fault, blame_mismatch = loc.blame_fault, loc.blame_mismatch
        if key is not None:
            self._refresh_alias(ref, old, spans, key, base, version, writable, blame_fault, blame_mismatch)
            return
        if old is not None and old.key is None and old.spans == spans and old.version == version:
            old.blame_fault, old.blame_mismatch = blame_fault, blame_mismatch
            return
        sample = run.plan.integrity_sample
        probe = bool(sample > 1 and (ref * 2654435761) % 4093 % sample)  # outside the sample: read, don't write
        copied = old is not None and old.key is not None and copy_of is not None and copy_of == old.key
        if copied:
            # copy-on-write: the copy holds the source's bytes as they were
            src = self.shared.get(old.key)
            probe_old = _Region(ref, 0, spans, blame_fault, blame_mismatch, key=old.key, base=old.base)
            self._verify_alias(probe_old, "the copy does not hold the bytes its source held when it was copied")
            if src is not None:
                src.aliases.pop(ref, None)
        elif old is not None and old.key is None and old.version == version:
            # Only ranges still covered keep their pattern: verify the spans
            # that remain, then rewrite the new layout.
            keep = [sp for sp in old.spans if sp in spans]
            if keep:
                self._verify(_Region(ref, old.gen, keep, blame_fault, blame_mismatch, old.probe))
        elif old is not None and old.key is not None:
            self._drop(ref, old)
        self.gen += 1
        region = _Region(ref, self.gen, spans, blame_fault, blame_mismatch, probe, version=version)
        self.regions[ref] = region
        if old is None:
            self.order.append(ref)
        self._write(region)
        if copied and src is not None and not probe:
            # neither write shows through the other: the source keeps its
            # bytes after the copy is written; a new write to the source
            # leaves the copy alone
            self._check_others(src, None, f"a write into the copy #{ref} showed through its source")
            for other in list(src.aliases):
                r = self.regions.get(other)
                if r is not None and r.key is not None and r.writable and not r.probe:
                    self._stamp_shared(r)
                    self._verify(region)
                    break

    def _located(self, ref: int, loc: Any) -> tuple | None:
        """``loc``'s extent at the address its ``locate`` reads from the
        implementation now (one guarded call); ``None`` when the
        implementation does not say."""
        box: list = []
        _, err = self.run.guard.call(lambda: box.append(loc.locate(self.run.sut)))
        if err is not None:
            if isinstance(err, HangResult):
                self.run.fail(loc.blame_fault, "hang", f"locating the memory of #{ref} hangs")
            cause = "unexpected-exception" if not isinstance(err, MemspecError) else "data"
            self.run.fail(loc.blame_fault, cause, f"locating the memory of #{ref} raised {type(err).__name__}: {err}")
        base = box[0] if box else None
        if type(base) is not int:
            return None
        off, n = loc.extent
        return base + off, n

    def _refresh_alias(self, ref: int, old: _Region | None, spans: list, key: Any, base: int, version: Any,
                       writable: bool | None, blame_fault: str, blame_mismatch: str) -> None:
        sh = self.shared.get(key)
        if sh is None:
            sh = self.shared[key] = _Shared(_key_id(key), version=version)
        rewritten = sh.version != version     # a caller wrote into the bytes: stamp anew
        if rewritten:
            sh.version, sh.gen, sh.written = version, None, set()
        if old is not None and old.key == key and old.spans == spans and old.base == base:
            old.blame_fault, old.blame_mismatch, old.writable, old.version = blame_fault, blame_mismatch, writable, version
            if rewritten:
                self._stamp_shared(old)
            return
        if old is not None and old.key is not None and old.key != key:
            self._drop(ref, old)
        sample = self.run.plan.integrity_sample
        probe = bool(sample > 1 and (ref * 2654435761) % 4093 % sample)
        region = _Region(ref, 0, spans, blame_fault, blame_mismatch, probe, key=key, base=base, writable=writable,
                         version=version)
        self.regions[ref] = region
        sh.aliases[ref] = None
        if old is None:
            self.order.append(ref)
        # a new alias shows the bytes last written through another; a region
        # that grew or moved still shows what was written before
        self._verify_alias(region, "the bytes written before did not survive its growth or move"
                           if old is not None and old.key == key else
                           "a new alias does not show the bytes of the memory it maps")
        if writable is False and not probe:
            self._probe_read_only(region)
        self._stamp_shared(region)

    def _probe_read_only(self, region: _Region) -> None:
        """A region a caller may not write: a write at each of its stamps
        (every page, sampled to ``MAX_STAMPS`` pages, and its end) must be
        refused with an error of the contract, and the bytes must not change."""
        spans = region.spans
        before = self._get(region, spans)
        for (addr, n), old in zip(spans, before):
            data = bytes(b ^ 0xA5 for b in bytes(old))
            s = self._stream()
            _, err = self.run.guard.call(self._write_spans, s, [(addr, n)], [data], [])
            if err is None:
                self.run.fail(region.blame_mismatch, "data",
                              f"a write into read-only #{region.ref} at {addr:#x}+{n} was accepted "
                              "(a write anywhere in a read-only region must be refused)")
            self.stream = None   # the refused copy's stream is not reused
            if isinstance(err, HangResult) or not isinstance(err, MemspecError):
                self._io_fail(region, addr, n, "writing (must be refused)", err)
        after = self._get(region, spans)
        for (addr, n), old, new in zip(spans, before, after):
            if bytes(old) != bytes(new):
                self.run.fail(region.blame_mismatch, "data",
                              f"a refused write changed the bytes of read-only #{region.ref} at {addr:#x}+{n} "
                              f"(read {bytes(new)[:16].hex()}..., was {bytes(old)[:16].hex()}...)")

    def after_step(self, touched: tuple, bound: tuple) -> None:
        refresh = self.refresh
        for r in bound:
            refresh(r)
        for r in touched:
            if r is not None and r not in bound:
                refresh(r)
        # round-robin verification of a few others (on one step in
        # ``verify_every``: the first step of a run, then every k-th)
        if self.verify_every > 1:
            if self._until_verify:
                self._until_verify -= 1
                return
            self._until_verify = self.verify_every - 1
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


def _key_id(key: Any) -> int:
    """A stable int for an alias key (ints and tuples of ints and strings
    hash the same in every run only for ints: strings are folded by hand)."""
    if type(key) is int:
        return key
    acc = 0x345678
    for part in (key if isinstance(key, tuple) else (key,)):
        v = part if type(part) is int else sum((i + 1) * b for i, b in enumerate(str(part).encode()))
        acc = (acc * 1000003 ^ v) & 0xFFFFFFFF
    return acc


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
