"""A kernel's call runs its compiled library only on arguments of the dtypes, ranks, layout and
fixed sizes it was compiled for (`kernels.fits`); any other call runs the eager function."""

from __future__ import annotations

import torch

from whitney.local.engine import kernels

SHAPES = ((torch.float32, 3, ((1, 1),)), (torch.int64, 0, ()))
"""Rows [N, 1, K] of float32 (dim 1 fixed at 1) and a 0-dim int64."""


def test_only_the_compiled_dtypes_ranks_layout_and_fixed_sizes_run_compiled() -> None:
    kernel = kernels.Kernel(lambda *args: "eager", list, None, lambda args: ["compiled"], SHAPES)
    rows, count = torch.zeros(4, 1, 6), torch.tensor(3)
    assert kernel(rows, count) == "compiled"
    assert kernel(torch.zeros(0, 1, 1), count) == "compiled"  # dynamic sizes: any
    assert kernel(rows.double(), count) == "eager"  # dtype
    assert kernel(rows, count.int()) == "eager"
    assert kernel(rows[0], count) == "eager"  # rank
    assert kernel(rows, count[None]) == "eager"
    assert kernel(torch.zeros(4, 1, 12)[..., ::2], count) == "eager"  # layout
    assert kernel(torch.zeros(4, 2, 6), count) == "eager"  # a fixed size
