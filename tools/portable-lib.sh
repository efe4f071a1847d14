# Shared by tools/gpu-check.sh and tools/portable-tests.sh (sourced, from the
# repository root): the portable build and the libraries that travel with it.

# build-v3/: Release, no CUDA, for x86-64-v3 (AVX2+FMA) instead of -march=native.
configure_v3() {
  cmake -S . -B build-v3 -DCMAKE_BUILD_TYPE=Release -DEXMY_CUDA=OFF -DEXMY_NATIVE=OFF \
    -DCMAKE_CXX_FLAGS="-march=x86-64-v3" >/dev/null
}

# copy_libs DEST BINARY...: the shared libraries the binaries load, all but
# the C library's own (the other machine has those) and cuBLAS's (over 500
# MB; a CUDA machine has its own: cuda_lib_path finds it), copied into DEST.
copy_libs() {
  local dest=$1
  shift
  mkdir -p "$dest"
  for b in "$@"; do
    ldd "$b" | awk '$3 ~ /^\// {print $3}'
  done | sort -u | grep -Ev '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux[^/]*|libcublas|libcublasLt)\.so' |
    while read -r lib; do cp -L "$lib" "$dest/"; done
}

# cuda_lib_path: the folder of this machine's libcublasLt (the CUDA toolkit's,
# else a Python wheel's), for LD_LIBRARY_PATH; empty when there is none.
cuda_lib_path() {
  local f
  f=$(ls /usr/local/cuda/lib64/libcublasLt.so.* /usr/local/cuda/targets/x86_64-linux/lib/libcublasLt.so.* 2>/dev/null | head -n 1)
  [ -n "$f" ] || f=$(find /usr /opt -name 'libcublasLt.so.*' 2>/dev/null | head -n 1)
  [ -n "$f" ] && dirname "$f"
  return 0
}
