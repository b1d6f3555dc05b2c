package ui

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"mizar.dev/pkg/agentapi"
	brokerv1alpha1 "mizar.dev/pkg/apis/broker/v1alpha1"
	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/mizarctl"
)

// Snapshot is what the page draws: the network as a tree (VPC -> subnet ->
// endpoint), the droplets beside it, the broker's orders, and per kind how
// many objects are not Provisioned. It is sent whole on every change.
type Snapshot struct {
	VPCs     []VPC     `json:"vpcs"`
	Droplets []Droplet `json:"droplets"`
	// Orders is nil when broker.mizar.dev is not served or not readable.
	Orders []Order `json:"orders"`
	// Total and NotProvisioned count each kind's objects.
	Total          map[string]int `json:"total"`
	NotProvisioned map[string]int `json:"notProvisioned"`
	// Unreadable names the kinds the kubeconfig's user may not list.
	Unreadable []string `json:"unreadable"`
}

// Object is what every drawn object has.
type Object struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Phase     string `json:"phase"`
	// Why is set when the object is not Provisioned (mizarctl status's why).
	Why string `json:"why,omitempty"`
	// Missing marks a VPC or subnet that is referenced but does not exist.
	Missing bool `json:"missing,omitempty"`
}

// VPC is a Vpc with its subnets.
type VPC struct {
	Object
	CIDR     string   `json:"cidr"`
	VNI      int32    `json:"vni"`
	Dividers [2]int   `json:"dividers"` // Provisioned, total
	Subnets  []Subnet `json:"subnets"`
}

// Subnet is a Subnet with its endpoints.
type Subnet struct {
	Object
	CIDR      string     `json:"cidr"`
	Gateway   string     `json:"gateway,omitempty"`
	Bouncers  [2]int     `json:"bouncers"` // Provisioned, total
	Endpoints []Endpoint `json:"endpoints"`
}

// Endpoint is one Endpoint (a pod's interface).
type Endpoint struct {
	Object
	IP      string `json:"ip"`
	MAC     string `json:"mac"`
	Droplet string `json:"droplet"`
	Pod     string `json:"pod,omitempty"`
}

// Droplet is one node agent's Droplet and what it serves.
type Droplet struct {
	Object
	Node      string `json:"node"`
	IP        string `json:"ip"`
	Endpoints int    `json:"endpoints"`
	Bouncers  [2]int `json:"bouncers"`
	Dividers  [2]int `json:"dividers"`
	// Seen is how many seconds ago its agent renewed its heartbeat Lease
	// (nil: no Lease read); Silent when that outlived the Lease's duration.
	Seen   *int64 `json:"seen,omitempty"`
	Silent bool   `json:"silent,omitempty"`
}

// Order is a ServiceInstance with its saga's steps.
type Order struct {
	Object
	Class  string `json:"class"`
	Plan   string `json:"plan"`
	Subnet string `json:"subnet,omitempty"`
	Steps  []Step `json:"steps"`
}

// Step is one saga step of an order.
type Step struct {
	Name     string `json:"name"`
	State    string `json:"state"`
	Attempts int32  `json:"attempts,omitempty"`
	Message  string `json:"message,omitempty"`
}

// objects is what the informers hold when a snapshot is built.
type objects struct {
	vpcs      []*v1alpha1.Vpc
	subnets   []*v1alpha1.Subnet
	endpoints []*v1alpha1.Endpoint
	droplets  []*v1alpha1.Droplet
	dividers  []*v1alpha1.Divider
	bouncers  []*v1alpha1.Bouncer
	orders    []*brokerv1alpha1.ServiceInstance // nil: not watched
	leases    []*coordinationv1.Lease
}

func phase(p v1alpha1.Phase) string {
	if p == "" {
		return string(v1alpha1.PhaseInit)
	}
	return string(p)
}

func object(m metav1.Object, st *v1alpha1.ProvisioningStatus) Object {
	o := Object{Namespace: m.GetNamespace(), Name: m.GetName(), Phase: phase(st.Phase)}
	if o.Phase != string(v1alpha1.PhaseProvisioned) || m.GetDeletionTimestamp() != nil {
		o.Why = mizarctl.Why(st, m.GetDeletionTimestamp())
	}
	return o
}

// build turns the cached objects into a Snapshot, every list sorted so that
// the same objects give the same bytes.
func build(in objects, now time.Time) *Snapshot {
	s := &Snapshot{Total: map[string]int{}, NotProvisioned: map[string]int{}}
	count := func(kind string, o Object) {
		s.Total[kind]++
		if o.Phase != string(v1alpha1.PhaseProvisioned) || o.Why != "" {
			s.NotProvisioned[kind]++
		}
	}

	vpcs := map[string]*VPC{}
	vpc := func(name string) *VPC {
		if v := vpcs[name]; v != nil {
			return v
		}
		v := &VPC{Object: Object{Name: name, Missing: true, Why: "referenced but not found"}}
		vpcs[name] = v
		return v
	}
	for _, v := range in.vpcs {
		o := object(v, &v.Status.ProvisioningStatus)
		count("Vpc", o)
		vpcs[v.Name] = &VPC{Object: o, CIDR: v.Spec.CIDR, VNI: v.Spec.VNI}
	}
	subnets := map[string]*Subnet{}
	subnetVPC := map[string]string{}
	for _, sn := range in.subnets {
		o := object(sn, &sn.Status.ProvisioningStatus)
		count("Subnet", o)
		subnets[sn.Name] = &Subnet{Object: o, CIDR: sn.Spec.CIDR, Gateway: sn.Spec.Gateway}
		subnetVPC[sn.Name] = sn.Spec.VPC
	}
	drops := map[string]*Droplet{}
	for _, d := range in.droplets {
		o := object(d, &d.Status.ProvisioningStatus)
		count("Droplet", o)
		drops[d.Name] = &Droplet{Object: o, Node: d.Spec.Node, IP: d.Spec.IP}
	}
	for _, dv := range in.dividers {
		o := object(dv, &dv.Status.ProvisioningStatus)
		count("Divider", o)
		prov := 0
		if o.Why == "" {
			prov = 1
		}
		v := vpc(dv.Spec.VPC)
		v.Dividers[0] += prov
		v.Dividers[1]++
		if d := drops[dv.Spec.Droplet]; d != nil {
			d.Dividers[0] += prov
			d.Dividers[1]++
		}
	}
	missingSubnet := func(name string) *Subnet {
		sn := &Subnet{Object: Object{Name: name, Missing: true, Why: "referenced but not found"}}
		subnets[name] = sn
		return sn
	}
	for _, b := range in.bouncers {
		o := object(b, &b.Status.ProvisioningStatus)
		count("Bouncer", o)
		prov := 0
		if o.Why == "" {
			prov = 1
		}
		sn := subnets[b.Spec.Subnet]
		if sn == nil {
			sn = missingSubnet(b.Spec.Subnet)
		}
		sn.Bouncers[0] += prov
		sn.Bouncers[1]++
		if d := drops[b.Spec.Droplet]; d != nil {
			d.Bouncers[0] += prov
			d.Bouncers[1]++
		}
	}
	for _, ep := range in.endpoints {
		o := object(ep, &ep.Status.ProvisioningStatus)
		count("Endpoint", o)
		sn := subnets[ep.Spec.Subnet]
		if sn == nil {
			sn = missingSubnet(ep.Spec.Subnet)
		}
		sn.Endpoints = append(sn.Endpoints, Endpoint{Object: o, IP: ep.Spec.IP, MAC: ep.Spec.MAC, Droplet: ep.Spec.Droplet, Pod: ep.Spec.Pod})
		if d := drops[ep.Spec.Droplet]; d != nil {
			d.Endpoints++
		}
	}
	for name, sn := range subnets {
		slices.SortFunc(sn.Endpoints, func(a, b Endpoint) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
		})
		// A subnet whose VPC is unknown (or that is itself missing) is
		// drawn under a VPC marked missing, so nothing is hidden.
		v := vpc(subnetVPC[name])
		v.Subnets = append(v.Subnets, *sn)
	}
	for _, v := range vpcs {
		slices.SortFunc(v.Subnets, func(a, b Subnet) int { return cmp.Compare(a.Name, b.Name) })
		s.VPCs = append(s.VPCs, *v)
	}
	slices.SortFunc(s.VPCs, func(a, b VPC) int { return cmp.Compare(a.Name, b.Name) })

	leases := map[string]*coordinationv1.Lease{}
	for _, l := range in.leases {
		leases[l.Labels[agentapi.HeartbeatLabel]] = l
	}
	for _, d := range drops {
		if seen, silent, ok := mizarctl.Heartbeat(leases[d.Name], now); ok {
			sec := int64(seen / time.Second)
			d.Seen, d.Silent = &sec, silent
			if silent {
				if d.Why == "" { // counted as Provisioned above
					s.NotProvisioned["Droplet"]++
				}
				d.Why = fmt.Sprintf("agent silent: heartbeat last renewed %ds ago", sec)
			}
		}
		s.Droplets = append(s.Droplets, *d)
	}
	slices.SortFunc(s.Droplets, func(a, b Droplet) int { return cmp.Compare(a.Name, b.Name) })

	if in.orders != nil {
		s.Orders = []Order{}
		for _, si := range in.orders {
			o := Object{Namespace: si.Namespace, Name: si.Name, Phase: string(si.Status.Phase)}
			if o.Phase == "" {
				o.Phase = string(brokerv1alpha1.PhasePending)
			}
			if o.Phase != string(brokerv1alpha1.PhaseProvisioned) {
				for _, c := range si.Status.Conditions {
					if c.Status != metav1.ConditionTrue {
						o.Why = fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
						break
					}
				}
			}
			s.Total["ServiceInstance"]++
			if o.Phase != string(brokerv1alpha1.PhaseProvisioned) {
				s.NotProvisioned["ServiceInstance"]++
			}
			ord := Order{Object: o, Class: si.Spec.Class, Plan: si.Spec.Plan, Subnet: si.Spec.Subnet, Steps: []Step{}}
			for _, st := range si.Status.Steps {
				ord.Steps = append(ord.Steps, Step{Name: st.Name, State: string(st.State), Attempts: st.Attempts, Message: st.Message})
			}
			s.Orders = append(s.Orders, ord)
		}
		slices.SortFunc(s.Orders, func(a, b Order) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
		})
	}
	return s
}
