// Row scatter for tandem's fixed-shape CUDA steps: `dst` row `pos[r]` = `src` row `r`
// (positions past `dst`'s `dst_rows` rows are skipped), one thread per element (candle's scatter walks the scattered dimension serially, one
// thread per column: 16 rows of a 256-wide cache took 16 µs a call on an H100). Elements
// are copied as bits, so one kernel per element width serves every dtype of that width.

template <typename T>
__device__ void scatter_rows(const unsigned int *pos, const T *src, T *dst,
                             unsigned int rows, unsigned int width, unsigned int dst_rows) {
  const unsigned int n = rows * width;
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += blockDim.x * gridDim.x) {
    const unsigned int r = i / width;
    const unsigned int c = i % width;
    if (pos[r] < dst_rows) {
      dst[(size_t)pos[r] * width + c] = src[i];
    }
  }
}

extern "C" __global__ void scatter_rows_b16(const unsigned int *pos, const unsigned short *src,
                                            unsigned short *dst, unsigned int rows,
                                            unsigned int width, unsigned int dst_rows) {
  scatter_rows(pos, src, dst, rows, width, dst_rows);
}

extern "C" __global__ void scatter_rows_b32(const unsigned int *pos, const unsigned int *src,
                                            unsigned int *dst, unsigned int rows,
                                            unsigned int width, unsigned int dst_rows) {
  scatter_rows(pos, src, dst, rows, width, dst_rows);
}
