package nodeagent

import (
	"context"
	"errors"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
)

// An agent often starts before mizar-apiserver is served: on a fresh cluster
// the DaemonSet and the API server come up together, and kube-apiserver
// answers 503 for the APIService until its backend is ready. Exiting on such
// an answer puts the agent into kubelet's crash-loop back-off (minutes), so
// the agent waits instead; an answer that will not change by waiting (403,
// 422, ...) still ends it at once, with its reason.

// notServedYet marks a 404 for the resource type itself, not for an object.
type notServedYet struct{ error }

func (e notServedYet) Unwrap() error { return e.error }

// retriableAPIError says whether err is the API not being served (yet):
// 503/429/5xx answers, timeouts, and refused or reset connections.
func retriableAPIError(err error) bool {
	var nsy notServedYet
	var status apierrors.APIStatus
	switch {
	case err == nil:
		return false
	case errors.As(err, &nsy):
		return true
	case apierrors.IsServiceUnavailable(err), apierrors.IsTooManyRequests(err), apierrors.IsServerTimeout(err),
		apierrors.IsTimeout(err), apierrors.IsInternalError(err), apierrors.IsUnexpectedServerError(err):
		return true
	case errors.As(err, &status) && status.Status().Code >= 500:
		return true
	case utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err), utilnet.IsProbableEOF(err):
		return true
	}
	return false
}

// startupBackoff spaces the retries: 0.5 s doubling up to 16 s.
var startupBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 6, Cap: 16 * time.Second}

// untilServed runs f until it succeeds, fails for good, or ctx ends.
func untilServed(ctx context.Context, what string, f func() error) error {
	b := startupBackoff
	for {
		err := f()
		if !retriableAPIError(err) {
			return err
		}
		d := b.Step()
		klog.InfoS("mizar's API is not served yet; retrying", "step", what, "in", d.Round(time.Millisecond), "err", err)
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(d):
		}
	}
}
