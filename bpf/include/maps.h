//go:build ignore

/* Maps of the mizar datapath. All are pinned by name under the pin root the
 * Go loader passes (default /sys/fs/bpf/mizar), so reloading the programs keeps
 * their contents and traffic keeps flowing. Sizes are per node. */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "mizar.h"

/* Every endpoint a host must know: its own pods (ifindex != 0), the endpoints of
 * the subnets it bounces for, and any destination host the agent learned. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct endpoint_key);
	__type(value, struct endpoint);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} endpoints SEC(".maps");

/* (vni, prefix) -> bouncers of that subnet. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* required for LPM tries */
	__type(key, struct subnet_key);
	__type(value, struct subnet);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} subnets SEC(".maps");

/* vni -> dividers of that VPC. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct vpc);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vpcs SEC(".maps");

/* Underlay hosts Geneve is accepted from. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct droplet_key);
	__type(value, struct droplet);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} droplets SEC(".maps");

/* MAC -> droplet address, for the droplets whose MAC the agent gave (the
 * ones on this host's L2 segment). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct mac_key);
	__type(value, struct droplet_key);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} droplet_macs SEC(".maps");

/* This node's own addresses: pod traffic to them goes to the host stack
 * (kubelet probes, node-local daemons), not into the overlay. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct droplet_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} host_addrs SEC(".maps");

/* (vni, droplet ip) -> present: a bouncer or divider of that VPC. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct endpoint_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} relays SEC(".maps");

/* (vni, ip) -> host it was learned at (direct-path learning). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct endpoint_key);
	__type(value, struct learned_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} learned SEC(".maps");

/* (vni, local pod, peer host) -> last introduction time. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct intro_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} introduced SEC(".maps");

/* Host-side veth ifindex -> the pod behind it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct pod_iface);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_ifaces SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, UL_MAX);
	__type(key, enum underlay_counter);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} underlay_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, POD_MAX);
	__type(key, enum pod_counter);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_stats SEC(".maps");

/* Generation of the maps above as the agent wrote them: Go bumps it after
 * every change (Datapath.invalidate), which empties every flow cache at once.
 * Pinned, so that programs being replaced see the same generation. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} generation SEC(".maps");

/* The programs' own map writes that a cache may have seen missing (a new
 * learned host) bump it too. */
static __always_inline void bump_generation(void)
{
	__u32 zero = 0;
	__u64 *g = bpf_map_lookup_elem(&generation, &zero);

	if (g)
		__sync_fetch_and_add(g, 1);
}

static __always_inline __u64 current_generation(void)
{
	__u32 zero = 0;
	__u64 *g = bpf_map_lookup_elem(&generation, &zero);

	return g ? *g : 0;
}

static __always_inline void count_ul(enum underlay_counter c)
{
	__u64 *v = bpf_map_lookup_elem(&underlay_stats, &c);

	if (v)
		*v += 1; /* per-CPU slot: no atomics needed */
}

static __always_inline void count_pod(enum pod_counter c)
{
	__u64 *v = bpf_map_lookup_elem(&pod_stats, &c);

	if (v)
		*v += 1;
}
