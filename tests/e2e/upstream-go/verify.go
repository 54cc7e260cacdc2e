// The token check of go-mcp's resource-server mode: RS256 JWTs of one issuer, verified
// against the keys its discovery document names, for one audience.
package main

import (
	"context"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/auth"
)

// maxDocument bounds what is read of the provider's discovery document and key set.
const maxDocument = 1 << 20

type verifier struct {
	issuer, audience string
	client           *http.Client

	mu      sync.Mutex
	keys    map[string]*rsa.PublicKey
	fetched time.Time
}

func newVerifier(issuer, audience string) *verifier {
	return &verifier{issuer: strings.TrimRight(issuer, "/"), audience: audience, client: &http.Client{Timeout: 10 * time.Second}}
}

// getJSON fetches url and decodes at most maxDocument bytes of its JSON body into out.
func (v *verifier) getJSON(ctx context.Context, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := v.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, maxDocument)).Decode(out)
}

// refresh reads the provider's key set (at most once every 10 s).
func (v *verifier) refresh(ctx context.Context) error {
	if time.Since(v.fetched) < 10*time.Second {
		return nil
	}
	v.fetched = time.Now()
	var discovery struct {
		JwksURI string `json:"jwks_uri"`
	}
	if err := v.getJSON(ctx, v.issuer+"/.well-known/openid-configuration", &discovery); err != nil {
		return err
	}
	var set struct {
		Keys []struct {
			Kid string `json:"kid"`
			Kty string `json:"kty"`
			Use string `json:"use"`
			N   string `json:"n"`
			E   string `json:"e"`
		} `json:"keys"`
	}
	if err := v.getJSON(ctx, discovery.JwksURI, &set); err != nil {
		return err
	}
	keys := map[string]*rsa.PublicKey{}
	for _, k := range set.Keys {
		if k.Kty != "RSA" || (k.Use != "" && k.Use != "sig") {
			continue
		}
		n, errN := base64.RawURLEncoding.DecodeString(k.N)
		e, errE := base64.RawURLEncoding.DecodeString(k.E)
		if errN != nil || errE != nil || len(e) == 0 || len(e) > 4 {
			continue
		}
		keys[k.Kid] = &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
	}
	v.keys = keys
	return nil
}

func (v *verifier) key(ctx context.Context, kid string) (*rsa.PublicKey, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if k, ok := v.keys[kid]; ok {
		return k, nil
	}
	if err := v.refresh(ctx); err != nil {
		return nil, err
	}
	if k, ok := v.keys[kid]; ok {
		return k, nil
	}
	return nil, fmt.Errorf("no key %q at the issuer", kid)
}

// verify is an auth.TokenVerifier: the token's claims become the TokenInfo's Extra.
func (v *verifier) verify(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(token, claims, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		return v.key(ctx, kid)
	}, jwt.WithValidMethods([]string{"RS256"}), jwt.WithIssuer(v.issuer), jwt.WithAudience(v.audience),
		jwt.WithExpirationRequired())
	if err != nil {
		log.Printf("refused a token: %v", err)
		return nil, fmt.Errorf("%w: %v", auth.ErrInvalidToken, err)
	}
	exp, err := claims.GetExpirationTime()
	if err != nil || exp == nil {
		return nil, errors.Join(auth.ErrInvalidToken, err)
	}
	sub, _ := claims["sub"].(string)
	scope, _ := claims["scope"].(string)
	return &auth.TokenInfo{Scopes: strings.Fields(scope), Expiration: exp.Time, UserID: sub, Extra: claims}, nil
}
