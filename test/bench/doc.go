// Package bench measures mizar-apiserver against the etcd it stores objects in:
// create throughput and latency, and watch-event latency, each reported beside
// the same operation done directly on that etcd in the same run. The machines
// this runs on are shared and noisy, so the ratios (apiserver / etcd) are the
// numbers to compare between runs; the absolute ones only describe this run.
//
// Run it with
//
//	go test ./test/bench -run '^$' -bench . -benchtime 10s -timeout 10m 2>&1 | grep -Ev '^[IWE][0-9]{4} '
//
// (about 4 minutes on two cores, most of it allocating the stale replica's
// 10,000 VNIs; the grep drops the in-process server's log). The timer
// covers only the apiserver phases, so the etcd phases add to the wall time.
// Endpoint creates are far slower than the others, so a time-based -benchtime
// gives each sub-benchmark a sensible N; with -benchtime Nx every one runs N
// operations, and the Endpoint path lists the subnet's endpoints on every
// create, so its cost depends on N. Add -cpuprofile to see where the server
// spends its time: it runs in the benchmark's process.
//
// MIZAR_BENCH_FLAGS adds server flags, to compare configurations in one way of
// running, e.g. MIZAR_BENCH_FLAGS=--watch-cache=false.
//
// Metrics (per sub-benchmark):
//
//	create/droplets, create/endpoints (16 concurrent workers):
//	  api-creates/s, api-p50-ms, api-p99-ms   creates through the clientset
//	  etcd-creates/s, etcd-p50-ms, etcd-p99-ms guarded puts (create-if-absent
//	                                          transactions) of a value as large as
//	                                          the stored object, on the same etcd
//	  creates/s-ratio = api-creates/s / etcd-creates/s, p50-ratio, p99-ratio = api / etcd
//	watch/all, watch/field-selector (one create at a time):
//	  api-p50-ms, api-p99-ms    from just before Create to the watcher's ADDED event
//	  etcd-p50-ms, etcd-p99-ms  from just before a put to the etcd watch event
//	  p50-ratio, p99-ratio      api / etcd
//	watch/replay-memory (a droplet's replaying watches of the subnet it bounces,
//	MIZAR_BENCH_REPLAY_WATCHES (100) at once on MIZAR_BENCH_REPLAY_ENDPOINTS (2,000)):
//	  heap-bytes/watch, rss-bytes/watch  peak growth over the idle process per watch
//	                                     (client and server share the process)
//	  peak/idle-rss, replay-p50-ms, replay-p99-ms
//	replicas (two replicas on one etcd in this process, the first running the operators):
//	  stale-create-ms    the idle replica's next create after the other allocated
//	                     MIZAR_BENCH_STALE_VALUES (10,000) VNIs
//	  busy-create-ms     the busy replica's own next create, the baseline
//	  leader-creates/s, other-creates/s, leader-p99-ms, other-p99-ms, p99-leader/other
//	                     an endpoint create storm through both at once, 8 clients each
//
// Nothing here runs in a plain go test: the server starts only in a benchmark.
package bench
