//go:build ignore

/* Packet headers, checksums and the flow hash shared by both programs. */
#pragma once

#include <linux/types.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>

#include "mizar.h"

#define IP_MF 0x2000
#define IP_DF 0x4000
#define IP_OFFMASK 0x1FFF

/* Geneve base header (RFC 8926 3.4). */
struct genevehdr {
	__u8 ver_optlen; /* Ver:2 | Opt Len:6 (4-byte words) */
	__u8 flags;      /* O:1 | C:1 | Rsvd:6 */
	__be16 proto;
	__u8 vni[3];
	__u8 rsvd;
};

#define GENEVE_F_OAM 0x80
#define GENEVE_F_CRITICAL 0x40

/* ARP for IPv4 over Ethernet (RFC 826), the only kind a pod sends. */
struct arp_eth {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 op;
	__u8 sha[6];
	__u8 spa[4];
	__u8 tha[6];
	__u8 tpa[4];
} __attribute__((packed));

/* ICMP (RFC 792); <linux/icmp.h> pulls in libc socket headers. */
struct icmphdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	union {
		__be32 gateway;
		struct {
			__be16 unused;
			__be16 mtu;
		} frag;
	} un;
};

#define ICMP_ECHO 8
#define ICMP_DEST_UNREACH 3
#define ICMP_FRAG_NEEDED 4
#define ICMP_TIME_EXCEEDED 11
#define ICMP_EXC_TTL 0
#define ICMP_TIMESTAMP 13

/* An ICMP error the pod-side program sends back to its pod, quoting the
 * offending packet's IPv4 header (options refused: never quoted) and the
 * first 8 bytes after it, as RFC 792 asks. */
struct icmp_error {
	struct ethhdr eth;
	struct iphdr ip;
	struct icmphdr icmp;
	struct iphdr quoted_ip;
	__u8 quoted_l4[8];
} __attribute__((packed));

/* Mizar's one Geneve option: the sending host (see mizar.h). */
struct geneve_opt_host {
	__be16 opt_class;
	__u8 type;
	__u8 len; /* R:3 | data length in 4-byte words:5 */
	__u8 host[4];
} __attribute__((packed));

/* Everything pushed in front of the pod's IPv4 packet on encapsulation. */
struct geneve_encap {
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
	struct genevehdr gnv;
	struct ethhdr inner;
} __attribute__((packed));

/* The same, with the sending-host option. */
struct geneve_encap_opt {
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
	struct genevehdr gnv;
	struct geneve_opt_host opt;
	struct ethhdr inner;
} __attribute__((packed));

_Static_assert(sizeof(struct geneve_encap) == ETH_HLEN + GENEVE_OVERHEAD,
	       "encap header must be the 50-byte Geneve overhead plus outer Ethernet");
_Static_assert(sizeof(struct geneve_opt_host) == SRC_HOST_OPT_LEN, "sending-host option is 8 bytes");

/* Addresses are byte arrays (see mizar.h) but are read and written as
 * words: memcpy from a __u8 array compiles to one load per byte. Packets and
 * map values may be accessed unaligned (the verifier allows it where the CPU
 * does it at full speed: x86-64, arm64); stack objects holding addresses are
 * laid out or declared so that these words are aligned, as the verifier
 * requires there. */
static __always_inline __u32 load_u32(const __u8 *p)
{
	return *(const __u32 *)p;
}

static __always_inline void store_u32(__u8 *p, __u32 v)
{
	*(__u32 *)p = v;
}

static __always_inline void copy_mac(__u8 *dst, const __u8 *src)
{
	*(__u32 *)dst = *(const __u32 *)src;
	*(__u16 *)(dst + 4) = *(const __u16 *)(src + 4);
}

static __always_inline int mac_is_zero(const __u8 *m)
{
	return (*(const __u32 *)m | *(const __u16 *)(m + 4)) == 0;
}

static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	/* Compared as a 4- and a 2-byte word: one branch, no loop. */
	return ((*(const __u32 *)a ^ *(const __u32 *)b) |
		(__u32)(*(const __u16 *)(a + 4) ^ *(const __u16 *)(b + 4))) == 0;
}

/* IPv4 header checksum of a 20-byte header (options are never written). */
static __always_inline __u16 ipv4_csum(struct iphdr *iph)
{
	__u16 *w = (__u16 *)iph;
	__u32 sum = 0;

	iph->check = 0;
#pragma unroll
	for (int i = 0; i < (int)sizeof(*iph) / 2; i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* Whether a received 20-byte IPv4 header's checksum is right: the one's
 * complement sum over the header, checksum included, is all ones. */
static __always_inline int ipv4_csum_ok(const struct iphdr *iph)
{
	const __u16 *w = (const __u16 *)iph;
	__u32 sum = 0;

#pragma unroll
	for (int i = 0; i < (int)sizeof(*iph) / 2; i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return sum == 0xffff;
}

/* Decrement the TTL and patch the checksum incrementally (RFC 1624), exactly
 * as the kernel's ip_decrease_ttl does. Caller checks ttl > 1 first. */
static __always_inline void ipv4_decrease_ttl(struct iphdr *iph)
{
	__u32 check = (__u32)iph->check;

	check += (__u32)bpf_htons(0x0100);
	iph->check = (__u16)(check + (check >= 0xFFFF));
	iph->ttl--;
}

/* Replace the 16-bit word at w (network order) and patch a checksum over it
 * incrementally (RFC 1624 eqn. 3). */
static __always_inline void csum_replace16(__u16 *check, __u16 *w, __u16 nw)
{
	__u32 sum = (__u16)~*check;

	sum += (__u16)~*w;
	sum += nw;
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	*w = nw;
	*check = (__u16)~sum;
}

/* ECN field (RFC 3168): the low two bits of TOS. */
#define ECN_MASK 0x03
#define ECN_NOT_ECT 0x00
#define ECN_ECT1 0x01
#define ECN_ECT0 0x02
#define ECN_CE 0x03

/* RFC 6040 decapsulation: the inner ECN field given the outer one, or -1
 * when the packet must be dropped (CE over a not-ECN-capable packet). */
static __always_inline int ecn_decap(__u8 outer, __u8 inner)
{
	outer &= ECN_MASK;
	inner &= ECN_MASK;
	if (outer == ECN_CE)
		return inner == ECN_NOT_ECT ? -1 : ECN_CE;
	if (outer == ECN_ECT1 && inner == ECN_ECT0)
		return ECN_ECT1;
	return inner;
}

/* Set the ECN bits of an IPv4 header, checksum patched. */
static __always_inline void ipv4_set_ecn(struct iphdr *iph, __u8 ecn)
{
	__u16 *w = (__u16 *)iph; /* version/ihl, tos */
	__u16 nw;
	__u8 *b = (__u8 *)&nw;

	__builtin_memcpy(&nw, w, 2);
	b[1] = (b[1] & ~ECN_MASK) | ecn;
	csum_replace16(&iph->check, w, nw);
}

/* Flow hash: the inner 5-tuple through a murmur3-style finaliser, fields read
 * as big-endian numbers so Go computes the same value (pkg/dataplane flowHash).
 * Fragments and unknown protocols hash without ports so every piece of a
 * datagram takes the same path. */
static __always_inline __u32 mix32(__u32 h)
{
	h ^= h >> 16;
	h *= 0x7feb352d;
	h ^= h >> 15;
	h *= 0x846ca68b;
	h ^= h >> 16;
	return h;
}

static __always_inline __u32 flow_hash(__u32 saddr_be, __u32 daddr_be, __u32 ports, __u8 proto)
{
	/* One multiply by its own odd constant per field, one finaliser: 14
	 * well-spread bits are all it must give, per packet of every flow. */
	__u32 h = bpf_ntohl(saddr_be) * 0x9e3779b1;

	h ^= bpf_ntohl(daddr_be) * 0x85ebca77;
	h ^= ports * 0xc2b2ae3d;
	h ^= (__u32)proto * 0x27d4eb2f;
	return mix32(h);
}

/* The 14 bits of flow entropy carried in the outer UDP source port. */
static __always_inline __u16 flow_sport(__u32 hash)
{
	return SPORT_BASE | (hash & SPORT_MASK);
}

static __always_inline __u32 vni_of(const struct genevehdr *g)
{
	return ((__u32)g->vni[0] << 16) | ((__u32)g->vni[1] << 8) | g->vni[2];
}
