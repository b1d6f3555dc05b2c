package apiserver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"

	"mizar.dev/pkg/registry"
)

// DefaultEtcdLeaderWait is how long a request waits for etcd to have a
// leader before it is answered 503: long enough to ride through an election
// (about a second), short enough that a client of a cluster without quorum
// hears so instead of hanging until its timeout.
const DefaultEtcdLeaderWait = 5 * time.Second

// notNowOptionsGetter gives every resource's storage notNowStorage.
type notNowOptionsGetter struct {
	generic.RESTOptionsGetter
	leaderWait time.Duration
}

func (g notNowOptionsGetter) GetRESTOptions(resource schema.GroupResource, example runtime.Object) (generic.RESTOptions, error) {
	opts, err := g.RESTOptionsGetter.GetRESTOptions(resource, example)
	if err != nil {
		return opts, err
	}
	registry.DecorateAfter(&opts, func(_ *storagebackend.ConfigForResource, _ string, _, _ func() runtime.Object, s storage.Interface, destroy factory.DestroyFunc) (storage.Interface, factory.DestroyFunc, error) {
		return notNowStorage{Interface: s, resource: resource, leaderWait: g.leaderWait}, destroy, nil
	})
	return opts, nil
}

// notNowStorage answers etcd's "not now" (no leader, unavailable, its own
// request timeout) as 503 with Retry-After, instead of a 500 carrying gRPC's
// text, and bounds how long a request waits for a leader. Its calls require
// a leader (clientv3.WithRequireLeader): an etcd member without one refuses
// at once, where it would otherwise hold a proposal until its own timeout
// and the client would retry a read until the request's 60 s ran out. A
// refusal for want of a leader was never proposed, so it is retried until
// leaderWait has passed, across an election.
type notNowStorage struct {
	storage.Interface
	resource   schema.GroupResource
	leaderWait time.Duration
}

func (s notNowStorage) do(ctx context.Context, op func(context.Context) error) error {
	ctx = clientv3.WithRequireLeader(ctx)
	deadline := time.Now().Add(s.leaderWait)
	for {
		err := op(ctx)
		if err == nil {
			return nil
		}
		if !errors.Is(err, rpctypes.ErrNoLeader) || time.Now().After(deadline) {
			return s.notNow(err)
		}
		select {
		case <-ctx.Done():
			return s.notNow(err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// notNow turns an etcd error that will pass into 503 with Retry-After.
func (s notNowStorage) notNow(err error) error {
	if !etcdNotNow(err) {
		return err
	}
	se := apierrors.NewServiceUnavailable(fmt.Sprintf("etcd cannot serve %s now (%v); retry", s.resource, err))
	se.ErrStatus.Details = &metav1.StatusDetails{Group: s.resource.Group, Kind: s.resource.Resource, RetryAfterSeconds: 1}
	return se
}

// etcdNotNow reports whether err is etcd saying it cannot serve at the
// moment: no leader, a leader change, its own request timeout, or the
// member unreachable (all gRPC Unavailable).
func etcdNotNow(err error) bool {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return false
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	if st, ok := grpcstatus.FromError(err); ok {
		return st.Code() == codes.Unavailable
	}
	return false
}

func (s notNowStorage) Create(ctx context.Context, key string, obj, out runtime.Object, ttl uint64) error {
	return s.do(ctx, func(ctx context.Context) error { return s.Interface.Create(ctx, key, obj, out, ttl) })
}

func (s notNowStorage) Delete(ctx context.Context, key string, out runtime.Object, pre *storage.Preconditions,
	validate storage.ValidateObjectFunc, cached runtime.Object, opts storage.DeleteOptions) error {
	return s.do(ctx, func(ctx context.Context) error { return s.Interface.Delete(ctx, key, out, pre, validate, cached, opts) })
}

func (s notNowStorage) Get(ctx context.Context, key string, opts storage.GetOptions, obj runtime.Object) error {
	return s.do(ctx, func(ctx context.Context) error { return s.Interface.Get(ctx, key, opts, obj) })
}

func (s notNowStorage) GetList(ctx context.Context, key string, opts storage.ListOptions, list runtime.Object) error {
	return s.do(ctx, func(ctx context.Context) error { return s.Interface.GetList(ctx, key, opts, list) })
}

func (s notNowStorage) GuaranteedUpdate(ctx context.Context, key string, dst runtime.Object, ignoreNotFound bool,
	pre *storage.Preconditions, try storage.UpdateFunc, cached runtime.Object) error {
	return s.do(ctx, func(ctx context.Context) error {
		return s.Interface.GuaranteedUpdate(ctx, key, dst, ignoreNotFound, pre, try, cached)
	})
}
