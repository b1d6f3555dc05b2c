//go:build ignore

/* mizar's fast path: one XDP program on the node's underlay interface
 * (decapsulate, bouncer, divider) and one TC program on the host side of
 * every pod's veth (ARP for the gateway, same-host delivery, Geneve encap).
 * Layouts are in include/mizar.h, maps in include/maps.h, the shared routing
 * decision in include/route.h. */

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "mizar.h"
#include "maps.h"
#include "pkt.h"
#include "route.h"
#include "netpol.h"
#include "dropev.h"
#include "svc.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* This host's identity on the underlay, set by the Go loader before load
 * (spec.Variables["host"].Set). Constants rather than a config map: they never
 * change while an agent runs (a change means reload + atomic link update),
 * they cost no lookup per packet, and the verifier sees their values. */
volatile const struct host_config host = {};

/* volatile reads: the compiler must not fold the zero initialiser. */
static __always_inline __u32 self_ip(void)
{
	return *(const volatile __u32 *)host.ip;
}

static __always_inline void self_mac(__u8 *dst)
{
	*(__u32 *)dst = *(const volatile __u32 *)host.mac;
	*(__u16 *)(dst + 4) = *(const volatile __u16 *)(host.mac + 4);
}

/* The next hop toward underlay address dst from the kernel FIB (for hops
 * given without a MAC: not on this host's L2 segment). Fills the MACs and
 * the egress interface; returns the BPF_FIB_LKUP_RET_* code. ctx is the
 * program's context (xdp_md or __sk_buff). */
static __always_inline int fib_next_hop(void *ctx, __u32 dst, __u8 *dmac, __u8 *smac, __u32 *oif)
{
	struct bpf_fib_lookup fib = {
		.family = 2 /* AF_INET */,
		.ifindex = host.underlay_ifindex,
		.ipv4_src = self_ip(),
		.ipv4_dst = dst,
	};
	int rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), BPF_FIB_LOOKUP_OUTPUT);

	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		/* Byte copies: the MACs in struct bpf_fib_lookup are not
		 * word-aligned on the stack. */
		__builtin_memcpy(dmac, fib.dmac, ETH_ALEN);
		__builtin_memcpy(smac, fib.smac, ETH_ALEN);
		*oif = fib.ifindex;
	}
	return rc;
}

/* ------------------------------------------------------------------------ */
/* Underlay (XDP): Geneve addressed to this host.                           */
/* ------------------------------------------------------------------------ */

static __always_inline int ul_drop(struct xdp_md *ctx, enum underlay_counter c)
{
	count_ul(c);
	drop_ev_ul(ctx, DROP_SET_UNDERLAY, c);
	return XDP_DROP;
}

/* Is this frame, tagged once or twice (802.1Q, 802.1ad), Geneve to this
 * host? Mizar's underlay is untagged: a tag means another segment's frame
 * leaked in (or someone hopping VLANs). The program sees tags only where
 * the NIC leaves them in the frame (the agent turns VLAN stripping off: see
 * DisableVLANOffload); a tag already in metadata is out of XDP's sight. */
static __always_inline int tagged_geneve_for_us(void *data, void *data_end)
{
	struct ethhdr *eth = data;
	__be16 proto = eth->h_proto;
	void *p = eth + 1;

#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD))
			break;
		if (p + 4 > data_end)
			return 0;
		proto = *(__be16 *)(p + 2);
		p += 4;
	}
	if (proto != bpf_htons(ETH_P_IP))
		return 0;

	struct iphdr *iph = p;

	if ((void *)(iph + 1) > data_end || iph->daddr != self_ip() || iph->protocol != IPPROTO_UDP ||
	    iph->ihl < 5)
		return 0;

	struct udphdr *udp = (void *)iph + iph->ihl * 4;

	return (void *)(udp + 1) <= data_end && udp->dest == bpf_htons(GENEVE_PORT);
}

SEC("xdp")
int mizar_underlay(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *iph;
	struct udphdr *udp;
	struct genevehdr *gnv;

	/* Anything that is not UDP to our Geneve port on our address is the
	 * kernel's business, malformed or not: pass it untouched. */
	if ((void *)(eth + 1) > data_end)
		goto pass;
	if (eth->h_proto != bpf_htons(ETH_P_IP)) {
		if (tagged_geneve_for_us(data, data_end))
			return ul_drop(ctx, UL_DROP_VLAN);
		goto pass;
	}
	iph = (void *)(eth + 1);
	if ((void *)(iph + 1) > data_end || iph->version != 4 || iph->ihl < 5)
		goto pass;
	if (iph->daddr != self_ip() || iph->protocol != IPPROTO_UDP)
		goto pass;
	/* A non-first fragment has no UDP header; mizar sets DF and never sends one. */
	if (iph->frag_off & bpf_htons(IP_OFFMASK))
		goto pass;
	udp = (void *)iph + iph->ihl * 4;
	if ((void *)(udp + 1) > data_end || udp->dest != bpf_htons(GENEVE_PORT))
		goto pass;

	/* From here on it is Geneve for us: we either handle it or drop it.
	 * rx is not counted here: Go sums it from the verdict counters. */
	if (iph->ihl != 5)
		return ul_drop(ctx, UL_DROP_IP_OPTIONS);
	if (iph->frag_off & bpf_htons(IP_MF))
		return ul_drop(ctx, UL_DROP_FRAGMENT);
	/* NICs verify it before the stack does, not before XDP. The source
	 * address is about to decide trust: it must be the one sent. */
	if (!ipv4_csum_ok(iph))
		return ul_drop(ctx, UL_DROP_IP_CHECKSUM);
	/* This host never sends Geneve to itself: such a frame came from
	 * someone else on the segment, whatever the droplets map says. */
	if (iph->saddr == self_ip())
		return ul_drop(ctx, UL_DROP_SELF_SOURCE);
	/* Caches below are valid while the agent changes nothing. */
	__u64 gen = current_generation();

	const struct droplet *src_droplet = droplet_lookup(iph->saddr, gen);

	if (!src_droplet)
		return ul_drop(ctx, UL_DROP_NOT_DROPLET);
	/* Where the agent knows the droplet's MAC (one L2 segment), the
	 * address alone does not make the sender. Only another droplet of the
	 * segment may differ: one re-bouncing under the sender's address, to
	 * a relay (checked below, once the VNI is known). */
	int rebounced = 0;

	if (!mac_is_zero(src_droplet->mac) && !mac_eq(eth->h_source, src_droplet->mac)) {
		struct mac_key mk __attribute__((aligned(4))) = {};

		copy_mac(mk.mac, eth->h_source);
		if (!bpf_map_lookup_elem(&droplet_macs, &mk))
			return ul_drop(ctx, UL_DROP_MAC_SPOOF);
		rebounced = 1;
	}
	udp = (void *)(iph + 1);
	gnv = (void *)(udp + 1);
	if ((void *)(gnv + 1) > data_end)
		return ul_drop(ctx, UL_DROP_MALFORMED);
	/* Version 0 carrying Ethernet only. Options other than mizar's one
	 * (below) are skipped unless marked critical, which RFC 8926 says a
	 * receiver that does not understand them must drop; OAM frames have no
	 * consumer here. */
	if ((gnv->ver_optlen >> 6) != 0 || gnv->proto != bpf_htons(ETH_P_TEB_) ||
	    (gnv->flags & (GENEVE_F_OAM | GENEVE_F_CRITICAL)))
		return ul_drop(ctx, UL_DROP_GENEVE);

	__u32 optlen = (gnv->ver_optlen & 0x3f) * 4;
	struct geneve_opt_host *opt = NULL;

	/* Mizar writes at most its one option; anything else is skipped. */
	if (optlen == SRC_HOST_OPT_LEN) {
		struct geneve_opt_host *o = (void *)(gnv + 1);

		if ((void *)(o + 1) > data_end)
			return ul_drop(ctx, UL_DROP_MALFORMED);
		if (o->opt_class == bpf_htons(MIZAR_OPT_CLASS) && o->type == MIZAR_OPT_SRC_HOST && (o->len & 0x1f) == 1)
			opt = o;
	}
	struct ethhdr *ieth = (void *)(gnv + 1) + optlen;
	struct iphdr *iip = (void *)(ieth + 1);

	if ((void *)(iip + 1) > data_end)
		return ul_drop(ctx, UL_DROP_MALFORMED);
	__u32 tot = bpf_ntohs(iph->tot_len);
	if (tot > (__u32)(data_end - (void *)iph) || (void *)iph + tot < (void *)(iip + 1) ||
	    bpf_ntohs(udp->len) != tot - sizeof(*iph))
		return ul_drop(ctx, UL_DROP_MALFORMED);
	if (ieth->h_proto != bpf_htons(ETH_P_IP))
		return ul_drop(ctx, UL_DROP_INNER_NOT_IPV4);
	if (iip->version != 4 || iip->ihl < 5)
		return ul_drop(ctx, UL_DROP_MALFORMED);

	/* The sender put the flow's hash in the source port; reuse it rather
	 * than parse the inner L4 header again. */
	__u32 pick = bpf_ntohs(udp->source) & SPORT_MASK;
	__u32 self = self_ip();
	__u32 vni = vni_of(gnv);

	if (rebounced && !is_relay(vni, self))
		return ul_drop(ctx, UL_DROP_MAC_SPOOF);
	int from_relay = 0, self_relay = 0;
	struct route r;
	/* The flow's earlier decision, if the agent changed nothing since. */
	__u32 slot = pick & (FLOW_SLOTS - 1);
	struct ul_flow *fl = bpf_map_lookup_elem(&ul_flows, &slot);

	if (fl && fl->valid && fl->gen == gen && fl->vni == vni && fl->osrc == iph->saddr &&
	    fl->isrc == iip->saddr && fl->idst == iip->daddr && fl->pick == pick) {
		r = fl->r;
		from_relay = fl->from_relay;
		self_relay = fl->self_relay;
	} else {
		int learned_trust = 0;

		if (!hostpath_underlay_route(&r, vni, iip->daddr, self, gen))
			route_lookup(&r, vni, iip->daddr, pick, self);
		if (r.kind != RT_DROP) {
			int refusal = hostpath_from_host(&r, vni, iph->saddr, iip->saddr, iip->daddr) ? 0 :
				      src_refusal(vni, iph->saddr, iip->saddr, &from_relay, &learned_trust);

			if (refusal)
				return ul_drop(ctx, refusal);
			if (r.kind == RT_REMOTE)
				self_relay = is_relay(vni, self);
		}
		/* Drops are kept too (a flood of them is cheap); trust learned
		 * from a relay expires, so is checked per packet. */
		if (fl && !learned_trust) {
			fl->gen = gen;
			fl->vni = vni;
			fl->osrc = iph->saddr;
			fl->isrc = iip->saddr;
			fl->idst = iip->daddr;
			fl->pick = pick;
			fl->from_relay = from_relay;
			fl->self_relay = self_relay;
			fl->learned = 0;
			fl->r = r;
			fl->valid = 1;
		} else {
			fl = NULL; /* the slot is another flow's */
		}
	}

	if (r.kind == RT_LOCAL) {
		/* NetworkPolicy: the receiving pod's ingress (counted in np_stats). */
		if (np_on()) {
			int np = np_deliver(ctx, vni, iip);

			if (np) {
				drop_ev_ul(ctx, DROP_SET_POLICY, np);
				return XDP_DROP;
			}
		}
		/* A Service backend's reply from another host (svc.h). */
		if (svc_on() && svc_rev_xdp(iip, data_end))
			count_ul(UL_SVC_REV_NAT);
		/* RFC 6040 normal mode: congestion marked on the underlay reaches
		 * the pod; the inner DSCP is the sender's (pipe model). */
		int ecn = ecn_decap(iph->tos, iip->tos);

		if (ecn < 0)
			return ul_drop(ctx, UL_DROP_ECN);
		if (ecn != (iip->tos & ECN_MASK))
			ipv4_set_ecn(iip, ecn);
		/* A relay vouches for where the inner source lives. */
		if (from_relay && opt && host.learn_ns) {
			__u32 sender = load_u32(opt->host);

			__u64 j = bpf_jiffies64();

			/* This flow refreshed the entry (or was refused) a moment
			 * ago; else what a relay says is checked against what the
			 * API says. */
			int refused = fl && fl->learned == sender && j - fl->learned_j < learn_skip_jiffies() ?
					      -1 : learn_refusal(vni, iip->saddr, sender, self, gen);

			if (refused > 0)
				count_ul(refused);
			if (refused > 0 && fl) {
				fl->learned = sender;
				fl->learned_j = j;
			}
			if (!refused) {
				struct endpoint_key k = { .vni = vni };
				__u64 now = bpf_ktime_get_coarse_ns();

				if (fl) {
					fl->learned = sender;
					fl->learned_j = j;
				}

				store_u32(k.ip, iip->saddr);
				struct learned_entry *cur = bpf_map_lookup_elem(&learned, &k);

				/* Rewritten only when the host changed or half the
				 * lifetime has passed: an update per packet of a
				 * bounced flow costs more than the rest of the path. */
				if (!cur || load_u32(cur->host_ip) != sender ||
				    cur->expires < now + host.learn_ns / 2) {
					struct learned_entry v = { .expires = now + host.learn_ns };

					store_u32(v.host_ip, sender);
					if (!bpf_map_update_elem(&learned, &k, &v, BPF_ANY)) {
						count_ul(UL_LEARN);
						/* Pod sides that found no live host
						 * for isrc look again. */
						if (!cur || load_u32(cur->host_ip) != sender || cur->expires <= now)
							bump_generation();
					}
				}
			}
		}
		copy_mac(ieth->h_dest, r.dst_mac);
		int off = (void *)ieth - data;

		if (bpf_xdp_adjust_head(ctx, off))
			return ul_drop(ctx, UL_DROP_ADJUST);
		/* The pod-side peer needs NAPI (GRO on, see EnableGRO in Go) or the
		 * veth drops redirected frames; such drops after the program are
		 * the kernel's to count (KernelDrops). */
		long ret = bpf_redirect(r.ifindex, 0);

		if (ret != XDP_REDIRECT)
			return ul_drop(ctx, UL_DROP_REDIRECT);
		count_ul(UL_DELIVER);
		return ret;
	}

	if (r.kind == RT_REMOTE) {
		/* Outer TTL guards against a loop between misconfigured hosts. */
		if (iph->ttl <= 1)
			return ul_drop(ctx, UL_DROP_TTL);
		/* A relay forwards under its own address (trusted for the whole
		 * VPC) and writes the sender it verified into the option. Any other
		 * host only re-bounces what a sender sent it directly (to a pod
		 * no longer here): under the sender's address, so the next relay
		 * checks the sender, not us. */
		if (!self_relay && from_relay)
			return ul_drop(ctx, UL_DROP_UNKNOWN_DST);
		if (self_relay && !from_relay && opt) {
			store_u32(opt->host, iph->saddr);
			count_ul(UL_STAMP);
		}
		__u32 out_ifindex = ctx->ingress_ifindex;

		if (mac_is_zero(r.next.mac)) {
			/* Not an L2 neighbour: the kernel FIB names the next
			 * hop (a router) and its MAC. XDP cannot wait for ARP;
			 * the host's own traffic keeps its router resolved. */
			int rc = fib_next_hop(ctx, load_u32(r.next.ip), eth->h_dest, eth->h_source, &out_ifindex);

			if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
				return ul_drop(ctx, UL_DROP_NO_NEIGH);
			if (rc != BPF_FIB_LKUP_RET_SUCCESS)
				return ul_drop(ctx, UL_DROP_NO_ROUTE);
		} else {
			copy_mac(eth->h_dest, r.next.mac);
			self_mac(eth->h_source);
		}
		if (self_relay)
			iph->saddr = self;
		else
			count_ul(UL_REBOUNCE);
		iph->daddr = load_u32(r.next.ip);
		iph->ttl--;
		iph->check = ipv4_csum(iph);
		/* The pseudo-header changed; 0 = no checksum, allowed over IPv4.
		 * The source port (flow entropy) is kept. */
		udp->check = 0;
		switch (r.via) {
		case VIA_ENDPOINT:
			count_ul(UL_FWD_ENDPOINT);
			break;
		case VIA_SUBNET:
			count_ul(UL_FWD_SUBNET);
			break;
		default:
			count_ul(UL_FWD_DIVIDER);
			break;
		}
		if (out_ifindex != ctx->ingress_ifindex)
			return bpf_redirect(out_ifindex, 0);
		return XDP_TX;
	}

	return ul_drop(ctx, r.via == VIA_UNKNOWN_VNI ? UL_DROP_UNKNOWN_VNI : UL_DROP_UNKNOWN_DST);

pass:
	count_ul(UL_PASS);
	return XDP_PASS;
}

/* ------------------------------------------------------------------------ */
/* Pod side (TC ingress of the host-side veth = the pod's egress).          */
/* ------------------------------------------------------------------------ */

/* Hook choice, measured on this machine (2 vCPU VM, kernel 6.18): iperf3,
 * one TCP stream pod netns -> host netns over one veth pair, 5 s per hook,
 * all in one run (BenchmarkPodHook, hack/bench-dataplane.sh):
 *
 *     no program on the host-side veth   20.70 Gbit/s
 *     tcx ingress, pass                  24.14 Gbit/s  (x1.17, noise)
 *     native XDP, pass                    4.43 Gbit/s  (x0.21)
 *     generic XDP, pass                  20.69 Gbit/s  (x1.00)
 *
 * Native XDP on the host-side veth strips TSO/GSO from the pod's eth0 and
 * clamps its MTU, so every segment crosses the stack on its own; generic XDP
 * sees 64 KB GSO packets that bpf_xdp_adjust_head cannot encapsulate
 * correctly. TC keeps the skb: bpf_skb_adjust_room with the ENCAP flags marks
 * it SKB_GSO_UDP_TUNNEL, so the kernel (or the NIC) segments after encap, and
 * the checksum state of the inner packet survives. Hence TC: a cls_bpf
 * filter, whose attach costs no RCU grace period under rtnl (tcx's does). */

static __always_inline int pod_drop(struct __sk_buff *skb, enum pod_counter c)
{
	count_pod(c);
	drop_ev_pod(skb, DROP_SET_POD, c);
	return TC_ACT_SHOT;
}

/* Send the verdict of a redirect, counting c only if the helper took it. */
static __always_inline int pod_redirected(struct __sk_buff *skb, long ret, enum pod_counter c)
{
	if (ret != TC_ACT_REDIRECT)
		return pod_drop(skb, POD_DROP_REDIRECT);
	count_pod(c);
	return ret;
}

/* Turn the pod's packet into an ICMP error about it, from the pod's gateway,
 * and send it back into the pod. rest is the ICMP header's second word.
 * Returns the TC verdict, or -1 when no error may or can be sent: about a
 * later fragment, an ICMP error (RFC 1122 3.2.2), a header with options or
 * a packet too short to quote. */
static __always_inline int pod_icmp_error(struct __sk_buff *skb, const struct pod_iface *cfg, __u8 type,
					  __u8 code, __be32 rest, enum pod_counter c)
{
	struct {
		struct icmphdr icmp;
		struct iphdr ip;
		__u8 l4[8];
	} m = {};

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &m.ip, sizeof(m.ip) + sizeof(m.l4)))
		return -1;
	if (m.ip.ihl != 5 || (m.ip.frag_off & bpf_htons(IP_OFFMASK)))
		return -1;
	if (m.ip.protocol == IPPROTO_ICMP && m.l4[0] != ICMP_ECHO && m.l4[0] != ICMP_TIMESTAMP)
		return -1;
	m.icmp.type = type;
	m.icmp.code = code;
	m.icmp.un.gateway = rest;

	__u16 *w = (__u16 *)&m;
	__u32 sum = 0;

#pragma unroll
	for (int i = 0; i < (int)sizeof(m) / 2; i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	m.icmp.checksum = (__u16)~sum;

	struct iphdr ip = {};

	ip.version = 4;
	ip.ihl = 5;
	ip.tos = 0xc0; /* internetwork control, as the kernel's own ICMP errors */
	ip.tot_len = bpf_htons(sizeof(ip) + sizeof(m));
	ip.ttl = OUTER_TTL;
	ip.protocol = IPPROTO_ICMP;
	ip.saddr = load_u32(cfg->gw_ip);
	ip.daddr = m.ip.saddr;
	ip.check = ipv4_csum(&ip);

	struct icmp_error e;

	/* Byte copies: e is packed, its MACs are not word-aligned on the stack. */
	__builtin_memcpy(e.eth.h_dest, cfg->mac, ETH_ALEN);
	__builtin_memcpy(e.eth.h_source, cfg->gw_mac, ETH_ALEN);
	e.eth.h_proto = bpf_htons(ETH_P_IP);
	__builtin_memcpy(&e.ip, &ip, sizeof(ip));
	__builtin_memcpy(&e.icmp, &m, sizeof(m));

	if (bpf_skb_change_tail(skb, sizeof(e), 0) || bpf_skb_store_bytes(skb, 0, &e, sizeof(e), 0))
		return -1;
	/* Egress of the same host-side veth: straight back into the pod. */
	return pod_redirected(skb, bpf_redirect(skb->ifindex, 0), c);
}

/* Make the first need bytes directly readable; 0 on success. */
static __always_inline int pull(struct __sk_buff *skb, __u32 need)
{
	if ((void *)(long)skb->data + need <= (void *)(long)skb->data_end)
		return 0;
	if (need > skb->len)
		return -1;
	return bpf_skb_pull_data(skb, need);
}

static __always_inline __u32 prefix_mask(__u32 len)
{
	if (len == 0)
		return 0;
	if (len >= 32)
		return 0xffffffff;
	return bpf_htonl(0xffffffffU << (32 - len));
}

static __always_inline int in_subnet(const struct pod_iface *cfg, __u32 addr)
{
	return (addr & prefix_mask(cfg->subnet_len)) == load_u32(cfg->subnet);
}

/* Answer the pod's ARP for its gateway, and for any other address of its
 * subnet, with the gateway's MAC (proxy ARP): on-link peers may live on any
 * host, and the delivering host writes the real destination MAC anyway. */
static __always_inline int pod_arp(struct __sk_buff *skb, const struct pod_iface *cfg)
{
	if (pull(skb, ETH_HLEN + sizeof(struct arp_eth)))
		return pod_drop(skb, POD_DROP_MALFORMED);

	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct arp_eth *arp = (void *)(eth + 1);

	if ((void *)(arp + 1) > data_end)
		return pod_drop(skb, POD_DROP_MALFORMED);
	if (arp->htype != bpf_htons(1) || arp->ptype != bpf_htons(ETH_P_IP) || arp->hlen != ETH_ALEN ||
	    arp->plen != 4 || arp->op != bpf_htons(1 /* request */))
		return pod_drop(skb, POD_DROP_ARP);

	__u32 spa = load_u32(arp->spa);
	__u32 tpa = load_u32(arp->tpa);
	__u32 own = load_u32(cfg->ip);

	/* Probes (sender 0.0.0.0) and gratuitous ARP are not answered: the
	 * pod's own address is never in use by anyone else. */
	if (spa != own || tpa == own)
		return pod_drop(skb, POD_DROP_ARP);
	if (tpa != load_u32(cfg->gw_ip) && !in_subnet(cfg, tpa))
		return pod_drop(skb, POD_DROP_ARP);

	arp->op = bpf_htons(2 /* reply */);
	copy_mac(arp->tha, arp->sha);
	store_u32(arp->tpa, spa);
	copy_mac(arp->sha, cfg->gw_mac);
	store_u32(arp->spa, tpa);
	copy_mac(eth->h_dest, eth->h_source);
	copy_mac(eth->h_source, cfg->gw_mac);
	/* Egress of the same host-side veth: straight back into the pod. */
	return pod_redirected(skb, bpf_redirect(skb->ifindex, 0), POD_ARP_REPLY);
}

/* Encapsulate the pod's IPv4 packet toward r->next and send it out of the
 * underlay, counting done. with_opt adds the sending-host option. */
static __always_inline int pod_encap(struct __sk_buff *skb, const struct pod_iface *cfg,
				     const struct route *r, const __u8 *idst, const __u8 *isrc,
				     __u8 tos, __u16 sport, const int with_opt, enum pod_counter done)
{
	__u8 dmac[8] __attribute__((aligned(8))), smac[8] __attribute__((aligned(8)));
	__u32 oif = host.underlay_ifindex;
	int via_neigh = 0;

	/* Not an L2 neighbour (zero MAC): the kernel FIB gives the next hop's
	 * MACs. Until it has resolved them the kernel does the routing and
	 * the ARP itself (bpf_redirect_neigh, which queues the packet). */
	if (mac_is_zero(r->next.mac)) {
		__builtin_memset(dmac, 0, sizeof(dmac));
		__builtin_memset(smac, 0, sizeof(smac));
		via_neigh = fib_next_hop(skb, load_u32(r->next.ip), dmac, smac, &oif) !=
			    BPF_FIB_LKUP_RET_SUCCESS;
	} else {
		copy_mac(dmac, r->next.mac);
		self_mac(smac);
	}
	const __u32 hlen = with_opt ? sizeof(struct geneve_encap_opt) : sizeof(struct geneve_encap);

	/* Room for outer IPv4 + UDP + Geneve (+ option) + inner Ethernet after
	 * the MAC header. The ENCAP flags make GSO packets SKB_GSO_UDP_TUNNEL
	 * with inner Ethernet (TEB), segmented after us; FIXED_GSO keeps
	 * gso_size because the pod's MTU already leaves room for the 50 bytes
	 * (the option is only added to packets that fit it). */
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 |
		      BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH |
		      BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN);

	/* A packet the host forwards (a NodePort's, DNATed to another node's
	 * pod) may be the very skb that arrived encapsulated: over a veth
	 * underlay (kind) the sender's skb crosses whole, and the kernel keeps
	 * its encapsulation mark through our XDP decapsulation, so the ENCAP
	 * flags are refused (-EALREADY). The room alone is what we need; the
	 * tunnel GSO type such a packet already carries is the one we add. */
	if (bpf_skb_adjust_room(skb, hlen - ETH_HLEN, BPF_ADJ_ROOM_MAC, flags) &&
	    bpf_skb_adjust_room(skb, hlen - ETH_HLEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO))
		return pod_drop(skb, POD_DROP_ENCAP);

	__u32 len = skb->len;

	/* Built apart, aligned, so its 16-bit words are summed in place. */
	struct iphdr ip = {};

	ip.version = 4;
	ip.ihl = 5;
	ip.tos = tos;
	ip.tot_len = bpf_htons(len - ETH_HLEN);
	ip.frag_off = bpf_htons(IP_DF); /* never fragment on the underlay */
	ip.ttl = OUTER_TTL;
	ip.protocol = IPPROTO_UDP;
	ip.saddr = self_ip();
	ip.daddr = load_u32(r->next.ip);
	ip.check = ipv4_csum(&ip);

	/* Written straight into the packet, a word at a time (no
	 * bpf_skb_store_bytes): bpf_skb_adjust_room made the new room part of
	 * the linear head. The layout is struct geneve_encap(_opt). */
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *p = data;

	if (data + sizeof(struct geneve_encap_opt) > data_end)
		return pod_drop(skb, POD_DROP_ENCAP);
	copy_mac(p, dmac);
	copy_mac(p + 6, smac);
	*(__u16 *)(p + 12) = bpf_htons(ETH_P_IP);
#pragma unroll
	for (int i = 0; i < 5; i++)
		((__u32 *)(p + ETH_HLEN))[i] = ((const __u32 *)&ip)[i];

	struct udphdr *udp = (void *)(p + ETH_HLEN + sizeof(struct iphdr));

	udp->source = bpf_htons(sport);
	udp->dest = bpf_htons(GENEVE_PORT);
	udp->len = bpf_htons(len - ETH_HLEN - sizeof(struct iphdr));
	udp->check = 0; /* allowed for UDP over IPv4 (RFC 8926 3.3) */

	struct genevehdr *gnv = (void *)(udp + 1);

	/* Version 0, no flags, Ethernet; VNI and reserved byte as one word. */
	*(__u16 *)gnv = with_opt ? SRC_HOST_OPT_LEN / 4 : 0;
	gnv->proto = bpf_htons(ETH_P_TEB_);
	*(__u32 *)gnv->vni = bpf_htonl(cfg->vni << 8);

	__u8 *inner = (__u8 *)(gnv + 1);

	if (with_opt) {
		struct geneve_opt_host *opt = (void *)inner;

		opt->opt_class = bpf_htons(MIZAR_OPT_CLASS);
		*(__u16 *)&opt->type = MIZAR_OPT_SRC_HOST | (1 << 8); /* type, len 1 */
		store_u32(opt->host, ip.saddr); /* the first relay overwrites it */
		inner += sizeof(*opt);
	}
	/* Inner Ethernet: the delivering host rewrites the destination anyway. */
	copy_mac(inner, idst);
	copy_mac(inner + 6, isrc);
	*(__u16 *)(inner + 12) = bpf_htons(ETH_P_IP);

	if (via_neigh)
		return pod_redirected(skb, bpf_redirect_neigh(host.underlay_ifindex, NULL, 0, 0), done);
	return pod_redirected(skb, bpf_redirect(oif, 0), done);
}

/* The next hop toward a learned host (a droplet: checked when the flow
 * looked it up): its MAC when the agent gave one (same L2 segment), else
 * zero for the FIB to resolve. */
static __always_inline void learned_hop(struct hop *h, __u32 peer, __u64 gen)
{
	const struct droplet *d = droplet_lookup(peer, gen);

	store_u32(h->ip, peer);
	if (d)
		copy_mac(h->mac, d->mac);
	else
		__builtin_memset(h->mac, 0, ETH_ALEN);
}

/* Frames a pod sends to a broadcast or multicast destination (Ethernet or
 * IPv4, the subnet's broadcast address included) reach no pod: mizar has no
 * broadcast domain, and a relay drops them after they crossed the underlay.
 * A pod may send flood_rate of them a second (bursts of as many), the
 * rest are dropped here and counted, so a storm stays on its host. 0 = no
 * limit. Set by the Go loader, like host. */
volatile const __u32 flood_rate = 0;

/* GCRA per pod interface: the theoretical arrival time of its next frame. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} pod_flood SEC(".maps");

static __always_inline int flood_dst(const struct ethhdr *eth, const struct pod_iface *cfg, __u32 daddr)
{
	__u32 h = bpf_ntohl(daddr);

	return (eth->h_dest[0] & 1) || (h >> 28) == 0xe || h == 0xffffffff ||
	       daddr == (load_u32(cfg->subnet) | ~prefix_mask(cfg->subnet_len));
}

/* May pod ifindex send one more flood frame now? Unlocked: racing CPUs
 * may let a frame or two more through, never fewer. */
static __always_inline int flood_ok(__u32 ifindex)
{
	__u32 rate = *(const volatile __u32 *)&flood_rate;

	if (!rate)
		return 1;
	__u64 interval = 1000000000ULL / rate, now = bpf_ktime_get_ns();
	__u64 *tat = bpf_map_lookup_elem(&pod_flood, &ifindex);

	if (!tat) {
		__u64 next = now + interval;

		bpf_map_update_elem(&pod_flood, &ifindex, &next, BPF_ANY);
		return 1;
	}
	__u64 t = *tat > now ? *tat : now;

	/* A second's worth of frames may be ahead of the clock: the burst. */
	if (t - now >= 1000000000ULL)
		return 0;
	*tat = t + interval;
	return 1;
}

SEC("tc")
int mizar_pod(struct __sk_buff *skb)
{
	/* Caches below are valid while the agent changes nothing. */
	__u64 gen = current_generation();
	const struct pod_iface *cfg = pod_config(skb->ifindex, gen);

	/* An interface the agent has not described yet sends nothing. */
	if (!cfg)
		return pod_drop(skb, POD_DROP_NO_CONFIG);

	if (pull(skb, ETH_HLEN))
		return pod_drop(skb, POD_DROP_MALFORMED);
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return pod_drop(skb, POD_DROP_MALFORMED);
	/* Frames leave only as what the endpoint is. The kernel moved an
	 * 802.1Q/802.1ad tag into metadata before TC (the encap would carry it
	 * onto the underlay); a second tag of a QinQ frame is still inline. */
	if (skb->vlan_present || eth->h_proto == bpf_htons(ETH_P_8021Q) ||
	    eth->h_proto == bpf_htons(ETH_P_8021AD))
		return pod_drop(skb, POD_DROP_VLAN);
	if (eth->h_source[0] & 1)
		return pod_drop(skb, POD_DROP_MAC_MULTICAST);
	if (!mac_eq(eth->h_source, cfg->mac))
		return pod_drop(skb, POD_DROP_MAC_SPOOF);
	if (eth->h_proto == bpf_htons(ETH_P_ARP))
		return pod_arp(skb, cfg);
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return pod_drop(skb, POD_DROP_NOT_IPV4);

	if (pull(skb, ETH_HLEN + sizeof(struct iphdr)))
		return pod_drop(skb, POD_DROP_MALFORMED);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	struct iphdr *iph = data + ETH_HLEN;

	if ((void *)(iph + 1) > data_end)
		return pod_drop(skb, POD_DROP_MALFORMED);
	if (iph->version != 4 || iph->ihl < 5)
		return pod_drop(skb, POD_DROP_MALFORMED);
	if (iph->saddr != load_u32(cfg->ip))
		return pod_drop(skb, POD_DROP_SPOOF);

	/* Ports only from first (or whole) datagrams of protocols that have
	 * them at the start of L4; fragments hash on addresses alone. */
	__u8 proto = iph->protocol;
	__u32 ports = 0;

	if (!(iph->frag_off & bpf_htons(IP_MF | IP_OFFMASK)) &&
	    (proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP)) {
		__u32 l4 = ETH_HLEN + iph->ihl * 4;

		if (pull(skb, l4 + 4))
			return pod_drop(skb, POD_DROP_MALFORMED);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		__u8 *p = data + l4;

		if ((void *)(p + 4) > data_end)
			return pod_drop(skb, POD_DROP_MALFORMED);
		ports = ((__u32)p[0] << 24) | ((__u32)p[1] << 16) | ((__u32)p[2] << 8) | p[3];
		iph = data + ETH_HLEN;
		if ((void *)(iph + 1) > data_end)
			return pod_drop(skb, POD_DROP_MALFORMED);
	}
	eth = data;

	/* Services (svc.h): compiled out unless enabled, skipped while none
	 * is programmed. */
	__u32 svc_m = svc_on() && ports && proto != IPPROTO_SCTP ? svc_maybe(ports >> 16, ports & 0xffff) : 0;

	struct svc_pkt sp; /* one for both calls: the stack is short */

	if (svc_m & SVC_MAYBE_FRONTEND) {
		sp.saddr = iph->saddr;
		sp.daddr = iph->daddr;
		sp.ports = ports;
		sp.l4off = ETH_HLEN + iph->ihl * 4;
		sp.proto = proto;
		int sv = svc_xlate(skb, &sp);

		if (sv > 0)
			return pod_drop(skb, sv);
		if (sv == SVC_XLATED) {
			svc_m = 0; /* to a Service: no reply of one */
			ports = sp.ports;
		}
		/* The verifier forgets packet pointers across a global
		 * function that is given the skb. */
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		eth = data;
		iph = data + ETH_HLEN;
		if ((void *)(iph + 1) > data_end)
			return pod_drop(skb, POD_DROP_MALFORMED);
	}

	__u32 daddr = iph->daddr;

	if (flood_dst(eth, cfg, daddr) && !flood_ok(skb->ifindex))
		return pod_drop(skb, POD_DROP_FLOOD);
	__u32 hash = flow_hash(iph->saddr, daddr, ports, proto);
	__u16 sport = flow_sport(hash);
	struct route r;

	struct rt_flow *rf = route_lookup_cached(&r, cfg->vni, daddr, sport & SPORT_MASK, self_ip(), gen);
	/* To this node itself (kubelet probes): the host stack answers, through
	 * the /32 route the agent keeps to the pod over this veth. */
	if (r.kind == RT_HOST) {
		hostpath_mark(skb, cfg->vni);
		count_pod(POD_TO_HOST);
		return TC_ACT_OK;
	}
	if (r.kind == RT_DROP)
		return pod_drop(skb, r.via == VIA_UNKNOWN_VNI ? POD_DROP_UNKNOWN_VNI : POD_DROP_UNKNOWN_DST);
	/* NetworkPolicy: this pod's egress, and the receiver's ingress when it
	 * is a pod of this host (counted in np_stats). */
	if (np_on()) {
		int np = np_check(cfg->vni, iph->saddr, daddr, proto, ports, 1, r.kind == RT_LOCAL);

		if (np) {
			drop_ev_pod(skb, DROP_SET_POLICY, np);
			return TC_ACT_SHOT;
		}
	}

	/* A Service backend's reply to a client here: from the Service
	 * (svc.h), once policy has seen the backend's address. */
	if (svc_m & SVC_MAYBE_REPLY) {
		sp.saddr = iph->saddr;
		sp.daddr = daddr;
		sp.ports = ports;
		sp.l4off = ETH_HLEN + iph->ihl * 4;
		sp.proto = proto;
		int sv = svc_rev(skb, &sp);

		if (sv > 0)
			return pod_drop(skb, sv);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		eth = data;
		iph = data + ETH_HLEN;
		if ((void *)(iph + 1) > data_end)
			return pod_drop(skb, POD_DROP_MALFORMED);
	}

	/* Leaving the subnet is routing through the gateway: one TTL hop,
	 * taken here and nowhere else on the path. */
	int cross = !in_subnet(cfg, daddr);

	if (cross) {
		if (iph->ttl <= 1) {
			/* The gateway is a hop: traceroute shows it. */
			int ret = pod_icmp_error(skb, cfg, ICMP_TIME_EXCEEDED, ICMP_EXC_TTL, 0,
						 POD_ICMP_TIME_EXCEEDED);

			return ret < 0 ? pod_drop(skb, POD_DROP_TTL) : ret;
		}
		ipv4_decrease_ttl(iph);
	}

	if (r.kind == RT_LOCAL) {
		copy_mac(eth->h_dest, r.dst_mac);
		copy_mac(eth->h_source, cfg->gw_mac);
		/* Straight into the other pod's netns: skips a backlog pass. */
		return pod_redirected(skb, bpf_redirect_peer(r.ifindex, 0), POD_LOCAL);
	}

	/* DSCP and ECN are copied to the outer header (RFC 6040 normal mode:
	 * the underlay may mark CE, decapsulation carries it inward). */
	__u8 tos = iph->tos;
	__u32 saddr = iph->saddr;
	int fits_opt = 0;

	/* The pod's MTU leaves room for Geneve; a pod that sends more anyway
	 * learns the path MTU, unless it allows fragmenting, which is not done
	 * here. GSO packets are segmented to their gso_size later. */
	if (!skb->gso_size && skb->len - ETH_HLEN + GENEVE_OVERHEAD + SRC_HOST_OPT_LEN <= host.mtu) {
		/* Fits the MTU the agent sized the pods from, option included:
		 * no need to ask the kernel. */
		fits_opt = 1;
	} else if (!skb->gso_size) {
		__u32 mtu = 0;
		__u16 frag_off = iph->frag_off;
		int rc = bpf_check_mtu(skb, host.underlay_ifindex, &mtu, GENEVE_OVERHEAD, 0);

		/* Room for the sending-host option too? */
		fits_opt = rc == 0 && skb->len - ETH_HLEN + GENEVE_OVERHEAD + SRC_HOST_OPT_LEN <= mtu;
		if (rc == BPF_MTU_CHK_RET_FRAG_NEEDED) {
			if (!(frag_off & bpf_htons(IP_DF)) || mtu <= GENEVE_OVERHEAD)
				return pod_drop(skb, POD_DROP_TOO_BIG);
			int ret = pod_icmp_error(skb, cfg, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED,
						 bpf_htonl(mtu - GENEVE_OVERHEAD), POD_ICMP_FRAG_NEEDED);

			return ret < 0 ? pod_drop(skb, POD_DROP_TOO_BIG) : ret;
		}
	}

	/* Through a relay (the agent named no host for daddr): go direct if
	 * a relay taught us where daddr lives and this pod has been introduced
	 * to that host; otherwise through the relay, introducing the pod. */
	enum pod_counter done = POD_ENCAP;
	int with_opt = 0;

	__u64 j = bpf_jiffies64();

	if (r.via == VIA_ENDPOINT && host.learn_ns && fits_opt && rf && j >= rf->introduce_j) {
		/* Straight to the endpoint's host: only a relay of the VPC (a
		 * bouncer or divider, which hold other hosts' endpoints) sends so.
		 * The receiver may hold no route to this pod and would answer
		 * through a relay for as long as the flow lasts: introduce the
		 * pod (a relay's word is trusted), once per half lifetime. */
		with_opt = 1;
		rf->introduce_j = j + host.learn_ns / 2 / JIFFY_MAX_NS;
		done = POD_INTRODUCE;
	} else if (r.via != VIA_ENDPOINT && host.learn_ns && rf && rf->peer && rf->saddr == saddr &&
	    j < rf->direct_until) {
		/* Decided below for an earlier packet of this flow. */
		learned_hop(&r.next, rf->peer, gen);
		done = POD_ENCAP_LEARNED;
	} else if (r.via != VIA_ENDPOINT && host.learn_ns && rf && rf->unlearned) {
		/* Nothing learned about daddr when the flow looked (below). */
		with_opt = fits_opt;
	} else if (r.via != VIA_ENDPOINT && host.learn_ns) {
		__u64 now = 0, expires = 0;
		__u32 peer = learned_host(cfg->vni, daddr, &now, 1, &expires);

		/* Only ever toward a droplet the API names (an entry learned
		 * before its droplet went, or before this check, is ignored). */
		if (peer && (peer == self_ip() || !known_droplet(peer, gen)))
			peer = 0;
		with_opt = fits_opt;
		if (!peer && rf)
			rf->unlearned = 1;
		if (peer) {
			struct intro_key ik = { .vni = cfg->vni };

			store_u32(ik.ip, saddr);
			store_u32(ik.host_ip, peer);
			__u64 *t = bpf_map_lookup_elem(&introduced, &ik);
			__u64 age = t ? now - *t : ~0ULL;

			/* Direct from INTRODUCE_DELAY_NS (the introduction has
			 * arrived) to half the lifetime; then the next packet
			 * that fits the option introduces again (refreshing the
			 * peer's entry), bigger ones stay direct until 3/4. */
			if (age >= INTRODUCE_DELAY_NS &&
			    (age < host.learn_ns / 2 || (!fits_opt && age < host.learn_ns / 4 * 3))) {
				learned_hop(&r.next, peer, gen);
				with_opt = 0;
				done = POD_ENCAP_LEARNED;
				/* Later packets of the flow skip the lookups until
				 * half the lifetime or the entry's expiry, whichever
				 * is first, counting jiffies long (JIFFY_MAX_NS). */
				__u64 left = host.learn_ns / 2 - age;

				if (expires - now < left)
					left = expires - now;
				if (rf && age < host.learn_ns / 2) {
					rf->saddr = saddr;
					rf->peer = peer;
					rf->direct_until = j + left / JIFFY_MAX_NS;
				}
			} else if (fits_opt && age >= INTRODUCE_DELAY_NS) {
				bpf_map_update_elem(&introduced, &ik, &now, BPF_ANY);
				done = POD_INTRODUCE;
			}
		}
	}

	/* Inner Ethernet: the endpoint's MAC when known (the delivering host
	 * rewrites it anyway), the gateway as source when routed. */
	__u8 idst[ETH_ALEN] __attribute__((aligned(4))), isrc[ETH_ALEN] __attribute__((aligned(4)));

	copy_mac(idst, r.has_mac ? r.dst_mac : eth->h_dest);
	copy_mac(isrc, cross ? cfg->gw_mac : eth->h_source);
	/* Two inlined copies, so each has constant sizes. */
	if (with_opt)
		return pod_encap(skb, cfg, &r, idst, isrc, tos, sport, 1, done);
	return pod_encap(skb, cfg, &r, idst, isrc, tos, sport, 0, done);
}
