//go:build ignore

/* Baselines for measurements only, never attached by the agent: the cheapest
 * possible XDP and TC programs. BenchmarkPrograms reports every mizar path as a
 * ratio to mizar_xdp_pass; the throughput benchmarks attach them to find the
 * ceiling of a hook (BenchmarkPodHook, BenchmarkOverlay "xdp-pass");
 * mizar_xdp_tx is the bouncer's ceiling in live-frames mode (BenchmarkLiveBouncer). */

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

char __license[] SEC("license") = "Dual BSD/GPL";

SEC("xdp")
int mizar_xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

SEC("tc")
int mizar_tc_pass(struct __sk_buff *skb)
{
	return TC_ACT_OK;
}

SEC("xdp")
int mizar_xdp_tx(struct xdp_md *ctx)
{
	return XDP_TX;
}

/* The least any Geneve encapsulation in tcx does: make room for the headers
 * with the flags mizar_pod uses and redirect. BenchmarkPrograms reports the
 * pod's encap paths against it too (x-encap-floor). */
SEC("tc")
int mizar_tc_encap_floor(struct __sk_buff *skb)
{
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 |
		      BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH |
		      BPF_F_ADJ_ROOM_ENCAP_L2(14);

	if (bpf_skb_adjust_room(skb, 50, BPF_ADJ_ROOM_MAC, flags))
		return TC_ACT_SHOT;
	return bpf_redirect(1, 0);
}
