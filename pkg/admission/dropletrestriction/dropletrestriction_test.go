package dropletrestriction

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"

	"mizar.dev/pkg/apis/networking"
)

func TestDropletOf(t *testing.T) {
	for _, c := range []struct {
		u    user.Info
		want string
		ok   bool
	}{
		{&user.DefaultInfo{Name: "mizar:droplet:node-1", Groups: []string{Group}}, "node-1", true},
		{&user.DefaultInfo{Name: "mizar:droplet:node-1"}, "", false},                    // not in the group
		{&user.DefaultInfo{Name: "admin", Groups: []string{Group}}, "", false},          // not a droplet user
		{&user.DefaultInfo{Name: "mizar:droplet:", Groups: []string{Group}}, "", false}, // no name
		{nil, "", false},
	} {
		got, ok := DropletOf(c.u)
		if got != c.want || ok != c.ok {
			t.Errorf("DropletOf(%v) = %q, %v; want %q, %v", c.u, got, ok, c.want, c.ok)
		}
	}
}

const agentSA = "system:serviceaccount:mizar-system:mizar-agent"

func saUser(name string, nodes ...string) user.Info {
	u := &user.DefaultInfo{Name: name, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:mizar-system", user.AllAuthenticated}}
	if nodes != nil {
		u.Extra = map[string][]string{NodeNameExtra: nodes, "authentication.kubernetes.io/pod-name": {"mizar-agent-x"}}
	}
	return u
}

func TestIdentitiesOf(t *testing.T) {
	ids := Identities{AgentServiceAccounts: []string{agentSA}}
	for _, c := range []struct {
		name       string
		u          user.Info
		want       string
		restricted bool
	}{
		{"agent SA bound to node-a", saUser(agentSA, "node-a"), "node-a", true},
		{"agent SA without a node (legacy or unbound token)", saUser(agentSA), "", true},
		{"agent SA with two node names", saUser(agentSA, "node-a", "node-b"), "", true},
		{"another SA bound to a node is no droplet", saUser("system:serviceaccount:default:builder", "node-a"), "", false},
		{"certificate identity", &user.DefaultInfo{Name: "mizar:droplet:d1", Groups: []string{Group}}, "d1", true},
		{"nobody", nil, "", false},
	} {
		got, restricted := ids.Of(c.u)
		if got != c.want || restricted != c.restricted {
			t.Errorf("%s: Of = %q, %v; want %q, %v", c.name, got, restricted, c.want, c.restricted)
		}
	}
	// Without the flag no ServiceAccount is restricted.
	if _, restricted := (Identities{}).Of(saUser(agentSA, "node-a")); restricted {
		t.Error("with no agent ServiceAccount configured, the SA is restricted")
	}
}

func TestParseServiceAccount(t *testing.T) {
	if got, err := ParseServiceAccount("mizar-system/mizar-agent"); err != nil || got != agentSA {
		t.Errorf("ParseServiceAccount = %q, %v", got, err)
	}
	for _, bad := range []string{"", "mizar-agent", "/x", "ns/", "a/b/c"} {
		if _, err := ParseServiceAccount(bad); err == nil {
			t.Errorf("ParseServiceAccount(%q) accepted", bad)
		}
	}
}

// TestValidateAgentServiceAccount runs the plugin on the writes node-a's agent
// token might try: its own objects pass, every other node's object is 403.
func TestValidateAgentServiceAccount(t *testing.T) {
	p := New(agentSA)
	nodeA := saUser(agentSA, "node-a")
	gvr := func(res string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Group: networking.GroupName, Version: "v1alpha1", Resource: res}
	}
	droplet := func(name string) *networking.Droplet {
		return &networking.Droplet{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	ep := func(on string) *networking.Endpoint {
		return &networking.Endpoint{ObjectMeta: metav1.ObjectMeta{Name: "ep", Namespace: "t"}, Spec: networking.EndpointSpec{Droplet: on}}
	}
	bouncer := func(on string) *networking.Bouncer {
		return &networking.Bouncer{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: networking.BouncerSpec{Droplet: on}}
	}
	divider := func(on string) *networking.Divider {
		return &networking.Divider{ObjectMeta: metav1.ObjectMeta{Name: "d"}, Spec: networking.DividerSpec{Droplet: on}}
	}
	for _, c := range []struct {
		name     string
		u        user.Info
		res, sub string
		op       admission.Operation
		objName  string
		obj, old runtime.Object
		allowed  bool
	}{
		{"create own droplet", nodeA, "droplets", "", admission.Create, "node-a", droplet("node-a"), nil, true},
		{"update own droplet status", nodeA, "droplets", "status", admission.Update, "node-a", droplet("node-a"), droplet("node-a"), true},
		{"patch node-b's droplet", nodeA, "droplets", "", admission.Update, "node-b", droplet("node-b"), droplet("node-b"), false},
		{"node-b's droplet status", nodeA, "droplets", "status", admission.Update, "node-b", droplet("node-b"), droplet("node-b"), false},
		{"delete node-b's droplet", nodeA, "droplets", "", admission.Delete, "node-b", nil, droplet("node-b"), false},
		{"endpoint on itself", nodeA, "endpoints", "", admission.Create, "ep", ep("node-a"), nil, true},
		{"endpoint on node-b", nodeA, "endpoints", "", admission.Create, "ep", ep("node-b"), nil, false},
		{"move own endpoint to node-b", nodeA, "endpoints", "", admission.Update, "ep", ep("node-b"), ep("node-a"), false},
		{"endpoint status", nodeA, "endpoints", "status", admission.Update, "ep", ep("node-a"), ep("node-a"), false},
		{"own bouncer status", nodeA, "bouncers", "status", admission.Update, "b", bouncer("node-a"), bouncer("node-a"), true},
		{"node-b's bouncer status", nodeA, "bouncers", "status", admission.Update, "b", bouncer("node-b"), bouncer("node-b"), false},
		{"node-b's divider status", nodeA, "dividers", "status", admission.Update, "d", divider("node-b"), divider("node-b"), false},
		{"own divider status", nodeA, "dividers", "status", admission.Update, "d", divider("node-a"), divider("node-a"), true},
		{"delete a vpc", nodeA, "vpcs", "", admission.Delete, "v", nil, &networking.Vpc{}, false},
		{"create a subnet", nodeA, "subnets", "", admission.Create, "s", &networking.Subnet{}, nil, false},
		{"unbound agent token, own name", saUser(agentSA), "droplets", "", admission.Create, "node-a", droplet("node-a"), nil, false},
		{"other SA on node-a writes node-b's droplet (RBAC decides)", saUser("system:serviceaccount:default:x", "node-a"), "droplets", "", admission.Update, "node-b", droplet("node-b"), droplet("node-b"), true},
	} {
		ns := ""
		if c.res == "endpoints" {
			ns = "t"
		}
		a := admission.NewAttributesRecord(c.obj, c.old, schema.GroupVersionKind{}, ns, c.objName, gvr(c.res), c.sub, c.op, nil, false, c.u)
		err := p.Validate(context.Background(), a, nil)
		if c.allowed && err != nil {
			t.Errorf("%s: refused: %v", c.name, err)
		}
		if !c.allowed {
			if !apierrors.IsForbidden(err) {
				t.Errorf("%s: want 403, got %v", c.name, err)
			} else if !strings.Contains(err.Error(), "node-a") && !strings.Contains(err.Error(), "names no node") {
				t.Errorf("%s: the refusal does not say who: %v", c.name, err)
			}
		}
	}
}
