// Package maglev builds Maglev lookup tables (Eisenbud et al., "Maglev: A
// Fast and Reliable Software Network Load Balancer", NSDI 2016, section
// 3.4): a table of m slots, each naming a backend, such that every backend
// owns m/n slots (within one) and a change of the backend set moves few
// slots besides the ones it must. The datapath hashes a connection's
// 5-tuple to a slot, so a backend added or removed re-steers only about 1/n
// of new connections. Pure and deterministic: the same names give the same
// table on every node.
package maglev

import (
	"fmt"
	"hash/fnv"
	"slices"
)

// Table returns, for each of m slots, the index into names of the backend
// owning it. m must be prime (every skip then walks every slot) and names
// distinct; the order of names does not matter. An empty names gives nil.
func Table(names []string, m int) ([]int, error) {
	if !prime(m) {
		return nil, fmt.Errorf("maglev table size %d is not prime", m)
	}
	if len(names) == 0 {
		return nil, nil
	}
	if len(names) > m {
		return nil, fmt.Errorf("%d backends do not fit a table of %d slots", len(names), m)
	}
	// Filled in sorted order so the table depends on the set alone.
	order := make([]int, len(names))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case names[a] < names[b]:
			return -1
		case names[a] > names[b]:
			return 1
		}
		return 0
	})
	for i := 1; i < len(order); i++ {
		if names[order[i]] == names[order[i-1]] {
			return nil, fmt.Errorf("maglev: backend %q given twice", names[order[i]])
		}
	}
	offset := make([]uint64, len(names))
	skip := make([]uint64, len(names))
	next := make([]uint64, len(names))
	for _, i := range order {
		offset[i] = hash(names[i], 0x6d) % uint64(m)
		skip[i] = hash(names[i], 0x5a)%uint64(m-1) + 1
	}
	table := make([]int, m)
	for s := range table {
		table[s] = -1
	}
	filled := 0
	for {
		for _, i := range order {
			// The backend's next preferred slot that is still free.
			c := (offset[i] + next[i]*skip[i]) % uint64(m)
			for table[c] >= 0 {
				next[i]++
				c = (offset[i] + next[i]*skip[i]) % uint64(m)
			}
			table[c] = i
			next[i]++
			filled++
			if filled == m {
				return table, nil
			}
		}
	}
}

// hash is FNV-1a of name after a seed byte: two independent hashes of a
// name give its offset and skip.
func hash(name string, seed byte) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte{seed})
	_, _ = h.Write([]byte(name))
	return h.Sum64()
}

func prime(n int) bool {
	if n < 2 {
		return false
	}
	for d := 2; d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}
