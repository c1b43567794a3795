#!/usr/bin/env python
"""Measurement, not engine: the DMFT response recursion as one compiled, fused pass per step (README, *Speed*, `dmft`).

The engine (``dmft.run_dmft``) forms, for each s < t, K = Σ_p B_{t,p} χ(p, s) with BLAS products and then
χ(t, s) = J_t K and R_F(t, s) = δ E χ(t, s) (chapter 1, ``eq-ch1-sample``). This script times that update, over a
whole run of T steps with random B and J of the engine's sizes, two ways on the same numbers:

* ``torch``: the engine's own loop (χ stored per s as [(p − s, b), (c, n)], products in blocks of 48 rows);
* ``fused``: a C++ kernel (built with torch's ``load_inline``, gcc, -O3 -march=native) that stores χ in tiles of 128
  paths, so that each (s, tile) reads one contiguous block, and does K, J·K and the path sum in one pass per step.

It prints both times, their agreement (relative max difference of R_F) and the bytes the recursion must move against
a copy bandwidth measured in the same process. It is kept to reproduce the README's numbers; the engine does not use
it (adopting it changes every DMFT result's code version: see the README).

    .venv/bin/python scripts/fused_recursion.py --T 60 --N 20000 --m 4
"""
import argparse
import time

import torch
from torch.utils.cpp_extension import load_inline

K_ROWS = 48  # as dmft.K_ROWS
NC = 128
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
      const int64_t s = job / nchunks, ch = job % nchunks;
      const int64_t blk = (T + 1 - s) * m * m * NC, R = (t - s) * m;
      double* C = X + o[s] + ch * blk;
      double* a_out = acc.data() + (s * nchunks + ch) * mm;
      if (m == 4) job_<4>(C, B + s * m, ldb, Jp, N, R, ch * NC, std::min(NC, N - ch * NC), a_out);
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


def build():
    return load_inline("grokspectra_fused_recursion", cpp_sources=SRC, functions=["step", "init"],
                       extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"])


def run(kind, T, N, m, mod, store):
    g = torch.Generator().manual_seed(1)
    f64 = dict(dtype=torch.float64)
    RF = torch.zeros(T + 1, m, m, **f64)
    if kind == "fused":
        nch = -(-N // NC)
        off = [0]
        for t in range(T + 1):
            off.append(off[-1] + nch * (T + 1 - t) * m * m * NC)
        offt = torch.tensor(off[:-1], dtype=torch.int64)
        out = torch.empty(T + 1, m, m, **f64)
    else:
        off = [0]
        for t in range(T + 1):
            off.append(off[-1] + (T + 1 - t) * m * N * m)
        Chi, Kb = [], torch.empty(m * m * N, **f64)
    if store.get(kind) is None or store[kind].numel() < off[-1]:
        store[kind] = torch.zeros(off[-1], **f64)  # touched once, reused: as inside dmft.reuse_memory()
    chi = store[kind]
    wall = 0.0
    for t in range(T + 1):
        J = torch.randn(m, m, N, generator=g, **f64) * 0.3
        Brow = torch.randn(m, max(t, 1) * m, generator=g, **f64) / max(t, 1) ** 0.5
        t0 = time.perf_counter()
        if kind == "fused":
            mod.init(chi, offt, J, t, T)
            if t > 0:
                mod.step(chi, offt, Brow, J, t, T, out)
                RF[:t] += out[:t]
        else:
            Chi.append(chi[off[t]:off[t + 1]].view((T + 1 - t) * m, N * m))
            Chi[t][:m] = J.view(m, m * N)
            K = Kb.view(m, m, N)
            for s in range(t):
                Kf, Cs, Bs = K.view(m, m * N), Chi[s], Brow[:, s * m:]
                torch.mm(Bs[:, :K_ROWS], Cs[:min(K_ROWS, (t - s) * m)], out=Kf)
                for r in range(K_ROWS, (t - s) * m, K_ROWS):
                    Kf.addmm_(Bs[:, r:r + K_ROWS], Cs[r:min(r + K_ROWS, (t - s) * m)])
                new = torch.mul(J[:, 0, None], K[0], out=Chi[s][(t - s) * m:(t - s + 1) * m].view(m, m, N))
                for a in range(1, m):
                    new.addcmul_(J[:, a, None], K[a])
                RF[s] += new.mean(2)
        wall += time.perf_counter() - t0
    return wall, RF


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\\n")[0])
    ap.add_argument("--T", type=int, default=60)
    ap.add_argument("--N", type=int, default=20000)
    ap.add_argument("--m", type=int, default=4, choices=(1, 2, 4))
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    mod, store, times = build(), {}, {"torch": [], "fused": []}
    for _ in range(a.repeats):
        for kind in ("torch", "fused"):
            w, RF = run(kind, a.T, a.N, a.m, mod, store)
            times[kind].append(w)
            store["RF_" + kind] = RF
    ref, new = store["RF_torch"], store["RF_fused"]
    nbytes = 8.0 * sum((t * (t + 1) // 2 + 2 * (t + 1)) * a.N * a.m * a.m for t in range(1, a.T + 1))
    x = torch.randn(2 ** 27, dtype=torch.float64)
    y = torch.empty_like(x)
    y.copy_(x)
    t0 = time.perf_counter()
    for _ in range(5):
        y.copy_(x)
    bw = 5 * 2 * x.numel() * 8 / (time.perf_counter() - t0)
    floor = nbytes / bw
    print(f"T={a.T} N={a.N} m={a.m} threads={torch.get_num_threads()}: recursion bytes {nbytes / 1e9:.1f} GB, copy "
          f"{bw / 1e9:.1f} GB/s, floor {floor:.2f} s")
    for kind in ("torch", "fused"):
        best = min(times[kind])
        print(f"  {kind}: best {best:.2f} s of {[round(v, 2) for v in times[kind]]} = {best / floor:.2f}x the floor")
    print(f"  agreement of R_F: {((ref - new).abs().max() / ref.abs().max()).item():.1e} relative")


if __name__ == "__main__":
    main()
