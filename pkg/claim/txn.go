package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
)

// Pending is what one create claims in the etcd transaction that writes its
// object: the object and its claims are stored together or not at all, so an
// allocated create costs one write, and a create that fails leaves no claim
// behind. The create's context carries it (WithPending) from the registry,
// which fills it in, to the client Client returns, which writes it.
type Pending struct {
	Owner Owner
	Keys  []string // relative to the store's prefix
	// Guard, when set, writes the object only if no claim under Guard was
	// written after Rev: a check made on a List of that range at Rev (a
	// subnet's overlap check against its VPC's ranges) still holds.
	Guard string
	Rev   int64
	// Unchanged are objects the new one depends on (a subnet's VPC, an
	// endpoint's subnet and droplet): the object is written only if each is
	// still at the revision read (0: still absent), so a parent deleted, or
	// marked for deletion, after the check cannot gain a child.
	Unchanged []Revision

	outcome Outcome
}

// Revision is an object's etcd key (absolute, see Store.ObjectKey) and the
// ModRevision it was read at; 0 means the key was absent.
type Revision struct {
	Key         string
	ModRevision int64
}

// Outcome is what became of a Pending.
type Outcome int

const (
	// NotSent: no transaction carried it (yet): nothing was written.
	NotSent Outcome = iota
	// Committed: the object and its claims were written.
	Committed
	// Refused: etcd answered that a condition failed; nothing was written.
	Refused
	// Unknown: the transaction was sent and no answer came; etcd may have
	// committed it.
	Unknown
)

// Outcome reports what became of p.
func (p *Pending) Outcome() Outcome { return p.outcome }

type pendingKey struct{}

// WithPending returns ctx carrying p to the storage that writes the create.
func WithPending(ctx context.Context, p *Pending) context.Context {
	return context.WithValue(ctx, pendingKey{}, p)
}

// PendingFrom returns the Pending ctx carries, or nil.
func PendingFrom(ctx context.Context) *Pending {
	p, _ := ctx.Value(pendingKey{}).(*Pending)
	return p
}

// ConflictError is a create refused because of its claims; nothing was written.
type ConflictError struct {
	// Holders are the claims other owners hold.
	Holders []Holder
	// GuardChanged: no key is held by another owner, but a claim under the
	// guarded range was written since it was read.
	GuardChanged bool
	// Changed are the keys of Pending.Unchanged written since they were read:
	// the create must check them again.
	Changed []string
}

func (e *ConflictError) Error() string {
	if len(e.Changed) > 0 {
		return "objects the create depends on changed since they were read: " + strings.Join(e.Changed, ", ")
	}
	if len(e.Holders) == 0 {
		return "claims: the guarded range changed since it was read"
	}
	held := make([]string, len(e.Holders))
	for i, h := range e.Holders {
		held[i] = h.Key + " (" + h.Owner.String() + ")"
	}
	return "claims held by others: " + strings.Join(held, ", ")
}

// Client returns a client for k8s.io/apiserver's etcd3 store over c whose
// creates (OptimisticPut at revision 0) write the claims their context carries
// (WithPending) in the same transaction as the object. Everything else is
// etcd's Kubernetes client as the apiserver's own factory builds it.
func (s *Store) Client(c *clientv3.Client) *kubernetes.Client {
	plain := &kubernetes.Client{Client: c}
	plain.Kubernetes = plain
	return &kubernetes.Client{Client: c, Kubernetes: &claimingKV{Interface: plain, kv: c.KV, store: s}}
}

type claimingKV struct {
	kubernetes.Interface
	kv    clientv3.KV
	store *Store
}

func (k *claimingKV) OptimisticPut(ctx context.Context, key string, value []byte, expectedRevision int64, opts kubernetes.PutOptions) (kubernetes.PutResponse, error) {
	p := PendingFrom(ctx)
	if expectedRevision != 0 || p == nil || len(p.Keys) == 0 && len(p.Unchanged) == 0 {
		return k.Interface.OptimisticPut(ctx, key, value, expectedRevision, opts)
	}
	return k.store.create(ctx, k.kv, p, key, value, opts)
}

// DeleteGuard makes a delete depend on what a check of its dependants read:
// the object is deleted only if no key under Prefix (absolute, see
// Store.ObjectKey) was created after Rev, the revision the check listed them
// at. Dependants created later depend on the object as they read it
// (Pending.Unchanged), so of a delete and a dependant's create at most one is
// written, whichever way they interleave.
type DeleteGuard struct {
	Prefix string
	Rev    int64
}

type deleteGuardKey struct{}

// WithDeleteGuard returns ctx carrying g to the storage that writes the delete.
func WithDeleteGuard(ctx context.Context, g DeleteGuard) context.Context {
	return context.WithValue(ctx, deleteGuardKey{}, g)
}

// HasDeleteGuard reports whether ctx carries a DeleteGuard.
func HasDeleteGuard(ctx context.Context) bool {
	_, ok := ctx.Value(deleteGuardKey{}).(DeleteGuard)
	return ok
}

// OptimisticDelete deletes as etcd's Kubernetes client does, and, when ctx
// carries a DeleteGuard, only if the guard holds: when the object is unchanged
// but a dependant was created since the guard's revision, it answers a
// *ConflictError (GuardChanged) and deletes nothing.
func (k *claimingKV) OptimisticDelete(ctx context.Context, key string, expectedRevision int64, opts kubernetes.DeleteOptions) (kubernetes.DeleteResponse, error) {
	g, ok := ctx.Value(deleteGuardKey{}).(DeleteGuard)
	if !ok {
		return k.Interface.OptimisticDelete(ctx, key, expectedRevision, opts)
	}
	resp, err := k.kv.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(key), "=", expectedRevision),
		clientv3.Compare(clientv3.CreateRevision(g.Prefix), "<", g.Rev+1).WithPrefix(),
	).Then(clientv3.OpDelete(key)).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return kubernetes.DeleteResponse{}, err
	}
	out := kubernetes.DeleteResponse{Succeeded: resp.Succeeded, Revision: resp.Header.Revision}
	if resp.Succeeded {
		return out, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 1 && kvs[0].ModRevision == expectedRevision {
		return out, &ConflictError{GuardChanged: true}
	}
	if opts.GetOnFailure && len(kvs) == 1 {
		out.KV = kvs[0]
	}
	return out, nil
}

// create writes the object under key together with p's claims, if the object
// is absent, each claim absent or already p's owner's (a retried create, as
// Claim allows), and p's guarded range unchanged. It answers as OptimisticPut:
// not Succeeded (with the object when asked) when the object exists; a
// *ConflictError when only the claims stood in the way.
func (s *Store) create(ctx context.Context, kv clientv3.KV, p *Pending, key string, value []byte, opts kubernetes.PutOptions) (kubernetes.PutResponse, error) {
	if p.outcome != NotSent {
		// A Pending belongs to one write: the registry makes a new one per try.
		return kubernetes.PutResponse{}, fmt.Errorf("the claims of %s were already sent once", p.Owner)
	}
	if p.Owner.Time.IsZero() {
		p.Owner.Time = time.Now()
	}
	owner, err := json.Marshal(p.Owner)
	if err != nil {
		return kubernetes.PutResponse{}, fmt.Errorf("encoding claim owner: %w", err)
	}
	ours := map[string]int64{} // keys p's owner holds already -> their ModRevision
	for {
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", 0)}
		puts := []clientv3.Op{clientv3.OpPut(key, string(value), clientv3.WithLease(opts.LeaseID))}
		gets := []clientv3.Op{clientv3.OpGet(key)}
		if p.Guard != "" {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(s.prefix+p.Guard), "<", p.Rev+1).WithPrefix())
		}
		for _, k := range p.Keys {
			if rev, ok := ours[k]; ok {
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(s.prefix+k), "=", rev))
			} else {
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(s.prefix+k), "=", 0))
				puts = append(puts, clientv3.OpPut(s.prefix+k, string(owner)))
			}
			gets = append(gets, clientv3.OpGet(s.prefix+k))
		}
		for _, u := range p.Unchanged {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(u.Key), "=", u.ModRevision))
			gets = append(gets, clientv3.OpGet(u.Key, clientv3.WithKeysOnly()))
		}
		resp, err := kv.Txn(ctx).If(cmps...).Then(puts...).Else(gets...).Commit()
		if errors.Is(err, rpctypes.ErrNoLeader) {
			// Refused before it was proposed (a member without a leader
			// refuses a request that requires one): nothing was written, and
			// the create may send its claims again once there is a leader.
			return kubernetes.PutResponse{}, err
		}
		if err != nil {
			p.outcome = Unknown
			return kubernetes.PutResponse{}, err
		}
		out := kubernetes.PutResponse{Succeeded: resp.Succeeded, Revision: resp.Header.Revision}
		if resp.Succeeded {
			p.outcome = Committed
			return out, nil
		}
		p.outcome = Refused
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			// The object exists: the answer OptimisticPut gives for it.
			if opts.GetOnFailure {
				out.KV = kvs[0]
			}
			return out, nil
		}
		conflict := &ConflictError{}
		claims := resp.Responses[1 : 1+len(p.Keys)]
		for i, u := range p.Unchanged {
			var rev int64
			if kvs := resp.Responses[1+len(p.Keys)+i].GetResponseRange().Kvs; len(kvs) > 0 {
				rev = kvs[0].ModRevision
			}
			if rev != u.ModRevision {
				conflict.Changed = append(conflict.Changed, u.Key)
			}
		}
		more := false
		if err := s.eachHolder(claims, func(i int, h Holder) {
			if h.UID == p.Owner.UID {
				if ours[p.Keys[i]] != h.ModRevision {
					ours[p.Keys[i]] = h.ModRevision
					more = true
				}
				return
			}
			conflict.Holders = append(conflict.Holders, h)
		}); err != nil {
			return out, err
		}
		if len(conflict.Changed) > 0 {
			return out, conflict
		}
		if len(conflict.Holders) == 0 && more {
			p.outcome = NotSent
			continue // only keys this owner holds already: write the rest
		}
		conflict.GuardChanged = len(conflict.Holders) == 0
		return out, conflict
	}
}

// Holders returns the claims among keys that owners other than uid hold, in
// one read: what a create that is not written (a dry run) checks.
func (s *Store) Holders(ctx context.Context, uid string, keys ...string) ([]Holder, error) {
	gets := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		gets[i] = clientv3.OpGet(s.prefix + k)
	}
	resp, err := s.client.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return nil, fmt.Errorf("reading claims %s: %w", strings.Join(keys, ", "), err)
	}
	var out []Holder
	err = s.eachHolder(resp.Responses, func(_ int, h Holder) {
		if h.UID != uid {
			out = append(out, h)
		}
	})
	return out, err
}

// eachHolder calls f with each claim the range reads of a transaction found,
// and the read's index; reads that found none are skipped.
func (s *Store) eachHolder(reads []*etcdserverpb.ResponseOp, f func(i int, h Holder)) error {
	for i, r := range reads {
		kvs := r.GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue
		}
		h, err := s.decode(kvs[0].Key, kvs[0].Value, kvs[0].ModRevision)
		if err != nil {
			return err
		}
		f(i, h)
	}
	return nil
}

// Unused tells the index that the value of key, taken by Next, was not
// claimed after all (its create wrote nothing).
func (s *Store) Unused(key string) { s.pools.released(key) }
