// Package apiserver is mizar-apiserver: the aggregated Kubernetes API server that
// serves networking.mizar.dev from its own etcd, either behind kube-apiserver or
// standalone on loopback.
package apiserver

import (
	"fmt"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/endpoints/openapi"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/kubernetes"

	"mizar.dev/pkg/admission/dropletrestriction"
	"mizar.dev/pkg/claim"
	"mizar.dev/pkg/etcd"
	generatedopenapi "mizar.dev/pkg/generated/openapi"
	"mizar.dev/pkg/operators"
	"mizar.dev/pkg/registry"
	brokerrest "mizar.dev/pkg/registry/broker/rest"
	networkingrest "mizar.dev/pkg/registry/networking/rest"
)

// Config is everything New needs.
type Config struct {
	Generic *genericapiserver.RecommendedConfig
	// Claims keeps the values no two objects may share (VNIs, addresses, ...).
	Claims *claim.Store
	// ClaimRepairPeriod is how often orphaned claims are looked for
	// (DefaultClaimRepairPeriod when 0).
	ClaimRepairPeriod time.Duration
	// Operators, when set, runs mizar's operators (leader-elected through this
	// etcd client) once the server serves.
	Operators *clientv3.Client
	// OperatorsClientQPS and OperatorsClientBurst limit each operator's client
	// (client-go's defaults when 0).
	OperatorsClientQPS   float32
	OperatorsClientBurst int
	// NodeAgentServiceAccounts are the user names of the node agents'
	// ServiceAccounts, whose writes dropletrestriction binds to their token's node.
	NodeAgentServiceAccounts []string
	// NoGarbageCollector: no garbage collector serves this server (standalone).
	NoGarbageCollector bool
	// Events, when set, receives the operators' Kubernetes Events.
	Events kubernetes.Interface
	// StuckAfter is how long an object may wait in Init before its Event.
	StuckAfter time.Duration

	// endpointSlices, when set, is the authorizer that reads the networking
	// storage this builds.
	endpointSlices *sliceAuthorizer
}

// DefaultClaimRepairPeriod is how often orphaned claims are looked for, as kube-apiserver
// repairs its service IP and port allocations.
const DefaultClaimRepairPeriod = 3 * time.Minute

// Server is a mizar-apiserver ready to run.
type Server struct {
	GenericAPIServer *genericapiserver.GenericAPIServer
	operatorsStarted atomic.Bool
	operatorsDone    chan struct{}
}

// WaitOperators returns once the operators, if they were started, have stopped.
func (s *Server) WaitOperators() {
	if s.operatorsStarted.Load() {
		<-s.operatorsDone
	}
}

// NewRecommendedConfig returns the generic configuration with mizar's OpenAPI
// (v2 and v3: server-side apply and kubectl explain are built on the v3 models).
func NewRecommendedConfig() *genericapiserver.RecommendedConfig {
	c := genericapiserver.NewRecommendedConfig(Codecs)
	c.BuildHandlerChainFunc = buildHandlerChain
	// A body etcd could never store is refused with 413 before it is decoded.
	c.MaxRequestBodyBytes = etcd.MaxRequestBytes
	namer := openapi.NewDefinitionNamer(Scheme)
	c.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(generatedopenapi.GetOpenAPIDefinitions, namer)
	c.OpenAPIConfig.Info.Title = "mizar"
	c.OpenAPIConfig.Info.Version = "v1alpha1"
	c.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(generatedopenapi.GetOpenAPIDefinitions, namer)
	c.OpenAPIV3Config.Info.Title = "mizar"
	c.OpenAPIV3Config.Info.Version = "v1alpha1"
	return c
}

// New builds the server and installs its API groups.
func (c *Config) New() (*Server, error) {
	// Node agents write only their own droplet's objects, whoever authorized them.
	if c.Generic.AdmissionControl == nil {
		c.Generic.AdmissionControl = dropletrestriction.New(c.NodeAgentServiceAccounts...)
	} else {
		c.Generic.AdmissionControl = admission.NewChainHandler(c.Generic.AdmissionControl, dropletrestriction.New(c.NodeAgentServiceAccounts...))
	}
	generic, err := c.Generic.Complete().New("mizar-apiserver", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, fmt.Errorf("building the generic server: %w", err)
	}
	networking, repairers, err := networkingrest.StorageProvider{Scheme: Scheme, Codecs: Codecs, Claims: c.Claims, Operators: c.Operators != nil,
		NoGarbageCollector: c.NoGarbageCollector}.
		NewAPIGroupInfo(c.Generic.RESTOptionsGetter)
	if err != nil {
		return nil, fmt.Errorf("networking.mizar.dev storage: %w", err)
	}
	if c.endpointSlices != nil {
		if err := c.endpointSlices.useStorage(networking.VersionedResourcesStorageMap["v1alpha1"]); err != nil {
			return nil, err
		}
	}
	generic.AddPostStartHookOrDie("mizar-repair-claims", func(ctx genericapiserver.PostStartHookContext) error {
		period := c.ClaimRepairPeriod
		if period == 0 {
			period = DefaultClaimRepairPeriod
		}
		go registry.RepairLoop(ctx, repairers, period)
		return nil
	})
	brokerGroup, err := brokerrest.StorageProvider{Scheme: Scheme, Codecs: Codecs, Claims: c.Claims}.NewAPIGroupInfo(c.Generic.RESTOptionsGetter)
	if err != nil {
		return nil, fmt.Errorf("broker.mizar.dev storage: %w", err)
	}
	if err := generic.InstallAPIGroups(networking, brokerGroup); err != nil {
		return nil, fmt.Errorf("installing API groups: %w", err)
	}
	s := &Server{GenericAPIServer: generic, operatorsDone: make(chan struct{})}
	if etcd := c.Operators; etcd != nil {
		generic.AddPostStartHookOrDie("mizar-operators", func(hook genericapiserver.PostStartHookContext) error {
			s.operatorsStarted.Store(true)
			go func() {
				defer close(s.operatorsDone)
				// In process: every watch event and status write of the
				// operators skips TLS and HTTP/2 framing on both ends.
				_ = operators.Run(hook, operators.Options{Config: inProcessConfig(hook.LoopbackClientConfig, generic.Handler), Etcd: etcd,
					ClientQPS: c.OperatorsClientQPS, ClientBurst: c.OperatorsClientBurst, Events: c.Events, StuckAfter: c.StuckAfter})
			}()
			return nil
		})
	}
	return s, nil
}
