"""``memspec demo STORY``: the seeds' stories, run on the reference.

* ``kv``            -- seed 000's KV growth transaction, prefix sharing,
                       pressure ticket and fence-ordered release.
* ``fragmentation`` -- seed 003's fragmentation OOM, empty_cache and
                       expandable segments, under the ``seed`` then the
                       ``pytorch`` preset.
"""

from __future__ import annotations

import importlib
import sys

STORIES = {
    "kv": "memspec.commands.demo_kv",
    "fragmentation": "memspec.commands.demo_fragmentation",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in STORIES:
        print(__doc__.strip())
        return 0 if (not argv or argv[0] in ("-h", "--help")) else 2
    return int(importlib.import_module(STORIES[argv[0]]).main(argv[1:]) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
