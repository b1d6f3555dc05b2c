package registry

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/klog/v2"

	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
)

// repair drops the claims of this kind whose owner is gone or no longer holds
// them (a release that could not reach etcd, a value an update claimed before
// its write failed or gave up, a claim of an older server that claimed before
// writing). Only claims older than the store's orphan grace are looked at, so
// an update still in flight keeps what it claimed.
func (k *Kind[T, S, St]) repair(ctx context.Context, self *genericregistry.Store) (int, error) {
	c := k.Claims
	r := &Reserver[T]{Claims: c.Store, self: self, keys: c.Keys}
	// One list of the kind tells most live claims apart; only the rest are
	// read one by one (consistently) before they are dropped.
	list, err := self.List(genericapirequest.WithNamespace(ctx, metav1.NamespaceAll), &metainternalversion.ListOptions{})
	if err != nil {
		return 0, err
	}
	held := map[string]string{} // claim key -> owner UID
	if err := meta.EachListItem(list, func(obj runtime.Object) error {
		for _, key := range c.Keys(must[T](obj)) {
			held[key.Key] = string(objectMeta(obj).GetUID())
		}
		return nil
	}); err != nil {
		return 0, err
	}
	now := time.Now()
	dropped := 0
	for _, p := range c.Prefixes {
		holders, _, err := c.Store.List(ctx, p)
		if err != nil {
			return dropped, err
		}
		for _, h := range holders {
			if h.Resource != k.Resource.Resource || !c.Store.Orphaned(h, now) || held[h.Key] == h.UID {
				continue
			}
			live, err := r.Live(ctx, h)
			if err != nil {
				return dropped, err
			}
			if live {
				continue
			}
			if err := c.Store.Drop(ctx, h); err != nil {
				return dropped, err
			}
			klog.InfoS("Dropped an orphaned claim", "key", h.Key, "owner", h.Owner.String(), "age", h.Age(now).Round(time.Second))
			dropped++
		}
	}
	return dropped, nil
}

// Repairer is a store whose orphaned claims can be dropped.
type Repairer interface {
	Repair(ctx context.Context) (int, error)
}

// RepairLoop runs every repairer at once and then every period until ctx ends.
func RepairLoop(ctx context.Context, repairers []Repairer, period time.Duration) {
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		for _, r := range repairers {
			if n, err := r.Repair(ctx); err != nil {
				klog.ErrorS(err, "Repairing claims", "store", r)
			} else if n > 0 {
				klog.InfoS("Repaired claims", "dropped", n)
			}
		}
	}, period)
}
