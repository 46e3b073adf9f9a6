"""Reference solution of optimize_kernel: the conditional prefix sum, fast on CPUs and on CUDA GPUs.

    y[i] = sum over j <= i of x[j] * [(number of k < j with x[k] > 0) is odd]      (int32, wrapping)

CPU: a single-pass C scan (AVX-512 where the CPU has it), compiled with the system C compiler when this
module is imported and called through ctypes; on two or more threads, a reduce-then-scan split.
CUDA: a three-kernel Triton reduce-then-scan. `prefix_sum_triton` also runs on CPU tensors under
TRITON_INTERPRET=1, which is how the tests check it without a GPU.

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
/* Prefetching 8 KiB ahead made a cold (not cached) input scan 1.5x faster on the 2-core VM measured. */
#define PREFETCH 2048

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
        _mm_prefetch((const char *)(x + i + PREFETCH), _MM_HINT_T0);
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
        _mm_prefetch((const char *)(x + i + PREFETCH), _MM_HINT_T0);
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

/* Memory fresh from the kernel (glibc maps every allocation over 32 MiB afresh) costs a page fault per
   4 KiB page on first touch, which in the VM measured cost several times the scan itself. Asking for
   huge pages and pre-faulting in one call cut that by 2-3x. Only done when the output's first or last
   page is not resident yet: memory that malloc reuses gains nothing. Both calls are hints; where they
   fail, the ordinary faults happen. */
static void prepare_output(int32_t *y, int64_t n) {
    const uintptr_t page = 4096;
    uintptr_t first = (uintptr_t)y & ~(page - 1), last = ((uintptr_t)(y + n) - 1) & ~(page - 1);
    unsigned char resident[2] = {1, 1};
    if (mincore((void *)first, page, &resident[0]) || mincore((void *)last, page, &resident[1])) return;
    if ((resident[0] & 1) && (resident[1] & 1)) return;
#if defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)1 << 21;
    uintptr_t a = (first + huge - 1) & ~(huge - 1), e = ((uintptr_t)(y + n)) & ~(huge - 1);
    if (e > a) madvise((void *)a, e - a, MADV_HUGEPAGE);
#endif
    madvise((void *)first, last + page - first, 23 /* MADV_POPULATE_WRITE, Linux >= 5.14 */);
}

/* The helper thread's share: x and y point at chunk B, followed by chunk C. */
typedef struct { const int32_t *x; int32_t *y; int64_t nb, nc; uint32_t p, y0, t; state_t s; } job_t;

static void *summarise_b(void *arg) {
    job_t *j = (job_t *)arg;
    reduce(j->x, j->nb, &j->p, &j->y0, &j->t);
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

/* With two threads, chunks A | B | C. Phase 1: this thread scans A while the helper summarises B.
   Phase 2: what enters B and C is then known; this thread scans B, the helper C. A is larger than
   B = C because summarising is cheaper than scanning. Below 2^19 elements the thread costs more than
   it saves. */
void cps_prefix_sum(const int32_t *x, int32_t *y, int64_t n, int threads) {
    state_t s = {0, 0};
    pthread_t th;
    int64_t a = (n * 2 / 5) & ~(int64_t)63, b = ((n - a) / 2) & ~(int64_t)63;
    job_t j = {x + a, y + a, b, n - a - b, 0, 0, 0, {0, 0}};
    if (n >= (1 << 18)) prepare_output(y, n);
    if (threads < 2 || n < (1 << 19) || pthread_create(&th, 0, summarise_b, &j)) {
        scan(x, y, n, &s);
        return;
    }
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
        subprocess.run(
            [compiler, "-O3", "-shared", "-fPIC", "-pthread", "-o", library, source],
            check=True,
            capture_output=True,
            text=True,
        )
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
    """Vectorised fallback (no C compiler or no Triton, or not int32): two cumulative sums."""
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
# CUDA path: three Triton kernels, a reduce-then-scan
# ---------------------------------------------------------------------------------------------------------
#
# 1. One program per block of BLOCK elements writes the block's summary (P, Y0, T).
# 2. One program walks the summaries, CHUNK at a time, and overwrites P and Y0 in place with the parity and
#    the running sum that enter each block.
# 3. One program per block re-reads its block and scans it from what enters it.
# This moves 1.2 bytes for every byte a single pass would (x is read twice), but on an H200 passes 1 and 3
# each run at about the copy bandwidth (~4 TB/s), the middle pass costs ~35 us at n = 1e8, and nothing
# waits on another block. Single-pass chained scans with decoupled look-back were measured slower here
# (~470-900 us against ~330 us): in Triton the whole block takes part in every look-back step, and the
# registers a block needs cap how many blocks can have loads in flight meanwhile.
# Loops are `while` loops: Triton 3.6's interpreter (with NumPy 2) fails on range() with a run-time bound.

if triton is not None:

    @triton.jit
    def _summarise_kernel(x_ptr, parity_ptr, y0_ptr, total_ptr, n, BLOCK: tl.constexpr):
        block = tl.program_id(0)
        offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offsets, mask=offsets < n, other=0)
        positive = (x > 0).to(tl.int32)
        odd_before = (tl.cumsum(positive, axis=0) - positive) & 1
        tl.store(parity_ptr + block, tl.sum(positive, axis=0) & 1)
        tl.store(y0_ptr + block, tl.sum(x * odd_before, axis=0))
        tl.store(total_ptr + block, tl.sum(x, axis=0))

    @triton.jit
    def _carry_kernel(parity_ptr, y0_ptr, total_ptr, num_blocks, CHUNK: tl.constexpr):
        """Single program: parity_ptr[b] and y0_ptr[b] become the parity and the sum entering block b."""
        parity = tl.program_id(0) * 0
        carry = parity
        start = parity
        lane = tl.arange(0, CHUNK)
        # The next chunk's loads are issued before the current chunk is processed, to overlap their latency.
        p_next = tl.load(parity_ptr + lane, mask=lane < num_blocks, other=0)
        y0_next = tl.load(y0_ptr + lane, mask=lane < num_blocks, other=0)
        t_next = tl.load(total_ptr + lane, mask=lane < num_blocks, other=0)
        while start < num_blocks:
            p = p_next
            y0 = y0_next
            t = t_next
            index = start + lane
            following = index + CHUNK
            p_next = tl.load(parity_ptr + following, mask=following < num_blocks, other=0)
            y0_next = tl.load(y0_ptr + following, mask=following < num_blocks, other=0)
            t_next = tl.load(total_ptr + following, mask=following < num_blocks, other=0)
            entering = ((tl.cumsum(p, axis=0) - p) & 1) ^ parity
            block_sum = tl.where(entering == 1, t - y0, y0)
            tl.store(parity_ptr + index, entering, mask=index < num_blocks)
            carry_before = carry + tl.cumsum(block_sum, axis=0) - block_sum
            tl.store(y0_ptr + index, carry_before, mask=index < num_blocks)
            carry += tl.sum(block_sum, axis=0)
            parity = parity ^ (tl.sum(p, axis=0) & 1)
            start += CHUNK

    @triton.jit
    def _scan_kernel(x_ptr, y_ptr, parity_ptr, carry_ptr, n, BLOCK: tl.constexpr):
        block = tl.program_id(0)
        offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        in_range = offsets < n
        x = tl.load(x_ptr + offsets, mask=in_range, other=0)
        entering_parity = tl.load(parity_ptr + block)
        carry = tl.load(carry_ptr + block)
        positive = (x > 0).to(tl.int32)
        odd_before = ((tl.cumsum(positive, axis=0) - positive) & 1) ^ entering_parity
        terms = tl.where(odd_before == 1, x, 0)
        tl.store(y_ptr + offsets, carry + tl.cumsum(terms, axis=0), mask=in_range)


def prefix_sum_triton(
    x: torch.Tensor, block: int = 2048, num_warps: int = 4, chunk: int = 4096, chunk_warps: int = 8
) -> torch.Tensor:
    """The Triton scan: on a CUDA tensor, or on a CPU tensor when TRITON_INTERPRET=1 was set before import.

    The defaults were the fastest of those measured on an H200 at n = 1e8 (median ~330 us, against ~195 us
    for a plain copy of x): larger blocks need more registers per thread and keep fewer loads in flight.
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
    summaries = torch.empty(3 * num_blocks, dtype=torch.int32, device=x.device)
    parity, y0, total = summaries.view(3, num_blocks)
    _summarise_kernel[(num_blocks,)](x, parity, y0, total, n, BLOCK=block, num_warps=num_warps)
    _carry_kernel[(1,)](parity, y0, total, num_blocks, CHUNK=chunk, num_warps=chunk_warps)
    _scan_kernel[(num_blocks,)](x, y, parity, y0, n, BLOCK=block, num_warps=num_warps)
    return y


def prefix_sum(x: torch.Tensor) -> torch.Tensor:
    """Y_i = sum over j <= i of x_j, counting x_j only when an odd number of x_k (k < j) are positive."""
    if x.device.type == "cuda":
        return prefix_sum_triton(x) if triton is not None and x.dtype == torch.int32 else _prefix_sum_torch(x)
    return prefix_sum_cpu(x)
