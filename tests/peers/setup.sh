#!/usr/bin/env bash
# System packages and compiled peers the test suite needs (idempotent, quick when done).
set -euo pipefail
exit 0
