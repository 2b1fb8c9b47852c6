"""A profile a scenario names that measured another device than ``gpu.name`` is said on stderr: its
kernel times are that device's, while memory and engine terms are the scenario GPU's."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from sim.engine.deployment import measured_elsewhere

H100 = SimpleNamespace(device={"name": "H100-SXM-80GB", "system": "gpu"})
TORCH_H100 = SimpleNamespace(device={"name": "NVIDIA H100 80GB HBM3", "system": "gpu"})
CPU = SimpleNamespace(device={"name": "Intel(R) Xeon(R) Processor", "system": "cpu"})
B200 = SimpleNamespace(device={"name": "B200-SXM-180GB", "system": "gpu"})
UNKNOWN = SimpleNamespace(device={"name": "NVIDIA RTX PRO 6000", "system": "gpu"})


@pytest.mark.parametrize(
    ("profile", "gpu", "ref", "said"),
    [
        (H100, "H100-SXM-80GB", "h100-sxm", False),
        (TORCH_H100, "H100-SXM-80GB", "mine.json", False),  # torch's spelling of the same part
        (CPU, "cpu", "cpu-reference", False),
        (CPU, "cpu", "mine.json", False),
        (B200, "GB200-186GB", "b200-sxm", False),  # the catalog prices GB200 on the B200's tables
        (UNKNOWN, "custom", "mine.json", False),  # a custom GPU takes any profile
        (CPU, "H100-SXM-80GB", "mine.json", True),
        (H100, "cpu", "h100-sxm", True),
        (H100, "H200-SXM-141GB", "h100-sxm", True),
        (UNKNOWN, "H100-SXM-80GB", "mine.json", True),
    ],
)
def test_measured_elsewhere(profile, gpu, ref, said):
    why = measured_elsewhere(profile, gpu, ref)
    assert (why is not None) == said, why
    if said:
        assert ref in why and gpu in why and profile.device["name"] in why


def test_a_run_says_it(caplog):
    from helpers import tiny_scenario
    from sim.engine.cluster import simulate

    with caplog.at_level(logging.WARNING, logger="kvsim"):
        simulate(tiny_scenario(**{"cost_model.profile": "h100-sxm"}))
    said = [r.getMessage() for r in caplog.records if "was measured on" in r.getMessage()]
    assert said and "H100-SXM-80GB" in said[0] and "gpu.name cpu" in said[0], said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kvsim"):
        simulate(tiny_scenario(**{"cost_model.profile": "cpu-reference"}))  # its own device's: nothing said
    assert not [r for r in caplog.records if "was measured on" in r.getMessage()]
