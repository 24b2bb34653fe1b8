"""``memspec targets``: the conformance targets found (entry point group
``memspec.targets``), with their kind and capabilities, or why they failed
to load.  Each target is built once to discover its capabilities (unless
``--no-probe``); one that cannot run here (no GPU, library missing) is listed
as unavailable with the reason."""

from __future__ import annotations

from memspec.invariants.report import console as _report_console

import argparse


#: seconds one target's probe (its factory, the capabilities, its close) may take
PROBE_SECONDS = 120.0


def _probe(ref) -> tuple[str, str, str | None]:  # type: ignore[no-untyped-def]
    """``(kind, capabilities, why unavailable or None)`` of one target, learnt
    in a supervised child: its factory is untrusted code (a factory that
    exits, crashes or hangs is listed as unavailable, with what happened,
    and the listing goes on)."""
    import time

    from memspec.invariants import text as T
    from memspec.invariants.discovery import capabilities
    from memspec.invariants.guard import supervise

    def work(ch) -> None:  # type: ignore[no-untyped-def]
        kind, caps, why = "", "", None
        try:
            inst = ref.factory()
            try:
                kind = getattr(inst, "kind", "mechanism")
                c = capabilities(inst) if inst.mechanism is not None else {}
                names = ["allocator"] if inst.mechanism is not None else []
                names += [k for k in ("virtual_backing", "shared_mapping", "ep", "physical_bytes") if c.get(k)]
                if kind == "caching":
                    names.insert(0, "caching allocator")
                caps = ", ".join(names)
            finally:
                if getattr(inst, "close", None):
                    inst.close()
        except Exception as e:  # noqa: BLE001 - a target that cannot be built is listed, not fatal
            # TargetUnavailable / DriverUnavailable carry the reason as their message
            why = T.safe_str(e, 2000) if type(e).__name__.endswith("Unavailable") else T.exc_text(e, 2000)
        ch.send({"t": "probe", "kind": T.safe_str(kind, 100), "caps": T.safe_str(caps, 500), "why": why})

    end = supervise(work, timeout=PROBE_SECONDS, deadline=time.monotonic() + PROBE_SECONDS)
    got = [m for m in end.messages if m.get("t") == "probe"]
    if end.death is not None or len(got) != 1:
        fatal = [m.get("error") for m in end.messages if m.get("t") == "fatal"]
        return "", "", (f"probing it raised {T.safe_str(fatal[0], 2000)}" if fatal
                        else f"probing it: {end.death or 'no answer'}")
    m = got[0]
    kind, caps, why = m.get("kind"), m.get("caps"), m.get("why")
    if type(kind) is not str or type(caps) is not str or not (why is None or type(why) is str):
        return "", "", "probing it: a malformed answer"
    return kind, caps, why


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="memspec targets", description=__doc__.split("\n\n")[0])
    p.add_argument("--no-probe", action="store_true", help="do not build targets to discover capabilities")
    args = p.parse_args(argv)
    from rich.markup import escape
    from rich.table import Table

    from memspec.invariants import text as T
    from memspec.invariants.discovery import list_targets

    t = Table(title="memspec targets")
    reasons: list[tuple[str, str]] = []
    for col in ("name", "kind", "capabilities", "status", "source"):
        t.add_column(col)
    for ref in list_targets():
        kind, caps, status = "", "", "available"
        if ref.error:
            # the target's text is text, never markup (an unbalanced "[/]" was a MarkupError)
            status = f"[red]import failed[/]: {escape(T.terminal(ref.error))}"
            reasons.append((ref.name, f"import failed: {ref.error}"))
        elif not args.no_probe:
            kind, caps, why = _probe(ref)
            if why is not None:
                status = f"[yellow]unavailable[/]: {escape(T.terminal(why))}"
                reasons.append((ref.name, f"unavailable: {why}"))
        t.add_row(escape(T.terminal(ref.name)), escape(T.terminal(kind)), escape(T.terminal(caps)), status,
                  escape(T.terminal(ref.source)))
    con = _report_console()
    con.print(t)
    if reasons:  # the table wraps long reasons: each in full, on one line
        for name, why in reasons:
            con.print(escape(T.terminal(f"{name}: {why}")), soft_wrap=True)
    return 0
