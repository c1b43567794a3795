"""The DMFT's response update as one fused pass per step (chapter 1, ``eq-ch1-sample``), compiled once per machine.

At step t the sample side needs, for every s < t,

    K = Σ_{s≤p<t} R_θ(t, p) χ(p, s),   χ(t, s) = D(u^t; y) K,   R_F(t, s) = δ E χ(t, s),

over N paths. The work is memory-bound: it streams every stored χ(p, s) once per step. Done with BLAS (a skinny
product for K, then J·K and a mean) it streams them at half the host's copy bandwidth or less on some hosts (README,
*Speed*). Here χ is stored in tiles of :data:`NC` paths, so that each (s, tile) is one contiguous block
``[(p − s, b), c, n]``, and a C++ kernel (built by ``torch.utils.cpp_extension.load_inline``, gcc -O3
-march=native, OpenMP through torch's thread pool) forms K, J·K and the tile's path sum in one pass while the tile is
in cache. Where no compiler is available, for float32 paths, for m > 4 and on a GPU, :func:`step` does the same
update on the same layout with torch calls (one batched product per s); the two agree to float64 roundoff
(``tests/test_dmft.py``). Set ``GROKSPECTRA_CHI_KERNEL=torch`` to force the torch path.

Layout (both paths): the values for s live at ``chi[off[s] : off[s + 1]]``, viewed as ``[tiles, (T + 1 − s)·m, m·NC]``:
tile k, row (p − s)·m + b, column c·NC + n holds χ(p, s)[b, c] on path k·NC + n (zero for paths ≥ N).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import warnings

import torch

NC = 128  # paths per tile (as in the kernel's source)

SRC = r'''
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <vector>
constexpr int64_t NC = 128;  // paths per tile
// tiled layout: block (s, ch) at o[s] + ch*(T+1-s)*M*M*NC, [r][c][n] with r = (p-s)*M + b
template <int M>
static void job_(double* __restrict C, const double* __restrict Bs, int64_t ldb, const double* __restrict Jp,
                 int64_t N, int64_t R, int64_t n0, int64_t nl, double* __restrict a_out) {
  alignas(64) double K[M * M * NC];
  for (int64_t i = 0; i < M * M * NC; ++i) K[i] = 0.0;
  int64_t r = 0;
  for (; r + 8 <= R; r += 8) {
    double b[M][8];
    for (int a = 0; a < M; ++a) for (int q = 0; q < 8; ++q) b[a][q] = Bs[a * ldb + r + q];
    for (int c = 0; c < M; ++c) {
      const double* __restrict x = C + (r * M + c) * NC;
      double* __restrict k = K + c * NC;
      #pragma GCC ivdep
      for (int64_t n = 0; n < NC; ++n) {
        double v[8];
        #pragma GCC unroll 8
        for (int q = 0; q < 8; ++q) v[q] = x[q * M * NC + n];
        #pragma GCC unroll 4
        for (int a = 0; a < M; ++a) {
          const double p0 = b[a][0] * v[0] + b[a][1] * v[1], p1 = b[a][2] * v[2] + b[a][3] * v[3];
          const double p2 = b[a][4] * v[4] + b[a][5] * v[5], p3 = b[a][6] * v[6] + b[a][7] * v[7];
          k[a * M * NC + n] += (p0 + p1) + (p2 + p3);
        }
      }
    }
  }
  for (; r + 4 <= R; r += 4) {
    double b[M][4];
    for (int a = 0; a < M; ++a) for (int q = 0; q < 4; ++q) b[a][q] = Bs[a * ldb + r + q];
    for (int c = 0; c < M; ++c) {
      const double* __restrict x = C + (r * M + c) * NC;
      double* __restrict k = K + c * NC;
      #pragma GCC ivdep
      for (int64_t n = 0; n < NC; ++n) {
        const double v0 = x[n], v1 = x[M * NC + n], v2 = x[2 * M * NC + n], v3 = x[3 * M * NC + n];
        #pragma GCC unroll 4
        for (int a = 0; a < M; ++a) k[a * M * NC + n] += (b[a][0] * v0 + b[a][1] * v1) + (b[a][2] * v2 + b[a][3] * v3);
      }
    }
  }
  for (; r < R; ++r)
    for (int c = 0; c < M; ++c) {
      const double* __restrict x0 = C + (r * M + c) * NC;
      for (int a = 0; a < M; ++a) {
        double* __restrict k = K + (a * M + c) * NC;
        const double b0 = Bs[a * ldb + r];
        #pragma GCC ivdep
        for (int64_t n = 0; n < NC; ++n) k[n] += b0 * x0[n];
      }
    }
  double* Y = C + (R * M) * NC;
  for (int b_ = 0; b_ < M; ++b_)
    for (int c = 0; c < M; ++c) {
      double* __restrict y = Y + (b_ * M + c) * NC;
      alignas(64) double v[NC];
      for (int64_t n = 0; n < NC; ++n) v[n] = 0.0;
      for (int a = 0; a < M; ++a) {
        const double* __restrict j = Jp + (b_ * M + a) * N + n0;
        const double* __restrict k = K + (a * M + c) * NC;
        #pragma GCC ivdep
        for (int64_t n = 0; n < nl; ++n) v[n] += j[n] * k[n];
      }
      double sum = 0.0;
      for (int64_t n = 0; n < NC; ++n) { y[n] = v[n]; }
      for (int64_t n = 0; n < nl; ++n) sum += v[n];
      a_out[b_ * M + c] = sum;
    }
}
void init(torch::Tensor chi, torch::Tensor off, torch::Tensor J, int64_t t, int64_t T) {
  const int64_t m = J.size(0), N = J.size(2), nchunks = (N + NC - 1) / NC;
  double* X = chi.data_ptr<double>() + off.data_ptr<int64_t>()[t];
  const double* Jp = J.data_ptr<double>();
  const int64_t blk = (T + 1 - t) * m * m * NC;
  at::parallel_for(0, nchunks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch)
      for (int64_t bc = 0; bc < m * m; ++bc)
        for (int64_t n = 0; n < NC; ++n) X[ch * blk + bc * NC + n] = ch * NC + n < N ? Jp[bc * N + ch * NC + n] : 0.0;
  });
}
void step(torch::Tensor chi, torch::Tensor off, torch::Tensor Brow, torch::Tensor J, int64_t t, int64_t T, torch::Tensor out) {
  const int64_t m = J.size(0), N = J.size(2);
  double* X = chi.data_ptr<double>();
  const int64_t* o = off.data_ptr<int64_t>();
  const double* B = Brow.data_ptr<double>();
  const int64_t ldb = Brow.stride(0);
  const double* Jp = J.data_ptr<double>();
  const int64_t nchunks = (N + NC - 1) / NC, mm = m * m;
  std::vector<double> acc(t * mm * nchunks, 0.0);
  at::parallel_for(0, t * nchunks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t job = lo; job < hi; ++job) {
      const int64_t ch = job / t, s = job % t;  // tile-major: each thread gets every s (the work per s varies as t − s)
      const int64_t blk = (T + 1 - s) * m * m * NC, R = (t - s) * m;
      double* C = X + o[s] + ch * blk;
      double* a_out = acc.data() + (s * nchunks + ch) * mm;
      if (m == 4) job_<4>(C, B + s * m, ldb, Jp, N, R, ch * NC, std::min(NC, N - ch * NC), a_out);
      else if (m == 3) job_<3>(C, B + s * m, ldb, Jp, N, R, ch * NC, std::min(NC, N - ch * NC), a_out);
      else if (m == 2) job_<2>(C, B + s * m, ldb, Jp, N, R, ch * NC, std::min(NC, N - ch * NC), a_out);
      else job_<1>(C, B + s * m, ldb, Jp, N, R, ch * NC, std::min(NC, N - ch * NC), a_out);
    }
  });
  double* O = out.data_ptr<double>();
  for (int64_t s = 0; s < t; ++s)
    for (int64_t i = 0; i < mm; ++i) {
      double sum = 0.0;
      for (int64_t ch = 0; ch < nchunks; ++ch) sum += acc[(s * nchunks + ch) * mm + i];
      O[s * mm + i] = sum / N;
    }
}
'''

def kernel():
    """The compiled module (``init``, ``step``), or ``None`` when it cannot be built here (a warning says why once)
    or ``GROKSPECTRA_CHI_KERNEL=torch`` asks for the torch path."""
    if os.environ.get("GROKSPECTRA_CHI_KERNEL", "").lower() == "torch":
        return None
    return _build(SRC)  # SRC named here, so that the kernel's source is part of every result's code version


def _build_dir() -> str:
    """Where the kernel is built: one directory per CPU feature set, since -march=native code built on one host may
    not run on another that shares the home directory."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        flags = ""
    tag = hashlib.sha1((flags or platform.processor() + platform.machine()).encode()).hexdigest()[:10]
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
    path = os.path.join(root, f"grokspectra_chi_kernel_{tag}")
    os.makedirs(path, exist_ok=True)
    return path


@functools.lru_cache(maxsize=None)
def _build(src: str):
    try:
        from torch.utils.cpp_extension import load_inline
        return load_inline("grokspectra_chi_kernel", cpp_sources=src, functions=["step", "init"],
                           extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
                           build_directory=_build_dir())
    except Exception as e:  # no compiler, no ninja, a failed build: the torch path gives the same numbers
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else ""
        warnings.warn(f"grokspectra.chi_kernel: the fused kernel could not be built ({type(e).__name__}: {msg}); "
                      "using the torch path, slower on some hosts, equal to roundoff", RuntimeWarning, stacklevel=3)
        return None


def offsets(T: int, N: int, m: int) -> list[int]:
    """Start of each s's values in the flat χ array (and the total, last): s has (T + 1 − s)·m rows per tile."""
    tiles = -(-N // NC)
    off = [0]
    for s in range(T + 1):
        off.append(off[-1] + tiles * (T + 1 - s) * m * m * NC)
    return off


def view(chi: torch.Tensor, off: list[int], s: int, T: int, m: int) -> torch.Tensor:
    """χ(·, s) as ``[tiles, (T + 1 − s)·m, m·NC]``."""
    n = off[s + 1] - off[s]
    return chi[off[s]:off[s + 1]].view(n // ((T + 1 - s) * m * m * NC), (T + 1 - s) * m, m * NC)


def _tiled(J: torch.Tensor, tiles: int) -> torch.Tensor:
    """J [b, a, N] as [tiles, b, a, NC], zero beyond N."""
    m, _, N = J.shape
    Jp = J.new_zeros(m, m, tiles * NC)
    Jp[..., :N] = J
    return Jp.view(m, m, tiles, NC).permute(2, 0, 1, 3)


def use_kernel(J: torch.Tensor) -> bool:
    """Whether :func:`step` will run the compiled kernel for paths like ``J`` (CPU, float64, m ≤ 4)."""
    return J.device.type == "cpu" and J.dtype == torch.float64 and J.shape[0] <= 4 and kernel() is not None


def step(chi: torch.Tensor, off: list[int], off_t: torch.Tensor | None, Brow: torch.Tensor, J: torch.Tensor, t: int,
         T: int) -> torch.Tensor:
    """Write χ(t, s) for s ≤ t into the tiled array and return E χ(t, s) for s < t, ``[t, m, m]`` (path mean).

    ``Brow`` [m, t·m] holds R_θ(t, s)[a, b] at [a, s·m + b]; ``J`` [b, a, N] = D(u^t_n; y_n)[b, a]; ``off_t`` is
    ``off`` as an int64 tensor (for the kernel)."""
    m, N = J.shape[0], J.shape[2]
    if use_kernel(J):
        mod = kernel()
        J = J.contiguous()
        mod.init(chi, off_t, J, t, T)
        out = torch.empty(max(t, 1), m, m, dtype=J.dtype)
        if t > 0:
            mod.step(chi, off_t, Brow.contiguous(), J, t, T, out)
        return out[:t]
    tiles = -(-N // NC)
    Jt = _tiled(J, tiles)  # [tiles, b, a, NC]
    view(chi, off, t, T, m)[:, :m] = Jt.reshape(tiles, m, m * NC)
    out = J.new_empty(t, m, m)
    for s in range(t):
        C, R = view(chi, off, s, T, m), (t - s) * m
        K = torch.matmul(Brow[:, s * m:t * m], C[:, :R]).view(tiles, m, m, NC)  # [tile, a, c, n]
        new = torch.einsum("kban,kacn->kbcn", Jt, K)
        C[:, R:R + m] = new.reshape(tiles, m, m * NC)
        out[s] = new.sum((0, 3)) / N
    return out
