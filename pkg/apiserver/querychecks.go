package apiserver

import (
	"fmt"
	"net/http"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
)

// withQueryChecks answers 400 naming the parameter when a numeric query
// parameter is not a number: k8s.io/apiserver's answer to ?limit=abc was the
// bare `strconv.ParseInt: parsing "abc": invalid syntax`.
func withQueryChecks(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		for _, name := range []string{"limit", "timeoutSeconds", "gracePeriodSeconds"} {
			vals, ok := q[name]
			if !ok {
				continue
			}
			for _, v := range vals {
				if n, err := strconv.ParseInt(v, 10, 64); err != nil || (n < 0 && name != "gracePeriodSeconds") {
					responsewriters.ErrorNegotiated(apierrors.NewBadRequest(fmt.Sprintf("query parameter %s must be a non-negative integer, got %q", name, v)),
						Codecs, schema.GroupVersion{}, w, req)
					return
				}
			}
		}
		h.ServeHTTP(w, req)
	})
}
