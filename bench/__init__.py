"""memspec benchmarks: ratios measured in one run on one machine (see README)."""
