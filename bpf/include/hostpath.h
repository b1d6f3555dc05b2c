//go:build ignore

/* The host path: Kubernetes networking for the cluster's default VPC (the
 * "host VPC", one per node, set by the agent; VNI 0 = none).
 *
 *   - A host-VPC pod's traffic to an address outside the VPC's CIDR goes to
 *     the host stack (kube-proxy translates Services, the node's routing
 *     takes egress), marked with the host-VPC mark so the agent's NAT rules
 *     know it; to another droplet's address it is encapsulated to that
 *     droplet instead, so replies to the node's own connections come back
 *     untranslated. Other VPCs' pods reach only this node's addresses,
 *     marked as such: the agent's rules never forward them.
 *   - The node reaches host-VPC pods through a host device (a veth pair,
 *     mizar_host in the host stack, its peer described as a "pod" of the
 *     host VPC whose address is the droplet's): the pod program on the peer
 *     checks that the source is this droplet and encapsulates as for pods.
 *   - The underlay program accepts "host traffic" (inner source = outer
 *     source, a known droplet) in the host VPC toward its pods, and delivers
 *     host-VPC packets addressed to this droplet into the host stack through
 *     the peer, so they arrive on mizar_host, the device whose route covers
 *     their source (rp_filter, conntrack). */
#pragma once

#include "maps.h"
#include "pkt.h"
#include "route.h" /* which includes this file where its pod route needs it */

struct hostpath_cfg {
	__u32 vni;         /* the host VPC; 0 = no host path */
	__u8 cidr[4];      /* its CIDR, masked */
	__u8 mask[4];      /* its netmask */
	__u32 dev_ifindex; /* the host device's peer: host-bound packets are redirected to it */
	__u8 dev_mac[6];   /* the host device's MAC: their inner destination */
	__u8 pad[2];
	/* skb marks of what a pod hands to the host stack, by the VPC it came
	 * from: the agent's NAT and filter rules match them (pkg/dataplane
	 * MarkHostVPC, MarkOtherVPC). */
	__u32 mark_host_vpc;
	__u32 mark_other_vpc;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct hostpath_cfg);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} hostpath SEC(".maps");

/* Array lookups are inlined by the verifier: no call. */
static __always_inline const struct hostpath_cfg *hostpath_get(void)
{
	__u32 zero = 0;
	const struct hostpath_cfg *hp = bpf_map_lookup_elem(&hostpath, &zero);

	return hp && hp->vni ? hp : NULL;
}

/* Whether a pod of vni sending to daddr leaves its VPC for the host path. */
static __always_inline int hostpath_outside(__u32 vni, __u32 daddr)
{
	const struct hostpath_cfg *hp = hostpath_get();

	return hp && hp->vni == vni && (daddr & load_u32(hp->mask)) != load_u32(hp->cidr);
}

/* Pod side, a flow's first packet: a host-VPC pod's destination outside
 * its VPC is another droplet (straight to it, in the host VPC) or the host
 * stack's. Returns 1 when it decided r. */
static __always_inline int hostpath_pod_route(struct route *r, __u32 vni, __u32 daddr, __u64 gen)
{
	if (!hostpath_outside(vni, daddr))
		return 0;
	__builtin_memset(r, 0, sizeof(*r));
	const struct droplet *d = droplet_lookup(daddr, gen);

	if (!d) {
		r->kind = RT_HOST;
		return 1;
	}
	store_u32(r->next.ip, daddr);
	copy_mac(r->next.mac, d->mac);
	r->kind = RT_REMOTE;
	r->via = VIA_ENDPOINT;
	return 1;
}

/* Mark a pod's packet handed to the host stack with what VPC it came from. */
static __always_inline void hostpath_mark(struct __sk_buff *skb, __u32 vni)
{
	const struct hostpath_cfg *hp = hostpath_get();

	if (hp)
		skb->mark |= hp->vni == vni ? hp->mark_host_vpc : hp->mark_other_vpc;
}

/* Underlay: a host-VPC packet addressed to this droplet goes into the host
 * stack through the host device. Returns 1 when it decided r. */
static __always_inline int hostpath_to_host(struct route *r, __u32 vni, __u32 daddr, __u32 self)
{
	const struct hostpath_cfg *hp = hostpath_get();

	if (!hp || hp->vni != vni || daddr != self)
		return 0;
	__builtin_memset(r, 0, sizeof(*r));
	if (!hp->dev_ifindex) {
		r->via = VIA_UNKNOWN_DST;
		return 1;
	}
	r->kind = RT_LOCAL;
	r->via = VIA_ENDPOINT;
	r->ifindex = hp->dev_ifindex;
	r->has_mac = 1;
	copy_mac(r->dst_mac, hp->dev_mac);
	return 1;
}

/* Underlay: "host traffic", a droplet's host stack speaking for itself in
 * the host VPC (inner source = outer source, which the caller checked is a
 * known droplet), to be delivered to a pod or relayed, never into this
 * host's stack. */
static __always_inline int hostpath_from_host(const struct route *r, __u32 vni, __u32 osrc, __u32 isrc)
{
	const struct hostpath_cfg *hp = hostpath_get();

	return hp && hp->vni == vni && osrc == isrc && !(r->kind == RT_LOCAL && r->ifindex == hp->dev_ifindex);
}
