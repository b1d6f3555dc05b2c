// Package leader runs work in one replica at a time: replicas campaign in an
// election on mizar's own etcd (mizar-apiserver serves no Lease kind), and a
// replica that loses its etcd session stops acting before another takes over.
// The networking operators and the broker's fulfillment operator each elect
// their own leader under their own key.
package leader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/klog/v2"
)

// Options configure one replica's campaign.
type Options struct {
	// Etcd is mizar's own etcd, where the election runs.
	Etcd *clientv3.Client
	// Key is the etcd prefix the replicas campaign under.
	Key string
	// Name says what is led, in logs (e.g. "Operators").
	Name string
	// Identity names this replica in the election; defaults to NewIdentity().
	Identity string
	// LeaseTTL is how long a silent leader keeps leadership, in seconds; default 5.
	LeaseTTL int
	// OnLeading, if set, is told when this replica starts and stops leading.
	OnLeading func(leading bool)
	// LeaseFile, if set, is a file only this replica uses (in its data
	// directory) where it keeps the id of its etcd lease, locked (flock) for
	// as long as the process lives. A replica restarted after a crash finds
	// the file unlocked, so the process that held the lease is dead: it
	// revokes that lease and is elected at once instead of waiting out the
	// TTL. A file still locked (another live process) is left alone.
	LeaseFile string
}

// NewIdentity is the host name and a random suffix.
func NewIdentity() string {
	host, _ := os.Hostname()
	return host + "-" + utilrand.String(6)
}

// Run campaigns until ctx ends and runs work while leading. work must return
// once its context ends; every request it makes should carry that context, so
// acting stops the moment leadership does.
func Run(ctx context.Context, o Options, work func(context.Context) error) error {
	if o.Etcd == nil || o.Key == "" {
		return errors.New("leader: an etcd client and an election key are required")
	}
	if o.Identity == "" {
		o.Identity = NewIdentity()
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = 5
	}
	if o.Name == "" {
		o.Name = o.Key
	}
	var leaseFile *os.File
	if o.LeaseFile != "" {
		leaseFile = takeOverDeadLease(ctx, o)
		if leaseFile != nil {
			defer leaseFile.Close() // releases the lock
		}
	}
	for ctx.Err() == nil {
		if err := lead(ctx, o, leaseFile, work); err != nil && ctx.Err() == nil {
			klog.ErrorS(err, o.Name+": leadership ended; campaigning again", "identity", o.Identity)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// lead waits to be elected, then runs work until leadership or ctx ends.
func lead(ctx context.Context, o Options, leaseFile *os.File, work func(context.Context) error) error {
	session, err := concurrency.NewSession(o.Etcd, concurrency.WithTTL(o.LeaseTTL), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("etcd session: %w", err)
	}
	defer session.Close() // revokes the lease: a clean stop hands over at once
	if leaseFile != nil {
		// Before campaigning: a crash after this leaves the lease to revoke.
		if err := writeLease(leaseFile, session.Lease()); err != nil {
			klog.ErrorS(err, o.Name+": recording the etcd lease; a restart after a crash will wait for it to expire", "file", o.LeaseFile)
		}
	}
	election := concurrency.NewElection(session, o.Key)
	if err := election.Campaign(ctx, o.Identity); err != nil {
		return fmt.Errorf("campaigning: %w", err)
	}
	klog.InfoS(o.Name+": elected leader", "identity", o.Identity)
	leadCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-session.Done(): // lease lost: another replica may lead now
			klog.InfoS(o.Name+": etcd session lost; stopping", "identity", o.Identity)
			cancel()
		case <-leadCtx.Done():
		}
	}()
	if o.OnLeading != nil {
		o.OnLeading(true)
	}
	// Acting stops the moment leadCtx ends: every request work makes carries
	// it. Waiting for its goroutines to wind down comes after.
	stopped := make(chan struct{})
	go func() {
		<-leadCtx.Done()
		if o.OnLeading != nil {
			o.OnLeading(false)
		}
		close(stopped)
	}()
	err = work(leadCtx)
	cancel()
	<-stopped
	resignCtx, done := context.WithTimeout(context.Background(), 2*time.Second)
	defer done()
	_ = election.Resign(resignCtx)
	return err
}

// takeOverDeadLease locks o.LeaseFile and revokes the lease it names, which a
// dead process of this replica held. It returns the locked file, or nil when
// it cannot be used (then the TTL is waited out, as without it).
func takeOverDeadLease(ctx context.Context, o Options) *os.File {
	f, err := os.OpenFile(o.LeaseFile, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		klog.ErrorS(err, o.Name+": opening the lease file", "file", o.LeaseFile)
		return nil
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		// Another live process uses it: its lease is not ours to end.
		klog.InfoS(o.Name+": lease file locked by another process; not using it", "file", o.LeaseFile, "err", err)
		f.Close()
		return nil
	}
	b, err := io.ReadAll(f)
	if err != nil {
		klog.ErrorS(err, o.Name+": reading the lease file", "file", o.LeaseFile)
		return f
	}
	id, err := strconv.ParseInt(strings.TrimSpace(string(b)), 16, 64)
	if err != nil || id == 0 {
		return f
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := o.Etcd.Revoke(rctx, clientv3.LeaseID(id)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		klog.ErrorS(err, o.Name+": revoking the lease of this replica's previous process", "lease", fmt.Sprintf("%x", id))
	} else if err == nil {
		klog.InfoS(o.Name+": revoked the lease of this replica's previous process, which is gone", "lease", fmt.Sprintf("%x", id))
	}
	return f
}

func writeLease(f *os.File, id clientv3.LeaseID) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt([]byte(fmt.Sprintf("%x\n", int64(id))), 0); err != nil {
		return err
	}
	return f.Sync()
}
