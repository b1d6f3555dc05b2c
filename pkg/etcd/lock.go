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

// pending marks a handoff whose holder has not finished: whoever finds it cannot
// trust it (the holder may have crashed after writing) and must read afresh.
const pending = "pending"

// Locker hands out mutual exclusion on named keys across every server that shares
// the etcd cluster. The registry takes one around "check the related objects,
// then store" so two concurrent creates cannot both pass a uniqueness check.
//
// Each key also carries a handoff: a short value a holder leaves for the next
// one (the registry leaves the resourceVersion of what it created, so the next
// holder can read "not older than that" from the watch cache instead of waiting
// for the cache to prove it is as new as etcd).
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

// Lock blocks until key is held or ctx ends. It returns the handoff the previous
// holder left ("" when there is none, or when that holder did not finish), and
// the function that releases the key: unlock(next) leaves next for the following
// holder, or with next == "" keeps the handoff that was there.
func (l *Locker) Lock(ctx context.Context, key string) (handoff string, unlock func(next string), err error) {
	releaseLocal, err := l.lockLocal(ctx, key)
	if err != nil {
		return "", nil, fmt.Errorf("locking %q: %w", key, err)
	}
	s, err := l.currentSession()
	if err != nil {
		releaseLocal()
		return "", nil, err
	}
	m := concurrency.NewMutex(s, l.prefix+"mutex/"+key)
	if err := m.Lock(ctx); err != nil {
		releaseLocal()
		return "", nil, fmt.Errorf("locking %q: %w", key, err)
	}

	// Read the handoff and mark it pending in one round trip, guarded by still
	// owning the mutex (the lease may have expired while we waited).
	handoffKey := l.prefix + "handoff/" + key
	resp, err := l.client.Txn(ctx).If(m.IsOwner()).
		Then(clientv3.OpGet(handoffKey), clientv3.OpPut(handoffKey, pending)).Commit()
	if err == nil && !resp.Succeeded {
		err = fmt.Errorf("lost the lock's lease")
	}
	if err != nil {
		l.release(m, releaseLocal, key, handoffKey, "")
		return "", nil, fmt.Errorf("locking %q: %w", key, err)
	}
	var prev string
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		prev = string(kvs[0].Value)
	}
	if prev == pending {
		prev = ""
	}
	return prev, func(next string) {
		if next == "" {
			next = prev
		}
		l.release(m, releaseLocal, key, handoffKey, next)
	}, nil
}

// release leaves next as the handoff (deleting it when empty) and frees the key,
// both in one transaction. It runs even if the request's context is gone; the
// lease is the backstop if etcd cannot be reached.
func (l *Locker) release(m *concurrency.Mutex, releaseLocal func(), key, handoffKey, next string) {
	defer releaseLocal()
	ctx, cancel := context.WithTimeout(context.Background(), lockTTL*time.Second)
	defer cancel()
	leave := clientv3.OpPut(handoffKey, next)
	if next == "" {
		leave = clientv3.OpDelete(handoffKey)
	}
	if _, err := l.client.Txn(ctx).If(m.IsOwner()).Then(leave, clientv3.OpDelete(m.Key())).Commit(); err != nil {
		klog.ErrorS(err, "Releasing etcd lock; it expires with its lease", "key", key)
	}
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
