#!/usr/bin/env bash
# Builds `tandem` with the CUDA target path (`--features cuda`) on a machine without a GPU,
# for the lent H200 (CUDA 13.0, driver 580; docs/gpu.md has the measured facts).
#
#   scripts/build-cuda.sh [TOOLKIT_DIR] [TARGET_DIR]
#
# 1. installs the CUDA 13.0 toolkit wheels into TOOLKIT_DIR (default ~/.cache/tandem/cuda13)
#    unless already there, with the unversioned library links the linker needs;
# 2. writes a stub libcuda.so exporting every `cu*` symbol cudarc declares (the real driver
#    is found on the device at run time);
# 3. builds the release binary into TARGET_DIR (default target-cuda), its rpath pointing at
#    the device's cuBLAS/cudart, and writes a stripped, xz-compressed copy beside it.
set -euo pipefail
TOOLKIT=${1:-$HOME/.cache/tandem/cuda13}
TARGET=${2:-target-cuda}
CU=$TOOLKIT/nvidia/cu13
DEVICE_LIBS=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib

if [ ! -x "$CU/bin/nvcc" ]; then
  pip install -q --no-deps --target "$TOOLKIT" nvidia-cuda-nvcc==13.0.88 \
    nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96 \
    nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35 \
    nvidia-cuda-nvrtc==13.0.88
fi
for lib in cublas cublasLt curand nvrtc cudart; do
  real=$(ls "$CU"/lib/lib$lib.so.* | grep -E "lib$lib\.so\.[0-9]+$" | head -1)
  ln -sf "$(basename "$real")" "$CU/lib/lib$lib.so"
done

cargo fetch -q
if [ ! -f "$CU/lib/stubs/libcuda.so" ]; then
  mkdir -p "$CU/lib/stubs"
  sys=$(ls -d "$HOME"/.cargo/registry/src/*/cudarc-0.19.*/src/driver/sys | tail -1)
  grep -o "pub unsafe fn cu[A-Za-z0-9_]*" "$sys/mod.rs" | sed 's/pub unsafe fn //' | sort -u |
    awk '{print "int "$1"(void){return 999;}"}' > "$CU/lib/stubs/stub.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$CU/lib/stubs/libcuda.so" "$CU/lib/stubs/stub.c"
fi

export PATH=$CU/bin:$PATH CUDA_ROOT=$CU CUDA_HOME=$CU CUDA_PATH=$CU
export CUDA_COMPUTE_CAP=90 CUDARC_CUDA_VERSION=13000 LIBRARY_PATH=$CU/lib/stubs:$CU/lib
export RUSTFLAGS="-L $CU/lib/stubs -L $CU/lib -C link-arg=-Wl,-rpath,$DEVICE_LIBS"
CARGO_TARGET_DIR=$TARGET cargo build --release -p tandem-cli --features cuda
strip -o "$TARGET/release/tandem-cuda" "$TARGET/release/tandem"
xz -T2 -6 -kf "$TARGET/release/tandem-cuda"
ls -l "$TARGET/release/tandem-cuda" "$TARGET/release/tandem-cuda.xz"
