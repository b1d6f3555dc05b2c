package endpoint

import (
	"container/heap"
	"sort"
	"strconv"
	"sync"
)

// waiters indexes the endpoints that wait for acknowledgements by the agents
// they wait for: an agent ("droplet/<name>", "bouncer/<name>" or
// "divider/<name>/<subnet>") has a heap of
// the resourceVersions awaited from it, so a watermark moving releases exactly
// the endpoints it now covers (an endpoint goes back on the queue once every
// agent it waits for has covered it) instead of every pending endpoint of a
// subnet or droplet. Reconcile registers a wait with what it found missing;
// events that change who an endpoint waits for (a bouncer going, a droplet
// being deleted) re-queue that agent's waiters, whose next Reconcile registers
// afresh. A registration replaces the endpoint's previous one; heap entries of
// replaced registrations are dropped when met.
type waiters struct {
	mu      sync.Mutex
	seq     uint64
	byKey   map[string]*waiter     // endpoint key -> its current wait
	byAgent map[string]*agentWaits // agent -> what is awaited from it
	// bySubnet holds endpoints that wait for their subnet or its first
	// Provisioned bouncer, which no watermark announces.
	bySubnet map[string]map[string]bool
}

type waiter struct {
	seq         uint64
	rv          uint64
	subnet      string
	outstanding map[string]bool // agents that have not yet covered rv
}

type agentWaits struct {
	heap rvHeap
	live int // entries of current registrations; the rest are stale
}

type entry struct {
	rv  uint64
	seq uint64
	key string
}

type rvHeap []entry

func (h rvHeap) Len() int           { return len(h) }
func (h rvHeap) Less(i, j int) bool { return h[i].rv < h[j].rv }
func (h rvHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *rvHeap) Push(x any)        { *h = append(*h, x.(entry)) }
func (h *rvHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func newWaiters() *waiters {
	return &waiters{byKey: map[string]*waiter{}, byAgent: map[string]*agentWaits{}, bySubnet: map[string]map[string]bool{}}
}

func dropletAgent(name string) string { return "droplet/" + name }
func bouncerAgent(name string) string { return "bouncer/" + name }

// dividerAgent is a divider as the agent of one subnet's endpoints: its
// watermarks are per subnet.
func dividerAgent(name, subnet string) string { return "divider/" + name + "/" + subnet }

// wait registers that key waits for agents to cover rv, and for its subnet's
// first bouncer if forSubnet. watermark reads an agent's current watermark: it
// is checked under the lock, so a watermark that moved since the caller looked
// is not missed. It reports whether nothing is left to wait for (the caller
// re-queues the endpoint).
func (w *waiters) wait(key, rv string, agents []string, subnet string, forSubnet bool, watermark func(agent string) string) bool {
	r, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return true // not a version a watermark can cover: let Reconcile decide
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.forgetLocked(key)
	w.seq++
	wt := &waiter{seq: w.seq, rv: r, subnet: subnet, outstanding: map[string]bool{}}
	for _, a := range agents {
		if !Applied(watermark(a), rv) {
			wt.outstanding[a] = true
		}
	}
	if len(wt.outstanding) == 0 && !forSubnet {
		return true
	}
	w.byKey[key] = wt
	for a := range wt.outstanding {
		aw := w.byAgent[a]
		if aw == nil {
			aw = &agentWaits{}
			w.byAgent[a] = aw
		}
		heap.Push(&aw.heap, entry{rv: r, seq: wt.seq, key: key})
		aw.live++
		aw.compact(w.byKey)
	}
	if forSubnet {
		if w.bySubnet[subnet] == nil {
			w.bySubnet[subnet] = map[string]bool{}
		}
		w.bySubnet[subnet][key] = true
	}
	return false
}

// forget drops key's wait (it is Provisioned, gone, or waits for nothing).
func (w *waiters) forget(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.forgetLocked(key)
}

func (w *waiters) forgetLocked(key string) {
	wt := w.byKey[key]
	if wt == nil {
		return
	}
	delete(w.byKey, key)
	for a := range wt.outstanding {
		if aw := w.byAgent[a]; aw != nil {
			aw.live--
		}
	}
	if s := w.bySubnet[wt.subnet]; s != nil {
		delete(s, key)
		if len(s) == 0 {
			delete(w.bySubnet, wt.subnet)
		}
	}
}

// covered records agent's new watermark and returns the endpoints that wait for
// nothing more.
func (w *waiters) covered(agent, watermark string) []string {
	wm, err := strconv.ParseUint(watermark, 10, 64)
	if err != nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	aw := w.byAgent[agent]
	if aw == nil {
		return nil
	}
	var ready []string
	for aw.heap.Len() > 0 && aw.heap[0].rv <= wm {
		e := heap.Pop(&aw.heap).(entry)
		wt := w.byKey[e.key]
		if wt == nil || wt.seq != e.seq || !wt.outstanding[agent] {
			continue // stale
		}
		aw.live--
		delete(wt.outstanding, agent)
		if len(wt.outstanding) == 0 && !w.bySubnet[wt.subnet][e.key] {
			delete(w.byKey, e.key)
			ready = append(ready, e.key)
		}
	}
	if aw.heap.Len() == 0 {
		delete(w.byAgent, agent)
	}
	return ready
}

// changed returns every endpoint waiting for agent, for an agent that changed
// in a way other than its watermark (it went, moved, stopped serving); with
// gone its entries are dropped. The endpoints keep their registration until
// their next Reconcile replaces it.
func (w *waiters) changed(agent string, gone bool) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	aw := w.byAgent[agent]
	if aw == nil {
		return nil
	}
	var keys []string
	for _, e := range aw.heap {
		if wt := w.byKey[e.key]; wt != nil && wt.seq == e.seq && wt.outstanding[agent] {
			keys = append(keys, e.key)
		}
	}
	if gone {
		delete(w.byAgent, agent)
		for _, k := range keys {
			delete(w.byKey[k].outstanding, agent)
		}
	}
	return keys
}

// subnetWaiters returns the endpoints waiting for subnet or its first bouncer.
func (w *waiters) subnetWaiters(subnet string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var keys []string
	for k := range w.bySubnet[subnet] {
		keys = append(keys, k)
	}
	return keys
}

// compact rebuilds the heap without stale entries once they dominate it, so an
// agent that stops acknowledging holds memory only for its live waiters.
func (aw *agentWaits) compact(byKey map[string]*waiter) {
	if len(aw.heap) < 1024 || len(aw.heap) < 4*aw.live {
		return
	}
	kept := aw.heap[:0]
	for _, e := range aw.heap {
		if wt := byKey[e.key]; wt != nil && wt.seq == e.seq {
			kept = append(kept, e)
		}
	}
	clear(aw.heap[len(kept):])
	aw.heap = kept
	heap.Init(&aw.heap)
}

// pending says what key still waits for: the agents that have not covered
// its version and whether it waits for its subnet's first bouncer. ok is
// false when it waits for nothing.
func (w *waiters) pending(key string) (agents []string, forSubnet, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	wt := w.byKey[key]
	if wt == nil {
		return nil, false, false
	}
	for a := range wt.outstanding {
		agents = append(agents, a)
	}
	sort.Strings(agents)
	return agents, w.bySubnet[wt.subnet][key], true
}
