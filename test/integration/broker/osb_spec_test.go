package broker

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"mizar.dev/pkg/broker/osb"
)

// The rules of the Open Service Broker API v2.17 (spec.md of
// openservicebrokerapi/servicebroker, tag v2.17) for what mizar's catalog
// advertises: bindable services with plan_updateable plans,
// instances_retrievable and bindings_retrievable false, provision, update
// and deprovision asynchronous only, bind and unbind synchronous. Every rule
// has its test: the single-request ones are rows of TestOSBSpecRules below,
// the ones that need a sequence name the test that walks it.
//
//	| area            | rule (MUST unless said)                                                        | proved by
//	|-----------------|--------------------------------------------------------------------------------|--------------------------------------------------
//	| auth            | no or wrong Basic credentials: 401                                             | TestOSBHeadersAndAuth, rows "auth"
//	| version header  | missing or unsupported X-Broker-API-Version: 412 with an error body; 2.13-2.17 | TestOSBHeadersAndAuth, TestOSBRequestBodies, rows
//	| request id      | X-Broker-API-Request-Identity echoed in the response (SHOULD)                  | row "request identity"
//	| origin identity | X-Broker-API-Originating-Identity optional, never required                     | rows "originating identity"
//	| errors          | every 4xx/5xx but 401, 410, a fetch's 404: {"description"}, "error" CamelCase | every row (checkErrorBody)
//	| bodies          | unknown fields ignored; malformed JSON 400; bodies over the cap 413           | row "unknown fields", TestOSBRequestBodies
//	| ids             | any id the spec allows (random GUIDs of every leading character, upper case,  | TestOSBAnyInstanceID, TestKubectlOrderNamedLikeAGUID,
//	|                 | unreserved and percent-encoded characters) yields a working order             | test/brokere2e TestAnyIDEndToEnd
//	| catalog         | services with id, name, description, bindable, >= 1 plan (id, name,           | rows "catalog", TestOSBCatalogSchemasAndPlanUpdateable,
//	|                 | description); schemas complete with $schema or absent; plan_updateable true  | TestOSBCatalogFollowsClasses, TestCatalogRefusals
//	|                 | only where a plan change can succeed; ids stable                               |
//	| provision       | accepts_incomplete absent or false: 422 AsyncRequired                          | TestOSBProvisionBindDeprovision, rows
//	|                 | missing/unknown service_id or plan_id: 400; organization_guid/space_guid: 400 | rows, TestOSBRequestBodies
//	|                 | invalid parameters: 400 naming the field; nothing stored on any 4xx            | TestOSBProvisionBindDeprovision, TestOSBRequestBodies
//	|                 | 202 with an operation (<= 10,000 characters)                                   | rows "provision", TestOSBProvisionBindDeprovision
//	|                 | same request while provisioning: 202 with the same operation                   | TestOSBProvisionBindDeprovision, row
//	|                 | same request once provisioned: 200; a different one: 409                       | TestOSBProvisionBindDeprovision, rows
//	|                 | maintenance_info the plan has not: 422 MaintenanceInfoConflict                 | rows "maintenance_info" (provision, update)
//	| last_operation  | 200 {state: in progress|succeeded|failed, description}; Retry-After            | TestOSBProvisionBindDeprovision, rows
//	|                 | unknown instance 404; an unknown or stale operation falls back, never 400      | rows
//	|                 | after an async delete: 410 (the spec's "gone" for deletes)                     | TestOSBProvisionBindDeprovision, e2ecluster BrokerMariaDBThroughOSB
//	|                 | failed order: state failed with the reason                                     | TestOSBBindRules, TestForbiddenNamespaceFailsAndCompensates
//	| update          | accepts_incomplete absent: 422 AsyncRequired                                   | TestOSBUpdateChangesTheStatefulSet, rows
//	|                 | nothing changes: 200 {}; a plan change that cannot be made: 422, no change     | TestOSBProvisionBindDeprovision, rows
//	|                 | another service's plan: 400; while an operation runs: 422 ConcurrencyError     | rows, TestOSBUpdateChangesTheStatefulSet
//	|                 | 202 + operation, last_operation follows the update to succeeded; parameters   | TestOSBUpdateChangesTheStatefulSet,
//	|                 | not sent stay as they are; the workload is changed (rollout, data kept)        | TestUpdateWhileProvisioningReachesTheStatefulSet, e2ecluster
//	| bind            | service_id/plan_id not the instance's: 400; instance busy: 422                 | TestOSBBindRules, rows
//	|                 | ConcurrencyError; failed instance: 422 InstanceNotUsable                       | TestOSBBindRules
//	|                 | 201 with credentials; same again 200 with them; another under the id 409      | TestOSBProvisionBindDeprovision, TestOSBBindRules, rows
//	|                 | parameters checked against the plan's binding schema (400) and stored          | TestOSBBindRules, rows
//	|                 | credentials connect (a client on another node reads and writes)                | e2ecluster BrokerMariaDBThroughOSB
//	| unbind          | 200 {}; a gone binding 410; another instance's binding 410; service_id and    | TestOSBProvisionBindDeprovision, rows
//	|                 | plan_id (REQUIRED query parameters) missing: 400, also for deprovision         | rows
//	| deprovision     | accepts_incomplete absent: 422; 202 + operation; gone: 410                     | TestOSBProvisionBindDeprovision, rows
//	|                 | accepted while provisioning: halts it and removes what was made                | TestDeprovisionDuringProvisioningStopsAndCleansUp
//	|                 | every resource created is removed, bindings included                           | TestOSBBindRules, TestOSBAnyInstanceID, e2ecluster
//	| GET instance /  | not offered (instances_retrievable, bindings_retrievable false): 404           | rows "fetch"
//	| GET binding     |                                                                                |
//
// The spec's own words for the codes are in ../../../../shared/notes/broker.md
// (sections 1, 2, 4, 5); 409 and 410 bodies are "{}" or an error object.

// specRow is one request and what the spec requires of its answer.
type specRow struct {
	rule   string
	method string
	path   string
	body   any
	hdr    map[string]string
	code   int
	// key is the "error" the answer must carry ("" = any, or none).
	key string
	// empty: the spec's body for this answer is "{}" (a fetch of what is
	// not there); otherwise an error answer carries a description.
	empty bool
	check func(r reply) error
}

var camelCase = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)

// checkErrorBody: an error answer is a JSON object with a description
// (mizar's choice where the spec expects "{}" and allows one, as for 409),
// and an "error" code, if any, is a CamelCase word (never empty).
func checkErrorBody(r reply, empty bool) error {
	if r.code < 400 || r.code == 401 || r.code == 410 || empty {
		return nil
	}
	if d, _ := r.body["description"].(string); d == "" {
		return fmt.Errorf("error answer without a description: %v", r.body)
	}
	if e, ok := r.body["error"]; ok {
		if s, _ := e.(string); !camelCase.MatchString(s) {
			return fmt.Errorf("error code %q is not a CamelCase word", e)
		}
	}
	return nil
}

// randomFirst is a random GUID whose first character is any hex digit.
func randomFirst() string { return randomGUID("0123456789abcdef"[rand.IntN(16)]) }

func TestOSBSpecRules(t *testing.T) {
	f := newOSB(t)
	ready, busy, fresh := randomFirst(), randomFirst(), randomFirst()
	rp, bp := instancePath(ready), instancePath(busy)
	prov := f.do("PUT", rp+"?accepts_incomplete=true", f.provisionBody(f.smallID, nil), nil)
	busyProv := f.do("PUT", bp+"?accepts_incomplete=true", f.provisionBody(f.haID, nil), nil)
	if prov.code != 202 || busyProv.code != 202 {
		t.Fatalf("provisions: %d %v, %d %v", prov.code, prov.body, busyProv.code, busyProv.body)
	}
	f.waitProvisioned(ready, 1)
	binding := strings.ToUpper(randomFirst())
	f.expect(f.do("PUT", rp+"/service_bindings/"+binding, map[string]any{"service_id": f.serviceID, "plan_id": f.smallID}, nil), 201, "bind")
	busyOp, _ := busyProv.body["operation"].(string)
	del := "?service_id=" + f.serviceID + "&plan_id=" + f.smallID

	hasKeys := func(keys ...string) func(reply) error {
		return func(r reply) error {
			for _, k := range keys {
				if _, ok := r.body[k]; !ok {
					return fmt.Errorf("answer lacks %q: %v", k, r.body)
				}
			}
			return nil
		}
	}
	state := func(want string) func(reply) error {
		return func(r reply) error {
			if r.body["state"] != want || r.body["description"] == nil {
				return fmt.Errorf("state %v description %v, want %q with a description", r.body["state"], r.body["description"], want)
			}
			return nil
		}
	}
	rows := []specRow{
		{rule: "auth: no credentials", method: "GET", path: "/v2/catalog", hdr: map[string]string{"Authorization": ""}, code: 401},
		{rule: "version header missing", method: "GET", path: "/v2/catalog", hdr: map[string]string{"X-Broker-API-Version": ""}, code: 412, key: osb.ErrKeyVersion},
		{rule: "version 2.12 refused", method: "GET", path: "/v2/catalog", hdr: map[string]string{"X-Broker-API-Version": "2.12"}, code: 412, key: osb.ErrKeyVersion},
		{rule: "version 2.13 accepted", method: "GET", path: "/v2/catalog", hdr: map[string]string{"X-Broker-API-Version": "2.13"}, code: 200},
		{rule: "request identity echoed", method: "GET", path: "/v2/catalog", hdr: map[string]string{"X-Broker-API-Request-Identity": "e6e0f3f2-7b1c-4a39-9a51-0c0ec1b8bb2e"}, code: 200,
			check: func(r reply) error {
				if got := r.header.Get("X-Broker-API-Request-Identity"); got != "e6e0f3f2-7b1c-4a39-9a51-0c0ec1b8bb2e" {
					return fmt.Errorf("X-Broker-API-Request-Identity %q not echoed", got)
				}
				return nil
			}},
		{rule: "originating identity accepted", method: "GET", path: rp + "/last_operation",
			hdr: map[string]string{"X-Broker-API-Originating-Identity": "kubernetes eyJ1c2VybmFtZSI6ImFsaWNlIn0="}, code: 200, check: state("succeeded")},
		{rule: "originating identity not required", method: "GET", path: rp + "/last_operation", code: 200, check: state("succeeded")},
		{rule: "catalog: required fields", method: "GET", path: "/v2/catalog", code: 200, check: func(r reply) error {
			svcs, _ := r.body["services"].([]any)
			for _, s := range svcs {
				s := s.(map[string]any)
				if s["id"] != f.serviceID {
					continue
				}
				for _, k := range []string{"id", "name", "description", "bindable", "plans"} {
					if _, ok := s[k]; !ok {
						return fmt.Errorf("service lacks %s: %v", k, s)
					}
				}
				if s["instances_retrievable"] == true || s["bindings_retrievable"] == true {
					return fmt.Errorf("service says it serves GET instance or binding: %v", s)
				}
				plans, _ := s["plans"].([]any)
				if len(plans) == 0 {
					return fmt.Errorf("service without plans: %v", s)
				}
				for _, p := range plans {
					p := p.(map[string]any)
					for _, k := range []string{"id", "name", "description"} {
						if v, _ := p[k].(string); v == "" {
							return fmt.Errorf("plan lacks %s: %v", k, p)
						}
					}
				}
				return nil
			}
			return fmt.Errorf("service %s not in the catalog", f.serviceID)
		}},

		{rule: "provision: accepts_incomplete absent", method: "PUT", path: instancePath(fresh), body: f.provisionBody(f.smallID, nil), code: 422, key: "AsyncRequired"},
		{rule: "provision: accepts_incomplete=false", method: "PUT", path: instancePath(fresh) + "?accepts_incomplete=false", body: f.provisionBody(f.smallID, nil), code: 422, key: "AsyncRequired"},
		{rule: "provision: service_id missing", method: "PUT", path: instancePath(fresh) + "?accepts_incomplete=true",
			body: map[string]any{"plan_id": f.smallID, "organization_guid": "o", "space_guid": "s"}, code: 400},
		{rule: "provision: plan_id missing", method: "PUT", path: instancePath(fresh) + "?accepts_incomplete=true",
			body: map[string]any{"service_id": f.serviceID, "organization_guid": "o", "space_guid": "s"}, code: 400},
		{rule: "provision: unknown service_id", method: "PUT", path: instancePath(fresh) + "?accepts_incomplete=true",
			body: map[string]any{"service_id": "no-such-service", "plan_id": f.smallID, "organization_guid": "o", "space_guid": "s"}, code: 400},
		{rule: "provision: another service's plan", method: "PUT", path: instancePath(fresh) + "?accepts_incomplete=true",
			body: f.provisionBody("no-such-plan", nil), code: 400},
		{rule: "provision: maintenance_info the plan has not", method: "PUT", path: instancePath(fresh) + "?accepts_incomplete=true",
			body: merge(f.provisionBody(f.smallID, nil), map[string]any{"maintenance_info": map[string]any{"version": "1.0.0"}}), code: 422, key: "MaintenanceInfoConflict"},
		{rule: "provision: same while provisioning, same operation", method: "PUT", path: bp + "?accepts_incomplete=true", body: f.provisionBody(f.haID, nil), code: 202,
			check: func(r reply) error {
				if r.body["operation"] != busyOp {
					return fmt.Errorf("operation %v, want %s", r.body["operation"], busyOp)
				}
				return nil
			}},
		{rule: "provision: same once provisioned", method: "PUT", path: rp + "?accepts_incomplete=true", body: f.provisionBody(f.smallID, nil), code: 200},
		{rule: "provision: another plan under the id", method: "PUT", path: rp + "?accepts_incomplete=true", body: f.provisionBody(f.haID, nil), code: 409},
		{rule: "provision: other parameters under the id", method: "PUT", path: rp + "?accepts_incomplete=true", body: f.provisionBody(f.smallID, map[string]any{"database": "other"}), code: 409},

		{rule: "last_operation: in progress", method: "GET", path: bp + "/last_operation?operation=" + busyOp, code: 200, check: func(r reply) error {
			if r.header.Get("Retry-After") == "" {
				return fmt.Errorf("no Retry-After")
			}
			return state("in progress")(r)
		}},
		{rule: "last_operation: unknown operation falls back", method: "GET", path: rp + "/last_operation?operation=no-such-operation", code: 200, check: state("succeeded")},
		{rule: "last_operation: service_id and plan_id given", method: "GET", path: rp + "/last_operation" + del, code: 200, check: state("succeeded")},
		{rule: "last_operation: unknown instance", method: "GET", path: instancePath(fresh) + "/last_operation", code: 404},

		{rule: "update: accepts_incomplete absent", method: "PATCH", path: rp, body: map[string]any{"service_id": f.serviceID, "plan_id": f.smallID}, code: 422, key: "AsyncRequired"},
		{rule: "update: nothing changes", method: "PATCH", path: rp + "?accepts_incomplete=true", body: map[string]any{"service_id": f.serviceID}, code: 200},
		{rule: "update: plan whose storage differs", method: "PATCH", path: rp + "?accepts_incomplete=true", body: map[string]any{"service_id": f.serviceID, "plan_id": f.haID}, code: 422},
		{rule: "update: a plan of no service", method: "PATCH", path: rp + "?accepts_incomplete=true", body: map[string]any{"service_id": f.serviceID, "plan_id": "no-such-plan"}, code: 400},
		{rule: "update: while provisioning", method: "PATCH", path: bp + "?accepts_incomplete=true", body: map[string]any{"service_id": f.serviceID, "parameters": map[string]any{"maxConnections": 50}}, code: 422, key: "ConcurrencyError"},
		{rule: "update: maintenance_info the plan has not", method: "PATCH", path: rp + "?accepts_incomplete=true",
			body: map[string]any{"service_id": f.serviceID, "maintenance_info": map[string]any{"version": "2.0.0"}}, code: 422, key: "MaintenanceInfoConflict"},
		{rule: "update: unknown fields ignored", method: "PATCH", path: rp + "?accepts_incomplete=true", body: map[string]any{"service_id": f.serviceID, "no_such_field": 1}, code: 200},

		{rule: "bind: bogus service_id", method: "PUT", path: rp + "/service_bindings/" + randomFirst(), body: map[string]any{"service_id": "bogus", "plan_id": f.smallID}, code: 400},
		{rule: "bind: another plan's id", method: "PUT", path: rp + "/service_bindings/" + randomFirst(), body: map[string]any{"service_id": f.serviceID, "plan_id": f.haID}, code: 400},
		{rule: "bind: parameters the plan's schema refuses", method: "PUT", path: rp + "/service_bindings/" + randomFirst(),
			body: map[string]any{"service_id": f.serviceID, "plan_id": f.smallID, "parameters": map[string]any{"x": 1}}, code: 400},
		{rule: "bind: while provisioning", method: "PUT", path: bp + "/service_bindings/" + randomFirst(), body: map[string]any{"service_id": f.serviceID, "plan_id": f.haID}, code: 422, key: "ConcurrencyError"},
		{rule: "bind: identical again", method: "PUT", path: rp + "/service_bindings/" + binding, body: map[string]any{"service_id": f.serviceID, "plan_id": f.smallID}, code: 200,
			check: func(r reply) error { return hasKeys("credentials")(r) }},
		{rule: "bind: unknown fields ignored", method: "PUT", path: rp + "/service_bindings/" + randomFirst(),
			body: map[string]any{"service_id": f.serviceID, "plan_id": f.smallID, "no_such_field": true}, code: 201,
			check: func(r reply) error {
				c, _ := r.body["credentials"].(map[string]any)
				for _, k := range []string{"uri", "host", "port", "username", "password", "database"} {
					if s, _ := c[k].(string); s == "" {
						return fmt.Errorf("credentials lack %s: %v", k, c)
					}
				}
				return nil
			}},

		{rule: "fetch instance: not offered", method: "GET", path: rp, code: 404},
		{rule: "fetch binding: not offered", method: "GET", path: rp + "/service_bindings/" + binding, code: 404, empty: true},

		{rule: "unbind: a binding never made", method: "DELETE", path: rp + "/service_bindings/" + randomFirst() + del, code: 410},
		{rule: "unbind: another instance's binding", method: "DELETE", path: bp + "/service_bindings/" + binding + del, code: 410},
		{rule: "unbind: plan_id missing", method: "DELETE", path: rp + "/service_bindings/" + binding + "?service_id=" + f.serviceID, code: 400},
		{rule: "deprovision: service_id missing", method: "DELETE", path: rp + "?accepts_incomplete=true&plan_id=" + f.smallID, code: 400},
		{rule: "deprovision: accepts_incomplete absent", method: "DELETE", path: rp + del, code: 422, key: "AsyncRequired"},
		{rule: "deprovision: an instance never made", method: "DELETE", path: instancePath(fresh) + del + "&accepts_incomplete=true", code: 410},
		// Last: it changes the state the rows above read.
		{rule: "unbind: the binding", method: "DELETE", path: rp + "/service_bindings/" + binding + del, code: 200},
		{rule: "deprovision while provisioning", method: "DELETE", path: bp + "?service_id=" + f.serviceID + "&plan_id=" + f.haID + "&accepts_incomplete=true", code: 202,
			check: func(r reply) error {
				if op, _ := r.body["operation"].(string); op == "" || len(op) > 10000 {
					return fmt.Errorf("operation %q", op)
				}
				return nil
			}},
	}
	for _, row := range rows {
		r := f.do(row.method, row.path, row.body, row.hdr)
		if r.code != row.code {
			t.Errorf("%s: %s %s answered %d %v, want %d", row.rule, row.method, row.path, r.code, r.body, row.code)
			continue
		}
		if row.key != "" && r.body["error"] != row.key {
			t.Errorf("%s: error %v, want %s (%v)", row.rule, r.body["error"], row.key, r.body)
		}
		if err := checkErrorBody(r, row.empty); err != nil {
			t.Errorf("%s: %v", row.rule, err)
		}
		if row.check != nil {
			if err := row.check(r); err != nil {
				t.Errorf("%s: %v", row.rule, err)
			}
		}
	}
	f.notStored(osb.ObjectName(fresh))
	if op, _ := prov.body["operation"].(string); op == "" || len(op) > 10000 {
		t.Errorf("provision operation %q", op)
	}
}

func merge(a, b map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}
