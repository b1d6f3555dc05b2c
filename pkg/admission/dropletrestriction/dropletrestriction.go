// Package dropletrestriction limits what a node agent may write, as kube's
// NodeRestriction limits kubelets: an agent authenticates as its droplet (user
// mizar:droplet:<name> in group mizar:droplets) and may change only its own
// Droplet, the status of the dividers and bouncers placed on it, and the
// endpoints on its droplet. Anything else is refused with 403 before storage.
package dropletrestriction

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"

	"mizar.dev/pkg/apis/networking"
)

const (
	// Group is the group every droplet identity is in.
	Group = "mizar:droplets"
	// UserPrefix starts every droplet's user name; the droplet's name follows.
	UserPrefix = "mizar:droplet:"
)

// DropletOf returns the droplet a user authenticates as, if it is one.
func DropletOf(u user.Info) (string, bool) {
	if u == nil || !slices.Contains(u.GetGroups(), Group) || !strings.HasPrefix(u.GetName(), UserPrefix) {
		return "", false
	}
	name := strings.TrimPrefix(u.GetName(), UserPrefix)
	return name, name != ""
}

// Plugin is the admission check.
type Plugin struct{ *admission.Handler }

var _ admission.ValidationInterface = &Plugin{}

// New returns the plugin.
func New() *Plugin {
	return &Plugin{Handler: admission.NewHandler(admission.Create, admission.Update, admission.Delete)}
}

// Validate refuses a droplet identity's writes outside its own droplet.
func (p *Plugin) Validate(_ context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	if a.GetResource().Group != networking.GroupName {
		return nil
	}
	me, ok := DropletOf(a.GetUserInfo())
	if !ok {
		return nil
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
