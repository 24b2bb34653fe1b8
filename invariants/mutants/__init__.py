"""Planted-bug mechanisms and roles: each breaks exactly one invariant."""
