#!/usr/bin/env bash
# Filters `go build -v`: package paths become a count printed every 100
# packages; anything else (compiler errors, warnings) passes through unchanged.
exec awk '
  /^[A-Za-z0-9._~\/-]+$/ { n++; if (n % 100 == 0) { printf "  ... %d packages compiled\n", n; fflush() } next }
  { print; fflush() }
  END { if (n >= 100) printf "  ... %d packages compiled\n", n }
'
