package osb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"

	"code.cloudfoundry.org/brokerapi/v13/domain/apiresponses"
)

// MaxBodyBytes caps a request body on the OSB listener. A provision's
// parameters are at most 64 KiB (validation.MaxParametersBytes); the rest of
// a body (ids, context, maintenance_info) is small. Larger bodies get 413
// before more than this is read, so one request cannot grow the process
// that also serves the networking API.
const MaxBodyBytes = 256 << 10

// Error keys of the answers this package writes itself. The spec fixes only
// AsyncRequired, ConcurrencyError, RequiresApp and MaintenanceInfoConflict;
// any other "error" must be a non-empty CamelCase word.
const (
	ErrKeyVersion   = "UnsupportedAPIVersion"
	ErrKeyTooLarge  = "RequestTooLarge"
	ErrKeyMalformed = "MalformedRequest"
)

// checkBody reads the body of a request that carries one (PUT, PATCH) up to
// MaxBodyBytes and answers what the spec asks of a bad one: 413 when too
// large, 400 when it is not a JSON object or declares another content type
// (a missing Content-Type is accepted, as the spec allows). The library then
// decodes the copy; it would answer 422 to malformed JSON and read any size.
func checkBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut && r.Method != http.MethodPatch {
			// Nothing else reads a body: never read more than a cap of it.
			r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
			next.ServeHTTP(w, r)
			return
		}
		if r.ContentLength > MaxBodyBytes {
			writeError(w, http.StatusRequestEntityTooLarge, ErrKeyTooLarge, fmt.Sprintf("the request body is %d bytes; at most %d are accepted", r.ContentLength, MaxBodyBytes))
			return
		}
		if ct := r.Header.Get("Content-Type"); ct != "" {
			if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
				writeError(w, http.StatusBadRequest, ErrKeyMalformed, fmt.Sprintf("Content-Type %q is not application/json", ct))
				return
			}
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			writeError(w, http.StatusRequestEntityTooLarge, ErrKeyTooLarge, fmt.Sprintf("the request body is over %d bytes", MaxBodyBytes))
			return
		case err != nil:
			writeError(w, http.StatusBadRequest, ErrKeyMalformed, "reading the request body: "+err.Error())
			return
		}
		if msg := jsonObjectProblem(body); msg != "" {
			writeError(w, http.StatusBadRequest, ErrKeyMalformed, msg)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// jsonObjectProblem says why a body is not one JSON object, or "".
func jsonObjectProblem(body []byte) string {
	if len(bytes.TrimSpace(body)) == 0 {
		return "the request body is empty; a JSON object is required"
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var obj map[string]json.RawMessage
	if err := dec.Decode(&obj); err != nil {
		return "the request body is not a JSON object: " + err.Error()
	}
	if _, err := dec.Token(); err != io.EOF {
		return "the request body has data after its JSON object"
	}
	return ""
}

// redactingHandler keeps request parameters out of the log: the library logs
// a provision's details (parameters included) with every refusal, and the
// description of a refusal may quote a parameter's value. Refusals are
// logged by their error key and status; internal errors (5xx) in full.
type redactingHandler struct{ inner slog.Handler }

// detailKeys are the attributes under which the library logs request bodies.
var detailKeys = map[string]bool{"instance-details": true, "binding-details": true, "details": true, "response": true}

func redact(a slog.Attr) (slog.Attr, bool) {
	if detailKeys[a.Key] {
		return slog.Attr{}, false
	}
	if a.Key == "error" {
		if err, ok := a.Value.Any().(error); ok {
			var fr *apiresponses.FailureResponse
			if errors.As(err, &fr) && fr.ValidatedStatusCode(nil) < 500 {
				return slog.String("error", fmt.Sprintf("refused: %s (HTTP %d)", fr.LoggerAction(), fr.ValidatedStatusCode(nil))), true
			}
		}
	}
	return a, true
}

func (h redactingHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h redactingHandler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, rec.Message, rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		if a, ok := redact(a); ok {
			out.AddAttrs(a)
		}
		return true
	})
	return h.inner.Handle(ctx, out)
}

func (h redactingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	kept := make([]slog.Attr, 0, len(attrs))
	for _, a := range attrs {
		if a, ok := redact(a); ok {
			kept = append(kept, a)
		}
	}
	return redactingHandler{h.inner.WithAttrs(kept)}
}

func (h redactingHandler) WithGroup(name string) slog.Handler {
	return redactingHandler{h.inner.WithGroup(name)}
}
