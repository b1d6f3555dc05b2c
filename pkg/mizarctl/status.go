// Package mizarctl is the logic of the mizarctl command (cmd/mizarctl, also
// the kubectl plugin kubectl-mizar): what an operator asks of mizar at 3 a.m.,
// answered from the API alone.
package mizarctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"mizar.dev/pkg/agentapi"

	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// StatusReport is what Status found: every droplet with its relays and
// endpoints, and every object not Provisioned with why.
type StatusReport struct {
	Droplets []DropletStatus
	// Kinds counts each kind's objects by phase.
	Kinds map[string]map[v1alpha1.Phase]int
	// NotProvisioned lists "Kind name: phase: why" for every object that is
	// not Provisioned (at most MaxListed, the rest counted).
	NotProvisioned []string
	More           int
}

// DropletStatus is one droplet (one node agent) and what it serves.
type DropletStatus struct {
	Name, Node, IP string
	Phase          v1alpha1.Phase
	Why            string
	Endpoints      int // hosted
	Bouncers       [2]int
	Dividers       [2]int // Provisioned, total
	// Seen is how long ago its agent renewed its heartbeat Lease (-1: no
	// Lease read).
	Seen time.Duration
}

// MaxListed bounds the objects StatusReport names one by one.
const MaxListed = 20

// Healthy reports whether every droplet and object is Provisioned.
func (r *StatusReport) Healthy() bool { return len(r.NotProvisioned) == 0 }

// Status reads every networking object once (one list per kind).
func Status(ctx context.Context, c versioned.Interface) (*StatusReport, error) {
	api := c.NetworkingV1alpha1()
	r := &StatusReport{Kinds: map[string]map[v1alpha1.Phase]int{}}
	lo := metav1.ListOptions{}
	drops, err := api.Droplets().List(ctx, lo)
	if err != nil {
		return nil, fmt.Errorf("listing droplets: %w", err)
	}
	vpcs, err := api.Vpcs().List(ctx, lo)
	if err != nil {
		return nil, fmt.Errorf("listing VPCs: %w", err)
	}
	subnets, err := api.Subnets().List(ctx, lo)
	if err != nil {
		return nil, fmt.Errorf("listing subnets: %w", err)
	}
	bouncers, err := api.Bouncers().List(ctx, lo)
	if err != nil {
		return nil, fmt.Errorf("listing bouncers: %w", err)
	}
	dividers, err := api.Dividers().List(ctx, lo)
	if err != nil {
		return nil, fmt.Errorf("listing dividers: %w", err)
	}
	eps, err := api.Endpoints(metav1.NamespaceAll).List(ctx, lo)
	if err != nil {
		return nil, fmt.Errorf("listing endpoints: %w", err)
	}

	byName := map[string]*DropletStatus{}
	for _, d := range drops.Items {
		r.Droplets = append(r.Droplets, DropletStatus{Name: d.Name, Node: d.Spec.Node, IP: d.Spec.IP, Phase: phaseOf(d.Status.Phase),
			Why: Why(&d.Status.ProvisioningStatus, d.DeletionTimestamp), Seen: -1})
	}
	for i := range r.Droplets {
		byName[r.Droplets[i].Name] = &r.Droplets[i]
	}
	note := func(kind string, m metav1.Object, st *v1alpha1.ProvisioningStatus) {
		p := phaseOf(st.Phase)
		if r.Kinds[kind] == nil {
			r.Kinds[kind] = map[v1alpha1.Phase]int{}
		}
		r.Kinds[kind][p]++
		if p == v1alpha1.PhaseProvisioned && m.GetDeletionTimestamp() == nil {
			return
		}
		if len(r.NotProvisioned) >= MaxListed {
			r.More++
			return
		}
		name := m.GetName()
		if m.GetNamespace() != "" {
			name = m.GetNamespace() + "/" + name
		}
		r.NotProvisioned = append(r.NotProvisioned, fmt.Sprintf("%s %s: %s: %s", kind, name, p, Why(st, m.GetDeletionTimestamp())))
	}
	for i := range drops.Items {
		note("Droplet", &drops.Items[i], &drops.Items[i].Status.ProvisioningStatus)
	}
	for i := range vpcs.Items {
		note("Vpc", &vpcs.Items[i], &vpcs.Items[i].Status.ProvisioningStatus)
	}
	for i := range subnets.Items {
		note("Subnet", &subnets.Items[i], &subnets.Items[i].Status.ProvisioningStatus)
	}
	for i := range bouncers.Items {
		b := &bouncers.Items[i]
		note("Bouncer", b, &b.Status.ProvisioningStatus)
		if d := byName[b.Spec.Droplet]; d != nil {
			d.Bouncers[1]++
			if b.Status.Phase == v1alpha1.PhaseProvisioned {
				d.Bouncers[0]++
			}
		}
	}
	for i := range dividers.Items {
		dv := &dividers.Items[i]
		note("Divider", dv, &dv.Status.ProvisioningStatus)
		if d := byName[dv.Spec.Droplet]; d != nil {
			d.Dividers[1]++
			if dv.Status.Phase == v1alpha1.PhaseProvisioned {
				d.Dividers[0]++
			}
		}
	}
	for i := range eps.Items {
		ep := &eps.Items[i]
		note("Endpoint", ep, &ep.Status.ProvisioningStatus)
		if d := byName[ep.Spec.Droplet]; d != nil {
			d.Endpoints++
		}
	}
	return r, nil
}

func phaseOf(p v1alpha1.Phase) v1alpha1.Phase {
	if p == "" {
		return v1alpha1.PhaseInit
	}
	return p
}

// Why is why an object is not Provisioned: that it is being deleted, or its
// first False condition other than Ready (Ready repeats it), or the Ready
// message, or what the phase implies.
func Why(st *v1alpha1.ProvisioningStatus, deleting *metav1.Time) string {
	if deleting != nil {
		return "being deleted since " + deleting.UTC().Format("15:04:05")
	}
	for _, c := range st.Conditions {
		if c.Status != metav1.ConditionTrue && c.Type != "Ready" {
			return fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	if c := meta.FindStatusCondition(st.Conditions, "Ready"); c != nil && c.Status != metav1.ConditionTrue {
		return c.Message
	}
	if phaseOf(st.Phase) == v1alpha1.PhaseInit {
		return "no condition yet: its agent or operator has not acted on it"
	}
	return ""
}

// Print writes the report for people.
func (r *StatusReport) Print(w io.Writer) error {
	prov := 0
	for _, d := range r.Droplets {
		if d.Phase == v1alpha1.PhaseProvisioned {
			prov++
		}
	}
	fmt.Fprintf(w, "Droplets (node agents): %d/%d Provisioned\n", prov, len(r.Droplets))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tNODE\tIP\tPHASE\tENDPOINTS\tBOUNCERS\tDIVIDERS\tAGENT SEEN\tWHY")
	for _, d := range r.Droplets {
		seen := "-"
		if d.Seen >= 0 {
			seen = d.Seen.Round(time.Second).String() + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d/%d\t%d/%d\t%s\t%s\n", d.Name, d.Node, d.IP, d.Phase, d.Endpoints,
			d.Bouncers[0], d.Bouncers[1], d.Dividers[0], d.Dividers[1], seen, d.Why)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var kinds []string
	for _, k := range []string{"Vpc", "Subnet", "Bouncer", "Divider", "Endpoint"} {
		ph := r.Kinds[k]
		total := 0
		for _, n := range ph {
			total += n
		}
		s := fmt.Sprintf("%ss: %d/%d Provisioned", k, ph[v1alpha1.PhaseProvisioned], total)
		var rest []string
		for _, p := range []v1alpha1.Phase{v1alpha1.PhaseInit, v1alpha1.PhaseTerminating, v1alpha1.PhaseFailed} {
			if ph[p] > 0 {
				rest = append(rest, fmt.Sprintf("%d %s", ph[p], p))
			}
		}
		if len(rest) > 0 {
			s += " (" + strings.Join(rest, ", ") + ")"
		}
		kinds = append(kinds, s)
	}
	fmt.Fprintln(w, strings.Join(kinds, "; "))
	if r.Healthy() {
		fmt.Fprintln(w, "All Provisioned.")
		return nil
	}
	fmt.Fprintln(w, "Not Provisioned:")
	list := slices.Clone(r.NotProvisioned)
	for _, l := range list {
		fmt.Fprintln(w, "  "+l)
	}
	if r.More > 0 {
		fmt.Fprintf(w, "  ... and %d more\n", r.More)
	}
	return nil
}

// AddHeartbeats notes when each droplet's agent last renewed its heartbeat
// Lease (agentapi.HeartbeatLabel); an agent whose Lease outlived its
// duration is silent: named among what is not healthy, whatever the phase
// of its objects says.
func (r *StatusReport) AddHeartbeats(leases []coordinationv1.Lease, now time.Time) {
	by := map[string]*coordinationv1.Lease{}
	for i := range leases {
		by[leases[i].Labels[agentapi.HeartbeatLabel]] = &leases[i]
	}
	for i := range r.Droplets {
		d := &r.Droplets[i]
		l := by[d.Name]
		seen, silent, ok := Heartbeat(l, now)
		if !ok {
			continue
		}
		d.Seen = seen
		if silent {
			r.NotProvisioned = append(r.NotProvisioned, fmt.Sprintf("Droplet %s: agent silent: its heartbeat Lease %s/%s was last renewed %v ago (duration %ds): "+
				"is mizar-nodeagent running on node %s?", d.Name, l.Namespace, l.Name, d.Seen.Round(time.Second), *l.Spec.LeaseDurationSeconds, d.Node))
		}
	}
}

// Heartbeat reads an agent's heartbeat Lease: how long ago it was renewed,
// and whether that outlived the Lease's duration (the agent is silent); ok
// is false without a Lease or a renewal.
func Heartbeat(l *coordinationv1.Lease, now time.Time) (seen time.Duration, silent, ok bool) {
	if l == nil || l.Spec.RenewTime == nil {
		return 0, false, false
	}
	seen = max(now.Sub(l.Spec.RenewTime.Time), 0)
	silent = l.Spec.LeaseDurationSeconds != nil && seen > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second
	return seen, silent, true
}

// ErrNotHealthy is Run's error when something is not Provisioned: scripts
// and the command's exit code (1) tell it from a failure to ask.
var ErrNotHealthy = errors.New("not everything is Provisioned")

// RunStatus prints the status of the mizar behind cfg.
func RunStatus(ctx context.Context, cfg *rest.Config, w io.Writer) error {
	c, err := versioned.NewForConfig(cfg)
	if err != nil {
		return err
	}
	r, err := Status(ctx, c)
	if err != nil {
		return err
	}
	// Heartbeats live in the workload cluster: readable when cfg is its
	// kube-apiserver (mizar aggregated behind it), skipped otherwise.
	if kc, err := kubernetes.NewForConfig(cfg); err == nil {
		if l, err := kc.CoordinationV1().Leases("").List(ctx, metav1.ListOptions{LabelSelector: agentapi.HeartbeatLabel}); err == nil {
			r.AddHeartbeats(l.Items, time.Now())
		}
	}
	if err := r.Print(w); err != nil {
		return err
	}
	if !r.Healthy() {
		return ErrNotHealthy
	}
	return nil
}
