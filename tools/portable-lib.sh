# Shared by tools/gpu-check.sh and tools/portable-tests.sh (sourced, from the
# repository root): the portable build and the libraries that travel with it.

# build-v3/: Release, no CUDA, for x86-64-v3 (AVX2+FMA) instead of -march=native.
configure_v3() {
  cmake -S . -B build-v3 -DCMAKE_BUILD_TYPE=Release -DEXMY_CUDA=OFF -DEXMY_NATIVE=OFF \
    -DCMAKE_CXX_FLAGS="-march=x86-64-v3" >/dev/null
}

# copy_libs DEST BINARY...: the shared libraries the binaries load, all but
# the C library's own (the other machine has those), copied into DEST.
copy_libs() {
  local dest=$1
  shift
  mkdir -p "$dest"
  for b in "$@"; do
    ldd "$b" | awk '$3 ~ /^\// {print $3}'
  done | sort -u | grep -Ev '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$dest/"; done
}
