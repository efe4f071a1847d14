#!/usr/bin/env bash
# Installs exmy's Debian dependencies when some are missing (run as root on a
# fresh Debian 12 machine; does nothing when everything is there).
set -euo pipefail
packages=(
  build-essential cmake git pkg-config
  clang libclang-rt-14-dev libomp-dev # sanitizer build and fuzz targets (libFuzzer; clang's OpenMP)
  libeigen3-dev                       # GEMM on the CPU
  libhdf5-dev hdf5-tools              # run files, checkpoints, tensor I/O
  libboost-dev libboost-program-options-dev   # command line (and Boost.Multiprecision in tests)
  libgtest-dev libbenchmark-dev       # tests and micro-benchmarks
  librandom123-dev                    # Philox4x32-10 for stochastic rounding
  nlohmann-json3-dev                  # JSON (stats, configs, HF config.json)
  zlib1g-dev                          # gzip text input of exmy prepare-data
  openmpi-bin libopenmpi-dev          # data-parallel training over MPI (mpirun -np N exmy train)
  git-doc                             # the default job's English corpus (/usr/share/doc/git-doc, GPL-2)
  python3 python3-h5py python3-matplotlib python3-numpy   # analysis scripts
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all dependencies present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
