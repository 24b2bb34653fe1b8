"""``memspec demo kv``: the printed ledger matches the committed bytes at every step."""

from __future__ import annotations

import re

from memspec.commands import demo_kv

LINE = re.compile(
    r"ledger \[(?P<label>[^\]]+)\]: free=(?P<free>[\d,]+) MiB granted=(?P<granted>[\d,]+) MiB "
    r"charged=(?P<charged>[\d,]+) MiB \(kv=(?P<kv>[\d,]+) MiB weights=(?P<w>[\d,]+) MiB\) "
    r"\| kv physical=(?P<phys>[\d,]+) MiB committed: (?P<committed>.*) \| device=(?P<dev>[\d,]+) MiB"
)


def num(s: str) -> int:
    return int(s.replace(",", ""))


def test_demo_kv_printed_ledger_matches_committed_bytes(capsys):
    assert demo_kv.main([]) == 0
    out = capsys.readouterr().out
    rows = [m.groupdict() for m in LINE.finditer(out)]
    assert len(rows) == 12, out
    by = {r["label"]: r for r in rows}
    cap = 24 * 1024
    for r in rows:
        assert num(r["free"]) + num(r["granted"]) + num(r["charged"]) == cap, r
        assert num(r["kv"]) == num(r["phys"]), r                 # kv charge == KV pages on the device
        assert num(r["charged"]) == num(r["dev"]), r             # every charged byte is a held page
    committed = {label: dict(
        (k, num(v.split()[0])) for k, v in (c.split("=") for c in r["committed"].split(", ") if "=" in c))
        for label, r in by.items()}
    assert committed["A=100 MiB"] == {"A": 100} and num(by["A=100 MiB"]["kv"]) == 100
    assert committed["A=120 MiB"] == {"A": 120} and num(by["A=120 MiB"]["kv"]) == 120
    # the injected step-4 failure changed nothing and returned the grant
    assert committed["after rollback"] == {"A": 120} and num(by["after rollback"]["granted"]) == 0
    assert "step 4 failed: InjectedFailure" in out
    assert committed["A=160 MiB"] == {"A": 160}
    # prefix shared: 260 MiB mapped, 196 MiB physical and charged (64 MiB counted once)
    shared = by["A=160 MiB, B=100 MiB (64 shared)"]
    assert committed["A=160 MiB, B=100 MiB (64 shared)"] == {"A": 160, "B": 100} and num(shared["kv"]) == 196
    assert "two cold weights can free 700 MiB" in out and "can free only 0 MiB" in out
    assert num(by["ticket answered"]["granted"]) == 700 and num(by["ticket timed out"]["granted"]) == 0
    # release waits for the fence
    assert num(by["A dropped, fence pending"]["kv"]) == 196 and num(by["A released"]["kv"]) == 100
    assert num(by["all released"]["charged"]) == 0 and num(by["all released"]["dev"]) == 0
    assert "consistent: at all 12 steps" in out


def test_demo_check_catches_an_inconsistent_ledger():
    rec = {"label": "x", "capacity": 10, "free": 5, "granted": 0, "charged": 5,
           "charged_kv": 4, "kv_physical": 2, "device_physical": 5}
    assert demo_kv.check([rec]) == ["[x] kv charged 4 != kv physical 2"]
