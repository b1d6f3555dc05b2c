package mizarctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"mizar.dev/pkg/agentapi"
	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// TraceOptions describe the packet to trace.
type TraceOptions struct {
	// From is the sending pod, namespace/name.
	From string
	// To is an IPv4 address or a pod, namespace/name.
	To string
	// Proto is tcp (default), udp or icmp; Port the destination port.
	Proto string
	Port  uint16
	// Src, if set, is written as the source address instead of the pod's
	// own (a spoofed packet).
	Src string
}

// TraceReport is a packet's path, node by node.
type TraceReport struct {
	From, To string
	VNI      int32
	Hops     []agentapi.TraceResponse
}

// maxTraceHops bounds a trace (a relay loop would be a bug, not a reason
// to loop here).
const maxTraceHops = 8

// Trace asks the agents to run the packet through their programs: first the
// sending pod's node (its pod program), then each node the packet reaches
// over the underlay (its underlay program), with the frame the previous one
// sent, until it is dropped, delivered or leaves the overlay.
func Trace(ctx context.Context, c versioned.Interface, agents *Agents, o TraceOptions) (*TraceReport, error) {
	api := c.NetworkingV1alpha1()
	from, err := podEndpoint(ctx, c, o.From)
	if err != nil {
		return nil, err
	}
	sub, err := api.Subnets().Get(ctx, from.Spec.Subnet, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("subnet of %s: %w", o.From, err)
	}
	vpc, err := api.Vpcs().Get(ctx, sub.Spec.VPC, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("VPC of %s: %w", o.From, err)
	}
	dst, err := netip.ParseAddr(o.To)
	if err != nil {
		to, err := podEndpoint(ctx, c, o.To)
		if err != nil {
			return nil, fmt.Errorf("--to is neither an address nor a pod: %w", err)
		}
		if dst, err = netip.ParseAddr(to.Spec.IP); err != nil {
			return nil, fmt.Errorf("endpoint of %s has no address yet", o.To)
		}
	}
	droplets, err := api.Droplets().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing droplets: %w", err)
	}
	byIP := map[string]string{}
	for _, d := range droplets.Items {
		byIP[d.Spec.IP] = d.Name
	}

	q := url.Values{"vni": {strconv.Itoa(int(vpc.Spec.VNI))}, "ip": {from.Spec.IP}, "dst": {dst.String()}, "proto": {o.Proto}}
	if o.Port != 0 {
		q.Set("dport", strconv.Itoa(int(o.Port)))
	}
	if o.Src != "" {
		q.Set("src", o.Src)
	}
	r := &TraceReport{From: o.From, To: o.To, VNI: vpc.Spec.VNI}
	var hop agentapi.TraceResponse
	if err := agents.call(ctx, from.Spec.Droplet, agentapi.PathTracePod+"?"+q.Encode(), nil, &hop); err != nil {
		return r, err
	}
	r.Hops = append(r.Hops, hop)
	for hop.Next == agentapi.NextUnderlay {
		if len(r.Hops) >= maxTraceHops {
			return r, fmt.Errorf("more than %d hops: a loop?", maxTraceHops)
		}
		next, ok := byIP[hop.Host]
		if !ok {
			return r, fmt.Errorf("%s sends the packet to %s, which is no droplet", hop.Droplet, hop.Host)
		}
		frame := hop.Out
		hop = agentapi.TraceResponse{}
		if err := agents.call(ctx, next, agentapi.PathTraceUnderlay, frame, &hop); err != nil {
			return r, err
		}
		r.Hops = append(r.Hops, hop)
	}
	return r, nil
}

// podEndpoint finds the Endpoint of pod namespace/name.
func podEndpoint(ctx context.Context, c versioned.Interface, pod string) (*v1alpha1.Endpoint, error) {
	ns, name, ok := strings.Cut(pod, "/")
	if !ok {
		ns, name = metav1.NamespaceDefault, pod
	}
	l, err := c.NetworkingV1alpha1().Endpoints(ns).List(ctx, metav1.ListOptions{FieldSelector: "spec.pod=" + name})
	if err != nil {
		return nil, fmt.Errorf("endpoint of pod %s/%s: %w", ns, name, err)
	}
	if len(l.Items) == 0 {
		return nil, fmt.Errorf("pod %s/%s has no mizar endpoint", ns, name)
	}
	return &l.Items[0], nil
}

// Dropped is the drop reason when the packet was dropped, else "".
func (r *TraceReport) Dropped() string {
	if n := len(r.Hops); n > 0 && r.Hops[n-1].Next == agentapi.NextDrop {
		return r.Hops[n-1].Drop
	}
	return ""
}

// Print writes the path as a table and the packet's fate.
func (r *TraceReport) Print(w io.Writer) error {
	fmt.Fprintf(w, "Trace %s -> %s (VNI %d), through each node's programs and maps:\n", r.From, r.To, r.VNI)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOP\tDROPLET\tPROGRAM\tVERDICT\tCOUNTERS\tNEXT")
	for i, h := range r.Hops {
		next := h.Next
		switch h.Next {
		case agentapi.NextUnderlay:
			next = "underlay -> " + h.Host
		case agentapi.NextDrop:
			next = "DROPPED: " + h.Drop
		case agentapi.NextPod:
			next = "delivered to the pod"
		case agentapi.NextHost:
			next = "to the node's stack"
		case agentapi.NextReply:
			next = "answered back into the pod"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", i+1, h.Droplet, h.Program, h.Verdict, strings.Join(h.Counters, ","), next)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if d := r.Dropped(); d != "" {
		fmt.Fprintf(w, "Dropped at %s: %s\n", r.Hops[len(r.Hops)-1].Droplet, d)
	} else if n := len(r.Hops); n > 0 {
		fmt.Fprintf(w, "Not dropped: %s at %s\n", r.Hops[n-1].Next, r.Hops[n-1].Droplet)
	}
	return nil
}

// ErrDropped is RunTrace's error when the traced packet is dropped.
var ErrDropped = errors.New("the packet is dropped")
