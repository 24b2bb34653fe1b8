"""Hostile output: reporting survives a target's text and the file system's faults.

A target's exception text is untrusted: a lone surrogate, tens of megabytes,
terminal escape sequences, an exception whose ``__str__`` raises.  The file
system is unreliable: an output path under a file, in a read-only directory,
a full disk.  For each, ``memspec conform`` must end with its exit status and
a one-line message, within a bounded time, and lose nothing it could write
(the other outputs are written).  The targets are in
``tests/hostile_text_targets.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from memspec import cli
from memspec.invariants import text as T
from tests import hostile_text_targets as H

ROOT = Path(__file__).resolve().parents[1]
MACHINE = "tests.hostile_targets:TOY"
#: a generous bound on one small conform run (CI is a loaded 2-core machine); never the verdict of a test by itself
WALL = 120


def _conform(tmp_path: Path, target: str, *extra: str, env: dict | None = None, outputs: bool = True,
             stdout=subprocess.PIPE):
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "memspec", "conform", f"tests.hostile_text_targets:{target}", "--machine", MACHINE,
            "--level", "mechanism", "--examples", "3", "--steps", "5", "--quiet", "--out", str(out / "repro")]
    if outputs:
        argv += ["--json", str(out / "r.json"), "--junit", str(out / "r.xml"), "--html", str(out / "r.html")]
    argv += list(extra)
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE, timeout=600,
                       env={**os.environ, "COLUMNS": "200", **(env or {})})
    return p, time.monotonic() - t0, out


def _strings(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from _strings(k)
            yield from _strings(x)
    elif isinstance(v, list):
        for x in v:
            yield from _strings(x)


def _outputs_ok(out: Path, *, json_path=None, junit_path=None, html_path=None) -> dict:
    """Every output written and well-formed: JSON strict UTF-8 without lone
    surrogates, JUnit parseable XML, HTML; a reproduction per failure."""
    doc = None
    if json_path is not False:
        raw = (json_path or out / "r.json").read_bytes()
        doc = json.loads(raw.decode("utf-8"))   # strict: a lone surrogate would not decode
        assert not any(0xD800 <= ord(c) <= 0xDFFF for s in _strings(doc) for c in s)
    if junit_path is not False:
        ET.parse(junit_path or out / "r.xml")
    if html_path is not False:
        html = (html_path or out / "r.html").read_bytes().decode("utf-8")
        assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    return doc


def _reasons(doc: dict) -> list[str]:
    return [f["reason"] for t in doc["targets"] for lv in t["levels"] for f in lv["failures"]]


def _flat(stdout: str) -> str:
    """The terminal text without whitespace and box-drawing characters (a
    table folds a long detail over several lines, between its borders)."""
    return "".join(c for c in stdout if not c.isspace() and not 0x2500 <= ord(c) <= 0x257F)


def _no_traceback(p):
    assert b"Traceback" not in p.stderr and b"Traceback" not in (p.stdout or b""), p.stderr.decode(errors="replace")


# --------------------------------------------------------------------------
# the sanitizer itself
# --------------------------------------------------------------------------

def test_cut_is_bounded_and_says_how_much_was_cut():
    s = "H" * 48_000_000
    for f, limit in ((T.safe_str, T.MAX_CHARS), (T.terminal, T.TERMINAL_CHARS), (T.xml, T.MAX_CHARS)):
        got = f(s)
        assert len(got) <= limit + 100
        assert "[cut: " in got and "of 48,000,000 chars]" in got
    # cut again (the terminal's shorter limit after the data's): the original length is still said
    assert "of 48,000,000 chars]" in T.terminal(T.safe_str(s))
    assert T.safe_str("short") == "short"


def test_terminal_shows_every_control_escaped():
    controls = "".join(map(chr, [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x202E, 0x2028, 0xD800]))
    got = T.terminal("x" + controls + "y")
    assert got.startswith("x") and got.endswith("y")
    assert all(0x20 <= ord(c) < 0x7F for c in got), ascii(got)
    assert "\\x1b" in got and "\\r" in got and "\\x9b" in got and "\\u202e" in got and "\\ud800" in got
    assert T.terminal("plain text: é ü 漢") == "plain text: é ü 漢"


def test_xml_carries_any_code_point():
    s = "".join(map(chr, range(0, 0x3000))) + "\ud800\udfff\ufffe\uffff"
    el = ET.Element("x", message=T.xml(s))
    el.text = T.xml(s)
    back = ET.fromstring(ET.tostring(el, encoding="utf-8"))
    assert "\\x00" in back.text and "\\x1b" in back.text and "\\ud800" in back.text


def test_a_raising_str_or_repr_never_escapes():
    assert "its __str__ raised RuntimeError" in T.exc_text(H.HostileStrError())
    assert T.exc_text(H.HostileReprError()).startswith("HostileReprError: <HostileReprError object: its __str__ raised")
    assert "__repr__ raised" in T.safe_repr(H.HostileReprError())

    class Sub(str):
        def __len__(self):
            return 0

    assert len(T.safe_str(Sub("x" * 100_000))) < T.MAX_CHARS + 100   # a str subclass cannot hide its length


# --------------------------------------------------------------------------
# conform against hostile text
# --------------------------------------------------------------------------

def test_lone_surrogate_does_not_crash_the_report(tmp_path):
    p, wall, out = _conform(tmp_path, "toy_surrogate")
    _no_traceback(p)
    assert p.returncode == 1, p.stderr
    assert wall < WALL
    stdout = p.stdout.decode("utf-8")          # strict: the terminal got valid UTF-8
    assert "\\ud800" in stdout and "\\udfff" in stdout and "FAIL" in stdout   # (the table may fold the line)
    doc = _outputs_ok(out)
    assert any("before \\ud800 after" in r for r in _reasons(doc))
    assert len(list((out / "repro").glob("*.py"))) >= 1


def test_escape_sequences_never_reach_the_terminal(tmp_path):
    p, wall, out = _conform(tmp_path, "toy_escapes")
    _no_traceback(p)
    assert p.returncode == 1 and wall < WALL
    stdout = p.stdout.decode("utf-8")
    for c in ("\x1b", "\x07", "\r", "\x9b", "\x00", "\x08", "\x7f", "\x0b", "\x0c", "\x85", "\u2028", "\u202e"):
        assert c not in stdout, ascii(c)
    flat = _flat(stdout)
    assert "\\x1b[31mRED\\x1b[0m" in flat and "\\x1b]0;pwned-title\\x07" in flat
    doc = _outputs_ok(out)
    assert any("\x1b[31mRED" in r for r in _reasons(doc))   # JSON keeps the data (escaped by JSON itself)
    xml_text = (out / "r.xml").read_text(encoding="utf-8")
    assert "\\x1b[31mRED" in xml_text and "\x1b" not in xml_text
    html = (out / "r.html").read_text(encoding="utf-8")
    assert "\\x1b[31mRED" in html and "\x1b" not in html and "\x00" not in html


def test_markup_in_target_text_is_text_everywhere(tmp_path):
    p, wall, out = _conform(tmp_path, "toy_markup")
    _no_traceback(p)
    assert p.returncode == 1 and wall < WALL
    assert "[boldred]markup[/]" in _flat(p.stdout.decode("utf-8"))
    _outputs_ok(out)
    failures = ET.parse(out / "r.xml").getroot().findall(".//failure")
    assert any("</failure><script>" in (f.get("message") or "") for f in failures)
    html = (out / "r.html").read_text(encoding="utf-8")
    assert "&lt;script&gt;alert(1)" in html and "<script>alert(1)" not in html


def test_a_huge_message_is_cut_everywhere(tmp_path):
    """4 MB of exception text (the harness and its pipe carry it; the reports
    cut it).  Before: the table alone took 35 s for 4 MB (quadratic);
    96 MB reproduction files for 48 MB."""
    n = 4_000_000
    p, wall, out = _conform(tmp_path, "toy_huge", env={"MEMSPEC_HOSTILE_HUGE_CHARS": str(n)})
    _no_traceback(p)
    assert p.returncode == 1 and wall < WALL
    stdout = p.stdout.decode("utf-8")
    assert "[cut: " in stdout and len(stdout) < 200_000
    doc = _outputs_ok(out)
    assert all("[cut: " in r and len(r) < 2 * T.MAX_CHARS for r in _reasons(doc))
    assert (out / "r.json").stat().st_size < 1_000_000
    assert (out / "r.xml").stat().st_size < 1_000_000
    assert (out / "r.html").stat().st_size < 2_000_000
    repros = list((out / "repro").glob("*.py"))
    assert repros and all(f.stat().st_size < 100_000 for f in repros)


def _engine_formats_safely():
    """(str-raising exceptions survive, huge text is bounded) in the engine's
    formatting of a target's exception (``Run._mismatch``); None where that
    cannot be asked (its signature changed): then the end-to-end tests run."""
    from memspec.invariants import engine as E

    action = SimpleNamespace(name="allocate")
    outs = SimpleNamespace(describe=lambda: "returns an allocation", branches=[])
    try:
        E.Run._mismatch(None, action, {}, outs, None, H.HostileStrError())
        str_ok = True
    except RuntimeError:
        str_ok = False
    except Exception:  # noqa: BLE001 - the probe itself does not fit any more
        return None
    try:
        _cause, reason = E.Run._mismatch(None, action, {}, outs, None, RuntimeError("H" * 1_000_000))
    except Exception:  # noqa: BLE001
        return None
    return str_ok, len(reason) < 100_000


_PROBE = _engine_formats_safely()
_ENGINE_STR_PENDING = _PROBE is not None and not _PROBE[0]
_ENGINE_CUT_PENDING = _PROBE is not None and not _PROBE[1]


@pytest.mark.xfail(_ENGINE_STR_PENDING, strict=True,
                   reason="engine.py formats the target's exception with f'{err}' (Run._describe_answer/_mismatch): "
                          "it must call memspec.invariants.text.exc_text / safe_str")
def test_an_exception_whose_str_raises_is_the_targets_failure(tmp_path):
    p, wall, out = _conform(tmp_path, "toy_str_raises")
    _no_traceback(p)
    assert p.returncode == 1 and wall < WALL
    doc = _outputs_ok(out)
    stdout = p.stdout.decode("utf-8")
    assert "harness error" not in stdout, stdout
    reasons = _reasons(doc)
    assert reasons and any("__str__ raised" in r for r in reasons), reasons


@pytest.mark.xfail(_ENGINE_CUT_PENDING, run=False, strict=True,
                   reason="engine.py puts the whole target text in the reason; the child pipes it to the parent "
                          "(guard.supervise joins the buffer quadratically): minutes for 48 MB until the engine "
                          "cuts with memspec.invariants.text.exc_text")
def test_a_48_mb_message_is_cut_at_the_source(tmp_path):
    p, wall, out = _conform(tmp_path, "toy_huge")
    _no_traceback(p)
    assert p.returncode == 1 and wall < WALL
    stdout = p.stdout.decode("utf-8")
    assert "[cut: " in stdout and "48,000,000" in stdout
    doc = _outputs_ok(out)
    assert all(len(r) < 2 * T.MAX_CHARS for r in _reasons(doc))


# --------------------------------------------------------------------------
# output paths: checked before the run
# --------------------------------------------------------------------------

def _run(argv, capsys):
    t0 = time.monotonic()
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    c = capsys.readouterr()
    return rc, c.out, c.err, time.monotonic() - t0


@pytest.fixture
def readonly_dir(tmp_path):
    """A directory nobody can create a file in: chmod 555 (not for root,
    who writes there anyway: then /sys, a read-only file system for root too)."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        for cand in (d, Path("/sys")):
            probe = cand / ".memspec-test-probe"
            try:
                probe.touch()
            except OSError:
                yield cand
                return
            probe.unlink()
        pytest.skip("no directory here refuses a file (root, and /sys is writable)")
    finally:
        d.chmod(0o755)


CHECKED_OUTPUTS = [
    ["conform", "--json", "{p}/x.json"],
    ["conform", "--junit", "{p}/x.xml"],
    ["conform", "--html", "{p}/x.html"],
    ["conform", "--out", "{p}/repro"],
    ["conform", "--db", "{p}/db"],
    ["fuzz", "--html", "{p}/x.html"],
    ["fuzz", "--json", "{p}/x.json"],
    ["fuzz", "--db", "{p}/db"],
    ["fuzz", "--out", "{p}/repro"],
    ["snapshot", "--svg", "{p}/x.svg"],
    ["mutants", "--json", "{p}/m.json"],
    ["prove", "--json", "{p}/p.json"],
    ["contracts", "--json", "{p}/c.json"],
]


@pytest.mark.parametrize("argv", CHECKED_OUTPUTS, ids=[" ".join(a[:2]) for a in CHECKED_OUTPUTS])
@pytest.mark.parametrize("where", ["under-a-file", "read-only"])
def test_unwritable_output_fails_before_the_run(argv, where, tmp_path, readonly_dir, capsys):
    if where == "under-a-file":
        blocker = tmp_path / "a-file"
        blocker.write_text("x")
        p = blocker / "missing"
    else:
        p = readonly_dir / "missing"
    rc, out, err, wall = _run([a.format(p=p) for a in argv], capsys)
    assert rc == 2
    msg = err.strip().splitlines()[-1]
    assert argv[1] in msg and ("not writable" in msg or "not a directory" in msg), err
    assert "Traceback" not in err and "steps run" not in out and "segments" not in out   # nothing ran
    assert wall < WALL


def test_a_missing_directory_is_created(tmp_path):
    deep = tmp_path / "new" / "deeper"
    p, wall, _out = _conform(tmp_path, "toy_escapes", "--json", str(deep / "r.json"), "--junit", str(deep / "r.xml"),
                             "--html", str(deep / "html" / "r.html"), outputs=False)
    _no_traceback(p)
    assert p.returncode == 1 and wall < WALL
    _outputs_ok(deep, html_path=deep / "html" / "r.html")


# --------------------------------------------------------------------------
# write failures after the run
# --------------------------------------------------------------------------

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full (Linux only)")


@needs_dev_full
@pytest.mark.parametrize("flag", ["--json", "--junit", "--html"])
def test_a_full_disk_is_one_line_and_the_other_outputs_are_written(tmp_path, flag):
    out = tmp_path / "out"
    paths = {"--json": out / "r.json", "--junit": out / "r.xml", "--html": out / "r.html"}
    paths[flag] = Path("/dev/full")
    extra = [a for f, path in paths.items() for a in (f, str(path))]
    p, wall, _ = _conform(tmp_path, "toy_escapes", *extra, outputs=False)
    _no_traceback(p)
    assert p.returncode == 2 and wall < WALL
    lines = [ln for ln in p.stderr.decode("utf-8").splitlines() if ln.strip()]
    assert lines == [f"memspec conform: cannot write {flag} /dev/full: No space left on device [Errno 28]"], lines
    _outputs_ok(out, json_path=False if flag == "--json" else None, junit_path=False if flag == "--junit" else None,
                html_path=False if flag == "--html" else None)
    assert "conformance FAILED" in p.stdout.decode("utf-8")   # the verdict is still shown


@needs_dev_full
def test_a_full_stdout_is_one_line_and_the_files_are_written(tmp_path):
    with open("/dev/full", "w") as full:
        p, wall, out = _conform(tmp_path, "toy_escapes", stdout=full)
    _no_traceback(p)
    assert p.returncode == 2 and wall < WALL
    lines = [ln for ln in p.stderr.decode("utf-8").splitlines() if ln.strip()]
    assert len(lines) == 1 and "cannot write the report to stdout" in lines[0], lines
    _outputs_ok(out)


def test_an_unwritable_repro_directory_after_the_start_is_one_error_per_failure(tmp_path, monkeypatch, capsys):
    """The reproduction directory vanishes under a file during the run: each
    failure says it could not be written; the JSON is still written."""
    from memspec.invariants import repro

    def broken(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(repro, "write_repro", broken)
    out = tmp_path / "out"
    rc, stdout, err, wall = _run(["conform", "tests.hostile_text_targets:toy_escapes", "--machine", MACHINE,
                                  "--level", "mechanism", "--examples", "3", "--steps", "5", "--quiet",
                                  "--out", str(out / "repro"), "--json", str(out / "r.json")], capsys)
    assert rc == 1 and wall < WALL
    doc = json.loads((out / "r.json").read_text(encoding="utf-8"))
    errors = [e for t in doc["targets"] for lv in t["levels"] for e in lv["errors"]]
    assert errors and all("No space left on device" in e and "\n" not in e for e in errors), errors


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE as a full disk (Linux)")
def test_fuzz_db_on_a_full_disk_says_so(tmp_path):
    """RLIMIT_FSIZE 0 (SIGXFSZ ignored): every write to a file fails with
    EFBIG, as on a full disk; Hypothesis's database swallows its save errors,
    the command must not."""
    import resource
    import signal

    def full_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    argv = [sys.executable, "-m", "memspec", "fuzz", "tests.hostile_text_targets:toy_escapes", "--machine", MACHINE,
            "--level", "mechanism", "--seconds", "2", "--shrink-seconds", "1", "--jobs", "1", "--quiet",
            "--db", str(tmp_path / "db"), "--out", str(tmp_path / "repro")]
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=600, preexec_fn=full_disk)
    assert time.monotonic() - t0 < WALL
    _no_traceback(p)
    err = p.stderr.decode("utf-8")
    said = [ln for ln in err.splitlines() if "--db" in ln]
    assert any("cannot persist anything" in ln and "File too large" in ln for ln in said), err
    assert any("did not persist" in ln for ln in said), err
    assert p.returncode == 1


# --------------------------------------------------------------------------
# flags
# --------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["fuzz", "--jobs", "100000"], ["prove", "--jobs", "100000"],
                                  ["contracts", "--jobs", "100000"], ["fuzz", "--jobs", "0"]])
def test_jobs_has_an_upper_bound(argv, capsys):
    rc, out, err, _ = _run(argv, capsys)
    assert rc == 2 and "--jobs" in err.strip().splitlines()[-1] and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--memspec-examples=0", "--memspec-steps=-1", "--memspec-steps=abc",
                                  "--memspec-timeout=nan", "--memspec-timeout=0", "--memspec-seed=x",
                                  "--memspec-target=", "--memspec-level=bogus"])
def test_pytest_plugin_flags_are_checked(flag, tmp_path):
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co", "-q", flag,
                        str(ROOT / "tests" / "test_layering.py")], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 4, p.stdout + p.stderr           # pytest's usage error
    name = flag.split("=")[0]
    assert any(name in ln and "error" in ln for ln in p.stderr.splitlines()), p.stderr
    assert "Traceback" not in p.stderr + p.stdout


def test_pytest_plugin_checks_the_repro_directory_with_a_target(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co", "-q",
                        "--memspec-target=reference", f"--memspec-out={blocker}/repro",
                        str(ROOT / "tests" / "test_layering.py")], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 4
    assert "--memspec-out" in p.stderr and "not a directory" in p.stderr and "Traceback" not in p.stderr
    # without --memspec-target nothing is checked (the plugin does nothing)
    q = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co", "-q",
                        f"--memspec-out={blocker}/repro", str(ROOT / "tests" / "test_layering.py")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert q.returncode == 0, q.stdout + q.stderr
