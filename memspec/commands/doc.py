"""``memspec doc [--check] [--output PATH]``: generate docs/SPEC.md from the spec.

``--check`` writes nothing and exits 1 if the file differs from what the spec
generates now (a stale document), 0 if it is current.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from memspec.argtypes import out_file


def default_path() -> Path:
    """docs/SPEC.md of the source tree (the repository this package was installed from), else of the cwd."""
    import memspec.spec as spec_pkg

    root = Path(spec_pkg.__file__).resolve().parent.parent
    if (root / "pyproject.toml").exists():
        return root / "docs" / "SPEC.md"
    return Path.cwd() / "docs" / "SPEC.md"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="memspec doc", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the committed file is stale")
    p.add_argument("--output", type=lambda s: Path(out_file(s)), default=None, help="where SPEC.md lives (default: docs/SPEC.md)")
    args = p.parse_args(argv)
    from memspec.spec.doc import render

    path = args.output or default_path()
    text = render()
    if args.check:
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        if old == text:
            print(f"{path}: up to date")
            return 0
        diff = list(difflib.unified_diff(old.splitlines(), text.splitlines(), str(path), "generated", lineterm="", n=1))
        print(f"{path} is stale ({'missing' if not old else f'{len(diff)} diff lines'}); run `memspec doc`", file=sys.stderr)
        print("\n".join(diff[:40]), file=sys.stderr)
        return 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
