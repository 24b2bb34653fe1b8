"""The invariant catalog at work: conformance harness, mutants, Z3 proofs and
CrossHair runs."""
