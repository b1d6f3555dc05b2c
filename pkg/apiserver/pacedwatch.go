package apiserver

import (
	"context"
	"reflect"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/storage"
	cacherstorage "k8s.io/apiserver/pkg/storage/cacher"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"
	"k8s.io/client-go/tools/cache"
)

// pacedWatchOptionsGetter builds each watch cache as k8s.io/apiserver's
// StorageWithCacher does, over an etcd store whose watches that fail at once
// are answered only after a pause (pacedWatches). The watch cache's reflector
// restarts a watch that ended with an internal error at once, for 30 s
// (client-go's MaxInternalErrorRetryDuration, no backoff): while etcd has no
// leader each restart fails in microseconds, and a replica logged about
// 2,500 "watch chan error: etcdserver: no leader" lines a second and spun
// its CPU on them.
type pacedWatchOptionsGetter struct {
	generic.RESTOptionsGetter
}

func (g pacedWatchOptionsGetter) GetRESTOptions(resource schema.GroupResource, example runtime.Object) (generic.RESTOptions, error) {
	opts, err := g.RESTOptionsGetter.GetRESTOptions(resource, example)
	if err != nil {
		return opts, err
	}
	// Only the watch cache has the reflector that spins: a resource without
	// one (--watch-cache=false, or a cache size of 0) keeps the decorator the
	// etcd options chose, UndecoratedStorage; their other choice is
	// StorageWithCacher, which this replaces.
	if opts.Decorator != nil && !sameFunc(opts.Decorator, generic.UndecoratedStorage) {
		opts.Decorator = storageWithPacedCacher()
	}
	return opts, nil
}

// sameFunc reports whether two decorators are the same function. Only
// top-level functions compare reliably: a closure's code is copied where
// the function returning it is inlined.
func sameFunc(a, b generic.StorageDecorator) bool {
	return reflect.ValueOf(a).Pointer() == reflect.ValueOf(b).Pointer()
}

// storageWithPacedCacher is genericregistry.StorageWithCacher with the raw
// store's watches paced.
func storageWithPacedCacher() generic.StorageDecorator {
	return func(config *storagebackend.ConfigForResource, resourcePrefix string, keyFunc func(obj runtime.Object) (string, error),
		newFunc, newListFunc func() runtime.Object, getAttrsFunc storage.AttrFunc, triggerFuncs storage.IndexerFuncs,
		indexers *cache.Indexers) (storage.Interface, factory.DestroyFunc, error) {
		raw, destroyRaw, err := generic.NewRawStorage(config, newFunc, newListFunc, resourcePrefix)
		if err != nil {
			return raw, destroyRaw, err
		}
		s := &pacedWatches{Interface: raw, pause: minWatchPause}
		cacher, err := cacherstorage.NewCacherFromConfig(cacherstorage.Config{
			Storage: s, Versioner: storage.APIObjectVersioner{}, GroupResource: config.GroupResource,
			EventsHistoryWindow: config.EventsHistoryWindow, ResourcePrefix: resourcePrefix, KeyFunc: keyFunc,
			NewFunc: newFunc, NewListFunc: newListFunc, GetAttrsFunc: getAttrsFunc, IndexerFuncs: triggerFuncs,
			Indexers: indexers, Codec: config.Codec,
		})
		if err != nil {
			destroyRaw()
			return nil, func() {}, err
		}
		delegator := cacherstorage.NewCacheDelegator(cacher, s)
		var once sync.Once
		return delegator, func() {
			once.Do(func() {
				delegator.Stop()
				cacher.Stop()
				destroyRaw()
			})
		}, nil
	}
}

const (
	minWatchPause = 200 * time.Millisecond
	maxWatchPause = 5 * time.Second
	// A watch that lasted this long before failing was a real one: the
	// next failure starts pausing from minWatchPause again.
	healthyWatch = 10 * time.Second
)

// pacedWatches holds back the error of a watch that fails soon after it
// started, for a pause that doubles with each such failure in a row (up to
// maxWatchPause), so that whoever restarts it at once restarts it a few
// times a second at most.
type pacedWatches struct {
	storage.Interface
	mu    sync.Mutex
	pause time.Duration
}

func (s *pacedWatches) Watch(ctx context.Context, key string, opts storage.ListOptions) (watch.Interface, error) {
	w, err := s.Interface.Watch(ctx, key, opts)
	if err != nil {
		return w, err
	}
	p := &pacedWatch{inner: w, out: make(chan watch.Event), stop: make(chan struct{})}
	go p.run(s, time.Now())
	return p, nil
}

// next returns the pause before passing on an error of a watch that ran
// for lived, and the pause for the next one.
func (s *pacedWatches) next(lived time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lived >= healthyWatch {
		s.pause = minWatchPause
		return 0
	}
	pause := s.pause
	s.pause = min(2*s.pause, maxWatchPause)
	return pause
}

type pacedWatch struct {
	inner    watch.Interface
	out      chan watch.Event
	stop     chan struct{}
	stopOnce sync.Once
}

func (p *pacedWatch) run(s *pacedWatches, started time.Time) {
	defer close(p.out)
	for ev := range p.inner.ResultChan() {
		if ev.Type == watch.Error {
			if pause := s.next(time.Since(started)); pause > 0 {
				select {
				case <-time.After(pause):
				case <-p.stop:
					return
				}
			}
		}
		select {
		case p.out <- ev:
		case <-p.stop:
			return
		}
	}
}

func (p *pacedWatch) ResultChan() <-chan watch.Event { return p.out }

func (p *pacedWatch) Stop() {
	p.stopOnce.Do(func() {
		close(p.stop)
		p.inner.Stop()
	})
}
