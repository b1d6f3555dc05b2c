package claim

import (
	"context"
	"errors"
	"testing"

	"go.etcd.io/etcd/client/v3/kubernetes"
)

// create writes object key k with the claims of p through the store's client,
// as the apiserver's etcd3 store creates an object.
func create(t *testing.T, s *Store, p *Pending, k string) (kubernetes.PutResponse, error) {
	t.Helper()
	return s.Client(s.client).Kubernetes.OptimisticPut(WithPending(context.Background(), p), s.prefix+"objects/"+k, []byte("object "+k), 0,
		kubernetes.PutOptions{GetOnFailure: true})
}

func exists(t *testing.T, s *Store, key string) bool {
	t.Helper()
	resp, err := s.client.Get(context.Background(), s.prefix+key)
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Kvs) > 0
}

// TestCreateWritesClaimsWithTheObject: the object and its claims are written in
// one revision, or nothing is.
func TestCreateWritesClaimsWithTheObject(t *testing.T) {
	s := newStores(t, 1)[0]
	ctx := context.Background()
	p := &Pending{Owner: owner("a"), Keys: []string{"x/1", "x/2"}}
	resp, err := create(t, s, p, "a")
	if err != nil || !resp.Succeeded || p.Outcome() != Committed {
		t.Fatalf("create: %+v, %v, outcome %v; want success", resp, err, p.Outcome())
	}
	for _, k := range []string{"objects/a", "x/1", "x/2"} {
		r, err := s.client.Get(ctx, s.prefix+k)
		if err != nil || len(r.Kvs) != 1 || r.Kvs[0].CreateRevision != resp.Revision {
			t.Fatalf("%s: %v, %v; want it created at revision %d", k, r, err, resp.Revision)
		}
	}
	if h, err := s.Get(ctx, "x/1"); err != nil || h == nil || h.UID != "uid-a" {
		t.Fatalf("claim x/1: %+v, %v; want held by a", h, err)
	}

	// A key held by another owner: a ConflictError naming it, nothing written.
	p = &Pending{Owner: owner("b"), Keys: []string{"x/3", "x/2"}}
	_, err = create(t, s, p, "b")
	var conflict *ConflictError
	if !errors.As(err, &conflict) || len(conflict.Holders) != 1 || conflict.Holders[0].Key != "x/2" || conflict.Holders[0].UID != "uid-a" {
		t.Fatalf("create over a held key: %v; want a conflict with a's x/2", err)
	}
	if p.Outcome() != Refused || exists(t, s, "objects/b") || exists(t, s, "x/3") {
		t.Fatalf("a refused create wrote something (outcome %v)", p.Outcome())
	}

	// The object exists: OptimisticPut's own answer, with the object, nothing written.
	p = &Pending{Owner: owner("a2"), Keys: []string{"x/4"}}
	resp, err = create(t, s, p, "a")
	if err != nil || resp.Succeeded || resp.KV == nil || string(resp.KV.Value) != "object a" {
		t.Fatalf("create of an existing object: %+v, %v; want not succeeded with the object", resp, err)
	}
	if exists(t, s, "x/4") {
		t.Fatal("a create of an existing object wrote its claim")
	}

	// Keys the same owner holds already (a retried create) count as claimed.
	if _, err := s.Claim(ctx, owner("c"), "x/5"); err != nil {
		t.Fatal(err)
	}
	p = &Pending{Owner: owner("c"), Keys: []string{"x/5", "x/6"}}
	if resp, err := create(t, s, p, "c"); err != nil || !resp.Succeeded {
		t.Fatalf("create holding one of its keys already: %+v, %v; want success", resp, err)
	}
	if !exists(t, s, "x/6") {
		t.Fatal("the key not held yet was not written")
	}

	// A second write of the same Pending is refused before it is sent.
	if _, err := create(t, s, p, "c-again"); err == nil {
		t.Fatal("a Pending was written twice")
	}
}

// TestCreateGuardedByARange: a create with a guard is refused when a claim
// under the guard was written after the revision its check read.
func TestCreateGuardedByARange(t *testing.T) {
	s := newStores(t, 1)[0]
	ctx := context.Background()
	mustClaim(t, s, owner("other"), "g/10.0.0.0/24")
	_, rev, err := s.List(ctx, "g/")
	if err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, owner("late"), "g/10.0.1.0/24")
	p := &Pending{Owner: owner("me"), Keys: []string{"g/10.0.2.0/24"}, Guard: "g/", Rev: rev}
	_, err = create(t, s, p, "me")
	var conflict *ConflictError
	if !errors.As(err, &conflict) || !conflict.GuardChanged || len(conflict.Holders) != 0 {
		t.Fatalf("create after the guarded range changed: %v; want a guard conflict", err)
	}
	if exists(t, s, "objects/me") || exists(t, s, "g/10.0.2.0/24") {
		t.Fatal("a refused create wrote something")
	}
	_, rev, err = s.List(ctx, "g/")
	if err != nil {
		t.Fatal(err)
	}
	p = &Pending{Owner: owner("me"), Keys: []string{"g/10.0.2.0/24"}, Guard: "g/", Rev: rev}
	if resp, err := create(t, s, p, "me"); err != nil || !resp.Succeeded {
		t.Fatalf("create on an unchanged range: %+v, %v; want success", resp, err)
	}
	// A claim written outside the guard does not matter.
	_, rev, err = s.List(ctx, "g/")
	if err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, owner("other"), "h/1")
	p = &Pending{Owner: owner("me2"), Keys: []string{"g/10.0.3.0/24"}, Guard: "g/", Rev: rev}
	if resp, err := create(t, s, p, "me2"); err != nil || !resp.Succeeded {
		t.Fatalf("create after a write outside the guard: %+v, %v; want success", resp, err)
	}
}

// TestWritesWithoutPendingArePlain: updates, and creates without claims, are
// etcd's own OptimisticPut.
func TestWritesWithoutPendingArePlain(t *testing.T) {
	s := newStores(t, 1)[0]
	kv := s.Client(s.client).Kubernetes
	ctx := context.Background()
	resp, err := kv.OptimisticPut(ctx, s.prefix+"objects/plain", []byte("v1"), 0, kubernetes.PutOptions{})
	if err != nil || !resp.Succeeded {
		t.Fatalf("plain create: %+v, %v", resp, err)
	}
	p := &Pending{Owner: owner("p"), Keys: []string{"x/1"}}
	resp, err = kv.OptimisticPut(WithPending(ctx, p), s.prefix+"objects/plain", []byte("v2"), resp.Revision, kubernetes.PutOptions{})
	if err != nil || !resp.Succeeded || p.Outcome() != NotSent || exists(t, s, "x/1") {
		t.Fatalf("update with a Pending in its context: %+v, %v, outcome %v; want a plain update", resp, err, p.Outcome())
	}
}

// TestNextAndUnused: a value Next hands out stays taken until Unused frees it.
func TestNextAndUnused(t *testing.T) {
	s := newStores(t, 1)[0]
	ctx := context.Background()
	v, err := s.Next(ctx, small)
	if err != nil || v != 2 {
		t.Fatalf("first value %d, %v; want 2 (1 is reserved)", v, err)
	}
	if w, err := s.Next(ctx, small); err != nil || w != 3 {
		t.Fatalf("second value %d, %v; want 3", w, err)
	}
	s.Unused(small.Prefix + small.Format(v))
	if w, err := s.Next(ctx, small); err != nil || w != 2 {
		t.Fatalf("after Unused(2): %d, %v; want 2", w, err)
	}
}
