package apiserver

import (
	"context"
	"fmt"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/registry/rest"

	"mizar.dev/pkg/admission/dropletrestriction"
	"mizar.dev/pkg/apis/networking"
)

// sliceAuthorizer keeps node agents' lists and watches of endpoints to their
// slice: the endpoints on their droplet (spec.droplet=<droplet>) and those of
// a subnet they serve (spec.subnet=<subnet>, for a bouncer of that subnet or a
// divider of its VPC placed on the droplet): exactly the selectors the agent
// reads with, each served from the watch cache's index. Any other list or
// watch of endpoints by a droplet identity is denied, before the request
// reaches storage: a watch without a selector replays the whole collection,
// and a few hundred of them took gigabytes of the server's memory. It comes
// before every other authorizer; it allows nothing itself.
type sliceAuthorizer struct {
	ids dropletrestriction.Identities
	// storage reads bouncers, dividers and subnets; set once the API groups'
	// storage exists (before any request is served).
	storage atomic.Pointer[sliceStorage]
}

type sliceStorage struct {
	bouncers, dividers rest.Lister
	subnets            rest.Getter
}

// useStorage hands the authorizer the networking group's storage.
func (s *sliceAuthorizer) useStorage(byResource map[string]rest.Storage) error {
	b, okB := byResource["bouncers"].(rest.Lister)
	d, okD := byResource["dividers"].(rest.Lister)
	sn, okS := byResource["subnets"].(rest.Getter)
	if !okB || !okD || !okS {
		return fmt.Errorf("endpoint slice authorizer: the networking storage has no bouncers, dividers or subnets to read")
	}
	s.storage.Store(&sliceStorage{bouncers: b, dividers: d, subnets: sn})
	return nil
}

func (s *sliceAuthorizer) Authorize(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if !a.IsResourceRequest() || a.GetAPIGroup() != networking.GroupName || a.GetResource() != "endpoints" || a.GetSubresource() != "" ||
		(a.GetVerb() != "list" && a.GetVerb() != "watch") {
		return authorizer.DecisionNoOpinion, "", nil
	}
	droplet, ok := s.ids.Of(a.GetUser())
	if !ok {
		return authorizer.DecisionNoOpinion, "", nil
	}
	rule := fmt.Sprintf("node agents may list and watch endpoints only with the field selector spec.droplet=%s "+
		"or spec.subnet=<a subnet with a bouncer or divider on droplet %s>", droplet, droplet)
	if droplet == "" {
		return authorizer.DecisionDeny, "node agents may list and watch endpoints only as a droplet, and this token names no node (" +
			dropletrestriction.NodeNameExtra + ")", nil
	}
	reqs, err := a.GetFieldSelector()
	if err != nil {
		return authorizer.DecisionDeny, fmt.Sprintf("%s; the field selector does not parse: %v", rule, err), nil
	}
	var subnets []string
	for _, r := range reqs {
		if r.Operator != selection.Equals && r.Operator != selection.DoubleEquals {
			continue
		}
		switch r.Field {
		case "spec.droplet":
			if r.Value == droplet {
				return authorizer.DecisionNoOpinion, "", nil
			}
		case "spec.subnet":
			subnets = append(subnets, r.Value)
		}
	}
	for _, subnet := range subnets {
		serves, err := s.serves(ctx, droplet, subnet)
		if err != nil {
			return authorizer.DecisionDeny, "", fmt.Errorf("checking whether droplet %s serves subnet %s: %w", droplet, subnet, err)
		}
		if serves {
			return authorizer.DecisionNoOpinion, "", nil
		}
	}
	if len(subnets) > 0 {
		return authorizer.DecisionDeny, fmt.Sprintf("%s; no bouncer or divider on %s serves subnet %s", rule, droplet, subnets[0]), nil
	}
	return authorizer.DecisionDeny, rule, nil
}

// serves reports whether a bouncer of subnet, or a divider of its VPC, is
// placed on droplet. It reads the watch cache first, then, when that says no
// (an agent starts a subnet's stream the moment it sees its bouncer, and this
// cache may not have that bouncer yet), etcd.
func (s *sliceAuthorizer) serves(ctx context.Context, droplet, subnet string) (bool, error) {
	st := s.storage.Load()
	if st == nil {
		return false, fmt.Errorf("the storage is not ready")
	}
	for _, rv := range []string{"0", ""} {
		ok, err := st.serves(ctx, droplet, subnet, rv)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

func (st *sliceStorage) serves(ctx context.Context, droplet, subnet, rv string) (bool, error) {
	onDroplet := &metainternalversion.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.droplet", droplet), ResourceVersion: rv}
	obj, err := st.bouncers.List(ctx, onDroplet)
	if err != nil {
		return false, err
	}
	bouncers, ok := obj.(*networking.BouncerList)
	if !ok {
		return false, fmt.Errorf("listing bouncers gave %T", obj)
	}
	for _, b := range bouncers.Items {
		if b.Spec.Subnet == subnet {
			return true, nil
		}
	}
	if obj, err = st.dividers.List(ctx, onDroplet); err != nil {
		return false, err
	}
	dividers, ok := obj.(*networking.DividerList)
	if !ok {
		return false, fmt.Errorf("listing dividers gave %T", obj)
	}
	if len(dividers.Items) == 0 {
		return false, nil
	}
	obj, err = st.subnets.Get(ctx, subnet, &metav1.GetOptions{ResourceVersion: rv})
	if apierrors.IsNotFound(err) {
		// A subnet that does not exist is served by nobody.
		return false, nil
	}
	if err != nil {
		return false, err
	}
	sn, ok := obj.(*networking.Subnet)
	if !ok {
		return false, fmt.Errorf("reading subnet %s gave %T", subnet, obj)
	}
	for _, d := range dividers.Items {
		if d.Spec.VPC == sn.Spec.VPC {
			return true, nil
		}
	}
	return false, nil
}
