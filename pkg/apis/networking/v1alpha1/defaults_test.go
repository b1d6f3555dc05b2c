package v1alpha1

import "testing"

func TestDefaults(t *testing.T) {
	vpc := &Vpc{Spec: VpcSpec{CIDR: "10.0.0.0/16"}}
	SetObjectDefaults_Vpc(vpc)
	if vpc.Spec.Dividers != 1 {
		t.Errorf("vpc dividers defaulted to %d, want 1", vpc.Spec.Dividers)
	}
	s := &Subnet{Spec: SubnetSpec{CIDR: "10.0.4.0/22"}}
	SetObjectDefaults_Subnet(s)
	if s.Spec.Bouncers != 1 || s.Spec.Gateway != "10.0.4.1" {
		t.Errorf("subnet defaults = %d bouncers, gateway %q; want 1, 10.0.4.1", s.Spec.Bouncers, s.Spec.Gateway)
	}
	// No gateway is guessed from a CIDR validation will reject.
	bad := &Subnet{Spec: SubnetSpec{CIDR: "not-a-cidr"}}
	SetObjectDefaults_Subnet(bad)
	if bad.Spec.Gateway != "" {
		t.Errorf("gateway %q guessed from an invalid cidr", bad.Spec.Gateway)
	}
	ep := &Endpoint{}
	SetObjectDefaults_Endpoint(ep)
	if ep.Spec.Interface != "eth0" {
		t.Errorf("endpoint interface defaulted to %q, want eth0", ep.Spec.Interface)
	}
}
