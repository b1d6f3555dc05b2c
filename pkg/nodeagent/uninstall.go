package nodeagent

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// DaemonSetWatch tells a normal stop of the agent (restart, upgrade, node
// drain, a deleted pod) from mizar's removal: only when the agent's own
// DaemonSet is deleted does the agent remove the node's conflist, plugin,
// pins and state on its way out.
//
// Why the DaemonSet, and why a watch: this is what Cilium's agent does with
// its cni.uninstall setting turned into a decision (it used to remove the
// conflist on every stop, which turned nodes NotReady on each upgrade), and
// what Antrea and Calico leave to the operator. A DaemonSet's deletion is the
// one event that means "no agent will come back here". Helm deletes the
// DaemonSet and, right after, the agent's RBAC and ServiceAccount; the pods
// go later, by garbage collection. A GET at SIGTERM would by then be refused
// (403/401), so the agent watches its DaemonSet while it runs and remembers
// the deletion; the GET at SIGTERM is only the fallback for a watch that had
// not delivered it yet.
type DaemonSetWatch struct {
	client    kubernetes.Interface
	namespace string
	name      string
	deleted   atomic.Bool
}

// ParseNamespacedName parses "namespace/name"; a bare name takes defaultNS.
func ParseNamespacedName(s, defaultNS string) (string, string, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok {
		ns, name = defaultNS, s
	}
	if ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("want namespace/name (or a name with $POD_NAMESPACE set), got %q", s)
	}
	return ns, name, nil
}

// WatchDaemonSet starts following namespace/name until ctx ends.
func WatchDaemonSet(ctx context.Context, client kubernetes.Interface, namespace, name string) *DaemonSetWatch {
	w := &DaemonSetWatch{client: client, namespace: namespace, name: name}
	lw := cache.NewListWatchFromClient(client.AppsV1().RESTClient(), "daemonsets", namespace, fields.OneTermEqualSelector("metadata.name", name))
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw, ObjectType: &appsv1.DaemonSet{},
		Handler: cache.ResourceEventHandlerFuncs{
			UpdateFunc: func(_, obj any) { w.saw(obj) },
			DeleteFunc: func(obj any) { w.markDeleted("watch") },
		},
	})
	go ctrl.RunWithContext(ctx)
	return w
}

func (w *DaemonSetWatch) saw(obj any) {
	if ds, ok := obj.(*appsv1.DaemonSet); ok && ds.DeletionTimestamp != nil {
		w.markDeleted("deletionTimestamp")
	}
}

func (w *DaemonSetWatch) markDeleted(how string) {
	if !w.deleted.Swap(true) {
		klog.InfoS("The agent's DaemonSet is being deleted: the node's mizar state goes when this agent stops", "daemonset", w.namespace+"/"+w.name, "seenBy", how)
	}
}

// Deleted says whether the DaemonSet is gone or going: from the watch, or
// else from a GET now (NotFound or a deletion timestamp). Any other answer,
// errors included, keeps the node's state: a wrong "no" costs a manual
// cleanup, a wrong "yes" cuts off every pod of the node.
func (w *DaemonSetWatch) Deleted(ctx context.Context) bool {
	if w.deleted.Load() {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ds, err := w.client.AppsV1().DaemonSets(w.namespace).Get(ctx, w.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		w.markDeleted("get")
	case err != nil:
		klog.ErrorS(err, "Cannot tell whether the agent's DaemonSet is deleted; keeping the node's mizar state", "daemonset", w.namespace+"/"+w.name)
	default:
		w.saw(ds)
	}
	return w.deleted.Load()
}
