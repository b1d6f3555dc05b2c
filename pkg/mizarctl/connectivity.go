package mizarctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"mizar.dev/pkg/agentapi"
	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/generated/clientset/versioned"
)

// ConnectivityReport is what ConnectivityTest found: each droplet's agent
// and Droplet, then every check with its outcome.
type ConnectivityReport struct {
	Nodes  []NodeCheck
	Checks []Check
}

// NodeCheck is one droplet: is its agent answering, is it Provisioned.
type NodeCheck struct {
	Droplet string
	Phase   v1alpha1.Phase
	Agent   string // "ok", or why not
	OK      bool
}

// Check is one probe: From pings To (a pod's address); Want says whether
// it must get through (same VPC) or must not (another VPC: isolation).
type Check struct {
	Kind     string // "pod-pod" or "isolation"
	From, To string // droplet/namespace/pod
	VPC      string // from's VPC (-> to's, when they differ)
	Want     bool
	Result   string
	OK       bool
}

// Passed reports whether every node and check is fine.
func (r *ConnectivityReport) Passed() bool {
	for _, n := range r.Nodes {
		if !n.OK {
			return false
		}
	}
	for _, c := range r.Checks {
		if !c.OK {
			return false
		}
	}
	return len(r.Checks) > 0
}

// probePod is the pod a droplet probes from and is probed at, per VPC.
type probePod struct {
	droplet, name, vpc string
	vni                int32
	ip                 string
}

func (p probePod) String() string { return p.droplet + "/" + p.name }

// ConnectivityTest checks the network the way its pods see it, with real
// packets: every droplet's agent must answer and its Droplet be
// Provisioned; from one Provisioned pod of each (droplet, VPC), the agent
// pings every other droplet's probe pod of the same VPC (must answer) and of
// other VPCs (must not: isolation). The probe pods are the first
// Provisioned endpoint of each (droplet, VPC), by namespace/name.
func ConnectivityTest(ctx context.Context, c versioned.Interface, agents *Agents) (*ConnectivityReport, error) {
	api := c.NetworkingV1alpha1()
	lo := metav1.ListOptions{}
	drops, err := api.Droplets().List(ctx, lo)
	if err != nil {
		return nil, fmt.Errorf("listing droplets: %w", err)
	}
	subnets, err := api.Subnets().List(ctx, lo)
	if err != nil {
		return nil, fmt.Errorf("listing subnets: %w", err)
	}
	vpcs, err := api.Vpcs().List(ctx, lo)
	if err != nil {
		return nil, fmt.Errorf("listing VPCs: %w", err)
	}
	eps, err := api.Endpoints("").List(ctx, lo)
	if err != nil {
		return nil, fmt.Errorf("listing endpoints: %w", err)
	}
	vpcOf := map[string]string{}
	for _, s := range subnets.Items {
		vpcOf[s.Name] = s.Spec.VPC
	}
	vniOf := map[string]int32{}
	for _, v := range vpcs.Items {
		vniOf[v.Name] = v.Spec.VNI
	}
	r := &ConnectivityReport{}
	up := map[string]bool{}
	for _, d := range drops.Items {
		n := NodeCheck{Droplet: d.Name, Phase: phaseOf(d.Status.Phase), Agent: "ok"}
		var body []byte
		if err := agents.call(ctx, d.Name, "/healthz", nil, &body); err != nil {
			n.Agent = "NOT ANSWERING: " + err.Error()
		} else {
			up[d.Name] = true
		}
		n.OK = up[d.Name] && n.Phase == v1alpha1.PhaseProvisioned
		r.Nodes = append(r.Nodes, n)
	}
	slices.SortFunc(r.Nodes, func(a, b NodeCheck) int { return strings.Compare(a.Droplet, b.Droplet) })

	slices.SortFunc(eps.Items, func(a, b v1alpha1.Endpoint) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	probes := map[[2]string]probePod{} // (droplet, vpc)
	for _, ep := range eps.Items {
		vpc := vpcOf[ep.Spec.Subnet]
		k := [2]string{ep.Spec.Droplet, vpc}
		if _, ok := probes[k]; ok || ep.Status.Phase != v1alpha1.PhaseProvisioned || ep.Spec.IP == "" || vpc == "" {
			continue
		}
		probes[k] = probePod{droplet: ep.Spec.Droplet, name: ep.Namespace + "/" + ep.Spec.Pod, vpc: vpc, vni: vniOf[vpc], ip: ep.Spec.IP}
	}
	var ps []probePod
	for _, p := range probes {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b probePod) int { return strings.Compare(a.droplet+" "+a.vpc, b.droplet+" "+b.vpc) })
	sameVPCIP := map[string]bool{} // "vpc ip": an endpoint of that VPC has it
	for _, ep := range eps.Items {
		sameVPCIP[vpcOf[ep.Spec.Subnet]+" "+ep.Spec.IP] = true
	}
	for _, from := range ps {
		for _, to := range ps {
			if from.droplet == to.droplet {
				continue
			}
			ck := Check{Kind: "pod-pod", From: from.String(), To: to.String() + " " + to.ip, VPC: from.vpc, Want: true}
			if from.vpc != to.vpc {
				if sameVPCIP[from.vpc+" "+to.ip] {
					continue // the address is one of from's own VPC too
				}
				ck.Kind, ck.VPC, ck.Want = "isolation", from.vpc+" -> "+to.vpc, false
			}
			if !up[from.droplet] {
				ck.Result = "not run: the agent of " + from.droplet + " is not answering"
				r.Checks = append(r.Checks, ck)
				continue
			}
			q := url.Values{"vni": {strconv.Itoa(int(from.vni))}, "ip": {from.ip}, "dst": {to.ip}, "count": {"3"}}
			var pr agentapi.ProbeResponse
			switch err := agents.call(ctx, from.droplet, agentapi.PathProbe+"?"+q.Encode(), nil, &pr); {
			case err != nil:
				ck.Result = "not run: " + err.Error()
			case pr.Error != "":
				ck.Result = "not run: " + pr.Error
			case pr.Received > 0:
				ck.Result = fmt.Sprintf("answered %d/%d, %v", pr.Received, pr.Sent, pr.RTT.Round(10*time.Microsecond))
				ck.OK = ck.Want
			default:
				ck.Result = fmt.Sprintf("no answer 0/%d", pr.Sent)
				ck.OK = !ck.Want
			}
			r.Checks = append(r.Checks, ck)
		}
	}
	return r, nil
}

// Print writes the nodes and checks as tables and a summary.
func (r *ConnectivityReport) Print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DROPLET\tPHASE\tAGENT\tOK")
	for _, n := range r.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.Droplet, n.Phase, n.Agent, mark(n.OK))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "CHECK\tFROM\tTO\tVPC\tWANT\tRESULT\tOK")
	passed := 0
	for _, c := range r.Checks {
		want := "answer"
		if !c.Want {
			want = "no answer"
		}
		if c.OK {
			passed++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Kind, c.From, c.To, c.VPC, want, c.Result, mark(c.OK))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	nodes := 0
	for _, n := range r.Nodes {
		if n.OK {
			nodes++
		}
	}
	verdict := "PASSED"
	if !r.Passed() {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "%s: %d/%d droplets healthy, %d/%d checks passed\n", verdict, nodes, len(r.Nodes), passed, len(r.Checks))
	if len(r.Checks) == 0 {
		fmt.Fprintln(w, "No checks: no two droplets have a Provisioned pod.")
	}
	return nil
}

func mark(ok bool) string {
	if ok {
		return "ok"
	}
	return "FAIL"
}

// ErrConnectivity is RunConnectivityTest's error when a check failed.
var ErrConnectivity = errors.New("connectivity test failed")
