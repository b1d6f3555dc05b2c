#!/usr/bin/env bash
# Fails when a tracked file is larger than 512 KiB or is an executable binary:
# images, root filesystems, e2e.test and built commands are made by scripts
# and cached outside the clone, never committed (a submission has a size limit,
# and an earlier one was refused whole for crossing it).
set -o errexit -o nounset -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
git ls-files -z | perl -0 -ne '
  BEGIN { $limit = 512 * 1024; $bad = 0 }
  chomp; next unless -f $_;
  my $size = -s _;
  if ($size > $limit) { print STDERR "verify-size: $_ is $size bytes (limit $limit): make it with a script and cache it outside the clone\n"; $bad = 1 }
  # An ELF executable or shared object (types 2, 3): the BPF objects bpf2go embeds are relocatables (type 1).
  if (open(my $fh, "<", $_)) { binmode $fh; read($fh, my $h, 18);
    if (length($h) == 18 && substr($h, 0, 4) eq "\x7fELF" && unpack("v", substr($h, 16, 2)) >= 2) { print STDERR "verify-size: $_ is an executable binary: build it, do not commit it\n"; $bad = 1 } }
  END { exit $bad if $bad; print "verify-size: no tracked file above $limit bytes, no executables\n" }'
