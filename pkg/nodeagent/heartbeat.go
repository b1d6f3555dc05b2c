package nodeagent

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"mizar.dev/pkg/agentapi"
)

// The agent's heartbeat: a coordination.k8s.io Lease in the workload
// cluster (in the agent's namespace) that it renews every HeartbeatInterval,
// as kubelet renews its node's Lease. mizarctl status reads them: an agent
// whose Lease outlived its duration is named, even when no object waits
// for it. A Lease, not the Droplet: every agent watches the Droplets, so a
// write to each per interval would reach every agent (N^2 events).
const HeartbeatInterval = 10 * time.Second

// The Lease's name and label (agentapi: mizarctl reads them too).
var (
	HeartbeatLeaseName = agentapi.HeartbeatLeaseName
	HeartbeatLabel     = agentapi.HeartbeatLabel
)

// Heartbeat renews droplet's Lease in namespace every interval until ctx
// ends; failures are logged and retried at the next beat.
func Heartbeat(ctx context.Context, c kubernetes.Interface, namespace, droplet string, interval time.Duration) {
	logger := klog.FromContext(ctx).WithName("heartbeat").WithValues("namespace", namespace, "lease", HeartbeatLeaseName(droplet))
	failing := false
	for {
		err := renew(ctx, c, namespace, droplet, interval)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			logger.Error(err, "Renewing the agent's heartbeat Lease failed; mizarctl status will show this agent as silent")
			failing = true
		case err == nil && failing:
			logger.Info("Renewing the agent's heartbeat Lease works again")
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

func renew(ctx context.Context, c kubernetes.Interface, namespace, droplet string, interval time.Duration) error {
	leases := c.CoordinationV1().Leases(namespace)
	now := metav1.NewMicroTime(time.Now())
	spec := coordinationv1.LeaseSpec{HolderIdentity: ptr.To(droplet), LeaseDurationSeconds: ptr.To(int32(4 * interval / time.Second)), RenewTime: &now}
	l, err := leases.Get(ctx, HeartbeatLeaseName(droplet), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		spec.AcquireTime = &now
		_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: HeartbeatLeaseName(droplet),
			Labels: map[string]string{HeartbeatLabel: droplet}}, Spec: spec}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	if l.Spec.AcquireTime != nil {
		spec.AcquireTime = l.Spec.AcquireTime
	}
	l.Spec = spec
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}
