"""Pictures of memory: the spec's state (or an allocator snapshot) as SVG.

Two halves, so a run record can carry pictures as data and be drawn later:

* :func:`state_model` turns a spec state -- the mechanism level's
  :class:`~memspec.spec.state.MechState`, the system level's
  :class:`~memspec.spec.state.SysState`, the caching allocator's
  ``CachingState`` -- into a small JSON-able *picture model* (plain dicts,
  lists, ints and strings; nothing from the state is kept by reference).
  :func:`snapshot_model` does the same for a ``torch.cuda.memory._snapshot()``
  dict (segments and blocks).
* :func:`svg` draws a picture model: the address space (reserved, committed,
  shared, read-only and private pages), the caching segments and their
  blocks by state (live, free, pending, unmapped), the Governor's ledger
  (free / granted / charged, and per holder), the deferred-free queue with
  the fences each release waits for, and the counters the invariants read
  when they are non-zero.  ``marks`` highlights what a failure names: the
  reference ids (``#3``) and addresses (``0x...``) in its reason get a red
  outline and the invariant's id, so the step that broke a rule shows the
  object it broke it on (seed 000: *GPU release must obey stream/fence
  ordering* -- a release queued behind a fence whose bytes the
  implementation already gave back is drawn queued, outlined in red).

Everything a target or a snapshot supplies (labels, holder names, messages)
is escaped with :func:`html.escape` before it enters the SVG.  The output is
self-contained (no fonts, scripts or links): it can be inlined in an HTML
report or written as a ``.svg`` file (``memspec snapshot --svg``).
"""

from __future__ import annotations

import html
import re
from typing import Any, Iterable

MiB = 1 << 20

#: page and block states -> fill colour
COLOURS = {
    # address space (mechanism level)
    "reserved": "#ffffff",      # reserved virtual addresses, no backing
    "committed": "#4a7fc1",     # private backing installed (VirtualBacking.commit_range)
    "eager": "#2e5e9e",         # an ordinary allocation's pages
    "shared": "#8e5cb8",        # a shared physical handle mapped here
    "read-only": "#c9a7e3",     # a read-only mapping of a shared handle
    "private": "#3fa7a0",       # copy-on-write: the mapping's own pages now
    "foreign": "#b0b0b0",       # the independent twin's (source of foreign handles)
    "freed": "#e4e4e4",         # released
    # owned objects (system level)
    "live": "#2e5e9e",
    "queued": "#f0ad4e",        # release queued behind fences (deferred-free queue)
    "decommitting": "#f6c98a",  # a page whose decommit is queued
    # caching blocks
    "free": "#5cb85c",
    "pending": "#f0ad4e",
    "unmapped": "#f4f4f4",
    "allocated": "#d9534f",
    # ledger
    "ledger-free": "#cfe8cf",
    "ledger-granted": "#f6d28b",
    "ledger-tickets": "#f0ad4e",
    "ledger-bad": "#d9534f",
}
HOLDER_COLOURS = ("#4a7fc1", "#8e5cb8", "#3fa7a0", "#c1704a", "#7a9a3a", "#b84a7a", "#5a5a9e", "#9e8a3a")
MARK = "#d0021b"

_REF = re.compile(r"#(\d+)")
_ADDR = re.compile(r"0x[0-9a-fA-F]+")
_DEC_ADDR = re.compile(r"(?<![\w.#])\d{7,}(?![\w.])")   # a decimal address in a list of figures


def esc(s: Any) -> str:
    """Text for SVG/HTML: every target-supplied string goes through here."""
    return html.escape(str(s), quote=True)


def fmt_bytes(n: Any) -> str:
    """``2.00 MiB``, ``512 B``, ``1.50 KiB``."""
    if not isinstance(n, int) or isinstance(n, bool):
        return esc(n)
    a = abs(n)
    if a >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if a >= MiB:
        return f"{n / MiB:.2f} MiB"
    if a >= 1024:
        return f"{n / 1024:.2f} KiB"
    return f"{n} B"


def marks_from(text: str, invariant: str | None = None, label: str | None = None,
               refs: Iterable[int] = ()) -> dict:
    """What a failure's reason names: reference ids (``#3``, and ``refs``
    the caller knows it names) and addresses (``0x...``, or decimal
    figures of seven digits and more, as a list of addresses prints)."""
    text = text or ""
    addrs = {int(m, 16) for m in _ADDR.findall(text)} | {int(m) for m in _DEC_ADDR.findall(text)}
    return {"refs": sorted({int(m) for m in _REF.findall(text)} | {int(r) for r in refs}),
            "addresses": sorted(addrs), "invariant": invariant or "", "label": label or ""}


# ==========================================================================
# Models
# ==========================================================================

def _runs(n: int, states: dict, default: str, limit: int = 1 << 16) -> list[dict]:
    """``[{start, count, state}]`` over ``n`` pages: ``states`` maps a page
    index to its state, every other page is ``default``."""
    out: list[dict] = []
    n = max(0, int(n))

    def push(start: int, count: int, state: str) -> None:
        if count <= 0:
            return
        if out and out[-1]["state"] == state and out[-1]["start"] + out[-1]["count"] == start:
            out[-1]["count"] += count
        else:
            out.append({"start": start, "count": count, "state": state})

    at = 0
    for i in sorted(k for k in states if 0 <= k < n)[:limit]:
        push(at, i - at, default)
        push(i, 1, states[i])
        at = i + 1
    push(at, n - at, default)
    return out


def _pages(size: int, page: int) -> int:
    page = max(1, int(page or 1))
    return max(1, -(-int(size) // page))


def _nonzero(obj: Any, names: Iterable[str]) -> dict:
    out = {}
    for k in names:
        v = getattr(obj, k, 0)
        if isinstance(v, int) and not isinstance(v, bool) and v:
            out[k] = v
    return out


_MECH_RECORDS = ("duplicate_identities", "foreign_frees", "absent_answered", "readonly_writes")
_SYS_RECORDS = ("misreleased", "stale_capabilities", "premature_frees", "governor_evictions", "hot_evictions",
                "overclaims", "frees_outside_poll", "moved_addresses", "duplicate_identities")


def state_model(state: Any) -> dict:
    """A JSON-able picture model of a spec state (see the module docstring).

    Dispatches on what the state has: a caching state's ``segments`` and
    ``policy``, a system state's ledger (``charged_by``), a mechanism
    state's ``allocations``.  Anything else gives ``{"level": "unknown"}``."""
    if state is None:
        return {"level": "none"}
    if hasattr(state, "segments") and hasattr(state, "policy"):
        return _caching_model(state)
    if hasattr(state, "charged_by") and hasattr(state, "owned"):
        return _system_model(state)
    if hasattr(state, "allocations") and hasattr(state, "reservations"):
        return _mechanism_model(state)
    return {"level": "unknown", "type": type(state).__name__}


def _mechanism_model(s: Any) -> dict:
    page = int(s.page)
    ranges = []
    for a in s.allocations.values():
        n = _pages(a.footprint, page)
        state = "freed" if not a.live else ("foreign" if a.foreign else "eager")
        ranges.append({"ref": a.ref, "kind": "allocation", "address": a.address, "size": a.size,
                       "footprint": a.footprint, "live": bool(a.live), "foreign": bool(a.foreign),
                       "pages": [{"start": 0, "count": n, "state": state}]})
    for r in s.reservations.values():
        n = _pages(r.size, page)
        states: dict[int, str] = {}
        if r.kind == "backing":
            for i in r.committed:
                states[i] = "committed"
        else:
            for mref in r.mappings.values():
                m = s.mappings.get(mref)
                if m is None or not m.live:
                    continue
                kind = "private" if m.private else ("read-only" if m.read_only else "shared")
                for i in range(m.offset // page, (m.offset + m.size + page - 1) // page):
                    states[i] = kind
        default = "reserved" if r.live else "freed"
        if not r.live:
            states = {}
        ranges.append({"ref": r.ref, "kind": r.kind, "address": r.address, "size": r.size, "live": bool(r.live),
                       "foreign": bool(r.foreign), "pages": _runs(n, states, default),
                       "mappings": sorted(int(x) for x in r.mappings.values())})
    ranges.sort(key=lambda d: (d["address"] if isinstance(d["address"], int) else 0, d["ref"]))
    handles = [{"ref": h.ref, "size": h.size, "released": bool(h.released), "mappings": h.mappings,
                "freed": bool(h.freed)} for h in s.handles.values()]
    return {
        "level": "mechanism", "capacity": s.capacity, "page": page, "physical": s.physical,
        "foreign_bytes": getattr(s, "foreign_bytes", 0),
        "bytes": {"eager": s.eager_bytes, "committed": s.committed_bytes, "shared": s.shared_bytes,
                  "private": s.private_bytes},
        "ranges": ranges, "handles": handles, "records": _nonzero(s, _MECH_RECORDS),
    }


def _fence(s: Any, f: Any) -> dict:
    """A fence (its reference id; the state maps it to ``(stream, work item)``):
    done once the stream is known to have completed that item."""
    ref = None
    if isinstance(f, int) and not isinstance(f, bool):
        ref = f
        f = s.fences.get(f, (None, None))
    try:
        stream, item = f
    except (TypeError, ValueError):
        stream, item = None, None
    st = s.streams.get(stream) if stream is not None else None
    done = st is not None and item is not None and st.completed >= item
    return {"ref": ref, "stream": stream, "item": item, "done": bool(done)}


def _system_model(s: Any) -> dict:
    page = int(s.page)
    owned = []
    for o in s.owned.values():
        if o.kind == "reservation":
            n = _pages(o.size, page)
            states = {i: "committed" for i in o.committed}
            for i in o.decommitting:
                states[i] = "decommitting"
            default = "reserved"
            if o.state != "live":
                states = {i: ("queued" if o.state == "queued" else "freed") for i in states}
                default = "reserved" if o.state == "queued" else "freed"
            pages = _runs(n, states, default)
        else:
            n = _pages(o.footprint, page)
            pages = [{"start": 0, "count": n, "state": o.state if o.state in ("live", "queued", "freed") else "live"}]
        owned.append({"ref": o.ref, "kind": o.kind, "holder": o.holder, "size": o.size, "footprint": o.footprint,
                      "state": o.state, "charged_to": o.charged_to, "creator": o.creator,
                      "address": o.address, "fences": [_fence(s, f) for f in o.fences], "pages": pages})
    queue = [{"seq": q.seq, "what": q.what, "fences": [_fence(s, f) for f in q.fences], "refund": dict(q.refund),
              "physical": q.physical, "owned": q.owned} for q in sorted(s.queue.values(), key=lambda q: q.seq)]
    streams = [{"ref": st.ref, "launched": st.launched, "completed": st.completed} for st in s.streams.values()]
    tickets = [{"ref": t.ref, "amount": t.amount, "priority": t.priority, "deadline": t.deadline, "state": t.state,
                "held": t.held} for t in s.tickets.values()]
    grants = [{"ref": g.ref, "holder": g.holder, "nbytes": g.nbytes, "state": g.state}
              for g in s.grants.values() if g.state == "open"]
    kv = [{"name": k.name, "max_bytes": k.max_bytes, "own": k.own, "prefix": k.prefix, "prefix_of": k.prefix_of,
           "state": k.state, "fences": [_fence(s, f) for f in k.fences]} for k in s.kv.values()]
    weights = [{"name": w.name, "pages": w.pages, "hot": bool(w.hot), "resident": bool(w.resident)}
               for w in s.weights.values()]
    reg = s.registry
    return {
        "level": "system", "capacity": s.capacity, "page": page, "clock": s.clock,
        "ledger": {"free": s.free, "granted": s.granted, "charged": s.charged, "open_grants": s.open_grants,
                   "tickets_held": s.tickets_held, "charged_by": dict(s.charged_by),
                   "lease_bytes": dict(s.lease_bytes), "live_bytes_by": dict(s.live_bytes_by),
                   "queued_bytes_by": dict(s.queued_bytes_by), "physical_by": dict(s.physical_by)},
        "owned": owned, "queue": queue, "streams": streams, "tickets": tickets, "grants": grants, "kv": kv,
        "weights": weights,
        "registry": {"installed": reg.installed, "generation": reg.generation, "context_alive": bool(reg.context_alive)},
        "records": _nonzero(s, _SYS_RECORDS),
    }


def _caching_model(s: Any) -> dict:
    segs = []
    for g in s.segments:
        segs.append({"sid": g.sid, "address": g.base, "size": g.size, "small": bool(g.small), "stream": g.stream,
                     "expandable": bool(g.expandable),
                     "blocks": [{"offset": b.offset, "size": b.size, "state": b.state, "ref": b.ref,
                                 "requested": b.requested, "stream": b.stream, "uses": sorted(b.uses),
                                 "waits": b.waits} for b in g.blocks]})
    pol = s.policy
    try:
        reserved = s.reserved()
        allocated = s.figure(("live", "pending"))
    except Exception:  # noqa: BLE001 - a picture never fails on the figures
        reserved = allocated = None
    return {
        "level": "caching", "capacity": pol.capacity, "preset": pol.preset, "expandable": bool(pol.expandable),
        "reserved": reserved, "allocated": allocated, "segments": segs,
        "events": [list(e) for e in s.events], "issued": dict(s.issued), "completed": dict(s.completed),
        "num_ooms": s.num_ooms, "violations": [list(v) for v in s.violations],
    }


_SNAP_STATES = {"active_allocated": "live", "inactive": "free", "active_pending_free": "pending"}


def snapshot_model(snap: dict) -> dict:
    """A picture model of a ``torch.cuda.memory._snapshot()`` dict (segments
    in address order; each mapped range of an expandable segment is a
    segment of its own).  The snapshot is untrusted: missing or odd fields
    are drawn as they are, never evaluated."""
    segs = []
    for k, sg in enumerate(snap.get("segments") or []):
        base = sg.get("address", 0)
        blocks = []
        for b in sg.get("blocks") or []:
            addr = b.get("address", base)
            off = addr - base if isinstance(addr, int) and isinstance(base, int) else 0
            blocks.append({"offset": off, "size": b.get("size", 0), "state": _SNAP_STATES.get(b.get("state"), str(b.get("state"))),
                           "ref": None, "requested": b.get("requested_size", 0), "stream": sg.get("stream", 0),
                           "uses": [], "waits": 0})
        segs.append({"sid": k, "address": base, "size": sg.get("total_size", 0),
                     "small": sg.get("segment_type") == "small", "stream": sg.get("stream", 0),
                     "expandable": bool(sg.get("is_expandable")), "blocks": blocks})
    reserved = sum(s["size"] for s in segs if isinstance(s["size"], int))
    allocated = sum(b["size"] for s in segs for b in s["blocks"] if b["state"] in ("live", "pending") and isinstance(b["size"], int))
    return {"level": "caching", "capacity": None, "preset": (snap.get("allocator_settings") or {}).get("preset", ""),
            "expandable": any(s["expandable"] for s in segs), "reserved": reserved, "allocated": allocated,
            "segments": segs, "events": [], "issued": {}, "completed": {}, "num_ooms": None, "violations": []}


# ==========================================================================
# Drawing
# ==========================================================================

class _Canvas:
    """An SVG under construction, top to bottom."""

    def __init__(self, width: int, uid: str) -> None:
        self.w = width
        self.y = 8
        self.parts: list[str] = []
        self.uid = uid

    def text(self, x: float, y: float, s: str, *, size: int = 11, weight: str = "normal", fill: str = "#222",
             cls: str = "") -> None:
        c = f' class="{esc(cls)}"' if cls else ""
        self.parts.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" font-weight="{weight}" fill="{fill}"{c}>'
                          f"{esc(s)}</text>")

    def heading(self, s: str) -> None:
        self.y += 16
        self.text(8, self.y, s, size=12, weight="bold")
        self.y += 6

    def rect(self, x: float, y: float, w: float, h: float, fill: str, *, stroke: str = "#555", sw: float = 0.6,
             dash: bool = False, title: str = "", attrs: dict | None = None) -> None:
        a = "".join(f' {k}="{esc(v)}"' for k, v in (attrs or {}).items())
        d = ' stroke-dasharray="4 2"' if dash else ""
        t = f"<title>{esc(title)}</title>" if title else ""
        self.parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0.8):.1f}" height="{h:.1f}" fill="{fill}" '
                          f'stroke="{stroke}" stroke-width="{sw}"{d}{a}>{t}</rect>')

    def svg(self, title: str) -> str:
        h = self.y + 12
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{h}" viewBox="0 0 {self.w} {h}" '
                f'font-family="monospace" role="img" aria-label="{esc(title)}">'
                f"<title>{esc(title)}</title>" + "".join(self.parts) + "</svg>")


def _is_marked(marks: dict | None, ref: Any = None, lo: Any = None, size: Any = None) -> bool:
    if not marks:
        return False
    if ref is not None and ref in (marks.get("refs") or ()):
        return True
    if isinstance(lo, int) and isinstance(size, int):
        return any(lo <= a < lo + max(size, 1) for a in marks.get("addresses") or ())
    return False


def _widths(sizes: list, scale: float, least: float = 6.0) -> list[float]:
    """Widths of consecutive parts: proportional, but none under ``least``
    pixels (a 512 B block in a 2 MiB segment stays visible); the row grows
    by what the small ones gained."""
    return [max(least, max(0, n) * scale) for n in sizes]


def _legend(c: _Canvas, states: Iterable[str]) -> None:
    c.y += 6
    x = 8
    for st in states:
        c.rect(x, c.y, 11, 11, COLOURS.get(st, "#999"))
        c.text(x + 15, c.y + 10, st, size=10)
        x += 22 + 7 * len(st)
        if x > c.w - 90:
            x = 8
            c.y += 16
    c.y += 16


def _mark_note(c: _Canvas, x: float, y: float, marks: dict, what: str) -> None:
    inv = marks.get("invariant") or "failure"
    label = marks.get("label") or ""
    text = f"\u2717 {inv}: {what}" + (f": {label}" if label else "")
    room = max(20, int((c.w - x - 8) / 6.1))
    c.text(x, y, text if len(text) <= room else text[: room - 3] + "...", size=10, weight="bold", fill=MARK,
           cls="mark-note")


def _page_row(c: _Canvas, label: str, runs: list[dict], npages: int, width: float, *, marked: bool, marks: dict | None,
              attrs: dict, note: str = "", dash_states: tuple = ("queued",)) -> None:
    """One labelled bar of pages, drawn as runs of equal state; a marked
    object gets a red outline and, on the line below, what the failure says."""
    left = 250
    h = 16
    c.text(8, c.y + 12, label[:38], size=10)
    x0 = left
    widths = _widths([r["count"] for r in runs], width / max(1, npages))
    width = sum(widths)
    x = x0
    for r, rw in zip(runs, widths):
        st = r["state"]
        x += rw
        c.rect(x - rw, c.y, rw, h, COLOURS.get(st, "#999"), stroke="#fff", sw=0.4,
               dash=st in dash_states,
               title=f"pages {r['start']}..{r['start'] + r['count'] - 1}: {st}",
               attrs={"class": f"page {st}", "data-state": st})
    a = dict(attrs)
    a["class"] = "object" + (" marked" if marked else "")
    c.rect(x0, c.y, width, h, "none", stroke=MARK if marked else "#333", sw=2.5 if marked else 0.8, attrs=a)
    if note:
        c.text(x0 + width + 6, c.y + 12, note[:60], size=10)
    c.y += h + 4
    if marked and marks is not None:
        _mark_note(c, x0, c.y + 10, marks, "named by the failure")
        c.y += 16


def svg(model: dict, marks: dict | None = None, *, width: int = 900, uid: str = "p", title: str = "") -> str:
    """Draw a picture model (see :func:`state_model`, :func:`snapshot_model`)."""
    c = _Canvas(width, uid)
    level = model.get("level")
    if level == "mechanism":
        _draw_mechanism(c, model, marks)
    elif level == "system":
        _draw_system(c, model, marks)
    elif level == "caching":
        _draw_caching(c, model, marks)
    else:
        c.heading(f"no picture for a state of level {level!r}")
    return c.svg(title or f"{level} state")


# -- mechanism -------------------------------------------------------------

def _draw_mechanism(c: _Canvas, m: dict, marks: dict | None) -> None:
    cap = m["capacity"] or 1
    c.heading(f"physical bytes: {fmt_bytes(m['physical'])} installed of {fmt_bytes(m['capacity'])} "
              f"(page {fmt_bytes(m['page'])})")
    c.y += 4
    x = 8.0
    bar = c.w - 16
    for k in ("eager", "committed", "shared", "private"):
        n = m["bytes"].get(k, 0)
        if n:
            w = bar * n / cap
            c.rect(x, c.y, w, 14, COLOURS[k], title=f"{k}: {fmt_bytes(n)}", attrs={"class": f"physical {k}"})
            x += w
    if m.get("foreign_bytes"):
        w = bar * m["foreign_bytes"] / cap
        c.rect(x, c.y, w, 14, COLOURS["foreign"], title=f"twin: {fmt_bytes(m['foreign_bytes'])}")
        x += w
    c.rect(8, c.y, bar, 14, "none", stroke="#333")
    c.y += 20
    c.heading(f"address space: {len(m['ranges'])} range(s)")
    biggest = max((r["size"] for r in m["ranges"]), default=1) or 1
    for r in m["ranges"]:
        npages = sum(x["count"] for x in r["pages"])
        w = max(60.0, (c.w - 600) * (r["size"] / biggest) ** 0.5)
        addr = f"{r['address']:#x}" if isinstance(r["address"], int) else "?"
        who = "twin " if r.get("foreign") else ""
        label = f"#{r['ref']} {who}{r['kind']} @{addr}"
        note = fmt_bytes(r["size"]) + ("" if r["live"] else " released")
        if r["kind"] == "backing":
            done = sum(x["count"] for x in r["pages"] if x["state"] == "committed")
            note += f", {done}/{npages} committed"
        _page_row(c, label, r["pages"], npages, w, marked=_is_marked(marks, r["ref"], r["address"], r["size"]),
                  marks=marks, note=note,
                  attrs={"data-ref": r["ref"], "data-kind": r["kind"], "data-state": "live" if r["live"] else "freed"})
    if m["handles"]:
        c.heading("shared physical handles")
        for h in m["handles"]:
            st = "freed" if h["freed"] else ("released, still mapped" if h["released"] else "live")
            marked = _is_marked(marks, h["ref"])
            c.text(16, c.y + 11, f"#{h['ref']}: {fmt_bytes(h['size'])}, {h['mappings']} mapping(s), {st}", size=10,
                   fill=MARK if marked else "#222", cls="handle" + (" marked" if marked else ""))
            c.y += 14
            if marked and marks is not None:
                _mark_note(c, 40, c.y + 10, marks, "handle named by the failure")
                c.y += 16
    _legend(c, ("reserved", "committed", "eager", "shared", "read-only", "private", "foreign", "freed"))
    _records(c, m.get("records") or {})


# -- system ----------------------------------------------------------------

def _holder_colours(names: Iterable[str]) -> dict:
    return {h: HOLDER_COLOURS[i % len(HOLDER_COLOURS)] for i, h in enumerate(sorted(set(names)))}


_LEDGER_OBS = re.compile(r"governor\.(free|granted|charged)(?:\(([^)]*)\))?")


def _ledger_named(marks: dict | None) -> set:
    """Ledger parts a failure's text names through the Governor's observations
    (``governor.free``, ``governor.charged(kv)``): ``{"free"}``, ``{"charged to kv"}``."""
    out: set = set()
    for part, holder in _LEDGER_OBS.findall((marks or {}).get("label") or ""):
        out.add(f"charged to {holder}" if part == "charged" and holder else part)
    return out


def _draw_system(c: _Canvas, m: dict, marks: dict | None) -> None:
    L = m["ledger"]
    cap = m["capacity"] or 1
    holders = set(L["charged_by"]) | set(L["lease_bytes"]) | set(L["live_bytes_by"]) | set(L["queued_bytes_by"]) \
        | {g["holder"] for g in m["grants"]}
    hc = _holder_colours(holders)
    total = L["free"] + L["granted"] + L["charged"]
    c.heading(f"Governor ledger: capacity {fmt_bytes(cap)} = free {fmt_bytes(L['free'])} + granted "
              f"{fmt_bytes(L['granted'])} + charged {fmt_bytes(L['charged'])}")
    c.y += 4
    bar = c.w - 16
    x = 8.0
    segs = [("free", L["free"], COLOURS["ledger-free"])]
    other_granted = L["granted"] - L["tickets_held"]
    segs.append(("granted (open grants)", other_granted, COLOURS["ledger-granted"]))
    segs.append(("granted (held by tickets)", L["tickets_held"], COLOURS["ledger-tickets"]))
    for h in sorted(L["charged_by"]):
        segs.append((f"charged to {h}", L["charged_by"][h], hc.get(h, "#777")))
    named = _ledger_named(marks)
    any_mark = False
    for name, n, col in segs:
        if n and n > 0:
            w = bar * n / cap
            hit = any(name == k or name.startswith(k + " ") for k in named)
            any_mark = any_mark or hit
            c.rect(x, c.y, w, 16, col, stroke=MARK if hit else "#555", sw=2.5 if hit else 0.6,
                   title=f"{name}: {fmt_bytes(n)}",
                   attrs={"class": "ledger" + (" marked" if hit else ""), "data-part": name})
            x += w
    c.rect(8, c.y, bar, 16, "none", stroke="#333")
    c.y += 22
    if named and marks is not None:
        _mark_note(c, 8, c.y + 8, marks, "the ledger figure the implementation disagrees on"
                   if any_mark else "a ledger figure (zero in the spec)")
        c.y += 16
    if total != cap or min(L["free"], L["granted"], L["charged"]) < 0:
        c.text(8, c.y + 10, f"\u2717 the ledger does not add up: free + granted + charged = {fmt_bytes(total)}, "
                            f"capacity {fmt_bytes(cap)}", size=11, weight="bold", fill=MARK, cls="ledger-bad")
        c.y += 16
    if holders:
        c.heading("per holder: granted | charged (live + queued refunds) | leases")
        biggest = max([1] + [L["charged_by"].get(h, 0) + sum(g["nbytes"] for g in m["grants"] if g["holder"] == h)
                             for h in holders])
        for h in sorted(holders):
            g = sum(x["nbytes"] for x in m["grants"] if x["holder"] == h)
            ch = L["charged_by"].get(h, 0)
            live = L["live_bytes_by"].get(h, 0)
            queued = L["queued_bytes_by"].get(h, 0)
            lease = L["lease_bytes"].get(h, 0)
            c.text(16, c.y + 11, str(h)[:28], size=10)
            x = 250.0
            span = c.w - 760
            if g:
                w = span * g / biggest
                c.rect(x, c.y, w, 13, COLOURS["ledger-granted"], title=f"{h} granted {fmt_bytes(g)}")
                x += w
            if ch:
                w = span * ch / biggest
                c.rect(x, c.y, w, 13, hc.get(h, "#777"), title=f"{h} charged {fmt_bytes(ch)}",
                       attrs={"class": "holder-charge", "data-holder": h})
                x += w
            c.text(x + 6, c.y + 11, f"granted {fmt_bytes(g)}, charged {fmt_bytes(ch)} (live {fmt_bytes(live)}, "
                                    f"queued {fmt_bytes(queued)}), leases {fmt_bytes(lease)}", size=10)
            c.y += 17
    if m["owned"]:
        c.heading(f"owned objects: {len(m['owned'])} (live solid, queued dashed orange, freed grey)")
        biggest = max((o["footprint"] or o["size"] or 1) for o in m["owned"])
        for o in m["owned"]:
            npages = sum(x["count"] for x in o["pages"])
            w = max(50.0, (c.w - 600) * ((o["footprint"] or o["size"] or 1) / biggest) ** 0.5)
            label = f"#{o['ref']} {o['kind']} of {o['holder']}"
            pend = [f for f in o["fences"] if not f["done"]]
            note = f"{fmt_bytes(o['footprint'])} {o['state']}"
            if o["state"] == "queued":
                note += f", waits on {len(pend)} fence(s)" if pend else ", waits for poll"
            elif pend:
                note += f", {len(pend)} fence(s) pending"
            marked = _is_marked(marks, o["ref"], o.get("address"), o["size"])
            _page_row(c, label, o["pages"], npages, w, marked=marked, marks=marks, note=note,
                      attrs={"data-ref": o["ref"], "data-kind": o["kind"], "data-state": o["state"]})
    c.heading(f"deferred-free queue: {len(m['queue'])} release(s)")
    for q in m["queue"]:
        marked = _is_marked(marks, q["owned"])
        refund = ", ".join(f"{h} {fmt_bytes(n)}" for h, n in q["refund"].items()) or "nothing"
        c.text(16, c.y + 11, f"seq {q['seq']}: {q['what']} -- frees {fmt_bytes(q['physical'])}, refunds {refund}",
               size=10, fill=MARK if marked else "#222", cls="queue-entry" + (" marked" if marked else ""))
        c.y += 15
        x = 40.0
        if not q["fences"]:
            c.text(x, c.y + 10, "no fence: runs at the next poll", size=10, fill="#555")
        for f in q["fences"]:
            col = "#5cb85c" if f["done"] else MARK
            c.parts.append(f'<circle cx="{x + 5:.1f}" cy="{c.y + 6:.1f}" r="5" fill="{col}" class="fence '
                           f'{"done" if f["done"] else "pending"}"><title>fence #{esc(f.get("ref"))}: stream #{esc(f["stream"])} item '
                           f'{esc(f["item"])}: {"done" if f["done"] else "pending"}</title></circle>')
            label = (f"fence #{f.get('ref')}: stream #{f['stream']} item {f['item']} "
                     f"{'done' if f['done'] else 'PENDING'}")
            c.text(x + 14, c.y + 10, label, size=10)
            x += 24 + 6.2 * len(label)
        c.y += 16
        if marked and marks is not None:
            _mark_note(c, 40, c.y + 10, marks, "the release of the object the failure names")
            c.y += 16
    if m["streams"]:
        c.heading("streams (work launched / completed)")
        for st in m["streams"]:
            c.text(16, c.y + 11, f"#{st['ref']}: launched {st['launched']}, completed {st['completed']}", size=10)
            c.y += 14
    if m["tickets"] or m["grants"]:
        c.heading("grants and pressure tickets")
        for g in m["grants"]:
            c.text(16, c.y + 11, f"grant #{g['ref']} {g['holder']}: {fmt_bytes(g['nbytes'])} open", size=10,
                   fill=MARK if _is_marked(marks, g["ref"]) else "#222")
            c.y += 14
        for t in m["tickets"]:
            c.text(16, c.y + 11, f"ticket #{t['ref']}: try to free {fmt_bytes(t['amount'])}, priority {t['priority']}, "
                                 f"deadline {t['deadline']}: {t['state']}, holds {fmt_bytes(t['held'])}", size=10,
                   fill=MARK if _is_marked(marks, t["ref"]) else "#222")
            c.y += 14
    if m["kv"] or m["weights"]:
        c.heading("holders: KV requests and model weights")
        for k in m["kv"]:
            pre = f", prefix {fmt_bytes(k['prefix'])} of {k['prefix_of']}" if k["prefix_of"] else ""
            c.text(16, c.y + 11, f"kv {k['name']}: {fmt_bytes(k['own'])} own of {fmt_bytes(k['max_bytes'])}{pre}, "
                                 f"{k['state']}", size=10)
            c.y += 14
        for w in m["weights"]:
            c.text(16, c.y + 11, f"weight {w['name']}: {w['pages']} page(s), {'hot' if w['hot'] else 'cold'}, "
                                 f"{'resident' if w['resident'] else 'not resident'}", size=10)
            c.y += 14
    _legend(c, ("live", "queued", "freed", "reserved", "committed", "decommitting", "ledger-free", "ledger-granted",
                "ledger-tickets"))
    _records(c, m.get("records") or {})


# -- caching ---------------------------------------------------------------

def _draw_caching(c: _Canvas, m: dict, marks: dict | None) -> None:
    segs = m["segments"]
    c.heading(f"{len(segs)} segment(s); reserved {fmt_bytes(m.get('reserved'))}, allocated "
              f"{fmt_bytes(m.get('allocated'))}" + (f" of {fmt_bytes(m['capacity'])}" if m.get("capacity") else "")
              + (f"; policy {m['preset']}" if m.get("preset") else "") + ("; expandable" if m.get("expandable") else ""))
    biggest = max((s["size"] for s in segs if isinstance(s["size"], int)), default=1) or 1
    left = 250
    span = c.w - left - 230
    for s in segs:
        base = s["address"]
        addr = f"{base:#x}" if isinstance(base, int) else "(no address yet)"
        kind = ("small" if s["small"] else "large") + (" expandable" if s["expandable"] else "")
        c.text(8, c.y + 13, f"seg {s['sid']} {kind} @{addr}"[:40], size=10)
        size = s["size"] if isinstance(s["size"], int) and s["size"] > 0 else 1
        w = max(60.0, span * size / biggest)
        widths = _widths([b["size"] if isinstance(b["size"], int) else 0 for b in s["blocks"]], w / size)
        w = max(w, sum(widths))
        any_mark = False
        bx = float(left)
        for b, bw in zip(s["blocks"], widths):
            st = b["state"]
            bx += bw
            baddr = base + b["offset"] if isinstance(base, int) and isinstance(b["offset"], int) else None
            marked = _is_marked(marks, b["ref"], baddr, b["size"] if isinstance(b["size"], int) else None)
            any_mark = any_mark or marked
            title = (f"{st} block {fmt_bytes(b['size'])}" + (f" at {baddr:#x}" if baddr is not None else "")
                     + (f", #{b['ref']}" if b["ref"] is not None else "")
                     + (f", requested {fmt_bytes(b['requested'])}" if st != "free" and b["requested"] else "")
                     + (f", {b['waits']} event(s) pending" if b["waits"] else ""))
            attrs = {"class": f"block {st}" + (" marked" if marked else ""), "data-state": st}
            if b["ref"] is not None:
                attrs["data-ref"] = b["ref"]
            c.rect(bx - bw, c.y, bw, 18,
                   COLOURS.get(st if st != "live" else "allocated", "#999"),
                   stroke=MARK if marked else "#fff", sw=2.5 if marked else 0.6, dash=st == "pending",
                   title=title, attrs=attrs)
        c.rect(left, c.y, w, 18, "none", stroke="#333", attrs={"class": "segment", "data-sid": s["sid"]})
        note = fmt_bytes(s["size"]) + f", stream {s['stream']}"
        c.text(left + w + 6, c.y + 13, note, size=10)
        c.y += 22
        if any_mark and marks is not None:
            _mark_note(c, left, c.y + 8, marks, "block named by the failure")
            c.y += 16
    if m.get("events"):
        c.heading("events not yet processed (block waits for another stream)")
        for stream, value, ref in m["events"]:
            c.text(16, c.y + 11, f"stream {stream} event {value} for block #{ref}", size=10,
                   fill=MARK if _is_marked(marks, ref) else "#222")
            c.y += 14
    _legend(c, ("allocated", "free", "pending", "unmapped"))
    for inv, why in m.get("violations") or []:
        c.text(8, c.y + 11, f"\u2717 {inv}: {why}", size=10, weight="bold", fill=MARK, cls="violation")
        c.y += 15


def _records(c: _Canvas, records: dict) -> None:
    """The counters the invariants read (S4's premature frees, S7's frees outside poll ...), when non-zero."""
    if not records:
        return
    c.heading("records the invariants read (non-zero)")
    for k, v in sorted(records.items()):
        c.text(16, c.y + 11, f"\u2717 {k.replace('_', ' ')}: {v}", size=10, weight="bold", fill=MARK, cls="record")
        c.y += 14


def snapshot_svg(snap: dict, *, width: int = 900) -> str:
    """``memspec snapshot --svg``: segments and blocks of a snapshot dict."""
    return svg(snapshot_model(snap), width=width, title="allocator snapshot: segments and blocks")
