package dropletrestriction

import (
	"testing"

	"k8s.io/apiserver/pkg/authentication/user"
)

func TestDropletOf(t *testing.T) {
	for _, c := range []struct {
		u    user.Info
		want string
		ok   bool
	}{
		{&user.DefaultInfo{Name: "mizar:droplet:node-1", Groups: []string{Group}}, "node-1", true},
		{&user.DefaultInfo{Name: "mizar:droplet:node-1"}, "", false},                    // not in the group
		{&user.DefaultInfo{Name: "admin", Groups: []string{Group}}, "", false},          // not a droplet user
		{&user.DefaultInfo{Name: "mizar:droplet:", Groups: []string{Group}}, "", false}, // no name
		{nil, "", false},
	} {
		got, ok := DropletOf(c.u)
		if got != c.want || ok != c.ok {
			t.Errorf("DropletOf(%v) = %q, %v; want %q, %v", c.u, got, ok, c.want, c.ok)
		}
	}
}
