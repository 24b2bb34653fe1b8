"""``memspec targets``: the conformance targets found (entry point group
``memspec.targets``), with their kind and capabilities, or why they failed
to load.  Each target is built once to discover its capabilities (unless
``--no-probe``); one that cannot run here (no GPU, library missing) is listed
as unavailable with the reason."""

from __future__ import annotations

from memspec.invariants.report import console as _report_console

import argparse
import sys


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="memspec targets", description=__doc__.split("\n\n")[0])
    p.add_argument("--no-probe", action="store_true", help="do not build targets to discover capabilities")
    args = p.parse_args(argv)
    from rich.table import Table

    from memspec.invariants.discovery import capabilities, list_targets

    t = Table(title="memspec targets")
    reasons: list[tuple[str, str]] = []
    for col in ("name", "kind", "capabilities", "status", "source"):
        t.add_column(col)
    for ref in list_targets():
        kind, caps, status = "", "", "available"
        if ref.error:
            status = f"[red]import failed[/]: {ref.error}"
            reasons.append((ref.name, f"import failed: {ref.error}"))
        elif not args.no_probe:
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
                why = str(e) if type(e).__name__.endswith("Unavailable") else f"{type(e).__name__}: {e}"
                status = f"[yellow]unavailable[/]: {why}"
                reasons.append((ref.name, f"unavailable: {why}"))
        t.add_row(ref.name, kind, caps, status, ref.source)
    con = _report_console()
    con.print(t)
    if reasons:  # the table wraps long reasons: each in full, on one line
        from rich.markup import escape

        for name, why in reasons:
            con.print(escape(f"{name}: {why}"), soft_wrap=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
