"""Diagnosis libraries behind memspec's commands (no CLI code here).

:mod:`memspec.triage.oom` reads out-of-memory messages (every PyTorch format
since 1.x, the driver's, TensorFlow/JAX's) and triages them: *does it fit at
all?*, then seed 003's six causes, or an honest ``unknown``.
"""
