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
// beyond metadata.name (and metadata.namespace for namespaced kinds). The
// fulfillment operator and the Open Service Broker facade find orders through them.
var SelectableFields = map[string][]string{
	"ServiceClass":    {"spec.id"},
	"ServiceInstance": {"spec.class", "spec.subnet", "status.phase"},
	"ServiceBinding":  {"spec.instance", "status.phase"},
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
