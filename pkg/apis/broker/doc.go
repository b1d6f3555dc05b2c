// +k8s:deepcopy-gen=package
// +groupName=broker.mizar.dev

// Package broker is the internal (hub) version of the broker.mizar.dev API: the
// catalog of services (ServiceClass), orders for them (ServiceInstance) and the
// credentials handed out for an instance (ServiceBinding).
package broker
