"""Calibration: turn measured kernel timings into a kvsim Profile.

Three routes feed the same :class:`sim.cost.profile.Profile` format: published kernel
tables (:mod:`calibration.profile_builder`), kernels timed on the local device
(:mod:`calibration.kernels`, needs torch) and, later, reference engine runs.
"""
