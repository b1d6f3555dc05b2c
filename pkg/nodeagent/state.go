package nodeagent

import (
	"fmt"
	"io"
	"net/http"
	"time"

	"mizar.dev/pkg/dataplane"
)

// StateDump serves the node's datapath as text, one section per map
// (every entry), for mizarctl sysdump: what a bug report needs and the
// metrics leave out. It walks whole maps: for people, never for scrapes.
type StateDump struct {
	dp      *dataplane.Datapath
	pods    *DatapathPods
	droplet string
}

// NewStateDump returns the handler of agentapi.PathState.
func NewStateDump(dp *dataplane.Datapath, pods *DatapathPods, droplet string) *StateDump {
	return &StateDump{dp: dp, pods: pods, droplet: droplet}
}

func (s *StateDump) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "# droplet %s, pin root %s, at %s\n", s.droplet, s.dp.PinRoot(), time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "# network policy compiled in: %v, drop events: %v\n", s.dp.PolicyEnabled(), s.dp.DropEventsEnabled())
	if info, err := s.dp.UnderlayProgram().Info(); err == nil {
		id, _ := info.ID()
		fmt.Fprintf(w, "# underlay program id %d tag %s\n", id, info.Tag)
	}
	if info, err := s.dp.PodProgram().Info(); err == nil {
		id, _ := info.ID()
		fmt.Fprintf(w, "# pod program id %d tag %s\n", id, info.Tag)
	}
	section(w, "counters", func() ([]any, error) {
		c, err := s.dp.Counters()
		return []any{c}, err
	})
	section(w, "links", func() (out []any, err error) {
		err = s.pods.inHost(func() error {
			ls, err := s.dp.Links()
			out = each(ls)
			return err
		})
		return out, err
	})
	section(w, "pod_ifaces", func() ([]any, error) { l, err := s.dp.PodInterfaces(); return each(l), err })
	section(w, "endpoints", func() ([]any, error) { l, err := s.dp.Endpoints(); return each(l), err })
	section(w, "subnets", func() ([]any, error) { l, err := s.dp.Subnets(); return each(l), err })
	section(w, "vpcs", func() ([]any, error) { l, err := s.dp.VPCs(); return each(l), err })
	section(w, "droplets", func() ([]any, error) { l, err := s.dp.Droplets(); return each(l), err })
	section(w, "relays", func() ([]any, error) {
		m, err := s.dp.Relays()
		var out []any
		for vni, ips := range m {
			out = append(out, fmt.Sprintf("vni %d: %v", vni, ips))
		}
		return out, err
	})
	section(w, "learned", func() ([]any, error) { l, err := s.dp.Learned(); return each(l), err })
	section(w, "host_addrs", func() ([]any, error) { l, err := s.dp.HostAddrs(); return each(l), err })
	section(w, "kernel_drops", func() ([]any, error) { l, err := s.dp.KernelDrops(); return each(l), err })
	if s.dp.PolicyEnabled() {
		section(w, "policy_counters", func() ([]any, error) { c, err := s.dp.PolicyCounters(); return []any{c}, err })
		section(w, "policy_refusals", func() ([]any, error) { l, err := s.dp.PolicyRefusals(); return each(l), err })
	}
}

func each[T any](l []T) []any {
	out := make([]any, len(l))
	for i := range l {
		out[i] = l[i]
	}
	return out
}

// section writes "## name (n)" and one line per entry, or the error.
func section(w io.Writer, name string, read func() ([]any, error)) {
	l, err := read()
	if err != nil {
		fmt.Fprintf(w, "\n## %s: error: %v\n", name, err)
		return
	}
	fmt.Fprintf(w, "\n## %s (%d)\n", name, len(l))
	for _, e := range l {
		fmt.Fprintf(w, "%+v\n", e)
	}
}
