// Package claim records values that must be unique across the cluster (VNIs,
// endpoint addresses and MACs, droplet addresses, a VPC's subnet ranges) as etcd
// keys, one key per value, each naming the object that holds it.
//
// A create claims its values in the etcd transaction that writes its object
// (Pending, Store.Client): two creates can never both hold a value, whatever
// the number of server replicas, and nothing is held by a lease or a process.
// A claim written on its own (an update's, or one of an older server that
// claimed before writing) whose owner was never stored is an orphan, which
// Repair removes once it is older than any create can run. This
// replaces a lease-held lock, which stalled creates for the lease's TTL after a
// crash and for etcd's request timeout while a leader was down.
package claim

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// OrphanGrace is how old an unowned claim must be before it is reclaimed: longer
// than any create can run between claiming and storing its object (the request
// timeout, 60 s by default), so a claim of a create still in flight is never taken.
// Store.SetOrphanGrace changes it (tests).
const OrphanGrace = 2 * time.Minute

// Owner is the object a claim belongs to. UID tells an object from an earlier
// one of the same name.
type Owner struct {
	Resource  string    `json:"resource"`
	Namespace string    `json:"namespace,omitempty"`
	Name      string    `json:"name"`
	UID       string    `json:"uid"`
	Time      time.Time `json:"time"`
}

// String names the owner as a person reads it, e.g. endpoints ns/a.
func (o Owner) String() string {
	if o.Namespace != "" {
		return o.Resource + " " + o.Namespace + "/" + o.Name
	}
	return o.Resource + " " + o.Name
}

// Holder is a stored claim.
type Holder struct {
	Owner
	Key         string // relative to the store's prefix
	ModRevision int64
}

// Age is how long ago the claim was written.
func (h Holder) Age(now time.Time) time.Duration { return now.Sub(h.Time) }

// Store keeps claims under a prefix of mizar's etcd (<etcd-prefix>/claims/).
type Store struct {
	client *clientv3.Client
	prefix string
	// objects is the etcd prefix of the API's objects (ObjectKey).
	objects string
	pools   pools
	grace   time.Duration
}

// NewStore keeps its claims under prefix, which ends in "/".
func NewStore(client *clientv3.Client, prefix string) *Store {
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return &Store{client: client, prefix: prefix, grace: OrphanGrace}
}

// SetObjectPrefix names the etcd prefix k8s.io/apiserver's store keeps the
// API's objects under (--etcd-prefix), for ObjectKey.
func (s *Store) SetObjectPrefix(p string) {
	s.objects = strings.TrimSuffix(path.Join("/", p), "/") + "/"
}

// ObjectKey is the etcd key of an object whose registry key (the store's
// KeyFunc) is key, as k8s.io/apiserver's etcd3 store prefixes it.
func (s *Store) ObjectKey(key string) string {
	return s.objects + strings.TrimPrefix(key, "/")
}

// SetOrphanGrace changes how old an unowned claim must be before it is
// reclaimed. Only tests shorten it; nothing may run a create for longer.
func (s *Store) SetOrphanGrace(d time.Duration) { s.grace = d }

// Orphaned reports whether a claim whose owner does not hold it is old enough
// to be reclaimed.
func (s *Store) Orphaned(h Holder, now time.Time) bool { return h.Age(now) > s.grace }

// Prefix is the etcd prefix of every claim.
func (s *Store) Prefix() string { return s.prefix }

// Claim writes every key for owner in one transaction, or none of them. Keys the
// same owner (UID) already holds count as claimed, so a retried create is
// idempotent. When any key is held by another owner nothing is written and those
// holders are returned.
func (s *Store) Claim(ctx context.Context, owner Owner, keys ...string) ([]Holder, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if owner.Time.IsZero() {
		owner.Time = time.Now()
	}
	value, err := json.Marshal(owner)
	if err != nil {
		return nil, fmt.Errorf("encoding claim owner: %w", err)
	}
	absent := make([]clientv3.Cmp, len(keys))
	puts := make([]clientv3.Op, len(keys))
	gets := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		absent[i] = clientv3.Compare(clientv3.CreateRevision(s.prefix+k), "=", 0)
		puts[i] = clientv3.OpPut(s.prefix+k, string(value))
		gets[i] = clientv3.OpGet(s.prefix + k)
	}
	resp, err := s.client.Txn(ctx).If(absent...).Then(puts...).Else(gets...).Commit()
	if err != nil {
		return nil, fmt.Errorf("claiming %s: %w", strings.Join(keys, ", "), err)
	}
	if resp.Succeeded {
		return nil, nil
	}
	var taken, ours []string
	var holders []Holder
	if err := s.eachHolder(resp.Responses, func(i int, h Holder) {
		if h.UID == owner.UID {
			ours = append(ours, keys[i])
			return
		}
		taken = append(taken, keys[i])
		holders = append(holders, h)
	}); err != nil {
		return nil, err
	}
	if len(taken) == 0 {
		// Only keys we hold already (a retry): claim the rest.
		rest := without(keys, ours)
		return s.Claim(ctx, owner, rest...)
	}
	return holders, nil
}

// Take replaces an orphaned claim with one of owner's, unless the claim changed
// since it was read. It reports whether owner now holds the key.
func (s *Store) Take(ctx context.Context, h Holder, owner Owner) (bool, error) {
	if owner.Time.IsZero() {
		owner.Time = time.Now()
	}
	value, err := json.Marshal(owner)
	if err != nil {
		return false, fmt.Errorf("encoding claim owner: %w", err)
	}
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(s.prefix+h.Key), "=", h.ModRevision)).
		Then(clientv3.OpPut(s.prefix+h.Key, string(value))).Commit()
	if err != nil {
		return false, fmt.Errorf("taking over orphaned claim %s of %s: %w", h.Key, h.Owner, err)
	}
	return resp.Succeeded, nil
}

// Drop deletes a claim unless it changed since it was read.
func (s *Store) Drop(ctx context.Context, h Holder) error {
	_, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(s.prefix+h.Key), "=", h.ModRevision)).
		Then(clientv3.OpDelete(s.prefix + h.Key)).Commit()
	if err != nil {
		return fmt.Errorf("deleting claim %s of %s: %w", h.Key, h.Owner, err)
	}
	s.pools.released(h.Key)
	return nil
}

// Release deletes the keys that the owner with uid holds; keys held by anyone
// else are left alone.
func (s *Store) Release(ctx context.Context, uid string, keys ...string) error {
	for _, k := range keys {
		h, err := s.Get(ctx, k)
		if err != nil {
			return err
		}
		if h == nil || h.UID != uid {
			continue
		}
		if err := s.Drop(ctx, *h); err != nil {
			return err
		}
	}
	return nil
}

// Get reads one claim (nil when absent).
func (s *Store) Get(ctx context.Context, key string) (*Holder, error) {
	resp, err := s.client.Get(ctx, s.prefix+key)
	if err != nil {
		return nil, fmt.Errorf("reading claim %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	h, err := s.decode(resp.Kvs[0].Key, resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
	return &h, err
}

// List returns every claim whose key starts with p, and the revision it read at.
func (s *Store) List(ctx context.Context, p string) ([]Holder, int64, error) {
	resp, err := s.client.Get(ctx, s.prefix+p, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("listing claims %s*: %w", p, err)
	}
	out := make([]Holder, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		h, err := s.decode(kv.Key, kv.Value, kv.ModRevision)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, h)
	}
	return out, resp.Header.Revision, nil
}

// keys returns the keys (relative to the prefix) starting with p, without values.
func (s *Store) keys(ctx context.Context, p string) ([]string, error) {
	resp, err := s.client.Get(ctx, s.prefix+p, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("listing claims %s*: %w", p, err)
	}
	out := make([]string, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		out[i] = strings.TrimPrefix(string(kv.Key), s.prefix)
	}
	return out, nil
}

// DeletePrefix deletes every claim under p (the address pool of a deleted subnet).
func (s *Store) DeletePrefix(ctx context.Context, p string) error {
	if _, err := s.client.Delete(ctx, s.prefix+p, clientv3.WithPrefix()); err != nil {
		return fmt.Errorf("deleting claims %s*: %w", p, err)
	}
	s.pools.forget(p)
	return nil
}

func (s *Store) decode(key, value []byte, rev int64) (Holder, error) {
	h := Holder{Key: strings.TrimPrefix(string(key), s.prefix), ModRevision: rev}
	if err := json.Unmarshal(value, &h.Owner); err != nil {
		return Holder{}, fmt.Errorf("decoding claim %s: %w", key, err)
	}
	return h, nil
}

func without(all, drop []string) []string {
	out := make([]string, 0, len(all))
	for _, k := range all {
		keep := true
		for _, d := range drop {
			if k == d {
				keep = false
				break
			}
		}
		if keep {
			out = append(out, k)
		}
	}
	return out
}
