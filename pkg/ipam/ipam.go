// Package ipam chooses free VNIs and IPv4 host addresses. It is pure: callers
// pass what is in use (read from the API under a lock), so every allocation is
// persisted in the object that holds it and nothing lives only in memory.
package ipam

import (
	"errors"
	"net/netip"
)

// ErrExhausted means every candidate is in use.
var ErrExhausted = errors.New("no free value left")

// Broadcast returns the last address of an IPv4 prefix.
func Broadcast(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= uint32(1)<<(32-p.Bits()) - 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// FirstFreeHost returns the lowest host address of p (neither the network nor the
// broadcast address) that is not in used.
func FirstFreeHost(p netip.Prefix, used map[netip.Addr]bool) (netip.Addr, error) {
	last := Broadcast(p)
	for a := p.Masked().Addr().Next(); a.IsValid() && a.Less(last); a = a.Next() {
		if !used[a] {
			return a, nil
		}
	}
	return netip.Addr{}, ErrExhausted
}

// FirstFreeVNI returns the lowest VNI in [1, maxVNI] that is not in used.
func FirstFreeVNI(used map[int32]bool, maxVNI int32) (int32, error) {
	for v := int32(1); v <= maxVNI; v++ {
		if !used[v] {
			return v, nil
		}
	}
	return 0, ErrExhausted
}
