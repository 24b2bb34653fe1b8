"""Make memspec importable without pip (no network, maybe no setuptools): a
directory of symlinks laid out as pyproject's ``package-dir`` says
(``memspec/`` -> ``memspec/``, ``memspec/spec`` -> ``spec/``...) plus a
``memspec-<version>.dist-info`` with ``METADATA`` and ``entry_points.txt``, so
the ``memspec.targets`` entry points are found.  Put the directory on
``PYTHONPATH``.

``python tests/gpu/linktree.py DEST`` (run from the project root; Python >= 3.11).
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path


def build(root: Path, dest: Path) -> Path:
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    proj = meta["project"]
    dirs: dict[str, str] = meta["tool"]["setuptools"]["package-dir"]
    dest.mkdir(parents=True, exist_ok=True)
    top = dest / "memspec"
    top.mkdir(exist_ok=True)
    for entry in (root / dirs["memspec"]).iterdir():  # the top package: its files, then the remapped subpackages
        link = top / entry.name
        if not link.exists() and entry.name != "__pycache__":
            link.symlink_to(entry.resolve())
    for pkg, src in sorted(dirs.items()):
        if pkg == "memspec" or pkg.count(".") != 1:
            continue  # nested packages come along inside their parent's directory
        link = top / pkg.split(".", 1)[1]
        if not link.exists():
            link.symlink_to((root / src).resolve())
    info = dest / f"memspec-{proj['version']}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: memspec\nVersion: {proj['version']}\n")
    lines = []
    for group, eps in proj.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{k} = {v}" for k, v in eps.items()]
        lines.append("")
    if proj.get("scripts"):
        lines.append("[console_scripts]")
        lines += [f"{k} = {v}" for k, v in proj["scripts"].items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(build(Path(os.getcwd()), Path(sys.argv[1]).resolve()))
