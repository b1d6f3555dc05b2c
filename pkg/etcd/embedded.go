package etcd

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// MaxRequestBytes is the largest request the embedded member accepts: etcd's
// default, set explicitly because the apiserver caps bodies and objects below it.
// An external etcd must allow at least as much (--max-request-bytes).
const MaxRequestBytes = 3 << 19 // 1.5 MiB

// maxSocketPath is the kernel's limit on a unix socket path (sun_path less the NUL).
const maxSocketPath = 107

// EmbeddedOptions configure the single-member etcd a standalone mizar runs in-process.
type EmbeddedOptions struct {
	// Dir holds etcd's data and its sockets.
	Dir string
	// UnsafeNoFsync trades durability for speed; only tests should set it.
	UnsafeNoFsync bool
}

// Embedded is a running in-process etcd member.
type Embedded struct {
	etcd      *embed.Etcd
	endpoints []string
	closing   atomic.Bool
}

// StartEmbedded starts a single-member etcd in opts.Dir, serving clients on a unix
// socket inside that directory: nothing listens on the
// network and two servers on one machine never race for a TCP port.
func StartEmbedded(opts EmbeddedOptions) (*Embedded, error) {
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: resolving %q: %w", opts.Dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded etcd: creating %s: %w", dir, err)
	}
	client := filepath.Join(dir, "client.sock")
	if len(client) > maxSocketPath {
		return nil, fmt.Errorf("embedded etcd: data directory %s is too long for a unix socket path (%d > %d bytes); choose a shorter --data-dir", dir, len(client), maxSocketPath)
	}
	// A socket left by a crashed run would make the listen fail.
	if err := os.Remove(client); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("embedded etcd: removing stale socket: %w", err)
	}

	e := &Embedded{endpoints: []string{(&url.URL{Scheme: "unix", Path: client}).String()}}
	cfg := embed.NewConfig()
	cfg.Name = "mizar"
	cfg.Dir = filepath.Join(dir, "data")
	cfg.UnsafeNoFsync = opts.UnsafeNoFsync
	cfg.MaxRequestBytes = MaxRequestBytes
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(e.logger())
	cfg.ListenClientUrls = []url.URL{{Scheme: "unix", Path: client}}
	// Only gRPC clients talk to it; the JSON gateway would dial the socket itself
	// and spam warnings while the listener starts.
	cfg.EnableGRPCGateway = false
	// etcd insists advertised URLs be host:port. Nobody discovers this member
	// through them (clients are handed the socket), so they are placeholders, and
	// with no peers it needs no peer listener either.
	cfg.AdvertiseClientUrls = []url.URL{{Scheme: "http", Host: "localhost:2379"}}
	cfg.ListenPeerUrls = nil
	cfg.AdvertisePeerUrls = []url.URL{{Scheme: "http", Host: "localhost:2380"}}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// The apiserver's watch cache serves consistent lists once etcd tells it how far
	// it has caught up; frequent progress notifications keep those lists fast.
	cfg.WatchProgressNotifyInterval = 5 * time.Second

	if e.etcd, err = embed.StartEtcd(cfg); err != nil {
		return nil, fmt.Errorf("embedded etcd: starting in %s: %w", dir, err)
	}
	select {
	case <-e.etcd.Server.ReadyNotify():
	case err := <-e.etcd.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(time.Minute):
		e.Close()
		return nil, fmt.Errorf("embedded etcd: not ready after a minute in %s", dir)
	}
	return e, nil
}

// logger writes etcd's errors to stderr, except while it shuts down: etcd then
// reports every listener it closes as a failure, which would only alarm people.
func (e *Embedded) logger() *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.Lock(os.Stderr), zapcore.ErrorLevel)
	return zap.New(&quietOnClose{Core: core, closing: &e.closing}).Named("etcd")
}

type quietOnClose struct {
	zapcore.Core
	closing *atomic.Bool
}

func (q *quietOnClose) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if q.closing.Load() {
		return ce
	}
	return q.Core.Check(ent, ce)
}

func (q *quietOnClose) With(fields []zapcore.Field) zapcore.Core {
	return &quietOnClose{Core: q.Core.With(fields), closing: q.closing}
}

// Endpoints are the client URLs, in the form --etcd-servers takes.
func (e *Embedded) Endpoints() []string { return e.endpoints }

// Close stops the member; its data stays in the directory for the next start.
func (e *Embedded) Close() {
	e.closing.Store(true)
	e.etcd.Close()
}
