//go:build ignore

/* Drop events: why did this packet die? Every drop is counted (maps.h);
 * besides, the programs report drops into the ring buffer drop_events, the
 * reason with the first DROP_EV_SNAP bytes of the packet (Go parses the
 * addresses, ports and VNI out of them). A flood must not cost more than the
 * counter: each CPU reports at most drop_ev_burst drops a jiffy (HZ 100 to
 * 1000: 100 to 1000 windows a second) and only counts the rest, which the
 * next event carries as suppressed. The budget check is a per-CPU array
 * lookup and bpf_jiffies64, both inlined by the verifier; the report itself
 * (reserve, copy, submit) runs only within the budget. Delivery paths pay
 * nothing: nothing here runs on them. Reports wake no reader (a wakeup
 * costs microseconds, measured: BenchmarkDropEvents): the agent polls the
 * ring (ReadDropEvents). */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "mizar.h"

/* Reports a CPU may send per jiffy; 0 = none (set by the Go loader). */
volatile const __u32 drop_ev_burst = 0;

struct drop_budget {
	__u64 jiffy;      /* the window the count is of */
	__u32 used;       /* reports sent in it */
	__u32 suppressed; /* drops not reported since the last report */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct drop_budget);
} drop_budget SEC(".maps");

/* Not pinned: the agent that loaded the programs reads their reports; a
 * restarted agent's programs replace the old ones, ring included. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} drop_events SEC(".maps");

/* May this CPU report a drop now? Returns the drops suppressed before it
 * + 1 (so 0 means no). */
static __always_inline __u32 drop_ev_take(void)
{
	__u32 burst = *(const volatile __u32 *)&drop_ev_burst;

	if (!burst)
		return 0;
	__u32 zero = 0;
	struct drop_budget *b = bpf_map_lookup_elem(&drop_budget, &zero);

	if (!b)
		return 0;
	__u64 j = bpf_jiffies64();

	if (b->jiffy != j) {
		b->jiffy = j;
		b->used = 0;
	}
	if (b->used >= burst) {
		b->suppressed++;
		return 0;
	}
	b->used++;
	__u32 s = b->suppressed;

	b->suppressed = 0;
	return s + 1;
}

static __always_inline struct drop_event *drop_ev_reserve(__u32 hook, __u32 set, __u32 reason, __u32 ifindex,
							  __u32 len, __u32 taken)
{
	struct drop_event *e = bpf_ringbuf_reserve(&drop_events, sizeof(*e), 0);

	if (!e)
		return NULL;
	e->ns = bpf_ktime_get_ns();
	e->hook = hook;
	e->set = set;
	e->reason = reason;
	e->ifindex = ifindex;
	e->len = len;
	e->suppressed = taken - 1;
	e->snap_len = 0;
	e->pad = 0;
	return e;
}

/* Report a drop by the underlay program (set: DROP_SET_*, reason: an
 * enum of that set; taken: what drop_ev_take returned). A global function:
 * verified once, called only for the drops within the budget. */
__attribute__((noinline)) int drop_ev_xdp(struct xdp_md *ctx, __u32 set, __u32 reason, __u32 taken)
{
	/* The helper, not data_end - data: the pointers must not be spilled
	 * as 32-bit values, and it counts a multi-buffer frame whole. */
	__u32 len = bpf_xdp_get_buff_len(ctx);
	struct drop_event *e = drop_ev_reserve(DROP_HOOK_UNDERLAY, set, reason, ctx->ingress_ifindex, len, taken);

	if (!e)
		return 0;
	__u32 n = len < DROP_EV_SNAP ? len : DROP_EV_SNAP;

	if (n > 0 && n <= DROP_EV_SNAP && !bpf_xdp_load_bytes(ctx, 0, e->snap, n))
		e->snap_len = n;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

/* Report a drop by the pod program; see drop_ev_xdp. */
__attribute__((noinline)) int drop_ev_skb(struct __sk_buff *skb, __u32 set, __u32 reason, __u32 taken)
{
	__u32 len = skb->len;
	struct drop_event *e = drop_ev_reserve(DROP_HOOK_POD, set, reason, skb->ifindex, len, taken);

	if (!e)
		return 0;
	__u32 n = len < DROP_EV_SNAP ? len : DROP_EV_SNAP;

	if (n > 0 && n <= DROP_EV_SNAP && !bpf_skb_load_bytes(skb, 0, e->snap, n))
		e->snap_len = n;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

/* Report a drop if the budget allows: what every drop site calls. */
static __always_inline void drop_ev_ul(struct xdp_md *ctx, __u32 set, __u32 reason)
{
	__u32 taken = drop_ev_take();

	if (taken)
		drop_ev_xdp(ctx, set, reason, taken);
}

static __always_inline void drop_ev_pod(struct __sk_buff *skb, __u32 set, __u32 reason)
{
	__u32 taken = drop_ev_take();

	if (taken)
		drop_ev_skb(skb, set, reason, taken);
}

/* The report's types reach no map's BTF (a ring buffer has no value type):
 * named here so that bpf2go -type emits them for Go. */
const struct drop_event *unused_drop_event __attribute__((unused));
const enum drop_hook *unused_drop_hook __attribute__((unused));
const enum drop_set *unused_drop_set __attribute__((unused));
