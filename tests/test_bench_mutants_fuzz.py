"""``bench.mutants_fuzz`` (issue 35): the command it runs per mutant is one
``memspec fuzz`` accepts, with the mode and ``--until-failure`` it was
given, and its summary counts kills and expected blames and takes the
median and the worst CPU seconds over the killed mutants only.  Nothing is
timed here."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import mutants_fuzz as B  # noqa: E402

from memspec.commands import fuzz  # noqa: E402


def test_the_command_per_mutant_is_one_memspec_fuzz_accepts(tmp_path):
    cmd = B.fuzz_command("noop-commit", "mechanism", str(tmp_path), mode="walk", jobs=1, minutes=0.5, seed=3,
                         until_failure=True)
    assert cmd[1:4] == ["-m", "memspec", "fuzz"]
    args = fuzz.parser().parse_args(cmd[4:])
    assert (args.target, args.mode, args.jobs, args.minutes, args.seed, args.until_failure, args.quiet) == \
        ("mutant:noop-commit", "walk", 1, 0.5, 3, True, True)
    assert args.capacity == B.CAPACITY and args.db.startswith(str(tmp_path))   # an empty database of its own
    args = fuzz.parser().parse_args(B.fuzz_command("caching-pools-mix", "caching", str(tmp_path), mode="hypothesis",
                                                   jobs=2, minutes=2, seed=0, until_failure=False)[4:])
    assert (args.mode, args.until_failure, args.capacity) == ("hypothesis", False, None)


def test_summary_is_over_the_killed_mutants():
    rows = [{"name": "a", "expected": "S1", "blame": "S1", "cpu_s": 1.0, "wall_s": 2.0},
            {"name": "b", "expected": "S2", "blame": "S7", "cpu_s": 9.0, "wall_s": 9.5},
            {"name": "c", "expected": "S3", "blame": "S3", "cpu_s": 3.0, "wall_s": 4.0},
            {"name": "d", "expected": "S4", "blame": None, "cpu_s": 120.0, "wall_s": 120.0}]   # survived
    s = B.summary(rows)
    assert (s["mutants"], s["killed"], s["expected_blame"]) == (4, 3, 2)
    assert (s["median_cpu_s"], s["worst_cpu_s"], s["worst_cpu_mutant"]) == (3.0, 9.0, "b")
    assert (s["median_wall_s"], s["worst_wall_s"]) == (4.0, 9.5)
    assert B.summary([])["median_cpu_s"] is None
