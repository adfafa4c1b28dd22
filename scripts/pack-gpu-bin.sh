#!/usr/bin/env bash
# Bundle the CUDA build's binaries with the shared libraries the GPU box's
# image lacks (ICU 72, fmt, PCRE2, ...) into DEST/gpu-bin.tar.xz, for
# KETTLE_PREBUILT in bench/cuda_check.sh (the GPU box cannot build kettle:
# no PCRE2/ICU development files there, and no network).
#   scripts/pack-gpu-bin.sh BUILD_DIR DEST
set -euo pipefail
build=${1:?build dir}; dest=${2:?dest dir}
stage=$(mktemp -d); mkdir -p "$stage/bin" "$stage/lib"
cp "$build/kettle" "$build/tests/backend_cuda_test" "$build/tests/golden_cuda_test" "$build/tests/quantized_test" "$build/bench/kettle_mask_bench" "$stage/bin/"
strip --strip-unneeded "$stage"/bin/*
for lib in libicuuc.so.72 libicui18n.so.72 libicudata.so.72 libfmt.so.9 libpcre2-8.so.0 \
           libbrotlidec.so.1 libbrotlienc.so.1 libbrotlicommon.so.1; do
  path=$(ldd "$build/kettle" | awk -v l="$lib" '$1 == l { print $3 }')
  [ -n "$path" ] && cp -L "$path" "$stage/lib/"
done
tar -C "$stage" -cf - bin lib | xz -T2 -6 >"$dest/gpu-bin.tar.xz"
rm -rf "$stage"; ls -la "$dest/gpu-bin.tar.xz"
