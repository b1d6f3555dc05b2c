// Package dropletrestriction limits what a node agent may write, as kube's
// NodeRestriction limits kubelets: an agent authenticates as its droplet and
// may change only its own Droplet, the status of the dividers and bouncers
// placed on it, and the endpoints on its droplet. Anything else is refused
// with 403 before storage.
//
// Two identities are droplets:
//   - user mizar:droplet:<name> in group mizar:droplets (client certificates,
//     e.g. from mizar-apiserver droplet-kubeconfig);
//   - the node agents' ServiceAccount, when named to the plugin: its bound
//     tokens carry the node of the pod they were issued to
//     (authentication.kubernetes.io/node-name in the user's extra, forwarded
//     by kube-apiserver's aggregator as a request header), and the droplet is
//     that node's. A token of that ServiceAccount without a node name (one not
//     bound to a pod) may write nothing.
package dropletrestriction

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"

	"mizar.dev/pkg/apis/networking"
)

const (
	// Group is the group every droplet identity is in.
	Group = "mizar:droplets"
	// UserPrefix starts every droplet's user name; the droplet's name follows.
	UserPrefix = "mizar:droplet:"
	// NodeNameExtra is the user extra in which bound ServiceAccount tokens carry
	// the node of the pod they were issued to (Kubernetes >= 1.30).
	NodeNameExtra = "authentication.kubernetes.io/node-name"
)

// DropletOf returns the droplet a certificate identity authenticates as, if it is one.
func DropletOf(u user.Info) (string, bool) {
	if u == nil || !slices.Contains(u.GetGroups(), Group) || !strings.HasPrefix(u.GetName(), UserPrefix) {
		return "", false
	}
	name := strings.TrimPrefix(u.GetName(), UserPrefix)
	return name, name != ""
}

// Identities says who is a droplet: certificate identities always, and the
// users of AgentServiceAccounts (system:serviceaccount:<ns>:<name>) by the
// node their token is bound to.
type Identities struct {
	AgentServiceAccounts []string
}

// ParseServiceAccount turns "namespace/name" into the ServiceAccount's user name.
func ParseServiceAccount(s string) (string, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", fmt.Errorf("want namespace/name, got %q", s)
	}
	return serviceaccount.MakeUsername(ns, name), nil
}

// Of returns the droplet u writes as. restricted says u is a droplet identity
// at all; a restricted identity with an empty droplet may write nothing.
func (i Identities) Of(u user.Info) (droplet string, restricted bool) {
	if name, ok := DropletOf(u); ok {
		return name, true
	}
	if u == nil || !slices.Contains(i.AgentServiceAccounts, u.GetName()) {
		return "", false
	}
	// One node name exactly: an extra with two values is no identity kube-apiserver issues.
	if nodes := u.GetExtra()[NodeNameExtra]; len(nodes) == 1 {
		return nodes[0], true
	}
	return "", true
}

// Plugin is the admission check.
type Plugin struct {
	*admission.Handler
	ids Identities
}

var _ admission.ValidationInterface = &Plugin{}

// New returns the plugin; agentServiceAccounts are user names
// (system:serviceaccount:<ns>:<name>) whose writes are bound to their token's node.
func New(agentServiceAccounts ...string) *Plugin {
	return &Plugin{Handler: admission.NewHandler(admission.Create, admission.Update, admission.Delete),
		ids: Identities{AgentServiceAccounts: agentServiceAccounts}}
}

// Validate refuses a droplet identity's writes outside its own droplet.
func (p *Plugin) Validate(_ context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	if a.GetResource().Group != networking.GroupName {
		return nil
	}
	me, ok := p.ids.Of(a.GetUserInfo())
	if !ok {
		return nil
	}
	if me == "" {
		return admission.NewForbidden(a, fmt.Errorf("%s is a node agent's ServiceAccount, but its token names no node (%s): only tokens bound to a pod on a node may write",
			a.GetUserInfo().GetName(), NodeNameExtra))
	}
	deny := func(format string, args ...any) error {
		return admission.NewForbidden(a, fmt.Errorf("droplet %s: "+format, append([]any{me}, args...)...))
	}
	res, sub := a.GetResource().Resource, a.GetSubresource()
	switch {
	case res == "droplets" && (sub == "" || sub == "status"):
		if a.GetName() != me {
			return deny("may write only its own droplet, not %s", a.GetName())
		}
		return nil
	case (res == "bouncers" || res == "dividers") && sub == "status" && a.GetOperation() == admission.Update:
		for _, obj := range []any{a.GetOldObject(), a.GetObject()} {
			if on := placedOn(obj); on != me {
				return deny("may write the status only of %s placed on it; %s is placed on %q", res, a.GetName(), on)
			}
		}
		return nil
	case res == "endpoints" && sub == "":
		for _, obj := range []any{a.GetOldObject(), a.GetObject()} {
			if obj == nil {
				continue
			}
			if ep, ok := obj.(*networking.Endpoint); ok && ep.Spec.Droplet != me {
				return deny("may write only endpoints on itself; %s/%s is on %q", a.GetNamespace(), a.GetName(), ep.Spec.Droplet)
			}
		}
		return nil
	}
	return deny("may not %s %s", strings.ToLower(string(a.GetOperation())), resourceName(res, sub))
}

func placedOn(obj any) string {
	switch o := obj.(type) {
	case *networking.Bouncer:
		return o.Spec.Droplet
	case *networking.Divider:
		return o.Spec.Droplet
	}
	return ""
}

func resourceName(res, sub string) string {
	if sub == "" {
		return res
	}
	return res + "/" + sub
}
