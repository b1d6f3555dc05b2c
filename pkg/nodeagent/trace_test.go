package nodeagent

import (
	"testing"

	"mizar.dev/pkg/agentapi"
	"mizar.dev/pkg/dataplane"
)

// The agent serves dataplane's TraceNext as agentapi's Next strings.
func TestTraceNextNames(t *testing.T) {
	for dp, api := range map[dataplane.TraceNext]string{dataplane.NextDrop: agentapi.NextDrop, dataplane.NextUnderlay: agentapi.NextUnderlay,
		dataplane.NextPod: agentapi.NextPod, dataplane.NextHost: agentapi.NextHost, dataplane.NextReply: agentapi.NextReply} {
		if string(dp) != api {
			t.Errorf("dataplane %q is agentapi %q", dp, api)
		}
	}
}
