//go:build ignore

/* Layouts shared by the BPF programs and Go (bpf2go -type emits each struct and
 * enum below as a Go type in pkg/dataplane). Every address is a byte array in
 * network order, so Go fills them with netip.Addr.As4() and MAC bytes and no
 * field depends on the host's byte order. Only the VNI is a host-order __u32. */
#pragma once

#include <linux/types.h>

#define GENEVE_PORT 6081
#define ETH_P_TEB_ 0x6558 /* Transparent Ethernet Bridging: Geneve carries Ethernet */

/* Outer IPv4 20 + UDP 8 + Geneve 8 (no options) + inner Ethernet 14. */
#define GENEVE_OVERHEAD 50

/* Bouncers per subnet and dividers per VPC a map value can hold. */
#define MAX_HOPS 16

/* TTL of the outer IPv4 header written on encapsulation. */
#define OUTER_TTL 64

/* Direct-path learning. A pod's packet that goes through a bouncer or
 * divider carries, when it fits the underlay MTU, one Geneve option naming
 * the sending host. The sender writes its own address; the first relay
 * overwrites it with the outer source it verified; the delivering host
 * trusts it only from a relay, and learns "this pod lives there" into
 * learned: for trust (accept that pod directly from that host) and for
 * routing (send to that pod directly). A host goes direct to a learned
 * destination only once it has introduced the sending pod to that host the
 * same way (introduced), INTRODUCE_DELAY_NS earlier, so the peer can check
 * the direct packets. */
/* Option class 0xFF4D ('M'): from 0xFF00..0xFFFF, which IANA's Geneve
 * option class registry (RFC 8926) leaves for experimental use; the 0x0111
 * mizar once wrote is another vendor's registered class. Frames of hosts
 * still writing 0x0111 during an upgrade carry an option that is not
 * critical and not ours: it is skipped, so they are delivered and relayed
 * as before and only teach no direct path until every host is upgraded. */
#define MIZAR_OPT_CLASS 0xFF4D
#define MIZAR_OPT_SRC_HOST 0x01 /* non-critical: 4 bytes, the sender's host */
#define SRC_HOST_OPT_LEN 8      /* option header 4 + IPv4 4 */
#define INTRODUCE_DELAY_NS 5000000ULL /* the introduction's bounced path vs the direct one */

/* Outer UDP source ports come from the flow hash, in 49152..65535 (RFC 6335
 * dynamic range): SPORT_BASE | (hash & SPORT_MASK). The same 14 bits pick the
 * bouncer/divider everywhere, so every hop agrees on a flow's path. */
#define SPORT_BASE 0xC000
#define SPORT_MASK 0x3FFF

/* A host on the underlay: where to send a packet next. A zero MAC means
 * "not on this host's L2 segment": the kernel FIB picks the next hop and its
 * MAC (bpf_fib_lookup, bpf_redirect_neigh). A MAC given is used as is,
 * without a FIB lookup: the fast path between L2 neighbours. */
struct hop {
	__u8 ip[4];
	__u8 mac[6];
	__u8 pad[2];
} __attribute__((aligned(4))); /* word access (pkt.h); the layout is the same */

/* endpoints: (vni, ip) -> endpoint. */
struct endpoint_key {
	__u32 vni;
	__u8 ip[4];
};

struct endpoint {
	__u8 host_ip[4];  /* host of the endpoint (this host's IP if local) */
	__u8 host_mac[6]; /* that host's underlay MAC; zero = ask the FIB (see hop) */
	__u8 mac[6];      /* the endpoint's own MAC, written as inner destination */
	__u32 ifindex;    /* host-side veth in the host netns; 0 = remote */
};

/* subnets: LPM trie. The VNI is always matched in full, so prefixlen is
 * 32 + the IPv4 prefix length; the VNI's byte order does not matter to the
 * trie because all 32 of its bits are compared. */
struct subnet_key {
	__u32 prefixlen;
	__u32 vni;
	__u8 ip[4];
};

struct subnet {
	__u32 nbouncers;
	struct hop bouncers[MAX_HOPS];
};

/* vpcs: vni -> dividers. Its presence also makes the VNI "known" here. */
struct vpc {
	__u32 ndividers;
	struct hop dividers[MAX_HOPS];
};

/* droplets: the underlay hosts Geneve is accepted from (the agent fills it
 * from the Droplets in the API). */
struct droplet_key {
	__u8 ip[4];
} __attribute__((aligned(4))); /* word access (pkt.h); the layout is the same */

/* The droplet's underlay MAC when it shares this host's L2 segment, zero
 * when the kernel FIB must find the next hop (as in struct hop): a path
 * learned to it then needs no FIB lookup per packet. */
struct droplet {
	__u8 mac[6];
	__u8 pad[2];
} __attribute__((aligned(4)));

/* droplet_macs: the underlay MACs of the droplets on this host's L2 segment
 * -> the droplet's address. A frame from such a droplet's address must
 * carry its MAC; one re-bounced by another droplet carries that droplet's. */
struct mac_key {
	__u8 mac[6];
	__u8 pad[2];
} __attribute__((aligned(4)));

/* relays: (vni, droplet ip) present = that droplet is a bouncer or divider of
 * the VPC, so it may forward packets of any endpoint of the VPC. Any other
 * droplet speaks only for the endpoints it hosts. Keyed like endpoints. */

/* pod_ifaces: host-side veth ifindex -> what the pod behind it is. */
struct pod_iface {
	__u32 vni;
	__u8 ip[4];         /* the pod's address: anything else is spoofed */
	__u8 mac[6];        /* the pod's eth0 MAC */
	__u8 gw_mac[6];     /* MAC answered for ARP of the gateway/on-link addresses */
	__u8 gw_ip[4];
	__u8 subnet[4];     /* the pod's subnet, masked */
	__u32 subnet_len;   /* its prefix length (0..32) */
};

/* learned: (vni, ip) -> where that endpoint was last seen sending from,
 * per a relay. LRU: entries for pods nobody talks to any more fall out. */
struct learned_entry {
	__u8 host_ip[4];
	__u32 pad;
	__u64 expires; /* CLOCK_MONOTONIC ns after which it is not used */
};

/* introduced: (vni, local pod ip, peer host) -> when the pod was last
 * introduced to that host (bpf_ktime_get_ns). */
struct intro_key {
	__u32 vni;
	__u8 ip[4];
	__u8 host_ip[4];
};

/* Load-time constants (see host in mizar.c). */
struct host_config {
	__u8 ip[4];
	__u8 mac[6];
	__u8 pad[2];
	__u32 underlay_ifindex;
	__u64 learn_ns; /* lifetime of a learned entry; 0 = never learn */
	__u32 mtu;      /* underlay MTU the pods were sized from; 0 = unknown */
	__u32 pad2;
};

/* Per-CPU counters of the underlay program; names are read from BTF by Go
 * (lower-cased, prefix dropped). */
enum underlay_counter {
	UL_PASS = 0,            /* not Geneve for this host: handed to the kernel */
	UL_RX,                  /* Geneve to this host's port (summed in Go, never counted here) */
	UL_DELIVER,             /* decapsulated into a local pod */
	UL_FWD_ENDPOINT,        /* bouncer: sent to the endpoint's host */
	UL_FWD_SUBNET,          /* divider: sent to a bouncer of the target subnet */
	UL_FWD_DIVIDER,         /* sent to a divider of the VPC */
	UL_DROP_MALFORMED,      /* truncated/inconsistent Geneve or inner headers */
	UL_DROP_IP_OPTIONS,     /* outer IPv4 options (never sent by mizar) */
	UL_DROP_FRAGMENT,       /* outer fragment (mizar sets DF) */
	UL_DROP_GENEVE,         /* version, protocol, OAM or critical option */
	UL_DROP_INNER_NOT_IPV4, /* inner frame that is not IPv4 */
	UL_DROP_UNKNOWN_VNI,    /* no VPC with this VNI here */
	UL_DROP_UNKNOWN_DST,    /* VPC known, destination not */
	UL_DROP_TTL,            /* outer TTL would expire on forward */
	UL_DROP_ADJUST,         /* bpf_xdp_adjust_head failed */
	UL_DROP_IP_CHECKSUM,    /* outer IPv4 header checksum is wrong */
	UL_DROP_NOT_DROPLET,    /* outer source is not a known droplet */
	UL_DROP_SRC_UNKNOWN,    /* inner source is no endpoint of the VNI known here */
	UL_DROP_SRC_SPOOFED,    /* inner source lives elsewhere than the outer source */
	UL_DROP_ECN,            /* outer CE over a not-ECN-capable inner packet (RFC 6040) */
	UL_DROP_REDIRECT,       /* bpf_redirect refused the target */
	UL_DROP_NO_ROUTE,       /* FIB: no usable route to the next droplet */
	UL_DROP_NO_NEIGH,       /* FIB: next hop's neighbour entry not resolved yet */
	UL_LEARN,               /* learned where an inner source lives, from a relay */
	UL_STAMP,               /* relay: wrote the verified sender into the option */
	UL_REBOUNCE,            /* not a relay: sent on to a relay, outer source kept */
	UL_DROP_SELF_SOURCE,    /* outer source is this host's own address */
	UL_LEARN_REFUSED,       /* option named no droplet, this host, or not the endpoint's API host: not learned */
	UL_DROP_MAC_SPOOF,      /* outer source is a droplet of this L2 segment, the source MAC is no droplet's */
	UL_DROP_VLAN,           /* Geneve for this host in an 802.1Q/802.1ad tagged frame */
	UL_SVC_REV_NAT,         /* delivered: a Service backend's reply, source translated back (svc.h) */
	UL_MAX,
};

/* Per-CPU counters of the pod-side program. */
enum pod_counter {
	POD_ENCAP = 0,          /* encapsulated toward a remote host */
	POD_LOCAL,              /* delivered to a pod on this host */
	POD_ARP_REPLY,          /* ARP for the gateway answered */
	POD_DROP_NO_CONFIG,     /* interface without pod_ifaces entry */
	POD_DROP_MALFORMED,     /* truncated Ethernet/IPv4/ARP */
	POD_DROP_NOT_IPV4,      /* neither IPv4 nor ARP */
	POD_DROP_ARP,           /* ARP we do not answer */
	POD_DROP_SPOOF,         /* source address is not the pod's */
	POD_DROP_UNKNOWN_VNI,
	POD_DROP_UNKNOWN_DST,
	POD_DROP_TTL,           /* TTL expired across subnets, no ICMP allowed/possible */
	POD_DROP_ENCAP,         /* bpf_skb_adjust_room/store failed */
	POD_DROP_VLAN,          /* 802.1Q/802.1ad tagged (in metadata or inline) */
	POD_DROP_MAC_MULTICAST, /* multicast/broadcast source MAC */
	POD_DROP_MAC_SPOOF,     /* source MAC is not the pod's */
	POD_ICMP_TIME_EXCEEDED, /* TTL expired at the gateway: ICMP sent to the pod */
	POD_ICMP_FRAG_NEEDED,   /* DF packet too big for the underlay: ICMP sent */
	POD_DROP_TOO_BIG,       /* too big for the underlay, DF clear (no fragmenting here) */
	POD_DROP_REDIRECT,      /* bpf_redirect/bpf_redirect_peer refused the target */
	POD_ENCAP_LEARNED,      /* encapsulated straight to a learned host */
	POD_INTRODUCE,          /* sent with the option that introduces the pod: bounced toward a learned host, or straight from a relay's node */
	POD_TO_HOST,            /* to an address of this node: passed to the host stack */
	POD_DROP_FLOOD,         /* broadcast/multicast destination over the pod's rate (flood_rate) */
	POD_SVC_NAT,            /* to a Service: translated to a backend (svc.h) */
	POD_SVC_REV_NAT,        /* a backend's reply: source translated back to the Service */
	POD_DROP_NO_BACKEND,    /* to a Service without backends */
	POD_DROP_SVC_REWRITE,   /* a Service translation's checksum/store helper failed */
	POD_MAX,
};

/* Drop events (include/dropev.h): which program dropped, and which enum
 * its reason is of. */
enum drop_hook {
	DROP_HOOK_UNDERLAY = 0, /* XDP on the underlay */
	DROP_HOOK_POD,          /* TC on a pod's veth */
};

enum drop_set {
	DROP_SET_UNDERLAY = 0, /* reason is an enum underlay_counter */
	DROP_SET_POD,          /* reason is an enum pod_counter */
	DROP_SET_POLICY,       /* reason is an enum np_counter (netpol.h) */
};

/* Bytes of a dropped packet a drop event carries: outer Ethernet, IPv4,
 * UDP, Geneve and an option (58), inner Ethernet, IPv4 and the ports (38). */
#define DROP_EV_SNAP 128

struct drop_event {
	__u64 ns;         /* bpf_ktime_get_ns */
	__u32 hook;       /* enum drop_hook */
	__u32 set;        /* enum drop_set */
	__u32 reason;
	__u32 ifindex;    /* the interface the packet came in on */
	__u32 len;        /* the packet's length */
	__u32 snap_len;   /* bytes of it in snap */
	__u32 suppressed; /* drops on this CPU not reported since its previous report */
	__u32 pad;
	__u8 snap[DROP_EV_SNAP];
};
