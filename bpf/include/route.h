//go:build ignore

/* The one routing decision both programs make: given (vni, inner destination)
 * and the flow's 14 bits of entropy, where does the packet go next?
 *
 *   1. endpoints[(vni, dst)]: local pod -> deliver; remote -> its host
 *      (the bouncer role, and the direct path once the source host knows it).
 *   2. subnets LPM (vni, dst): a bouncer of the destination's subnet (the
 *      divider role). If this host is itself one of those bouncers it holds
 *      every endpoint of the subnet, so a miss in step 1 means "no such
 *      endpoint": drop instead of bouncing the packet between bouncers.
 *   3. vpcs[vni]: a divider of the VPC, which knows every subnet. A divider
 *      that gets here has no subnet for dst: drop. No entry: unknown VNI.
 *
 * Every table is keyed by the VNI, so nothing ever matches across VPCs. */
#pragma once

#include "maps.h"
#include "pkt.h"

enum route_kind {
	RT_DROP = 0,
	RT_LOCAL,
	RT_REMOTE,
	RT_HOST, /* pod side only: an address of this node (host_addrs) */
};

enum route_via {
	VIA_ENDPOINT = 0,
	VIA_SUBNET,
	VIA_DIVIDER,
	VIA_UNKNOWN_VNI,
	VIA_UNKNOWN_DST,
};

/* Where a packet goes next. Ordered so that the addresses are word-aligned
 * on the stack (pkt.h). */
struct route {
	struct hop next; /* RT_REMOTE */
	__u8 dst_mac[6];
	__u8 has_mac;   /* dst_mac is the endpoint's MAC */
	__u8 pad;
	__u32 kind;     /* enum route_kind */
	__u32 via;      /* enum route_via */
	__u32 ifindex;  /* RT_LOCAL: host-side veth of the pod */
};

/* ul_flows slot: the underlay decision for (vni, outer source, inner source,
 * inner destination, pick), made at generation gen. Only decisions the
 * agent's maps alone made are kept (not trust learned from a relay, which
 * expires on its own). */
struct ul_flow {
	__u64 gen;
	__u32 vni;
	__u32 osrc;
	__u32 isrc;
	__u32 idst;
	__u32 pick;
	__u8 from_relay; /* the outer source is a relay of the VPC */
	__u8 self_relay; /* this host is one */
	__u8 valid;
	__u8 pad;
	__u32 learned;    /* the sender last learned for isrc from this flow */
	__u64 learned_j;  /* when (jiffies) */
	struct route r;
};

/* Jiffies of a tenth of a learned entry's lifetime, counting 10 ms a jiffy
 * (HZ >= 100): never longer than that, whatever HZ is. bpf_jiffies64 is
 * inlined, where a clock read is a helper call. */
#define JIFFY_MAX_NS 10000000ULL
#define learn_skip_jiffies() (host.learn_ns / 10 / JIFFY_MAX_NS)

/* Per-CPU flow caches: what the hash lookups of a flow's first packet
 * decided, valid while the generation is unchanged. Array lookups are
 * inlined by the verifier; a hash lookup is a call chain costing as much as
 * the rest of a path. Not pinned: a cache dies with its program. */
#define FLOW_SLOTS 256

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FLOW_SLOTS);
	__type(key, __u32);
	__type(value, struct ul_flow);
} ul_flows SEC(".maps");

/* Per-CPU caches of the pod side and of the droplet check, like ul_flows. */
struct rt_flow {
	__u64 gen;
	__u32 vni;
	__u32 daddr;
	__u32 pick;
	__u32 valid;
	struct route r;
	/* Learned path decided for the pod saddr: direct to peer until
	 * direct_until (jiffies). */
	__u32 saddr;
	__u32 peer;
	__u64 direct_until;
	__u32 unlearned; /* no live learned host for daddr (a new one bumps gen) */
	__u32 pad;
	/* Sent straight to the endpoint's host (VIA_ENDPOINT): when the flow
	 * next introduces its pod there (jiffies; 0 = with its next packet). */
	__u64 introduce_j;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FLOW_SLOTS);
	__type(key, __u32);
	__type(value, struct rt_flow);
} rt_flows SEC(".maps");

#define IFACE_SLOTS 64

struct pod_seen {
	__u64 gen;
	__u32 ifindex;
	__u32 valid;
	struct pod_iface cfg;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, IFACE_SLOTS);
	__type(key, __u32);
	__type(value, struct pod_seen);
} pods_seen SEC(".maps");

#define DROPLET_SLOTS 64

struct droplet_seen {
	__u64 gen;
	__u32 ip;
	__u32 valid;
	struct droplet d;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DROPLET_SLOTS);
	__type(key, __u32);
	__type(value, struct droplet_seen);
} droplets_seen SEC(".maps");

/* The droplet at ip (network order) if Geneve is accepted from it, NULL
 * otherwise. */
static __always_inline const struct droplet *droplet_lookup(__u32 ip, __u64 gen)
{
	__u32 slot = (ip ^ (ip >> 16)) & (DROPLET_SLOTS - 1);
	struct droplet_seen *s = bpf_map_lookup_elem(&droplets_seen, &slot);

	if (s && s->valid && s->gen == gen && s->ip == ip)
		return &s->d;

	struct droplet_key dk __attribute__((aligned(4)));

	store_u32(dk.ip, ip);
	const struct droplet *d = bpf_map_lookup_elem(&droplets, &dk);

	if (!d || !s)
		return d;
	s->gen = gen;
	s->ip = ip;
	s->d = *d;
	s->valid = 1;
	return &s->d;
}

static __always_inline int known_droplet(__u32 ip, __u64 gen)
{
	return droplet_lookup(ip, gen) != NULL;
}

/* The description of the pod behind host-side veth ifindex, or NULL. */
static __always_inline const struct pod_iface *pod_config(__u32 ifindex, __u64 gen)
{
	__u32 slot = ifindex & (IFACE_SLOTS - 1);
	struct pod_seen *s = bpf_map_lookup_elem(&pods_seen, &slot);

	if (s && s->valid && s->gen == gen && s->ifindex == ifindex)
		return &s->cfg;

	const struct pod_iface *cfg = bpf_map_lookup_elem(&pod_ifaces, &ifindex);

	if (!cfg || !s)
		return cfg;
	s->gen = gen;
	s->ifindex = ifindex;
	s->cfg = *cfg;
	s->valid = 1;
	return &s->cfg;
}

static __always_inline int hops_contain(const struct hop *hops, __u32 n, __u32 ip)
{
	for (__u32 i = 0; i < MAX_HOPS; i++) {
		if (i >= n)
			break;
		if (load_u32(hops[i].ip) == ip)
			return 1;
	}
	return 0;
}

/* Pick hops[pick % n], refusing to pick from a set this host belongs to. */
static __always_inline int pick_hop(struct route *r, const struct hop *hops, __u32 n,
				    __u32 pick, __u32 self, __u32 via)
{
	if (n > MAX_HOPS)
		n = MAX_HOPS;
	if (n == 0 || hops_contain(hops, n, self)) {
		r->kind = RT_DROP;
		r->via = VIA_UNKNOWN_DST;
		return 0;
	}
	__u32 idx = pick % n;

	/* clang knows idx < n <= MAX_HOPS and would drop the check the
	 * verifier needs (it does not track bounds through BPF_MOD). */
	barrier_var(idx);
	if (idx >= MAX_HOPS)
		return 0;
	r->next = hops[idx];
	r->kind = RT_REMOTE;
	r->via = via;
	return 0;
}

static __always_inline void route_lookup(struct route *r, __u32 vni, __u32 daddr, __u32 pick,
					 __u32 self)
{
	struct endpoint_key ek = { .vni = vni };

	store_u32(ek.ip, daddr);
	r->kind = RT_DROP;
	r->has_mac = 0;

	struct endpoint *ep = bpf_map_lookup_elem(&endpoints, &ek);
	if (ep) {
		r->has_mac = 1;
		copy_mac(r->dst_mac, ep->mac);
		if (ep->ifindex) {
			r->kind = RT_LOCAL;
			r->via = VIA_ENDPOINT;
			r->ifindex = ep->ifindex;
			return;
		}
		if (load_u32(ep->host_ip) == self) {
			/* Remote endpoint said to live here: a stale entry.
			 * Sending it to ourselves would loop. */
			r->via = VIA_UNKNOWN_DST;
			return;
		}
		store_u32(r->next.ip, load_u32(ep->host_ip));
		copy_mac(r->next.mac, ep->host_mac);
		r->kind = RT_REMOTE;
		r->via = VIA_ENDPOINT;
		return;
	}

	struct subnet_key sk = { .prefixlen = 64, .vni = vni };

	store_u32(sk.ip, daddr);
	struct subnet *sn = bpf_map_lookup_elem(&subnets, &sk);
	if (sn) {
		pick_hop(r, sn->bouncers, sn->nbouncers, pick, self, VIA_SUBNET);
		return;
	}

	struct vpc *vp = bpf_map_lookup_elem(&vpcs, &vni);
	if (!vp) {
		r->via = VIA_UNKNOWN_VNI;
		return;
	}
	pick_hop(r, vp->dividers, vp->ndividers, pick, self, VIA_DIVIDER);
}

#include "hostpath.h" /* needs the above; hostpath_pod_route is used below */

/* The pod side's route: this node's own addresses first (host_addrs: the
 * host stack answers kubelet probes), then route_lookup, through rt_flows:
 * routes (not drops) are kept until the generation changes. Returns the
 * flow's slot, or NULL when it has none. */
static __always_inline struct rt_flow *route_lookup_cached(struct route *r, __u32 vni, __u32 daddr,
							   __u32 pick, __u32 self, __u64 gen)
{
	__u32 slot = pick & (FLOW_SLOTS - 1);
	struct rt_flow *s = bpf_map_lookup_elem(&rt_flows, &slot);

	if (s && s->valid && s->gen == gen && s->vni == vni && s->daddr == daddr && s->pick == pick) {
		*r = s->r;
		return s;
	}
	struct droplet_key hk __attribute__((aligned(4)));

	store_u32(hk.ip, daddr);
	if (bpf_map_lookup_elem(&host_addrs, &hk)) {
		__builtin_memset(r, 0, sizeof(*r));
		r->kind = RT_HOST;
	} else if (!hostpath_pod_route(r, vni, daddr, gen))
		route_lookup(r, vni, daddr, pick, self);
	if (!s || r->kind == RT_DROP)
		return NULL;
	s->gen = gen;
	s->vni = vni;
	s->daddr = daddr;
	s->pick = pick;
	s->r = *r;
	s->peer = 0;
	s->unlearned = 0;
	s->introduce_j = 0;
	s->valid = 1;
	return s;
}

static __always_inline int is_relay(__u32 vni, __u32 ip)
{
	struct endpoint_key k = { .vni = vni };

	store_u32(k.ip, ip);
	return bpf_map_lookup_elem(&relays, &k) != NULL;
}

/* The host (vni, ip) was learned at, if the entry is alive; 0 otherwise.
 * The clock is read only on a hit (*now, for the caller to reuse): the
 * coarse one unless precise (the introduction delay is shorter than a tick;
 * a lifetime of seconds does not care about one). */
static __always_inline __u32 learned_host(__u32 vni, __u32 ip, __u64 *now, const int precise,
					  __u64 *expires)
{
	struct endpoint_key k = { .vni = vni };

	store_u32(k.ip, ip);
	struct learned_entry *ln = bpf_map_lookup_elem(&learned, &k);
	if (!ln)
		return 0;
	*now = precise ? bpf_ktime_get_ns() : bpf_ktime_get_coarse_ns();
	if (*now >= ln->expires)
		return 0;
	if (expires)
		*expires = ln->expires;
	return load_u32(ln->host_ip);
}

/* Trust on the underlay: may the droplet at outer source osrc carry a packet
 * whose inner source is isrc in VPC vni? A bouncer or divider of the VPC may
 * (it checked the source where the packet entered the overlay); any other
 * droplet only for endpoints it hosts, as the agent says (endpoints) or as a
 * relay taught this host (learned). Returns 0 or the refusal reason as a
 * counter index; *relay tells whether osrc is a relay. */
static __always_inline int src_refusal(__u32 vni, __u32 osrc, __u32 isrc, int *relay, int *learned_trust)
{
	*relay = is_relay(vni, osrc);
	*learned_trust = 0;
	if (*relay)
		return 0;

	struct endpoint_key k = { .vni = vni };

	store_u32(k.ip, isrc);
	struct endpoint *ep = bpf_map_lookup_elem(&endpoints, &k);
	if (ep) {
		/* A pod of this host cannot arrive from the underlay. */
		if (ep->ifindex || load_u32(ep->host_ip) != osrc)
			return UL_DROP_SRC_SPOOFED;
		return 0;
	}
	__u64 now;
	__u32 h = learned_host(vni, isrc, &now, 0, NULL);

	if (!h)
		return UL_DROP_SRC_UNKNOWN;
	*learned_trust = 1;
	return h == osrc ? 0 : UL_DROP_SRC_SPOOFED;
}
