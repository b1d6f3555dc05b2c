package etcd

import (
	"fmt"
	"strings"

	"google.golang.org/grpc/grpclog"
	"k8s.io/klog/v2"
)

// QuietGRPCLog routes gRPC's log to klog as k8s.io/apiserver does, but drops the
// warnings gRPC writes when a client closes a connection it was still dialing
// ("createTransport failed ... use of closed network connection"): the
// apiserver's short-lived etcd clients cause a batch of them at every start and
// stop, and they never mean anything is wrong. Warnings about etcd being
// unreachable still show. Call before any etcd client is created.
func QuietGRPCLog() { grpclog.SetLoggerV2(quietGRPC{}) }

// grpcDepth skips this file and gRPC's own logging frames, so klog names the caller.
const grpcDepth = 4

type quietGRPC struct{}

func (quietGRPC) Info(args ...any) {
	if v := klog.V(5); v.Enabled() {
		v.InfoSDepth(grpcDepth, fmt.Sprint(args...))
	}
}
func (q quietGRPC) Infoln(args ...any)               { q.Info(fmt.Sprintln(args...)) }
func (q quietGRPC) Infof(format string, args ...any) { q.Info(fmt.Sprintf(format, args...)) }

func (quietGRPC) Warning(args ...any) {
	msg := fmt.Sprint(args...)
	if strings.Contains(msg, "use of closed network connection") {
		return
	}
	klog.WarningDepth(grpcDepth, msg)
}
func (q quietGRPC) Warningln(args ...any)               { q.Warning(fmt.Sprintln(args...)) }
func (q quietGRPC) Warningf(format string, args ...any) { q.Warning(fmt.Sprintf(format, args...)) }

func (quietGRPC) Error(args ...any)   { klog.ErrorDepth(grpcDepth, args...) }
func (quietGRPC) Errorln(args ...any) { klog.ErrorDepth(grpcDepth, fmt.Sprintln(args...)) }
func (quietGRPC) Errorf(format string, args ...any) {
	klog.ErrorDepth(grpcDepth, fmt.Sprintf(format, args...))
}
func (quietGRPC) Fatal(args ...any)   { klog.FatalDepth(grpcDepth, args...) }
func (quietGRPC) Fatalln(args ...any) { klog.FatalDepth(grpcDepth, fmt.Sprintln(args...)) }
func (quietGRPC) Fatalf(format string, args ...any) {
	klog.FatalDepth(grpcDepth, fmt.Sprintf(format, args...))
}
func (quietGRPC) V(l int) bool { return klog.V(klog.Level(l)).Enabled() }
