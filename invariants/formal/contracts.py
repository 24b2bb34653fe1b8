"""CrossHair over the spec's pure kernels (issue 5).

* ``crosshair check`` on the PEP 316 contracts (``pre:``/``post:`` lines in
  the docstrings) of :mod:`memspec.spec.kernels` and, once it exists, the
  caching kernels of :mod:`memspec.spec.caching`;
* ``crosshair diffbehavior`` between each spec kernel and its reference
  counterpart (:mod:`memspec.invariants.formal.contracts_pairs`).

Each run is a subprocess (``python -m crosshair ...``) with a bounded
per-condition time; a result row says which function, what was run, how
long it took and any counterexample CrossHair printed.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

#: the switch of the opt-in mypyc build (``memspec.native.ENV``; this layer does not import ``memspec``)
NATIVE_ENV = "MEMSPEC_NATIVE"

KERNEL_MODULES = ["memspec.spec.kernels", "memspec.spec.caching.kernels"]

_ERR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: (?P<msg>.*)$")


@dataclass
class Row:
    kind: str          # "check" | "diff"
    target: str        # function (check) or pair name (diff)
    ok: bool
    seconds: float
    detail: str = ""
    conditions: int = 0
    #: what the row says: ``clean`` / ``same`` (CrossHair finished and found
    #: nothing), ``counterexample`` / ``different`` (it found one), ``timeout``
    #: (killed before it finished: nothing was shown either way), ``error``
    #: (CrossHair itself failed, or printed an error no contract owns)
    verdict: str = ""


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)


def _run(args: list[str], timeout: float) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    # CrossHair runs the modules on symbolic values: the pure-Python source, never the opt-in
    # mypyc build (a compiled function takes no symbolic int: every diff said DIFFERENT with it)
    env.pop(NATIVE_ENV, None)
    try:
        p = subprocess.run([sys.executable, "-m", "crosshair", *args], capture_output=True, text=True,
                           timeout=timeout, env=env)
        return p.returncode, (p.stdout + p.stderr).strip(), time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, f"timed out after {timeout}s\n{out}", time.perf_counter() - t0


def contracted_functions(module_name: str) -> list[tuple[str, int, int, int]]:
    """``(name, first line, last line, number of pre/post conditions)`` of
    each function in the module whose docstring carries PEP 316 conditions."""
    mod = importlib.import_module(module_name)
    out = []
    for name, fn in inspect.getmembers(mod, inspect.isfunction):
        if fn.__module__ != module_name:
            continue
        doc = inspect.getdoc(fn) or ""
        n = sum(1 for line in doc.splitlines() if line.strip().startswith(("pre:", "post:")))
        if not n:
            continue
        lines, first = inspect.getsourcelines(fn)
        out.append((name, first, first + len(lines) - 1, n))
    return sorted(out, key=lambda t: t[1])


def available_modules() -> tuple[list[str], list[str]]:
    have, missing = [], []
    for m in KERNEL_MODULES:
        try:
            importlib.import_module(m)
            have.append(m)
        except ImportError:
            missing.append(m)
    return have, missing


def check_module(module_name: str, per_condition_timeout: float = 2.0, timeout: float = 120.0) -> list[Row]:
    """``crosshair check`` on one module; one row per contracted function."""
    funcs = contracted_functions(module_name)
    rc, out, secs = _run(["check", "--analysis_kind", "PEP316", "--per_condition_timeout", str(per_condition_timeout),
                          module_name], timeout)
    errors: dict[str, list[str]] = {}
    stray = []
    for line in out.splitlines():
        m = _ERR.match(line.strip())
        if not m:
            continue
        ln = int(m["line"])
        owner = next((f for f, a, b, _ in funcs if a <= ln <= b), None)
        if owner is None:
            stray.append(line)
        else:
            errors.setdefault(owner, []).append(m["msg"])
    timed_out = rc == 124
    rows = []
    short, each = module_name.rsplit(".", 1)[-1], secs / max(1, len(funcs))
    for f, _, _, n in funcs:
        if f in errors:
            ok, detail, verdict = False, "; ".join(errors[f]), "counterexample"
        elif timed_out:
            # killed before CrossHair finished the module: no counterexample *seen* is not "no counterexample"
            ok, detail, verdict = False, (f"not finished: the module's CrossHair run was killed after {timeout:g}s "
                                          "(raise --module-timeout)"), "timeout"
        else:
            ok, detail, verdict = True, "no counterexample", "clean"
        rows.append(Row("check", f"{short}.{f}", ok, each, detail, n, verdict))
    if not timed_out and (rc not in (0, 1) or stray or (rc == 1 and not errors)):
        rows.append(Row("check", module_name, False, secs, f"crosshair exit {rc}: " + (out[-2000:] or "no output"),
                        0, "error"))
    return rows


def diff_pair(name: str, spec_fn: str, ref_fn: str, per_condition_timeout: float = 8.0, timeout: float = 60.0) -> Row:
    rc, out, secs = _run(["diffbehavior", "--exception_equivalence", "SAME_TYPE", "--per_condition_timeout",
                          str(per_condition_timeout), spec_fn, ref_fn], timeout)
    same = rc == 0 and "No differences found" in out
    detail = out.splitlines()[0] if same and out else out[-1500:]
    if same:
        verdict = "same"
    elif rc == 124:
        verdict, detail = "timeout", f"not finished: killed after {timeout:g}s (raise --module-timeout)"
    elif rc == 1 or "differ" in out.lower():
        verdict = "different"
    else:
        verdict = "error"
    return Row("diff", name, same, secs, detail, 0, verdict)


def run_contracts(per_condition_timeout: float = 2.0, diff_timeout: float = 4.0, jobs: int = 4,
                  module_timeout: float = 600.0) -> Report:
    """Check every kernel module and diff every pair, ``jobs`` subprocesses at a time."""
    t0 = time.perf_counter()
    rep = Report()
    mods, missing = available_modules()
    rep.skipped += [f"{m}: not importable (no such module yet)" for m in missing]
    from memspec.invariants.formal.contracts_pairs import all_pairs

    pairs, notes = all_pairs()
    rep.skipped += notes
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        checks = [ex.submit(check_module, m, per_condition_timeout, module_timeout) for m in mods]
        diffs = [ex.submit(diff_pair, n, a, b, diff_timeout, module_timeout) for n, a, b, _ in pairs]
        for f in checks:
            rep.rows += f.result()
        for f in diffs:
            rep.rows.append(f.result())
    rep.seconds = time.perf_counter() - t0
    return rep
