#!/usr/bin/env bash
# Bundle the CUDA build's binaries with the shared libraries the GPU box's
# image lacks (ICU 72, fmt, PCRE2, ...) into DEST/gpu-bin.tar.xz, for
# KETTLE_PREBUILT in bench/cuda_check.sh (the GPU box cannot build kettle:
# no PCRE2/ICU development files there, and no network).
#   [BINS="kettle tests/golden_cuda_test ..."] scripts/pack-gpu-bin.sh BUILD_DIR DEST
# BINS: paths under BUILD_DIR (default: kettle and the CUDA test and bench binaries).
# The device call carries the working tree and the bundle in 64 MiB together: name only
# the binaries the call runs when the bundle would not fit (xz -9e: about 15 MB for kettle alone).
set -euo pipefail
build=${1:?build dir}; dest=${2:?dest dir}
bins=${BINS:-kettle tests/backend_cuda_test tests/golden_cuda_test tests/quantized_test bench/kettle_mask_bench}
stage=$(mktemp -d); mkdir -p "$stage/bin" "$stage/lib"
for b in $bins; do cp "$build/$b" "$stage/bin/"; done
strip --strip-unneeded "$stage"/bin/*
for lib in libicuuc.so.72 libicui18n.so.72 libicudata.so.72 libfmt.so.9 libpcre2-8.so.0 \
           libbrotlidec.so.1 libbrotlienc.so.1 libbrotlicommon.so.1 libsqlite3.so.0; do
  path=$(ldd "$build/kettle" | awk -v l="$lib" '$1 == l { print $3 }')
  [ -n "$path" ] && cp -L "$path" "$stage/lib/"
done
tar -C "$stage" -cf - bin lib | xz -T2 -9e >"$dest/gpu-bin.tar.xz"
rm -rf "$stage"; ls -la "$dest/gpu-bin.tar.xz"
