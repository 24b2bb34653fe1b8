"""Test configuration: the Hypothesis profile (``ci`` unless HYPOTHESIS_PROFILE says otherwise), and the
``fresh_process`` marker."""

import atexit
import json
import os
import re
import select
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from memspec import profiles

profiles.load()


_CHILD = "MEMSPEC_TEST_IN_FRESH_PROCESS"
#: the backstop of one fresh-process test (pyproject's pytest timeout, 900 s, is the hang detector)
_FRESH_LIMIT_S = 850


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "fresh_process: run this test in a fresh interpreter (the seed-000 BMC refutations search in "
                   "Z3's main context, so their search depends on the terms earlier tests left there; every other "
                   "check is a solving.Query in a context of its own)")


# A fresh interpreter costs about 2 s of CPU before the test starts (the interpreter, pytest, its plugins,
# Hypothesis, Z3), times 53 tests.  The zygote pays that once per pytest process: a new interpreter that
# imports only those third-party packages -- no project module (Hypothesis draws integers from a pool of
# constants harvested from the project's modules in ``sys.modules``), no Z3 term (its main context is not
# created by the import) -- and then, per test, forks a child that runs ``pytest.main`` on the test's node
# id exactly as ``python -m pytest`` would.  Every child starts from the same never-used zygote; nothing a
# test does reaches the zygote or another test.  Requests and answers are one JSON line each (never pickled).
_ZYGOTE_SRC = r"""
import json, os, sys
import pytest, _pytest.config, _pytest.main, _pytest.python, _pytest.runner, _pytest.fixtures, _pytest.terminal
import hypothesis, z3
try:
    import pytest_timeout, xdist
except ImportError:
    pass
assert z3.z3._main_ctx is None, "the zygote must not create Z3's context"
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        rc = 70
        try:
            fd = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0); os.dup2(fd, 1); os.dup2(fd, 2)
            os.chdir(req["cwd"])
            os.environ.clear(); os.environ.update(req["env"])
            rc = int(pytest.main(req["args"]))
        except BaseException as e:
            print(f"fresh-process child: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            try:
                sys.stdout.flush(); sys.stderr.flush()
            finally:
                os._exit(rc)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""

_zygote: "subprocess.Popen[str] | None" = None


def _stop_zygote() -> None:
    global _zygote
    z, _zygote = _zygote, None
    if z is not None:
        try:
            z.stdin.close()   # its loop ends: it exits
            z.wait(timeout=10)
        except Exception:
            z.kill()
            z.wait()


def _read_line(z: "subprocess.Popen[str]", limit: float) -> dict:
    ready, _, _ = select.select([z.stdout], [], [], limit)
    line = z.stdout.readline() if ready else ""
    if not line:
        raise RuntimeError("the fresh-process zygote did not answer" + ("" if ready else f" within {limit:g}s"))
    return json.loads(line)


def _start_zygote(root: str) -> "subprocess.Popen[str]":
    global _zygote
    if _zygote is None or _zygote.poll() is not None:
        _zygote = subprocess.Popen([sys.executable, "-c", _ZYGOTE_SRC], cwd=root, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, env={**os.environ, _CHILD: "1"},
                                   start_new_session=True)
        atexit.register(_stop_zygote)
        if _read_line(_zygote, 120) != {"ready": True}:
            raise RuntimeError("the fresh-process zygote did not start")
    return _zygote


def _in_fresh_process(root: str, args: list[str]) -> tuple[int, str]:
    """``python -m pytest ARGS`` in a child of the zygote: its exit status and its output."""
    with tempfile.NamedTemporaryFile("r", prefix="fresh-", suffix=".out") as out:
        z = _start_zygote(root)
        try:
            z.stdin.write(json.dumps({"args": args, "cwd": root, "out": out.name,
                                      "env": {**os.environ, _CHILD: "1"}}) + "\n")
            z.stdin.flush()
            rc = _read_line(z, _FRESH_LIMIT_S)["rc"]
        except BaseException:
            try:                      # a timeout or an interrupt: the zygote and its child go (their own group)
                os.killpg(z.pid, 9)
            except OSError:
                pass
            _stop_zygote()
            raise
        return rc, out.read()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked ``fresh_process`` runs alone in a new ``python -m pytest`` (its pass or failure is the
    child's); in that child it runs as usual."""
    if pyfuncitem.get_closest_marker("fresh_process") is None or os.environ.get(_CHILD):
        return None
    root = str(pyfuncitem.config.rootpath)
    args = ["-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--durations=0", "--durations-min=1e9",
            "-W", "ignore::pytest.PytestAssertRewriteWarning",   # the zygote imported Hypothesis before pytest
            pyfuncitem.nodeid]
    if hasattr(os, "fork"):
        rc, out = _in_fresh_process(root, args)
        err = ""
    else:
        p = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=root, capture_output=True, text=True,
                           env={**os.environ, _CHILD: "1"}, timeout=_FRESH_LIMIT_S)
        rc, out, err = p.returncode, p.stdout, p.stderr
    if rc != 0:
        pytest.fail(f"in a fresh interpreter ({pyfuncitem.nodeid}), exit {rc}:\n{out[-6000:]}\n{err[-2000:]}",
                    pytrace=False)
    return True


# Scheduling under ``-n auto`` (measured on the README's command, quiet 2-core machine, 503 s before): (1)
# xdist's ``load`` mode sends each test to whichever worker is free, so a module-scoped fixture shared by two
# tests was built once per worker that ran one of them (the agreement walk of ``test_proofs_agreement.py``:
# 22.4 s + 21.2 s); (2) the expensive tests came late in collection order, and one worker ran them alone at
# the end while the other idled.  (xdist's own ``loadgroup`` mode cannot help: with pytest 9 the group suffix
# it writes into ``item._nodeid`` is ignored.)  So: every test file that defines a module-scoped fixture is
# one unit of work (one worker, its fixtures built once), every other test is a unit of its own, and units go
# out one at a time to whichever worker is free, largest first (``pytest_collection_modifyitems``).  Which
# test runs where never decides a verdict; a plain ``python -m pytest`` (no ``-n``) keeps the file order.
_MODULE_FIXTURE = re.compile(r"@pytest\.fixture\([^)]*scope\s*=\s*[\"']module[\"']")


def _files_sharing_a_module_fixture(root: Path) -> frozenset[str]:
    tests = root / "tests"
    return frozenset(f"tests/{p.name}" for p in tests.glob("test_*.py")
                     if _MODULE_FIXTURE.search(p.read_text(encoding="utf-8")))


@pytest.hookimpl(tryfirst=True, optionalhook=True)   # optional: a run with -p no:xdist has no such hook
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load":
        return None        # a mode the user asked for by name is xdist's
    from xdist.scheduler import LoadScopeScheduling

    shared = _files_sharing_a_module_fixture(Path(str(config.rootpath)))

    class _ModuleFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in shared else nodeid

    config.option.loadscopereorder = False     # keep the workers' order: the slow tests first
    return _ModuleFixtureScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """In an xdist worker, the order the controller hands out (largest units first): the files that are one
    unit, then the tests marked ``slow``, then the ``fresh_process`` ones, then the rest, each in file order."""
    if not hasattr(config, "workerinput"):
        return
    shared = _files_sharing_a_module_fixture(Path(str(config.rootpath)))

    def rank(item: pytest.Item) -> int:
        if item.nodeid.split("::", 1)[0] in shared:
            return 0
        return 1 if item.get_closest_marker("slow") else 2 if item.get_closest_marker("fresh_process") else 3

    items.sort(key=rank)   # stable: file order within a rank
