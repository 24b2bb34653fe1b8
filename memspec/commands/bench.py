"""``memspec bench [--quick] [--json FILE] [--only NAME]``: run the benchmarks.

Same as ``python -m bench`` in a checkout.  ``bench/`` is not part of the
installed wheel, so it is found in the current directory, or next to the
sources of an editable install; otherwise this command says where it looked.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def find_bench_root() -> tuple[Path | None, list[Path]]:
    """The directory holding ``bench/__main__.py``, and every place looked."""
    import memspec

    looked: list[Path] = []
    candidates = [Path.cwd(), *Path.cwd().parents]
    candidates.append(Path(memspec.__file__).resolve().parents[1])  # editable install: the repo
    for root in candidates:
        looked.append(root)
        if (root / "bench" / "__main__.py").is_file() and (root / "bench" / "common.py").is_file():
            return root, looked
    return None, looked


def main(argv: list[str]) -> int:
    root, looked = find_bench_root()
    if root is None:
        print("memspec bench: the benchmarks (bench/) ship with the source tree, not the wheel.\n"
              "Run this from a memspec checkout, or install it editable (pip install -e .).\n"
              "Looked for bench/__main__.py in: " + ", ".join(map(str, looked)), file=sys.stderr)
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    mod = importlib.import_module("bench.__main__")
    return int(mod.main(argv, prog="memspec bench") or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
