package fulfillment

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	brokerv1 "mizar.dev/pkg/apis/broker/v1alpha1"
	netv1alpha1 "mizar.dev/pkg/apis/networking/v1alpha1"
	"mizar.dev/pkg/broker/saga"
)

const (
	// LabelInstance names the order a workload object belongs to (its name);
	// LabelInstanceUID ties it to this very order, so a namesake made by
	// someone else (or by an earlier order of the same name) is never adopted.
	LabelInstance    = "app.kubernetes.io/instance"
	LabelInstanceUID = "broker.mizar.dev/instance-uid"
	LabelManagedBy   = "app.kubernetes.io/managed-by"
	managedBy        = "mizar-broker"
	// AnnotationSubnet on a pod asks mizar's CNI to attach it to that subnet:
	// the annotation the node agent reads (it was "networking.mizar.dev/subnet",
	// which no agent read, so orders with a subnet landed in the default one).
	AnnotationSubnet = netv1alpha1.PodAnnotationSubnet

	mysqlPort  = 3306
	mysqlUser  = "app"
	dataVolume = "data"
)

// names are the workload objects of one order; all derive from the
// workload name its status keeps.
type names struct{ secret, service, statefulSet string }

func namesOf(in *brokerv1.ServiceInstance) names {
	w := workloadName(in)
	return names{secret: w + "-credentials", service: w, statefulSet: w}
}

// workloadName is the name the order's StatefulSet and Service carry: the one
// in its status once picked; else, for an order that made objects before
// status.workloadName existed, its own name (what they were made under).
func workloadName(in *brokerv1.ServiceInstance) string {
	if in.Status.WorkloadName != "" {
		return in.Status.WorkloadName
	}
	for _, s := range in.Status.Steps {
		if makers[s.Name] && s.State != brokerv1.StepPending {
			return in.Name
		}
	}
	return NewWorkloadName(in.Spec.Class, in.UID)
}

// maxWorkloadPrefix keeps "<prefix>-<hash>" within 52 characters, the
// StatefulSet limit (its pods' controller-revision-hash label adds 11 to
// the name and must fit in 63).
const maxWorkloadPrefix = 52 - 1 - workloadHashLen

// workloadHashLen characters of base32 carry 60 bits of the order's uid.
const workloadHashLen = 12

var lowerBase32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewWorkloadName is a name for an order's workload that is a DNS-1035
// label (what a Service name must be) whatever the order is called: an OSB
// instance id may be any string, and a GUID begins with a digit 10 times in
// 16. It is the class name when that is a DNS-1035 label (else "svc"), then
// a hash of the order's uid, so it is unique per order and the same on
// every run.
func NewWorkloadName(class string, uid types.UID) string {
	prefix := class
	if len(prefix) > maxWorkloadPrefix {
		prefix = strings.TrimRight(prefix[:maxWorkloadPrefix], "-")
	}
	if len(utilvalidation.IsDNS1035Label(prefix)) > 0 {
		prefix = "svc"
	}
	sum := sha256.Sum256([]byte(uid))
	return prefix + "-" + lowerBase32.EncodeToString(sum[:])[:workloadHashLen]
}

func labelsOf(in *brokerv1.ServiceInstance) map[string]string {
	return map[string]string{LabelInstance: in.Name, LabelInstanceUID: string(in.UID), LabelManagedBy: managedBy}
}

// selectorOf selects the order's pods; it must never change once the StatefulSet exists.
func selectorOf(in *brokerv1.ServiceInstance) map[string]string {
	return map[string]string{LabelInstance: in.Name, LabelInstanceUID: string(in.UID)}
}

// classify turns a workload API error into a saga error: what the workload
// cluster refuses for good (forbidden, invalid, namespace gone) fails the order;
// the rest (timeouts, conflicts, 5xx) is retried.
func classify(what string, err error) error {
	err = fmt.Errorf("%s: %w", what, err)
	switch {
	case apierrors.IsForbidden(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsMethodNotSupported(err):
		return saga.Permanent(err)
	}
	return err
}

// owned checks that an existing object was made for this order.
func owned(in *brokerv1.ServiceInstance, kind string, m metav1.Object) error {
	if m.GetLabels()[LabelInstanceUID] != string(in.UID) {
		return saga.Permanent(fmt.Errorf("%s %s/%s already exists and was not made for this order (label %s=%q)",
			kind, m.GetNamespace(), m.GetName(), LabelInstanceUID, m.GetLabels()[LabelInstanceUID]))
	}
	return nil
}

func password() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating a password: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// ensureSecret creates the credentials once; an existing Secret of this order
// is kept as it is, so a retry or a restart never changes a password.
func ensureSecret(ctx context.Context, kube kubernetes.Interface, in *brokerv1.ServiceInstance, database string) error {
	n := namesOf(in)
	existing, err := kube.CoreV1().Secrets(in.Namespace).Get(ctx, n.secret, metav1.GetOptions{})
	if err == nil {
		return owned(in, "Secret", existing)
	}
	if !apierrors.IsNotFound(err) {
		return classify("reading the credentials Secret", err)
	}
	root, err := password()
	if err != nil {
		return err
	}
	user, err := password()
	if err != nil {
		return err
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: n.secret, Namespace: in.Namespace, Labels: labelsOf(in)},
		Type:       corev1.SecretTypeOpaque,
		StringData: map[string]string{
			"host":                fmt.Sprintf("%s.%s.svc", n.service, in.Namespace),
			"port":                strconv.Itoa(mysqlPort),
			"username":            mysqlUser,
			"password":            user,
			"database":            database,
			"mysql-root-password": root,
		},
	}
	_, err = kube.CoreV1().Secrets(in.Namespace).Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Lost a race with ourselves (an earlier attempt whose answer was lost): check it is ours.
		return fmt.Errorf("credentials Secret appeared while creating it; checking it again")
	}
	if err != nil {
		return classify("creating the credentials Secret", err)
	}
	return nil
}

func ensureService(ctx context.Context, kube kubernetes.Interface, in *brokerv1.ServiceInstance) error {
	n := namesOf(in)
	existing, err := kube.CoreV1().Services(in.Namespace).Get(ctx, n.service, metav1.GetOptions{})
	if err == nil {
		return owned(in, "Service", existing)
	}
	if !apierrors.IsNotFound(err) {
		return classify("reading the Service", err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: n.service, Namespace: in.Namespace, Labels: labelsOf(in)},
		Spec: corev1.ServiceSpec{
			// Headless: each replica gets a stable DNS name through the StatefulSet.
			ClusterIP:                corev1.ClusterIPNone,
			Selector:                 selectorOf(in),
			PublishNotReadyAddresses: true,
			Ports:                    []corev1.ServicePort{{Name: "mysql", Port: mysqlPort, TargetPort: intstr.FromString("mysql")}},
		},
	}
	if _, err := kube.CoreV1().Services(in.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return classify("creating the Service", err)
	} else if err != nil {
		return fmt.Errorf("Service appeared while creating it; checking it again")
	}
	return nil
}

func statefulSet(in *brokerv1.ServiceInstance, class *brokerv1.ServiceClass, plan *brokerv1.ServicePlan) *appsv1.StatefulSet {
	n := namesOf(in)
	podAnnotations := map[string]string{}
	if in.Spec.Subnet != "" {
		podAnnotations[AnnotationSubnet] = in.Spec.Subnet
	}
	secretEnv := func(name, key string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: n.secret}, Key: key,
		}}}
	}
	resources := corev1.ResourceList{corev1.ResourceCPU: plan.CPU, corev1.ResourceMemory: plan.Memory}
	replicas := plan.Replicas
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: n.statefulSet, Namespace: in.Namespace, Labels: labelsOf(in)},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    &replicas,
			ServiceName: n.service,
			Selector:    &metav1.LabelSelector{MatchLabels: selectorOf(in)},
			// PVCs go with the StatefulSet: deprovisioning leaves no data behind.
			PersistentVolumeClaimRetentionPolicy: &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
				WhenDeleted: appsv1.DeletePersistentVolumeClaimRetentionPolicyType,
				WhenScaled:  appsv1.DeletePersistentVolumeClaimRetentionPolicyType,
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labelsOf(in), Annotations: podAnnotations},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Name:  "mysql",
						Image: class.Spec.Image,
						Ports: []corev1.ContainerPort{{Name: "mysql", ContainerPort: mysqlPort}},
						Env: []corev1.EnvVar{
							secretEnv("MYSQL_ROOT_PASSWORD", "mysql-root-password"),
							secretEnv("MYSQL_USER", "username"),
							secretEnv("MYSQL_PASSWORD", "password"),
							secretEnv("MYSQL_DATABASE", "database"),
						},
						Resources:    corev1.ResourceRequirements{Requests: resources, Limits: resources},
						VolumeMounts: []corev1.VolumeMount{{Name: dataVolume, MountPath: "/var/lib/mysql"}},
						// The first start initializes the data directory; give it time
						// before readiness is judged (bitpoke/mysql-operator #416).
						StartupProbe: &corev1.Probe{
							ProbeHandler:     corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"mysqladmin", "ping", "-h", "127.0.0.1"}}},
							PeriodSeconds:    5,
							FailureThreshold: 60,
						},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{
								"sh", "-c", `mysql -h 127.0.0.1 -uroot -p"$MYSQL_ROOT_PASSWORD" -e 'SELECT 1'`,
							}}},
							PeriodSeconds:  5,
							TimeoutSeconds: 3,
						},
					}},
				},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: dataVolume, Labels: labelsOf(in)},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: plan.Storage}},
				},
			}},
		},
	}
}

func ensureStatefulSet(ctx context.Context, kube kubernetes.Interface, in *brokerv1.ServiceInstance, class *brokerv1.ServiceClass, plan *brokerv1.ServicePlan) error {
	n := namesOf(in)
	existing, err := kube.AppsV1().StatefulSets(in.Namespace).Get(ctx, n.statefulSet, metav1.GetOptions{})
	if err == nil {
		if err := owned(in, "StatefulSet", existing); err != nil {
			return err
		}
		return updateStatefulSet(ctx, kube, existing, statefulSet(in, class, plan))
	}
	if !apierrors.IsNotFound(err) {
		return classify("reading the StatefulSet", err)
	}
	if _, err := kube.AppsV1().StatefulSets(in.Namespace).Create(ctx, statefulSet(in, class, plan), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return classify("creating the StatefulSet", err)
	} else if err != nil {
		return fmt.Errorf("StatefulSet appeared while creating it; checking it again")
	}
	return nil
}

// updateStatefulSet brings an existing StatefulSet to what the plan asks
// (replicas, the container's resources and image): an update of the order.
// Its volume claim templates cannot change; the registry refuses plans that
// would need it.
func updateStatefulSet(ctx context.Context, kube kubernetes.Interface, existing, want *appsv1.StatefulSet) error {
	cur := &existing.Spec.Template.Spec.Containers[0]
	next := want.Spec.Template.Spec.Containers[0]
	if *existing.Spec.Replicas == *want.Spec.Replicas && cur.Image == next.Image &&
		apiequality.Semantic.DeepEqual(cur.Resources, next.Resources) {
		return nil
	}
	sts := existing.DeepCopy()
	sts.Spec.Replicas = want.Spec.Replicas
	c := &sts.Spec.Template.Spec.Containers[0]
	c.Image, c.Resources = next.Image, next.Resources
	// A conflict (someone else wrote it since) is retried with a fresh read.
	if _, err := kube.AppsV1().StatefulSets(sts.Namespace).Update(ctx, sts, metav1.UpdateOptions{}); err != nil {
		return classify("updating the StatefulSet", err)
	}
	return nil
}

// replicasReady waits until every replica of the current StatefulSet spec is ready.
func replicasReady(ctx context.Context, kube kubernetes.Interface, in *brokerv1.ServiceInstance, plan *brokerv1.ServicePlan) error {
	sts, err := kube.AppsV1().StatefulSets(in.Namespace).Get(ctx, namesOf(in).statefulSet, metav1.GetOptions{})
	if err != nil {
		return classify("reading the StatefulSet", err)
	}
	want := plan.Replicas
	if sts.Spec.Replicas != nil {
		want = *sts.Spec.Replicas
	}
	if sts.Status.ObservedGeneration < sts.Generation || sts.Status.ReadyReplicas < want {
		return saga.Wait("waiting for %d/%d replicas ready", sts.Status.ReadyReplicas, want)
	}
	// After an update, old pods are replaced one by one: ready is not enough.
	if sts.Status.UpdateRevision != "" && sts.Status.CurrentRevision != sts.Status.UpdateRevision {
		return saga.Wait("waiting for %d/%d replicas updated", sts.Status.UpdatedReplicas, want)
	}
	return nil
}

// remove deletes one workload object of this order, if it is there and ours.
func remove(ctx context.Context, what string, get func() (metav1.Object, error), del func() error, in *brokerv1.ServiceInstance) error {
	obj, err := get()
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return classify("reading the "+what, err)
	}
	if obj.GetLabels()[LabelInstanceUID] != string(in.UID) {
		// Not ours (the create step refused it): leave it.
		return nil
	}
	if err := del(); err != nil && !apierrors.IsNotFound(err) {
		return classify("deleting the "+what, err)
	}
	return nil
}

func deleteSecret(ctx context.Context, kube kubernetes.Interface, in *brokerv1.ServiceInstance) error {
	c, name := kube.CoreV1().Secrets(in.Namespace), namesOf(in).secret
	return remove(ctx, "credentials Secret",
		func() (metav1.Object, error) { return c.Get(ctx, name, metav1.GetOptions{}) },
		func() error { return c.Delete(ctx, name, metav1.DeleteOptions{}) }, in)
}

func deleteService(ctx context.Context, kube kubernetes.Interface, in *brokerv1.ServiceInstance) error {
	c, name := kube.CoreV1().Services(in.Namespace), namesOf(in).service
	return remove(ctx, "Service",
		func() (metav1.Object, error) { return c.Get(ctx, name, metav1.GetOptions{}) },
		func() error { return c.Delete(ctx, name, metav1.DeleteOptions{}) }, in)
}

// deleteStatefulSet deletes the StatefulSet and, explicitly, the claims of its
// replicas: the retention policy needs a controller that may not be running.
func deleteStatefulSet(ctx context.Context, kube kubernetes.Interface, in *brokerv1.ServiceInstance) error {
	c, name := kube.AppsV1().StatefulSets(in.Namespace), namesOf(in).statefulSet
	// Background: the StatefulSet goes at once and the garbage collector takes its pods;
	// foreground would leave it behind wherever no collector runs.
	bg := metav1.DeletePropagationBackground
	err := remove(ctx, "StatefulSet",
		func() (metav1.Object, error) { return c.Get(ctx, name, metav1.GetOptions{}) },
		func() error { return c.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg}) }, in)
	if err != nil {
		return err
	}
	sel := metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: map[string]string{LabelInstanceUID: string(in.UID)}})
	err = kube.CoreV1().PersistentVolumeClaims(in.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel})
	if err != nil && !apierrors.IsNotFound(err) {
		return classify("deleting the StatefulSet's volume claims", err)
	}
	return nil
}
