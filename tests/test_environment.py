"""The setup line: versions, device, and whether Graphviz's dot is there."""

from __future__ import annotations

import random
import re
import shutil
import subprocess

import pytest
import torch

from helpers.environment import describe_environment, pick_device, seed_everything


def test_mentions_python_torch_and_the_device():
    line = describe_environment()
    assert f"torch {torch.__version__}" in line
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert f"device: {device}" in line
    assert "\n" not in line


def test_dot_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("dot") is None
    assert "dot: missing" in describe_environment()


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot")
def test_dot_version_when_present():
    result = subprocess.run(["dot", "-V"], capture_output=True, text=True, check=True)
    version = re.search(r"version (\S+)", result.stderr or result.stdout)
    assert version
    line = describe_environment()
    assert line.endswith(f"Graphviz dot: {version.group(1)}")
    assert "missing" not in line


def test_pick_device():
    assert pick_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_seed_everything_repeats_python_and_torch_numbers():
    seed_everything(7)
    first = (random.random(), torch.rand(3))
    seed_everything(7)
    second = (random.random(), torch.rand(3))
    assert first[0] == second[0]
    assert torch.equal(first[1], second[1])
    seed_everything(8)
    assert not torch.equal(torch.rand(3), first[1])
