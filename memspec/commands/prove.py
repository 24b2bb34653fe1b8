"""``memspec prove``: Z3 inductive proofs of the spec's invariants.

One row per invariant of the spec's catalogs (seed 000's S rows,
:data:`memspec.spec.invariants.CATALOG`; the caching allocator's C rows,
:data:`memspec.spec.caching.CATALOG`), plus G1 (configuration generations,
on S15's machine) and P1 (progress, :mod:`memspec.invariants.formal.proofs_progress`),
and "proved" only when all of these hold (DESIGN.md, *What "proved" must mean*):

* the inductive proof passes with nothing assumed (a lemma not derived from
  the invariant makes it *conditional*);
* its Z3 machine encodes every spec action that declares the invariant
  (encoded/declared, read from the spec's action tables);
* its Z3 machine encodes every spec action that *writes what the invariant
  reads*, derived from the executable spec (seeded spec-only walks: the
  fields each branch writes, the fields each invariant reads;
  :mod:`memspec.invariants.formal.coverage`).  A gap listed with its reason in
  ``KNOWN_GAPS`` leaves the row proved over its encoded actions only
  (PARTIAL, ``uncovered`` in the JSON, not a full proof for the acceptance
  check); any other gap, or a stale line of that table, fails the row, naming
  the action and the field;
* invariant agreement: on projections of reachable spec states the encoded
  invariant holds exactly where the executable one does;
* transition agreement: every branch of every encoded action that has a spec
  counterpart was sampled and agreed (per-branch counts; 0 samples fails);
* the unguarded variant (one guard removed) breaks the invariant it names;
* invariant strength: on perturbed copies of the walk's states (mostly
  unreachable; :mod:`memspec.invariants.formal.agreement_perturb`) the executable
  invariant never holds where the named encoding fails, and it rejects some
  perturbed state wherever the encoding does (a weakened executable check).

Exit status 1 if any invariant is not proved.  ``--json FILE`` writes the
per-invariant record; ``--self-test`` plants breaks and prints a kill table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from typing import Any

from memspec.argtypes import jobs as jobs_type
from memspec.argtypes import out_file


#: agreeing samples per outcome branch of each encoded action, per spec action that it encodes
#: (``--per-branch``): a branch reached often stops costing evaluations once it has these
PER_BRANCH = 25


def _agreement(samples: int, inv_samples: int, seed: int, per_branch: int | None = None) -> list[Any]:
    from memspec.invariants.formal import run_agreement

    return run_agreement(samples=samples, seed=seed, inv_samples=inv_samples, per_branch=per_branch)


def _seed000_record(p: Any, r: Any, reps: list[Any], branch_sets: dict[str, list[str]],
                    fp: Any = None) -> dict[str, Any]:
    from memspec.invariants.formal import declared, encoded

    dec, enc = declared(getattr(p, "declared_by", p.id)), encoded(p)  # G1 is on S15's machine
    mine = [x for x in reps if x.invariant == p.id]
    inv_n = sum(x.inv_samples for x in mine)
    inv_bad = [m for x in mine for m in x.inv_disagreements]
    trans: dict[str, dict[str, int]] = {}
    mismatches: list[str] = []
    for a in p.actions:
        for spec_action in a.spec:
            level, name = spec_action.split(":")
            counts = {b: 0 for b in branch_sets[a.name]}
            for x in mine:
                if x.action == a.name and x.spec_action == name and level in ("mechanism", "system"):
                    for b, n in x.branches.items():
                        counts[b] = counts.get(b, 0) + n
            trans[spec_action] = counts
    for x in mine:
        mismatches += [f"{x.action}: {m}" for m in x.mismatches]
    unsampled = [f"{act}/{b}" for act, bs in trans.items() for b, n in bs.items() if n == 0]
    exec_bad = sorted({v for x in mine for v in x.exec_violations})
    from memspec.invariants.formal import strength

    strong = strength(reps, p.id)
    # each action's hypotheses shown satisfiable, per outcome branch: by a Z3 model (its branch) or
    # by a concrete state of the agreement walk that satisfies them (every branch of an action with a
    # spec counterpart; one branch of an action without)
    witnessed: dict[str, set[str]] = {a: set(bs) for a, bs in r.hyp_branches.items()}
    for x in mine:
        witnessed.setdefault(x.action, set()).update(x.hyp_witnessed)
    unshown = []
    for a in p.actions:
        got = witnessed.get(a.name, set())
        if a.spec:
            unshown += [f"{a.name}/{b}" for b in branch_sets[a.name] if b not in got]
        elif not got:
            unshown.append(f"{a.name} (no model, no spec counterpart)")
    return {
        "id": p.id, "title": p.title,
        "proved": False,  # set below
        "status": r.status,
        "bounded": p.bounded or None,
        "assumed": list(r.assumed),
        "declared_actions": dec, "encoded_actions": enc,
        "invariant_agreement": {"samples": inv_n, "disagreements": len(inv_bad)},
        "transition_agreement": trans,
        "transition_mismatches": len(mismatches),
        "unguarded": {"guard": p.guard, "refuted": r.unguarded_refuted,
                      "named_invariant_violated": r.named_invariant_violated,
                      "violates": r.unguarded_violates or None, "trace": r.unguarded_trace},
        "executable_invariant": {"violations": len(exec_bad), "examples": exec_bad[:3]},
        # the executable invariant against the encoding on perturbed (unreachable) states near the walk's
        "invariant_strength": strong,
        "hypotheses": {"unknown_to_z3": list(r.hyp_unknown), "not_shown_satisfiable": unshown,
                       "contradictory": [c.name[4:] for c in r.checks if c.name.startswith("hyp:") and not c.ok]},
        "checks": [{"name": c.name, "ok": c.ok, "seconds": round(c.seconds, 3), "detail": c.detail} for c in r.checks],
        "_why": [],
        "_details": {"inv": inv_bad[:3], "mismatch": mismatches[:3], "unsampled": unsampled},
        **_coverage_fields(p, fp),
    }


def _coverage_fields(p: Any, fp: Any) -> dict[str, Any]:
    """A row's coverage derived from what the spec writes (:mod:`memspec.invariants.formal.coverage`):
    ``uncovered`` (reviewed gaps: proved over its encoded actions only), ``coverage`` (reads, required
    actions, gaps), and ``_coverage_problems`` (an unexplained gap, a stale reviewed line: the row fails)."""
    if fp is None:
        return {}
    from memspec.invariants.formal import all_proofs, row_coverage, static_problems, table_problems

    cov = row_coverage(p, fp)
    table = table_problems([q.id for q in all_proofs()]) + static_problems(fp)
    return {"uncovered": cov.uncovered, "coverage": cov.as_json(),
            "_coverage_problems": cov.problems + table,
            "_uncovered_fields": {g.action: g.fields for g in cov.gaps if g.known is not None}}


def _verdict(rec: dict[str, Any]) -> dict[str, Any]:
    why = []
    if rec["status"] != "proved":
        why.append(rec["status"] if rec["status"] != "conditional" else "conditional: " + "; ".join(rec["assumed"]))
    missing = sorted(set(rec["declared_actions"]) - set(rec["encoded_actions"]))
    if missing:
        why.append(f"not encoded: {', '.join(missing)}")
    ia = rec["invariant_agreement"]
    if ia["samples"] == 0:
        why.append("invariant agreement: 0 samples")
    elif ia["disagreements"]:
        why.append(f"invariant agreement: {ia['disagreements']}/{ia['samples']} disagree")
    if rec.get("transition_mismatches"):
        why.append(f"transition agreement: {rec['transition_mismatches']} disagreements")
    unsampled = [f"{a}/{b}" for a, bs in rec["transition_agreement"].items() for b, n in bs.items() if n == 0]
    if not rec["transition_agreement"]:
        why.append("transition agreement: no encoded action sampled")
    elif unsampled:
        why.append(f"branches with 0 samples: {', '.join(unsampled[:6])}" + (" ..." if len(unsampled) > 6 else ""))
    if not rec["unguarded"]["refuted"]:
        why.append("unguarded variant not refuted")
    elif not rec["unguarded"].get("named_invariant_violated", False):
        why.append(f"unguarded variant breaks only {rec['unguarded'].get('violates') or 'an auxiliary conjunct'}, "
                   "not the invariant the row is named for")
    ex = rec.get("executable_invariant") or {}
    if ex.get("violations"):
        why.append(f"executable invariant fails on {ex['violations']} visited state(s) of the agreement walk, "
                   f"e.g. {ex['examples'][0][:200]}")
    if rec.get("invariant_strength") is not None:
        from memspec.invariants.formal import strength_problems

        why += strength_problems(rec["invariant_strength"])
    hy = rec.get("hypotheses") or {}
    if hy.get("not_shown_satisfiable"):
        ns = hy["not_shown_satisfiable"]
        why.append(f"hypotheses not shown satisfiable (no model, no concrete witness): {', '.join(ns[:6])}"
                   + (" ..." if len(ns) > 6 else ""))
    if rec["bounded"]:
        why.append(f"bounded: {rec['bounded']}")
    why += rec.get("_coverage_problems", [])
    rec["_why"] = why
    rec["proved"] = not why
    return rec


def _unencoded_seed000(ids: list[str]) -> list[str]:
    """The requested ids of seed 000's catalog (:data:`memspec.spec.invariants.CATALOG`) that no Z3
    proof of :func:`memspec.invariants.formal.proofs_catalog.all_proofs` encodes (none while every catalog
    entry has its proof): each is a row that is not proved, never an id left out."""
    from memspec.invariants.formal import all_proofs
    from memspec.spec import invariants as seed000

    have = {p.id for p in all_proofs()}
    return [e.id for e in seed000.CATALOG if e.id not in have and (not ids or e.id in ids)]


def _unencoded_record(inv_id: str, fp: Any = None) -> dict[str, Any]:
    """The row of a catalog invariant with no Z3 proof: not proved, saying what is missing -- and, when the
    spec has its executable check, what a proof needs: the fields the check reads and the spec actions that
    write them (derived as every row's coverage is, :mod:`memspec.invariants.formal.coverage`), and the existing
    machine that already encodes most of those actions (a new row can share it, as S7 shares S4's)."""
    from memspec.invariants.formal import declared
    from memspec.spec import invariants as seed000

    title = next(e.title for e in seed000.CATALOG if e.id == inv_id)
    rec: dict[str, Any] = {
        "id": inv_id, "title": title, "proved": False, "status": "no proof",
        "bounded": None, "assumed": [], "declared_actions": declared(inv_id), "encoded_actions": [],
        "invariant_agreement": {"samples": 0, "disagreements": 0}, "transition_agreement": {},
        "transition_mismatches": 0,
        "unguarded": {"guard": None, "refuted": False, "named_invariant_violated": False, "trace": ""},
        "checks": [], "_details": {"inv": [], "mismatch": [], "unsampled": []},
    }
    rec = _verdict(rec)
    missing = [f"no Z3 proof: {inv_id} is in the catalog (memspec.spec.invariants) but "
               "memspec.invariants.formal.proofs_seed000 has no Proof for it (PROOFS)"]
    if not any(i.id == inv_id for i in seed000.ALL):
        missing.append(f"no executable check: memspec.spec.invariants.ALL has no Invariant {inv_id} (its "
                       "predicate over the spec state comes first: the proof's reads and actions derive from it)")
    else:
        need = _what_a_proof_needs(inv_id, fp)
        rec["needs"] = need
        if need["required"]:
            best, lacks = need["closest_machine"], need["closest_lacks"]
            missing.append(f"{inv_id} reads {', '.join(need['reads'][:8])}"
                           + (" ..." if len(need["reads"]) > 8 else "") + "; the spec actions that write them: "
                           + ", ".join(need["required"]))
            missing.append(f"closest machine: {best}'s encodes "
                           + (f"all of them: what is missing is a Proof on that machine (its fields and actions, as "
                              f"S7 shares S4's) with {inv_id}'s predicate in Z3 terms, and its NAMED entry"
                              if not lacks else
                              f"all but {', '.join(lacks)} (encode those, or a KNOWN_GAPS line with a reason)"))
        else:
            missing.append(f"{inv_id}'s check reads nothing any spec action writes in the derivation's walks "
                           f"({need['steps']} steps): no machine can say anything about it")
    rec["_why"][:0] = missing
    rec["proved"] = False
    return rec


def _what_a_proof_needs(inv_id: str, fp: Any = None) -> dict[str, Any]:
    """For an invariant with an executable check and no proof: its derived reads, the spec actions whose
    writes meet them (``level:action``), and the proof whose machine encodes the most of those."""
    from types import SimpleNamespace

    from memspec.invariants.formal import all_proofs, encoded, footprints, row_coverage

    fp = fp if fp is not None else footprints()
    cov = row_coverage(SimpleNamespace(id=inv_id, declared_by=inv_id, actions=[]), fp, known=())
    required = sorted(cov.required)
    best, lacks = None, required
    for q in all_proofs():
        enc = set(encoded(q))
        miss = [a for a in required if a not in enc]
        if best is None or len(miss) < len(lacks):
            best, lacks = q.id, miss
    return {"reads": list(cov.reads), "required": required, "closest_machine": best, "closest_lacks": lacks,
            "steps": fp.steps}


def _caching_records(heap: Any, agree: Any = None) -> list[dict[str, Any]]:
    """The C rows: the heap encoding of :mod:`memspec.invariants.formal.proofs_caching_heap`
    (one inductive invariant over an arbitrary well-formed heap, expandable segments included, so its
    checks are shared by every C row), each invariant's unguarded variant,
    encoded/declared from the spec's action table; the transition and
    invariant agreement of that encoding with spec/caching
    (:mod:`memspec.invariants.formal.proofs_caching_agree`, shared by the rows: one
    machine).  Verdicts by :func:`_verdict` (the same rules as the S rows)."""
    from memspec.invariants.formal import BOUNDED, UNGUARDED, declared, machines
    from memspec.spec.caching import INVARIANTS

    known = {f"{lvl}:{a.name}" for lvl, m in machines().items() for a in m.actions}
    out = []
    for inv in INVARIANTS:
        rec: dict[str, Any] = {
            "id": inv.id, "title": inv.title, "proved": False, "status": "not run",
            "bounded": BOUNDED.get(inv.id), "assumed": [], "declared_actions": declared(inv.id),
            "encoded_actions": [], "invariant_agreement": {"samples": 0, "disagreements": 0},
            "transition_agreement": {}, "transition_mismatches": 0,
            "unguarded": {"guard": None, "refuted": False, "named_invariant_violated": False, "trace": ""},
            "checks": [], "_details": {"inv": [], "mismatch": [], "unsampled": []},
        }
        src = heap
        if src is not None:
            bad = [c for c in src["checks"] if c[1] not in ("proved", "framed")]
            rec["status"] = "proved" if not bad else "FAILED"
            names = sorted({n for specs in src["actions"].values() for n in specs})
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ValueError(f"caching encoding names spec actions no machine has: {unknown}")
            rec["encoded_actions"] = names
            rec["bounded"] = src.get("bounded", {}).get(inv.id, rec["bounded"]) if "bounded" in src else rec["bounded"]
            rec["checks"] = [{"name": n, "ok": r in ("proved", "framed"), "seconds": round(t, 3), "detail": r}
                             for n, r, t in src["checks"]]
            if inv.id in src["refuted"]:
                ok, trace = src["refuted"][inv.id]
                guards = src.get("unguarded", UNGUARDED)
                # what the counterexample breaks, as its model evaluated it (proofs_caching_heap.refute tags the
                # last line)
                violates = ("named invariant" if "(named invariant)" in trace
                            else "step property" if "(step property)" in trace else None) if ok else None
                rec["unguarded"] = {"guard": guards[inv.id][2], "refuted": ok,
                                    "named_invariant_violated": violates is not None, "violates": violates,
                                    "trace": trace}
        ag = agree
        if ag is not None:
            samples, disagree = ag.inv.get(inv.id, [0, 0])
            rec["invariant_agreement"] = {"samples": samples, "disagreements": disagree}
            rec["transition_agreement"] = {a: dict(b) for a, b in ag.counts.items()}
            rec["transition_mismatches"] = len(ag.mismatches)
            rec["_details"] = {"inv": [x for x in ag.inv_examples if x.startswith(inv.id + " ")][:3],
                               "mismatch": ag.mismatches[:3], "unsampled": []}
        out.append(_verdict(rec))
    return out


def default_jobs() -> int:
    """Worker processes for ``--jobs``: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _task(task: tuple[Any, ...]) -> tuple[Any, float]:
    """One independent proof group (runs in a worker process with ``--jobs`` > 1):
    its result (picklable) and the CPU seconds it took in its process."""
    t0 = time.process_time()
    kind = task[0]
    out: Any
    if kind == "S-agreement":
        out = _agreement(*task[1:])
    elif kind == "S":
        from memspec.invariants.formal import all_proofs, branches, prove

        p = next(x for x in all_proofs() if x.id == task[1])
        out = (prove(p), {a.name: branches(p, a) for a in p.actions})
    elif kind == "P1":
        from memspec.invariants.formal import progress_record

        out = progress_record(*task[1:])
    elif kind == "synthesis":
        from memspec.invariants.formal import run_caching

        out = run_caching(depth=task[1])
    elif kind == "heap":
        from memspec.invariants.formal import heap_unit

        out = heap_unit(task[1])
    elif kind == "agreement":
        from memspec.invariants.formal import agreement_part

        # a batch of parts in one process: the compiled encodings (per action and heap size) are shared
        out = [agreement_part(part, seed=task[1], walks_per_config=task[3]) for part in task[2]]
    else:
        raise ValueError(f"unknown proof group {task!r}")
    return out, time.process_time() - t0


def _run_tasks(tasks: list[tuple[Any, ...]], jobs: int, progress: bool = False) -> list[tuple[Any, float]]:
    """Every task's result, in the order of ``tasks`` whatever process ran it.

    Each task runs in a process of its own, forked from this one, ``jobs`` at
    a time (the costliest first, so that no worker is left with a long one at
    the end).  A fresh process per task is what makes the answers
    reproducible: Z3's search depends on every term its process built before,
    and in one shared process a heap goal that takes 8 s CPU alone
    (``malloc:fit`` step C4) ran for over 500 s after the other groups had
    built theirs.  Where ``fork`` is not available, ``jobs`` 1 runs the tasks
    here one after the other (:mod:`memspec.invariants.forked` says why not a
    ``multiprocessing.Pool``).  With ``progress``, one line per finished task on
    stderr (``[k/N] name: CPU s``)."""
    import sys

    from memspec.invariants.forked import forkable, in_fresh_processes

    t_start = time.perf_counter()
    finished = [0]

    def _done(i: int, cpu: float) -> None:
        finished[0] += 1
        if progress:
            print(f"prove: [{finished[0]}/{len(tasks)}] {task_name(tasks[i])}: {cpu:.1f} s CPU "
                  f"({time.perf_counter() - t_start:.0f} s wall so far)", file=sys.stderr, flush=True)

    if not forkable():
        if jobs > 1:
            print("prove: this platform cannot fork: the proof groups run one after the other in this process",
                  file=sys.stderr)
        out = []
        for i, t in enumerate(tasks):
            out.append(_task(t))
            _done(i, out[-1][1])
        return out
    order = sorted(range(len(tasks)), key=lambda i: task_cost(tasks[i]), reverse=True)
    got = in_fresh_processes(_task, [tasks[i] for i in order], jobs,
                             on_done=lambda k, res: _done(order[k], res[1]))
    results = dict(zip(order, got))
    return [results[i] for i in range(len(tasks))]


#: the caching agreement's parts run in this many processes (fewer: less compiling, a longer task)
AGREEMENT_BATCHES = 1

#: rough CPU seconds of each kind of proof group (only the submission order depends on it)
_COST = {"S-agreement": 50, "agreement": 70, "synthesis": 20, "heap": 2, "P1": 5, "S": 1}


def task_cost(task: tuple[Any, ...]) -> float:
    """A static estimate of a task's CPU seconds (the pool runs the costliest first, so that no
    worker is left with a long one at the end); a heap unit's from :data:`HEAP_UNIT_COST`."""
    if task[0] == "heap":
        from memspec.invariants.formal import unit_cost

        return unit_cost(task[1])
    return _COST.get(task[0], 0)


def run(ids: list[str], samples: int, inv_samples: int, seed: int, caching_on: bool, depth: int,
        quiet: bool = False, per_branch: int | None = None,
        jobs: int = 1, walks: int | None = None) -> tuple[list[dict[str, Any]], Any, float]:
    """Every requested row.  The proof groups (the S rows' agreement walk, each
    S proof, P1, the caching synthesis, each unit of the heap induction, the
    caching agreement) are independent: with ``jobs`` > 1 they run in a
    process pool, and the rows are assembled in the same order from the same
    results, so the rows do not depend on ``jobs`` (only the seconds do).  A
    Z3 witness (the synthesized fragmentation trace, an unguarded variant's
    counterexample) is a model, and which model Z3 returns depends on the terms
    its process built before, so those texts may differ between runs with
    different ``jobs``; the verdicts and depths do not.  ``walks``: random walks of the caching
    agreement per configuration (each a fresh seed; the directed scripts and sweeps always run;
    None: :data:`memspec.invariants.formal.proofs_caching_agree.WALKS_PER_CONFIG`)."""
    from memspec.invariants.formal import all_proofs

    t_all = time.perf_counter()
    CPU.clear()
    proofs = [p for p in all_proofs() if not ids or p.id in ids]
    cids = [i for i in ids if i.startswith("C")]
    want_p1 = not ids or "P1" in ids
    want_syn = caching_on and (not ids or bool(cids))
    want_heap = caching_on and (not ids or bool(cids))
    heap_units: list[tuple[str, ...]] = []
    tasks: list[tuple[Any, ...]] = []
    if samples and proofs:  # only the S rows read it
        tasks.append(("S-agreement", samples, inv_samples, seed, per_branch))
    tasks += [("S", p.id) for p in proofs]
    if want_p1:  # progress (liveness as safety), on S15's machine and by a walk of the spec
        tasks.append(("P1", max(samples // 2, 50), seed))
    if want_syn:
        tasks.append(("synthesis", depth))
    if want_heap:
        from memspec.invariants.formal import heap_units as units_of

        heap_units = units_of(ids=cids or None)
        from memspec.invariants.formal import agreement_parts

        tasks += [("heap", u) for u in heap_units]
        # the caching agreement's parts in one process (a batch): they share the encodings compiled per
        # action and heap size (the 22 parts of two walks per configuration: 66 s CPU in one process, 85 s
        # in two, 230 s in a process each); each part's figures do not depend on the batch it ran in
        from memspec.invariants.formal import WALKS_PER_CONFIG

        walks = WALKS_PER_CONFIG if walks is None else walks
        parts = agreement_parts(walks_per_config=walks)
        nb = AGREEMENT_BATCHES
        tasks += [("agreement", seed, tuple(parts[k::nb]), walks) for k in range(nb)]
    results = dict(zip(range(len(tasks)), _run_tasks(tasks, jobs, progress=not quiet)))
    by_kind: dict[str, list[tuple[Any, float]]] = {}
    GROUP_CPU.clear()
    TASK_CPU[:] = sorted(((task_name(t), results[i][1]) for i, t in enumerate(tasks)), key=lambda x: -x[1])
    for i, t in enumerate(tasks):
        by_kind.setdefault(t[0], []).append(results[i])
        g = GROUP_CPU.setdefault(t[0], {"tasks": 0, "cpu": 0.0, "largest": 0.0})
        g["tasks"] += 1
        g["cpu"] += results[i][1]
        g["largest"] = max(g["largest"], results[i][1])

    reps = by_kind["S-agreement"][0][0] if "S-agreement" in by_kind else []
    fp = None
    if proofs:
        # the S rows' coverage, derived from what the spec writes: seeded spec-only walks (no Z3 term), here
        # after the groups ran (so no group's process inherits them); once per process
        from memspec.invariants.formal import footprints

        t0 = time.process_time()
        fp = footprints()
        cpu = time.process_time() - t0
        GROUP_CPU["coverage"] = {"tasks": 1, "cpu": cpu, "largest": cpu}
    COVERAGE.clear()
    if fp is not None:   # what the derivation's walks could not show: visible, never silent
        COVERAGE.update(steps=fp.steps, unreached=fp.unreached)
    records = []
    for p, (res, _cpu) in zip(proofs, by_kind.get("S", [])):
        r, bsets = res
        records.append(_verdict(_seed000_record(p, r, reps, bsets, fp)))
    records += [_unencoded_record(i, fp) for i in _unencoded_seed000(ids)]
    if want_p1:
        records.append(by_kind["P1"][0][0])
    caching = None
    if want_syn:
        caching, CPU["synthesis"] = by_kind["synthesis"][0]
    heap = agree = None
    if want_heap:
        from memspec.invariants.formal import join_units

        heap = join_units([res for res, _cpu in by_kind["heap"]])
        CPU["heap induction + refutations"] = sum(cpu for _res, cpu in by_kind["heap"])
        from memspec.invariants.formal import merge_agreements

        batches = [res for res, _cpu in by_kind["agreement"]]   # batch k holds parts k, k + nb, ...
        agree = merge_agreements([batches[i % len(batches)][i // len(batches)]
                                  for i in range(sum(map(len, batches)))])
        CPU["agreement"] = sum(cpu for _res, cpu in by_kind["agreement"])
    if not ids or cids:
        records += [r for r in _caching_records(heap, agree) if not ids or r["id"] in ids]
    return records, caching, time.perf_counter() - t_all


def _print(records: list[dict[str, Any]], caching: Any, total: float, traces: bool) -> None:
    hdr = (f"{'id':<4} {'invariant':<24} {'verdict':<12} {'proof':<12} {'encoded':<8} {'inv agree':<11} "
           f"{'branches':<9} {'unguarded':<10}")
    print(hdr)
    print("-" * len(hdr))
    for rec in records:
        ta = rec["transition_agreement"]
        nb = sum(len(b) for b in ta.values())
        sampled = sum(1 for b in ta.values() for n in b.values() if n)
        dec = set(rec["declared_actions"])
        enc = len(dec & set(rec["encoded_actions"]))
        ia = rec["invariant_agreement"]
        partial = rec["proved"] and rec.get("uncovered")
        verdict = "PARTIAL" if partial else "PROVED" if rec["proved"] else "NOT PROVED"
        print(f"{rec['id']:<4} {rec['title'][:24]:<24} {verdict:<12} "
              f"{rec['status']:<12} {f'{enc}/{len(dec)}':<8} "
              f"{(str(ia['disagreements']) + '/' + str(ia['samples'])) if ia['samples'] else '-':<11} "
              f"{f'{sampled}/{nb}':<9} {'refuted' if rec['unguarded']['refuted'] else 'NO':<10}")
        if rec.get("uncovered"):
            fields = rec.get("_uncovered_fields", {})
            print(f"     {'PROVED' if rec['proved'] else 'checked'} over its encoded actions; NOT COVERED (reviewed "
                  "gaps, invariants/formal/coverage.py KNOWN_GAPS): "
                  + ", ".join(f"{a} ({', '.join(fields.get(a, []))})" for a in rec["uncovered"]))
        for w in rec["_why"]:
            print(f"     {w}")
        for d in rec.get("_details", {}).get("inv", [])[:1]:
            print(f"     e.g. {d[:300]}")
        for d in rec.get("_details", {}).get("mismatch", [])[:1]:
            print(f"     e.g. {d[:300]}")
        for c in rec.get("checks", []):
            if not c["ok"]:
                print(f"     {c['name']}: {c['detail'][:300]}")
        if traces and rec["unguarded"].get("trace"):
            print(f"     without: {rec['unguarded']['guard']}")
            print("\n".join("   " + line for line in rec["unguarded"]["trace"].splitlines()))
    if caching is not None:
        print(f"\ncaching allocator (seed 003): fragmentation synthesis [{caching.seconds:.1f}s]")
        for syn, (rok, rtext) in zip(caching.synth, caching.replays):
            if syn.depth is None:
                print(f"  {syn.preset}: NO fragmentation OOM found up to depth {syn.trace}")
                continue
            print(f"  {syn.preset}: shortest fragmentation OOM: {syn.depth} op(s) then the failing malloc; "
                  f"replayed on the executable spec: {'confirmed' if rok else 'NOT CONFIRMED'}")
        for e in caching.expandable:
            print(f"  {e.preset} + expandable: <= {e.depth} ops, {e.states} states; page-level fragmentation OOM: "
                  + ("none" if e.page_level is None else "FOUND"))
        print("  Z3 policy kernels vs spec/caching: "
              + ("agree" if not caching.kernel_mismatches else f"{len(caching.kernel_mismatches)} DISAGREE"))
    if CPU:
        print("  caching CPU seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in CPU.items()))
    if COVERAGE:
        print(f"\ncoverage derived from {COVERAGE['steps']} spec-only steps; spec branches no walk reached "
              f"(what they write is in no required set): {', '.join(COVERAGE['unreached']) or 'none'}")
    n_ok = sum(1 for r in records if r["proved"])
    part = [r["id"] for r in records if r["proved"] and r.get("uncovered")]
    print(f"\n{n_ok - len(part)}/{len(records)} invariants fully proved"
          + (f"; {len(part)} more proved over their encoded actions only (PARTIAL: spec actions NOT COVERED, "
             f"reviewed gaps): {', '.join(part)}" if part else "")
          + (f"; {len(records) - n_ok} NOT proved" if n_ok < len(records) else "") + f"; total {total:.1f}s")


#: CPU seconds of each part of the caching checks in this run (for the report, never for a verdict)
CPU: dict[str, float] = {}
#: the coverage derivation of the last :func:`run`: its walk steps and the spec actions and branches
#: its walks never reached (their writes are not in any required set: an under-approximation, shown)
COVERAGE: dict[str, Any] = {}
#: per kind of proof group in this run: tasks, CPU seconds in all, the largest one's (for the report only)
GROUP_CPU: dict[str, dict[str, float]] = {}
#: every task of the last :func:`run` and its CPU seconds, costliest first
TASK_CPU: list[tuple[str, float]] = []


def task_name(task: tuple[Any, ...]) -> str:
    """A task as one readable name (``heap step unmap:cache core``)."""
    if task[0] == "agreement" and isinstance(task[2], tuple):   # a batch of caching-agreement parts
        return f"agreement ({len(task[2])} parts: " + ", ".join(" ".join(map(str, p)) for p in task[2][:3]) + ", ...)"
    parts = [task[0]] + [" ".join(map(str, x)) if isinstance(x, tuple) else str(x) for x in task[1:]]
    return " ".join(parts)


def _json(records: list[dict[str, Any]], caching: Any, total: float) -> dict[str, Any]:
    keys = ("proved", "bounded", "assumed", "declared_actions", "encoded_actions", "invariant_agreement",
            "transition_agreement", "unguarded")
    out: dict[str, Any] = {
        "total_seconds": round(total, 2),
        "ok": all(r["proved"] for r in records),
        "invariants": {r["id"]: {k: r[k] for k in keys} for r in records},
        "why_not_proved": {r["id"]: r["_why"] for r in records if not r["proved"]},
        "not_fully_proved": {r["id"]: r["uncovered"] for r in records if r["proved"] and r.get("uncovered")},
        "fully_proved": all(r["proved"] and not r.get("uncovered") for r in records),
    }
    if COVERAGE:
        out["coverage_walks"] = dict(COVERAGE)
    for r in records:
        out["invariants"][r["id"]]["unguarded"] = {k: r["unguarded"][k]
                                                   for k in ("guard", "refuted", "named_invariant_violated")}
        if r.get("invariant_strength") is not None:
            out["invariants"][r["id"]]["invariant_strength"] = r["invariant_strength"]
        if "coverage" in r:   # derived coverage: a row with uncovered spec actions is not a full proof
            out["invariants"][r["id"]]["uncovered"] = r["uncovered"]
            out["invariants"][r["id"]]["fully_proved"] = r["proved"] and not r["uncovered"]
            out["invariants"][r["id"]]["coverage"] = r["coverage"]
    if caching is not None:
        out["caching_cpu_seconds"] = {k: round(v, 2) for k, v in CPU.items()}
        out["caching"] = {
            "synthesis": [{"preset": x.preset, "depth": x.depth, "trace": x.trace, "replay_confirmed": rr[0]}
                          for x, rr in zip(caching.synth, caching.replays)],
            "kernel_mismatches": caching.kernel_mismatches,
        }
    return out


def catalog_ids() -> tuple[str, ...]:
    """Every id of the spec's invariant catalogs, in catalog order: seed 000's
    (:data:`memspec.spec.invariants.CATALOG`) then the caching allocator's
    (:data:`memspec.spec.caching.invariants.CATALOG`).  Read at each call, never
    restated here: an invariant added to a catalog is a row of ``memspec prove``."""
    from memspec.spec import invariants as seed000
    from memspec.spec.caching import invariants as caching

    return tuple(e.id for e in seed000.CATALOG) + tuple(e.id for e in caching.CATALOG)


#: rows of ``memspec prove`` beyond the catalogs: G1 (configuration generations, a proof of
#: :mod:`memspec.invariants.formal.proofs_seed000` on S15's machine, in ``all_proofs()``) and P1 (progress,
#: :mod:`memspec.invariants.formal.proofs_progress`, a row of its own with no Z3 ``Proof`` object)
EXTRA_ROWS = ("G1", "P1")


def acceptance_ids() -> tuple[str, ...]:
    """The rows issue 13's acceptance names: every catalog invariant (:func:`catalog_ids`)."""
    return catalog_ids()


def __getattr__(name: str) -> Any:
    # ``ACCEPTANCE_IDS``, the former constant, read from the catalogs when asked
    if name == "ACCEPTANCE_IDS":
        return acceptance_ids()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_acceptance(data: dict[str, Any], ids: tuple[str, ...] | None = None) -> list[str]:
    """Every acceptance field of every row of a ``--json`` file (issue 13): ``proved`` true, ``bounded``
    null, ``assumed`` empty, ``encoded_actions`` covering ``declared_actions``, invariant agreement
    sampled with 0 disagreements, every branch of every encoded action sampled, the unguarded variant
    refuted on the invariant it names, and no spec action left ``uncovered`` (derived coverage, issue 33:
    a row proved over its encoded actions only is not a full proof).  One line per failing field (empty: all hold); a row missing
    from the file fails.  ``ids``: the rows to check (default :func:`acceptance_ids`)."""
    if ids is None:
        ids = acceptance_ids()
    rows = data.get("invariants") if isinstance(data, dict) else None
    if not isinstance(rows, dict):
        return ["not a `memspec prove --json` file: no 'invariants' object"]
    bad: list[str] = []
    for i in ids:
        r = rows.get(i)
        if not isinstance(r, dict):
            bad.append(f"{i}: missing")
            continue
        if r.get("proved") is not True:
            bad.append(f"{i}: proved is {r.get('proved')!r}")
        if r.get("bounded") is not None:
            bad.append(f"{i}: bounded: {r.get('bounded')}")
        if r.get("assumed") != []:
            bad.append(f"{i}: assumed {r.get('assumed')!r}")
        dec, enc = r.get("declared_actions"), r.get("encoded_actions")
        if not isinstance(dec, list) or not isinstance(enc, list) or not dec:
            bad.append(f"{i}: declared/encoded actions missing (declared {dec!r})")
        elif set(dec) - set(enc):
            bad.append(f"{i}: not encoded: {sorted(set(dec) - set(enc))}")
        ia = r.get("invariant_agreement") or {}
        if not isinstance(ia.get("samples"), int) or ia["samples"] <= 0:
            bad.append(f"{i}: invariant agreement has {ia.get('samples')!r} samples")
        if ia.get("disagreements") != 0:
            bad.append(f"{i}: invariant agreement disagreements {ia.get('disagreements')!r}")
        ta = r.get("transition_agreement")
        if not isinstance(ta, dict) or not ta:
            bad.append(f"{i}: no transition agreement")
        else:
            zero = [f"{a}/{b}" for a, bs in ta.items() for b, n in (bs or {}).items() if not n]
            empty = [a for a, bs in ta.items() if not bs]
            if zero or empty:
                bad.append(f"{i}: branches with 0 samples: {', '.join(zero + [a + '/(none)' for a in empty])}")
        if r.get("uncovered"):   # derived coverage (issue 33): proved over its encoded actions only
            bad.append(f"{i}: not covered: {sorted(r['uncovered'])}")
        ug = r.get("unguarded") or {}
        if ug.get("refuted") is not True or ug.get("named_invariant_violated") is not True:
            bad.append(f"{i}: unguarded variant ({ug.get('guard')!r}) refuted {ug.get('refuted')!r}, "
                       f"named invariant violated {ug.get('named_invariant_violated')!r}")
    return bad


def _check_acceptance_file(path: str) -> int:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as e:
        print(f"memspec prove --check-acceptance: cannot read {path}: {e}")
        return 2
    ids = acceptance_ids()
    bad = check_acceptance(data, ids)
    for line in bad:
        print(f"FAIL {line}")
    failing = sorted({line.split(":")[0] for line in bad}, key=lambda x: (x[0], int(x[1:]) if x[1:].isdigit() else 0))
    print(f"acceptance: {len(ids) - len(failing)}/{len(ids)} rows hold every field"
          + (f"; failing: {', '.join(failing)}" if failing else ""))
    return 1 if bad else 0


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its finished workers."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def known_ids() -> list[str]:
    """The ids ``memspec prove`` accepts, in report order: the catalogs' (:func:`catalog_ids`; one
    with no proof is a row that fails, naming what is missing), every Z3 proof's and :data:`EXTRA_ROWS`."""
    from memspec.invariants.formal import all_proofs

    out = list(catalog_ids())
    for i in [p.id for p in all_proofs()] + list(EXTRA_ROWS):
        if i not in out:
            out.append(i)
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="memspec prove", description=__doc__.split("\n\n")[0])
    ap.add_argument("ids", nargs="*", help="invariant ids: those of the spec's catalogs (seed 000's S rows, the "
                                           "caching allocator's C rows), G1 and P1 (default: all)")
    ap.add_argument("--samples", type=int, default=400,
                    help="transition-agreement samples per adapter, at most (default 400)")
    ap.add_argument("--per-branch", type=int, default=PER_BRANCH,
                    help=f"an adapter has enough once each outcome branch of its encoded action has this many "
                         f"agreeing samples (default {PER_BRANCH}; 0: always --samples)")
    ap.add_argument("--inv-samples", type=int, default=100,
                    help="invariant-agreement states per adapter (default 100)")
    ap.add_argument("--traces", action="store_true", help="print each unguarded variant's counterexample trace")
    ap.add_argument("--json", metavar="FILE", type=out_file, help="write the per-invariant results as JSON")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-caching", action="store_true", help="skip the caching allocator's Z3 checks")
    ap.add_argument("--depth", type=int, default=8, help="bound of the fragmentation searches (default 8)")
    ap.add_argument("--jobs", type=jobs_type, default=None,
                    help="worker processes for the independent proof groups (default: the CPUs this process "
                         "may run on; 1: all in this process); the rows are the same for any value")
    ap.add_argument("--walks", type=int, default=None,
                    help="random walks per configuration in the caching allocator's agreement (default 1: with "
                         "the directed scripts, every branch is sampled; more: more states, ~25 s CPU each)")
    ap.add_argument("--self-test", action="store_true",
                    help="plant breaks in encodings, spec actions and kernels; print the kill table (each break "
                         "in a process of its own, --jobs at a time)")
    ap.add_argument("--check-acceptance", metavar="FILE",
                    help="check every acceptance field of every catalog row (S and C) of a --json FILE "
                         "(exit 1 naming each failing field); runs no proof")
    ns = ap.parse_args(argv)
    if ns.jobs is not None and ns.jobs < 1:
        ap.error(f"--jobs must be at least 1 (got {ns.jobs})")
    if ns.walks is not None and ns.walks < 0:
        ap.error(f"--walks must be at least 0 (got {ns.walks})")

    if ns.check_acceptance:
        return _check_acceptance_file(ns.check_acceptance)

    if ns.self_test:
        from memspec.invariants.formal import self_test

        return self_test(jobs=ns.jobs if ns.jobs is not None else default_jobs())

    known = known_ids()
    unknown = [i for i in ns.ids if i not in known]
    if unknown:
        print(f"memspec prove: unknown invariant id(s) {unknown}; known: {', '.join(known)}")
        return 2
    records, caching, total = run(ns.ids, ns.samples, ns.inv_samples, ns.seed, not ns.no_caching, ns.depth,
                                  per_branch=ns.per_branch or None,
                                  jobs=ns.jobs if ns.jobs is not None else default_jobs(), walks=ns.walks)
    _print(records, caching, total, ns.traces)
    cpu = _cpu_seconds()
    jobs = ns.jobs if ns.jobs is not None else default_jobs()
    print(f"CPU {cpu:.1f}s in all processes; wall {total:.1f}s; --jobs {jobs}; by group (tasks, CPU s, largest): "
          + ", ".join(f"{k} {int(g['tasks'])} {g['cpu']:.1f} {g['largest']:.1f}" for k, g in GROUP_CPU.items()))
    print("costliest tasks (CPU s): " + ", ".join(f"{n} {c:.1f}" for n, c in TASK_CPU[:8]))
    if ns.json:
        out = _json(records, caching, total)
        out["cpu_seconds"], out["jobs"] = round(cpu, 2), jobs
        out["group_cpu_seconds"] = {k: {"tasks": int(g["tasks"]), "cpu": round(g["cpu"], 2),
                                        "largest": round(g["largest"], 2)} for k, g in GROUP_CPU.items()}
        out["task_cpu_seconds"] = {n: round(c, 2) for n, c in TASK_CPU}
        from memspec.commands._output import write_output
        from memspec.invariants.report import write_file

        if not write_output("memspec prove", "--json", ns.json,
                            lambda: write_file(ns.json, json.dumps(out, indent=2, default=str))):
            return 2
    return 0 if all(r["proved"] for r in records) else 1
