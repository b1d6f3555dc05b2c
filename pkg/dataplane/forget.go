package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
)

// ForgetLearnedIn drops everything learned about the endpoints of vni inside
// prefix: the agent calls it when it cannot tell which endpoints of a subnet
// left their hosts (it missed some of the subnet's departures, or the subnet
// went). Traffic to them takes a relay again until a relay teaches a path.
func (d *Datapath) ForgetLearnedIn(vni uint32, prefix netip.Prefix) (err error) {
	defer d.invalidate(&err)
	if err := checkVNI(vni); err != nil {
		return err
	}
	if err := checkPrefix(prefix.Masked()); err != nil {
		return err
	}
	prefix = prefix.Masked()
	return d.forgetLearned(func(k mizarEndpointKey) bool {
		return k.Vni == vni && prefix.Contains(netip.AddrFrom4(k.Ip))
	})
}

// ForgetAllLearned empties the learned map: an agent starting over pins an
// earlier run filled cannot tell what left its host meanwhile.
func (d *Datapath) ForgetAllLearned() (err error) {
	defer d.invalidate(&err)
	return d.forgetLearned(func(mizarEndpointKey) bool { return true })
}

func (d *Datapath) forgetLearned(match func(mizarEndpointKey) bool) error {
	var (
		k    mizarEndpointKey
		v    mizarLearnedEntry
		dead []mizarEndpointKey
	)
	// Collected first: deleting while iterating a hash map restarts or
	// skips the walk.
	it := d.objs.Learned.Iterate()
	for it.Next(&k, &v) {
		if match(k) {
			dead = append(dead, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list learned endpoints: %w", err)
	}
	var errs []error
	for i := range dead {
		errs = append(errs, deleteKey(d.objs.Learned, &dead[i], "learned endpoint"))
	}
	return errors.Join(errs...)
}
