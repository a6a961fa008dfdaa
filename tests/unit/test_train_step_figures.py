"""How benchmarks/train_step.py prints a FLOP rate: three significant figures, whole GFLOP/s from
100 up. A loaded machine's smoke run once measured a matmul peak below 0.5 GFLOP/s, printed in
whole GFLOP/s as 0, and its test divided by it."""

from __future__ import annotations

import sys

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from train_step import gflop_rate  # noqa: E402

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("flops_per_second, printed", [
    (0.4e9, "0.400"), (0.0123e9, "0.0123"), (5e9, "5.00"), (12.345e9, "12.3"), (150.4e9, "150"), (764e9, "764"),
])
def test_a_rate_keeps_three_significant_figures_and_never_rounds_to_zero(flops_per_second, printed):
    assert gflop_rate(flops_per_second) == printed
