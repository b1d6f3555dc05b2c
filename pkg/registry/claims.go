package registry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"mizar.dev/pkg/claim"
)

// Claims gives a kind values no two objects may share (see package claim). A
// create writes them in the transaction that writes its object; they are
// released when the object is deleted.
type Claims[T runtime.Object] struct {
	Store *claim.Store
	// Reserve checks a new, statically valid object against the objects it
	// depends on, fills in what it allocates and names the values to claim
	// (Reserver.ClaimKeys, Allocate, ClaimUnchanged), which are written with
	// the object.
	Reserve func(ctx context.Context, r *Reserver[T], obj T) (field.ErrorList, error)
	// Keys are the claims a stored object holds, with the field each comes from.
	Keys func(obj T) []Key
	// Prefixes are the claim prefixes whose claims are this kind's (for Repair).
	Prefixes []string
	// AfterDelete, optional, drops what a deleted object held besides its Keys.
	AfterDelete func(ctx context.Context, s *claim.Store, obj T) error
}

// Key is one claim of an object and the field that holds the value.
type Key struct {
	Key   string
	Path  *field.Path
	Value any
}

// Reserver is what a kind's Reserve works with: the claim store, the new
// object's owner record, and its own store for telling live holders from orphans.
type Reserver[T runtime.Object] struct {
	Claims *claim.Store
	Owner  claim.Owner
	self   *genericregistry.Store
	keys   func(T) []Key
	// create, set for a create, gathers the claims written with the object;
	// without it (an update) keys are claimed at once.
	create *createClaims
}

// ClaimKeys claims keys for the new object: a create writes them in the
// transaction that writes the object, an update at once. A key held by a live
// object is a duplicate (422 at its field); one whose holder is gone and older
// than its grace (claim.OrphanGrace) is taken over; one held by a create still
// in flight is waited for, briefly.
func (r *Reserver[T]) ClaimKeys(ctx context.Context, keys ...Key) (field.ErrorList, error) {
	duplicate := func(h claim.Holder) *field.Error {
		k := keyOf(keys, h.Key)
		dup := field.Duplicate(k.Path, k.Value)
		dup.Detail = "already used by " + h.Owner.String()
		return dup
	}
	concurrent := func() error {
		return apierrors.NewConflict(r.self.DefaultQualifiedResource, r.Owner.Name, errors.New("its values were claimed concurrently; retry"))
	}
	if c := r.create; c != nil {
		c.Keys = append(c.Keys, KeyNames(keys)...)
		c.policy = &conflictPolicy{max: 3, exhausted: concurrent,
			resolve: func(ctx context.Context, conflict *claim.ConflictError, _ int) (bool, field.ErrorList, error) {
				errs, err := r.Resolve(ctx, conflict.Holders, duplicate)
				return true, errs, err
			}}
		return nil, nil
	}
	names := KeyNames(keys)
	for attempt := 0; attempt < 3; attempt++ {
		holders, err := r.Claims.Claim(ctx, r.Owner, names...)
		if err != nil {
			return nil, StorageError(err)
		}
		if len(holders) == 0 {
			return nil, nil
		}
		errs, err := r.Resolve(ctx, holders, duplicate)
		if err != nil || len(errs) > 0 {
			return errs, err
		}
	}
	return nil, concurrent()
}

// Allocate gives the new object the lowest free value of rng (claim.Store.Next),
// claimed with extra in the transaction that writes the object. A value another
// create got first is skipped; an extra key held by a live object is reported
// through conflict, and exhausted is the answer when extra keys stay contended.
func (r *Reserver[T]) Allocate(ctx context.Context, rng claim.Range, extra []Key, conflict func(claim.Holder) *field.Error, exhausted func() error) (uint32, error) {
	c := r.create
	if c == nil {
		return 0, errors.New("registry: Allocate is for creates only")
	}
	var v uint32
	var err error
	if lost := lostFrom(ctx); lost != nil && *lost > 0 {
		// An earlier try lost its value to another create, likely another
		// replica's taking the same lowest values: look elsewhere.
		v, err = r.Claims.NextFrom(ctx, rng, rng.Lo+rand.Uint32N(rng.Hi-rng.Lo+1))
	} else {
		v, err = r.Claims.Next(ctx, rng)
	}
	if err != nil {
		return 0, err
	}
	key := rng.Prefix + rng.Format(v)
	c.Keys = append(append(c.Keys, key), KeyNames(extra)...)
	c.allocated = key
	c.policy = &conflictPolicy{max: 3, exhausted: exhausted,
		resolve: func(ctx context.Context, ce *claim.ConflictError, _ int) (bool, field.ErrorList, error) {
			var others []claim.Holder
			for _, h := range ce.Holders {
				if h.Key != key {
					others = append(others, h)
				}
			}
			if len(others) == 0 {
				// The value went to another create: the next try takes another one.
				if lost := lostFrom(ctx); lost != nil {
					*lost++
				}
				return false, nil, nil
			}
			errs, err := r.Resolve(ctx, others, conflict)
			return true, errs, err
		}}
	return v, nil
}

// DependOn makes the create depend on the object name of store as Reserve
// read it (obj, nil when it was absent): etcd writes the new object only if
// that one is still at the revision read, so a parent deleted, or marked for
// deletion, after Reserve checked it cannot gain a child. When it changed the
// create is tried again, checked against the parent as it is then.
func (r *Reserver[T]) DependOn(ctx context.Context, store *genericregistry.Store, namespace, name string, obj metav1.Object) error {
	c := r.create
	if c == nil {
		return nil // an update: the object exists, its parents were checked when it was created
	}
	key, err := store.KeyFunc(genericapirequest.WithNamespace(ctx, namespace), name)
	if err != nil {
		return fmt.Errorf("the key of %s %q: %w", store.DefaultQualifiedResource, name, err)
	}
	var rev int64
	if obj != nil {
		if rev, err = strconv.ParseInt(obj.GetResourceVersion(), 10, 64); err != nil {
			return fmt.Errorf("the resource version of %s %q: %w", store.DefaultQualifiedResource, name, err)
		}
		if seen := seenFrom(ctx); seen != nil {
			seen[r.Claims.ObjectKey(key)] = true
		}
	}
	c.Unchanged = append(c.Unchanged, claim.Revision{Key: r.Claims.ObjectKey(key), ModRevision: rev})
	return nil
}

// SeenBefore reports whether an earlier try of this create found the object
// name of store (DependOn): one absent now was deleted meanwhile.
func (r *Reserver[T]) SeenBefore(ctx context.Context, store *genericregistry.Store, namespace, name string) bool {
	key, err := store.KeyFunc(genericapirequest.WithNamespace(ctx, namespace), name)
	return err == nil && seenFrom(ctx)[r.Claims.ObjectKey(key)]
}

type seenKey struct{}

type lostKey struct{}

// lostFrom counts the tries of one create whose allocated value another
// create got first.
func lostFrom(ctx context.Context) *int {
	n, _ := ctx.Value(lostKey{}).(*int)
	return n
}

// seenFrom is the set of parents the tries of one create have found.
func seenFrom(ctx context.Context) map[string]bool {
	m, _ := ctx.Value(seenKey{}).(map[string]bool)
	return m
}

// dependencyTries bounds how often a create is tried again because an object
// it depends on changed under it (DependOn): parents change rarely (a status
// write, a finalizer), so only a parent rewritten without pause exhausts it.
const dependencyTries = 10

// ClaimUnchanged claims keys with the new object only if no claim under guard
// was written after rev (a check made on a List of that range at rev still
// holds); when one was, the create is tried again (with a short, growing sleep)
// and exhausted is the answer after five tries.
func (r *Reserver[T]) ClaimUnchanged(guard string, rev int64, exhausted func() error, keys ...Key) error {
	c := r.create
	if c == nil {
		return errors.New("registry: ClaimUnchanged is for creates only")
	}
	c.Keys = append(c.Keys, KeyNames(keys)...)
	c.Guard, c.Rev = guard, rev
	c.policy = &conflictPolicy{max: 5, exhausted: exhausted,
		resolve: func(_ context.Context, _ *claim.ConflictError, tries int) (bool, field.ErrorList, error) {
			time.Sleep(time.Duration(tries+1) * time.Millisecond)
			return true, nil, nil
		}}
	return nil
}

// Resolve looks at claims held by others: a live holder is reported through
// conflict, an orphan is dropped (the caller retries), and a create still in
// flight is waited for (see awaitInFlight).
func (r *Reserver[T]) Resolve(ctx context.Context, holders []claim.Holder, conflict func(claim.Holder) *field.Error) (field.ErrorList, error) {
	var errs field.ErrorList
	for _, h := range holders {
		live, err := r.Live(ctx, h)
		if err != nil {
			return nil, err
		}
		switch {
		case live && h.Namespace == r.Owner.Namespace && h.Name == r.Owner.Name:
			// A retried create whose first try was stored (its reply was lost).
			return nil, apierrors.NewAlreadyExists(r.self.DefaultQualifiedResource, r.Owner.Name)
		case live:
			errs = append(errs, conflict(h))
		case h.Namespace == r.Owner.Namespace && h.Name == r.Owner.Name,
			r.Claims.Orphaned(h, time.Now()):
			// Same name: left by an earlier create of this name whose object is
			// gone (claims written with an object never outlive a failed create).
			klog.InfoS("Reclaiming an orphaned claim", "key", h.Key, "owner", h.Owner.String())
			if err := r.Claims.Drop(ctx, h); err != nil {
				return nil, StorageError(err)
			}
		default:
			settled, err := r.settled(ctx, h)
			if err != nil {
				return nil, err
			}
			if settled {
				// Freed, not in flight: its owner is gone or moved on.
				klog.InfoS("Reclaiming a freed claim", "key", h.Key, "owner", h.Owner.String())
				if err := r.Claims.Drop(ctx, h); err != nil {
					return nil, StorageError(err)
				}
				continue
			}
			live, err := r.awaitInFlight(ctx, h)
			if err != nil {
				return nil, err
			}
			if live {
				errs = append(errs, conflict(h))
			}
			// Otherwise the other create failed and released the key: the caller claims again.
		}
	}
	return errs, nil
}

// inFlightWait bounds how long a create waits for a concurrent create holding
// one of its keys; creates take milliseconds, so only a stalled or crashed one
// outlasts it.
const inFlightWait = 3 * time.Second

// awaitInFlight waits for the create holding h to end, so that concurrent
// creates get the answer a serial order would give them: a duplicate (422) when
// the other create was stored, a fresh claim when it failed. Only a holder
// that stays in flight past inFlightWait gets the client a 409 to retry later.
func (r *Reserver[T]) awaitInFlight(ctx context.Context, h claim.Holder) (bool, error) {
	deadline := time.Now().Add(inFlightWait)
	for delay := 2 * time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		select {
		case <-ctx.Done():
			return false, StorageError(ctx.Err())
		case <-time.After(delay):
		}
		live, err := r.Live(ctx, h)
		if err != nil || live {
			return live, err
		}
		cur, err := r.Claims.Get(ctx, h.Key)
		if err != nil {
			return false, StorageError(err)
		}
		if cur == nil || cur.UID != h.UID {
			return false, nil
		}
		if time.Now().After(deadline) {
			return false, apierrors.NewConflict(r.self.DefaultQualifiedResource, r.Owner.Name,
				fmt.Errorf("%s is being claimed by a create of %s still in progress; retry", h.Key, h.Owner))
		}
	}
}

// settled reports whether a claim its owner does not hold can no longer be
// taken up by a write in flight: its object, written after the claim, does
// not hold it, so it was updated past it (an address changed). Such a claim is
// free at once, not a 409 "still in progress" until the repair loop's grace
// (121 s) runs out. An update in flight (its claim written, its object not
// yet) and a claim without its object are still waited for.
func (r *Reserver[T]) settled(ctx context.Context, h claim.Holder) (bool, error) {
	obj, err := r.self.Get(genericapirequest.WithNamespace(ctx, h.Namespace), h.Name, &metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil // maybe a create of an older server, which claimed before writing: wait
	}
	if err != nil {
		return false, StorageError(err)
	}
	m := objectMeta(obj)
	if string(m.GetUID()) != h.UID {
		return false, nil
	}
	rv, err := strconv.ParseInt(m.GetResourceVersion(), 10, 64)
	if err != nil {
		return false, nil
	}
	return rv > h.ModRevision && keyOf(r.keys(must[T](obj)), h.Key).Key == "", nil
}

// Live reports whether the holder's object exists (read consistently from etcd)
// and still holds the key.
func (r *Reserver[T]) Live(ctx context.Context, h claim.Holder) (bool, error) {
	obj, err := r.self.Get(genericapirequest.WithNamespace(ctx, h.Namespace), h.Name, &metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if string(objectMeta(obj).GetUID()) != h.UID {
		return false, nil
	}
	return keyOf(r.keys(must[T](obj)), h.Key).Key != "", nil
}

func keyOf(keys []Key, name string) Key {
	for _, k := range keys {
		if k.Key == name {
			return k
		}
	}
	return Key{Path: field.NewPath("metadata", "name"), Value: name}
}

// StorageError keeps API status errors as they are (a 429 from the watch cache
// stays a 429) and turns a failing etcd into a retriable 503 instead of a 500.
func StorageError(err error) error {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return apierrors.NewTimeoutError(fmt.Sprintf("storage did not answer in time: %v", err), 1)
	}
	se := apierrors.NewServiceUnavailable(fmt.Sprintf("storage unavailable: %v", err))
	se.ErrStatus.Details = &metav1.StatusDetails{RetryAfterSeconds: 1}
	return se
}

func (k *Kind[T, S, St]) owner(obj runtime.Object) claim.Owner {
	m := objectMeta(obj)
	return claim.Owner{Resource: k.Resource.Resource, Namespace: m.GetNamespace(), Name: m.GetName(), UID: string(m.GetUID())}
}

// KeyNames returns the claim keys of keys.
func KeyNames(keys []Key) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.Key
	}
	return out
}

// beginCreate reserves a new object's claims: they are written with the
// object, in one transaction (see createWithClaims). The store calls it before
// the strategy's own validation, so static validation runs here first: only a
// well-formed object claims anything, and a bad one gets every static error at
// once.
func (k *Kind[T, S, St]) beginCreate(gk schema.GroupKind, self *genericregistry.Store) genericregistry.BeginCreateFunc {
	c := k.Claims
	return func(ctx context.Context, obj runtime.Object, opts *metav1.CreateOptions) (genericregistry.FinishFunc, error) {
		t := must[T](obj)
		name := objectMeta(obj).GetName()
		if errs := k.Validate(t); len(errs) > 0 {
			return nil, apierrors.NewInvalid(gk, name, errs)
		}
		create := createClaimsFrom(ctx)
		if create == nil {
			// Every create of a kind with claims comes through REST.Create or REST.Update.
			return nil, apierrors.NewInternalError(fmt.Errorf("a create of %s %q came without its claims", k.Resource, name))
		}
		r := &Reserver[T]{Claims: c.Store, Owner: k.owner(obj), self: self, keys: c.Keys, create: create}
		create.reset(r.Owner)
		errs, err := c.Reserve(ctx, r, t)
		if err != nil {
			return nil, StorageError(err)
		}
		if len(errs) > 0 {
			return nil, apierrors.NewInvalid(gk, name, errs)
		}
		if opts != nil && len(opts.DryRun) > 0 {
			// Nothing is written, so etcd checks no claim: read them instead.
			holders, err := c.Store.Holders(ctx, r.Owner.UID, create.Keys...)
			if err != nil {
				return nil, StorageError(err)
			}
			if len(holders) > 0 {
				return nil, &claim.ConflictError{Holders: holders}
			}
		}
		return func(context.Context, bool) {}, nil
	}
}

// createClaims are the claims of one create of a kind with claims. REST.Create
// and REST.Update put them in the create's context; BeginCreate fills them in
// (Reserve); the storage writes them with the object (claim.Store.Client).
type createClaims struct {
	claim.Pending
	store *claim.Store
	// allocated is the key of the value Allocate took from the index.
	allocated string
	// policy says what to do when etcd refuses the claims.
	policy *conflictPolicy
}

// conflictPolicy handles a create refused because of its claims.
type conflictPolicy struct {
	// resolve looks at the holders (tries: refusals counted so far): field
	// errors end the create, counted says the refusal counts towards max.
	resolve func(ctx context.Context, c *claim.ConflictError, tries int) (counted bool, errs field.ErrorList, err error)
	max     int
	// exhausted is the answer after max counted refusals.
	exhausted func() error
}

type createClaimsKey struct{}

func createClaimsFrom(ctx context.Context) *createClaims {
	c, _ := ctx.Value(createClaimsKey{}).(*createClaims)
	return c
}

// reset starts the claims of a new try of the create (the store may run
// BeginCreate more than once: a generated name taken, an apply retried).
func (c *createClaims) reset(owner claim.Owner) {
	c.settle(nil)
	c.Pending = claim.Pending{Owner: owner}
	c.policy = nil
}

// settle frees the allocated value in the index when nothing was written,
// unless err says another holder has it.
func (c *createClaims) settle(err error) {
	if c.allocated == "" {
		return
	}
	if o := c.Outcome(); o == claim.NotSent || o == claim.Refused {
		taken := false
		var conflict *claim.ConflictError
		if errors.As(err, &conflict) {
			taken = slices.ContainsFunc(conflict.Holders, func(h claim.Holder) bool { return h.Key == c.allocated })
		}
		if !taken {
			c.store.Unused(c.allocated)
		}
	}
	c.allocated = ""
}

// createWithClaims runs create (a Store.Create or an apply's Store.Update) with
// fresh claims in its context until etcd takes them or the kind's policy gives
// an answer: a live holder is a 422, an orphan is taken over, a create in
// flight is waited for, an allocated value someone else got is replaced by the
// next one.
func (k *Kind[T, S, St]) createWithClaims(gk schema.GroupKind) func(context.Context, func(context.Context) (runtime.Object, error)) (runtime.Object, error) {
	return func(ctx context.Context, create func(context.Context) (runtime.Object, error)) (runtime.Object, error) {
		tries, changed := 0, 0
		ctx = context.WithValue(context.WithValue(ctx, seenKey{}, map[string]bool{}), lostKey{}, new(int))
		for {
			c := &createClaims{store: k.Claims.Store}
			out, err := create(claim.WithPending(context.WithValue(ctx, createClaimsKey{}, c), &c.Pending))
			c.settle(err)
			var conflict *claim.ConflictError
			if !errors.As(err, &conflict) {
				return out, err
			}
			if len(conflict.Changed) > 0 {
				// A parent changed between Reserve's read and the write: check it again.
				if changed++; changed >= dependencyTries {
					return nil, apierrors.NewConflict(k.Resource, c.Owner.Name, fmt.Errorf("the objects it depends on kept changing; retry: %w", err))
				}
				continue
			}
			if c.policy == nil {
				return nil, apierrors.NewInternalError(fmt.Errorf("claims of %s %q refused without a policy: %w", k.Resource, c.Owner.Name, err))
			}
			counted, errs, err := c.policy.resolve(ctx, conflict, tries)
			if err != nil {
				return nil, err
			}
			if len(errs) > 0 {
				return nil, apierrors.NewInvalid(gk, c.Owner.Name, errs)
			}
			if counted {
				if tries++; tries >= c.policy.max {
					if c.policy.exhausted == nil {
						return nil, apierrors.NewConflict(k.Resource, c.Owner.Name, errors.New("its values were claimed concurrently; retry"))
					}
					return nil, c.policy.exhausted()
				}
			}
		}
	}
}

// beginUpdate claims the values an update adds. Values it no longer holds are
// freed by Repair (the finish function runs before the write, so it cannot
// know whether the old values are free yet).
func (k *Kind[T, S, St]) beginUpdate(self *genericregistry.Store) genericregistry.BeginUpdateFunc {
	c := k.Claims
	return func(ctx context.Context, obj, old runtime.Object, opts *metav1.UpdateOptions) (genericregistry.FinishFunc, error) {
		added := slices.DeleteFunc(c.Keys(must[T](obj)), func(n Key) bool {
			return slices.ContainsFunc(c.Keys(must[T](old)), func(o Key) bool { return o.Key == n.Key })
		})
		if len(added) == 0 {
			return func(context.Context, bool) {}, nil
		}
		r := &Reserver[T]{Claims: c.Store, Owner: k.owner(old), self: self, keys: c.Keys}
		errs, err := r.ClaimKeys(ctx, added...)
		if err != nil {
			return nil, err
		}
		if len(errs) > 0 {
			return nil, apierrors.NewInvalid(schema.GroupKind{Group: k.Resource.Group, Kind: k.Singular}, r.Owner.Name, errs)
		}
		dryRun := opts != nil && len(opts.DryRun) > 0
		return func(ctx context.Context, stored bool) {
			if !stored || dryRun {
				release(ctx, c.Store, r.Owner.UID, KeyNames(added))
			}
		}, nil
	}
}

func release(ctx context.Context, s *claim.Store, uid string, keys []string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.Release(ctx, uid, keys...); err != nil {
		// Not lost: Repair drops claims whose owner does not hold them.
		klog.ErrorS(err, "Releasing claims; Repair will", "keys", keys)
	}
}

// claimingStorage releases a deleted object's claims whichever path deleted it
// (a delete, or the update that removed its last finalizer).
type claimingStorage[T runtime.Object] struct {
	storage.Interface
	claims *Claims[T]
}

// claimingOptionsGetter builds each storage wrapped in a claimingStorage.
type claimingOptionsGetter[T runtime.Object] struct {
	generic.RESTOptionsGetter
	claims *Claims[T]
}

func (g claimingOptionsGetter[T]) GetRESTOptions(resource schema.GroupResource, example runtime.Object) (generic.RESTOptions, error) {
	opts, err := g.RESTOptionsGetter.GetRESTOptions(resource, example)
	if err != nil {
		return opts, err
	}
	DecorateAfter(&opts, func(_ *storagebackend.ConfigForResource, _ string, _, _ func() runtime.Object, s storage.Interface, destroy factory.DestroyFunc) (storage.Interface, factory.DestroyFunc, error) {
		return &claimingStorage[T]{Interface: s, claims: g.claims}, destroy, nil
	})
	return opts, nil
}

// DecorateAfter makes opts' storage decorator hand what it built (and what it
// was built from) to then, whose result the registry gets instead.
func DecorateAfter(opts *generic.RESTOptions, then func(config *storagebackend.ConfigForResource, resourcePrefix string,
	newFunc, newListFunc func() runtime.Object, s storage.Interface, destroy factory.DestroyFunc) (storage.Interface, factory.DestroyFunc, error)) {
	decorate := opts.Decorator
	opts.Decorator = func(config *storagebackend.ConfigForResource, resourcePrefix string, keyFunc func(runtime.Object) (string, error),
		newFunc, newListFunc func() runtime.Object, getAttrs storage.AttrFunc, trigger storage.IndexerFuncs, indexers *cache.Indexers,
	) (storage.Interface, factory.DestroyFunc, error) {
		s, destroy, err := decorate(config, resourcePrefix, keyFunc, newFunc, newListFunc, getAttrs, trigger, indexers)
		if err != nil {
			return s, destroy, err
		}
		return then(config, resourcePrefix, newFunc, newListFunc, s, destroy)
	}
}

func (s *claimingStorage[T]) Delete(ctx context.Context, key string, out runtime.Object, preconditions *storage.Preconditions,
	validateDeletion storage.ValidateObjectFunc, cachedExistingObject runtime.Object, opts storage.DeleteOptions) error {
	if err := s.Interface.Delete(ctx, key, out, preconditions, validateDeletion, cachedExistingObject, opts); err != nil {
		return err
	}
	t := must[T](out)
	release(ctx, s.claims.Store, string(objectMeta(out).GetUID()), KeyNames(s.claims.Keys(t)))
	if s.claims.AfterDelete != nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := s.claims.AfterDelete(ctx, s.claims.Store, t); err != nil {
			klog.ErrorS(err, "Dropping the claims of a deleted object", "key", key)
		}
	}
	return nil
}
