"""Pure-Python reference implementation of every role of seed 000 on an
honest simulated device.  Imports only ``memspec.spec.api`` and
``memspec.spec.errors`` from the spec."""
