"""The seed's toy caching allocator, extracted from the seed text at run time.

The benchmark compares the reference caching allocator's ``seed`` preset with
the toy in ``shared/seeds/003_5119c376f66a0078.txt``.  The toy is never copied
into the project: it is read from the seed when that file is present, and the
row is skipped otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

SEED_NAME = "003_5119c376f66a0078.txt"


def seed_path() -> Path | None:
    here = Path(__file__).resolve().parents[1]
    for cand in (
        os.environ.get("MEMSPEC_SEED_003"),
        here.parent / "shared" / "seeds" / SEED_NAME,
        here / "shared" / "seeds" / SEED_NAME,
    ):
        if cand and Path(cand).is_file():
            return Path(cand)
    return None


def load_toy() -> SimpleNamespace | None:
    """Exec the seed's ``toy_alloc.py`` listing; ``None`` when the seed is absent."""
    path = seed_path()
    if path is None:
        return None
    text = path.read_text()
    start = text.index("# toy_alloc.py")
    end = text.index("Run the fragmentation scenario:")
    ns: dict = {}
    exec(compile(text[start:end], f"{path}:toy_alloc.py", "exec"), ns)
    return SimpleNamespace(**{k: ns[k] for k in ("Sim", "OOM", "MB", "round_size")})
