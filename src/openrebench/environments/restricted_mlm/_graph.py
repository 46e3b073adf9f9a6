"""A forward pass as a graph of ATen operators: recorded in the solution's process, replayed by the scorer.

Recording (in the solution host) runs the agent's `model(x)` under a TorchFunctionMode, which names the
Python-level function being called and refuses those that read tensor values into Python, and a
TorchDispatchMode, which sees every ATen operator whatever Python path led to it, refuses those off the
allow-list and writes each allowed one down: operator, arguments (references to the input, to earlier
results or to constants; plain values as they are) and results.

Replaying (in the scorer) checks the graph against the same rules and runs it on held-out data. What is
scored is what the graph computes, so nothing the solution's process does beyond reporting a graph can
change the score: a graph of allowed operators over fixed constants is a model within the rules by
definition, whatever produced it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, resolve_name
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from ._rules import ALLOWED_OPS, VALUE_ESCAPES, floats_into_integers, op_allowed, written_args

MAX_NODES = 200_000
MAX_CONSTANTS = 100_000
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in (
    "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")}
MEMORY_FORMATS = {f"torch.{name}": getattr(torch, name)
                  for name in ("contiguous_format", "preserve_format", "channels_last")}
_OP_NAME = re.compile(r"aten\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)")


class RuleViolation(Exception):
    """The forward pass broke a rule; the message is for the agent."""


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _storage_key(t: torch.Tensor) -> tuple[str, int] | None:
    """Which memory a tensor lives in (None for empty storage, which nothing can write to)."""
    storage = t.untyped_storage()
    return (str(t.device), storage.data_ptr()) if storage.nbytes() else None


# ---------------------------------------------------------------- recording (solution host)

@dataclass
class Trace:
    """One recorded forward pass: JSON-able nodes and output reference, the constants it read, its output."""

    nodes: list[dict[str, Any]]
    output_ref: dict[str, Any]
    constants: list[torch.Tensor]
    output: torch.Tensor


class _Recorder:
    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self.nodes: list[dict[str, Any]] = []
        self.refs: WeakIdKeyDictionary = WeakIdKeyDictionary()  # result tensor -> its reference
        self.constants: list[torch.Tensor] = []  # strong references keep ids unique
        self.constant_index: dict[int, int] = {}
        self.fixed_storages = {_storage_key(x)} - {None}  # the input's and the constants': never written
        self.python_name: str | None = None
        self.violation: str | None = None

    def fail(self, message: str) -> None:
        if self.violation is None:  # the first one counts, even if the model catches the exception
            self.violation = message
        raise RuleViolation(message)

    def describe(self, op: str) -> str:
        name = self.python_name
        return f"{name} ({op})" if name and name != op and not op.startswith(f"{name}.") else op

    def encode(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if type(value) not in (torch.Tensor, torch.nn.Parameter):
                self.fail(f"the forward pass uses a tensor subclass ({type(value).__name__}); "
                          "use plain tensors and parameters")
            ref = self.refs.get(value)
            if ref is not None:
                return ref
            if value is self.x:
                return {"x": 0}
            index = self.constant_index.get(id(value))
            if index is None:
                index = self.constant_index[id(value)] = len(self.constants)
                self.constants.append(value)
                if (key := _storage_key(value)) is not None:
                    self.fixed_storages.add(key)
            return {"c": index}
        if isinstance(value, list | tuple):
            return [self.encode(v) for v in value]
        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, torch.dtype):
            return {"dtype": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {"device": str(value)}
        if isinstance(value, torch.layout):
            return {"layout": str(value)}
        if isinstance(value, torch.memory_format):
            return {"memory_format": str(value)}
        return self.fail(f"an operator in the forward pass got an argument of type {type(value).__name__}, "
                         "which the scorer cannot replay")

    def record(self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        name = str(op)
        if not op_allowed(op):
            self.fail(f"the forward pass uses a forbidden operation: {self.describe(name)}")
        node = {"op": name, "args": self.encode(list(args)),
                "kwargs": {k: self.encode(v) for k, v in kwargs.items()}}
        for target in written_args(op, args, kwargs):
            if _storage_key(target) in self.fixed_storages:
                self.fail(f"the forward pass modifies its input or a parameter/constant in place "
                          f"({self.describe(name)})")
        out = op(*args, **kwargs)
        if floats_into_integers(op, _tensors((args, kwargs)), _tensors(out)):
            self.fail(f"the forward pass turns floating-point values into integers ({self.describe(name)})")
        index = len(self.nodes)
        if index >= MAX_NODES:
            self.fail(f"the forward pass runs more than {MAX_NODES} operators")
        self.nodes.append(node)
        if isinstance(out, torch.Tensor):
            self.refs[out] = {"n": index}
        elif isinstance(out, list | tuple):
            for k, item in enumerate(out):
                if isinstance(item, torch.Tensor):
                    self.refs[item] = {"n": index, "i": k}
        return out


class _Functions(TorchFunctionMode):
    """Names the Python-level call being made (for messages) and refuses reads of tensor values."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = resolve_name(func) or getattr(func, "__qualname__", None) or repr(func)
        if name in VALUE_ESCAPES:
            self.recorder.fail(f"the forward pass reads tensor values into Python or NumPy ({name}); "
                               "whatever is computed from them is invisible to the rules")
        outer, self.recorder.python_name = self.recorder.python_name, name
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.recorder.python_name = outer


class _Operators(TorchDispatchMode):
    """Sees every ATen operator, checks it and records it."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.recorder.record(func, tuple(args), dict(kwargs or {}))


def trace(model: torch.nn.Module, x: torch.Tensor) -> Trace:
    """Run `model(x)` once under both modes; raise RuleViolation for the first rule it breaks."""
    recorder = _Recorder(x)
    try:
        with torch.no_grad(), _Functions(recorder), _Operators(recorder):
            out = model(x)
    except BaseException:
        if recorder.violation is not None:
            raise RuleViolation(recorder.violation) from None
        raise
    if recorder.violation is not None:  # raised, caught by the model, and carried on
        raise RuleViolation(recorder.violation)
    if type(out) is not torch.Tensor:
        kind = "a tensor subclass" if isinstance(out, torch.Tensor) else type(out).__name__
        raise RuleViolation(f"the model returned {kind}; it must return a plain tensor of logits")
    output_ref = recorder.encode(out)
    return Trace(nodes=recorder.nodes, output_ref=output_ref, constants=recorder.constants, output=out)


def difference(a: Trace, b: Trace, a_constants: Packed, b_constants: Packed) -> str | None:
    """Why two traces of one model on different inputs are not one computation (None if they are)."""
    for i, (na, nb) in enumerate(zip(a.nodes, b.nodes, strict=False)):
        if na != nb:
            other = f"{nb['op']}{' with other arguments' if na['op'] == nb['op'] else ''}"
            return (f"operator {i} of the forward pass ({na['op']}) differs between two inputs ({other}): "
                    "the forward pass must be one computation for every input (it may not branch on tensor "
                    "values)")
    if len(a.nodes) != len(b.nodes) or a.output_ref != b.output_ref:
        return "the forward pass runs a different number of operators for different inputs"
    if a_constants != b_constants:
        return ("a tensor the forward pass reads changes with the input: the forward pass may use only its "
                "input, results of allowed operations and constants (computed before the forward pass)")
    return None


# ---------------------------------------------------------------- constants on the wire

Packed = tuple[list[dict[str, Any]], list[bytes]]


def pack_constants(constants: list[torch.Tensor]) -> Packed:
    """Each constant as a view (dtype, size, stride, offset) of one of the returned storages' bytes; shared
    storages stay shared, so as_strided on a constant means the same thing when replayed."""
    storages: dict[tuple[str, int] | int, int] = {}
    found: list[bytes] = []
    meta = []
    for c in constants:
        key = _storage_key(c) or -len(meta) - 1  # empty storages are never shared
        if key not in storages:
            storages[key] = len(found)
            u8 = torch.empty(0, dtype=torch.uint8, device=c.device).set_(c.untyped_storage())
            found.append(u8.cpu().numpy().tobytes())
        meta.append({"s": storages[key], "dtype": str(c.dtype).removeprefix("torch."), "size": list(c.shape),
                     "stride": list(c.stride()), "offset": c.storage_offset()})
    return meta, found


def unpack_constants(meta: list[dict[str, Any]], storages: list[bytes],
                     device: torch.device) -> list[torch.Tensor]:
    """The constants, rebuilt from bytes on `device`; sizes, strides and offsets are checked against their
    storage (as_strided refuses views that reach outside it)."""
    if len(meta) > MAX_CONSTANTS:
        raise RuleViolation(f"the forward pass reads more than {MAX_CONSTANTS} constants")
    bases = [torch.frombuffer(bytearray(b), dtype=torch.uint8).to(device) if b else
             torch.empty(0, dtype=torch.uint8, device=device) for b in storages]
    out = []
    for m in meta:
        try:
            dtype = DTYPES[m["dtype"]]
            base = bases[int(m["s"])]
            itemsize = torch.empty(0, dtype=dtype).element_size()
            usable = base[: base.numel() - base.numel() % itemsize]
            size, stride = [int(v) for v in m["size"]], [int(v) for v in m["stride"]]
            out.append(torch.as_strided(usable.view(dtype), size, stride, int(m["offset"])))
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
            raise RuleViolation(f"a constant of the forward pass cannot be replayed ({type(e).__name__}: "
                                f"{str(e)[:160]})") from None
    return out


# ---------------------------------------------------------------- replaying (scorer)

def _resolve(name: str) -> torch._ops.OpOverload:
    match = _OP_NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None or match[1] not in ALLOWED_OPS:
        raise RuleViolation(f"the forward pass uses a forbidden operation: {name}")
    packet = getattr(torch.ops.aten, match[1])
    if match[2] not in packet.overloads():
        raise RuleViolation(f"the forward pass uses an unknown operator: {name}")
    op = getattr(packet, match[2])
    if not op_allowed(op):
        raise RuleViolation(f"the forward pass uses a forbidden operation: {name}")
    return op


class Program:
    """A recorded graph, checked against the rules, that the scorer runs on its own inputs.

    The input and the constants are never written to (the constants are shared by every run), no
    floating-point value flows into an integer, and every reference points to an earlier result.
    """

    def __init__(self, nodes: list[dict[str, Any]], output_ref: Any, constants: list[torch.Tensor],
                 device: torch.device) -> None:
        if not isinstance(nodes, list) or len(nodes) > MAX_NODES:
            raise RuleViolation(f"the forward pass must be a list of at most {MAX_NODES} operators")
        self.device = device
        self.constants = constants
        self.ops = [_resolve(n.get("op") if isinstance(n, dict) else None) for n in nodes]
        self.nodes = nodes
        self.output_ref = output_ref
        self.last_use = [-1] * len(nodes)
        try:
            for i, node in enumerate(nodes):
                for n in self._refs((node.get("args"), node.get("kwargs"))):
                    if not 0 <= n < i:
                        raise RuleViolation(f"operator {i} refers to the result of operator {n}, which is "
                                            "not an earlier one")
                    self.last_use[n] = i
            for n in self._refs(output_ref):
                if not 0 <= n < len(nodes):
                    raise RuleViolation("the forward pass's output refers to no operator")
                self.last_use[n] = len(nodes)
        except RecursionError:
            raise RuleViolation("the recorded forward pass is nested too deeply") from None

    def _refs(self, value: Any) -> list[int]:
        if isinstance(value, dict):
            if "n" in value:
                return [value["n"] if isinstance(value["n"], int) else -1]
            return [n for v in value.values() for n in self._refs(v)]
        if isinstance(value, list | tuple):
            return [n for v in value for n in self._refs(v)]
        return []

    def _decode(self, value: Any, results: list[Any], x: torch.Tensor) -> Any:
        if isinstance(value, list):
            return [self._decode(v, results, x) for v in value]
        if not isinstance(value, dict):
            if value is None or isinstance(value, bool | int | float | str):
                return value
            raise RuleViolation(f"an operator argument has an unsupported type ({type(value).__name__})")
        if len(value) == 1 and "c" in value:
            return self.constants[int(value["c"])]
        if len(value) == 1 and "x" in value:
            return x
        if "n" in value and set(value) <= {"n", "i"}:
            result = results[value["n"]]
            return result[int(value["i"])] if "i" in value else result
        if len(value) == 1 and "dtype" in value and value["dtype"] in DTYPES:
            return DTYPES[value["dtype"]]
        if len(value) == 1 and "device" in value:
            return self.device
        if value == {"layout": "torch.strided"}:
            return torch.strided
        if len(value) == 1 and value.get("memory_format") in MEMORY_FORMATS:
            return MEMORY_FORMATS[value["memory_format"]]
        raise RuleViolation(f"an operator argument cannot be replayed ({str(value)[:80]})")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        fixed = {_storage_key(t) for t in (x, *self.constants)} - {None}
        results: list[Any] = [None] * len(self.nodes)
        try:
            for i, (op, node) in enumerate(zip(self.ops, self.nodes, strict=True)):
                raw_args, raw_kwargs = node.get("args", []), node.get("kwargs", {})
                if not isinstance(raw_args, list) or not isinstance(raw_kwargs, dict):
                    raise RuleViolation(f"operator {i} ({op}) has malformed arguments")
                args = self._decode(raw_args, results, x)
                kwargs = {str(k): self._decode(v, results, x) for k, v in raw_kwargs.items()}
                for target in written_args(op, tuple(args), kwargs):
                    if _storage_key(target) in fixed:
                        raise RuleViolation(f"the forward pass modifies its input or a constant in place "
                                            f"({op})")
                out = op(*args, **kwargs)
                if floats_into_integers(op, _tensors((args, kwargs)), _tensors(out)):
                    raise RuleViolation(f"the forward pass turns floating-point values into integers ({op})")
                results[i] = out if self.last_use[i] >= 0 else None
                for n in self._refs((node.get("args"), node.get("kwargs"))):
                    if self.last_use[n] == i:
                        results[n] = None
            out = self._decode(self.output_ref, results, x)
        except (RuntimeError, TypeError, ValueError, IndexError, KeyError, RecursionError) as e:
            raise RuleViolation(f"the recorded forward pass cannot be replayed ({type(e).__name__}: "
                                f"{str(e)[:200]})") from None
        if not isinstance(out, torch.Tensor):
            raise RuleViolation("the forward pass's output is not a tensor")
        return out
