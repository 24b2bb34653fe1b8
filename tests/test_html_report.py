"""The HTML run report, the pictures, and the Hypothesis signals (issue 18).

The report is parsed with the standard library's HTML parser (a strict
tree builder below: every end tag must close the element opened last), the
snapshot SVG with an XML parser.  A real shipped mutant's failure must show
the broken rule in the failing step's picture.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from memspec.invariants import html_report, pictures, runner

ROOT = Path(__file__).resolve().parents[1]
VOID = {"meta", "br", "img", "input", "link", "hr", "wbr", "source", "col", "area", "base", "embed", "param", "track"}
MARKUP = "<script>alert(1)</script> & <b onmouseover=\"x()\">bold</b>"


# --------------------------------------------------------------------------
# A strict little tree builder over html.parser
# --------------------------------------------------------------------------

class Node:
    def __init__(self, tag: str, attrs: dict, parent: "Node | None") -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node] = []
        self.text: list[str] = []

    def iter(self):
        yield self
        for c in self.children:
            yield from c.iter()

    def all_text(self) -> str:
        return "".join(self.text) + "".join(c.all_text() for c in self.children)

    def classes(self) -> set:
        return set((self.attrs.get("class") or "").split())

    def find_all(self, tag: str | None = None, cls: str | None = None, **attrs) -> list["Node"]:
        out = []
        for n in self.iter():
            if tag is not None and n.tag != tag:
                continue
            if cls is not None and cls not in n.classes():
                continue
            if any(n.attrs.get(k.replace("_", "-")) != v for k, v in attrs.items()):
                continue
            out.append(n)
        return out


class TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {}, None)
        self.cur = self.root
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        n = Node(tag, {k: (v or "") for k, v in attrs}, self.cur)
        self.cur.children.append(n)
        if tag not in VOID:
            self.cur = n

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, {k: (v or "") for k, v in attrs}, self.cur))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if self.cur.tag != tag:
            self.errors.append(f"</{tag}> closes <{self.cur.tag}>")
            return
        self.cur = self.cur.parent

    def handle_data(self, data):
        self.cur.text.append(data)


def parse(text: str) -> Node:
    b = TreeBuilder()
    b.feed(text)
    b.close()
    assert not b.errors, b.errors[:5]
    assert b.cur is b.root, f"unclosed <{b.cur.tag}>"
    return b.root


# --------------------------------------------------------------------------
# A shipped mutant, end to end through the CLI
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mutant_report(tmp_path_factory):
    """``memspec conform mutant:release-before-fence --html``: the deferred-free
    queue releases before the fence (S4)."""
    from memspec.commands import conform

    d = tmp_path_factory.mktemp("report")
    html_path, json_path = d / "report.html", d / "run.json"
    rc = conform.main(["mutant:release-before-fence", "--examples", "100", "--capacity", str(16 << 20), "--quiet",
                       "--out", str(d / "repro"), "--json", str(json_path), "--html", str(html_path)])
    assert rc == 1
    return html_path.read_text(encoding="utf-8"), json.loads(json_path.read_text())


def test_report_parses_and_holds_every_failure_and_every_step(mutant_report):
    text, js = mutant_report
    doc = parse(text)
    fails = [f for t in js["targets"] for lv in t["levels"] for f in lv["failures"]]
    assert fails
    divs = doc.find_all("div", cls="failure")
    assert len(divs) == len(fails)
    for f, div in zip(fails, divs):
        assert f"FAIL {f['invariant']}" in div.all_text()
        steps = div.find_all("section", cls="step")
        assert len(steps) == len(f["trace"]) == f["shrunk_length"]
        for s, sec in zip(f["trace"], steps):
            assert s["action"] in sec.find_all("h4")[0].all_text()
            dts = [n.all_text() for n in sec.find_all("dt")]
            assert dts[:2] == ["spec permits", "implementation"]
            assert sec.find_all("svg"), "every replayed step has a picture"
        assert [("failing" in s.classes()) for s in steps] == [False] * (len(steps) - 1) + [True]
    # the verdict table has every invariant of the level, with its coverage
    rows = doc.find_all("table", cls="verdicts")[0].find_all("tr")[1:]
    assert [r.find_all("td")[0].all_text() for r in rows] == [row["id"] for row in js["targets"][0]["invariants"]]
    assert all("actions:" in r.find_all("td", cls="cov")[0].all_text() or "no action" in r.all_text() for r in rows)
    # no network, nothing external
    for tag, attr in (("script", "src"), ("link", "href"), ("img", "src"), ("iframe", "src")):
        assert not [n for n in doc.find_all(tag) if n.attrs.get(attr)], (tag, attr)
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text


def test_failing_step_picture_shows_the_release_queued_behind_its_fence(mutant_report):
    """Seed 000, *GPU release must obey stream/fence ordering*: the spec still
    holds the dropped allocation queued (its release waits in the
    deferred-free queue), and the failure says its bytes are gone -- the
    picture outlines that queued object in red with the invariant's id."""
    text, _ = mutant_report
    doc = parse(text)
    div = doc.find_all("div", cls="failure")[0]
    assert "S4" in div.find_all("h3")[0].all_text()
    failing = div.find_all("section", cls="failing")
    assert len(failing) == 1
    sec = failing[0]
    assert "GPU release must obey stream/fence ordering" in " ".join(b.all_text() for b in sec.find_all("blockquote"))
    marked = sec.find_all("rect", cls="marked")
    assert marked and all(m.attrs.get("data-state") == "queued" for m in marked), [m.attrs for m in marked]
    assert any(n.all_text().startswith("\u2717 S4") for n in sec.find_all("text", cls="mark-note"))
    assert sec.find_all("text", cls="queue-entry"), "the deferred-free queue holds its release"
    # before the failing step nothing is marked, and the object was live
    for other in div.find_all("section", cls="step"):
        if other is not sec:
            assert not other.find_all(cls="marked")
    assert any(r.attrs.get("data-state") == "live" for s in div.find_all("section", cls="step")[:-1]
               for r in s.find_all("rect", cls="object"))


def test_the_record_is_json_and_render_is_a_pure_function_of_it():
    res = runner.conform("mutant:noop-commit", "all", examples=60, capacity=16 << 20, out_dir=None)
    rec = html_report.build_record({"mutant:noop-commit": res}, {"examples": 60})
    again = json.loads(json.dumps(rec))
    assert html_report.render(again) == html_report.render(rec)
    (f,) = [f for t in rec["targets"] for r in t["runs"] for f in r["failures"]]
    assert f["replay"]["reproduced"] and f["invariant"] == "S5"
    assert all(s["picture"]["level"] == "mechanism" for s in f["steps"])
    # the marked range is the reservation the failure names, drawn committed in the spec's state
    last = f["steps"][-1]
    assert last["failing"] and last["marks"]["refs"]
    doc = parse(html_report.render(rec))
    marked = doc.find_all("rect", cls="marked")
    assert marked and {m.attrs["data-ref"] for m in marked} == {str(r) for r in last["marks"]["refs"]}


# --------------------------------------------------------------------------
# Escaping: target text is text
# --------------------------------------------------------------------------

def _hand_record() -> dict:
    sys_model = {
        "level": "system", "capacity": 8 << 20, "page": 2 << 20, "clock": 0,
        "ledger": {"free": 4 << 20, "granted": 0, "charged": 4 << 20, "open_grants": 0, "tickets_held": 0,
                   "charged_by": {MARKUP: 4 << 20}, "lease_bytes": {}, "live_bytes_by": {MARKUP: 4 << 20},
                   "queued_bytes_by": {}, "physical_by": {}},
        "owned": [{"ref": 1, "kind": "allocation", "holder": MARKUP, "size": 1, "footprint": 4 << 20, "state": "queued",
                   "charged_to": MARKUP, "creator": 0, "address": None, "fences": [],
                   "pages": [{"start": 0, "count": 2, "state": "queued"}]}],
        "queue": [{"seq": 1, "what": MARKUP, "fences": [], "refund": {MARKUP: 4 << 20}, "physical": 4 << 20,
                   "owned": 1}],
        "streams": [], "tickets": [], "grants": [], "kv": [{"name": MARKUP, "max_bytes": 1, "own": 0, "prefix": 0,
                                                          "prefix_of": MARKUP, "state": "open", "fences": []}],
        "weights": [], "registry": {"installed": 0, "generation": 1, "context_alive": True}, "records": {},
    }
    step = {"index": 1, "action": "allocate", "call": f"allocate(size={MARKUP!r})", "args": {"size": MARKUP},
            "permitted": MARKUP, "answer": f"raises RuntimeError: {MARKUP}", "bound": [], "failing": True,
            "picture": sys_model, "marks": pictures.marks_from("#1 " + MARKUP, "S4", MARKUP)}
    fail = {"invariant": "S4", "title": MARKUP, "quote": MARKUP, "cause": "unexpected-exception",
            "reason": f"allocate raised RuntimeError: {MARKUP}", "steps_to_detection": 3, "shrunk_length": 1,
            "repro": MARKUP, "flaky": False, "replay": {"reproduced": True, "note": MARKUP}, "steps": [step]}
    return {"schema": html_report.SCHEMA, "tool": "memspec conform", "created": MARKUP,
            "parameters": {MARKUP: MARKUP},
            "targets": [{"target": MARKUP, "ok": False, "levels": ["system"],
                         "invariants": [{"id": "S4", "title": MARKUP, "quote": MARKUP, "status": "FAIL",
                                         "cells": {"system": "FAIL"}, "detail": MARKUP, "coverage": {"system": None}}],
                         "runs": [{"level": "system", "steps": 3, "examples": 1, "seconds": 0.1,
                                   "steps_per_second": 30.0, "actions": {MARKUP: 3}, "outcomes": {},
                                   "capabilities": {}, "errors": [MARKUP], "failures": [fail]}]}]}


def test_target_text_with_markup_renders_as_text():
    text = html_report.render(_hand_record())
    doc = parse(text)
    scripts = doc.find_all("script")
    assert len(scripts) == 1 and "alert" not in scripts[0].all_text()  # only the report's own navigation
    assert not [b for b in doc.find_all("b") if b.all_text() == "bold"], "a target's <b> must not become an element"
    assert not [n for n in doc.iter() if any(k.startswith("on") for k in n.attrs)]
    body = doc.all_text()
    assert body.count("<script>alert(1)</script>") >= 8  # shown as text: reason, call, answer, holder, queue ...
    svg = doc.find_all("svg")[0]
    assert "<script>alert(1)</script>" in svg.all_text()  # the holder's name inside the picture, as text
    assert "not recorded" in doc.find_all("table", cls="verdicts")[0].all_text()


def markup_target(capacity=None):
    """A reference target whose allocator raises an exception carrying markup on its third allocate."""
    from memspec.reference.targets import reference_eager

    inst = reference_eager(capacity) if capacity is not None else reference_eager()
    inner = inst.mechanism.allocator()

    class Alloc:
        calls = 0

        def __getattr__(self, k):
            return getattr(inner, k)

        def allocate(self, request):
            Alloc.calls += 1
            if Alloc.calls > 2:
                raise RuntimeError(MARKUP)
            return inner.allocate(request)

    a = Alloc()
    mech = inst.mechanism

    class Mech:
        name = "markup"

        def __getattr__(self, k):
            return getattr(mech, k)

        def allocator(self):
            return a

    inst.mechanism = Mech()
    return inst


def test_a_target_error_message_with_markup_is_escaped_end_to_end():
    (r,) = runner.conform("tests.test_html_report:markup_target", "mechanism", examples=10, steps=10, out_dir=None)
    assert r.failures and any(MARKUP in f.reason for f in r.failures)
    text = html_report.render(html_report.build_record({"markup": [r]}))
    doc = parse(text)
    assert len(doc.find_all("script")) == 1 and not [b for b in doc.find_all("b") if b.all_text() == "bold"]
    assert MARKUP in doc.all_text()


# --------------------------------------------------------------------------
# Pictures on their own: the snapshot SVG
# --------------------------------------------------------------------------

def test_snapshot_svg_is_xml_with_blocks_by_state(tmp_path):
    from memspec.commands import snapshot as snapshot_cmd
    from memspec.reference.caching import CachingAllocator

    a = CachingAllocator(preset="pytorch", capacity=64 << 20)
    a.malloc(1 << 19)
    y = a.malloc(1 << 19)
    a.record_stream(y, 1)
    a.free(y)
    root = ET.fromstring(pictures.snapshot_svg(a.snapshot()))
    states = {r.get("data-state") for r in root.iter("{http://www.w3.org/2000/svg}rect") if "block" in (r.get("class") or "")}
    assert {"live", "free", "pending"} <= states
    out = tmp_path / "s.svg"
    assert snapshot_cmd.main(["--svg", str(out)]) == 0
    root = ET.fromstring(out.read_text())
    blocks = [r for r in root.iter("{http://www.w3.org/2000/svg}rect") if "block" in (r.get("class") or "")]
    assert {b.get("data-state") for b in blocks} == {"live", "free"}  # the seed's fragmented device at its OOM
    # memspec oom explain --snapshot ... --svg: the same picture of the snapshot it explains
    from memspec.commands import oom

    pkl, drawn = tmp_path / "s.pickle", tmp_path / "oom.svg"
    assert snapshot_cmd.main(["--out", str(pkl)]) == 0
    assert oom.main(["explain", "--snapshot", str(pkl), "--svg", str(drawn)]) == 0
    assert drawn.read_text() == out.read_text()
    assert oom.main(["explain", "--svg", str(drawn), "CUDA out of memory."]) == 2  # --svg needs a snapshot


def test_snapshot_svg_escapes_what_the_snapshot_says():
    snap = {"segments": [{"address": 0, "total_size": 4096, "segment_type": "large", "stream": MARKUP,
                          "blocks": [{"address": 0, "size": 4096, "state": MARKUP, "requested_size": 1}]}]}
    root = ET.fromstring(pictures.snapshot_svg(snap))  # well-formed XML: nothing was injected
    assert not [e for e in root.iter() if e.tag.endswith("script") or e.tag == "b"]
    assert any(MARKUP in (t.text or "") for t in root.iter("{http://www.w3.org/2000/svg}text"))


# --------------------------------------------------------------------------
# Hypothesis signals
# --------------------------------------------------------------------------

def test_each_step_records_hypothesis_events():
    from memspec.invariants.signals import HypothesisStatistics

    with HypothesisStatistics() as seen:   # the engine runs in a supervised child: read back as data
        runner.conform("reference-eager", "mechanism", examples=15, steps=15, out_dir=None)
    assert len(seen.stats) == 1
    text = seen.texts()
    assert "action: allocate" in text
    assert "outcome: allocate -> returns" in text
    assert "boundary: allocate.size = page" in text  # the spec's page size, drawn exactly


def test_pytest_plugin_shows_the_events_with_hypothesis_statistics(tmp_path):
    (tmp_path / "test_users.py").write_text("def test_users_own():\n    assert True\n")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_users.py"),
                        "--memspec-target", "reference-eager", "--memspec-level", "mechanism", "--memspec-examples",
                        "10", "--memspec-steps", "10", "--memspec-out", str(tmp_path / "repro"),
                        "--hypothesis-show-statistics"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]
    assert "Hypothesis Statistics" in p.stdout and "action: allocate" in p.stdout, p.stdout[-3000:]


# --------------------------------------------------------------------------
# A browser, when there is one
# --------------------------------------------------------------------------

def _browser() -> str | None:
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.mark.skipif(_browser() is None, reason="no headless Chromium on this machine (CI does not install a browser)")
def test_headless_chromium_renders_a_screenshot(tmp_path, mutant_report):
    text, _ = mutant_report
    page = tmp_path / "report.html"
    page.write_text(text, encoding="utf-8")
    shot = tmp_path / "shot.png"
    p = subprocess.run([_browser(), "--headless", "--disable-gpu", "--no-sandbox", f"--screenshot={shot}",
                        "--window-size=1200,2400", page.as_uri()], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


# --------------------------------------------------------------------------
# Replays that go wrong, and fuzz --html
# --------------------------------------------------------------------------

def test_a_replay_that_hangs_is_said_so_and_the_report_still_renders():
    """The replay runs the target in a supervised child: a target that hangs
    in the replay is killed there, and the report says so."""
    (r,) = runner.conform("tests.hostile_targets:reference_hangs", "mechanism", examples=10, steps=10, timeout=0.3,
                          out_dir=None)
    assert r.failures and {f.cause for f in r.failures} == {"hang"}
    rec = html_report.build_record({"hangs": [r]})
    f = rec["targets"][0]["runs"][0]["failures"][0]
    assert f["replay"]["reproduced"] and "did not return" in f["replay"]["note"], f["replay"]
    assert f["steps"][-1]["answer"] == "hangs" and f["steps"][-1]["picture"] == f["steps"][-2]["picture"]
    doc = parse(html_report.render(rec))
    assert len(doc.find_all("section", cls="step")) == len(f["steps"]) == f["shrunk_length"]
    assert len(doc.find_all("section", cls="failing")) == 1


def test_fuzz_writes_the_report_too(tmp_path):
    from memspec.commands import fuzz

    page = tmp_path / "fuzz.html"
    rc = fuzz.main(["mutant:release-before-fence", "--seconds", "8", "--capacity", str(16 << 20), "--quiet",
                    "--db", str(tmp_path / "db"), "--out", str(tmp_path / "repro"), "--html", str(page)])
    assert rc == 1
    doc = parse(page.read_text(encoding="utf-8"))
    assert "memspec fuzz" in doc.find_all("h1")[0].all_text()
    fails = doc.find_all("div", cls="failure")
    assert fails and any("S4" in d.find_all("h3")[0].all_text() for d in fails)
    assert all(d.find_all("section", cls="failing") for d in fails)


def test_a_ledger_figure_named_by_the_failure_is_outlined():
    """S11's observations name the Governor's figures (``governor.free``):
    the picture outlines that part of the ledger bar, and only that part."""
    model = _hand_record()["targets"][0]["runs"][0]["failures"][0]["steps"][0]["picture"]
    marks = pictures.marks_from("", "S11", "governor.free: implementation says 1048575, spec says 1048576")
    root = ET.fromstring(pictures.svg(model, marks))
    parts = {r.get("data-part"): "marked" in (r.get("class") or "")
             for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("data-part")}
    assert parts["free"] is True and not any(v for k, v in parts.items() if k != "free"), parts
    plain = ET.fromstring(pictures.svg(model, pictures.marks_from("", "S11", "something else")))
    assert not [r for r in plain.iter("{http://www.w3.org/2000/svg}rect") if "marked" in (r.get("class") or "")
                and r.get("data-part")]


def test_a_malformed_picture_model_is_said_so_not_raised():
    """Picture models come back from the supervised child as data: one that
    cannot be drawn leaves a note in its step, and the rest of the report stands."""
    rec = _hand_record()
    step = rec["targets"][0]["runs"][0]["failures"][0]["steps"][0]
    step["picture"] = {"level": "system", "ledger": MARKUP, "capacity": "many"}
    doc = parse(html_report.render(rec))
    (sec,) = doc.find_all("section", cls="step")
    assert "the picture could not be drawn" in sec.all_text() and not sec.find_all("svg")
    assert doc.find_all("table", cls="verdicts")
