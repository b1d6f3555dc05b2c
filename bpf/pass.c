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
