// tandem's own CUDA kernels for the fixed-shape steps of a Gemma 3 target (see
// src/fused.rs): each does in one launch what took several of candle's, computing in f32
// and rounding once. Types: `T` is the activations' dtype (bf16, f16 or f32).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

// The sum and the largest of `x` over the warp's lanes.
__device__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffff, x, o);
  return x;
}
__device__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, o));
  return x;
}

// `x` reduced over the block by the warp reduction `W` (`idle` where a lane has no warp to
// read; blockDim.x a multiple of 32, at most 1024).
template <float (*W)(float)> __device__ float block_reduce(float x, float idle) {
  __shared__ float part[32];
  x = W(x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) part[warp] = x;
  __syncthreads();
  x = lane < blockDim.x / 32 ? part[lane] : idle;
  return W(x);
}

// The sum of `x` over the block.
__device__ float block_sum(float x) { return block_reduce<warp_sum>(x, 0.f); }
// The largest of `x` over the block.
__device__ float block_max(float x) { return block_reduce<warp_max>(x, -INFINITY); }

// Row scatter: `dst` row `pos[r]` = `src` row `r` (positions past `dst_rows` are skipped),
// one thread per element, copied as bits (candle's scatter walks the rows serially).
template <typename T>
__device__ void scatter_rows(const unsigned int *pos, const T *src, T *dst,
                             unsigned int rows, unsigned int width, unsigned int dst_rows) {
  const unsigned int n = rows * width;
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += blockDim.x * gridDim.x) {
    const unsigned int r = i / width;
    if (pos[r] < dst_rows) dst[(size_t)pos[r] * width + i % width] = src[i];
  }
}

// The heads of fused q|k|v rows (`qkv` [m, (nh + 2 nkv) hd]): each q and k head RMS-normed
// with its weights (`qw`, `kw` [hd]) and rotated by row `r`'s `cos`/`sin`
// ([m, hd / 2], rotate-half); q heads go to `q` [m, nh, hd], k and v heads (v as is) to
// row `pos[r]` of the caches `k`/`v` [dst_rows, nkv hd]. Grid (nh + 2 nkv, m), hd / 2
// threads.
template <typename T>
__device__ void qkv_heads(const T *qkv, const T *qw, const T *kw, const T *cos, const T *sin,
                          const unsigned int *pos, T *q, T *k, T *v, unsigned int nh,
                          unsigned int nkv, unsigned int hd, unsigned int dst_rows, float eps) {
  const unsigned int head = blockIdx.x, r = blockIdx.y, half = hd / 2, i = threadIdx.x;
  const T *src = qkv + ((size_t)r * (nh + 2 * nkv) + head) * hd;
  const float a = to_f(src[i]), b = to_f(src[i + half]);
  if (head >= nh + nkv) {
    if (pos[r] < dst_rows) {
      T *dst = v + ((size_t)pos[r] * nkv + head - nh - nkv) * hd;
      dst[i] = src[i];
      dst[i + half] = src[i + half];
    }
    return;
  }
  const float scale = rsqrtf(block_sum(a * a + b * b) / hd + eps);
  const T *w = head < nh ? qw : kw;
  const float xa = a * scale * to_f(w[i]), xb = b * scale * to_f(w[i + half]);
  const float c = to_f(cos[r * half + i]), s = to_f(sin[r * half + i]);
  T *dst;
  if (head < nh) {
    dst = q + ((size_t)r * nh + head) * hd;
  } else if (pos[r] < dst_rows) {
    dst = k + ((size_t)pos[r] * nkv + head - nh) * hd;
  } else {
    return;
  }
  dst[i] = from_f<T>(xa * c - xb * s);
  dst[i + half] = from_f<T>(xa * s + xb * c);
}

// Gemma's residual with a sandwich norm: `out[0]` = `x` + rmsnorm(`a`, `w`), and where `w2`
// is given, `out[1]` = rmsnorm(`out[0]`, `w2`); rows of `cols` ([m, cols] each, `out`
// [1 or 2, m, cols]). One block per row.
template <typename T>
__device__ void add_norm(const T *x, const T *a, const T *w, const T *w2, T *out,
                         unsigned int rows, unsigned int cols, float eps) {
  const unsigned int r = blockIdx.x;
  const T *xr = x + (size_t)r * cols, *ar = a + (size_t)r * cols;
  T *o = out + (size_t)r * cols;
  float ss = 0.f;
  for (unsigned int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float t = to_f(ar[j]);
    ss += t * t;
  }
  const float scale = rsqrtf(block_sum(ss) / cols + eps);
  float ss2 = 0.f;
  for (unsigned int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float y = to_f(xr[j]) + to_f(ar[j]) * scale * to_f(w[j]);
    const T yt = from_f<T>(y);
    o[j] = yt;
    ss2 += to_f(yt) * to_f(yt);
  }
  if (w2 == nullptr) return;
  const float scale2 = rsqrtf(block_sum(ss2) / cols + eps);
  T *o2 = out + ((size_t)rows + r) * cols;
  for (unsigned int j = threadIdx.x; j < cols; j += blockDim.x) {
    o2[j] = from_f<T>(to_f(o[j]) * scale2 * to_f(w2[j]));
  }
}

// GeGLU of fused gate|up rows (`gu` [m, 2 f]): `out` [m, f] = gelu_tanh(gate) * up.
template <typename T>
__device__ void geglu(const T *gu, T *out, unsigned int rows, unsigned int f) {
  const unsigned int n = rows * f;
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += blockDim.x * gridDim.x) {
    const unsigned int r = i / f, j = i % f;
    const float g = to_f(gu[(size_t)r * 2 * f + j]), u = to_f(gu[(size_t)r * 2 * f + f + j]);
    const float t = tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g));
    out[i] = from_f<T>(0.5f * g * (1.f + t) * u);
  }
}

// The sum of `x` over the warps before this one (one value a warp, the same in each of
// its lanes), and in `*total` over the block (blockDim.x a multiple of 32, at most 1024).
__device__ float warps_before(float x, float *total) {
  __shared__ float warps[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) warps[warp] = x;
  __syncthreads();
  if (warp == 0) {
    float w = lane < nw ? warps[lane] : 0.f;
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffff, w, o);
      if (lane >= o) w += y;
    }
    warps[lane] = w;
  }
  __syncthreads();
  *total = warps[nw - 1];
  const float before = warp == 0 ? 0.f : warps[warp - 1];
  __syncthreads();
  return before;
}

// One position of a sampled draft, in one block of 1024 threads: the proposal of `logits`
// [n] at one over the temperature `*inv_t` (the softmax without the ids whose probability
// is below `floor`, renormalised) and the id the uniform `*u` draws from it: the first id
// whose running sum passes `*u`, among ids with mass, or the last id with mass where none
// does (tandem_core's SparseDist::draw). The kept ids, ascending, and their probabilities
// go to `ids` and `probs` from offset `ends[0]` on, and the offset past them to `ends[1]`
// (so the positions of a block follow each other in one buffer); the drawn id to `*pick`.
// Warp w holds the ids of rows w * rows .. (w + 1) * rows of 32 (each lane one column, so
// reads are coalesced); the warp the draw lands in is found from the warps' masses, the row
// from its rows', the id by a scan of that row, and the smallest id any warp finds wins.
extern "C" __global__ void draw_row_f32(const float *logits, const float *inv_t,
                                        const float *u, float floor, unsigned int *ids,
                                        float *probs, unsigned int *ends, unsigned int *pick,
                                        unsigned int n) {
  __shared__ unsigned int found, counts[32];
  __shared__ int last_kept;
  const unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  const unsigned int rows = (n + 32 * nw - 1) / (32 * nw), first = warp * rows * 32 + lane;
  const float s = *inv_t;
  if (threadIdx.x == 0) {
    found = n;
    last_kept = -1;
  }
  float m = -INFINITY;
  for (unsigned int r = 0, i = first; r < rows; r++, i += 32)
    if (i < n) m = fmaxf(m, logits[i] * s);
  m = block_max(m);
  float sum = 0.f;
  for (unsigned int r = 0, i = first; r < rows; r++, i += 32)
    if (i < n) sum += expf(logits[i] * s - m);
  const float inv_total = 1.f / block_sum(sum);
  float mass = 0.f;
  unsigned int count = 0;
  int last = -1;
  for (unsigned int r = 0, i = first; r < rows; r++, i += 32) {
    const float p = i < n ? expf(logits[i] * s - m) * inv_total : 0.f;
    if (p >= floor && i < n) {
      mass += p;
      count++;
      last = (int)i;
    }
  }
  if (last >= 0) atomicMax(&last_kept, last);
  const float warp_mass = warp_sum(mass);
  for (int o = 16; o > 0; o >>= 1) count += __shfl_xor_sync(0xffffffff, count, o);
  if (lane == 0) counts[warp] = count;
  float kept;
  const float before = warps_before(warp_mass, &kept);
  const float target = *u * kept;
  if (warp_mass > 0.f && target < before + warp_mass) {
    float acc = before;
    for (unsigned int r = 0, i = first; r < rows; r++, i += 32) {
      const float p = i < n ? expf(logits[i] * s - m) * inv_total : 0.f;
      const float q = p >= floor ? p : 0.f;
      float inc = q;
      for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffff, inc, o);
        if (lane >= o) inc += y;
      }
      const unsigned int past = __ballot_sync(0xffffffff, q > 0.f && target < acc + inc);
      if (past != 0) {
        if (lane == 0) atomicMin(&found, i - lane + __ffs(past) - 1);
        break;
      }
      acc += __shfl_sync(0xffffffff, inc, 31);
    }
  }
  __syncthreads();
  unsigned int at = ends[0];
  for (unsigned int w = 0; w < warp; w++) at += counts[w];
  for (unsigned int r = 0, i = first; r < rows; r++, i += 32) {
    const float p = i < n ? expf(logits[i] * s - m) * inv_total : 0.f;
    const bool keep = i < n && p >= floor;
    const unsigned int held = __ballot_sync(0xffffffff, keep);
    if (keep) {
      const unsigned int k = at + __popc(held & ((1u << lane) - 1));
      ids[k] = i;
      probs[k] = p / kept;
    }
    at += __popc(held);
  }
  if (threadIdx.x == blockDim.x - 1) ends[1] = at;
  if (threadIdx.x == 0) *pick = found < n ? found : (unsigned int)max(last_kept, 0);
}

#define EXPORT(T, S)                                                                        \
  extern "C" __global__ void scatter_rows_##S(const unsigned int *pos, const T *src, T *dst, \
                                              unsigned int rows, unsigned int width,        \
                                              unsigned int dst_rows) {                      \
    scatter_rows(pos, src, dst, rows, width, dst_rows);                                     \
  }                                                                                         \
  extern "C" __global__ void qkv_heads_##S(const T *qkv, const T *qw, const T *kw,         \
                                           const T *cos, const T *sin,                      \
                                           const unsigned int *pos, T *q, T *k, T *v,       \
                                           unsigned int nh, unsigned int nkv,               \
                                           unsigned int hd, unsigned int dst_rows,          \
                                           float eps) {                                     \
    qkv_heads(qkv, qw, kw, cos, sin, pos, q, k, v, nh, nkv, hd, dst_rows, eps);             \
  }                                                                                         \
  extern "C" __global__ void add_norm_##S(const T *x, const T *a, const T *w, const T *w2,  \
                                          T *out, unsigned int rows, unsigned int cols,     \
                                          float eps) {                                      \
    add_norm(x, a, w, w2, out, rows, cols, eps);                                            \
  }                                                                                         \
  extern "C" __global__ void geglu_##S(const T *gu, T *out, unsigned int rows,             \
                                       unsigned int f) {                                    \
    geglu(gu, out, rows, f);                                                                \
  }

EXPORT(float, f32)
EXPORT(__nv_bfloat16, bf16)
EXPORT(__half, f16)
