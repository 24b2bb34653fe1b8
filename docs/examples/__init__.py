"""Worked examples of conformance targets (README, "Writing a target").

Each module is a complete target a test runs (``tests/test_harness_examples.py``):
``memspec conform docs.examples.mechanism_target:target`` and so on.
"""
