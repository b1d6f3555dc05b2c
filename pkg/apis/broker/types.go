package broker

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Phase is where an order (or a binding) is in its lifecycle.
type Phase string

const (
	PhasePending        Phase = "Pending"
	PhaseProvisioning   Phase = "Provisioning"
	PhaseProvisioned    Phase = "Provisioned"
	PhaseDeprovisioning Phase = "Deprovisioning"
	PhaseFailed         Phase = "Failed"
)

// StepState is where one saga step is.
type StepState string

const (
	StepPending      StepState = "Pending"
	StepRunning      StepState = "Running"
	StepDone         StepState = "Done"
	StepFailed       StepState = "Failed"
	StepCompensating StepState = "Compensating"
	StepCompensated  StepState = "Compensated"
)

// +genclient
// +genclient:nonNamespaced
// +genclient:noStatus
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// ServiceClass is one service of the catalog and its plans.
type ServiceClass struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Spec   ServiceClassSpec
	Status ServiceClassStatus
}

// ServiceClassStatus holds the Ready condition the server sets on create.
type ServiceClassStatus struct {
	Conditions []metav1.Condition
}

type ServiceClassSpec struct {
	ID          string
	Description string
	Bindable    bool
	Image       string
	Plans       []ServicePlan
}

type ServicePlan struct {
	ID                      string
	Name                    string
	Description             string
	Replicas                int32
	Storage                 resource.Quantity
	CPU                     resource.Quantity
	Memory                  resource.Quantity
	MaxProvisioningDuration *metav1.Duration
	ParametersSchema        *runtime.RawExtension
	BindingParametersSchema *runtime.RawExtension
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

type ServiceClassList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []ServiceClass
}

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// ServiceInstance is an order for a service of the catalog.
type ServiceInstance struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Spec   ServiceInstanceSpec
	Status ServiceInstanceStatus
}

type ServiceInstanceSpec struct {
	Class      string
	Plan       string
	Parameters *runtime.RawExtension
	Subnet     string
	Deadline   *metav1.Duration
}

type ServiceInstanceStatus struct {
	Phase              Phase
	ObservedGeneration int64
	Conditions         []metav1.Condition
	Operation          string
	Steps              []Step
	ConnectionSecret   string
	WorkloadName       string
}

type Step struct {
	Name       string
	State      StepState
	Attempts   int32
	Message    string
	StartedAt  *metav1.Time
	FinishedAt *metav1.Time
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

type ServiceInstanceList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []ServiceInstance
}

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// ServiceBinding asks for credentials of an instance.
type ServiceBinding struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Spec   ServiceBindingSpec
	Status ServiceBindingStatus
}

type ServiceBindingSpec struct {
	Instance   string
	Parameters *runtime.RawExtension
}

type ServiceBindingStatus struct {
	Phase              Phase
	ObservedGeneration int64
	Conditions         []metav1.Condition
	SecretName         string
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

type ServiceBindingList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []ServiceBinding
}
