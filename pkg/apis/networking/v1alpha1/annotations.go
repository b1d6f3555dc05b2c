package v1alpha1

// Annotations on a workload cluster's Pods that place the pod's Endpoint,
// overriding the conflist's "vpc" and "subnet". A subnet alone implies its
// VPC; a VPC alone must be the conflist subnet's. Declared here, once, for
// the node agent that reads them and for the broker that writes them on the
// StatefulSets it makes.
const (
	PodAnnotationVPC    = "mizar.dev/vpc"
	PodAnnotationSubnet = "mizar.dev/subnet"
)
