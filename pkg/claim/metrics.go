package claim

import (
	"math/bits"
	"strings"
	"sync/atomic"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

var (
	descInUse = metrics.NewDesc("mizar_claims_in_use",
		"Values of a range (VNIs, a subnet's addresses) that are claimed, as this replica's allocation index knows them; reserved values not counted.",
		[]string{"range"}, nil, metrics.ALPHA, "")
	descCapacity = metrics.NewDesc("mizar_claims_capacity",
		"Values a range can hand out (its size less reserved values).", []string{"range"}, nil, metrics.ALPHA, "")

	served       atomic.Pointer[Store]
	registerOnce atomic.Bool
)

// ServeMetrics makes s the store whose ranges /metrics reports (the serving
// one: a process runs one; tests that start several report the last).
func ServeMetrics(s *Store) {
	served.Store(s)
	if registerOnce.CompareAndSwap(false, true) {
		legacyregistry.CustomMustRegister(&collector{})
	}
}

// collector reports each indexed range's use from its in-memory bitmap: no
// etcd read, and a cost in the ranges' used words, not in requests.
type collector struct{ metrics.BaseStableCollector }

func (c *collector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- descInUse
	ch <- descCapacity
}

func (c *collector) CollectWithStability(ch chan<- metrics.Metric) {
	s := served.Load()
	if s == nil {
		return
	}
	s.pools.mu.Lock()
	ps := make([]*pool, 0, len(s.pools.m))
	for _, p := range s.pools.m {
		ps = append(ps, p)
	}
	s.pools.mu.Unlock()
	for _, p := range ps {
		used, capacity, ok := p.usage()
		if !ok {
			continue
		}
		name := strings.TrimSuffix(p.r.Prefix, "/")
		ch <- metrics.NewLazyConstMetric(descInUse, metrics.GaugeValue, float64(used), name)
		ch <- metrics.NewLazyConstMetric(descCapacity, metrics.GaugeValue, float64(capacity), name)
	}
}

// usage counts the claimed values of a loaded index.
func (p *pool) usage() (used, capacity uint64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.loaded {
		return 0, 0, false
	}
	for _, w := range p.words {
		used += uint64(bits.OnesCount64(w))
	}
	reserved := uint64(0)
	for _, v := range p.r.Reserved {
		if v >= p.r.Lo && v <= p.r.Hi {
			reserved++
		}
	}
	return used - min(used, reserved), uint64(p.r.Hi-p.r.Lo) + 1 - reserved, true
}
