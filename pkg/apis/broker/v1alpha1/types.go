package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Phase is where an order (or a binding) is in its lifecycle.
// +enum
type Phase string

const (
	// PhasePending: stored, the fulfillment operator has not started it yet.
	PhasePending Phase = "Pending"
	// PhaseProvisioning: the saga is running; status.steps shows how far it is.
	PhaseProvisioning Phase = "Provisioning"
	// PhaseProvisioned: every workload replica is ready (or the binding's Secret exists).
	PhaseProvisioned Phase = "Provisioned"
	// PhaseDeprovisioning: deletion requested; what the saga made is being removed.
	PhaseDeprovisioning Phase = "Deprovisioning"
	// PhaseFailed: a permanent error or the deadline stopped the order and its
	// compensation ran; conditions say which step failed and why.
	PhaseFailed Phase = "Failed"
)

// StepState is where one saga step is.
// +enum
type StepState string

const (
	// StepPending: not started.
	StepPending StepState = "Pending"
	// StepRunning: started, possibly retrying after transient errors.
	StepRunning StepState = "Running"
	// StepDone: completed; a resumed saga skips it.
	StepDone StepState = "Done"
	// StepFailed: failed permanently (or hit the deadline).
	StepFailed StepState = "Failed"
	// StepCompensating: being undone, possibly retrying after errors.
	StepCompensating StepState = "Compensating"
	// StepCompensated: undone by compensation or deprovisioning.
	StepCompensated StepState = "Compensated"
)

// +genclient
// +genclient:nonNamespaced
// +genclient:noStatus
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// ServiceClass is one service of the broker's catalog (e.g. mysql) and the
// plans it is offered in. The Open Service Broker catalog is built from them.
type ServiceClass struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	// +optional
	Spec ServiceClassSpec `json:"spec,omitempty" protobuf:"bytes,2,opt,name=spec"`
	// +optional
	Status ServiceClassStatus `json:"status,omitempty" protobuf:"bytes,3,opt,name=status"`
}

// ServiceClassStatus is the observed state of a service class.
type ServiceClassStatus struct {
	// conditions: Ready is True once the class is stored, that is validated with its
	// plans' parameter schemas; the server sets it (a class has no /status).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchMergeKey=type
	// +patchStrategy=merge
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type" protobuf:"bytes,1,rep,name=conditions"`
}

// ServiceClassSpec describes a service and its plans.
type ServiceClassSpec struct {
	// id is the service's Open Service Broker id: globally unique and stable forever.
	ID string `json:"id" protobuf:"bytes,1,opt,name=id"`
	// description is a short text for people choosing a service.
	Description string `json:"description" protobuf:"bytes,2,opt,name=description"`
	// bindable says whether ServiceBindings (credentials) may be made for instances.
	// +optional
	Bindable bool `json:"bindable,omitempty" protobuf:"varint,3,opt,name=bindable"`
	// image is the container image the workload runs, e.g. mysql:8.4.
	Image string `json:"image" protobuf:"bytes,4,opt,name=image"`
	// plans are the sizes the service is offered in; at least one.
	// +listType=map
	// +listMapKey=name
	Plans []ServicePlan `json:"plans" protobuf:"bytes,5,rep,name=plans"`
}

// ServicePlan is one size of a service.
type ServicePlan struct {
	// id is the plan's Open Service Broker id: globally unique and stable forever.
	ID string `json:"id" protobuf:"bytes,1,opt,name=id"`
	// name is unique within the class; ServiceInstances name their plan with it.
	Name string `json:"name" protobuf:"bytes,2,opt,name=name"`
	// description is a short text for people choosing a plan.
	Description string `json:"description" protobuf:"bytes,3,opt,name=description"`
	// replicas is how many workload pods an instance runs (1 to 9). Defaults to 1.
	// +optional
	Replicas int32 `json:"replicas,omitempty" protobuf:"varint,4,opt,name=replicas"`
	// storage is the size of each replica's persistent volume claim.
	Storage resource.Quantity `json:"storage" protobuf:"bytes,5,opt,name=storage"`
	// cpu is each replica's CPU request and limit.
	CPU resource.Quantity `json:"cpu" protobuf:"bytes,6,opt,name=cpu"`
	// memory is each replica's memory request and limit.
	Memory resource.Quantity `json:"memory" protobuf:"bytes,7,opt,name=memory"`
	// maxProvisioningDuration bounds how long an order of this plan may take
	// before it fails and is compensated. Defaults to 30m.
	// +optional
	MaxProvisioningDuration *metav1.Duration `json:"maxProvisioningDuration,omitempty" protobuf:"bytes,8,opt,name=maxProvisioningDuration"`
	// parametersSchema is the JSON schema (draft 4 subset, as in OpenAPI v3) that an
	// instance's spec.parameters must satisfy. Without one, an instance may not set parameters.
	// +optional
	ParametersSchema *runtime.RawExtension `json:"parametersSchema,omitempty" protobuf:"bytes,9,opt,name=parametersSchema"`
	// bindingParametersSchema is the JSON schema that a ServiceBinding's
	// spec.parameters must satisfy. Without one, a binding may not set parameters.
	// +optional
	BindingParametersSchema *runtime.RawExtension `json:"bindingParametersSchema,omitempty" protobuf:"bytes,10,opt,name=bindingParametersSchema"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// ServiceClassList is a list of service classes.
type ServiceClassList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	Items []ServiceClass `json:"items" protobuf:"bytes,2,rep,name=items"`
}

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// ServiceInstance is an order for a service of the catalog. The fulfillment
// operator runs it as a saga whose progress is in status.steps; it is
// Provisioned once every replica of its workload is ready.
type ServiceInstance struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	// +optional
	Spec ServiceInstanceSpec `json:"spec,omitempty" protobuf:"bytes,2,opt,name=spec"`
	// +optional
	Status ServiceInstanceStatus `json:"status,omitempty" protobuf:"bytes,3,opt,name=status"`
}

// ServiceInstanceSpec is the order.
type ServiceInstanceSpec struct {
	// class is the name of the ServiceClass ordered. Immutable.
	Class string `json:"class" protobuf:"bytes,1,opt,name=class"`
	// plan is the name of one of the class's plans.
	Plan string `json:"plan" protobuf:"bytes,2,opt,name=plan"`
	// parameters are checked against the plan's parametersSchema.
	// +optional
	Parameters *runtime.RawExtension `json:"parameters,omitempty" protobuf:"bytes,3,opt,name=parameters"`
	// subnet, when set, is the networking.mizar.dev Subnet the workload's pods are
	// launched into; provisioning waits until it is Provisioned. Immutable.
	// +optional
	Subnet string `json:"subnet,omitempty" protobuf:"bytes,4,opt,name=subnet"`
	// deadline bounds provisioning, counted from the order's creation; past it the
	// order fails and what was made is removed. Defaults to the plan's maxProvisioningDuration.
	// +optional
	Deadline *metav1.Duration `json:"deadline,omitempty" protobuf:"bytes,5,opt,name=deadline"`
}

// ServiceInstanceStatus is how far the order is.
type ServiceInstanceStatus struct {
	// phase is Pending, Provisioning, Provisioned, Deprovisioning or Failed.
	// +optional
	Phase Phase `json:"phase,omitempty" protobuf:"bytes,1,opt,name=phase,casttype=Phase"`
	// observedGeneration is the metadata.generation the saga last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty" protobuf:"varint,2,opt,name=observedGeneration"`
	// conditions are the latest observations of the order.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchMergeKey=type
	// +patchStrategy=merge
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type" protobuf:"bytes,3,rep,name=conditions"`
	// operation is the id of the current asynchronous operation, as handed to
	// Open Service Broker clients.
	// +optional
	Operation string `json:"operation,omitempty" protobuf:"bytes,4,opt,name=operation"`
	// steps are the saga's steps in order, with their progress.
	// +optional
	// +listType=map
	// +listMapKey=name
	Steps []Step `json:"steps,omitempty" protobuf:"bytes,5,rep,name=steps"`
	// connectionSecret names the Secret (in the instance's namespace of the
	// workload cluster) holding the generated credentials.
	// +optional
	ConnectionSecret string `json:"connectionSecret,omitempty" protobuf:"bytes,6,opt,name=connectionSecret"`
	// workloadName names the order's StatefulSet and headless Service in the
	// workload cluster (its Secret is <workloadName>-credentials). The
	// fulfillment operator picks it once, before making anything, from the
	// class and the order's uid, so any order name yields valid names; it never
	// changes afterwards.
	// +optional
	WorkloadName string `json:"workloadName,omitempty" protobuf:"bytes,7,opt,name=workloadName"`
}

// Step is one named step of an order's saga.
type Step struct {
	// name identifies the step, e.g. CreatingStatefulSet.
	Name string `json:"name" protobuf:"bytes,1,opt,name=name"`
	// state is Pending, Running, Done, Failed, Compensating or Compensated.
	State StepState `json:"state" protobuf:"bytes,2,opt,name=state,casttype=StepState"`
	// attempts counts the runs of the step that ended in an error; while the step is
	// Compensating it counts failed undo attempts instead (they drive the backoff).
	// +optional
	Attempts int32 `json:"attempts,omitempty" protobuf:"varint,3,opt,name=attempts"`
	// message is the step's latest progress or error, for people.
	// +optional
	Message string `json:"message,omitempty" protobuf:"bytes,4,opt,name=message"`
	// startedAt is when the step first ran.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty" protobuf:"bytes,5,opt,name=startedAt"`
	// finishedAt is when the step reached Done, Failed or Compensated.
	// +optional
	FinishedAt *metav1.Time `json:"finishedAt,omitempty" protobuf:"bytes,6,opt,name=finishedAt"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// ServiceInstanceList is a list of service instances.
type ServiceInstanceList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	Items []ServiceInstance `json:"items" protobuf:"bytes,2,rep,name=items"`
}

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// ServiceBinding asks for credentials of a ServiceInstance; they are delivered
// as a Secret holding host, port, user and password.
type ServiceBinding struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	// +optional
	Spec ServiceBindingSpec `json:"spec,omitempty" protobuf:"bytes,2,opt,name=spec"`
	// +optional
	Status ServiceBindingStatus `json:"status,omitempty" protobuf:"bytes,3,opt,name=status"`
}

// ServiceBindingSpec names the instance to bind.
type ServiceBindingSpec struct {
	// instance is the name of a ServiceInstance in the binding's namespace. Immutable.
	Instance string `json:"instance" protobuf:"bytes,1,opt,name=instance"`
	// parameters are checked against the instance's plan's bindingParametersSchema.
	// Immutable.
	// +optional
	Parameters *runtime.RawExtension `json:"parameters,omitempty" protobuf:"bytes,2,opt,name=parameters"`
}

// ServiceBindingStatus says where the credentials are.
type ServiceBindingStatus struct {
	// phase is Pending, Provisioned (the Secret exists), Deprovisioning or Failed.
	// +optional
	Phase Phase `json:"phase,omitempty" protobuf:"bytes,1,opt,name=phase,casttype=Phase"`
	// observedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty" protobuf:"varint,2,opt,name=observedGeneration"`
	// conditions are the latest observations of the binding.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchMergeKey=type
	// +patchStrategy=merge
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type" protobuf:"bytes,3,rep,name=conditions"`
	// secretName names the Secret with keys host, port, username and password.
	// +optional
	SecretName string `json:"secretName,omitempty" protobuf:"bytes,4,opt,name=secretName"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// ServiceBindingList is a list of service bindings.
type ServiceBindingList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`

	Items []ServiceBinding `json:"items" protobuf:"bytes,2,rep,name=items"`
}
