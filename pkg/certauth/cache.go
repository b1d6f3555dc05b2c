// Package certauth keeps k8s.io/apiserver's client-certificate authentication
// from verifying the same certificate chain on every request.
//
// k8s.io/apiserver verifies the presented chain against the CA bundle for each
// request (one ECDSA or RSA signature check or more), although a client sends
// the same certificate on every request of its connections: that check was
// about 9% of mizar-apiserver's CPU per create. A Cache remembers chains that
// verified, for the exact certificates presented and the exact CA bundle in
// force, never past a certificate's validity; Authenticator answers from it
// and leaves every other request to the library's authenticator.
package certauth

import (
	"bytes"
	"container/list"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// DefaultSize bounds a Cache: clients (agents, operators, kube-apiserver's
// front proxy, people) rarely number more than this, and a miss only costs
// the verification the library would have done anyway.
const DefaultSize = 4096

// Cache remembers certificate chains that verified against a CA bundle. It is
// safe for concurrent use.
type Cache struct {
	size int
	now  func() time.Time
	// verifications counts real (uncached) verifications, for tests.
	verifications atomic.Int64

	mu      sync.Mutex
	lru     *list.List // of *entry, most recently used first
	entries map[cacheKey]*list.Element
}

// cacheKey names what was verified against which provider: the provider (a
// client CA and the front proxy's CA must never answer for each other) and a
// hash of the presented certificates, leaf first.
type cacheKey struct {
	provider dynamiccertificates.CAContentProvider
	certs    [sha256.Size]byte
}

type entry struct {
	key cacheKey
	// bundle is the CA bundle the chains verified against; any other bundle
	// (a CA added, rotated or removed) is a miss.
	bundle []byte
	chains [][]*x509.Certificate
	// notBefore and notAfter bound the time every certificate of every chain
	// is valid: outside it the entry is a miss.
	notBefore, notAfter time.Time
}

// NewCache returns a cache of at most size verified chains (DefaultSize if
// size < 1).
func NewCache(size int) *Cache {
	if size < 1 {
		size = DefaultSize
	}
	return &Cache{size: size, now: time.Now, lru: list.New(), entries: map[cacheKey]*list.Element{}}
}

// Verify verifies peers[0] (with peers[1:] as intermediates unless the
// provider names its own) against the provider's CA bundle, as k8s.io/apiserver's
// x509 authenticator does, and returns the verified chains. ok is false when
// the provider has no CA bundle yet (no opinion). Only successes are cached.
func (c *Cache) Verify(peers []*x509.Certificate, p dynamiccertificates.CAContentProvider) (chains [][]*x509.Certificate, ok bool, err error) {
	if len(peers) == 0 || p == nil {
		return nil, false, nil
	}
	// The bundle is read before the options: if the CA changes in between, the
	// entry is stored under the older bundle and the next lookup misses. The
	// other order could store a verification by an old CA under the new bundle.
	bundle := p.CurrentCABundleContent()
	opts, ok := p.VerifyOptions()
	if !ok {
		return nil, false, nil
	}
	// A fixed verification time is not "now": nothing to cache. A provider of
	// a type that cannot be a map key (a slice-based union) is not cached either.
	cacheable := opts.CurrentTime.IsZero() && len(bundle) > 0 && reflect.TypeOf(p).Comparable()
	key := cacheKey{provider: p, certs: hashCerts(peers)}
	now := c.now()
	if cacheable {
		if chains, hit := c.lookup(key, bundle, now); hit {
			return chains, true, nil
		}
	}
	if cacheable {
		// The lookup's clock, so the entry and the verification agree on "now".
		opts.CurrentTime = now
	}
	if opts.Intermediates == nil && len(peers) > 1 {
		opts.Intermediates = x509.NewCertPool()
		for _, in := range peers[1:] {
			opts.Intermediates.AddCert(in)
		}
	}
	c.verifications.Add(1)
	chains, err = peers[0].Verify(opts)
	if err != nil {
		return nil, true, err
	}
	if cacheable {
		c.store(key, bundle, chains)
	}
	return chains, true, nil
}

// Len is the number of cached chains.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

func (c *Cache) lookup(key cacheKey, bundle []byte, now time.Time) ([][]*x509.Certificate, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, found := c.entries[key]
	if !found {
		return nil, false
	}
	e := el.Value.(*entry)
	if now.Before(e.notBefore) || now.After(e.notAfter) || !bytes.Equal(e.bundle, bundle) {
		// Expired, not yet valid, or verified under another CA bundle: drop it
		// so a revoked CA's verification cannot linger.
		c.lru.Remove(el)
		delete(c.entries, key)
		return nil, false
	}
	c.lru.MoveToFront(el)
	return e.chains, true
}

func (c *Cache) store(key cacheKey, bundle []byte, chains [][]*x509.Certificate) {
	e := &entry{key: key, bundle: bundle, chains: chains}
	first := true
	for _, chain := range chains {
		for _, cert := range chain {
			if first || cert.NotBefore.After(e.notBefore) {
				e.notBefore = cert.NotBefore
			}
			if first || cert.NotAfter.Before(e.notAfter) {
				e.notAfter = cert.NotAfter
			}
			first = false
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, found := c.entries[key]; found {
		el.Value = e
		c.lru.MoveToFront(el)
		return
	}
	c.entries[key] = c.lru.PushFront(e)
	for c.lru.Len() > c.size {
		oldest := c.lru.Back()
		c.lru.Remove(oldest)
		delete(c.entries, oldest.Value.(*entry).key)
	}
}

// hashCerts hashes the presented certificates in order, each length-prefixed
// so two different lists never hash the same bytes.
func hashCerts(certs []*x509.Certificate) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	for _, cert := range certs {
		binary.BigEndian.PutUint64(n[:], uint64(len(cert.Raw)))
		h.Write(n[:])
		h.Write(cert.Raw)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
