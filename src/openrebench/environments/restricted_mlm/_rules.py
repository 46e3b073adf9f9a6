"""The rules of restricted_mlm: which operations a forward pass may use, stated at PyTorch's operator level.

The paper's allow-list is written in Python terms (nn.Linear, nn.Embedding, matmul/@/einsum, sum, + and *,
relu, indexing and reshaping, constants). Every Python path to a computation, however it is spelled
(`torch.exp`, `getattr(torch, "exp")`, `torch.ops.aten.exp`, a Tensor method, a custom autograd Function),
ends in ATen operators, so the rule is enforced there: an operator is allowed if its packet is below.
Composite operators (linear, matmul, einsum, reshape...) never reach this level; what they decompose into
does, and is listed. One more rule closes the remaining back door: no floating-point value may flow
into an integer or boolean tensor (a cast, `copy_`, `view(dtype)`...), since integers index tables.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

# Packets of ATen operators (namespace aten) that a forward pass may run.
ALLOWED_OPS: frozenset[str] = frozenset({
    # nn.Linear, matmul, @, einsum (decomposed into these)
    "linear", "matmul", "mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "einsum",
    # nn.Embedding, gather and other indexing (indices are integers from the input or constants)
    "embedding", "gather", "index_select", "index", "take", "select", "slice", "narrow", "as_strided",
    "unfold", "diagonal", "index_put", "index_put_", "scatter", "scatter_", "scatter_add", "scatter_add_",
    "index_add", "index_add_", "index_copy", "index_copy_", "index_fill", "index_fill_", "slice_scatter",
    "select_scatter", "repeat_interleave",
    # reshaping, concatenating, copying
    "view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "unsqueeze", "squeeze", "permute",
    "transpose", "t", "flatten", "unflatten", "split", "split_with_sizes", "chunk", "unbind", "cat",
    "stack", "clone", "contiguous", "alias", "detach", "lift_fresh", "lift_fresh_copy", "repeat", "flip",
    "roll", "constant_pad_nd", "tril", "triu", "copy_", "_to_copy", "to", "view_as",
    # constants
    "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full",
    "arange", "eye", "scalar_tensor", "fill", "fill_", "zero_",
    # + and * (and their trivial relatives: a - b = a + (-1) * b), sum, relu
    "add", "add_", "sub", "sub_", "rsub", "neg", "neg_", "mul", "mul_", "addcmul", "sum", "relu", "relu_",
})

# Operators that read only the shape, dtype and device of their tensor argument, never its values.
SHAPE_ONLY_OPS: frozenset[str] = frozenset({
    "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full"})

# Overloads of allowed packets that are not allowed: reinterpreting bits (e.g. a float's exponent) is maths.
DENIED_OVERLOADS: frozenset[str] = frozenset({"aten.view.dtype"})

# Python-level functions that read tensor values into Python (or NumPy), where no operator can see what
# is computed with them: forbidden in the forward pass whatever is done afterwards.
VALUE_ESCAPES: frozenset[str] = frozenset(f"torch.Tensor.{name}" for name in (
    "numpy", "tolist", "item", "__array__", "__array_wrap__", "__float__", "__int__", "__index__", "__bool__",
    "__complex__", "__repr__", "__str__", "__format__", "data_ptr", "untyped_storage", "storage",
    "_typed_storage", "__dlpack__", "__reduce_ex__", "__getstate__", "__setstate__", "__deepcopy__",
))

# What the agent is told is allowed (the paper's wording).
ALLOWED_SUMMARY = ("nn.Linear, nn.Embedding, matmul/@/einsum, sum, elementwise + and * (and -), relu, "
                   "indexing and reshaping (slicing, gather, unsqueeze, reshape, as_strided, cat...), "
                   "constants")


def op_allowed(op: object) -> bool:
    if not isinstance(op, torch._ops.OpOverload):
        return False
    return (op.namespace == "aten" and op.overloadpacket.__name__ in ALLOWED_OPS
            and str(op) not in DENIED_OVERLOADS)


def _is_float(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point or t.dtype.is_complex


def floats_into_integers(op: torch._ops.OpOverload, inputs: Iterable[torch.Tensor],
                         outputs: Iterable[torch.Tensor]) -> bool:
    """Whether an operator turns floating-point values into integers or booleans (a step function)."""
    if op.overloadpacket.__name__ in SHAPE_ONLY_OPS or all(_is_float(o) for o in outputs):
        return False
    return any(_is_float(t) for t in inputs)


def written_args(op: torch._ops.OpOverload, args: tuple[object, ...], kwargs: dict[str, object]
                 ) -> list[torch.Tensor]:
    """The tensors an operator writes to (in-place and out= arguments), from its schema."""
    written = []
    for i, arg in enumerate(op._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            if isinstance(value, torch.Tensor):
                written.append(value)
    return written
