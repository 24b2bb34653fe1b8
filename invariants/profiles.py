"""Hypothesis settings profiles, registered in one place.

* ``ci``   -- bounded and derandomized: fits the CI budget (the default under pytest).
* ``dev``  -- a quick local loop.
* ``fuzz`` -- long runs (GPU runners, nightly).

Select with ``HYPOTHESIS_PROFILE=<name>`` or ``memspec ... --profile``.
Defined here, below the CLI layer (:mod:`memspec.profiles` re-exports it).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

#: stateful runs are long by nature: a step draws its action, its arguments (the
#: guidance draws a few candidates and keeps the best) and its branch, so even
#: the smallest example is "large" by Hypothesis's measure; that is not a defect
#: of the strategy, and a health check failing on it would end a fuzz round
#: with no step run
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
             HealthCheck.large_base_example]

settings.register_profile(
    "ci",
    max_examples=200,
    stateful_step_count=50,
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=_SUPPRESS,
)
settings.register_profile(
    "dev",
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=_SUPPRESS,
)
settings.register_profile(
    "fuzz",
    max_examples=100_000,
    stateful_step_count=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SUPPRESS,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


def load(name: str | None = None) -> str:
    """Load the named profile (default: ``$HYPOTHESIS_PROFILE`` or ``ci``)."""
    name = name or os.environ.get("HYPOTHESIS_PROFILE", "ci")
    settings.load_profile(name)
    return name
