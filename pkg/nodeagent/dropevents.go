package nodeagent

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/agentapi"
	"mizar.dev/pkg/dataplane"
)

// DropLog keeps the drop events the programs reported (the latest
// DropLogSize), logs them (at most DropLogLines a second, the rest
// summarised) and serves them as JSON at /drops: what mizarctl drops and
// mizarctl trace --live read.
type DropLog struct {
	droplet string
	mu      sync.Mutex
	ring    []agentapi.DropEvent
	next    int // where the next event goes once the ring is full
	total   uint64
	reg     prometheus.Counter
	logged  int       // lines logged in the current second
	second  time.Time // the second they were logged in
	quiet   int       // events not logged in it
}

// DropLogSize is how many drop events the agent keeps; DropLogLines how
// many a second it logs.
const (
	DropLogSize  = 1024
	DropLogLines = 10
)

// NewDropLog returns an empty log of droplet's agent whose events count
// into reg (nil: none).
func NewDropLog(droplet string, reg prometheus.Registerer) *DropLog {
	l := &DropLog{droplet: droplet}
	if reg != nil {
		l.reg = prometheus.NewCounter(prometheus.CounterOpts{Name: "mizar_dataplane_drop_events_total",
			Help: "Drop events the programs reported (a sample of the drops: see mizar_dataplane_packets_total for all of them)."})
		reg.MustRegister(l.reg)
	}
	return l
}

// Run reads dp's drop events into the log until ctx ends.
func (l *DropLog) Run(ctx context.Context, dp *dataplane.Datapath) error {
	logger := klog.FromContext(ctx).WithName("drops")
	return dp.ReadDropEvents(ctx, func(e dataplane.DropEvent) { l.Add(logger, e) })
}

// Add records one event, logging it unless this second's lines are spent.
func (l *DropLog) Add(logger klog.Logger, de dataplane.DropEvent) {
	e := agentapi.DropEvent{Time: de.Time, Program: de.Program, Reason: de.Reason, Ifindex: de.Ifindex, Len: de.Len, Suppressed: de.Suppressed,
		OuterSrc: de.OuterSrc, OuterDst: de.OuterDst, VNI: de.VNI, Src: de.Src, Dst: de.Dst, Proto: de.Proto, SrcPort: de.SrcPort, DstPort: de.DstPort}
	l.mu.Lock()
	if len(l.ring) < DropLogSize {
		l.ring = append(l.ring, e)
	} else {
		l.ring[l.next] = e
		l.next = (l.next + 1) % DropLogSize
	}
	l.total++
	if l.reg != nil {
		l.reg.Inc()
	}
	now := time.Now().Truncate(time.Second)
	var quiet int
	if !now.Equal(l.second) {
		quiet, l.quiet = l.quiet, 0
		l.second, l.logged = now, 0
	}
	log := l.logged < DropLogLines
	if log {
		l.logged++
	} else {
		l.quiet++
	}
	l.mu.Unlock()
	if quiet > 0 {
		logger.Info("Drop events not logged (over the line budget; all are kept at /drops and counted)", "events", quiet, "linesPerSecond", DropLogLines)
	}
	if log {
		kv := []any{"program", e.Program, "reason", e.Reason, "ifindex", e.Ifindex, "len", e.Len}
		if e.OuterSrc.IsValid() {
			kv = append(kv, "outerSrc", e.OuterSrc, "outerDst", e.OuterDst, "vni", e.VNI)
		}
		if e.Src.IsValid() {
			kv = append(kv, "src", e.Src, "dst", e.Dst, "proto", e.Proto, "srcPort", e.SrcPort, "dstPort", e.DstPort)
		}
		if e.Suppressed > 0 {
			kv = append(kv, "suppressedBefore", e.Suppressed)
		}
		logger.Info("Packet dropped", kv...)
	}
}

// Events returns the kept events after since (all for the zero time),
// oldest first, and how many the log has seen in all.
func (l *DropLog) Events(since time.Time) ([]agentapi.DropEvent, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]agentapi.DropEvent, 0, len(l.ring))
	for i := range l.ring {
		e := l.ring[(l.next+i)%len(l.ring)]
		if e.Time.After(since) {
			out = append(out, e)
		}
	}
	return out, l.total
}

// ServeHTTP serves the kept events as JSON; ?since=<RFC 3339 time> keeps
// the later ones only, ?wait=<seconds> waits up to that long for one.
func (l *DropLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var since time.Time
	if s := r.URL.Query().Get("since"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			http.Error(w, "since: "+err.Error(), http.StatusBadRequest)
			return
		}
		since = t
	}
	var wait time.Duration
	if s := r.URL.Query().Get("wait"); s != "" {
		secs, err := strconv.ParseFloat(s, 64)
		if err != nil || secs < 0 || secs > 60 {
			http.Error(w, "wait: seconds from 0 to 60", http.StatusBadRequest)
			return
		}
		wait = time.Duration(secs * float64(time.Second))
	}
	deadline := time.Now().Add(wait)
	evs, total := l.Events(since)
	for len(evs) == 0 && time.Now().Before(deadline) && r.Context().Err() == nil {
		time.Sleep(50 * time.Millisecond)
		evs, total = l.Events(since)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(agentapi.DropsResponse{Droplet: l.droplet, Total: total, Events: evs})
}
