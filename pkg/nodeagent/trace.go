package nodeagent

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"

	"golang.org/x/sys/unix"

	"mizar.dev/pkg/agentapi"
	"mizar.dev/pkg/dataplane"
)

// Tracer serves traces through this node's programs and maps
// (agentapi.PathTracePod, agentapi.PathTraceUnderlay); mizarctl trace
// follows them from node to node.
type Tracer struct {
	dp      *dataplane.Datapath
	pods    *DatapathPods
	droplet string
}

// NewTracer returns the handler of /trace/pod and /trace/underlay.
func NewTracer(dp *dataplane.Datapath, pods *DatapathPods, droplet string) *Tracer {
	return &Tracer{dp: dp, pods: pods, droplet: droplet}
}

// ServeHTTP serves agentapi.PathTracePod and PathTraceUnderlay. A frame
// traced from the underlay loses its Geneve options first.
func (t *Tracer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var tr dataplane.Trace
	var err error
	switch r.URL.Path {
	case agentapi.PathTracePod:
		tr, err = t.tracePod(r)
	case agentapi.PathTraceUnderlay:
		if r.Method != http.MethodPost {
			http.Error(w, "POST the frame", http.StatusMethodNotAllowed)
			return
		}
		var frame []byte
		if frame, err = io.ReadAll(io.LimitReader(r.Body, 16<<10)); err == nil {
			// Whoever asks is no relay: its frame teaches no direct path.
			frame = dataplane.WithoutGeneveOptions(frame)
			err = t.pods.inHost(func() (err error) { tr, err = t.dp.TraceUnderlay(frame); return err })
		}
	default:
		http.NotFound(w, r)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp := agentapi.TraceResponse{Droplet: t.droplet, Program: tr.Program, Verdict: tr.Verdict, Counters: tr.Counters, Drop: tr.Drop,
		Next: string(tr.Next), Out: tr.Out}
	if tr.Host.IsValid() {
		resp.Host = tr.Host.String()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

func (t *Tracer) tracePod(r *http.Request) (dataplane.Trace, error) {
	q := r.URL.Query()
	vni, err := strconv.ParseUint(q.Get("vni"), 10, 32)
	if err != nil {
		return dataplane.Trace{}, fmt.Errorf("vni: %w", err)
	}
	ip, err := netip.ParseAddr(q.Get("ip"))
	if err != nil {
		return dataplane.Trace{}, fmt.Errorf("ip: %w", err)
	}
	dst, err := netip.ParseAddr(q.Get("dst"))
	if err != nil {
		return dataplane.Trace{}, fmt.Errorf("dst: %w", err)
	}
	src := ip
	if s := q.Get("src"); s != "" {
		if src, err = netip.ParseAddr(s); err != nil {
			return dataplane.Trace{}, fmt.Errorf("src: %w", err)
		}
	}
	port := func(name string, def uint16) (uint16, error) {
		s := q.Get(name)
		if s == "" {
			return def, nil
		}
		v, err := strconv.ParseUint(s, 10, 16)
		return uint16(v), err
	}
	sport, err := port("sport", 40000)
	if err != nil {
		return dataplane.Trace{}, fmt.Errorf("sport: %w", err)
	}
	dport, err := port("dport", 80)
	if err != nil {
		return dataplane.Trace{}, fmt.Errorf("dport: %w", err)
	}
	var proto uint8
	switch q.Get("proto") {
	case "", "tcp":
		proto = unix.IPPROTO_TCP
	case "udp":
		proto = unix.IPPROTO_UDP
	case "icmp":
		proto = unix.IPPROTO_ICMP
	default:
		return dataplane.Trace{}, fmt.Errorf("proto %q: tcp, udp or icmp", q.Get("proto"))
	}
	pis, err := t.dp.PodInterfaces()
	if err != nil {
		return dataplane.Trace{}, err
	}
	for _, pi := range pis {
		if pi.VNI != uint32(vni) || pi.IP != ip {
			continue
		}
		frame, err := dataplane.TracePacket{SrcMAC: pi.MAC, DstMAC: pi.GatewayMAC, Src: src, Dst: dst, Proto: proto, SrcPort: sport, DstPort: dport}.Frame()
		if err != nil {
			return dataplane.Trace{}, err
		}
		var tr dataplane.Trace
		err = t.pods.inHost(func() (err error) { tr, err = t.dp.TracePod(pi.Ifindex, frame); return err })
		return tr, err
	}
	return dataplane.Trace{}, fmt.Errorf("no pod %s of VNI %d on droplet %s", ip, vni, t.droplet)
}
