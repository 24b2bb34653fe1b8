"""A conformance run as one self-contained HTML file.

``memspec conform --html report.html`` (and ``memspec fuzz --html``) write it;
open it in any browser (``xdg-open report.html``, or drag it into a window):
no network, no external scripts, fonts or images -- CSS, SVG and a few lines
of script for keyboard step navigation are inline.

Two steps, so the report can be rebuilt, diffed or archived as data:

1. :func:`build_record` turns the runner's results into a **run record**, a
   JSON-able dict (``json.dumps`` works on it as it is).  Each failure's
   shrunk counterexample is replayed on a fresh target and spec in a
   supervised child (the target's code never runs in the reporting
   process), and the spec's state after every step comes back as a picture
   model (:func:`memspec.invariants.pictures.state_model`): data, drawn
   defensively (a model that cannot be drawn is said so).
2. :func:`render` is a pure function from a run record to the HTML text.

The run record (``schema: "memspec.run/1"``)::

    {"schema": "memspec.run/1", "tool": "memspec conform", "created": ISO-8601 UTC,
     "parameters": {name: value, ...},            # profile, examples, steps, seed, ...
     "targets": [{
        "target": str, "ok": bool, "levels": [str, ...],
        "invariants": [{"id", "title", "quote", "status", "cells": {level: status}, "detail",
                        "coverage": {level: {"actions": {name: steps}, "branches": {"action: outcome": n},
                                             "observations": [name, ...], "steps": n} | None}}],
        "runs": [{"level", "steps", "examples", "seconds", "steps_per_second",
                  "actions": {name: n}, "outcomes": {"action: outcome": n}, "capabilities": {...},
                  "errors": [str], "failures": [FAILURE, ...]}]}]}

    FAILURE = {"invariant", "title", "quote", "cause", "reason", "steps_to_detection", "shrunk_length",
               "repro", "flaky", "replay": {"reproduced": bool, "note": str},
               "steps": [{"index", "action", "call", "args": {name: repr}, "permitted", "answer",
                          "bound": [ref, ...], "failing": bool, "picture": MODEL | None,
                          "marks": {"refs", "addresses", "invariant", "label"} | None}]}

``coverage`` is what the run recorded for the invariant: the steps of each
action that declares it, the outcome branches those actions took, and the
observations blamed on it (compared after every step).  A record without it
(``None``) is shown as *not recorded*.  Every string that came from a target
(error messages, reprs of its objects) is escaped on the way into the HTML
and the SVG: a message holding markup is shown as text.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
from typing import TYPE_CHECKING, Any, Iterable

from memspec.invariants import pictures as P
from memspec.invariants import text as T

if TYPE_CHECKING:
    from memspec.invariants.results import PlanView

SCHEMA = "memspec.run/1"

def esc(s: Any) -> str:
    """Text for the HTML: made safe (bounded, encodable, the characters XML
    forbids -- controls -- shown escaped, e.g. ``\\x1b``) and HTML-escaped."""
    return P.esc(T.xml(s, 4 * T.MAX_CHARS))


# ==========================================================================
# Run record
# ==========================================================================

def _r(v: Any, limit: int = 160) -> str:
    s = T.safe_repr(v, max(limit, 64))   # never raises, bounded, encodable (a hostile __repr__ is said so)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _call(action: str, args: dict) -> str:
    return f"{action}({', '.join(f'{k}={_r(v, 60)}' for k, v in args.items())})"


def machine_of(plan: "PlanView") -> Any:
    """The spec machine of a plan: an engine plan carries it; the supervisor's
    view of a plan run in a child names it (the level's, or ``machine_ref``).
    Spec code only: nothing of the target runs here."""
    from memspec.invariants import planning
    from memspec.invariants.plan import Plan

    if isinstance(plan, Plan):
        return plan.machine
    ref = plan.machine_ref
    try:
        return planning.load_machine(ref) if ref else planning.machine_for(plan.level)
    except Exception:  # noqa: BLE001 - no machine: no quotes, coverage not recorded
        return None


def _action_names(plan: "PlanView") -> set:
    return set(plan.action_names)


def coverage_of(plan: "PlanView", inv_id: str, machine: Any = None) -> dict | None:
    """What exercised ``inv_id`` in a run of ``plan``: steps per declaring
    action (of those the run could draw), the outcome branches they took, the
    observations blamed on it.  Prefers a ``coverage`` mapping the plan's
    stats carry when the engine records one; ``None`` when nothing was recorded."""
    if plan is None:
        return None
    st = plan.stats
    own = getattr(st, "coverage", None)
    if isinstance(own, dict) and inv_id in own:
        c = own[inv_id]
        return dict(c) if isinstance(c, dict) else {"recorded": _r(c)}
    machine = machine if machine is not None else machine_of(plan)
    if machine is None:
        return None
    drawn = _action_names(plan)
    actions = [a.name for a in machine.actions if inv_id in getattr(a, "invariants", ()) and a.name in drawn]
    obs = [o.name for o in getattr(machine, "observations", []) if getattr(o, "blame", None) == inv_id]
    names = set(actions)
    branches = {f"{a}: {o}": int(n) for (a, o), n in sorted(st.outcomes.items()) if a in names}
    return {"actions": {a: int(st.actions.get(a, 0)) for a in actions}, "branches": branches,
            "observations": obs, "steps": int(st.steps)}


def _outcomes_of(action: Any, state: Any, args: dict) -> str:
    """The spec's permitted outcomes for the step, asked of a copy of the
    state (``step`` only describes; ``then`` is what changes a state)."""
    try:
        return action.step(copy.deepcopy(state), **args).describe()
    except Exception as e:  # noqa: BLE001
        return f"(the spec could not describe its outcomes: {T.exc_text(e)})"


def _named(action: Any, args: dict, known: set) -> list:
    """The references a call names: arguments drawn from a domain of
    references (one with an availability rule: there is nothing to pick
    before a step binds one -- sizes and flags are always available) whose
    value a step of the replay bound."""
    out = []
    for k, v in args.items():
        d = action.params.get(k)
        field = getattr(type(d), "__dataclass_fields__", {}).get("available")
        default = getattr(field, "default", None)
        if type(v) is int and v in known and d is not None and getattr(d, "available", default) is not default:
            out.append(v)
    return out


def _answer(run: Any, ts: Any) -> str:
    """The implementation's answer: the branch it took (or what it did
    instead), and the objects it returned (their reprs: target text)."""
    refs = getattr(getattr(run, "sut", None), "refs", None) or {}
    bound = [f"#{b} = {_r(refs[b], 120)}" for b in ts.bound if b in refs]
    return T.safe_str(ts.outcome) + (f"; {', '.join(bound)}" if bound else "")


def _step_row(i: int, ts: Any, **kw: Any) -> dict:
    row = {"index": i, "action": T.safe_str(ts.action, 200), "call": _call(T.safe_str(ts.action, 200), ts.args),
           "args": {k: _r(v) for k, v in ts.args.items()}, "permitted": "", "answer": T.safe_str(ts.outcome),
           "bound": list(ts.bound), "failing": False, "picture": None, "marks": None}
    row.update(kw)
    return row


def _replay_in_child(ch: Any, target: str, level: str, trace: list, expect: str, opts: dict) -> None:
    """The supervised child of :func:`replay_failure`: rebuild the plan, run
    the steps on a fresh target and spec, and send one message per step
    (plain data: strings, numbers, the picture model) and how it ended."""
    from memspec.invariants import engine as E
    from memspec.invariants.choosers import ReplayChooser
    from memspec.invariants.errors import TARGET_ERROR, Violation
    from memspec.invariants.guard import BUILD_SECONDS, CallGuard
    from memspec.invariants.planning import make_plan

    guard = CallGuard(opts["timeout"], "direct")
    guard.blame, guard.what = TARGET_ERROR, f"planning the replay of {target!r}"
    guard.limit = max(opts["timeout"], BUILD_SECONDS)
    plan, err = guard.call(make_plan, target, level, capacity=opts["capacity"], timeout=opts["timeout"],
                           machine=opts["machine"])
    guard.limit = None
    if err is not None:
        ch.send({"t": "end", "reproduced": False, "note": f"could not plan the replay: {T.exc_text(err)}"})
        return
    run = E.Run(plan, guard)
    known: set = set()
    try:
        for i, ts in enumerate(trace, 1):
            action = plan.machine.action(ts.action)
            args = dict(ts.args)
            if action.params and not args:   # arguments that were not literals: drawn again from the choices
                args = action.draw_args(run.state, ReplayChooser(ts.choices))
            row = {"index": i, "action": ts.action, "call": _call(ts.action, args),
                   "args": {k: _r(v) for k, v in args.items()}, "permitted": _outcomes_of(action, run.state, args),
                   "answer": "", "bound": [], "failing": False, "picture": None, "marks": None}
            try:
                done = run.apply(action, args, ts.choices)
            except Violation as v:
                last = run.trace[-1] if run.trace else None
                reason = T.safe_str(v.reason)
                row.update(answer=_answer(run, last) if last is not None else "",
                           bound=list(last.bound) if last is not None else [], failing=True,
                           picture=P.state_model(run.state),
                           marks=P.marks_from(reason, v.invariant, reason, refs=_named(action, args, known)))
                ch.send({"t": "step", "row": row})
                note = "reproduced" if v.invariant == expect else \
                    f"the replay failed differently: {T.safe_str(v.invariant, 200)} [{T.safe_str(v.cause, 200)}] {reason}"
                if i < len(trace):
                    note += f" (at step {i} of {len(trace)})"
                ch.send({"t": "end", "reproduced": v.invariant == expect, "note": note})
                return
            row.update(answer=_answer(run, done), bound=list(done.bound), picture=P.state_model(run.state))
            known.update(done.bound)
            ch.send({"t": "step", "row": row})
        try:
            run.teardown()
        except Violation as v:
            reason = T.safe_str(v.reason)
            ch.send({"t": "end", "reproduced": v.invariant == expect, "failing_last": True,
                     "marks": P.marks_from(reason, v.invariant, reason),
                     "note": f"reproduced by the end-of-run check: {reason}"})
            return
        ch.send({"t": "end", "reproduced": False,
                 "note": "did not reproduce: every step of the replay passed (a nondeterministic target?)"})
    finally:
        run.close()


def replay_failure(plan: "PlanView", failure: Any, *, target: str | None = None) -> tuple[list[dict], dict]:
    """Replay ``failure.trace`` on a fresh target and spec -- in a supervised
    child, as the conformance run itself: the target's code never runs in
    this process -- and record, per step, the call, the permitted outcomes,
    the implementation's answer and a picture model of the spec's state after
    it.  Never raises: a replay that does not reproduce, hangs or crashes is
    said so in the second value, and the steps it did not reach keep what the
    run recorded."""
    from memspec.invariants.guard import supervise

    trace = list(failure.trace)
    info: dict = {"reproduced": False, "note": ""}
    rows: list[dict] = []
    end_msg: dict = {}
    target = target or plan.target
    opts = {"timeout": float(plan.timeout or 5.0), "capacity": plan.factory_kwargs.get("capacity"),
            "machine": plan.machine_ref}

    def on_message(m: dict) -> None:
        if m.get("t") == "step" and isinstance(m.get("row"), dict):
            rows.append(m["row"])
        elif m.get("t") == "end":
            end_msg.update(m)

    try:
        end = supervise(lambda ch: _replay_in_child(ch, target, plan.level, trace, failure.invariant, opts),
                        timeout=opts["timeout"], on_message=on_message)
    except Exception as e:  # noqa: BLE001 - a report never fails on a replay
        end, end_msg["note"] = None, f"the replay could not start: {T.exc_text(e)}"
    steps = []
    for i, ts in enumerate(trace, 1):
        got = rows[i - 1] if i <= len(rows) else None
        if isinstance(got, dict):
            row = _step_row(i, ts)
            for k in ("call", "args", "permitted", "answer", "bound", "failing", "picture", "marks"):
                if k in got:   # a child's message: plain data, its strings made safe once here
                    row[k] = T.clean(got[k]) if k in ("call", "args", "permitted", "answer") else got[k]
            steps.append(row)
        else:
            steps.append(_step_row(i, ts))
    info["reproduced"] = bool(end_msg.get("reproduced"))
    info["note"] = T.safe_str(end_msg.get("note") or "")
    death = getattr(end, "death", None) if end is not None else None
    if death:
        info["note"] = (info["note"] + "; " if info["note"] else "") + f"the replay ended: {death}"
        if len(rows) == len(trace) - 1 and failure.cause in ("hang", "crash") and \
                bool(getattr(end, "hang", False)) == (failure.cause == "hang"):
            # the last call hung (or killed the process) again: the spec's state is the previous step's
            info["reproduced"] = True
            info["note"] = f"reproduced: {death}"
            if steps and len(steps) >= 2 and steps[-1].get("picture") is None:
                steps[-1]["picture"] = steps[-2].get("picture")
                steps[-1]["answer"] = "hangs" if failure.cause == "hang" else "kills the process"
    if end_msg.get("failing_last") and steps:
        steps[-1]["failing"] = True
        steps[-1]["marks"] = end_msg.get("marks")
    if steps and not any(s.get("failing") for s in steps):
        steps[-1]["failing"] = True
        reason = T.safe_str(failure.reason)
        steps[-1]["marks"] = P.marks_from(reason, failure.invariant, reason)
    return steps, info


def _unreplayed(trace: list, failure: Any) -> list[dict]:
    out = [_step_row(i, ts) for i, ts in enumerate(trace, 1)]
    if out:
        out[-1]["failing"] = True
        reason = T.safe_str(failure.reason)
        out[-1]["marks"] = P.marks_from(reason, failure.invariant, reason)
    return out


def build_record(all_results: dict[str, list[Any]], parameters: dict | None = None, *,
                 tool: str = "memspec conform", replay: bool = True) -> dict:
    """The run record of ``{target: [PlanResult, ...]}`` (see the module docstring)."""
    from memspec.invariants.report import merged_rows

    targets = []
    for target, results in all_results.items():
        results = list(results)
        levels, rows = merged_rows(results)
        quotes: dict[str, str] = {}
        titles: dict[str, str] = {}
        machines = {}
        for r in results:
            if r.plan is not None:
                m = machines[r.level] = machine_of(r.plan)
                for inv in getattr(m, "invariants", None) or []:
                    quotes.setdefault(inv.id, inv.quote)
                    titles.setdefault(inv.id, inv.title)
        invs = []
        for row in rows:
            cov = {r.level: coverage_of(r.plan, row["id"], machines.get(r.level))
                   for r in results if r.level in row["cells"]}
            invs.append({"id": row["id"], "title": row["title"], "quote": quotes.get(row["id"], ""),
                         "status": row["status"], "cells": dict(row["cells"]), "detail": row["detail"],  # made safe by merged_rows
                         "coverage": cov})
        runs = []
        for r in results:
            st = r.stats
            fails = []
            for f in r.failures:
                if replay and r.plan is not None:
                    steps, rp = replay_failure(r.plan, f)
                else:
                    steps, rp = _unreplayed(list(f.trace), f), {"reproduced": False, "note": "not replayed"}
                fails.append({"invariant": T.safe_str(f.invariant), "title": titles.get(f.invariant, ""),
                              "quote": quotes.get(f.invariant, ""), "cause": T.safe_str(f.cause),
                              "reason": T.safe_str(f.reason),
                              "steps_to_detection": f.steps_to_detection, "shrunk_length": f.shrunk_length,
                              "repro": None if f.repro is None else T.safe_str(f.repro), "flaky": bool(f.flaky),
                              "replay": rp, "steps": steps})
            runs.append({"level": r.level, "steps": st.steps, "examples": st.examples,
                         "seconds": round(st.seconds, 3), "steps_per_second": round(st.rate(), 1),
                         "actions": dict(st.actions),
                         "outcomes": {f"{a}: {o}": n for (a, o), n in sorted(st.outcomes.items())},
                         "capabilities": dict(r.plan.capabilities) if r.plan is not None else {},
                         "errors": [T.safe_str(e) for e in r.errors], "failures": fails})
        targets.append({"target": T.safe_str(target), "ok": all(r.ok for r in results), "levels": levels,
                        "invariants": invs, "runs": runs})
    return {"schema": SCHEMA, "tool": tool,
            "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "parameters": _effective(parameters or {}), "targets": targets}


def _effective(parameters: dict) -> dict:
    """The parameters as given, the profile's figures where none was given,
    and the versions that ran."""
    out = dict(parameters)
    prof = out.get("profile")
    if isinstance(prof, str) and (out.get("examples") is None or out.get("steps") is None):
        try:
            from memspec.invariants.runner import hypothesis_settings

            st = hypothesis_settings(prof)
            if out.get("examples") is None:
                out["examples"] = f"{st.max_examples} (profile {prof})"
            if out.get("steps") is None:
                out["steps"] = f"{st.stateful_step_count} (profile {prof})"
        except Exception:  # noqa: BLE001 - an unknown profile is shown as given
            pass
    try:
        from importlib.metadata import version

        out.setdefault("memspec version", version("memspec"))
        out.setdefault("hypothesis version", version("hypothesis"))
    except Exception:  # noqa: BLE001
        pass
    return out


def write_html(path: str, all_results: dict[str, list[Any]], parameters: dict | None = None, *,
               tool: str = "memspec conform", record_path: str | None = None) -> dict:
    """Build the record, write the report to ``path`` (and the record as JSON to ``record_path``)."""
    from memspec.invariants.report import write_file

    record = build_record(all_results, parameters, tool=tool)
    write_file(path, render(record))
    if record_path:
        write_file(record_path, json.dumps(record, indent=1, default=str))
    return record


# ==========================================================================
# Rendering
# ==========================================================================

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.2em 2em;color:#222;max-width:1200px}
h1{font-size:1.4em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ccc}h3{font-size:1.05em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:3px 6px;
vertical-align:top;text-align:left}th{background:#f3f3f3}
.PASS{color:#1a7f1a;font-weight:bold}.FAIL{color:#c00;font-weight:bold}.ERROR{color:#a60;font-weight:bold}
.NA{color:#777}.UNTESTED{color:#a60;font-weight:bold}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.88em}
pre{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;padding:4px 6px;margin:2px 0}
.cov{font-size:.82em;color:#333}.cov .none{color:#a60}.muted{color:#777}
blockquote{border-left:4px solid #d0021b;margin:.4em 0;padding:.2em .8em;background:#fff4f4;font-style:italic}
.failure{border:1px solid #e3b3b3;border-radius:4px;padding:.4em 1em;margin:1em 0}
.steps-nav a{margin-right:.5em}.step{border-top:1px dashed #bbb;padding:.5em 0}
.step.failing{background:#fff4f4;border:2px solid #d0021b;padding:.5em}
.step dl{display:grid;grid-template-columns:11em 1fr;gap:2px 8px;margin:.3em 0}.step dt{font-weight:bold}
.step dd{margin:0}.pic{overflow-x:auto}.step:target{outline:3px solid #4a7fc1}
"""

JS = """
document.addEventListener('keydown',function(e){
 if(e.target&&(e.target.tagName==='INPUT'||e.target.tagName==='TEXTAREA'))return;
 if(e.key!=='j'&&e.key!=='k')return;
 var s=Array.prototype.slice.call(document.querySelectorAll('section.step'));if(!s.length)return;
 var cur=location.hash?document.getElementById(location.hash.slice(1)):null,i=s.indexOf(cur);
 i=e.key==='j'?Math.min(s.length-1,i+1):Math.max(0,i-1);location.hash=s[i].id;});
"""


def _status_cls(s: str) -> str:
    return {"N/A": "NA"}.get(s, s if s in ("PASS", "FAIL", "ERROR", "UNTESTED") else "")


def _coverage_html(cov: dict | None) -> str:
    if not cov:
        return '<span class="none">not recorded</span>'
    if "actions" not in cov:
        return esc(json.dumps(cov, default=str)[:400])
    acts = cov.get("actions") or {}
    parts = []
    if acts:
        parts.append("actions: " + ", ".join(f"{esc(a)}&nbsp;{int(n)}" for a, n in acts.items()))
    else:
        parts.append('<span class="none">no action declares it</span>')
    br = cov.get("branches") or {}
    if br:
        parts.append(f"branches ({len(br)}): " + "; ".join(f"{esc(k)}&nbsp;{int(n)}" for k, n in br.items()))
    elif acts:
        parts.append('<span class="none">no branch taken</span>')
    obs = cov.get("observations") or []
    if obs:
        parts.append("observations after every step (" + str(cov.get("steps", "?")) + "): "
                     + ", ".join(esc(o) for o in obs))
    return "<br>".join(parts)


def _kv_table(d: dict) -> str:
    if not d:
        return '<p class="muted">none recorded</p>'
    rows = "".join(f"<tr><th>{esc(k)}</th><td><code>{esc(v if isinstance(v, str) else json.dumps(v, default=str))}"
                   f"</code></td></tr>" for k, v in d.items())
    return f"<table>{rows}</table>"


def _verdicts(t: dict) -> str:
    levels = t["levels"]
    head = "".join(f"<th>{esc(lv)}</th>" for lv in levels)
    out = [f'<table class="verdicts"><tr><th>invariant</th><th>title</th>{head}<th>result</th><th>detail</th>'
           f"<th>coverage</th></tr>"]
    for inv in t["invariants"]:
        cells = "".join(f'<td class="{_status_cls(inv["cells"].get(lv, "-"))}">{esc(inv["cells"].get(lv, "-"))}</td>'
                        for lv in levels)
        cov = inv.get("coverage") or {}
        cov_html = "<br>".join(
            (f"<b>{esc(lv)}</b>: " if len(cov) > 1 else "") + _coverage_html(c) for lv, c in cov.items()) \
            if cov else _coverage_html(None)
        out.append(f'<tr id="{esc(t["target"])}-{esc(inv["id"])}"><td><b>{esc(inv["id"])}</b></td>'
                   f'<td>{esc(inv["title"])}</td>{cells}<td class="{_status_cls(inv["status"])}">{esc(inv["status"])}'
                   f'</td><td>{esc(inv["detail"])}</td><td class="cov">{cov_html}</td></tr>')
    out.append("</table>")
    return "".join(out)


def _runs_table(t: dict) -> str:
    out = ["<table><tr><th>level</th><th>examples</th><th>steps</th><th>seconds</th><th>steps/s</th>"
           "<th>actions (steps)</th><th>capabilities</th><th>errors</th></tr>"]
    for r in t["runs"]:
        acts = ", ".join(f"{esc(a)}&nbsp;{int(n)}" for a, n in sorted(r["actions"].items()))
        caps = ", ".join(f"{esc(k)}={'yes' if v else 'no'}" for k, v in r["capabilities"].items())
        errs = "<br>".join(esc(e) for e in r["errors"]) or "-"
        out.append(f"<tr><td>{esc(r['level'])}</td><td>{int(r['examples'])}</td><td>{int(r['steps'])}</td>"
                   f"<td>{esc(r['seconds'])}</td><td>{esc(r['steps_per_second'])}</td><td class=\"cov\">{acts}</td>"
                   f"<td class=\"cov\">{caps}</td><td>{errs}</td></tr>")
    out.append("</table>")
    return "".join(out)


def _failure_html(t: dict, run: dict, f: dict, fid: str) -> str:
    steps = f.get("steps") or []
    nav = " ".join(f'<a href="#{fid}-s{s["index"]}">{"&#x2717;" if s["failing"] else ""}{int(s["index"])}</a>'
                   for s in steps)
    rp = f.get("replay") or {}
    out = [f'<div class="failure" id="{fid}"><h3><span class="FAIL">FAIL {esc(f["invariant"])}</span> '
           f'{esc(f.get("title", ""))} <span class="muted">[{esc(f["cause"])}] &middot; {esc(t["target"])} / '
           f'{esc(run["level"])} &middot; {int(f["shrunk_length"])} step(s) after shrinking'
           + (f' &middot; first seen after {esc(f["steps_to_detection"])} steps' if f.get("steps_to_detection") is not None else "")
           + (" &middot; flaky" if f.get("flaky") else "") + "</span></h3>"]
    if f.get("quote"):
        out.append(f'<blockquote class="seed">{esc(f["quote"])}</blockquote>')
    out.append(f'<pre class="reason">{esc(f["reason"])}</pre>')
    if f.get("repro"):
        out.append(f"<p>reproduction: <code>python {esc(f['repro'])}</code></p>")
    out.append(f'<p class="muted">replay for the pictures: {esc(rp.get("note", ""))} '
               f'&middot; steps: <span class="steps-nav">{nav}</span> (keys j / k)</p>')
    for s in steps:
        sid = f"{fid}-s{s['index']}"
        cls = "step failing" if s["failing"] else "step"
        out.append(f'<section class="{cls}" id="{sid}" data-step="{int(s["index"])}">')
        out.append(f"<h4>step {int(s['index'])} of {len(steps)}: <code>{esc(s['call'])}</code></h4><dl>")
        out.append(f"<dt>spec permits</dt><dd><code>{esc(s['permitted'] or '(not replayed)')}</code></dd>")
        out.append(f"<dt>implementation</dt><dd><code>{esc(s['answer'])}</code></dd>")
        if s.get("bound"):
            out.append(f"<dt>bound</dt><dd>{', '.join('#' + esc(b) for b in s['bound'])}</dd>")
        out.append("</dl>")
        if s["failing"]:
            out.append(f'<p class="FAIL">&#x2717; this step breaks {esc(f["invariant"])}: {esc(f.get("title", ""))}</p>')
            if f.get("quote"):
                out.append(f'<blockquote class="seed">{esc(f["quote"])}</blockquote>')
            out.append(f'<pre class="reason">{esc(f["reason"])}</pre>')
        if s.get("picture"):
            out.append(f'<div class="pic">{_picture(s, sid)}</div>')
        else:
            out.append('<p class="muted">no picture: the replay did not reach this step</p>')
        out.append("</section>")
    out.append("</div>")
    return "".join(out)


def _picture(s: dict, sid: str) -> str:
    """The step's picture; a picture model that cannot be drawn (it came from
    a supervised child: data, not trusted) is said so, never raised."""
    try:
        return P.svg(s["picture"], s.get("marks"), uid=sid, title=f"spec state after step {s['index']}")
    except Exception as e:  # noqa: BLE001
        return f'<p class="muted">the picture could not be drawn: {esc(T.exc_text(e))}</p>'


def render(record: dict) -> str:
    """The HTML report of a run record (a pure function of the record)."""
    targets = record.get("targets") or []
    nfail = sum(len(r["failures"]) for t in targets for r in t["runs"])
    ok = all(t.get("ok") for t in targets)
    title = f"{record.get('tool', 'memspec')}: " + ", ".join(t["target"] for t in targets)
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
           f"<h1>{esc(title)}</h1>",
           f'<p>{"<span class=PASS>all invariants hold</span>" if ok else "<span class=FAIL>conformance FAILED</span>"}'
           f" &middot; {nfail} failure(s) &middot; {esc(record.get('created', ''))} &middot; "
           f"record schema {esc(record.get('schema', '?'))}</p>",
           "<h2>Parameters</h2>", _kv_table(record.get("parameters") or {})]
    if nfail:
        out.append("<h2>Failures</h2><ul>")
        for ti, t in enumerate(targets):
            for ri, r in enumerate(t["runs"]):
                for fi, f in enumerate(r["failures"]):
                    out.append(f'<li><a href="#f{ti}-{ri}-{fi}">{esc(t["target"])} / {esc(r["level"])}: '
                               f'FAIL {esc(f["invariant"])} [{esc(f["cause"])}]</a> ({int(f["shrunk_length"])} steps)</li>')
        out.append("</ul>")
    for ti, t in enumerate(targets):
        out.append(f'<h2>Target <code>{esc(t["target"])}</code></h2>')
        out.append("<h3>Verdicts and coverage</h3>" + _verdicts(t))
        out.append("<h3>Runs</h3>" + _runs_table(t))
        for ri, r in enumerate(t["runs"]):
            for fi, f in enumerate(r["failures"]):
                out.append(_failure_html(t, r, f, f"f{ti}-{ri}-{fi}"))
    out.append(f"<script>{JS}</script></body></html>")
    return "\n".join(out)


def parameters_from_args(args: Any, names: Iterable[str]) -> dict:
    """The run's parameters from an argparse namespace (only the names given)."""
    out = {}
    for n in names:
        if hasattr(args, n):
            v = getattr(args, n)
            out[n] = v if isinstance(v, (int, float, str, bool, type(None))) else _r(v)
    return out


__all__ = ["SCHEMA", "build_record", "render", "write_html", "replay_failure", "coverage_of", "parameters_from_args"]
