"""Benchmark 4: the reference caching allocator, alloc/free pairs per second.

* ``pytorch`` preset on a mixed small/large workload at 1k, 10k, 100k live
  blocks.  Targets: >= 100,000 pairs/s at 100k, and per-op cost at 100k
  <= 1.5x at 1k (best fit is an ordered search, not a scan).
* ``seed`` preset against the seed's toy (``bench/toy.py``, read from the seed
  at run time) on large requests only, same workload, same run.  Target:
  ratio seed/toy >= 1.0 at every live-set size.

Pure Python and compiled: when ``memspec.reference.caching`` imports as a
mypyc build (``memspec build-native``, ``MEMSPEC_NATIVE=1``: its
``COMPILED`` is true), every reference figure is measured twice in the same
run, compiled and pure (a pure copy loaded from the source files next to
it, its parts and ``caching_stats`` included); the row's value and verdict are the
compiled figure's, its note names the build and gives the pure figure
(``extra``: ``compiled``, ``pure_*``).  Without a build the rows are pure
Python and say so.

Each measurement is repeated and the best (fastest) run kept, interleaving
the sides of a comparison (toy, pure, compiled) so machine noise hits them
alike.  The per-op cost ratio @100k / @1k is the fastest CPU time at 100k
over the fastest at 1k, both from the same interleaved trials (each trial
runs every size back to back); the note gives the trials' own ratios
(median, range).  Rates are pairs
per CPU second of this process (``time.process_time``): on a shared machine
the wall clock also counts the time other processes held the core (the
wall-clock rate is in each row's note and ``extra``).
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

from bench import toy as toy_mod
from bench import workload
from bench.common import NOT_AVAILABLE, Row, unavailable

MiB = 1 << 20
#: the simulated device is never the limit here: ~1 PiB
CAPACITY = 1 << 50


class Unavailable(Exception):
    """A dependency of the row has not landed or does not import."""


CACHING = "memspec.reference.caching"
STATS = "memspec.reference.caching_stats"
#: the modules the allocator is made of, each importing only those before it
#: (``caching`` is the face of ``caching_blocks`` and ``caching_segments``)
PARTS = (STATS, "memspec.reference.caching_blocks", "memspec.reference.caching_segments", CACHING)


def reference_ops(preset: str, mod: Any = None) -> tuple[Callable[[int], Any], Callable[[Any], Any]]:
    """``(alloc(size) -> block, free(block))`` on a fresh reference caching
    allocator under ``preset`` (of ``mod``, default the module as imported)."""
    if mod is None:
        try:
            mod = importlib.import_module(CACHING)
        except ImportError as e:
            raise Unavailable(f"{CACHING} does not import ({e})") from e
    return _adapt(mod, preset)


def is_compiled(mod: Any) -> bool:
    """The module runs as a mypyc build (its own ``COMPILED`` flag)."""
    return getattr(mod, "COMPILED", False) is True


def load_pure(install: bool = False) -> Any:
    """A pure-Python copy of ``memspec.reference.caching`` (and of the
    modules it imports, :data:`PARTS`), executed from the source files in the
    package's directory whatever build the normal import finds; the
    ``sys.modules`` entries are restored afterwards, unless ``install``
    (then later imports get the pure copies)."""
    import memspec.reference as pkg

    where = Path(list(pkg.__path__)[0])
    saved = {k: sys.modules.get(k) for k in PARTS}
    try:
        got = None
        for name in PARTS:
            spec = importlib.util.spec_from_file_location(name, where / (name.rsplit(".", 1)[1] + ".py"))
            if spec is None or spec.loader is None:
                raise Unavailable(f"no source of {name} in {where}")
            got = importlib.util.module_from_spec(spec)
            sys.modules[name] = got  # the later parts import these very copies
            spec.loader.exec_module(got)
        return got
    except (OSError, ImportError) as e:
        raise Unavailable(f"the pure-Python source of {CACHING} does not load ({e})") from e
    finally:
        for k, v in saved.items():
            if install:
                pass
            elif v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def variants() -> list[tuple[str, Any]]:
    """``[(label, module)]`` to measure: ``[("compiled", build), ("pure", copy)]``
    when the import finds a mypyc build, else ``[("pure", module)]``."""
    try:
        mod = importlib.import_module(CACHING)
    except ImportError as e:
        raise Unavailable(f"{CACHING} does not import ({e})") from e
    if is_compiled(mod):
        return [("compiled", mod), ("pure", load_pure())]
    return [("pure", mod)]


def build_text(vs: list[tuple[str, Any]]) -> str:
    if vs[0][0] == "compiled":
        return f"ran compiled (mypyc build {Path(getattr(vs[0][1], '__file__', '?')).name})"
    return "ran pure Python (no mypyc build imported: see `memspec build-native`, MEMSPEC_NATIVE=1)"


def _adapt(mod: Any, preset: str) -> tuple[Callable[[int], Any], Callable[[Any], Any]]:
    cls = getattr(mod, "CachingAllocator", None)
    if cls is None:
        raise Unavailable("memspec.reference.caching has no CachingAllocator")
    a = cls(preset=preset, capacity=CAPACITY)
    return a.malloc, a.free


def toy_ops() -> tuple[Callable[[int], Any], Callable[[Any], Any]]:
    t = toy_mod.load_toy()
    if t is None:
        raise Unavailable("seed 003 not found (set MEMSPEC_SEED_003)")
    sim = t.Sim(device=CAPACITY)
    return sim.alloc, sim.free


def _once(make_ops: Callable[[], tuple], w: workload.Workload) -> tuple[float, float]:
    """``(CPU seconds, wall seconds)`` of the workload's timed pairs on fresh ops."""
    alloc, free = make_ops()
    return workload.timed_pairs(w, alloc, free)


def _best(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """The fastest CPU time and the fastest wall time of repeated runs."""
    return min(c for c, _ in runs), min(t for _, t in runs)


LIVE = (1_000, 10_000, 100_000)
QUICK_LIVE = (100, 300, 1_000)


def run(quick: bool = False) -> list[Row]:
    lives = QUICK_LIVE if quick else LIVE
    pairs = 2_000 if quick else 30_000
    repeats = 1 if quick else 3
    trials = 1 if quick else 5  # interleaved runs of each side (best kept): pytorch sizes, seed vs toy
    return (_loaded(lambda: pytorch_rows(lives, pairs, repeats, trials))
            + _loaded(lambda: [floor_row(lives, pairs, repeats)]) + _loaded(lambda: seed_rows(lives, pairs, trials)))


def _loaded(make: Callable[[], list[Row]]) -> list[Row]:
    """``make()``'s rows with the machine's 1-minute load average before and
    after their measurement (note and ``extra["loadavg"]``): on a shared
    machine it says how far the figures are from a quiet one's."""
    before = _loadavg()
    rows = make()
    after = _loadavg()
    if before is not None and after is not None:
        for r in rows:
            if r.value is not None:
                r.extra["loadavg"] = [before, after]
                r.note += f"; load average {before:.1f} -> {after:.1f}"
    return rows


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # (not on every platform)
        return None


class _DictAllocator:
    """The cheapest possible "allocator": a counter and a dict.  It does no
    allocation policy at all; its per-op cost at 100k vs 1k live blocks is
    the floor the memory hierarchy (random access into a large live set)
    puts under any Python allocator on this machine."""

    __slots__ = ("n", "live")

    def __init__(self) -> None:
        self.n = 0
        self.live: dict[int, int] = {}

    def alloc(self, size: int) -> int:
        self.n += 1
        self.live[self.n] = size
        return self.n

    def free(self, h: int) -> None:
        del self.live[h]


def floor_row(lives: tuple[int, ...], pairs: int, repeats: int) -> Row:
    lo, hi = lives[0], lives[-1]
    t = {}
    for n in (lo, hi):
        w = workload.make("mixed", n, pairs)
        t[n] = min(workload.timed_pairs(w, a.alloc, a.free)[0] for a in (_DictAllocator() for _ in range(repeats)))
    return Row(f"floor: dict 'allocator' @{_k(hi)} live (mixed)", pairs / t[hi], "pairs/s", t[hi] / t[lo], "", None,
               f"no policy; ratio = per-op cost @{_k(hi)} / @{_k(lo)}: the memory hierarchy's share")


def _k(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def _clock(v: str, n: int, cpu: float, wall: float, pairs: int) -> str:
    return f"{v} {pairs / cpu:,.0f} pairs per CPU second (wall clock {pairs / wall:,.0f})"


def pytorch_rows(lives: tuple[int, ...], pairs: int, repeats: int, trials: int | None = None) -> list[Row]:
    """One row per live-set size, then the two targets: the rate at the
    largest size (ratio = rate / 100,000) and the per-op cost there against
    the smallest (the flatness: the median over ``trials`` interleaved
    trials of that trial's cost ratio; each trial runs every size and every
    variant back to back)."""
    names = [f"caching pytorch @{_k(n)} live (mixed)" for n in lives]
    small, big = lives[0], lives[-1]
    tgt_rate = ">= 100,000/s"
    flat_name, tgt_flat = f"caching pytorch per-op cost @{_k(big)} / @{_k(small)}", "<= 1.5x"
    try:
        vs = variants()
    except Unavailable as e:
        return ([unavailable(n, "pairs/s", tgt_rate if i == len(lives) - 1 else "", str(e)) for i, n in enumerate(names)]
                + [unavailable(flat_name, "x", tgt_flat, str(e))])
    trials = max(trials or repeats, 1)
    ws = {n: workload.make("mixed", n, pairs) for n in lives}
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {(v, n): [] for v, _ in vs for n in lives}
    for _ in range(trials):
        for n in lives:
            for v, mod in vs:
                runs[v, n].append(_once(lambda: reference_ops("pytorch", mod), ws[n]))
    main = vs[0][0]
    built = build_text(vs)
    best = {k: _best(r) for k, r in runs.items()}
    rate = {k: pairs / c for k, (c, _) in best.items()}

    def others(n: int) -> str:
        return "; ".join(_clock(v, n, *best[v, n], pairs) for v, _ in vs)

    rows = []
    for n, name in zip(lives, names):
        r = rate[main, n]
        extra: dict[str, Any] = {"wall_rate": pairs / best[main, n][1], "compiled": main == "compiled",
                                 "pure_rate": rate["pure", n]}
        if n == big:
            rows.append(Row(name, r, "pairs/s", r / 100_000, tgt_rate, r >= 100_000,
                            f"ratio = rate / 100,000; {built}; {others(n)}", extra=extra))
        else:
            rows.append(Row(name, r, "pairs/s", None, "", None,
                            ("baseline of the cost ratio; " if n == small else "") + f"{built}; {others(n)}",
                            extra=extra))

    def cost_ratios(v: str) -> list[float]:
        return [hi[0] / lo[0] for lo, hi in zip(runs[v, small], runs[v, big])]

    # the ratio of the fastest CPU times of the interleaved trials (noise only
    # adds time, in either size's run); the per-trial ratios' median and range
    # show the spread
    ratio = {v: best[v, big][0] / best[v, small][0] for v, _ in vs}
    med = {v: statistics.median(cost_ratios(v)) for v, _ in vs}
    spread = cost_ratios(main)
    cost = ratio[main]
    pure_txt = "" if main == "pure" else f"; pure Python {ratio['pure']:.2f} (trials' median {med['pure']:.2f})"
    rows.append(Row(flat_name, cost, "x", cost, tgt_flat, cost <= 1.5,
                    f"fastest CPU time @{_k(big)} / fastest @{_k(small)} over {trials} interleaved trials "
                    f"(each trial's own ratio: median {med[main]:.2f}, range {min(spread):.2f}-{max(spread):.2f}); "
                    f"{built}{pure_txt}; best fit is a bisect, not a scan; the floor row gives the memory hierarchy's share",
                    extra={"compiled": main == "compiled", "trial_ratios": spread, "trial_median": med[main],
                           "pure_ratio": ratio["pure"], "pure_median": med["pure"],
                           "cpu_seconds": {f"{v}@{n}": [c for c, _ in runs[v, n]] for v, _ in vs for n in (small, big)}}))
    return rows


def seed_rows(lives: tuple[int, ...], pairs: int, repeats: int) -> list[Row]:
    names = [f"caching seed vs toy @{_k(n)} live (large)" for n in lives]
    tgt = "ratio >= 1.0"
    reason = None
    try:
        toy_ops()
    except Unavailable as e:
        reason = str(e)
    vs: list[tuple[str, Any]] = []
    if reason is None:
        try:
            vs = variants()
        except Unavailable as e:
            reason = str(e)
    if reason is not None:
        return [unavailable(n, "pairs/s", tgt, reason) for n in names]
    main = vs[0][0]
    built = build_text(vs)
    rows = []
    for n, name in zip(lives, names):
        w = workload.make("large", n, pairs)
        runs: dict[str, list[tuple[float, float]]] = {v: [] for v, _ in vs}
        toy_t = []
        for _ in range(repeats):
            toy_t.append(_once(toy_ops, w))
            for v, mod in vs:
                runs[v].append(_once(lambda: reference_ops("seed", mod), w))
        toy_c, toy_w = _best(toy_t)
        best = {v: _best(r) for v, r in runs.items()}
        ratio = {v: toy_c / c for v, (c, _) in best.items()}
        ref_c, ref_w = best[main]
        pure_txt = "" if main == "pure" else f"; pure Python ratio {ratio['pure']:.2f} ({pairs / best['pure'][0]:,.0f} pairs/s)"
        rows.append(Row(name, pairs / ref_c, "pairs/s", ratio[main], tgt, ratio[main] >= 1.0,
                        f"{built}{pure_txt}; toy {pairs / toy_c:,.0f} pairs per CPU second; wall clock: "
                        f"{main} {pairs / ref_w:,.0f}, toy {pairs / toy_w:,.0f} pairs/s (ratio {toy_w / ref_w:.2f})",
                        extra={"compiled": main == "compiled", "pure_ratio": ratio["pure"],
                               "pure_rate": pairs / best["pure"][0], "toy_rate": pairs / toy_c,
                               "wall_rate": pairs / ref_w, "toy_wall_rate": pairs / toy_w}))
    return rows


def opcodes_per_pair(make_ops: Callable[[], tuple], w: workload.Workload) -> float:
    """Python opcodes executed per alloc/free pair (``sys.settrace`` opcode
    events in every frame the ops enter; the driving loop is not counted):
    deterministic and load-independent, unlike a rate.  A compiled build
    runs no Python opcodes in its own code, so count the pure copy."""
    alloc, free = make_ops()
    live = [alloc(n) for n in w.init]
    ops = 0

    def local(frame: Any, event: str, arg: Any) -> Any:
        nonlocal ops
        if event == "opcode":
            ops += 1
        return local

    def call(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    # The cyclic collector is held off while counting: a collection runs
    # ``gc.callbacks`` (Hypothesis installs one), whose Python frames the
    # tracer would count, so the figure would depend on what ran before.
    old, was_enabled = sys.gettrace(), gc.isenabled()
    gc.collect()
    gc.disable()
    sys.settrace(call)
    try:
        for i, n in w.ops:
            free(live[i])
            live[i] = alloc(n)
    finally:
        sys.settrace(old)
        if was_enabled:
            gc.enable()
    return ops / len(w.ops)


def opcode_table(lives: tuple[int, ...] = (1_000, 100_000), pairs: int = 3_000) -> list[tuple[str, int, float]]:
    """``[(what, live, opcodes per pair)]``: the seed preset and the toy on the
    toy's workload, the pytorch preset on the mixed one (pure Python)."""
    pure = load_pure()
    out = []
    for n in lives:
        w = workload.make("large", n, pairs)
        out.append(("seed", n, opcodes_per_pair(lambda: reference_ops("seed", pure), w)))
        try:
            out.append(("toy", n, opcodes_per_pair(toy_ops, w)))
        except Unavailable:
            pass
        out.append(("pytorch", n, opcodes_per_pair(lambda: reference_ops("pytorch", pure),
                                                    workload.make("mixed", n, pairs))))
    return out


if __name__ == "__main__":  # python -m bench.caching: opcodes per pair (load-independent)
    for what, n, k in opcode_table():
        print(f"{what:8} @{_k(n):>4} live: {k:6.0f} Python opcodes per alloc/free pair")
