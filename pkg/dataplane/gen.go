package dataplane

// The BPF objects and their Go bindings are generated from bpf/ and committed,
// so `go build` needs no clang. Regenerate with `make -f hack/dataplane.mk bpf`;
// `verify-bpf` fails when the committed files are stale. clang-19 and
// llvm-strip-19 are pinned by name (Debian bookworm, hack/install-deps.sh) so
// the output is byte-identical wherever it is rebuilt. Both arch include dirs
// are listed for <asm/types.h>; clang ignores the one that does not exist.

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -type hop -type endpoint_key -type endpoint -type subnet_key -type subnet -type vpc -type pod_iface -type droplet_key -type droplet -type learned_entry -type intro_key -type underlay_counter -type pod_counter -type hostpath_cfg -type np_counter -type drop_event -type drop_hook -type drop_set -type svc_key -type svc -type svc_backend -type svc_ct_key -type svc_ct_entry -type svc_info -type svc_port_bits -type svc_affinity_key -type svc_affinity -type svc_limits mizar ../../bpf/mizar.c -- -I../../bpf/include -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu -mcpu=v3 -Wall -Werror
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel pass ../../bpf/pass.c -- -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu -mcpu=v3 -Wall -Werror
