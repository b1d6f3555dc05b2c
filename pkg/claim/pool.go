package claim

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"sync"
)

// ErrExhausted means every value of a range is claimed.
var ErrExhausted = errors.New("no free value left")

// Range is a set of values handed out lowest first, each claimed under
// Prefix+Format(v).
type Range struct {
	Prefix string // ends in "/"
	// Space names what the values mean (a subnet's cidr): an index built for
	// another space under the same prefix is rebuilt.
	Space  string
	Lo, Hi uint32 // inclusive
	// Reserved values are never handed out (a subnet's gateway).
	Reserved []uint32
	Format   func(v uint32) string
	Parse    func(s string) (uint32, bool)
}

// Next takes the lowest free value of r from an in-memory index of the range
// (loaded from etcd once, then kept by this server's own claims and releases),
// so finding a value costs the same in an empty or a full range. The index is a
// hint: etcd decides when the value is claimed; a range that looks full is
// reloaded before it is called exhausted. The value stays marked used until
// its claim is released, or Unused says it was never written.
func (s *Store) Next(ctx context.Context, r Range) (uint32, error) {
	p := s.pools.get(r)
	v, ok, err := p.next(ctx, s)
	if err != nil || ok {
		return v, err
	}
	if err := p.load(ctx, s); err != nil {
		return 0, err
	}
	if v, ok, err = p.next(ctx, s); err != nil || ok {
		return v, err
	}
	return 0, ErrExhausted
}

// NextFrom is Next, but takes the lowest free value at or above start
// (wrapping around to the lowest free one below it): creates that lost a
// value to another replica's create look apart from it, instead of all
// trying the same lowest values again.
func (s *Store) NextFrom(ctx context.Context, r Range, start uint32) (uint32, error) {
	p := s.pools.get(r)
	v, ok, err := p.nextFrom(ctx, s, start)
	if err != nil || ok {
		return v, err
	}
	return s.Next(ctx, r)
}

// pools are the in-memory indexes of ranges, by prefix.
type pools struct {
	mu sync.Mutex
	m  map[string]*pool
}

func (ps *pools) get(r Range) *pool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.m == nil {
		ps.m = map[string]*pool{}
	}
	p := ps.m[r.Prefix]
	if p == nil || !sameRange(p.r, r) {
		// New, or the range under this prefix changed (a subnet re-created with another cidr).
		p = &pool{r: r}
		ps.m[r.Prefix] = p
	}
	return p
}

func sameRange(a, b Range) bool {
	if a.Space != b.Space || a.Lo != b.Lo || a.Hi != b.Hi || len(a.Reserved) != len(b.Reserved) {
		return false
	}
	for i := range a.Reserved {
		if a.Reserved[i] != b.Reserved[i] {
			return false
		}
	}
	return true
}

// released frees the value of key in its range's index, if it is indexed here.
func (ps *pools) released(key string) {
	if p, v, ok := ps.lookup(key); ok {
		p.free(v)
	}
}

// lookup finds the index holding key and the value key names.
func (ps *pools) lookup(key string) (*pool, uint32, bool) {
	i := strings.LastIndexByte(key, '/')
	if i < 0 {
		return nil, 0, false
	}
	ps.mu.Lock()
	p := ps.m[key[:i+1]]
	ps.mu.Unlock()
	if p == nil {
		return nil, 0, false
	}
	v, ok := p.r.Parse(key[i+1:])
	return p, v, ok
}

func (ps *pools) forget(prefix string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	delete(ps.m, prefix)
}

// pool is a bitmap of the used values of a range with the lowest word that may
// have a free bit, so finding the lowest free value is amortized O(1) while a
// range fills and O(1) again after a value below is freed.
type pool struct {
	r      Range
	mu     sync.Mutex
	loaded bool
	words  map[uint32]uint64 // (v-Lo)/64 -> used bits; absent = all free
	hint   uint32            // no word below hint has a free bit
}

func (p *pool) load(ctx context.Context, s *Store) error {
	keys, err := s.keys(ctx, p.r.Prefix)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.words, p.hint, p.loaded = map[uint32]uint64{}, 0, true
	for _, v := range p.r.Reserved {
		p.mark(v)
	}
	for _, k := range keys {
		if v, ok := p.r.Parse(strings.TrimPrefix(k, p.r.Prefix)); ok {
			p.mark(v)
		}
	}
	return nil
}

// ensureLoaded reads the pool's index from s the first time it is needed.
func (p *pool) ensureLoaded(ctx context.Context, s *Store) error {
	p.mu.Lock()
	loaded := p.loaded
	p.mu.Unlock()
	if loaded {
		return nil
	}
	if err := p.load(ctx, s); err != nil {
		return fmt.Errorf("loading the index of %s: %w", p.r.Prefix, err)
	}
	return nil
}

// next marks the lowest free value used and returns it.
func (p *pool) next(ctx context.Context, s *Store) (uint32, bool, error) {
	if err := p.ensureLoaded(ctx, s); err != nil {
		return 0, false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	span := p.r.Hi - p.r.Lo
	for w := p.hint; w <= span/64; w++ {
		used := p.words[w]
		if used == ^uint64(0) {
			continue
		}
		p.hint = w
		v := p.r.Lo + w*64 + uint32(bits.TrailingZeros64(^used))
		if v > p.r.Hi || v < p.r.Lo {
			break
		}
		p.mark(v)
		return v, true, nil
	}
	return 0, false, nil
}

// nextFrom marks the lowest free value at or above start used and returns it;
// false when there is none up to the range's end.
func (p *pool) nextFrom(ctx context.Context, s *Store, start uint32) (uint32, bool, error) {
	if err := p.ensureLoaded(ctx, s); err != nil {
		return 0, false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if start < p.r.Lo || start > p.r.Hi {
		return 0, false, nil
	}
	o := start - p.r.Lo
	for w := o / 64; w <= (p.r.Hi-p.r.Lo)/64; w++ {
		used := p.words[w]
		if w == o/64 {
			used |= 1<<(o%64) - 1 // the values below start are not looked at
		}
		if used == ^uint64(0) {
			continue
		}
		v := p.r.Lo + w*64 + uint32(bits.TrailingZeros64(^used))
		if v > p.r.Hi {
			break
		}
		p.mark(v)
		return v, true, nil
	}
	return 0, false, nil
}

func (p *pool) mark(v uint32) {
	if v < p.r.Lo || v > p.r.Hi {
		return
	}
	o := v - p.r.Lo
	p.words[o/64] |= 1 << (o % 64)
}

func (p *pool) free(v uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.loaded || v < p.r.Lo || v > p.r.Hi {
		return
	}
	for _, r := range p.r.Reserved {
		if r == v {
			return
		}
	}
	o := v - p.r.Lo
	if p.words[o/64] &^= 1 << (o % 64); p.words[o/64] == 0 {
		delete(p.words, o/64)
	}
	if o/64 < p.hint {
		p.hint = o / 64
	}
}
