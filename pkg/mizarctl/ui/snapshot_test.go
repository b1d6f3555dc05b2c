package ui

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"mizar.dev/pkg/agentapi"
	brokerv1alpha1 "mizar.dev/pkg/apis/broker/v1alpha1"
	v1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
)

// build draws every object somewhere (a subnet of a missing VPC, an
// endpoint of a missing subnet), counts what is not Provisioned (an object
// being deleted, a droplet whose agent is silent), and places orders.
func TestBuildGroupsAndCounts(t *testing.T) {
	now := time.Now()
	prov := v1alpha1.ProvisioningStatus{Phase: v1alpha1.PhaseProvisioned}
	meta := func(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name} }
	deleting := metav1.ObjectMeta{Name: "going", DeletionTimestamp: ptr.To(metav1.NewTime(now))}
	lease := func(droplet string, age time.Duration) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: agentapi.HeartbeatLeaseName(droplet), Labels: map[string]string{agentapi.HeartbeatLabel: droplet}},
			Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To(int32(40)), RenewTime: ptr.To(metav1.NewMicroTime(now.Add(-age)))}}
	}
	in := objects{
		vpcs: []*v1alpha1.Vpc{{ObjectMeta: meta("blue"), Spec: v1alpha1.VpcSpec{CIDR: "10.1.0.0/16", VNI: 7}, Status: v1alpha1.VpcStatus{ProvisioningStatus: prov}}},
		subnets: []*v1alpha1.Subnet{
			{ObjectMeta: meta("b1"), Spec: v1alpha1.SubnetSpec{VPC: "blue", CIDR: "10.1.1.0/24"}, Status: v1alpha1.SubnetStatus{ProvisioningStatus: prov}},
			{ObjectMeta: meta("lost"), Spec: v1alpha1.SubnetSpec{VPC: "gone", CIDR: "10.2.1.0/24"}},
		},
		endpoints: []*v1alpha1.Endpoint{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e2"}, Spec: v1alpha1.EndpointSpec{Subnet: "b1", Droplet: "d1", IP: "10.1.1.3"}, Status: v1alpha1.EndpointStatus{ProvisioningStatus: prov}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e1"}, Spec: v1alpha1.EndpointSpec{Subnet: "b1", Droplet: "d1", IP: "10.1.1.2"}, Status: v1alpha1.EndpointStatus{ProvisioningStatus: prov}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "stray"}, Spec: v1alpha1.EndpointSpec{Subnet: "nosuch", Droplet: "d2"}},
		},
		droplets: []*v1alpha1.Droplet{
			{ObjectMeta: meta("d1"), Status: v1alpha1.DropletStatus{ProvisioningStatus: prov}},
			{ObjectMeta: meta("d2"), Status: v1alpha1.DropletStatus{ProvisioningStatus: prov}},
		},
		bouncers: []*v1alpha1.Bouncer{
			{ObjectMeta: meta("bb"), Spec: v1alpha1.BouncerSpec{Subnet: "b1", Droplet: "d1"}, Status: v1alpha1.BouncerStatus{ProvisioningStatus: prov}},
			{ObjectMeta: deleting, Spec: v1alpha1.BouncerSpec{Subnet: "b1", Droplet: "d2"}, Status: v1alpha1.BouncerStatus{ProvisioningStatus: prov}},
		},
		leases: []*coordinationv1.Lease{lease("d1", 3*time.Second), lease("d2", 2*time.Minute)},
	}
	s := build(in, now)

	var tree []string
	for _, v := range s.VPCs {
		for _, sn := range v.Subnets {
			var eps []string
			for _, ep := range sn.Endpoints {
				eps = append(eps, ep.Name)
			}
			tree = append(tree, v.Name+">"+sn.Name+">"+strings.Join(eps, "+"))
		}
	}
	// Sorted: the unnamed VPC of the missing subnet first.
	if got, want := strings.Join(tree, " "), ">nosuch>stray blue>b1>e1+e2 gone>lost>"; got != want {
		t.Errorf("tree %q, want %q", got, want)
	}
	if !s.VPCs[0].Missing || !s.VPCs[0].Subnets[0].Missing || !s.VPCs[2].Missing || s.VPCs[1].Missing {
		t.Errorf("missing marks wrong: %+v", s.VPCs)
	}
	if b := s.VPCs[1].Subnets[0].Bouncers; b != [2]int{1, 2} {
		t.Errorf("b1's bouncers %v, want 1/2 (one being deleted)", b)
	}
	want := map[string]int{"Subnet": 1, "Endpoint": 1, "Bouncer": 1, "Droplet": 1}
	for k, n := range want {
		if s.NotProvisioned[k] != n {
			t.Errorf("%s not Provisioned: %d, want %d (all: %v)", k, s.NotProvisioned[k], n, s.NotProvisioned)
		}
	}
	if s.NotProvisioned["Vpc"] != 0 || s.Total["Endpoint"] != 3 {
		t.Errorf("counts %v of %v", s.NotProvisioned, s.Total)
	}
	d1, d2 := s.Droplets[0], s.Droplets[1]
	if d1.Silent || d1.Seen == nil || *d1.Seen != 3 || d1.Why != "" || d1.Endpoints != 2 || d1.Bouncers != [2]int{1, 1} {
		t.Errorf("d1 %+v: want seen 3s ago, 2 endpoints, 1/1 bouncers", d1)
	}
	if !d2.Silent || !strings.Contains(d2.Why, "agent silent") || d2.Bouncers != [2]int{0, 1} {
		t.Errorf("d2 %+v: want silent, 0/1 bouncers", d2)
	}
	if s.Orders != nil {
		t.Errorf("orders %v without a broker, want nil (drawn as not served)", s.Orders)
	}

	in.orders = []*brokerv1alpha1.ServiceInstance{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db"},
		Spec: brokerv1alpha1.ServiceInstanceSpec{Class: "mysql", Plan: "small"},
		Status: brokerv1alpha1.ServiceInstanceStatus{Phase: brokerv1alpha1.PhaseProvisioning,
			Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "StepFailed", Message: "quota"}},
			Steps:      []brokerv1alpha1.Step{{Name: "CreatingSecret", State: "Done"}, {Name: "CreatingStatefulSet", State: "Running", Attempts: 2, Message: "quota"}}}}}
	s = build(in, now)
	if len(s.Orders) != 1 || len(s.Orders[0].Steps) != 2 || s.Orders[0].Why != "Ready=False StepFailed: quota" || s.NotProvisioned["ServiceInstance"] != 1 {
		t.Errorf("orders %+v", s.Orders)
	}
	// The same objects give the same bytes (no change, nothing sent).
	a, _ := json.Marshal(build(in, now))
	b, _ := json.Marshal(build(in, now))
	if string(a) != string(b) {
		t.Error("build is not deterministic")
	}
}
