package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"

	"mizar.dev/pkg/apis/networking"
)

func init() {
	localSchemeBuilder.Register(addKindMismatchConversions)
}

// addKindMismatchConversions registers a conversion between every two different
// kinds that only fails, saying what is wrong: a body of one kind sent to another
// kind's resource otherwise fails with the scheme's "unknown conversion".
func addKindMismatchConversions(scheme *runtime.Scheme) error {
	kinds := []struct {
		name     string
		external any
		internal any
	}{
		{"Vpc", (*Vpc)(nil), (*networking.Vpc)(nil)},
		{"Subnet", (*Subnet)(nil), (*networking.Subnet)(nil)},
		{"Divider", (*Divider)(nil), (*networking.Divider)(nil)},
		{"Bouncer", (*Bouncer)(nil), (*networking.Bouncer)(nil)},
		{"Endpoint", (*Endpoint)(nil), (*networking.Endpoint)(nil)},
		{"Droplet", (*Droplet)(nil), (*networking.Droplet)(nil)},
	}
	for _, from := range kinds {
		for _, to := range kinds {
			if from.name == to.name {
				continue
			}
			msg := fmt.Sprintf("the body is a %s but this resource holds %ss: send it to the %s resource, or set kind: %s",
				from.name, to.name, from.name, to.name)
			err := scheme.AddConversionFunc(from.external, to.internal, func(any, any, conversion.Scope) error {
				return fmt.Errorf("%s", msg)
			})
			if err != nil {
				return fmt.Errorf("registering the %s to %s kind-mismatch error: %w", from.name, to.name, err)
			}
		}
	}
	return nil
}
