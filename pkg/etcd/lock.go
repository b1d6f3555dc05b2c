package etcd

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"k8s.io/klog/v2"
)

// lockTTL bounds how long a crashed server can keep others waiting on its locks.
const lockTTL = 10 // seconds

// Locker hands out mutual exclusion on named keys across every server that shares
// the etcd cluster. The registry takes one around "check the related objects,
// then store" so two concurrent creates cannot both pass a uniqueness check.
type Locker struct {
	client *clientv3.Client
	prefix string

	mu      sync.Mutex
	session *concurrency.Session
	// local serializes holders inside this process: an etcd Mutex belongs to a
	// session (lease), and every goroutine here shares one, so etcd alone would
	// let them all in at once.
	local map[string]*localLock
}

// localLock is a context-aware mutex with a count of goroutines using it, so
// the map entry is dropped when nobody needs it.
type localLock struct {
	sem  chan struct{}
	refs int
}

// NewLocker keeps its lock keys under prefix.
func NewLocker(client *clientv3.Client, prefix string) *Locker {
	return &Locker{client: client, prefix: prefix, local: map[string]*localLock{}}
}

// Lock blocks until key is held or ctx ends, and returns the function that releases it.
func (l *Locker) Lock(ctx context.Context, key string) (unlock func(), err error) {
	releaseLocal, err := l.lockLocal(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("locking %q: %w", key, err)
	}
	s, err := l.currentSession()
	if err != nil {
		releaseLocal()
		return nil, err
	}
	m := concurrency.NewMutex(s, l.prefix+key)
	if err := m.Lock(ctx); err != nil {
		releaseLocal()
		return nil, fmt.Errorf("locking %q: %w", key, err)
	}
	return func() {
		// Released even if the request's context is gone; the lease is the backstop.
		ctx, cancel := context.WithTimeout(context.Background(), lockTTL*time.Second)
		defer cancel()
		if err := m.Unlock(ctx); err != nil {
			klog.ErrorS(err, "Releasing etcd lock; it expires with its lease", "key", key)
		}
		releaseLocal()
	}, nil
}

func (l *Locker) lockLocal(ctx context.Context, key string) (func(), error) {
	l.mu.Lock()
	ll := l.local[key]
	if ll == nil {
		ll = &localLock{sem: make(chan struct{}, 1)}
		l.local[key] = ll
	}
	ll.refs++
	l.mu.Unlock()

	done := func() {
		l.mu.Lock()
		if ll.refs--; ll.refs == 0 {
			delete(l.local, key)
		}
		l.mu.Unlock()
	}
	select {
	case ll.sem <- struct{}{}:
		return func() { <-ll.sem; done() }, nil
	case <-ctx.Done():
		done()
		return nil, ctx.Err()
	}
}

// currentSession returns the lease-backed session, replacing one that expired
// (e.g. after etcd was unreachable longer than the TTL).
func (l *Locker) currentSession() (*concurrency.Session, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.session != nil {
		select {
		case <-l.session.Done():
			l.session = nil
		default:
			return l.session, nil
		}
	}
	s, err := concurrency.NewSession(l.client, concurrency.WithTTL(lockTTL))
	if err != nil {
		return nil, fmt.Errorf("creating etcd lock session: %w", err)
	}
	l.session = s
	return s, nil
}

// Close releases the session and with it any lock still held.
func (l *Locker) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.session == nil {
		return nil
	}
	err := l.session.Close()
	l.session = nil
	return err
}
