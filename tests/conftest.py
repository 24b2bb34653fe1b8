"""Test configuration: the Hypothesis profile (``ci`` unless HYPOTHESIS_PROFILE says otherwise)."""

from memspec import profiles

profiles.load()
