// Package osb is the broker's Open Service Broker API v2 facade, built on
// code.cloudfoundry.org/brokerapi. It keeps no state of its own: a provision is
// a ServiceInstance, a bind a ServiceBinding, and last_operation reads the
// order's status, so kubectl and an OSB platform see one truth.
package osb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"code.cloudfoundry.org/brokerapi/v13"
	"code.cloudfoundry.org/brokerapi/v13/domain"
	"code.cloudfoundry.org/brokerapi/v13/domain/apiresponses"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	brokerv1 "mizar.dev/pkg/apis/broker/v1alpha1"
	"mizar.dev/pkg/broker/fulfillment"
	"mizar.dev/pkg/generated/clientset/versioned"
	brokerinformers "mizar.dev/pkg/generated/informers/externalversions/broker/v1alpha1"
	brokerlisters "mizar.dev/pkg/generated/listers/broker/v1alpha1"
)

const (
	// MinMinorVersion and MaxMinorVersion bound the X-Broker-API-Version 2.x accepted.
	MinMinorVersion = 13
	MaxMinorVersion = 17
	// RetryAfter is what last_operation suggests between polls.
	RetryAfter = 5 * time.Second
	// LabelOSB marks the orders and bindings placed through this facade.
	LabelOSB = "broker.mizar.dev/osb"
)

// Broker serves the Open Service Broker API from mizar's objects.
type Broker struct {
	mizar    versioned.Interface
	workload kubernetes.Interface
	// namespace holds every order placed through the facade: OSB ids carry no namespace.
	namespace string
	// classes is the catalog, watched: every provision reads it twice.
	classes  brokerlisters.ServiceClassLister
	informer cache.SharedIndexInformer
	// catalog converts each class once per resourceVersion: parsing every
	// plan's schema again was most of a provision's CPU in this facade.
	catalogMu sync.Mutex
	catalog   map[types.UID]catalogEntry
}

var _ domain.ServiceBroker = &Broker{}

// New returns the broker. Orders go to namespace, credentials are read from
// the workload cluster. Start must run before it serves.
func New(mizar versioned.Interface, workload kubernetes.Interface, namespace string) *Broker {
	inf := brokerinformers.NewServiceClassInformer(mizar, 0, cache.Indexers{})
	return &Broker{mizar: mizar, workload: workload, namespace: namespace,
		classes: brokerlisters.NewServiceClassLister(inf.GetIndexer()), informer: inf}
}

// Start watches the catalog until ctx ends and returns once it is loaded.
func (b *Broker) Start(ctx context.Context) error {
	go b.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), b.informer.HasSynced) {
		return fmt.Errorf("OSB API: the catalog never loaded: %w", ctx.Err())
	}
	return nil
}

// Handler is the HTTP API: Basic auth, then the version check, then the
// routes; every request is counted (instrument). A nil logger is KlogLogger.
func (b *Broker) Handler(creds Credentials, logger *slog.Logger) http.Handler {
	if logger == nil {
		logger = KlogLogger()
	}
	// Parameters stay out of the log, whoever logs (see redactingHandler).
	logger = slog.New(redactingHandler{logger.Handler()})
	h := brokerapi.NewWithOptions(b, logger,
		brokerapi.WithCustomAuth(creds.middleware),
		brokerapi.WithCustomAuth(checkVersion),
		// After authentication: an anonymous client gets 401 before its body is read.
		brokerapi.WithCustomAuth(checkBody),
		brokerapi.WithAdditionalMiddleware(retryAfter),
	)
	// Outermost: every answer echoes the platform's request id, refusals too.
	h = echoRequestIdentity(h)
	return instrument(h)
}

// checkVersion answers 412 to a request without a 2.13..2.17 version header.
// The library accepts any 2.x; the spec's rules here are 2.13's onwards.
func checkVersion(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Get("X-Broker-API-Version")
		var major, minor int
		if n, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil || n != 2 || major != 2 || minor < MinMinorVersion || minor > MaxMinorVersion {
			writeError(w, http.StatusPreconditionFailed, ErrKeyVersion, fmt.Sprintf("X-Broker-API-Version %q is not supported; this broker speaks 2.%d to 2.%d", v, MinMinorVersion, MaxMinorVersion))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// echoRequestIdentity sends X-Broker-API-Request-Identity back on every
// answer, as the spec asks (SHOULD); the library echoes it only on a 412.
func echoRequestIdentity(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get("X-Broker-API-Request-Identity"); id != "" {
			w.Header().Set("X-Broker-API-Request-Identity", id)
		}
		next.ServeHTTP(w, r)
	})
}

// checkMaintenanceInfo refuses a request that names a maintenance_info: no
// plan of this catalog has one, so none can match (422
// MaintenanceInfoConflict, the spec's answer to a version that does not
// match the catalog's). The library does not check it.
func checkMaintenanceInfo(m *domain.MaintenanceInfo) error {
	if m == nil || m.Equals(domain.MaintenanceInfo{}) {
		return nil
	}
	return apiresponses.ErrMaintenanceInfoNilConflict
}

// retryAfter suggests a polling interval on last_operation answers.
func retryAfter(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/last_operation") {
			w.Header().Set("Retry-After", fmt.Sprint(int(RetryAfter.Seconds())))
		}
		next.ServeHTTP(w, r)
	})
}

func writeError(w http.ResponseWriter, code int, key, description string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": key, "description": description})
}

func failure(err error, code int, key string) error {
	return apiresponses.NewFailureResponseBuilder(err, code, key).WithErrorKey(key).Build()
}

// conflict is a 409 that says what conflicts: the spec expects "{}" and
// allows a description, which the library's own 409s leave out.
func conflict(format string, args ...any) error {
	return apiresponses.NewFailureResponseBuilder(fmt.Errorf(format, args...), http.StatusConflict, "conflict").Build()
}

var (
	errNotFound  = failure(errors.New("no such service instance"), http.StatusNotFound, "NotFound")
	errBadParams = func(err error) error { return failure(err, http.StatusBadRequest, "ValidationFailed") }
)

// Services is the catalog, read from the ServiceClasses. Every provision
// reads it too (the library checks the service and plan ids against it).
func (b *Broker) Services(ctx context.Context) ([]domain.Service, error) {
	classes, err := b.classes.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("listing service classes: %w", err)
	}
	sort.Slice(classes, func(i, j int) bool { return classes[i].Name < classes[j].Name })
	out := make([]domain.Service, 0, len(classes))
	b.catalogMu.Lock()
	defer b.catalogMu.Unlock()
	if b.catalog == nil {
		b.catalog = map[types.UID]catalogEntry{}
	}
	for _, c := range classes {
		e, ok := b.catalog[c.UID]
		if !ok || e.resourceVersion != c.ResourceVersion {
			e = catalogEntry{resourceVersion: c.ResourceVersion, service: service(c)}
			b.catalog[c.UID] = e
		}
		out = append(out, e.service)
	}
	if len(b.catalog) > len(classes) {
		// A class went: forget what is not listed any more.
		live := make(map[types.UID]bool, len(classes))
		for _, c := range classes {
			live[c.UID] = true
		}
		for uid := range b.catalog {
			if !live[uid] {
				delete(b.catalog, uid)
			}
		}
	}
	return out, nil
}

// catalogEntry is a class as the OSB catalog shows it, for the class's
// resourceVersion it was made from. Callers only read it (the library encodes
// it, or looks ids up in it), so answers share it.
type catalogEntry struct {
	resourceVersion string
	service         domain.Service
}

// service is a class as an OSB catalog entry.
//
// plan_updateable is false for the service and true only on a plan that has
// another plan to change to: one with the same storage (a StatefulSet's
// claims cannot be resized, so the registry refuses any other change).
// Schemas are complete or absent: the library would write "parameters":
// null for any schema left out, which is not a schema.
func service(c *brokerv1.ServiceClass) domain.Service {
	s := domain.Service{
		ID: c.Spec.ID, Name: c.Name, Description: c.Spec.Description, Bindable: c.Spec.Bindable,
		PlanUpdatable: false, Tags: []string{c.Name},
	}
	for _, p := range c.Spec.Plans {
		plan := domain.ServicePlan{ID: p.ID, Name: p.Name, Description: p.Description, Free: domain.FreeValue(true)}
		if p.MaxProvisioningDuration != nil {
			secs := int(p.MaxProvisioningDuration.Seconds())
			plan.MaximumPollingDuration = &secs
		}
		if changeable(c, p.Name) {
			plan.PlanUpdatable = domain.PlanUpdatableValue(true)
		}
		if p.ParametersSchema != nil || p.BindingParametersSchema != nil {
			instance := catalogSchema(p.ParametersSchema)
			plan.Schemas = &domain.ServiceSchemas{
				// An update's parameters are checked against the same schema as a provision's.
				Instance: domain.ServiceInstanceSchema{Create: domain.Schema{Parameters: instance}, Update: domain.Schema{Parameters: instance}},
				Binding:  domain.ServiceBindingSchema{Create: domain.Schema{Parameters: catalogSchema(p.BindingParametersSchema)}},
			}
		}
		s.Plans = append(s.Plans, plan)
	}
	return s
}

// changeable reports whether an instance of the plan may move to another plan.
func changeable(c *brokerv1.ServiceClass, plan string) bool {
	var from *brokerv1.ServicePlan
	for i := range c.Spec.Plans {
		if c.Spec.Plans[i].Name == plan {
			from = &c.Spec.Plans[i]
		}
	}
	for _, p := range c.Spec.Plans {
		if from != nil && p.Name != plan && p.Storage.Cmp(from.Storage) == 0 {
			return true
		}
	}
	return false
}

// noParameters is the schema of what takes no parameters: an empty object.
const noParameters = `{"type":"object","additionalProperties":false}`

// catalogSchema is a stored schema as the catalog shows it, with the "$schema"
// the spec requires (draft 4: what the validator implements).
func catalogSchema(raw *runtime.RawExtension) map[string]any {
	data := []byte(noParameters)
	if raw != nil {
		data = raw.Raw
	}
	var schema map[string]any
	if err := json.Unmarshal(data, &schema); err != nil || schema == nil {
		// Stored schemas were parsed when the class was validated.
		_ = json.Unmarshal([]byte(noParameters), &schema)
	}
	if _, ok := schema["$schema"]; !ok {
		schema["$schema"] = "http://json-schema.org/draft-04/schema#"
	}
	return schema
}

// classFor finds the class and plan names of OSB service and plan ids.
func (b *Broker) classFor(ctx context.Context, serviceID, planID string) (string, string, error) {
	classes, err := b.classes.List(labels.Everything())
	if err != nil {
		return "", "", fmt.Errorf("looking up service %s: %w", serviceID, err)
	}
	for _, c := range classes {
		if c.Spec.ID != serviceID {
			continue
		}
		for _, p := range c.Spec.Plans {
			if p.ID == planID {
				return c.Name, p.Name, nil
			}
		}
	}
	return "", "", errBadParams(fmt.Errorf("service %s has no plan %s", serviceID, planID))
}

// checkID refuses what the spec refuses, an empty id, and ids over MaxIDBytes.
// Any other string works: ObjectName maps it to an object name.
func checkID(kind, id string) error {
	switch {
	case id == "":
		return errBadParams(fmt.Errorf("the %s id is empty", kind))
	case len(id) > MaxIDBytes:
		return errBadParams(fmt.Errorf("the %s id is %d bytes; at most %d are accepted", kind, len(id), MaxIDBytes))
	}
	return nil
}

// getInstance reads the order placed under an OSB id: NotFound unless it is
// this id's (see ObjectName).
func (b *Broker) getInstance(ctx context.Context, id string) (*brokerv1.ServiceInstance, error) {
	in, err := b.mizar.BrokerV1alpha1().ServiceInstances(b.namespace).Get(ctx, ObjectName(id), metav1.GetOptions{})
	if err == nil && !isFor(in, id) {
		return nil, apierrors.NewNotFound(brokerv1.Resource("serviceinstances"), id)
	}
	return in, err
}

// Provision places an order, or answers for the one already placed under this id.
func (b *Broker) Provision(ctx context.Context, id string, d domain.ProvisionDetails, async bool) (domain.ProvisionedServiceSpec, error) {
	if !async {
		return domain.ProvisionedServiceSpec{}, apiresponses.ErrAsyncRequired
	}
	if err := checkID("instance", id); err != nil {
		return domain.ProvisionedServiceSpec{}, err
	}
	// Deprecated in favour of context, but still REQUIRED in 2.13 to 2.17.
	if d.OrganizationGUID == "" || d.SpaceGUID == "" {
		return domain.ProvisionedServiceSpec{}, errBadParams(errors.New("organization_guid and space_guid are required"))
	}
	class, plan, err := b.classFor(ctx, d.ServiceID, d.PlanID)
	if err != nil {
		return domain.ProvisionedServiceSpec{}, err
	}
	if err := checkMaintenanceInfo(d.MaintenanceInfo); err != nil {
		return domain.ProvisionedServiceSpec{}, err
	}
	want := brokerv1.ServiceInstanceSpec{Class: class, Plan: plan}
	if len(d.RawParameters) > 0 && string(d.RawParameters) != "null" {
		want.Parameters = &runtime.RawExtension{Raw: d.RawParameters}
	}
	in := &brokerv1.ServiceInstance{
		ObjectMeta: metav1.ObjectMeta{Name: ObjectName(id), Namespace: b.namespace,
			Labels: map[string]string{LabelOSB: "true"}, Annotations: map[string]string{AnnotationID: id}},
		Spec: want,
	}
	created, err := b.mizar.BrokerV1alpha1().ServiceInstances(b.namespace).Create(ctx, in, metav1.CreateOptions{})
	switch {
	case err == nil:
		return domain.ProvisionedServiceSpec{IsAsync: true, OperationData: created.Status.Operation}, nil
	case apierrors.IsInvalid(err):
		return domain.ProvisionedServiceSpec{}, errBadParams(fmt.Errorf("invalid order: %s", invalidCauses(err)))
	case !apierrors.IsAlreadyExists(err):
		return domain.ProvisionedServiceSpec{}, fmt.Errorf("placing the order: %w", err)
	}
	existing, err := b.getInstance(ctx, id)
	if apierrors.IsNotFound(err) {
		// Another id's order holds the name (see ObjectName), or it just went.
		return domain.ProvisionedServiceSpec{}, conflict("another service instance holds the name of %s; retry, or use another id", id)
	}
	if err != nil {
		return domain.ProvisionedServiceSpec{}, fmt.Errorf("reading the existing order: %w", err)
	}
	if !sameOrder(&existing.Spec, &want) {
		return domain.ProvisionedServiceSpec{}, conflict("service instance %s exists with another service, plan or parameters", id)
	}
	switch {
	case existing.DeletionTimestamp != nil:
		return domain.ProvisionedServiceSpec{}, apiresponses.ErrConcurrentInstanceAccess
	case existing.Status.Phase == brokerv1.PhaseProvisioned:
		return domain.ProvisionedServiceSpec{AlreadyExists: true}, nil
	}
	return domain.ProvisionedServiceSpec{IsAsync: true, OperationData: existing.Status.Operation}, nil
}

func sameOrder(a, b *brokerv1.ServiceInstanceSpec) bool {
	return a.Class == b.Class && a.Plan == b.Plan && sameParameters(a.Parameters, b.Parameters)
}

// sameParameters compares parameters as JSON values; none and {} are the same.
func sameParameters(a, b *runtime.RawExtension) bool {
	var pa, pb any
	if a != nil {
		_ = json.Unmarshal(a.Raw, &pa)
	}
	if b != nil {
		_ = json.Unmarshal(b.Raw, &pb)
	}
	if m, ok := pa.(map[string]any); ok && len(m) == 0 {
		pa = nil
	}
	if m, ok := pb.(map[string]any); ok && len(m) == 0 {
		pb = nil
	}
	return apiequality.Semantic.DeepEqual(pa, pb)
}

func invalidCauses(err error) string {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return err.Error()
	}
	var parts []string
	for _, c := range status.Status().Details.Causes {
		parts = append(parts, c.Field+": "+c.Message)
	}
	return strings.Join(parts, "; ")
}

// deprovisionOperation is the operation id of an order's deletion; last_operation
// recognises it after the order is gone.
func deprovisionOperation(in *brokerv1.ServiceInstance) string {
	return "deprovision-" + string(in.UID)
}

// Deprovision deletes the order; the operator removes what it made first.
func (b *Broker) Deprovision(ctx context.Context, id string, _ domain.DeprovisionDetails, async bool) (domain.DeprovisionServiceSpec, error) {
	if !async {
		return domain.DeprovisionServiceSpec{}, apiresponses.ErrAsyncRequired
	}
	in, err := b.getInstance(ctx, id)
	if apierrors.IsNotFound(err) {
		return domain.DeprovisionServiceSpec{}, apiresponses.ErrInstanceDoesNotExist
	}
	if err != nil {
		return domain.DeprovisionServiceSpec{}, fmt.Errorf("reading the order: %w", err)
	}
	uid := in.UID
	// Its bindings go with it: the fulfillment operator deletes them once the
	// workload (and so the credentials) is gone.
	err = b.mizar.BrokerV1alpha1().ServiceInstances(b.namespace).Delete(ctx, in.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return domain.DeprovisionServiceSpec{}, apiresponses.ErrInstanceDoesNotExist
	}
	if err != nil {
		return domain.DeprovisionServiceSpec{}, fmt.Errorf("deleting the order: %w", err)
	}
	return domain.DeprovisionServiceSpec{IsAsync: true, OperationData: deprovisionOperation(in)}, nil
}

// GetInstance is not offered (instances_retrievable is false).
func (b *Broker) GetInstance(context.Context, string, domain.FetchInstanceDetails) (domain.GetInstanceDetailsSpec, error) {
	return domain.GetInstanceDetailsSpec{}, errNotFound
}

// Update changes an instance's plan or parameters (parameters not sent stay
// as they are). The order's spec changes and the fulfillment operator brings
// the StatefulSet to it: 202 with the update's operation. An update that
// changes nothing answers 200 once the instance is provisioned; the same
// update again while it runs, 202 with the same operation; any other change
// while the instance is busy, 422 ConcurrencyError. Plans whose storage
// differs are refused (422): a StatefulSet's claims cannot be resized.
func (b *Broker) Update(ctx context.Context, id string, d domain.UpdateDetails, async bool) (domain.UpdateServiceSpec, error) {
	if !async {
		return domain.UpdateServiceSpec{}, apiresponses.ErrAsyncRequired
	}
	in, err := b.getInstance(ctx, id)
	if apierrors.IsNotFound(err) {
		return domain.UpdateServiceSpec{}, errNotFound
	}
	if err != nil {
		return domain.UpdateServiceSpec{}, fmt.Errorf("reading the order: %w", err)
	}
	want := *in.Spec.DeepCopy()
	if d.PlanID != "" {
		class, plan, err := b.classFor(ctx, d.ServiceID, d.PlanID)
		if err != nil {
			return domain.UpdateServiceSpec{}, err
		}
		if class != in.Spec.Class {
			return domain.UpdateServiceSpec{}, errBadParams(fmt.Errorf("service %s is not the service of instance %s", d.ServiceID, id))
		}
		want.Plan = plan
	}
	if err := checkMaintenanceInfo(d.MaintenanceInfo); err != nil {
		return domain.UpdateServiceSpec{}, err
	}
	if len(d.RawParameters) > 0 && string(d.RawParameters) != "null" {
		want.Parameters = &runtime.RawExtension{Raw: d.RawParameters}
	}
	busy := in.DeletionTimestamp != nil || in.Status.Phase != brokerv1.PhaseProvisioned || in.Status.ObservedGeneration != in.Generation
	if sameOrder(&in.Spec, &want) {
		switch {
		case !busy:
			return domain.UpdateServiceSpec{}, nil
		case in.DeletionTimestamp == nil && strings.HasPrefix(in.Status.Operation, "update-") && in.Status.Phase != brokerv1.PhaseFailed:
			return domain.UpdateServiceSpec{IsAsync: true, OperationData: in.Status.Operation}, nil
		}
	}
	if busy {
		return domain.UpdateServiceSpec{}, apiresponses.ErrConcurrentInstanceAccess
	}
	in.Spec = want
	updated, err := b.mizar.BrokerV1alpha1().ServiceInstances(b.namespace).Update(ctx, in, metav1.UpdateOptions{})
	switch {
	case apierrors.IsConflict(err):
		return domain.UpdateServiceSpec{}, apiresponses.ErrConcurrentInstanceAccess
	case apierrors.IsInvalid(err) && invalidField(err, "spec.plan"):
		return domain.UpdateServiceSpec{}, failure(fmt.Errorf("plan change refused: %s", invalidCauses(err)), http.StatusUnprocessableEntity, "PlanChangeNotSupported")
	case apierrors.IsInvalid(err):
		return domain.UpdateServiceSpec{}, errBadParams(fmt.Errorf("invalid update: %s", invalidCauses(err)))
	case err != nil:
		return domain.UpdateServiceSpec{}, fmt.Errorf("updating the order: %w", err)
	}
	return domain.UpdateServiceSpec{IsAsync: true, OperationData: updated.Status.Operation}, nil
}

// invalidField reports whether a 422 names the field.
func invalidField(err error, field string) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, c := range status.Status().Details.Causes {
		if c.Field == field {
			return true
		}
	}
	return false
}

// LastOperation reports the order's progress from its status.
func (b *Broker) LastOperation(ctx context.Context, id string, d domain.PollDetails) (domain.LastOperation, error) {
	in, err := b.getInstance(ctx, id)
	if apierrors.IsNotFound(err) {
		if strings.HasPrefix(d.OperationData, "deprovision-") {
			return domain.LastOperation{}, apiresponses.ErrInstanceDoesNotExist
		}
		return domain.LastOperation{}, errNotFound
	}
	if err != nil {
		return domain.LastOperation{}, fmt.Errorf("reading the order: %w", err)
	}
	return lastOperation(in), nil
}

func lastOperation(in *brokerv1.ServiceInstance) domain.LastOperation {
	ready := meta.FindStatusCondition(in.Status.Conditions, fulfillment.ConditionReady)
	msg := ""
	reason := ""
	if ready != nil {
		msg, reason = ready.Message, ready.Reason
	}
	switch {
	case in.DeletionTimestamp != nil:
		return domain.LastOperation{State: domain.InProgress, Description: "deprovisioning: " + fulfillment.DescribeUndo(in)}
	case in.Status.Phase == brokerv1.PhaseProvisioned && in.Status.ObservedGeneration != in.Generation:
		return domain.LastOperation{State: domain.InProgress, Description: "update accepted, waiting for the fulfillment operator"}
	case in.Status.Phase == brokerv1.PhaseProvisioned && strings.HasPrefix(in.Status.Operation, "update-"):
		return domain.LastOperation{State: domain.Succeeded, Description: "updated: every replica runs the new plan and is ready"}
	case in.Status.Phase == brokerv1.PhaseProvisioned:
		return domain.LastOperation{State: domain.Succeeded, Description: "provisioned: every replica is ready"}
	case in.Status.Phase == brokerv1.PhaseFailed && reason == "Failed":
		return domain.LastOperation{State: domain.Failed, Description: msg}
	case in.Status.Phase == brokerv1.PhaseFailed:
		return domain.LastOperation{State: domain.InProgress, Description: msg + "; removing what was made"}
	case in.Status.Phase == brokerv1.PhasePending || len(in.Status.Steps) == 0:
		return domain.LastOperation{State: domain.InProgress, Description: "order accepted, waiting for the fulfillment operator"}
	}
	return domain.LastOperation{State: domain.InProgress, Description: fulfillment.Describe(in)}
}

// Bind records a ServiceBinding and hands out the instance's credentials.
// The service and plan ids must be the instance's (400); the parameters are
// stored with the binding and checked against the plan's binding schema by
// the registry (400). The same binding again answers 200, another one under
// the same id 409.
func (b *Broker) Bind(ctx context.Context, id, bindingID string, d domain.BindDetails, _ bool) (domain.Binding, error) {
	if err := checkID("binding", bindingID); err != nil {
		return domain.Binding{}, err
	}
	in, err := b.getInstance(ctx, id)
	if apierrors.IsNotFound(err) {
		return domain.Binding{}, failure(fmt.Errorf("service instance %s does not exist", id), http.StatusNotFound, "NotFound")
	}
	if err != nil {
		return domain.Binding{}, fmt.Errorf("reading the order: %w", err)
	}
	class, err := b.classes.Get(in.Spec.Class)
	if err != nil {
		return domain.Binding{}, fmt.Errorf("reading service class %s of instance %s: %w", in.Spec.Class, id, err)
	}
	planID := ""
	for _, p := range class.Spec.Plans {
		if p.Name == in.Spec.Plan {
			planID = p.ID
		}
	}
	switch {
	case d.ServiceID != class.Spec.ID:
		return domain.Binding{}, errBadParams(fmt.Errorf("service_id %s is not the service of instance %s", d.ServiceID, id))
	case d.PlanID != planID:
		return domain.Binding{}, errBadParams(fmt.Errorf("plan_id %s is not the plan of instance %s", d.PlanID, id))
	case !class.Spec.Bindable:
		return domain.Binding{}, errBadParams(fmt.Errorf("service %s is not bindable", class.Name))
	}
	if err := usable(in); err != nil {
		return domain.Binding{}, err
	}
	creds, err := b.credentials(ctx, in)
	if err != nil {
		return domain.Binding{}, err
	}
	bindings := b.mizar.BrokerV1alpha1().ServiceBindings(b.namespace)
	sb := &brokerv1.ServiceBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ObjectName(bindingID), Namespace: b.namespace,
			Labels:      map[string]string{LabelOSB: "true"},
			Annotations: map[string]string{AnnotationID: bindingID, AnnotationPlanID: d.PlanID}},
		Spec: brokerv1.ServiceBindingSpec{Instance: in.Name},
	}
	if len(d.RawParameters) > 0 && string(d.RawParameters) != "null" {
		sb.Spec.Parameters = &runtime.RawExtension{Raw: d.RawParameters}
	}
	_, err = bindings.Create(ctx, sb, metav1.CreateOptions{})
	switch {
	case err == nil:
		// Its status is the fulfillment operator's to write, as for one made with kubectl.
		return domain.Binding{Credentials: creds}, nil
	case apierrors.IsInvalid(err):
		return domain.Binding{}, errBadParams(fmt.Errorf("invalid binding: %s", invalidCauses(err)))
	case !apierrors.IsAlreadyExists(err):
		return domain.Binding{}, fmt.Errorf("recording the binding: %w", err)
	}
	existing, err := bindings.Get(ctx, sb.Name, metav1.GetOptions{})
	if err != nil {
		return domain.Binding{}, fmt.Errorf("reading the existing binding: %w", err)
	}
	if !isFor(existing, bindingID) || existing.Spec.Instance != in.Name || !sameParameters(existing.Spec.Parameters, sb.Spec.Parameters) ||
		(existing.Annotations[AnnotationPlanID] != "" && existing.Annotations[AnnotationPlanID] != d.PlanID) {
		return domain.Binding{}, conflict("binding %s exists with another instance, plan or parameters", bindingID)
	}
	return domain.Binding{AlreadyExists: true, Credentials: creds}, nil
}

// AnnotationPlanID keeps the plan id a binding was made with: binding the
// same id again with another plan is a different binding (409).
const AnnotationPlanID = "broker.mizar.dev/osb-plan-id"

// usable says why an instance cannot be bound yet, if it cannot: 422
// ConcurrencyError while an operation runs (the platform waits and retries),
// 422 InstanceNotUsable when it failed (waiting will not help).
func usable(in *brokerv1.ServiceInstance) error {
	switch {
	case in.DeletionTimestamp != nil:
		return failure(errors.New("the service instance is being deprovisioned"), http.StatusUnprocessableEntity, "ConcurrencyError")
	case in.Status.Phase == brokerv1.PhaseFailed:
		msg := "its operation failed"
		if c := meta.FindStatusCondition(in.Status.Conditions, fulfillment.ConditionReady); c != nil && c.Message != "" {
			msg = c.Message
		}
		return failure(fmt.Errorf("the service instance cannot be bound: %s; deprovision it (or update it to a working plan)", msg), http.StatusUnprocessableEntity, "InstanceNotUsable")
	case in.Status.Phase != brokerv1.PhaseProvisioned || in.Status.ObservedGeneration != in.Generation:
		return failure(errors.New("the service instance is still being provisioned or updated; bind once last_operation says succeeded"), http.StatusUnprocessableEntity, "ConcurrencyError")
	}
	return nil
}

// credentials reads the instance's connection Secret in the workload cluster.
func (b *Broker) credentials(ctx context.Context, in *brokerv1.ServiceInstance) (map[string]any, error) {
	s, err := b.workload.CoreV1().Secrets(in.Namespace).Get(ctx, in.Status.ConnectionSecret, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the credentials of %s: %w", in.Name, err)
	}
	get := func(k string) string {
		if v, ok := s.Data[k]; ok {
			return string(v)
		}
		return s.StringData[k]
	}
	host, port, user, pass, db := get("host"), get("port"), get("username"), get("password"), get("database")
	return map[string]any{
		"host": host, "port": port, "username": user, "password": pass, "database": db,
		"uri": fmt.Sprintf("mysql://%s:%s@%s:%s/%s", user, pass, host, port, db),
	}, nil
}

// Unbind deletes the binding.
func (b *Broker) Unbind(ctx context.Context, id, bindingID string, _ domain.UnbindDetails, _ bool) (domain.UnbindSpec, error) {
	bindings := b.mizar.BrokerV1alpha1().ServiceBindings(b.namespace)
	existing, err := bindings.Get(ctx, ObjectName(bindingID), metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && (!isFor(existing, bindingID) || existing.Spec.Instance != ObjectName(id))) {
		return domain.UnbindSpec{}, apiresponses.ErrBindingDoesNotExist
	}
	if err != nil {
		return domain.UnbindSpec{}, fmt.Errorf("reading the binding: %w", err)
	}
	uid := existing.UID
	if err := bindings.Delete(ctx, existing.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
		return domain.UnbindSpec{}, fmt.Errorf("deleting the binding: %w", err)
	}
	return domain.UnbindSpec{}, nil
}

// GetBinding is not offered (bindings_retrievable is false).
func (b *Broker) GetBinding(context.Context, string, string, domain.FetchBindingDetails) (domain.GetBindingSpec, error) {
	return domain.GetBindingSpec{}, apiresponses.ErrBindingNotFound
}

// LastBindingOperation: binds are synchronous, there is never one to poll.
func (b *Broker) LastBindingOperation(context.Context, string, string, domain.PollDetails) (domain.LastOperation, error) {
	return domain.LastOperation{}, apiresponses.ErrBindingNotFound
}
