#!/usr/bin/env bash
# Copy this worktree's files (tracked and untracked-not-ignored) into
# /work/main/.gpu-src (git-ignored there), the folder a device call carries;
# models/ and tests/data are left out: the call links main's identical copies.
set -euo pipefail
dst=/work/main/.gpu-src
rm -rf "$dst" && mkdir -p "$dst"
cd "$(dirname "$0")/.."
git ls-files -co --exclude-standard | grep -v -E '^(models|tests/data)/' | tar -cf - -T - | tar -xf - -C "$dst"
