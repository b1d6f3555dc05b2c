package apiserver

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	brokerinstall "mizar.dev/pkg/apis/broker/install"
	brokerv1alpha1 "mizar.dev/pkg/apis/broker/v1alpha1"
	networkinginstall "mizar.dev/pkg/apis/networking/install"
	networkingv1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
)

var (
	// Scheme knows every type mizar-apiserver serves.
	Scheme = runtime.NewScheme()
	// Codecs serialize them.
	Codecs = serializer.NewCodecFactory(Scheme)
	// StorageVersions are the versions objects are written to etcd in.
	StorageVersions = schema.GroupVersions{networkingv1alpha1.SchemeGroupVersion, brokerv1alpha1.SchemeGroupVersion}
)

func init() {
	networkinginstall.Install(Scheme)
	brokerinstall.Install(Scheme)
	// Options types (ListOptions, ...) and the unversioned meta types every
	// generic server answers with.
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	Scheme.AddUnversionedTypes(schema.GroupVersion{Group: "", Version: "v1"},
		&metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{},
	)
}
