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

// The sum of `x` over the block (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float x) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffff, x, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) part[warp] = x;
  __syncthreads();
  x = lane < blockDim.x / 32 ? part[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffff, x, o);
  return x;
}

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

// The largest of `x` over the block (blockDim.x a multiple of 32, at most 1024).
__device__ float block_max(float x) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) part[warp] = x;
  __syncthreads();
  x = lane < blockDim.x / 32 ? part[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, o));
  return x;
}

// The sum of `x` over the threads before this one (thread order), and in `*total` over
// the block (blockDim.x a multiple of 32, at most 1024).
__device__ float block_scan(float x, float *total) {
  __shared__ float warps[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  float inc = x;
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(0xffffffff, inc, o);
    if (lane >= o) inc += y;
  }
  __syncthreads();
  if (lane == 31) warps[warp] = inc;
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
  const float before = (warp == 0 ? 0.f : warps[warp - 1]) + inc - x;
  __syncthreads();
  return before;
}

// One position of a sampled draft, in one block: the proposal of `logits` [n] at one over
// the temperature `*inv_t` (the softmax without the ids whose probability is below
// `floor`, renormalised) into `probs` [n], and into `*pick` the id the uniform `*u` draws
// from it: the first id whose running sum passes `*u`, among ids with mass, or the last id
// with mass where none does (tandem_core's SparseDist::draw). Each thread holds a run of
// consecutive ids; the run the draw lands in is found from the runs' masses, the id within
// it by a walk, and the smallest id any run's walk finds wins.
extern "C" __global__ void draw_row_f32(const float *logits, const float *inv_t,
                                        const float *u, float floor, float *probs,
                                        unsigned int *pick, unsigned int n) {
  __shared__ unsigned int found;
  __shared__ int last_kept;
  const unsigned int per = (n + blockDim.x - 1) / blockDim.x;
  const unsigned int lo = min(threadIdx.x * per, n), hi = min(lo + per, n);
  const float s = *inv_t;
  if (threadIdx.x == 0) {
    found = n;
    last_kept = -1;
  }
  float m = -INFINITY;
  for (unsigned int i = lo; i < hi; i++) m = fmaxf(m, logits[i] * s);
  m = block_max(m);
  float sum = 0.f;
  for (unsigned int i = lo; i < hi; i++) sum += expf(logits[i] * s - m);
  const float inv_total = 1.f / block_sum(sum);
  float mass = 0.f;
  int last = -1;
  for (unsigned int i = lo; i < hi; i++) {
    const float p = expf(logits[i] * s - m) * inv_total;
    if (p >= floor) {
      mass += p;
      last = (int)i;
    }
  }
  float kept;
  const float before = block_scan(mass, &kept);
  if (last >= 0) atomicMax(&last_kept, last);
  const float target = *u * kept;
  if (mass > 0.f && target < before + mass) {
    float acc = before;
    for (unsigned int i = lo; i < hi; i++) {
      const float p = expf(logits[i] * s - m) * inv_total;
      if (p < floor) continue;
      acc += p;
      if (target < acc) {
        atomicMin(&found, i);
        break;
      }
    }
  }
  for (unsigned int i = lo; i < hi; i++) {
    const float p = expf(logits[i] * s - m) * inv_total;
    probs[i] = p >= floor ? p / kept : 0.f;
  }
  __syncthreads();
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
