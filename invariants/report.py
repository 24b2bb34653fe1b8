"""Reports of a conformance run: the invariant table, JSON and JUnit.

One row per invariant: **PASS**, **FAIL** (with the cause, the reason, and
the standalone reproduction of its shortest counterexample), **N/A** with
the reason (a capability the target explicitly lacks), **UNTESTED** with the
reason when the actions that declare it did not succeed often enough to
judge it (see :mod:`~memspec.invariants.verdicts`: not a pass), or
**ERROR** when the run could not judge it (the target could not be built,
the spec crashed).  JSON and JUnit carry the per-action counts behind each
verdict.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import sys
import tempfile
import xml.etree.ElementTree as ET
from typing import Any, Iterable

from memspec.invariants import text as T

ORDER = {"FAIL": 0, "ERROR": 1, "UNTESTED": 2, "PASS": 3, "N/A": 4, "\u2014": 5, "-": 6}


def merged_rows(results: Iterable[Any]) -> tuple[list[str], list[dict]]:
    """Rows of one target's results merged over its levels:
    ``(levels, [{id, title, cells: {level: status}, status, detail}])``."""
    results = list(results)
    levels = [r.level for r in results]
    rows: dict[str, dict] = {}
    for r in results:
        rr = r.rows()
        if not rr and r.errors:
            rows.setdefault("-", {"id": "-", "title": "", "cells": {}, "details": []})
            rows["-"]["cells"][r.level] = "ERROR"
            rows["-"]["details"].append(f"{r.level}: {T.safe_str(r.errors[0])}")
        for inv, title, status, detail in rr:
            row = rows.setdefault(inv, {"id": inv, "title": title, "cells": {}, "details": []})
            row["title"] = row["title"] or title
            row["cells"][r.level] = status
            if status == "FAIL" and any(f.invariant == inv for f in r.failures):
                for f in (f for f in r.failures if f.invariant == inv):   # each counterexample, its own line
                    what = f"[{f.check_id}] " if getattr(f, "check", None) else ""
                    extra = f" -> {f.repro}" if f.repro else ""
                    row["details"].append((f"{r.level}: " if len(results) > 1 else "") + what
                                          + f"[{f.cause}] {f.reason}" + extra)
            elif status in ("FAIL", "ERROR", "N/A", "UNTESTED", "PASS") and detail:
                row["details"].append((f"{r.level}: " if len(results) > 1 else "") + detail)
    out = []
    for row in rows.values():
        sts = list(row["cells"].values())
        if "FAIL" in sts:
            status = "FAIL"
        elif "ERROR" in sts:
            status = "ERROR"
        elif "UNTESTED" in sts and "PASS" not in sts:
            status = "UNTESTED"  # a level that ran it enough makes the row a PASS
        elif "PASS" in sts:
            status = "PASS"
        elif sts and all(x == "\u2014" for x in sts):
            status = "\u2014"   # no level has an action of it
        else:
            status = "N/A"
        # an N/A detail matters only when nothing else judged it
        details = [d for d in row["details"] if status == "N/A" or "capability absent" not in d and "no action" not in d]
        if status == "PASS":   # only what the PASS rests on
            details = [d for d in details if "rests on: " in d]
        out.append({"id": T.safe_str(row["id"]), "title": T.safe_str(row["title"]), "cells": row["cells"],
                    "status": status, "detail": T.safe_str(" | ".join(details), 4 * T.MAX_CHARS)})
    return levels, out


def _style(status: str) -> str:
    return {"PASS": "green", "FAIL": "bold red", "N/A": "dim", "ERROR": "yellow", "UNTESTED": "magenta",
            "\u2014": "dim"}.get(status, "default")


def print_table(console: Any, target: str, results: list[Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    levels, rows = merged_rows(results)
    t = Table(title=f"memspec conform {escape(T.terminal(target, 300))}", show_lines=False)
    t.add_column("invariant", no_wrap=True)
    t.add_column("title")
    for lv in levels:
        t.add_column(lv, no_wrap=True)
    t.add_column("result", no_wrap=True)
    t.add_column("detail", overflow="fold")
    for row in rows:
        cells = [f"[{_style(row['cells'].get(lv, '-'))}]{row['cells'].get(lv, '-')}[/]" for lv in levels]
        t.add_row(escape(T.terminal(row["id"], 200)), escape(T.terminal(row["title"], 200)), *cells,
                  f"[{_style(row['status'])}]{row['status']}[/]", escape(T.terminal(row["detail"])))
    console.print(t)
    for r in results:
        st = r.stats
        acts = len(st.actions)
        total_acts = len(r.plan.actions) if r.plan is not None else 0
        console.print(
            f"  {r.level}: {st.steps} steps in {st.examples} runs, {st.seconds:.1f} s, "
            f"{st.rate():.0f} steps/s; actions covered {acts}/{total_acts}, outcomes seen {len(st.outcomes)}"
            + (f"; spec boundary values hit {len(st.boundaries)}" if getattr(st, "boundaries", None) else "")
            + (f"; {len(r.failures)} failure(s)" if r.failures else "")
            + (f"; errors: {escape(T.terminal('; '.join(T.safe_str(e) for e in r.errors)))}" if r.errors else ""))
        for note in getattr(r, "notes", None) or []:
            console.print(f"  {r.level}: note: {escape(T.terminal(T.safe_str(note)))}")


def to_json(all_results: dict[str, list[Any]]) -> dict:
    out = {"targets": []}
    for target, results in all_results.items():
        levels, rows = merged_rows(results)
        tj = {"target": target, "ok": all(r.ok for r in results), "invariants": rows, "levels": []}
        for r in results:
            st = r.stats
            tj["levels"].append({
                "level": r.level,
                "steps": st.steps,
                "examples": st.examples,
                "seconds": round(st.seconds, 3),
                "steps_per_second": round(st.rate(), 1),
                "actions": dict(st.actions),
                "outcomes": {f"{a}: {o}": n for (a, o), n in st.outcomes.items()},
                "accepted": dict(getattr(st, "accepted", {}) or {}),
                "coverage": r.coverage() if hasattr(r, "coverage") else {},
                "min_accepted": getattr(r, "min_accepted", None),
                "boundaries_hit": dict(getattr(st, "boundaries", {}) or {}),
                "capabilities": r.plan.capabilities if r.plan is not None else {},
                "errors": r.errors,
                "notes": list(getattr(r, "notes", None) or []),
                "failures": [{
                    "invariant": f.invariant, "check": getattr(f, "check", None), "cause": f.cause,
                    "likely_consequence_of": getattr(f, "likely_cause", None),
                    "reason": f.reason,
                    "steps_to_detection": f.steps_to_detection, "shrunk_length": f.shrunk_length,
                    "repro": f.repro, "flaky": f.flaky,
                    # the checks that failed first, when the diagnosis named another rule (runner.diagnose)
                    "consequences": list(getattr(f, "consequences", []) or []),
                    "trace": [{"action": s.action, "args": {k: T.safe_repr(v) for k, v in s.args.items()},
                               "outcome": s.outcome} for s in f.trace],
                } for f in r.failures],
            })
        out["targets"].append(tj)
    # every string bounded and encodable (a lone surrogate would make json.dump's
    # output unwritable as UTF-8 in strict readers); control characters are escaped by JSON itself
    return T.clean(out)


def write_file(path: str, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path``, creating its directory.

    A regular file (or a new one) is written to a temporary file beside it
    and renamed over it, so a failure part way (a full disk) leaves the old
    file or none, never a truncated report; the temporary file is removed.
    Anything else (``/dev/stdout``, a FIFO, ``/dev/full``) is written in
    place.  Raises ``OSError`` on failure."""
    raw = data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(path, "wb") as fh:
            fh.write(raw)
        return
    os.makedirs(d, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=d)
    except OSError:
        if st is None:
            raise
        with open(path, "wb") as fh:   # a writable file in a directory that is not: in place
            fh.write(raw)
        return
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        if st is not None:
            try:
                os.chmod(tmp, stat.S_IMODE(st.st_mode))
            except OSError:
                pass
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path: str, all_results: dict[str, list[Any]]) -> None:
    write_file(path, json.dumps(to_json(all_results), indent=2, default=str) + "\n")


def X(s: Any, limit: int = T.MAX_CHARS) -> str:
    """Text for JUnit XML (:func:`memspec.invariants.text.xml`)."""
    return T.xml(s, limit)


def write_junit(path: str, all_results: dict[str, list[Any]]) -> None:
    suites = ET.Element("testsuites", name="memspec conform")
    for target, results in all_results.items():
        for r in results:
            cases = r.rows()
            cov = r.coverage() if hasattr(r, "coverage") else {}
            suite = ET.SubElement(suites, "testsuite", name=X(f"{target}/{r.level}"), tests=str(max(1, len(cases))),
                                  failures=str(sum(1 for c in cases if c[2] in ("FAIL", "UNTESTED"))),
                                  errors=str(sum(1 for c in cases if c[2] == "ERROR") + (0 if cases else len(r.errors))),
                                  skipped=str(sum(1 for c in cases if c[2] == "N/A")),
                                  time=f"{r.stats.seconds:.3f}")
            if not cases and r.errors:
                tc = ET.SubElement(suite, "testcase", classname=X(f"memspec.{target}.{r.level}"), name="setup")
                ET.SubElement(tc, "error", message=X(r.errors[0], 500)).text = X("\n".join(X(e) for e in r.errors),
                                                                                4 * T.MAX_CHARS)
            for inv, title, status, detail in cases:
                detail = X(detail)
                tc = ET.SubElement(suite, "testcase", classname=X(f"memspec.{target}.{r.level}"),
                                   name=X(f"{inv} {title}".strip()))
                if inv in cov:
                    props = ET.SubElement(tc, "properties")
                    for a, c in cov[inv]["actions"].items():
                        ET.SubElement(props, "property", name=X(f"{a}.steps"), value=str(c["steps"]))
                        ET.SubElement(props, "property", name=X(f"{a}.accepted"), value=str(c["accepted"]))
                if status == "FAIL":
                    f = next((x for x in r.failures if x.invariant == inv), None)
                    el = ET.SubElement(tc, "failure", message=X(detail, 500), type=X(f.cause) if f else "FAIL")
                    lines = [detail]
                    if f is not None:
                        lines += [X(f"{i}. {s.action}({', '.join(f'{k}={T.safe_repr(v, 200)}' for k, v in s.args.items())})"
                                    f" -> {T.safe_str(s.outcome)}") for i, s in enumerate(f.trace, 1)]
                        if f.repro:
                            lines.append(X(f"reproduction: {shlex.quote(sys.executable)} {shlex.quote(T.safe_str(f.repro))}"))
                    el.text = "\n".join(lines)
                elif status == "ERROR":
                    ET.SubElement(tc, "error", message=X(detail, 500))
                elif status == "N/A":
                    ET.SubElement(tc, "skipped", message=X(detail, 500))
                elif status == "UNTESTED":  # not a pass: a failure of the run's coverage, typed so
                    ET.SubElement(tc, "failure", message=X("UNTESTED: " + detail, 500), type="untested").text = detail
    write_file(path, ET.tostring(suites, encoding="utf-8", xml_declaration=True))


def console(**kw):
    """A rich console for reports: the terminal's width on a terminal, and
    100 columns in CI logs and pipes (tables fold their detail column to fit) so tables are not
    truncated (rich assumes 80 columns when it cannot ask)."""
    import sys

    from rich.console import Console

    if "width" not in kw and not sys.stdout.isatty():
        kw["width"] = 100
    return Console(**kw)
