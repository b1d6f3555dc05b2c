//go:build ignore

/* Kubernetes Services in the pod program (the kube-proxy replacement's
 * foundation). A pod's TCP or UDP packet to a Service frontend (VIP, port,
 * protocol) is translated to one of the Service's backends (DNAT) where it
 * leaves the pod, before routing; the backend's replies are translated back
 * (source = VIP:port) where they leave the backend's pod.
 *
 *   svc_frontends (vip, port, proto) -> svc id, backend count, affinity, flags
 *   svc_maglev    flat array, svc id * SVC_MAGLEV_M + slot -> backend id:
 *                 each Service's Maglev table, built in Go (pkg/dataplane/maglev)
 *   svc_backends  backend id -> (ip, port)
 *   svc_ct        LRU: a connection's translation, both ways, so it keeps its
 *                 backend while it lives and while that backend exists
 *   svc_affinities LRU: sessionAffinity ClientIP, (svc id, client) -> backend
 *
 * Everything here is compiled out unless the loader sets svc_enabled
 * (Options.Services), and skipped while no frontend is programmed
 * (svc_state, an inlined array lookup): traffic that is not to a Service
 * pays one hash lookup (the frontend) and, for the reply check, one more
 * (svc_ct). Fragments and SCTP are not translated yet. */
#pragma once

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>

#include "mizar.h"
#include "maps.h"
#include "pkt.h"

/* Limits shared with Go (bpf2go -type svc_limits). M is prime, as Maglev
 * needs; a change of either replaces the pinned svc_maglev (another size). */
enum svc_limits {
	SVC_MAGLEV_M = 1021, /* slots of one Service's Maglev table */
	SVC_MAX = 1024,      /* frontends (Service ports) per node */
	SVC_BACKENDS_MAX = 65536,
	SVC_CT_MAX = 262144, /* tracked connections, both directions */
	SVC_AFFINITY_MAX = 65536, /* (Service, client) pairs with ClientIP affinity */
};

struct svc_key {
	__u8 vip[4];
	__be16 port; /* network order */
	__u8 proto;  /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
} __attribute__((aligned(4)));

struct svc {
	__u32 id;          /* its table: svc_maglev[id * SVC_MAGLEV_M ...] */
	__u32 nbackends;   /* 0: drop (drop_no_backend) */
	__u32 affinity_s;  /* sessionAffinity ClientIP timeout (s); 0 = none */
	__u32 flags;       /* reserved */
};

struct svc_backend {
	__u8 ip[4];
	__be16 port; /* network order */
	__u8 pad[2];
} __attribute__((aligned(4)));

enum svc_ct_dir {
	SVC_CT_FWD = 0, /* client -> VIP: nat is the backend */
	SVC_CT_REV,     /* backend -> client: nat is the VIP */
};

/* A packet's 5-tuple as it is on the wire, and the direction the entry is
 * for (a Service deleted while its connections live must not make a
 * client's packet look like a backend's reply). */
struct svc_ct_key {
	__u8 saddr[4];
	__u8 daddr[4];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 dir; /* enum svc_ct_dir */
	__u8 pad[2];
} __attribute__((aligned(4)));

struct svc_ct_entry {
	__u8 nat_ip[4];   /* FWD: the backend; REV: the VIP */
	__be16 nat_port;
	__u8 pad[2];
	__u32 backend_id; /* FWD: still valid while svc_backends holds it as nat */
	__u32 svc_id;
};

/* svc_ports[port / 32]: bit port % 32 set when some frontend listens on
 * the port (frontend) or some backend serves from it (backend). Plain
 * pod traffic (to no Service port, from no backend port) pays these two
 * inlined array lookups instead of the frontend and connection lookups.
 * Go sets a port's bits before the entries that need them and clears them
 * after. */
struct svc_port_bits {
	__u32 frontend;
	__u32 backend;
};

#define SVC_PORT_WORDS (65536 / 32)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SVC_PORT_WORDS);
	__type(key, __u32);
	__type(value, struct svc_port_bits);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svc_ports SEC(".maps");

#define SVC_MAYBE_FRONTEND 1
#define SVC_MAYBE_REPLY 2

/* Could a packet with these ports (sport << 16 | dport, host order) be to
 * a Service or a backend's reply? SVC_MAYBE_* bits. */
static __always_inline __u32 svc_maybe(__u32 sport, __u32 dport)
{
	__u32 k = dport >> 5, m = 0;
	const struct svc_port_bits *b = bpf_map_lookup_elem(&svc_ports, &k);

	if (b && ((b->frontend >> (dport & 31)) & 1))
		m |= SVC_MAYBE_FRONTEND;
	k = sport >> 5;
	b = bpf_map_lookup_elem(&svc_ports, &k);
	if (b && ((b->backend >> (sport & 31)) & 1))
		m |= SVC_MAYBE_REPLY;
	return m;
}

/* sessionAffinity ClientIP: (Service, client) -> the backend its last new
 * connection got, until expires. A new connection within the timeout goes
 * to the same backend while it exists, and renews the entry (kube-proxy's
 * "recent" rule does the same). */
struct svc_affinity_key {
	__u32 svc_id;
	__u8 client[4];
};

struct svc_affinity {
	__u64 expires; /* bpf_ktime_get_ns */
	__u32 backend_id;
	__u8 ip[4];    /* the backend, to see an id re-used for another */
	__be16 port;
	__u8 pad[6];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SVC_AFFINITY_MAX);
	__type(key, struct svc_affinity_key);
	__type(value, struct svc_affinity);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svc_affinities SEC(".maps");

/* Frontends programmed; 0 = skip everything (Go keeps it). */
struct svc_info {
	__u32 nfrontends;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SVC_MAX);
	__type(key, struct svc_key);
	__type(value, struct svc);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svc_frontends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SVC_BACKENDS_MAX);
	__type(key, __u32);
	__type(value, struct svc_backend);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svc_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SVC_MAX * SVC_MAGLEV_M);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svc_maglev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SVC_CT_MAX);
	__type(key, struct svc_ct_key);
	__type(value, struct svc_ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svc_ct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct svc_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svc_state SEC(".maps");

/* Set by the Go loader (Options.Services). */
volatile const __u32 svc_enabled = 0;

/* Whether any Service is to be translated: the switch, then the count. */
static __always_inline int svc_on(void)
{
	if (!*(const volatile __u32 *)&svc_enabled)
		return 0;
	__u32 zero = 0;
	const struct svc_info *st = bpf_map_lookup_elem(&svc_state, &zero);

	return st && st->nfrontends;
}

/* Rewrite the packet's address at ip_off and port at port_off (both
 * network order, old values given) and patch the IPv4 and L4 checksums
 * with the kernel's helpers (which handle CHECKSUM_PARTIAL packets). */
static __always_inline int svc_rewrite(struct __sk_buff *skb, __u32 l4off, __u8 proto, __u32 ip_off,
				       __u32 old_ip, __u32 new_ip, __u32 port_off, __u16 old_port, __u16 new_port)
{
	__u32 csum_off = l4off + (proto == IPPROTO_TCP ? __builtin_offsetof(struct tcphdr, check) :
							 __builtin_offsetof(struct udphdr, check));
	__u64 mangled = proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;

	if (old_ip != new_ip) {
		if (bpf_l4_csum_replace(skb, csum_off, old_ip, new_ip, BPF_F_PSEUDO_HDR | mangled | 4))
			return -1;
		if (bpf_l3_csum_replace(skb, ETH_HLEN + __builtin_offsetof(struct iphdr, check), old_ip, new_ip, 4))
			return -1;
		if (bpf_skb_store_bytes(skb, ip_off, &new_ip, 4, 0))
			return -1;
	}
	if (old_port != new_port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, new_port, mangled | 2))
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &new_port, 2, 0))
			return -1;
	}
	return 0;
}

/* Translate a pod's TCP/UDP packet p if it is to a Service (before
 * routing, NetworkPolicy and everything else see the backend). Returns 0
 * when nothing was done, SVC_XLATED when the packet was rewritten
 * (p->ports updated; the caller re-reads the rest), or a pod_counter drop
 * reason. A
 * subprogram: the plain path's code stays as it was. */
struct svc_pkt {
	__u32 saddr; /* network order */
	__u32 daddr;
	__u32 ports; /* sport << 16 | dport, host order */
	__u32 l4off; /* from the start of the frame */
	__u32 proto;
};

#define SVC_XLATED (-1)

/* The translation's keys and values live in a per-CPU scratch slot, not on
 * the stack: the pod program's own frame (with NetworkPolicy compiled in)
 * leaves a called function little of the verifier's 512 bytes. */
struct svc_scratch {
	struct svc_key fk;
	struct svc_ct_key ck;
	struct svc_ct_entry v;
	struct svc_affinity_key ak;
	struct svc_affinity av;
	struct svc_backend be;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct svc_scratch);
} svc_scratch SEC(".maps");

/* Translate a pod's TCP/UDP packet p if it is to a Service (before
 * routing, NetworkPolicy and everything else see the backend). Returns 0
 * when nothing was done, SVC_XLATED when the packet was rewritten
 * (p->ports updated; the caller re-reads the rest), or a pod_counter drop
 * reason. A global function: verified once, whatever the caller's paths,
 * and the plain path's code stays as it was. */
__attribute__((noinline)) int svc_xlate(struct __sk_buff *skb, struct svc_pkt *p)
{
	__u32 zero = 0;
	struct svc_scratch *x = bpf_map_lookup_elem(&svc_scratch, &zero);

	if (!p || !x)
		return 0;
	__u32 saddr = p->saddr, daddr = p->daddr, ports = p->ports, l4off = p->l4off, proto = p->proto;
	__be16 sport = bpf_htons(ports >> 16), dport = bpf_htons(ports & 0xffff);

	__builtin_memset(&x->fk, 0, sizeof(x->fk));
	x->fk.port = dport;
	x->fk.proto = proto;
	store_u32(x->fk.vip, daddr);
	const struct svc *s = bpf_map_lookup_elem(&svc_frontends, &x->fk);

	if (!s)
		return 0;
	__u32 id = s->id, nbackends = s->nbackends, affinity_s = s->affinity_s;

	__builtin_memset(&x->ck, 0, sizeof(x->ck));
	x->ck.sport = sport;
	x->ck.dport = dport;
	x->ck.proto = proto;
	x->ck.dir = SVC_CT_FWD;
	store_u32(x->ck.saddr, saddr);
	store_u32(x->ck.daddr, daddr);
	__u32 bid = 0, bip = 0;
	__be16 bport = 0;
	const struct svc_ct_entry *fwd = bpf_map_lookup_elem(&svc_ct, &x->ck);

	if (fwd) {
		/* The connection keeps its backend while the backend exists. */
		const struct svc_backend *b = bpf_map_lookup_elem(&svc_backends, &fwd->backend_id);

		if (b && load_u32(b->ip) == load_u32(fwd->nat_ip) && b->port == fwd->nat_port && fwd->svc_id == id) {
			bip = load_u32(fwd->nat_ip);
			bport = fwd->nat_port;
			bid = fwd->backend_id;
		} else {
			fwd = NULL;
		}
	}
	if (!fwd) {
		if (!nbackends)
			return POD_DROP_NO_BACKEND;
		const struct svc_backend *b = NULL;
		__u64 now = 0;

		x->ak.svc_id = id;
		store_u32(x->ak.client, saddr);
		if (affinity_s) {
			/* The client's backend while it lasts and still exists. */
			const struct svc_affinity *a = bpf_map_lookup_elem(&svc_affinities, &x->ak);

			now = bpf_ktime_get_ns();
			if (a && a->expires > now) {
				b = bpf_map_lookup_elem(&svc_backends, &a->backend_id);
				if (b && load_u32(b->ip) == load_u32(a->ip) && b->port == a->port)
					bid = a->backend_id;
				else
					b = NULL;
			}
		}
		if (!b) {
			/* Maglev: the flow's hash picks a slot of the Service's table. */
			__u32 slot = id * SVC_MAGLEV_M + flow_hash(saddr, daddr, ports, proto) % SVC_MAGLEV_M;
			const __u32 *mid = bpf_map_lookup_elem(&svc_maglev, &slot);

			if (!mid)
				return POD_DROP_NO_BACKEND;
			bid = *mid;
			b = bpf_map_lookup_elem(&svc_backends, &bid);
			if (!b)
				return POD_DROP_NO_BACKEND;
		}
		bip = load_u32(b->ip);
		bport = b->port;
		if (affinity_s) {
			__builtin_memset(&x->av, 0, sizeof(x->av));
			x->av.expires = now + (__u64)affinity_s * 1000000000ULL;
			x->av.backend_id = bid;
			x->av.port = bport;
			store_u32(x->av.ip, bip);
			bpf_map_update_elem(&svc_affinities, &x->ak, &x->av, BPF_ANY);
		}

		__builtin_memset(&x->v, 0, sizeof(x->v));
		x->v.nat_port = bport;
		x->v.backend_id = bid;
		x->v.svc_id = id;
		store_u32(x->v.nat_ip, bip);
		bpf_map_update_elem(&svc_ct, &x->ck, &x->v, BPF_ANY);

		/* The reply's tuple: from the backend to the client. */
		store_u32(x->ck.saddr, bip);
		store_u32(x->ck.daddr, saddr);
		x->ck.sport = bport;
		x->ck.dport = sport;
		x->ck.dir = SVC_CT_REV;
		store_u32(x->v.nat_ip, daddr);
		x->v.nat_port = dport;
		bpf_map_update_elem(&svc_ct, &x->ck, &x->v, BPF_ANY);
	}
	if (svc_rewrite(skb, l4off, proto, ETH_HLEN + __builtin_offsetof(struct iphdr, daddr), daddr, bip,
			l4off + __builtin_offsetof(struct udphdr, dest), dport, bport))
		return POD_DROP_SVC_REWRITE;
	count_pod(POD_SVC_NAT);
	p->ports = (ports & 0xffff0000) | bpf_ntohs(bport);
	return SVC_XLATED;
}

/* A backend's reply to a connection translated on this host: its source
 * back to the Service. Called after NetworkPolicy, which must see the
 * backend's own address (its connection entry is under it). Returns as
 * svc_xlate; global for the same reasons. */
__attribute__((noinline)) int svc_rev(struct __sk_buff *skb, struct svc_pkt *p)
{
	__u32 zero = 0;
	struct svc_scratch *x = bpf_map_lookup_elem(&svc_scratch, &zero);

	if (!p || !x)
		return 0;
	__u32 saddr = p->saddr, ports = p->ports, l4off = p->l4off, proto = p->proto;
	__be16 sport = bpf_htons(ports >> 16), dport = bpf_htons(ports & 0xffff);

	__builtin_memset(&x->ck, 0, sizeof(x->ck));
	x->ck.sport = sport;
	x->ck.dport = dport;
	x->ck.proto = proto;
	x->ck.dir = SVC_CT_REV;
	store_u32(x->ck.saddr, saddr);
	store_u32(x->ck.daddr, p->daddr);
	const struct svc_ct_entry *rev = bpf_map_lookup_elem(&svc_ct, &x->ck);

	if (!rev)
		return 0;
	__u32 nip = load_u32(rev->nat_ip);
	__be16 nport = rev->nat_port;

	if (svc_rewrite(skb, l4off, proto, ETH_HLEN + __builtin_offsetof(struct iphdr, saddr), saddr, nip,
			l4off + __builtin_offsetof(struct udphdr, source), sport, nport))
		return POD_DROP_SVC_REWRITE;
	count_pod(POD_SVC_REV_NAT);
	p->ports = ((__u32)bpf_ntohs(nport) << 16) | (ports & 0xffff);
	return SVC_XLATED;
}

/* Patch a one's complement checksum for a 16-bit word changing from old
 * to nw (RFC 1624 eqn. 3). */
static __always_inline void csum_patch16(__sum16 *check, __u16 old, __u16 nw)
{
	__u32 sum = (__u16)~*check;

	sum += (__u16)~old;
	sum += nw;
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	*check = (__u16)~sum;
}

/* The underlay's delivery into a pod: a backend's reply that crossed from
 * another host (whose pod program holds no entry for it: the connection
 * was translated here, at the client's host) gets its source translated
 * back to the Service. XDP has no checksum helpers; the frame's checksums
 * are complete (nothing offloads them inside Geneve), so they are patched
 * in place. Returns 1 when it translated. */
static __always_inline int svc_rev_xdp(struct iphdr *iip, void *data_end)
{
	if (iip->ihl != 5 || (iip->frag_off & bpf_htons(IP_MF | IP_OFFMASK)))
		return 0;
	__u8 proto = iip->protocol;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 0;
	__u8 *l4 = (void *)(iip + 1);

	if ((void *)(l4 + 8) > data_end)
		return 0;
	if (!(svc_maybe(bpf_ntohs(*(__be16 *)l4), 0) & SVC_MAYBE_REPLY))
		return 0;
	struct svc_ct_key ck = { .proto = proto, .dir = SVC_CT_REV };

	store_u32(ck.saddr, iip->saddr);
	store_u32(ck.daddr, iip->daddr);
	ck.sport = *(__be16 *)l4;
	ck.dport = *(__be16 *)(l4 + 2);
	const struct svc_ct_entry *rev = bpf_map_lookup_elem(&svc_ct, &ck);

	if (!rev)
		return 0;
	__sum16 *l4check = (void *)(l4 + 6);

	if (proto == IPPROTO_TCP) {
		if ((void *)(l4 + sizeof(struct tcphdr)) > data_end)
			return 0;
		l4check = (void *)(l4 + 16);
	}
	int l4sum = proto == IPPROTO_TCP || *l4check; /* UDP: 0 = no checksum */
	__u16 *oldw = (__u16 *)&iip->saddr;
	__u32 nip = load_u32(rev->nat_ip);
	__u16 *neww = (__u16 *)&nip;

#pragma unroll
	for (int i = 0; i < 2; i++) {
		csum_patch16(&iip->check, oldw[i], neww[i]);
		if (l4sum)
			csum_patch16(l4check, oldw[i], neww[i]);
	}
	iip->saddr = nip;
	if (l4sum)
		csum_patch16(l4check, *(__u16 *)l4, rev->nat_port);
	*(__be16 *)l4 = rev->nat_port;
	if (proto == IPPROTO_UDP && l4sum && *l4check == 0)
		*l4check = 0xffff;
	return 1;
}

/* Named so that bpf2go -type emits the limits for Go (see dropev.h). */
const enum svc_limits *unused_svc_limits __attribute__((unused));
