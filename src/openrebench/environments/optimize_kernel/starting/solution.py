"""Starting solution: a straightforward PyTorch implementation of the conditional prefix sum."""

import torch


def prefix_sum(x: torch.Tensor) -> torch.Tensor:
    """Y_i = sum over j <= i of x_j, counting x_j only when an odd number of x_k (k < j) are positive."""
    is_positive = x > 0
    positive_count = is_positive.cumsum(0)
    odd_before = torch.zeros_like(is_positive)
    odd_before[1:] = (positive_count[:-1] % 2).bool()
    terms = torch.where(odd_before, x, torch.zeros_like(x))
    return terms.cumsum(0).to(x.dtype)
