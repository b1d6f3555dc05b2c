package validation

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"mizar.dev/pkg/apis/networking"
)

// want is the one error a rule must report: its field, type and a fragment of its detail.
// A zero want means the object is valid.
type want struct {
	field  string
	typ    field.ErrorType
	detail string
}

func check(t *testing.T, errs field.ErrorList, w want) {
	t.Helper()
	if w.field == "" {
		if len(errs) > 0 {
			t.Fatalf("want no errors, got %v", errs)
		}
		return
	}
	if len(errs) != 1 {
		t.Fatalf("want exactly one error on %s, got %d: %v", w.field, len(errs), errs)
	}
	e := errs[0]
	if e.Field != w.field || e.Type != w.typ || !strings.Contains(e.Detail, w.detail) {
		t.Fatalf("got %s %q (%s), want %s %q containing %q", e.Field, e.Type, e.Detail, w.field, w.typ, w.detail)
	}
}

func meta(name, namespace string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: namespace}
}

func TestValidateVpc(t *testing.T) {
	ok := func() *networking.Vpc {
		return &networking.Vpc{ObjectMeta: meta("v", ""), Spec: networking.VpcSpec{CIDR: "10.0.0.0/16", VNI: 7, Dividers: 1}}
	}
	cidr := func(c string) func(*networking.Vpc) { return func(v *networking.Vpc) { v.Spec.CIDR = c } }
	tests := []struct {
		name   string
		mutate func(*networking.Vpc)
		want   want
	}{
		{"valid", func(*networking.Vpc) {}, want{}},
		{"vni 0 allocates", func(v *networking.Vpc) { v.Spec.VNI = 0 }, want{}},
		{"cidr missing", cidr(""), want{"spec.cidr", field.ErrorTypeRequired, "IPv4 CIDR"}},
		{"cidr not a cidr", cidr("10.0.0.0"), want{"spec.cidr", field.ErrorTypeInvalid, "CIDR"}},
		{"cidr not canonical", cidr("10.0.0.1/16"), want{"spec.cidr", field.ErrorTypeInvalid, "beyond the prefix length"}},
		{"cidr IPv6", cidr("fd00::/64"), want{"spec.cidr", field.ErrorTypeInvalid, "only IPv4"}},
		{"cidr too small", cidr("10.0.0.0/30"), want{"spec.cidr", field.ErrorTypeInvalid, "at most /29"}},
		{"cidr everything", cidr("0.0.0.0/0"), want{"spec.cidr", field.ErrorTypeInvalid, "0.0.0.0/8"}},
		{"cidr this network", cidr("0.0.0.0/24"), want{"spec.cidr", field.ErrorTypeInvalid, "unspecified"}},
		{"cidr loopback", cidr("127.0.0.0/16"), want{"spec.cidr", field.ErrorTypeInvalid, "loopback"}},
		{"cidr link-local", cidr("169.254.0.0/16"), want{"spec.cidr", field.ErrorTypeInvalid, "link-local"}},
		{"cidr multicast", cidr("224.0.0.0/24"), want{"spec.cidr", field.ErrorTypeInvalid, "multicast"}},
		{"cidr covering multicast", cidr("192.0.0.0/2"), want{"spec.cidr", field.ErrorTypeInvalid, "multicast"}},
		{"cidr reserved", cidr("255.255.255.0/24"), want{"spec.cidr", field.ErrorTypeInvalid, "broadcast"}},
		{"cidr next to link-local", cidr("169.255.0.0/16"), want{}},
		{"vni negative", func(v *networking.Vpc) { v.Spec.VNI = -1 }, want{"spec.vni", field.ErrorTypeInvalid, "between 1 and"}},
		{"vni too large", func(v *networking.Vpc) { v.Spec.VNI = MaxVNI + 1 }, want{"spec.vni", field.ErrorTypeInvalid, "between 1 and"}},
		{"no dividers", func(v *networking.Vpc) { v.Spec.Dividers = 0 }, want{"spec.dividers", field.ErrorTypeInvalid, "between 1 and 16"}},
		{"too many dividers", func(v *networking.Vpc) { v.Spec.Dividers = MaxDividers + 1 }, want{"spec.dividers", field.ErrorTypeInvalid, "between 1 and 16"}},
		{"bad name", func(v *networking.Vpc) { v.Name = "Big_Name" }, want{"metadata.name", field.ErrorTypeInvalid, "RFC 1123"}},
		{"namespaced", func(v *networking.Vpc) { v.Namespace = "ns" }, want{"metadata.namespace", field.ErrorTypeForbidden, "not allowed"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := ok()
			tc.mutate(v)
			check(t, ValidateVpc(v), tc.want)
		})
	}
}

func TestValidateVpcUpdate(t *testing.T) {
	old := &networking.Vpc{ObjectMeta: meta("v", ""), Spec: networking.VpcSpec{CIDR: "10.0.0.0/16", VNI: 7, Dividers: 1}}
	old.ResourceVersion = "5"
	tests := []struct {
		name   string
		mutate func(*networking.Vpc)
		want   want
	}{
		{"more dividers", func(v *networking.Vpc) { v.Spec.Dividers = 2 }, want{}},
		{"cidr", func(v *networking.Vpc) { v.Spec.CIDR = "10.1.0.0/16" }, want{"spec.cidr", field.ErrorTypeInvalid, "immutable"}},
		{"vni", func(v *networking.Vpc) { v.Spec.VNI = 8 }, want{"spec.vni", field.ErrorTypeInvalid, "immutable"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := old.DeepCopy()
			tc.mutate(v)
			check(t, ValidateVpcUpdate(v, old), tc.want)
		})
	}
}

func TestValidateSubnet(t *testing.T) {
	ok := func() *networking.Subnet {
		return &networking.Subnet{ObjectMeta: meta("s", ""), Spec: networking.SubnetSpec{VPC: "v", CIDR: "10.0.1.0/24", Bouncers: 1, Gateway: "10.0.1.1"}}
	}
	tests := []struct {
		name   string
		mutate func(*networking.Subnet)
		want   want
	}{
		{"valid", func(*networking.Subnet) {}, want{}},
		{"no vpc", func(s *networking.Subnet) { s.Spec.VPC = "" }, want{"spec.vpc", field.ErrorTypeRequired, ""}},
		{"bad vpc name", func(s *networking.Subnet) { s.Spec.VPC = "A" }, want{"spec.vpc", field.ErrorTypeInvalid, "RFC 1123"}},
		// Defaulting leaves the gateway empty for an IPv6 CIDR: only the CIDR is at fault.
		{"IPv6 cidr, one error", func(s *networking.Subnet) { s.Spec.CIDR, s.Spec.Gateway = "fd00::/64", "" },
			want{"spec.cidr", field.ErrorTypeInvalid, "only IPv4"}},
		{"loopback cidr", func(s *networking.Subnet) { s.Spec.CIDR, s.Spec.Gateway = "127.0.1.0/24", "127.0.1.1" },
			want{"spec.cidr", field.ErrorTypeInvalid, "loopback"}},
		{"no gateway", func(s *networking.Subnet) { s.Spec.Gateway = "" }, want{"spec.gateway", field.ErrorTypeRequired, "first address"}},
		{"gateway not an IP", func(s *networking.Subnet) { s.Spec.Gateway = "gw" }, want{"spec.gateway", field.ErrorTypeInvalid, "IP"}},
		{"gateway IPv6", func(s *networking.Subnet) { s.Spec.Gateway = "fd00::1" }, want{"spec.gateway", field.ErrorTypeInvalid, "only IPv4"}},
		{"gateway outside", func(s *networking.Subnet) { s.Spec.Gateway = "10.0.2.1" }, want{"spec.gateway", field.ErrorTypeInvalid, "inside 10.0.1.0/24"}},
		{"gateway network address", func(s *networking.Subnet) { s.Spec.Gateway = "10.0.1.0" }, want{"spec.gateway", field.ErrorTypeInvalid, "network address"}},
		{"gateway broadcast", func(s *networking.Subnet) { s.Spec.Gateway = "10.0.1.255" }, want{"spec.gateway", field.ErrorTypeInvalid, "broadcast"}},
		{"no bouncers", func(s *networking.Subnet) { s.Spec.Bouncers = 0 }, want{"spec.bouncers", field.ErrorTypeInvalid, "between 1 and 16"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := ok()
			tc.mutate(s)
			check(t, ValidateSubnet(s), tc.want)
		})
	}
}

func TestValidateSubnetUpdate(t *testing.T) {
	old := &networking.Subnet{ObjectMeta: meta("s", ""), Spec: networking.SubnetSpec{VPC: "v", CIDR: "10.0.1.0/24", Bouncers: 1, Gateway: "10.0.1.1"}}
	old.ResourceVersion = "5"
	tests := []struct {
		name   string
		mutate func(*networking.Subnet)
		want   want
	}{
		{"more bouncers", func(s *networking.Subnet) { s.Spec.Bouncers = 3 }, want{}},
		{"vpc", func(s *networking.Subnet) { s.Spec.VPC = "w" }, want{"spec.vpc", field.ErrorTypeInvalid, "immutable"}},
		{"cidr", func(s *networking.Subnet) { s.Spec.CIDR = "10.0.1.0/25" }, want{"spec.cidr", field.ErrorTypeInvalid, "immutable"}},
		{"gateway", func(s *networking.Subnet) { s.Spec.Gateway = "10.0.1.2" }, want{"spec.gateway", field.ErrorTypeInvalid, "immutable"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := old.DeepCopy()
			tc.mutate(s)
			check(t, ValidateSubnetUpdate(s, old), tc.want)
		})
	}
}

func TestValidateSubnetRelations(t *testing.T) {
	vpc := &networking.Vpc{ObjectMeta: meta("v", ""), Spec: networking.VpcSpec{CIDR: "10.0.0.0/16"}}
	s := &networking.Subnet{ObjectMeta: meta("s", ""), Spec: networking.SubnetSpec{VPC: "v", CIDR: "10.0.1.0/24"}}
	deleting := vpc.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{}
	outside := s.DeepCopy()
	outside.Spec.CIDR = "10.1.0.0/24"
	larger := s.DeepCopy()
	larger.Spec.CIDR = "10.0.0.0/15"
	// Overlap with siblings is the claim of the range (test/integration/allocation).
	tests := []struct {
		name string
		s    *networking.Subnet
		vpc  *networking.Vpc
		want want
	}{
		{"valid", s, vpc, want{}},
		{"vpc missing", s, nil, want{"spec.vpc", field.ErrorTypeNotFound, ""}},
		{"vpc being deleted", s, deleting, want{"spec.vpc", field.ErrorTypeForbidden, "being deleted"}},
		{"outside vpc", outside, vpc, want{"spec.cidr", field.ErrorTypeInvalid, "inside VPC v"}},
		{"larger than vpc", larger, vpc, want{"spec.cidr", field.ErrorTypeInvalid, "inside VPC v"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			check(t, ValidateSubnetRelations(tc.s, tc.vpc), tc.want)
		})
	}
}

func TestValidateDividerAndBouncer(t *testing.T) {
	d := &networking.Divider{ObjectMeta: meta("d", ""), Spec: networking.DividerSpec{VPC: "v"}}
	check(t, ValidateDivider(d), want{})
	d2 := d.DeepCopy()
	d2.Spec.VPC = ""
	check(t, ValidateDivider(d2), want{"spec.vpc", field.ErrorTypeRequired, ""})
	d3 := d.DeepCopy()
	d3.Spec.Droplet = "Bad"
	check(t, ValidateDivider(d3), want{"spec.droplet", field.ErrorTypeInvalid, "RFC 1123"})
	d.ResourceVersion = "1"
	d4 := d.DeepCopy()
	d4.Spec.VPC = "w"
	check(t, ValidateDividerUpdate(d4, d), want{"spec.vpc", field.ErrorTypeInvalid, "immutable"})

	b := &networking.Bouncer{ObjectMeta: meta("b", ""), Spec: networking.BouncerSpec{Subnet: "s"}}
	check(t, ValidateBouncer(b), want{})
	b2 := b.DeepCopy()
	b2.Spec.Subnet = ""
	check(t, ValidateBouncer(b2), want{"spec.subnet", field.ErrorTypeRequired, ""})
	b.ResourceVersion = "1"
	b3 := b.DeepCopy()
	b3.Spec.Subnet = "t"
	check(t, ValidateBouncerUpdate(b3, b), want{"spec.subnet", field.ErrorTypeInvalid, "immutable"})
}

func TestValidateEndpoint(t *testing.T) {
	ok := func() *networking.Endpoint {
		return &networking.Endpoint{ObjectMeta: meta("e", "ns"), Spec: networking.EndpointSpec{
			Subnet: "s", Droplet: "d", Interface: "eth0", MAC: "02:00:00:00:00:01", IP: "10.0.1.5"}}
	}
	mac := func(m string) func(*networking.Endpoint) { return func(e *networking.Endpoint) { e.Spec.MAC = m } }
	tests := []struct {
		name   string
		mutate func(*networking.Endpoint)
		want   want
	}{
		{"valid", func(*networking.Endpoint) {}, want{}},
		{"ip allocated later", func(e *networking.Endpoint) { e.Spec.IP = "" }, want{}},
		{"not namespaced", func(e *networking.Endpoint) { e.Namespace = "" }, want{"metadata.namespace", field.ErrorTypeRequired, ""}},
		{"no subnet", func(e *networking.Endpoint) { e.Spec.Subnet = "" }, want{"spec.subnet", field.ErrorTypeRequired, ""}},
		{"no droplet", func(e *networking.Endpoint) { e.Spec.Droplet = "" }, want{"spec.droplet", field.ErrorTypeRequired, ""}},
		{"bad pod", func(e *networking.Endpoint) { e.Spec.Pod = "P" }, want{"spec.pod", field.ErrorTypeInvalid, "RFC 1123"}},
		{"no interface", func(e *networking.Endpoint) { e.Spec.Interface = "" }, want{"spec.interface", field.ErrorTypeRequired, ""}},
		{"interface too long", func(e *networking.Endpoint) { e.Spec.Interface = "abcdefghijklmnop" }, want{"spec.interface", field.ErrorTypeTooLong, "15"}},
		{"interface with slash", func(e *networking.Endpoint) { e.Spec.Interface = "a/b" }, want{"spec.interface", field.ErrorTypeInvalid, "Linux interface name"}},
		{"interface with NUL", func(e *networking.Endpoint) { e.Spec.Interface = "eth\x000" }, want{"spec.interface", field.ErrorTypeInvalid, "printable ASCII"}},
		{"interface with a control character", func(e *networking.Endpoint) { e.Spec.Interface = "eth\x1b[0" }, want{"spec.interface", field.ErrorTypeInvalid, "printable ASCII"}},
		{"interface not ASCII", func(e *networking.Endpoint) { e.Spec.Interface = "ethé" }, want{"spec.interface", field.ErrorTypeInvalid, "printable ASCII"}},
		{"no mac", mac(""), want{"spec.mac", field.ErrorTypeRequired, "MAC"}},
		{"mac not a mac", mac("02-00-00-00-00-01"), want{"spec.mac", field.ErrorTypeInvalid, "colon-separated"}},
		{"mac too long", mac("02:00:00:00:00:00:00:01"), want{"spec.mac", field.ErrorTypeInvalid, "48-bit"}},
		{"mac all zeros", mac("00:00:00:00:00:00"), want{"spec.mac", field.ErrorTypeInvalid, "all zeros"}},
		{"mac multicast", mac("01:00:5e:00:00:01"), want{"spec.mac", field.ErrorTypeInvalid, "unicast"}},
		{"mac broadcast", mac("ff:ff:ff:ff:ff:ff"), want{"spec.mac", field.ErrorTypeInvalid, "unicast"}},
		{"mac upper case", mac("02:00:00:00:00:AB"), want{"spec.mac", field.ErrorTypeInvalid, "lower-case"}},
		{"ip not an ip", func(e *networking.Endpoint) { e.Spec.IP = "ten" }, want{"spec.ip", field.ErrorTypeInvalid, "IP"}},
		{"ip IPv6", func(e *networking.Endpoint) { e.Spec.IP = "fd00::5" }, want{"spec.ip", field.ErrorTypeInvalid, "only IPv4"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := ok()
			tc.mutate(e)
			check(t, ValidateEndpoint(e), tc.want)
		})
	}
}

func TestValidateEndpointUpdateAndRelations(t *testing.T) {
	old := &networking.Endpoint{ObjectMeta: meta("e", "ns"), Spec: networking.EndpointSpec{
		Subnet: "s", Droplet: "d", Interface: "eth0", MAC: "02:00:00:00:00:01", IP: "10.0.1.5"}}
	old.ResourceVersion = "3"
	moved := old.DeepCopy()
	moved.Spec.Droplet = "d2"
	check(t, ValidateEndpointUpdate(moved, old), want{})
	renumbered := old.DeepCopy()
	renumbered.Spec.IP = "10.0.1.6"
	check(t, ValidateEndpointUpdate(renumbered, old), want{"spec.ip", field.ErrorTypeInvalid, "immutable"})
	resubnetted := old.DeepCopy()
	resubnetted.Spec.Subnet = "t"
	check(t, ValidateEndpointUpdate(resubnetted, old), want{"spec.subnet", field.ErrorTypeInvalid, "immutable"})

	subnet := &networking.Subnet{ObjectMeta: meta("s", ""), Spec: networking.SubnetSpec{CIDR: "10.0.1.0/24", Gateway: "10.0.1.1"}}
	deleting := subnet.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{}
	ip := func(a string) *networking.Endpoint { e := old.DeepCopy(); e.Spec.IP = a; return e }
	tests := []struct {
		name   string
		ep     *networking.Endpoint
		subnet *networking.Subnet
		want   want
	}{
		{"valid", old, subnet, want{}},
		{"subnet missing", old, nil, want{"spec.subnet", field.ErrorTypeNotFound, ""}},
		{"subnet being deleted", old, deleting, want{"spec.subnet", field.ErrorTypeForbidden, "being deleted"}},
		{"outside subnet", ip("10.0.2.5"), subnet, want{"spec.ip", field.ErrorTypeInvalid, "inside 10.0.1.0/24"}},
		{"network address", ip("10.0.1.0"), subnet, want{"spec.ip", field.ErrorTypeInvalid, "network address"}},
		{"broadcast", ip("10.0.1.255"), subnet, want{"spec.ip", field.ErrorTypeInvalid, "broadcast"}},
		{"gateway", ip("10.0.1.1"), subnet, want{"spec.ip", field.ErrorTypeInvalid, "gateway"}},
	}
	// Uniqueness of the address is its claim (test/integration/allocation).
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			errs := ValidateEndpointSubnet(tc.ep, tc.subnet)
			if len(errs) == 0 {
				errs = ValidateEndpointAddress(tc.ep, tc.subnet)
			}
			check(t, errs, tc.want)
		})
	}
}

func TestValidateDroplet(t *testing.T) {
	ok := func() *networking.Droplet {
		return &networking.Droplet{ObjectMeta: meta("d", ""), Spec: networking.DropletSpec{
			Node: "n", IP: "192.168.0.10", MAC: "02:00:00:00:00:0a", Interface: "eth0"}}
	}
	ip := func(a string) func(*networking.Droplet) { return func(d *networking.Droplet) { d.Spec.IP = a } }
	tests := []struct {
		name   string
		mutate func(*networking.Droplet)
		want   want
	}{
		{"valid", func(*networking.Droplet) {}, want{}},
		{"no node", func(d *networking.Droplet) { d.Spec.Node = "" }, want{"spec.node", field.ErrorTypeRequired, ""}},
		{"no ip", ip(""), want{"spec.ip", field.ErrorTypeRequired, "IPv4"}},
		{"ip not an ip", ip("host"), want{"spec.ip", field.ErrorTypeInvalid, "IP"}},
		{"ip IPv6", ip("fd00::1"), want{"spec.ip", field.ErrorTypeInvalid, "only IPv4"}},
		{"ip unspecified", ip("0.0.0.0"), want{"spec.ip", field.ErrorTypeInvalid, "unspecified"}},
		{"ip broadcast", ip("255.255.255.255"), want{"spec.ip", field.ErrorTypeInvalid, "broadcast"}},
		{"ip multicast", ip("239.1.2.3"), want{"spec.ip", field.ErrorTypeInvalid, "multicast"}},
		{"ip loopback", ip("127.0.0.2"), want{"spec.ip", field.ErrorTypeInvalid, "loopback"}},
		{"mac all zeros", func(d *networking.Droplet) { d.Spec.MAC = "00:00:00:00:00:00" }, want{"spec.mac", field.ErrorTypeInvalid, "all zeros"}},
		{"no interface", func(d *networking.Droplet) { d.Spec.Interface = "" }, want{"spec.interface", field.ErrorTypeRequired, ""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := ok()
			tc.mutate(d)
			check(t, ValidateDroplet(d), tc.want)
		})
	}
	old := ok()
	old.ResourceVersion = "2"
	renamed := old.DeepCopy()
	renamed.Spec.Node = "m"
	check(t, ValidateDropletUpdate(renamed, old), want{"spec.node", field.ErrorTypeInvalid, "immutable"})
}

func TestValidateProvisioningStatus(t *testing.T) {
	cond := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Done", LastTransitionTime: metav1.Now()}
	tests := []struct {
		name string
		st   networking.ProvisioningStatus
		want want
	}{
		{"valid", networking.ProvisioningStatus{Phase: networking.PhaseProvisioned, ObservedGeneration: 2, Conditions: []metav1.Condition{cond}}, want{}},
		{"unknown phase", networking.ProvisioningStatus{Phase: "Done"}, want{"status.phase", field.ErrorTypeNotSupported, ""}},
		{"negative generation", networking.ProvisioningStatus{ObservedGeneration: -1}, want{"status.observedGeneration", field.ErrorTypeInvalid, "greater than or equal to 0"}},
		{"future generation", networking.ProvisioningStatus{ObservedGeneration: 3}, want{"status.observedGeneration", field.ErrorTypeInvalid, "must not exceed"}},
		{"bad condition", networking.ProvisioningStatus{Conditions: []metav1.Condition{{Type: "Ready", Status: "Maybe", Reason: "X", LastTransitionTime: metav1.Now()}}},
			want{"status.conditions[0].status", field.ErrorTypeNotSupported, ""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			check(t, ValidateProvisioningStatus(&tc.st, 2), tc.want)
		})
	}
}

// Watermarks are resourceVersions: "abc" and a subnet listed twice (the
// list's map key) are refused.
func TestValidateWatermarks(t *testing.T) {
	path := field.NewPath("status", "appliedResourceVersion")
	if errs := ValidateWatermark("", path); len(errs) > 0 {
		t.Errorf("empty watermark: %v", errs)
	}
	if errs := ValidateWatermark("12345", path); len(errs) > 0 {
		t.Errorf("watermark 12345: %v", errs)
	}
	if errs := ValidateWatermark("abc", path); len(errs) != 1 || errs[0].Field != "status.appliedResourceVersion" {
		t.Errorf("watermark abc: got %v, want one error at status.appliedResourceVersion", errs)
	}
	errs := ValidateSubnetWatermarks([]networking.SubnetWatermark{{Subnet: "a", ResourceVersion: "1"}, {Subnet: "a", ResourceVersion: "2"}, {Subnet: "b", ResourceVersion: "x"}})
	if len(errs) != 2 || errs[0].Type != field.ErrorTypeDuplicate || errs[0].Field != "status.appliedResourceVersions[1].subnet" ||
		errs[1].Field != "status.appliedResourceVersions[2].resourceVersion" {
		t.Errorf("divider watermarks: got %v, want a duplicate subnet at [1] and a bad resourceVersion at [2]", errs)
	}
}

func TestValidateSubnetDepartures(t *testing.T) {
	ok := func(seq int64) networking.EndpointDeparture {
		return networking.EndpointDeparture{Sequence: seq, Endpoint: "default/ep", IP: "10.1.1.5", Droplet: "node-1"}
	}
	if errs := ValidateSubnetDepartures([]networking.EndpointDeparture{ok(7), ok(8)}); len(errs) != 0 {
		t.Errorf("two numbered departures: %v", errs)
	}
	bad := ok(9)
	bad.Endpoint, bad.IP, bad.Droplet = "ep", "fd00::5", ""
	errs := ValidateSubnetDepartures([]networking.EndpointDeparture{ok(0), ok(1), ok(4), bad})
	want := []string{"status.departures[0].sequence", "status.departures[2].sequence", "status.departures[3].sequence",
		"status.departures[3].endpoint", "status.departures[3].ip", "status.departures[3].droplet"}
	var got []string
	for _, e := range errs {
		got = append(got, e.Field)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got errors at %v, want %v (%v)", got, want, errs)
	}
	many := make([]networking.EndpointDeparture, networking.MaxSubnetDepartures+1)
	for i := range many {
		many[i] = ok(int64(i + 1))
	}
	if errs := ValidateSubnetDepartures(many); len(errs) != 1 || errs[0].Type != field.ErrorTypeTooMany {
		t.Errorf("%d departures: got %v, want one TooMany", len(many), errs)
	}
}
