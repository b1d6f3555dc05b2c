package dataplane

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"

	"mizar.dev/pkg/dataplane/maglev"
)

// Services in the fast path (bpf/include/svc.h): with Options.Services the
// pod program translates a pod's TCP and UDP connections to a Service
// frontend (VIP, port, protocol) into one of its backends, chosen by the
// connection's hash in the Service's Maglev table (pkg/dataplane/maglev),
// and keeps the choice in a connection table for as long as the connection
// lives and its backend exists; the backend's replies leave its pod with
// the frontend as their source. Without Options.Services none of it is
// compiled in, and kube-proxy serves Services as before.
//
// IDs are kept stable: a frontend keeps its Service id (its slice of the
// Maglev array) and a backend (IP, port) its backend id for as long as they
// are programmed, across agent restarts too (read back from the pinned
// maps), so a change rewrites only what changed and connections tracked
// under an id stay valid.

// Limits of the Service maps, from the C enum svc_limits.
const (
	// MaglevTableSize is the slots of one Service's Maglev table (prime).
	MaglevTableSize = int(mizarSvcLimitsSVC_MAGLEV_M)
	// MaxServices is how many frontends (Service ports) a node can hold.
	MaxServices = int(mizarSvcLimitsSVC_MAX)
	// MaxServiceBackends is how many distinct backends a node can hold.
	MaxServiceBackends = int(mizarSvcLimitsSVC_BACKENDS_MAX)
)

// Protocol is an IP protocol number a Service frontend may use.
type Protocol uint8

// The protocols Services are translated for.
const (
	TCP Protocol = 6
	UDP Protocol = 17
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	}
	return fmt.Sprintf("Protocol(%d)", uint8(p))
}

// Frontend is what a Service's clients dial: a ClusterIP and one of its
// ports.
type Frontend struct {
	VIP   netip.Addr
	Port  uint16
	Proto Protocol
}

func (f Frontend) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(f.VIP, f.Port), f.Proto)
}

// Service is one frontend and the backends it is translated to. No
// backends means its connections are dropped (counted as drop_no_backend).
type Service struct {
	Frontend
	Backends []netip.AddrPort
	// AffinityTimeout is sessionAffinity ClientIP's timeout: a client's
	// new connections go to the backend of its last one while it is this
	// recent (and the backend exists); 0 means no affinity. Whole seconds.
	AffinityTimeout time.Duration
}

// ServicesEnabled reports whether the programs were loaded with
// Options.Services.
func (d *Datapath) ServicesEnabled() bool { return d.opts.Services }

// svcState is what the agent keeps besides the maps: the ids in use.
type svcState struct {
	loaded   bool
	ids      map[Frontend]uint32           // frontend -> Service id
	backends map[netip.AddrPort]uint32     // backend -> backend id
	members  map[Frontend][]netip.AddrPort // the backends each frontend's table holds
	ports    map[uint32]mizarSvcPortBits   // svc_ports as written (non-zero words)
	// The ids in use, and where the next search for a free one starts
	// (round robin: a freed id is not handed out again at once).
	svcTaken, beTaken map[uint32]bool
	svcNext, beNext   uint32
}

// errServicesOff refuses to program Services into programs without them.
var errServicesOff = errors.New("the datapath was loaded without Options.Services")

func (d *Datapath) svc() (*svcState, error) {
	if !d.opts.Services {
		return nil, errServicesOff
	}
	s := &d.svcs
	if s.loaded {
		return s, nil
	}
	s.ids = map[Frontend]uint32{}
	s.backends = map[netip.AddrPort]uint32{}
	s.members = map[Frontend][]netip.AddrPort{}
	s.ports = map[uint32]mizarSvcPortBits{}
	s.svcTaken, s.beTaken, s.beNext = map[uint32]bool{}, map[uint32]bool{}, 1
	var word uint32
	var bits mizarSvcPortBits
	pit := d.objs.SvcPorts.Iterate()
	for pit.Next(&word, &bits) {
		if bits.Frontend|bits.Backend != 0 {
			s.ports[word] = bits
		}
	}
	if err := pit.Err(); err != nil {
		return nil, fmt.Errorf("read Service ports: %w", err)
	}
	// Read back what an earlier agent programmed, so its ids stay.
	byID := map[uint32]netip.AddrPort{}
	var bid uint32
	var bv mizarSvcBackend
	it := d.objs.SvcBackends.Iterate()
	for it.Next(&bid, &bv) {
		a := netip.AddrPortFrom(netip.AddrFrom4(bv.Ip), ntohs(bv.Port))
		byID[bid] = a
		s.backends[a] = bid
		s.beTaken[bid] = true
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read Service backends: %w", err)
	}
	tables, err := d.readAllMaglev()
	if err != nil {
		return nil, err
	}
	var k mizarSvcKey
	var v mizarSvc
	fit := d.objs.SvcFrontends.Iterate()
	for fit.Next(&k, &v) {
		f := Frontend{VIP: netip.AddrFrom4(k.Vip), Port: ntohs(k.Port), Proto: Protocol(k.Proto)}
		s.ids[f] = v.Id
		s.svcTaken[v.Id] = true
		if v.Nbackends == 0 || v.Id >= uint32(MaxServices) {
			continue
		}
		table := tables[v.Id*uint32(MaglevTableSize) : (v.Id+1)*uint32(MaglevTableSize)]
		seen := map[uint32]bool{}
		for _, b := range table {
			if a, ok := byID[b]; ok && !seen[b] {
				seen[b] = true
				s.members[f] = append(s.members[f], a)
			}
		}
	}
	if err := fit.Err(); err != nil {
		return nil, fmt.Errorf("read Service frontends: %w", err)
	}
	s.loaded = true
	return s, nil
}

func (d *Datapath) readMaglev(id uint32) ([]uint32, error) {
	all, err := d.readAllMaglev()
	if err != nil {
		return nil, err
	}
	return all[id*uint32(MaglevTableSize) : (id+1)*uint32(MaglevTableSize)], nil
}

// readAllMaglev reads every Service's table at once (batches of the whole
// array: one lookup per slot would cost a syscall each).
func (d *Datapath) readAllMaglev() ([]uint32, error) {
	size := int(d.objs.SvcMaglev.MaxEntries())
	out := make([]uint32, 0, size)
	const chunk = 1 << 16
	keys, vals := make([]uint32, chunk), make([]uint32, chunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := d.objs.SvcMaglev.BatchLookup(&cursor, keys, vals, nil)
		out = append(out, vals[:n]...)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read the Maglev tables: %w", err)
		}
	}
	if len(out) != size {
		return nil, fmt.Errorf("read the Maglev tables: %d of %d slots", len(out), size)
	}
	return out, nil
}

func maglevKeys(id uint32) []uint32 {
	keys := make([]uint32, MaglevTableSize)
	for i := range keys {
		keys[i] = id*uint32(MaglevTableSize) + uint32(i)
	}
	return keys
}

func (s *Service) validate() error {
	if _, err := ipv4("Service VIP", s.VIP); err != nil {
		return err
	}
	if s.Port == 0 {
		return fmt.Errorf("Service %s: port 0", s.Frontend)
	}
	if s.Proto != TCP && s.Proto != UDP {
		return fmt.Errorf("Service %s: only TCP and UDP are translated", s.Frontend)
	}
	if s.AffinityTimeout < 0 || s.AffinityTimeout > 0 && s.AffinityTimeout < time.Second || s.AffinityTimeout > 24*time.Hour*365 {
		return fmt.Errorf("Service %s: affinity timeout %v out of range", s.Frontend, s.AffinityTimeout)
	}
	if len(s.Backends) > MaglevTableSize {
		return fmt.Errorf("Service %s: %d backends, at most %d", s.Frontend, len(s.Backends), MaglevTableSize)
	}
	for _, b := range s.Backends {
		if _, err := ipv4("Service backend", b.Addr()); err != nil {
			return err
		}
		if b.Port() == 0 {
			return fmt.Errorf("Service %s: backend %s has port 0", s.Frontend, b)
		}
	}
	return nil
}

func (f Frontend) key() mizarSvcKey {
	return mizarSvcKey{Vip: f.VIP.Unmap().As4(), Port: htons(f.Port), Proto: uint8(f.Proto)}
}

// UpsertService programs s: its backends, its Maglev table, then its
// frontend, so a packet never sees a table naming a backend not yet
// written. Backends no frontend uses any more are removed last.
func (d *Datapath) UpsertService(s Service) error {
	s.VIP = s.VIP.Unmap()
	if err := s.validate(); err != nil {
		return err
	}
	d.svcMu.Lock()
	defer d.svcMu.Unlock()
	st, err := d.svc()
	if err != nil {
		return err
	}
	return d.upsertService(st, s, true)
}

// upsertService programs s; settle removes the backends no frontend uses
// any more and clears the ports no Service needs (SetServices does it once
// at its end instead).
func (d *Datapath) upsertService(st *svcState, s Service, settle bool) error {
	backends := slices.Clone(s.Backends)
	for i := range backends {
		backends[i] = netip.AddrPortFrom(backends[i].Addr().Unmap(), backends[i].Port())
	}
	slices.SortFunc(backends, func(a, b netip.AddrPort) int { return a.Compare(b) })
	backends = slices.Compact(backends)

	// The ports' bits first: the program looks no further without them.
	want := st.wantPorts()
	want.add(s.Port, backends)
	if err := d.writePorts(st, want, true); err != nil {
		return err
	}

	id, ok := st.ids[s.Frontend]
	if !ok {
		var err error
		if id, err = freeID(st.svcTaken, &st.svcNext, 0, uint32(MaxServices)); err != nil {
			return fmt.Errorf("Service %s: %w", s.Frontend, err)
		}
	}
	names := make([]string, len(backends))
	bids := make([]uint32, len(backends))
	for i, b := range backends {
		bid, ok := st.backends[b]
		if !ok {
			var err error
			if bid, err = freeID(st.beTaken, &st.beNext, 1, uint32(MaxServiceBackends)); err != nil {
				return fmt.Errorf("Service %s: backend %s: %w", s.Frontend, b, err)
			}
			v := mizarSvcBackend{Ip: b.Addr().As4(), Port: htons(b.Port())}
			if err := d.objs.SvcBackends.Update(bid, v, ebpf.UpdateAny); err != nil {
				return fmt.Errorf("write Service backend %s: %w", b, err)
			}
			st.backends[b] = bid
			st.beTaken[bid] = true
		}
		names[i], bids[i] = b.String(), bid
	}
	if len(backends) > 0 {
		table, err := maglev.Table(names, MaglevTableSize)
		if err != nil {
			return fmt.Errorf("Service %s: %w", s.Frontend, err)
		}
		vals := make([]uint32, len(table))
		for i, b := range table {
			vals[i] = bids[b]
		}
		if err := d.writeMaglev(id, vals); err != nil {
			return fmt.Errorf("Service %s: %w", s.Frontend, err)
		}
	}
	v := mizarSvc{Id: id, Nbackends: uint32(len(backends)), AffinityS: uint32(s.AffinityTimeout / time.Second)}
	if err := d.objs.SvcFrontends.Update(s.Frontend.key(), v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write Service %s: %w", s.Frontend, err)
	}
	st.ids[s.Frontend] = id
	st.svcTaken[id] = true
	st.members[s.Frontend] = backends
	if err := d.writeSvcCount(len(st.ids)); err != nil {
		return err
	}
	if !settle {
		return nil
	}
	return d.settle(st)
}

// settle removes the backends no frontend uses and clears the ports no
// Service needs.
func (d *Datapath) settle(st *svcState) error {
	if err := d.gcBackends(st); err != nil {
		return err
	}
	return d.writePorts(st, st.wantPorts(), false)
}

// portBits is svc_ports' contents by word.
type portBits map[uint32]mizarSvcPortBits

func (p portBits) add(frontend uint16, backends []netip.AddrPort) {
	w := p[uint32(frontend)/32]
	w.Frontend |= 1 << (frontend % 32)
	p[uint32(frontend)/32] = w
	for _, b := range backends {
		w := p[uint32(b.Port())/32]
		w.Backend |= 1 << (b.Port() % 32)
		p[uint32(b.Port())/32] = w
	}
}

// wantPorts is svc_ports for the Services programmed.
func (st *svcState) wantPorts() portBits {
	p := portBits{}
	for f := range st.ids {
		p.add(f.Port, st.members[f])
	}
	return p
}

// writePorts writes want into svc_ports, only adding bits when onlyAdd.
func (d *Datapath) writePorts(st *svcState, want portBits, onlyAdd bool) error {
	words := map[uint32]bool{}
	for w := range want {
		words[w] = true
	}
	for w := range st.ports {
		words[w] = true
	}
	for w := range words {
		have, v := st.ports[w], want[w]
		if onlyAdd {
			v.Frontend |= have.Frontend
			v.Backend |= have.Backend
		}
		if v == have {
			continue
		}
		if err := d.objs.SvcPorts.Update(w, v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write Service ports: %w", err)
		}
		if v.Frontend|v.Backend == 0 {
			delete(st.ports, w)
		} else {
			st.ports[w] = v
		}
	}
	return nil
}

func (d *Datapath) writeMaglev(id uint32, vals []uint32) error {
	keys := maglevKeys(id)
	if _, err := d.objs.SvcMaglev.BatchUpdate(keys, vals, nil); err == nil {
		return nil
	} else if !errors.Is(err, ebpf.ErrNotSupported) {
		return fmt.Errorf("write Maglev table: %w", err)
	}
	for i, k := range keys {
		if err := d.objs.SvcMaglev.Update(k, vals[i], ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write Maglev table: %w", err)
		}
	}
	return nil
}

func (d *Datapath) writeSvcCount(n int) error {
	if err := d.objs.SvcState.Update(uint32(0), mizarSvcInfo{Nfrontends: uint32(n)}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write the Service count: %w", err)
	}
	return nil
}

// gcBackends removes the backends no frontend's table names any more.
// Connections still tracked to one are re-balanced by their next packet.
func (d *Datapath) gcBackends(st *svcState) error {
	used := map[netip.AddrPort]bool{}
	for _, bs := range st.members {
		for _, b := range bs {
			used[b] = true
		}
	}
	var errs []error
	for b, bid := range st.backends {
		if used[b] {
			continue
		}
		if err := deleteKey(d.objs.SvcBackends, bid, "Service backend"); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(st.backends, b)
		delete(st.beTaken, bid)
	}
	return errors.Join(errs...)
}

// DeleteService removes a frontend; its connections are no longer
// translated (nor their replies once their entries age out).
func (d *Datapath) DeleteService(f Frontend) error {
	f.VIP = f.VIP.Unmap()
	d.svcMu.Lock()
	defer d.svcMu.Unlock()
	st, err := d.svc()
	if err != nil {
		return err
	}
	return d.deleteService(st, f)
}

func (d *Datapath) deleteService(st *svcState, f Frontend) error {
	if _, ok := st.ids[f]; !ok {
		return nil
	}
	if err := deleteKey(d.objs.SvcFrontends, f.key(), "Service"); err != nil {
		return err
	}
	delete(st.svcTaken, st.ids[f])
	delete(st.ids, f)
	delete(st.members, f)
	if err := d.writeSvcCount(len(st.ids)); err != nil {
		return err
	}
	return d.settle(st)
}

// SetServices makes all the Services programmed: each upserted, every
// other frontend deleted (the agent's resync).
func (d *Datapath) SetServices(all []Service) error {
	want := map[Frontend]bool{}
	for i := range all {
		all[i].VIP = all[i].VIP.Unmap()
		if err := all[i].validate(); err != nil {
			return err
		}
		if want[all[i].Frontend] {
			return fmt.Errorf("Service %s given twice", all[i].Frontend)
		}
		want[all[i].Frontend] = true
	}
	d.svcMu.Lock()
	defer d.svcMu.Unlock()
	st, err := d.svc()
	if err != nil {
		return err
	}
	// Stale frontends first: their ids are free for the new ones.
	for f := range st.ids {
		if !want[f] {
			if err := d.deleteService(st, f); err != nil {
				return err
			}
		}
	}
	for _, s := range all {
		if err := d.upsertService(st, s, false); err != nil {
			return err
		}
	}
	return d.settle(st)
}

// Services reads back the programmed Services from the maps, sorted by
// frontend; each one's backends are those its Maglev table names.
func (d *Datapath) Services() ([]Service, error) {
	byID := map[uint32]netip.AddrPort{}
	var bid uint32
	var bv mizarSvcBackend
	it := d.objs.SvcBackends.Iterate()
	for it.Next(&bid, &bv) {
		byID[bid] = netip.AddrPortFrom(netip.AddrFrom4(bv.Ip), ntohs(bv.Port))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read Service backends: %w", err)
	}
	var out []Service
	var k mizarSvcKey
	var v mizarSvc
	var tables []uint32
	fit := d.objs.SvcFrontends.Iterate()
	for fit.Next(&k, &v) {
		s := Service{Frontend: Frontend{VIP: netip.AddrFrom4(k.Vip), Port: ntohs(k.Port), Proto: Protocol(k.Proto)},
			AffinityTimeout: time.Duration(v.AffinityS) * time.Second}
		if v.Nbackends > 0 && v.Id < uint32(MaxServices) {
			if tables == nil {
				var err error
				if tables, err = d.readAllMaglev(); err != nil {
					return nil, err
				}
			}
			table := tables[v.Id*uint32(MaglevTableSize) : (v.Id+1)*uint32(MaglevTableSize)]
			seen := map[uint32]bool{}
			for _, b := range table {
				if a, ok := byID[b]; ok && !seen[b] {
					seen[b] = true
					s.Backends = append(s.Backends, a)
				}
			}
			slices.SortFunc(s.Backends, func(a, b netip.AddrPort) int { return a.Compare(b) })
		}
		out = append(out, s)
	}
	if err := fit.Err(); err != nil {
		return nil, fmt.Errorf("read Service frontends: %w", err)
	}
	slices.SortFunc(out, func(a, b Service) int {
		if c := a.VIP.Compare(b.VIP); c != 0 {
			return c
		}
		if a.Port != b.Port {
			return int(a.Port) - int(b.Port)
		}
		return int(a.Proto) - int(b.Proto)
	})
	return out, nil
}

// serviceIDs returns the Service id of each programmed frontend (tests).
func (d *Datapath) serviceIDs() (map[Frontend]uint32, map[netip.AddrPort]uint32, error) {
	d.svcMu.Lock()
	defer d.svcMu.Unlock()
	st, err := d.svc()
	if err != nil {
		return nil, nil, err
	}
	return cloneMap(st.ids), cloneMap(st.backends), nil
}

func cloneMap[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// freeID returns the first id in [first, limit) not taken, searching from
// *next on and wrapping around, and moves *next past it.
func freeID(taken map[uint32]bool, next *uint32, first, limit uint32) (uint32, error) {
	n := limit - first
	start := *next
	if start < first || start >= limit {
		start = first
	}
	for i := range n {
		id := first + (start-first+i)%n
		if !taken[id] {
			*next = id + 1
			return id, nil
		}
	}
	return 0, fmt.Errorf("all %d ids in use", n)
}

// htons and ntohs: the programs are built for little-endian hosts only
// (bpfel), so network order is the swapped order.
func htons(v uint16) uint16 { return bits.ReverseBytes16(v) }
func ntohs(v uint16) uint16 { return bits.ReverseBytes16(v) }
