"""The restricted_mlm scorer: record the agent's forward pass, check it, replay it on held-out text.

Runs in the scorer process. The agent's code runs only in the solution host, which is given two
batches of random tokens (never held-out text), and returns the graph of ATen operators its model
ran, with the constants it read. Here the graph is checked against the rules (every operator on the
allow-list, no float-to-integer flow, no writes to the input or the constants) and run on masked
windows of the held-out tokens, drawn from a fresh seed for every scoring; the masked-LM loss is
computed here from the logits the graph gives. A sample of the host's own logits is compared with
the replay, so a forward pass that computes anything the recording missed is reported as such.
Whatever fails on held-out text is reported as a fixed text, without the error's values.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from openrebench.api import ScoreResult, SolutionError, SolutionProcess, TierSpec

from ._graph import Program, RuleViolation, unpack_constants
from ._rules import ALLOWED_SUMMARY
from ._wire import receive_blob
from .params import RestrictedMLMParams

HOST_MODULE = "openrebench.environments.restricted_mlm._host"
CHECK_ROWS = 64
LOSS_FLOOR = 1.5  # the score is ln(loss - 1.5), as in the paper
# What the agent is told when the replay on held-out text fails: fixed texts, never the error's own
# (an operator's error can quote an index or a value of the held-out tokens).
HELDOUT_FAILURE = ("Invalid: the recorded forward pass failed when replayed on held-out text (an operator "
                   "raised an error on those inputs, though not on the random tokens it was recorded on).")
HELDOUT_SHAPE = ("Invalid: the forward pass gives logits of another shape on held-out text; expected "
                 "{expected}.")


def masked_batch(tokens: np.ndarray, batch: int, length: int, mask_prob: float, mask_id: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`batch` random windows of `tokens`, each position masked with probability `mask_prob`: the input
    (masked positions set to `mask_id`), the original tokens and the mask."""
    starts = torch.randint(len(tokens) - length, (batch,), generator=generator).tolist()
    original = torch.from_numpy(np.stack([np.asarray(tokens[s:s + length], dtype=np.int64) for s in starts]))
    mask = torch.rand((batch, length), generator=generator) < mask_prob
    return torch.where(mask, mask_id, original), original, mask


def _random_input(p: RestrictedMLMParams, generator: torch.Generator) -> torch.Tensor:
    """Random ordinary tokens, masked like the real inputs: what the host records the forward pass on."""
    shape = (p.eval_batch_size, p.seq_len)
    tokens = torch.randint(p.mask_id, shape, generator=generator)
    mask = torch.rand(tokens.shape, generator=generator) < p.mask_prob
    return torch.where(mask, p.mask_id, tokens)


def _receive_program(host: SolutionProcess, p: RestrictedMLMParams,
                     device: torch.device) -> tuple[Program, dict]:
    ready = host.receive(float(p.setup_timeout_s), "loading the model and recording its forward pass")
    header, blob = receive_blob(lambda: host.receive(60.0, "sending the recorded forward pass"),
                                int(p.max_graph_gb * 1024**3))
    size = header.get("graph_bytes")
    try:
        if not isinstance(size, int) or not 0 <= size <= len(blob):
            raise ValueError("bad graph size")
        graph = json.loads(blob[:size])
        sizes = graph["storage_sizes"]
        if not (isinstance(sizes, list) and all(isinstance(s, int) and s >= 0 for s in sizes)
                and sum(sizes) == len(blob) - size):
            raise ValueError("bad storage sizes")
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise SolutionError(f"the solution process sent a malformed graph ({type(e).__name__})") from None
    offsets = np.cumsum([size, *sizes]).tolist()
    storages = [blob[offsets[i]:offsets[i + 1]] for i in range(len(sizes))]
    try:
        constants = unpack_constants(graph["constants"], storages, device)
        program = Program(graph["nodes"], graph["output"], constants, device)
    except (KeyError, TypeError, AttributeError, RecursionError) as e:
        raise SolutionError(f"the solution process sent a malformed graph ({type(e).__name__})") from None
    info = {"load_s": ready.get("load_s"), "trace_s": ready.get("trace_s"), "operators": len(graph["nodes"]),
            "constants_mb": sum(sizes) / 1e6}
    return program, info


def _check_against_host(host: SolutionProcess, program: Program, x: torch.Tensor, p: RestrictedMLMParams,
                        generator: torch.Generator) -> float:
    """Replay the recorded input and compare a sample of rows with the host's own logits."""
    expected = (p.eval_batch_size, p.seq_len, p.vocab_size)
    out = program(x)
    if tuple(out.shape) != expected or not out.dtype.is_floating_point:
        raise RuleViolation(f"the recorded forward pass gives logits of shape {tuple(out.shape)} and dtype "
                            f"{out.dtype}; expected {expected} and a floating-point dtype")
    flat = torch.randperm(expected[0] * expected[1], generator=generator)[:CHECK_ROWS].tolist()
    positions = [(i // expected[1], i % expected[1]) for i in flat]
    host.send({"op": "rows", "positions": positions})
    _, blob = receive_blob(lambda: host.receive(60.0, "sending rows of its logits"),
                           4 * expected[2] * len(flat))
    theirs = torch.frombuffer(bytearray(blob), dtype=torch.float32).reshape(len(flat), expected[2])
    ours = torch.stack([out[b, t] for b, t in positions]).float().cpu()
    both_finite = torch.isfinite(theirs) & torch.isfinite(ours)
    diff = float((theirs - ours).abs()[both_finite].max()) if both_finite.any() else 0.0
    scale = 1.0 + float(ours[both_finite].abs().max()) if both_finite.any() else 1.0
    if diff > 1e-3 * scale or not torch.equal(torch.isfinite(theirs), torch.isfinite(ours)):
        raise RuleViolation(
            f"the model's logits differ from what its recorded operations compute (by up to {diff:.3g}): "
            "the forward pass computed something outside the operations that were recorded (tracing "
            "switched off, tensors changed through NumPy or other libraries, or compiled kernels)")
    return diff


def score(spec: TierSpec[RestrictedMLMParams], solution: Path, protected: Path) -> ScoreResult:
    p = spec.params
    if spec.device == "cuda" and not torch.cuda.is_available():
        return ScoreResult.invalid(f"Invalid: the {spec.name} tier needs a CUDA GPU and none is available.")
    device = torch.device(spec.device)
    threads = p.torch_threads
    if threads:  # on a 2-core machine that others share, one thread is several times faster than two
        torch.set_num_threads(threads)
    batch, length = p.eval_batch_size, p.seq_len
    vocab, mask_id = p.vocab_size, p.mask_id
    heldout = np.memmap(protected / "heldout.bin", dtype=np.uint16, mode="r")
    seed = secrets.randbits(62)
    generator = torch.Generator().manual_seed(seed)
    trace_inputs = [_random_input(p, generator) for _ in range(2)]
    started = time.perf_counter()
    try:
        with SolutionProcess(HOST_MODULE, solution) as host:
            host.send({"device": spec.device, "threads": threads, "batch_size": batch, "seq_len": length,
                       "vocab_size": vocab, "inputs": [x.flatten().tolist() for x in trace_inputs]})
            program, info = _receive_program(host, p, device)
            info["max_row_difference"] = _check_against_host(host, program, trace_inputs[0].to(device), p,
                                                             generator)
            host.send({"op": "exit"})
    except SolutionError as e:
        return ScoreResult.invalid(f"Invalid: {e}", seed=seed)
    except RuleViolation as e:
        message = str(e).rstrip(".")
        return ScoreResult.invalid(f"Invalid: {message}. Allowed in the forward pass: {ALLOWED_SUMMARY}.",
                                   seed=seed)
    recorded = time.perf_counter()

    total, count = 0.0, 0
    try:
        for _ in range(p.eval_batches):
            x, original, mask = masked_batch(heldout, batch, length, p.mask_prob, mask_id,
                                             generator)
            logits = program(x.to(device))
            if tuple(logits.shape) != (batch, length, vocab):
                return ScoreResult.invalid(HELDOUT_SHAPE.format(expected=(batch, length, vocab)), seed=seed)
            mask = mask.to(device)
            total += float(F.cross_entropy(logits[mask].float(), original.to(device)[mask], reduction="sum"))
            count += int(mask.sum())
    except Exception as e:  # a fixed description: the error's text may quote held-out tokens
        return ScoreResult.invalid(HELDOUT_FAILURE, seed=seed, error_type=type(e).__name__)
    loss = total / max(count, 1)
    details = {**info, "loss": loss, "masked_tokens": count, "sequences": batch * p.eval_batches,
               "seed": seed, "record_s": recorded - started, "eval_s": time.perf_counter() - recorded}
    if not math.isfinite(loss):
        return ScoreResult.invalid("Invalid: the model's logits on held-out text are not finite (NaN or "
                                   "inf).", **details)
    raw = math.log(max(loss - LOSS_FLOOR, 1e-6))
    return ScoreResult(raw=raw, details=details, message=(
        f"Valid: masked-LM loss {loss:.4f} on {count:,} masked tokens of held-out text "
        f"({details['operators']} operators, all allowed); score ln(loss - 1.5) = {raw:.4f}"))
