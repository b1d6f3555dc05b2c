//go:build ignore

/* Kubernetes NetworkPolicy in the fast path (pkg/netpol compiles the
 * policies; pkg/dataplane/netpol.go writes these maps).
 *
 * Identities: every pod the agent knows is (vni, ip) -> identity + which
 * directions its policies isolate (np_endpoints); an address's prefix
 * identity is that of the longest ipBlock prefix of its VNI holding it
 * (np_prefixes). A rule is (subject identity, direction, peer identity,
 * protocol or 0 for all) -> the destination port ranges allowed (np_rules);
 * the peer is the pod identity, the prefix identity or NP_ID_ANY.
 *
 * Where: egress in the sending pod's program, ingress where the packet is
 * delivered (the pod program for a pod of this host, the underlay program
 * after decapsulation). Traffic from this node's own stack never enters
 * either check (it reaches the pod through the kernel route), as Kubernetes
 * requires for kubelet probes.
 *
 * Connections: an allowed first packet of a flow leaves an entry in
 * np_conns (LRU) under its original direction;
 * replies find it reversed and pass. Entries carry the policy generation
 * they were decided under: after a change (np_generation) the next packet
 * re-decides its connection, which is kept or cut. A per-CPU verdict cache
 * (np_cache) spares established flows every hash lookup.
 *
 * Everything here is compiled out unless the loader sets np_enabled. */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "mizar.h"

#define NP_MAX_RANGES 32
#define NP_CACHE_SLOTS 1024
#define NP_ID_ANY 1

#define NP_FLAG_INGRESS 1
#define NP_FLAG_EGRESS 2

#define NP_DIR_INGRESS 0
#define NP_DIR_EGRESS 1

struct np_endpoint {
	__u32 identity;
	__u8 flags; /* NP_FLAG_* */
	__u8 pad[3];
};

struct np_prefix_key {
	__u32 prefixlen; /* 32 (the VNI) + the prefix's bits */
	__u32 vni;
	__u8 ip[4];
};

struct np_rule_key {
	__u32 subject;
	__u32 peer;
	__u8 dir;   /* NP_DIR_* */
	__u8 proto; /* 0: every protocol */
	__u16 pad;
};

struct np_range {
	__u16 lo, hi;
};

struct np_ports {
	__u32 n;
	struct np_range r[NP_MAX_RANGES];
};

/* A connection in its original direction. */
struct np_conn_key {
	__u32 vni;
	__u8 src[4];
	__u8 dst[4];
	__u16 sport, dport; /* host order; 0 for protocols without ports */
	__u8 proto;
	__u8 pad[3];
};

struct np_conn {
	__u64 gen; /* policy generation the connection was allowed under */
};

struct np_cache_entry {
	struct np_conn_key k;
	__u64 gen;
	__u32 mode; /* which checks the verdict is for; 0 = empty slot */
	__u32 pad;
};

/* A pod's refusals, by direction (visible per pod from Go). */
struct np_refused_key {
	__u32 vni;
	__u8 ip[4];
	__u32 dir;
};

enum np_counter {
	NP_ALLOW_NEW,
	NP_ALLOW_ESTABLISHED,
	NP_ALLOW_REPLY,
	NP_RECHECK_KEPT,
	NP_DROP_EGRESS,
	NP_DROP_INGRESS,
	NP_DROP_CUT_EGRESS,
	NP_DROP_CUT_INGRESS,
	NP_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct endpoint_key);
	__type(value, struct np_endpoint);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} np_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* required for LPM tries */
	__type(key, struct np_prefix_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} np_prefixes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct np_rule_key);
	__type(value, struct np_ports);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} np_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct np_conn_key);
	__type(value, struct np_conn);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} np_conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NP_CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct np_cache_entry);
} np_cache SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct np_refused_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} np_refused SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NP_MAX);
	__type(key, enum np_counter);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} np_stats SEC(".maps");

/* Bumped by the agent after every rule change. Starts at 0; entries are
 * written with the generation + 1 so that a zeroed slot never matches. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} np_generation SEC(".maps");

/* Set by the Go loader (Options.NetworkPolicy). */
volatile const __u32 np_enabled = 0;

static __always_inline int np_on(void)
{
	return *(const volatile __u32 *)&np_enabled;
}

static __always_inline void np_count(enum np_counter c)
{
	__u64 *v = bpf_map_lookup_elem(&np_stats, &c);

	if (v)
		*v += 1;
}

static __always_inline void np_count_refused(__u32 vni, __u32 ip, __u32 dir)
{
	struct np_refused_key k = { .vni = vni, .dir = dir };

	store_u32(k.ip, ip);
	__u64 *v = bpf_map_lookup_elem(&np_refused, &k);

	if (v) {
		__sync_fetch_and_add(v, 1);
		return;
	}
	__u64 one = 1;

	/* A racing CPU may have created it: add to its entry then. */
	if (bpf_map_update_elem(&np_refused, &k, &one, BPF_NOEXIST)) {
		v = bpf_map_lookup_elem(&np_refused, &k);
		if (v)
			__sync_fetch_and_add(v, 1);
	}
}

static __always_inline struct np_endpoint *np_endpoint(__u32 vni, __u32 ip)
{
	struct endpoint_key k = { .vni = vni };

	store_u32(k.ip, ip);
	return bpf_map_lookup_elem(&np_endpoints, &k);
}

/* Does one rule entry allow port? A global function: the verifier checks
 * it once, on its own, rather than once per call site and per state of the
 * caller (its bounded loop, six calls per check, in both programs, exceeds
 * the 1M-instruction limit when inlined or static). It runs only for a
 * flow's first packet. */
__attribute__((noinline)) int np_rule_allows(__u32 subject, __u32 peer, __u32 dir_proto, __u32 port)
{
	struct np_rule_key k = { .subject = subject, .peer = peer, .dir = dir_proto >> 8, .proto = dir_proto & 0xff };
	struct np_ports *p = bpf_map_lookup_elem(&np_rules, &k);

	if (!p)
		return 0;
	__u32 n = p->n;

	for (__u32 i = 0; i < NP_MAX_RANGES; i++) {
		if (i >= n)
			break;
		if (port >= p->r[i].lo && port <= p->r[i].hi)
			return 1;
	}
	return 0;
}

/* Does subject's policy in direction dir allow the peer (pod identity, or 0,
 * at address peer_ip) on proto/port? */
static __always_inline int np_match(__u32 subject, __u32 dir, __u32 peer_id, __u32 vni, __u32 peer_ip, __u8 proto,
				    __u32 port)
{
	struct np_prefix_key pk = { .prefixlen = 64, .vni = vni };

	store_u32(pk.ip, peer_ip);
	__u32 *pfx = bpf_map_lookup_elem(&np_prefixes, &pk);
	__u32 prefix_id = pfx ? *pfx : 0;
	__u32 dp = dir << 8 | proto, dany = dir << 8;

	if (np_rule_allows(subject, NP_ID_ANY, dp, port) || np_rule_allows(subject, NP_ID_ANY, dany, port))
		return 1;
	if (peer_id && (np_rule_allows(subject, peer_id, dp, port) || np_rule_allows(subject, peer_id, dany, port)))
		return 1;
	if (prefix_id && (np_rule_allows(subject, prefix_id, dp, port) || np_rule_allows(subject, prefix_id, dany, port)))
		return 1;
	return 0;
}

/* The policy's verdict on a connection's first packet src -> dst:
 * 0, or NP_DROP_EGRESS / NP_DROP_INGRESS. Only the directions asked for
 * are checked: each host checks its own pods. */
static __always_inline int np_decide(__u32 vni, __u32 src, __u32 dst, __u8 proto, __u32 dport, int egress,
				     int ingress)
{
	struct np_endpoint *s = np_endpoint(vni, src);
	struct np_endpoint *d = np_endpoint(vni, dst);
	__u32 sid = s ? s->identity : 0, did = d ? d->identity : 0;

	if (egress && s && (s->flags & NP_FLAG_EGRESS) && !np_match(sid, NP_DIR_EGRESS, did, vni, dst, proto, dport))
		return NP_DROP_EGRESS;
	if (ingress && d && (d->flags & NP_FLAG_INGRESS) && !np_match(did, NP_DIR_INGRESS, sid, vni, src, proto, dport))
		return NP_DROP_INGRESS;
	return 0;
}

static __always_inline __u64 np_current_generation(void)
{
	__u32 zero = 0;
	__u64 *g = bpf_map_lookup_elem(&np_generation, &zero);

	return (g ? *g : 0) + 1;
}

/* Count a refusal of a packet src -> dst (reason NP_DROP_*) against the
 * local pod whose policy refused it. */
static __always_inline int np_refuse(int reason, __u32 vni, __u32 src, __u32 dst)
{
	np_count(reason);
	if (reason == NP_DROP_EGRESS || reason == NP_DROP_CUT_EGRESS)
		np_count_refused(vni, src, NP_DIR_EGRESS);
	else
		np_count_refused(vni, dst, NP_DIR_INGRESS);
	return reason;
}

/* Policy for one packet of vni, src -> dst, at a point that checks the
 * source's egress (a pod of this host sends) and/or the destination's
 * ingress (a pod of this host receives). ports is the L4 header's first
 * word (source port << 16 | destination port), 0 when there is none.
 * Returns 0 to let the packet go on, else the NP_DROP_* reason. */
static __always_inline int np_check(__u32 vni, __u32 src, __u32 dst, __u8 proto, __u32 ports, int egress, int ingress)
{
	if (!np_on())
		return 0;
	__u64 gen = np_current_generation();
	__u32 mode = (egress ? 1 : 0) | (ingress ? 2 : 0);
	struct np_conn_key k = { .vni = vni, .sport = ports >> 16, .dport = ports & 0xffff, .proto = proto };

	store_u32(k.src, src);
	store_u32(k.dst, dst);

	/* Flows already decided under this generation, on this CPU. */
	__u32 h = (src ^ dst ^ ports ^ vni ^ proto) * 0x9e3779b1;
	__u32 slot = (h >> 16) & (NP_CACHE_SLOTS - 1);
	struct np_cache_entry *c = bpf_map_lookup_elem(&np_cache, &slot);

	if (c && c->gen == gen && c->mode == mode && c->k.vni == vni && load_u32(c->k.src) == src &&
	    load_u32(c->k.dst) == dst && c->k.sport == k.sport && c->k.dport == k.dport && c->k.proto == proto)
		return 0;

	/* Every connection is tracked, isolated pods or not: a pod that a
	 * later policy isolates keeps the replies of what it opened before. */
	struct np_conn *e = bpf_map_lookup_elem(&np_conns, &k);

	if (e) {
		if (e->gen == gen) {
			np_count(NP_ALLOW_ESTABLISHED);
			goto allow;
		}
		int r = np_decide(vni, src, dst, proto, k.dport, egress, ingress);

		if (r) {
			bpf_map_delete_elem(&np_conns, &k);
			return np_refuse(r == NP_DROP_EGRESS ? NP_DROP_CUT_EGRESS : NP_DROP_CUT_INGRESS, vni, src, dst);
		}
		e->gen = gen;
		np_count(NP_RECHECK_KEPT);
		goto allow;
	}

	/* A reply: the connection was opened the other way. It is re-decided
	 * as it was first (directions swapped: our egress was its ingress). */
	struct np_conn_key rk = { .vni = vni, .sport = k.dport, .dport = k.sport, .proto = proto };

	store_u32(rk.src, dst);
	store_u32(rk.dst, src);
	e = bpf_map_lookup_elem(&np_conns, &rk);
	if (e) {
		if (e->gen != gen) {
			int r = np_decide(vni, dst, src, proto, rk.dport, ingress, egress);

			if (r) {
				bpf_map_delete_elem(&np_conns, &rk);
				/* Counted against the pod whose policy refused:
				 * the original sender is our destination. */
				return np_refuse(r == NP_DROP_EGRESS ? NP_DROP_CUT_EGRESS : NP_DROP_CUT_INGRESS, vni,
						 dst, src);
			}
			e->gen = gen;
			np_count(NP_RECHECK_KEPT);
		} else {
			np_count(NP_ALLOW_REPLY);
		}
		goto allow;
	}

	int r = np_decide(vni, src, dst, proto, k.dport, egress, ingress);

	if (r)
		return np_refuse(r, vni, src, dst);
	struct np_conn v = { .gen = gen };

	bpf_map_update_elem(&np_conns, &k, &v, BPF_ANY);
	np_count(NP_ALLOW_NEW);

allow:
	if (c) {
		c->k = k;
		c->gen = gen;
		c->mode = mode;
	}
	return 0;
}

/* L4 ports (source << 16 | destination) of the IPv4 packet at iph, 0 for
 * fragments, protocols without ports and truncated headers. */
static __always_inline __u32 np_ports(struct iphdr *iph, void *data_end)
{
	__u8 proto = iph->protocol;

	if ((iph->frag_off & bpf_htons(IP_MF | IP_OFFMASK)) ||
	    (proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != IPPROTO_SCTP))
		return 0;
	__u8 *p = (void *)iph + (iph->ihl & 0xf) * 4;

	/* A truncated L4 header is checked as port 0 (refused by any rule
	 * that names ports). */
	if ((void *)(p + 4) > data_end)
		return 0;
	return ((__u32)p[0] << 24) | ((__u32)p[1] << 16) | ((__u32)p[2] << 8) | p[3];
}

/* Ingress policy for a decapsulated packet about to be delivered to a pod
 * of this host (iip: its inner IPv4 header, bounds-checked by the caller).
 * Returns 0 or the NP_DROP_* reason. data_end is read again from ctx rather
 * than passed: kept live across the routing code, it cost the policy-less
 * path a spill (decap +7%, measured). */
static __always_inline int np_deliver(struct xdp_md *ctx, __u32 vni, struct iphdr *iip)
{
	void *data_end = (void *)(long)ctx->data_end;

	return np_check(vni, iip->saddr, iip->daddr, iip->protocol, np_ports(iip, data_end), 0, 1);
}
