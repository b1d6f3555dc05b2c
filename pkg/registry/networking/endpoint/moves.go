package endpoint

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/rest"

	"mizar.dev/pkg/apis/networking"
	"mizar.dev/pkg/apis/networking/v1alpha1"
)

// recordMoves writes, in the update that moves an endpoint to another
// droplet, the droplet it left (v1alpha1.EndpointDepartedFromAnnotation). A
// move is thus recorded with the move itself: the Endpoint operator lists it
// in the subnet's departures whenever it runs, even if it was down when the
// endpoint moved (an informer's update event, the only other place the
// former droplet is seen, is lost with a restart).
type recordMoves struct{ rest.RESTUpdateStrategy }

func (s recordMoves) PrepareForUpdate(ctx context.Context, obj, old runtime.Object) {
	s.RESTUpdateStrategy.PrepareForUpdate(ctx, obj, old)
	ep, was := obj.(*networking.Endpoint), old.(*networking.Endpoint)
	from := ""
	if was.Spec.Droplet != "" && ep.Spec.Droplet != was.Spec.Droplet {
		from = was.Spec.Droplet
	}
	ep.Annotations = v1alpha1.RecordDeparture(was.Annotations, ep.Annotations, from)
}
