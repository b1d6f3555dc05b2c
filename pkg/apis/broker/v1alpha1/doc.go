// +k8s:openapi-gen=true
// +k8s:deepcopy-gen=package
// +k8s:conversion-gen=mizar.dev/pkg/apis/broker
// +k8s:defaulter-gen=TypeMeta
// +groupName=broker.mizar.dev
// +k8s:openapi-model-package=dev.mizar.broker.v1alpha1

// Package v1alpha1 is the v1alpha1 version of broker.mizar.dev.
package v1alpha1
