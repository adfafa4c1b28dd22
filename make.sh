#!/usr/bin/env bash
# The front door on a bare Debian 12: installs what kettle needs (make, the
# compilers, the libraries, Node.js for the tests; Debian packages only, via
# scripts/install-deps.sh), then runs the Makefile's target:
#   bash make.sh run     # build and serve the bundled demo model
#   bash make.sh test    # build and run every test (what CI runs)
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/install-deps.sh
exec make "$@"
