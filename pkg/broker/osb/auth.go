package osb

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// Credentials are the one username and password platforms authenticate with.
type Credentials struct {
	Username string
	Password string
}

// MinPasswordLength keeps guessable passwords out.
const MinPasswordLength = 16

// LoadCredentials reads "username:password" from a file (a mounted Secret key).
// There is no default: a broker without credentials does not start.
func LoadCredentials(path string) (Credentials, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Credentials{}, fmt.Errorf("reading broker credentials: %w", err)
	}
	user, pass, ok := strings.Cut(strings.TrimSpace(string(data)), ":")
	c := Credentials{Username: user, Password: pass}
	if !ok {
		return Credentials{}, fmt.Errorf("broker credentials in %s: want one line username:password", path)
	}
	if err := c.Validate(); err != nil {
		return Credentials{}, fmt.Errorf("broker credentials in %s: %w", path, err)
	}
	return c, nil
}

// Validate rejects empty users and short passwords.
func (c Credentials) Validate() error {
	if c.Username == "" {
		return errors.New("the username is empty")
	}
	if len(c.Password) < MinPasswordLength {
		return fmt.Errorf("the password has %d characters; at least %d are required", len(c.Password), MinPasswordLength)
	}
	return nil
}

// middleware answers 401 unless the request carries the credentials.
func (c Credentials) middleware(next http.Handler) http.Handler {
	wantUser, wantPass := sha256.Sum256([]byte(c.Username)), sha256.Sum256([]byte(c.Password))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pass, ok := r.BasicAuth()
		u, p := sha256.Sum256([]byte(user)), sha256.Sum256([]byte(pass))
		// Both compared in constant time, always, so timing says nothing about either.
		userOK := subtle.ConstantTimeCompare(u[:], wantUser[:]) == 1
		passOK := subtle.ConstantTimeCompare(p[:], wantPass[:]) == 1
		if !ok || !userOK || !passOK {
			w.Header().Set("WWW-Authenticate", `Basic realm="mizar-broker"`)
			writeError(w, http.StatusUnauthorized, "Unauthorized", "missing or wrong broker credentials")
			return
		}
		next.ServeHTTP(w, r)
	})
}
