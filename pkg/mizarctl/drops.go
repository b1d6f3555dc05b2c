package mizarctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"mizar.dev/pkg/agentapi"
)

// Drops asks every agent for the drop events it keeps (after since, when
// not zero; waiting up to wait for one). It returns the answers of the
// agents that answered and an error naming each one that did not.
func Drops(ctx context.Context, agents *Agents, since time.Time, wait time.Duration) ([]agentapi.DropsResponse, error) {
	q := url.Values{}
	if !since.IsZero() {
		q.Set("since", since.Format(time.RFC3339Nano))
	}
	if wait > 0 {
		q.Set("wait", strconv.FormatFloat(wait.Seconds(), 'f', 3, 64))
	}
	var out []agentapi.DropsResponse
	var errs []error
	for _, name := range agents.Names() {
		var r agentapi.DropsResponse
		if err := agents.call(ctx, name, agentapi.PathDrops+"?"+q.Encode(), nil, &r); err != nil {
			errs = append(errs, err)
			continue
		}
		if r.Droplet == "" {
			r.Droplet = name
		}
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}

// PrintDrops writes the events of every agent as one table.
func PrintDrops(w io.Writer, rs []agentapi.DropsResponse) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tDROPLET\tPROGRAM\tREASON\tVNI\tPACKET\tOUTER\tIFINDEX")
	n := 0
	for _, r := range rs {
		for _, e := range r.Events {
			n++
			pkt := ""
			if e.Src.IsValid() {
				pkt = fmt.Sprintf("%s %s -> %s", protoName(e.Proto), hostPort(e.Src, e.SrcPort), hostPort(e.Dst, e.DstPort))
			}
			outer := ""
			if e.OuterSrc.IsValid() {
				outer = e.OuterSrc.String() + " -> " + e.OuterDst.String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\n", e.Time.UTC().Format("15:04:05.000"), r.Droplet, e.Program, e.Reason, e.VNI, pkt, outer, e.Ifindex)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rs {
		fmt.Fprintf(w, "%s: %d drop events since its agent started (a sample of the drops, which mizar_dataplane_packets_total counts in full)\n", r.Droplet, r.Total)
	}
	if n == 0 {
		fmt.Fprintln(w, "No drop events.")
	}
	return nil
}

func hostPort(a netip.Addr, p uint16) string {
	if p == 0 {
		return a.String()
	}
	return netip.AddrPortFrom(a, p).String()
}

func protoName(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 132:
		return "sctp"
	}
	return "proto-" + strconv.Itoa(int(p))
}
