package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
)

func init() {
	localSchemeBuilder.Register(addFieldLabelConversions)
}

// SelectableFields lists, per kind, the field selectors this version accepts
// beyond metadata.name (and metadata.namespace for namespaced kinds). Node agents
// and operators watch their slice of the API through them.
var SelectableFields = map[string][]string{
	"Vpc":      {"spec.vni", "status.phase"},
	"Subnet":   {"spec.vpc", "status.phase"},
	"Divider":  {"spec.vpc", "spec.droplet", "status.phase"},
	"Bouncer":  {"spec.subnet", "spec.droplet", "status.phase"},
	"Endpoint": {"spec.subnet", "spec.droplet", "spec.pod", "status.phase"},
	"Droplet":  {"spec.node", "status.phase"},
}

func addFieldLabelConversions(scheme *runtime.Scheme) error {
	for kind, fields := range SelectableFields {
		known := sets.New(fields...).Insert("metadata.name", "metadata.namespace")
		err := scheme.AddFieldLabelConversionFunc(SchemeGroupVersion.WithKind(kind), func(label, value string) (string, string, error) {
			if !known.Has(label) {
				return "", "", fmt.Errorf("field label not supported: %s (supported: %v)", label, sets.List(known))
			}
			return label, value, nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
