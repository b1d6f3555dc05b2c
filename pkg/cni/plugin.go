package cni

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

// SpecVersions are the CNI spec versions the plugin speaks.
var SpecVersions = version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0")

// Budgets per command. ADD waits for the endpoint to be Provisioned inside
// the agent, which has its own, shorter, timeout and says what it waited for.
// DEL stays well inside kubelet's patience: past it, the DEL is queued.
const (
	addTimeout    = 2 * time.Minute
	delTimeout    = 10 * time.Second
	statusTimeout = 10 * time.Second
)

// Funcs returns the plugin's command implementations for skel.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{
		Add:    func(a *skel.CmdArgs) error { return run(a, CmdAdd, addTimeout) },
		Del:    cmdDel,
		Check:  func(a *skel.CmdArgs) error { return run(a, CmdCheck, addTimeout) },
		GC:     func(a *skel.CmdArgs) error { return run(a, CmdGC, addTimeout) },
		Status: func(a *skel.CmdArgs) error { return run(a, CmdStatus, statusTimeout) },
	}
}

// Main is cmd/cni's whole body.
func Main() {
	skel.PluginMainFuncs(Funcs(), SpecVersions, "mizar CNI plugin: pods on mizar VPCs (forwards to mizar-nodeagent)")
}

func request(a *skel.CmdArgs, cmd string) *Request {
	return &Request{Command: cmd, ContainerID: a.ContainerID, Netns: a.Netns, IfName: a.IfName, Args: a.Args, Config: a.StdinData}
}

// run forwards one command and prints its result.
func run(a *skel.CmdArgs, cmd string, budget time.Duration) error {
	conf, cerr := ParseConf(a.StdinData)
	if cerr != nil {
		return cerr
	}
	if cmd == CmdAdd {
		if cerr := conf.CheckPlacement(); cerr != nil {
			return cerr
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	rep, err := call(ctx, conf.AgentSocket, request(a, cmd))
	if err != nil {
		if errors.Is(err, errAgentDown) {
			if cmd == CmdStatus {
				return types.NewError(50, "mizar-nodeagent is not running on this node: pods cannot be added", err.Error())
			}
			return types.NewError(types.ErrTryAgainLater, "mizar-nodeagent is not running on this node; start it and retry", err.Error())
		}
		return types.NewError(types.ErrIOFailure, "mizar: talking to mizar-nodeagent failed", err.Error())
	}
	if rep.Error != nil {
		return rep.Error
	}
	if cmd != CmdAdd {
		return nil
	}
	res, err := types100.NewResult(rep.Result)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "mizar: mizar-nodeagent's result cannot be decoded", err.Error())
	}
	if err := types.PrintResult(res, conf.CNIVersion); err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("mizar: printing the result as CNI %s", conf.CNIVersion), err.Error())
	}
	return nil
}

// cmdDel forwards a DEL; when the agent cannot be reached it queues the DEL on
// disk for the agent's next start and reports success, so the runtime can go
// on tearing the pod down.
func cmdDel(a *skel.CmdArgs) error {
	conf, cerr := ParseConf(a.StdinData)
	if cerr != nil {
		return cerr
	}
	req := request(a, CmdDel)
	ctx, cancel := context.WithTimeout(context.Background(), delTimeout)
	defer cancel()
	rep, err := call(ctx, conf.AgentSocket, req)
	if err != nil {
		if qerr := Enqueue(conf.DeleteQueue, req); qerr != nil {
			return types.NewError(types.ErrIOFailure, "mizar: mizar-nodeagent is unreachable and the delete could not be queued",
				errors.Join(err, qerr).Error())
		}
		return nil
	}
	if rep.Error != nil {
		return rep.Error
	}
	return nil
}
