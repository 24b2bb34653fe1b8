"""Benchmarks 1-3: the conformance harness, the random-walk fuzzer, and the
per-step cost as the live set grows.

1. ``memspec conform reference`` (both levels, mechanism and system) under
   Hypothesis vs the bare Hypothesis state machine of ``bench/bare.py`` with
   the same examples x steps, in the same run.  Target >= 0.5x.
2. The random-walk fuzz mode (``memspec fuzz --mode walk``): same spec
   oracle and checks, no Hypothesis engine per step.  Target >= 5x bare.
3. Time per step of the mixed phase of a walk that first builds a live set
   of 10, 1,000, 10,000 allocations.  Target: @10,000 <= 1.5x @10.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from bench.bare import bare_rate
from bench.common import FAILED, Row, unavailable

HARNESS_TARGET = "reference"
#: what each row needs; a row reads "not available" only when one of these is missing
HARNESS_DEPS = ("memspec.invariants.runner", "memspec.reference.targets", "memspec.spec.mechanism", "memspec.spec.system")
WALK_DEPS = ("memspec.invariants.walk", "memspec.reference.targets", "memspec.spec.system")
_bare_cache: dict[tuple[int, int], tuple[float, int, float]] = {}
#: CPU microseconds per bare step (``time.process_time``, best of the runs):
#: on a loaded machine the wall-clock rates measure the scheduler too, the
#: CPU time per step much less so (the rows' notes give both)
_bare_cpu: dict[tuple[int, int], float] = {}


def _bare_timed(examples: int, steps: int) -> tuple[float, int, float]:
    import time

    c0 = time.process_time()
    r = bare_rate(examples, steps)
    us = (time.process_time() - c0) / max(r[1], 1) * 1e6
    key = (examples, steps)
    _bare_cpu[key] = min(us, _bare_cpu.get(key, us))
    return r


def _settings(quick: bool) -> tuple[int, int]:
    return (3, 10) if quick else (100, 50)


def bare(quick: bool) -> tuple[float, int, float]:
    """The bare Hypothesis rate for this run's examples x steps (measured once per run)."""
    key = _settings(quick)
    if key not in _bare_cache:
        # best of three: on a shared machine noise only ever slows a run down
        _bare_cache[key] = max((_bare_timed(*key) for _ in range(1 if quick else 3)), key=lambda r: r[0])
    return _bare_cache[key]


def _missing(*modules: str) -> str | None:
    for m in modules:
        try:
            if importlib.util.find_spec(m) is None:
                return f"{m} has not landed"
        except (ImportError, ValueError) as e:
            return f"{m} does not import ({e})"
    return None


def harness_rows(quick: bool = False) -> list[Row]:
    from bench.harness_ab import _choices, _count_choices

    examples, steps = _settings(quick)
    _count_choices()   # Hypothesis choices per step, counted in the supervised child too
    _choices()
    fresh = _settings(quick) not in _bare_cache
    b_rate, b_steps, b_dt = bare(quick)
    b_nodes = _choices()[0]
    b_choices = b_nodes / max(b_steps * (1 if quick else 3), 1) if fresh else None
    rows = [Row("bare Hypothesis step rate", b_rate, "steps/s", None, "", None,
                f"baseline: {examples} examples x {steps} steps; {b_steps} steps in {b_dt:.2f} s")]
    name, unit, tgt = f"harness step rate (conform {HARNESS_TARGET})", "steps/s", ">= 0.5x bare"
    why = _missing(*HARNESS_DEPS)
    if why:
        return rows + [unavailable(name, unit, tgt, why)]
    from memspec.invariants import runner

    import os
    import resource
    import time

    best = None
    cpu: list[tuple[float, float]] = []   # per run: (supervised child, supervisor) CPU us per step
    choices: list[float] = []             # per run: Hypothesis choices per step
    for _ in range(1 if quick else 2):  # best of two, like the baseline
        _choices()
        b, c0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time()
        results = runner.conform(HARNESS_TARGET, "all", profile="ci", examples=examples, steps=steps, out_dir=None)
        a, c1 = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time()
        steps_run = sum(r.stats.steps for r in results if r.plan is not None)
        if steps_run:
            choices.append(_choices()[0] / steps_run)
        seconds = sum(r.seconds for r in results)
        if steps_run:
            child = (a.ru_utime - b.ru_utime) + (a.ru_stime - b.ru_stime)
            cpu.append((child / steps_run * 1e6, (c1 - c0) / steps_run * 1e6))
        if best is None or (seconds and steps_run / seconds > best[1] / best[2]):
            best = (results, steps_run, seconds)
    results, steps_run, seconds = best
    errors = [e for r in results for e in r.errors]
    if errors and not steps_run:
        return rows + [unavailable(name, unit, tgt, f"conform {HARNESS_TARGET}: {errors[0][:150]}")]
    rate = steps_run / seconds
    ratio = rate / b_rate
    per_level = {r.level: {"steps": r.stats.steps, "seconds": r.seconds,
                           "rate": (r.stats.steps / r.seconds if r.seconds else None)} for r in results}
    fails = [f"{f.invariant}" for r in results for f in r.failures]
    note = "levels " + ", ".join(f"{lv} {d['rate']:,.0f}/s" for lv, d in per_level.items() if d["rate"])
    b_cpu = _bare_cpu.get(_settings(quick))
    child_us = min(c for c, _p in cpu) if cpu else None
    parent_us = min(p for _c, p in cpu) if cpu else None
    if b_cpu and child_us:
        # load-independent: CPU time per step (the conform child: its own start included;
        # the supervisor apart), against the bare machine's, same run
        note += (f"; CPU us/step: conform child {child_us:.0f} (+ supervisor {parent_us:.0f}), bare {b_cpu:.0f}: "
                 f"CPU ratio {b_cpu / child_us:.2f}")
    if choices:
        note += f"; Hypothesis choices/step {min(choices):.2f}" + (f" (bare {b_choices:.2f})" if b_choices else "")
    if hasattr(os, "getloadavg"):
        note += f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    if fails or errors:
        note += f"; NOTE run not clean: {len(fails)} FAIL ({', '.join(fails[:4])}), {len(errors)} errors"
    rows.append(Row(name, rate, unit, ratio, tgt, ratio >= 0.5, note,
                    extra={"steps": steps_run, "seconds": seconds, "levels": per_level, "failures": fails,
                           "errors": errors[:5], "cpu_us_per_step": child_us, "supervisor_cpu_us_per_step": parent_us,
                           "bare_cpu_us_per_step": b_cpu,
                           "choices_per_step": min(choices) if choices else None, "bare_choices_per_step": b_choices,
                           "cpu_ratio": (b_cpu / child_us) if b_cpu and child_us else None}))
    return rows


def walk_measure(quick: bool = False) -> dict:
    """The walk on both levels of ``reference``, best of two per level:
    ``{"levels": {level: {steps, seconds, rate, runs}}, "cpu": {level: us/step},
    "problems": [...], "native": {...}}`` (``native``: what this process
    runs, :func:`memspec.native.info`)."""
    import time

    from memspec import native
    from memspec.invariants import runner, walk

    examples, steps = _settings(quick)
    per_level, problems = {}, []
    cpu: dict[str, float] = {}   # level -> CPU us per walk step (best run)
    for level in ("mechanism", "system"):
        best = None
        for rep in range(1 if quick else 2):  # best of two
            try:
                plan = runner.make_plan(HARNESS_TARGET, level)
            except Exception as e:  # noqa: BLE001 - a level that cannot be planned is reported, not fatal
                problems.append(f"{level}: {type(e).__name__}: {e}")
                break
            c0 = time.process_time()
            res = walk.walk(plan, max_steps=examples * steps, run_length=steps, seed=0, stop_on_failure=False)
            cpu_us = (time.process_time() - c0) / max(res.steps, 1) * 1e6
            cpu[level] = min(cpu_us, cpu.get(level, cpu_us))
            if rep == 0:
                problems += [f"{level}: {e}" for e in res.errors]
                problems += [f"{level}: {f.violation.invariant}" for f in res.failures]
            if best is None or res.rate() > best.rate():
                best = res
        if best is not None:
            per_level[level] = {"steps": best.steps, "seconds": best.seconds, "rate": best.rate(), "runs": best.runs}
    info = native.info()
    return {"levels": per_level, "cpu": cpu, "problems": problems, "native": info}


def _walk_native(quick: bool) -> tuple[dict | None, str, float | None]:
    """The same walk measured in a child process with the compiled modules
    (``MEMSPEC_NATIVE=1``): ``(measurement or None, why not, build seconds)``.
    Uses the build of the current sources that ``memspec build-native`` made;
    with ``MEMSPEC_BENCH_NATIVE_BUILD=1`` a missing build is made first (3
    CPU minutes, 10 wall minutes on a loaded 2-core machine: more than the
    whole bench's budget, so not by default)."""
    import os
    import time

    from memspec import native

    build_s = None
    dest, why = native.stale_reason()
    if dest is None:
        if quick or os.environ.get("MEMSPEC_BENCH_NATIVE_BUILD", "") in ("", "0"):
            return None, why, None
        try:
            t0 = time.perf_counter()
            native.build()
            build_s = time.perf_counter() - t0
        except native.NativeError as e:
            return None, f"no native build ({str(e).splitlines()[0][:120]})", None
    out, why = _walk_in_child(quick, compiled=True)
    return out, why, build_s


def _walk_in_child(quick: bool, compiled: bool) -> tuple[dict | None, str]:
    """:func:`walk_measure` in a fresh interpreter, with the compiled modules
    (``MEMSPEC_NATIVE=1``) or without them: ``(measurement or None, why not)``."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from memspec import native

    env = dict(os.environ)
    if compiled:
        env[native.ENV] = "1"
    else:
        env.pop(native.ENV, None)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    code = ("import json, sys; from bench.harness import walk_measure; "
            f"print('WALK-JSON ' + json.dumps(walk_measure({quick!r})))")
    what = "native" if compiled else "pure-Python"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("WALK-JSON ")]
    if p.returncode != 0 or not lines:
        return None, f"{what} walk failed: {(p.stderr.strip().splitlines() or ['?'])[-1][:150]}"
    out = json.loads(lines[-1][len("WALK-JSON "):])
    if bool(out["native"]["native"]) != compiled:
        return None, f"{what} walk: the child {'did not load' if compiled else 'loaded'} the native build: " \
                     f"{p.stderr.strip()[-150:]}"
    return out, ""


def _phase_labels() -> tuple:
    from bench.profile import WALK_PHASES

    return WALK_PHASES


def _walk_phases(quick: bool) -> dict:
    """``{level: bench.profile.walk_phases(level)}``: each phase of a pure
    walk step timed per call (no profiler), in CPU us/step; ``{}`` when it
    cannot run (the row's figures do not depend on it)."""
    try:
        from bench.profile import walk_phases

        return {lv: walk_phases(lv, steps=100 if quick else 1500, run_length=_settings(quick)[1])
                for lv in ("mechanism", "system")}
    except Exception:  # noqa: BLE001 - a breakdown that cannot run leaves the row as it is
        return {}


#: the phases no harness can make cheaper: the implementation's own call, and
#: the spec's step with the match of the answer against its outcome set
CEILING_PHASES = ("target call", "spec + match")


def walk_ceiling(phases: dict, bare_cpu_us: float | None) -> dict:
    """The walk/bare ratio a walk would reach if drawing and every check cost
    nothing: bare CPU per step over :data:`CEILING_PHASES`' CPU per step,
    per level and for the levels together (the row's figure is both levels'
    steps over both levels' time).  ``{}`` without a bare figure or the
    phases."""
    if not bare_cpu_us or not phases:
        return {}
    floor = {lv: sum(m["phases"].get(p, 0.0) for p in CEILING_PHASES) for lv, m in phases.items()}
    if not all(floor.values()):
        return {}
    out = {lv: bare_cpu_us / us for lv, us in floor.items()}
    out["both"] = bare_cpu_us / (sum(floor.values()) / len(floor))
    return out


def _totals(m: dict) -> tuple[int, float]:
    return sum(d["steps"] for d in m["levels"].values()), sum(d["seconds"] for d in m["levels"].values())


def walk_rows(quick: bool = False) -> list[Row]:
    """The walk mode on both levels of ``reference``: the same examples x
    steps as the harness row (runs of ``steps`` steps), same oracle and
    checks; pure Python in this process and, when a native build exists or
    can be made (``memspec build-native``), compiled in a child process.
    The row's figure is the compiled walk's when it ran; the note and the
    JSON give both."""
    name, unit, tgt = f"walk fuzz step rate ({HARNESS_TARGET})", "steps/s", ">= 5x bare"
    why = _missing(*WALK_DEPS)
    if why:
        return [unavailable(name, unit, tgt, why)]
    from memspec.invariants import walk

    b_rate = bare(quick)[0]
    b_cpu = _bare_cpu.get(_settings(quick))
    here = walk_measure(quick)
    if here["native"]["native"]:
        # this process runs the compiled modules (MEMSPEC_NATIVE=1, as for the caching rows):
        # this walk is the compiled one, the pure-Python walk runs in a child without them
        comp, build_s = here, None
        pure, why_not = _walk_in_child(quick, compiled=False)
        if pure is None:
            return [unavailable(name, unit, tgt, why_not, status=FAILED)]
    else:
        pure = here
        comp, why_not, build_s = _walk_native(quick)
    total_steps, total_s = _totals(pure)
    if not total_steps:
        return [unavailable(name, unit, tgt, f"walk ran no steps: {'; '.join(pure['problems'])[:150]}",
                            status=FAILED)]
    pure_ratio = total_steps / total_s / b_rate

    def cpu_text(m: dict) -> tuple[str, float | None]:
        cpu = m["cpu"]
        w = sum(cpu.values()) / len(cpu) if cpu else None
        if not (b_cpu and w):
            return "", None
        return (f"walk {w:.0f} (" + ", ".join(f"{lv} {us:.0f}" for lv, us in cpu.items())
                + f"), bare {b_cpu:.0f}: CPU ratio {b_cpu / w:.2f}"), b_cpu / w

    pure_cpu_text, pure_cpu_ratio = cpu_text(pure)
    main_m = comp or pure
    steps_, secs = _totals(main_m)
    rate = steps_ / secs
    ratio = rate / b_rate
    note = ("COMPILED (mypyc, `memspec build-native`): " if comp else "pure Python: ") + "levels " + \
        ", ".join(f"{lv} {d['rate']:,.0f}/s" for lv, d in main_m["levels"].items())
    extra: dict[str, Any] = {"native": comp is not None, "pure_ratio": pure_ratio, "pure_cpu_ratio": pure_cpu_ratio}
    if comp:
        comp_cpu_text, comp_cpu_ratio = cpu_text(comp)
        note += f"; CPU us/step compiled: {comp_cpu_text}; pure Python in the same run: {pure_ratio:.2f}x bare " \
                f"(CPU us/step {pure_cpu_text})"
        if build_s is not None:
            note += f"; native build made by this run in {build_s:.0f} s"
        extra.update(native_ratio=ratio, native_cpu_ratio=comp_cpu_ratio, native_build_seconds=build_s,
                     native_build=comp["native"]["build"], compiled_modules=len(comp["native"]["compiled"]),
                     native_cpu_us_per_step=comp["cpu"])
    else:
        note += f"; CPU us/step: {pure_cpu_text}; not compiled: {why_not}"
    phases = _walk_phases(quick)
    if phases:
        built = "compiled" if here["native"]["native"] else "pure"   # measured in this process
        note += f"; where a {built} step's time goes (CPU us/step, " + "/".join(phases) + "): " + ", ".join(
            f"{label} " + "/".join(f"{m['phases'][label]:.0f}" for m in phases.values())
            for label, _d in _phase_labels())
        extra["phases_us_per_step"] = {lv: m["phases"] for lv, m in phases.items()}
        extra["phases_compiled"] = bool(here["native"]["native"])
        ceiling = walk_ceiling(phases, b_cpu)
        if ceiling:
            extra["ceiling"] = ceiling
            note += ("; CEILING, a walk whose draws and checks cost nothing (bare CPU / (target call + spec + "
                     "match)): " + ", ".join(f"{lv} {x:.2f}x" for lv, x in ceiling.items()))
    note += "; " + walk.sample_note()
    problems = pure["problems"] + (comp["problems"] if comp else [])
    if problems:
        note += f"; NOTE run not clean: {'; '.join(problems[:3])[:150]}"
    extra.update(steps=steps_, seconds=secs, levels=main_m["levels"], problems=problems[:5],
                 cpu_us_per_step=pure["cpu"], bare_cpu_us_per_step=b_cpu,
                 cpu_ratio=pure_cpu_ratio if not comp else extra["native_cpu_ratio"],
                 pure_levels=pure["levels"])
    return [Row(name, rate, unit, ratio, tgt, ratio >= 5.0, note, extra=extra)]


LIVE = (10, 1_000, 10_000)
QUICK_LIVE = (10, 100, 300)
#: the live-set walk runs the reference on 4 KiB pages (the integrity check
#: writes stamps into every live page; 2 MiB pages would cost GiB of host
#: memory at 10,000 live allocations), 16,384 pages: room for 10,000 live
#: allocations and the mixed phase's own, the same device at every N
LIVESET_PAGE = 4096
LIVESET_CAPACITY = 16_384 * LIVESET_PAGE
#: the mixed phase draws from the allocator's actions and the capability
#: queries (the live set is made of allocations; VMM and sharing actions cost
#: O(pages of a range), which does not depend on the live set)
LIVESET_ROLES = ("DeviceAllocator", "DeviceMemoryMechanism")


def _liveset_plan() -> Any:
    import functools

    from memspec.invariants import runner
    from memspec.invariants.discovery import TargetRef
    from memspec.reference import targets

    tref = TargetRef(HARNESS_TARGET, functools.partial(targets.reference, page_size=LIVESET_PAGE), "bench")
    plan = runner.make_plan(tref, "mechanism", capacity=LIVESET_CAPACITY)
    plan.actions = [a for a in plan.actions if a.role in LIVESET_ROLES]
    return plan


def step_time(n_live: int, mixed_steps: int, seed: int = 0) -> tuple[float, dict]:
    """Seconds per step of the mixed phase of a walk on the mechanism level
    that first allocates ``n_live`` one-page allocations.

    Mixed phase: a random step from the allocator's and capability-query
    actions of the spec, by their weights, arguments drawn from the spec's
    domains (allocation sizes from its usual 1 byte..3 pages); then, when
    the live set drifted, one step that allocates or frees a random live
    allocation to bring it back to ``n_live``.  Every step is a full harness step (spec oracle, outcome
    match, invariants, observations, data integrity) and all are counted.
    """
    import random
    import time

    from memspec.invariants import harness as H

    plan = _liveset_plan()
    allocate = plan.machine.action("allocate")
    deallocate = plan.machine.action("deallocate")
    guard = H.CallGuard(plan.timeout, plan.guard_mode)
    guard.install()
    run = H.Run(plan, guard)
    rng = random.Random(seed)
    chooser = H.RandomChooser(rng, [])
    page = LIVESET_PAGE
    try:
        for _ in range(n_live):
            run.apply(allocate, {"size": page})
        live = run.state.live_allocs
        if len(live) != n_live:
            raise RuntimeError(f"built {len(live)} live allocations, wanted {n_live}")
        before = dict(plan.stats.actions)
        steps = 0
        t0 = time.perf_counter()
        acts = list(plan.actions)
        weights = [a.weight for a in acts]
        while steps < mixed_steps:
            a = rng.choices(acts, weights)[0]
            if a is allocate:
                # the spec's "mostly" sizes only: its occasional "up to half the
                # capacity" draw would succeed or not depending on the free
                # space, i.e. on the live set, and cost O(pages) when it does
                args = {"size": rng.randint(1, 3 * page)}
            elif a.available(run.state):
                args = a.draw_args(run.state, chooser)
            else:
                continue
            run.apply(a, args)
            steps += 1
            d = len(live) - n_live
            if d < 0:
                run.apply(allocate, {"size": page})
                steps += 1
            elif d > 0:
                run.apply(deallocate, {"handle": live.at(rng.randrange(len(live)))})
                steps += 1
        dt = time.perf_counter() - t0
        mixed = {k: v - before.get(k, 0) for k, v in plan.stats.actions.items() if v - before.get(k, 0)}
        info = {"steps": steps, "seconds": dt, "live_at_end": len(live), "actions": mixed}
    finally:
        run.close()
        guard.uninstall()
    return dt / steps, info


def liveset_rows(quick: bool = False) -> list[Row]:
    lives = QUICK_LIVE if quick else LIVE
    names = [f"step time @{n:,} live" for n in lives]
    tgt_last = f"<= 1.5x @{lives[0]:,}"
    why = _missing(*WALK_DEPS)
    if why:
        return [unavailable(n, "us/step", tgt_last if lv == lives[-1] else "", why) for n, lv in zip(names, lives)]
    mixed = 300 if quick else 3000
    per: dict[int, tuple[float, dict]] = {}
    from memspec.invariants import harness as H

    for n in lives:
        # best of two runs: noise only ever adds time
        try:
            if n == lives[0]:
                step_time(n, 100, seed=2)  # warm-up: imports and first calls out of the baseline
            a = step_time(n, mixed, seed=0)
            b = step_time(n, mixed, seed=1) if not quick else a
        except (H.Violation, H.SpecError, H.TargetError, RuntimeError) as e:
            why = f"the walk on {HARNESS_TARGET} stopped at @{n:,} live: {type(e).__name__}: {str(e)[:140]}"
            return [unavailable(nm, "us/step", tgt_last if lv == lives[-1] else "", why, status=FAILED)
                    for nm, lv in zip(names, lives)]
        per[n] = min(a, b, key=lambda x: x[0])
    rows = []
    base = per[lives[0]][0]
    for n, name in zip(lives, names):
        t, info = per[n]
        if n == lives[-1]:
            ratio = t / base
            rows.append(Row(name, t * 1e6, "us/step", ratio, tgt_last, ratio <= 1.5,
                            f"ratio = step time @{n:,} / @{lives[0]:,}; {info['steps']} mixed steps", extra=info))
        else:
            rows.append(Row(name, t * 1e6, "us/step", None, "", None,
                            ("baseline; " if n == lives[0] else "") + f"{info['steps']} mixed steps", extra=info))
    return rows
