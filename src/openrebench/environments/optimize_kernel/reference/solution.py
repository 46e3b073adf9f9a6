"""Reference solution of optimize_kernel: the conditional prefix sum, fast on CPUs and on CUDA GPUs.

    y[i] = sum over j <= i of x[j] * [(number of k < j with x[k] > 0) is odd]      (int32, wrapping)

CPU: a single-pass C scan (AVX-512 where the CPU has it), compiled with the system C compiler when this
module is imported and called through ctypes; on two or more threads, a reduce-then-scan split.
CUDA: a single-pass Triton scan with decoupled look-back. `prefix_sum_triton` is also usable on CPU
tensors under TRITON_INTERPRET=1, which is how the tests check it without a GPU.

Both paths rest on one fact: a block of the input is summarised, for either incoming parity, by three
numbers. With P = parity of the block's positives, Y0 = the block's sum of included terms when the parity
entering it is even, and T = the block's plain sum, the sum is Y0 if the entering parity is even and
T - Y0 if it is odd, and the parity leaving it is the entering one xor P.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
import warnings

import torch

try:  # Only the CUDA path needs Triton; the CPU path must import without it.
    import triton
    import triton.language as tl
except ImportError:
    triton = None

# ---------------------------------------------------------------------------------------------------------
# CPU path
# ---------------------------------------------------------------------------------------------------------

_C_SOURCE = r"""
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Running state: parity of the positives seen so far, and the running sum (uint32 wraps like int32). */
typedef struct { uint32_t par, acc; } state_t;

static void scan_scalar(const int32_t *x, int32_t *y, int64_t n, state_t *s) {
    uint32_t par = s->par, acc = s->acc;
    for (int64_t i = 0; i < n; ++i) {
        acc += (uint32_t)x[i] & (0u - par);
        y[i] = (int32_t)acc;
        par ^= (uint32_t)(x[i] > 0);
    }
    s->par = par; s->acc = acc;
}

/* Block summary for an even entering parity: p = parity of positives, y0 = included sum, t = plain sum. */
static void reduce_scalar(const int32_t *x, int64_t n, uint32_t *p, uint32_t *y0, uint32_t *t) {
    uint32_t par = 0, a = 0, b = 0;
    for (int64_t i = 0; i < n; ++i) {
        a += (uint32_t)x[i] & (0u - par);
        b += (uint32_t)x[i];
        par ^= (uint32_t)(x[i] > 0);
    }
    *p = par; *y0 = a; *t = b;
}

static int have_avx512 = 0;

#if defined(__x86_64__)
#define AVX512 __attribute__((target("avx512f,avx512bw")))

/* 16 lanes at a time: the parities come from a prefix xor of the 16-bit "x > 0" mask in a general
   register; the included values are then prefix-summed in the vector register in four shift-adds. */
AVX512 static void scan_avx512(const int32_t *x, int32_t *y, int64_t n, state_t *s) {
    int64_t head = (int64_t)((64 - ((uintptr_t)y & 63)) & 63) / 4;  /* align the stores */
    if ((uintptr_t)y & 3 || head > n) head = n;
    scan_scalar(x, y, head, s);
    const __m512i zero = _mm512_setzero_si512();
    const __m512i last = _mm512_set1_epi32(15);
    __m512i carry = _mm512_set1_epi32((int32_t)s->acc);
    uint32_t par = s->par;
    int64_t i = head;
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_loadu_si512((const void *)(x + i));
        uint32_t m = (uint32_t)_mm512_cmpgt_epi32_mask(v, zero);
        uint32_t p = m ^ (m << 1);
        p ^= p << 2; p ^= p << 4; p ^= p << 8;   /* bit j: parity of the positives in lanes 0..j */
        uint32_t incl = (p << 1) ^ (0u - par);    /* bit j: parity before lane j is odd */
        par ^= (p >> 15) & 1u;
        __m512i t = _mm512_maskz_mov_epi32((__mmask16)incl, v);
        t = _mm512_add_epi32(t, _mm512_alignr_epi32(t, zero, 15));
        t = _mm512_add_epi32(t, _mm512_alignr_epi32(t, zero, 14));
        t = _mm512_add_epi32(t, _mm512_alignr_epi32(t, zero, 12));
        t = _mm512_add_epi32(t, _mm512_alignr_epi32(t, zero, 8));
        _mm512_storeu_si512((void *)(y + i), _mm512_add_epi32(t, carry));
        carry = _mm512_add_epi32(carry, _mm512_permutexvar_epi32(last, t));
    }
    s->par = par;
    s->acc = (uint32_t)_mm_cvtsi128_si32(_mm512_castsi512_si128(carry));
    scan_scalar(x + i, y + i, n - i, s);
}

AVX512 static void reduce_avx512(const int32_t *x, int64_t n, uint32_t *pp, uint32_t *y0, uint32_t *t) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i a = zero, b = zero;
    uint32_t par = 0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_loadu_si512((const void *)(x + i));
        uint32_t m = (uint32_t)_mm512_cmpgt_epi32_mask(v, zero);
        uint32_t p = m ^ (m << 1);
        p ^= p << 2; p ^= p << 4; p ^= p << 8;
        uint32_t incl = (p << 1) ^ (0u - par);
        par ^= (p >> 15) & 1u;
        a = _mm512_mask_add_epi32(a, (__mmask16)incl, a, v);
        b = _mm512_add_epi32(b, v);
    }
    uint32_t tp, ta, tb;
    reduce_scalar(x + i, n - i, &tp, &ta, &tb);
    uint32_t sa = (uint32_t)_mm512_reduce_add_epi32(a), sb = (uint32_t)_mm512_reduce_add_epi32(b);
    *pp = par ^ tp;
    *y0 = sa + (par ? tb - ta : ta);   /* the tail enters with parity `par` */
    *t = sb + tb;
}
#endif

static void scan(const int32_t *x, int32_t *y, int64_t n, state_t *s) {
#if defined(__x86_64__)
    if (have_avx512) { scan_avx512(x, y, n, s); return; }
#endif
    scan_scalar(x, y, n, s);
}

static void reduce(const int32_t *x, int64_t n, uint32_t *p, uint32_t *y0, uint32_t *t) {
#if defined(__x86_64__)
    if (have_avx512) { reduce_avx512(x, n, p, y0, t); return; }
#endif
    reduce_scalar(x, n, p, y0, t);
}

/* A fresh output costs one page fault per 4 KiB page on first touch, which in a VM can cost several
   times the scan itself. Asking for huge pages and pre-faulting in one call is much cheaper. Both are
   hints: where they fail (old kernel, THP off) the ordinary faults happen instead. */
static void prepare_output(int32_t *y, int64_t n) {
#if defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)1 << 21;
    uintptr_t a = ((uintptr_t)y + huge - 1) & ~(huge - 1), e = ((uintptr_t)(y + n)) & ~(huge - 1);
    if (e > a) madvise((void *)a, e - a, MADV_HUGEPAGE);
#endif
    uintptr_t p = (uintptr_t)y & ~(uintptr_t)4095;
    madvise((void *)p, (uintptr_t)(y + n) - p, 23 /* MADV_POPULATE_WRITE, Linux >= 5.14 */);
}

/* The helper thread's share: x and y point at chunk B, followed by chunk C. */
typedef struct { const int32_t *x; int32_t *y; int64_t nb, nc; uint32_t p, y0, t; state_t s; } job_t;

static void *summarise_b_prepare_bc(void *arg) {
    job_t *j = (job_t *)arg;
    reduce(j->x, j->nb, &j->p, &j->y0, &j->t);
    prepare_output(j->y, j->nb + j->nc);
    return 0;
}

static void *scan_c(void *arg) {
    job_t *j = (job_t *)arg;
    scan(j->x + j->nb, j->y + j->nb, j->nc, &j->s);
    return 0;
}

int cps_init(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
    return have_avx512;
}

/* Two threads, chunks A | B | C. Phase 1: this thread pre-faults and scans A while the helper summarises
   B and pre-faults B and C. Phase 2: the carries of A and A+B are known; this thread scans B, the helper
   C. A is larger than B = C because summarising is cheaper than scanning. */
void cps_prefix_sum(const int32_t *x, int32_t *y, int64_t n, int threads) {
    state_t s = {0, 0};
    pthread_t th;
    int64_t a = (n * 2 / 5) & ~(int64_t)63, b = ((n - a) / 2) & ~(int64_t)63;
    job_t j = {x + a, y + a, b, n - a - b, 0, 0, 0, {0, 0}};
    if (threads < 2 || n < (1 << 18) || pthread_create(&th, 0, summarise_b_prepare_bc, &j)) {
        if (n >= (1 << 18)) prepare_output(y, n);
        scan(x, y, n, &s);
        return;
    }
    prepare_output(y, a);
    scan(x, y, a, &s);
    pthread_join(th, 0);
    j.s.par = s.par ^ j.p;
    j.s.acc = s.acc + (s.par ? j.t - j.y0 : j.y0);
    if (pthread_create(&th, 0, scan_c, &j)) {
        scan_c(&j);
        scan(x + a, y + a, b, &s);
        return;
    }
    scan(x + a, y + a, b, &s);
    pthread_join(th, 0);
}
"""


def _build_c_library() -> ctypes.CDLL | None:
    """Compile the C scan into a private temporary directory; None (with a warning) if that fails."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        warnings.warn("no C compiler found: prefix_sum falls back to a slower PyTorch version", stacklevel=2)
        return None
    workdir = tempfile.mkdtemp(prefix="prefix_sum_")
    try:
        source, library = os.path.join(workdir, "scan.c"), os.path.join(workdir, "scan.so")
        with open(source, "w") as f:
            f.write(_C_SOURCE)
        # Plain -O3 (no -march=native): the vector code is chosen at run time, so the library is portable.
        subprocess.run([compiler, "-O3", "-shared", "-fPIC", "-pthread", "-o", library, source],
                       check=True, capture_output=True, text=True)
        lib = ctypes.CDLL(library)
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        warnings.warn(f"compiling the C scan failed, using a slower PyTorch version: {detail}", stacklevel=2)
        return None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # the loaded library stays mapped
    lib.cps_init.restype = ctypes.c_int
    lib.cps_prefix_sum.restype = None
    lib.cps_prefix_sum.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    lib.cps_init()
    return lib


_LIB = _build_c_library()


def _prefix_sum_torch(x: torch.Tensor) -> torch.Tensor:
    """Vectorised fallback (no C compiler, or not int32): two cumulative sums."""
    is_positive = (x > 0).to(torch.int64)
    odd_before = (is_positive.cumsum(0) - is_positive) & 1
    return (x.to(torch.int64) * odd_before).cumsum(0).to(x.dtype)


def prefix_sum_cpu(x: torch.Tensor) -> torch.Tensor:
    """The C scan on a CPU tensor, on up to two threads (torch's thread setting is respected)."""
    if _LIB is None or x.dtype != torch.int32:
        return _prefix_sum_torch(x)
    x = x.contiguous()
    y = torch.empty_like(x)
    if x.numel():
        _LIB.cps_prefix_sum(x.data_ptr(), y.data_ptr(), x.numel(), torch.get_num_threads())
    return y


# ---------------------------------------------------------------------------------------------------------
# CUDA path: one Triton kernel, a chained scan with decoupled look-back
# ---------------------------------------------------------------------------------------------------------
#
# Each block (BLOCK elements) publishes, in a status word of its own, first its aggregate (P, Y0; T goes
# into a second word) and, once it knows what enters it, its inclusive prefix (parity and running sum
# after it). A block finds what enters it by looking back over its predecessors, WINDOW at a time,
# folding their aggregates until it meets a published prefix. Everything a reader needs travels inside
# one 64-bit word that is written atomically, so no memory fence is needed:
#     bits 0..31: a value (Y0 for an aggregate, the running sum for a prefix), bit 32: parity,
#     bits 33..34: status (0 = nothing yet, 1 = aggregate, 2 = prefix).
# The second word holds T with bit 32 set, so that 0 still means "not yet written".
# Blocks take their index from an atomic counter rather than program_id: a block then only waits for
# blocks that have already started, so the waiting cannot deadlock whatever order the GPU schedules in.

if triton is not None:

    @triton.jit
    def _word(status: tl.constexpr, parity, value):
        """Pack a status word: the int32 value's bits, then the parity, then the status."""
        return value.to(tl.uint32, bitcast=True).to(tl.int64) | (parity.to(tl.int64) << 32) | (status << 33)

    @triton.jit
    def _prefix_sum_kernel(x_ptr, y_ptr, state_ptr, counter_ptr, n, BLOCK: tl.constexpr, WINDOW: tl.constexpr,
                           PREFIX_EVERY: tl.constexpr):
        block = tl.atomic_add(counter_ptr, 1)
        offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        in_range = offsets < n
        x = tl.load(x_ptr + offsets, mask=in_range, other=0)
        positive = (x > 0).to(tl.int32)
        odd_before = (tl.cumsum(positive, axis=0) - positive) & 1  # within the block
        block_parity = tl.sum(positive, axis=0) & 1
        block_y0 = tl.sum(x * odd_before, axis=0)
        block_total = tl.sum(x, axis=0)

        if block == 0:
            carry_parity = block_parity * 0
            carry = block_y0 * 0
        else:
            tl.atomic_xchg(state_ptr + 2 * block + 1, _word(0, block_parity * 0 + 1, block_total))
            tl.atomic_xchg(state_ptr + 2 * block, _word(1, block_parity, block_y0))
            # Aggregate (parity, y0, total) of the blocks between the look-back position and this block.
            agg_parity = block_parity * 0
            agg_y0 = block_y0 * 0
            agg_total = block_y0 * 0
            carry_parity = block_parity * 0
            carry = block_y0 * 0
            end = block
            found = block * 0
            lane = tl.arange(0, WINDOW)
            while found == 0:
                index = end - WINDOW + lane
                exists = index >= 0
                # Blocks before 0 read as a prefix of zero, so the first window always ends the search.
                word = tl.load(state_ptr + 2 * index, mask=exists, other=2 << 33, volatile=True)
                # A block that published a prefix had seen every earlier block's aggregate, so waiting for
                # the whole window never waits for more than the blocks we need.
                while tl.min(word, axis=0) == 0:
                    word = tl.load(state_ptr + 2 * index, mask=exists, other=2 << 33, volatile=True)
                last_prefix = tl.max(tl.where((word >> 33) == 2, lane, -1), axis=0)
                fold = lane > last_prefix
                total_word = tl.load(state_ptr + 2 * index + 1, mask=fold, other=1 << 32, volatile=True)
                while tl.min(total_word, axis=0) == 0:
                    total_word = tl.load(state_ptr + 2 * index + 1, mask=fold, other=1 << 32, volatile=True)
                parity = ((word >> 32) & 1).to(tl.int32)
                value = word.to(tl.int32)
                total = total_word.to(tl.int32)
                fold_parity = tl.where(fold, parity, 0)
                entering = (tl.cumsum(fold_parity, axis=0) - fold_parity) & 1
                window_parity = tl.sum(fold_parity, axis=0) & 1
                window_y0 = tl.sum(tl.where(fold, tl.where(entering == 1, total - value, value), 0), axis=0)
                window_total = tl.sum(tl.where(fold, total, 0), axis=0)
                # The window's blocks come before the aggregate's: fold them in front of it.
                agg_y0 = window_y0 + tl.where(window_parity == 1, agg_total - agg_y0, agg_y0)
                agg_total = window_total + agg_total
                agg_parity = window_parity ^ agg_parity
                if last_prefix >= 0:
                    prefix_parity = tl.sum(tl.where(lane == last_prefix, parity, 0), axis=0)
                    prefix_value = tl.sum(tl.where(lane == last_prefix, value, 0), axis=0)
                    carry_parity = prefix_parity ^ agg_parity
                    carry = prefix_value + tl.where(prefix_parity == 1, agg_total - agg_y0, agg_y0)
                    found = found + 1
                end = end - WINDOW

        if block % PREFIX_EVERY == 0:  # always, except when tests make the look-back fold many aggregates
            block_sum = tl.where(carry_parity == 1, block_total - block_y0, block_y0)
            tl.atomic_xchg(state_ptr + 2 * block, _word(2, carry_parity ^ block_parity, carry + block_sum))
        terms = tl.where((odd_before ^ carry_parity) == 1, x, 0)
        tl.store(y_ptr + offsets, carry + tl.cumsum(terms, axis=0), mask=in_range)


def prefix_sum_triton(x: torch.Tensor, block: int = 8192, window: int = 32, num_warps: int = 8,
                      prefix_every: int = 1) -> torch.Tensor:
    """The Triton scan: on a CUDA tensor, or on a CPU tensor when TRITON_INTERPRET=1 was set before import.

    prefix_every > 1 is for tests: only every prefix_every-th block publishes its prefix, so the look-back
    must fold aggregates across several windows (which the interpreter, running blocks in order, never does).
    """
    if triton is None:
        raise RuntimeError("prefix_sum_triton needs Triton, which is not installed")
    if x.dtype != torch.int32:
        raise TypeError(f"prefix_sum_triton takes int32 input, got {x.dtype}")
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    num_blocks = triton.cdiv(n, block)
    # Status words (two a block) and the block counter, zeroed by one fill.
    state = torch.zeros(2 * num_blocks + 1, dtype=torch.int64, device=x.device)
    counter = state[2 * num_blocks:].view(torch.int32)
    _prefix_sum_kernel[(num_blocks,)](x, y, state, counter, n, BLOCK=block, WINDOW=window,
                                       PREFIX_EVERY=prefix_every, num_warps=num_warps)
    return y


def prefix_sum(x: torch.Tensor) -> torch.Tensor:
    """Y_i = sum over j <= i of x_j, counting x_j only when an odd number of x_k (k < j) are positive."""
    if x.device.type == "cuda":
        return prefix_sum_triton(x)
    return prefix_sum_cpu(x)
