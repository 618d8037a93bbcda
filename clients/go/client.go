// client.go: the Client: it sends runs and reads providers, and checks every answer.

package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// DefaultMaxBodyBytes is the largest request body a client sends unless told otherwise: the
// daemon's default [daemon].max_body_bytes (8 MiB). A larger request is refused here.
const DefaultMaxBodyBytes = 8 << 20

const (
	// maxAnswerBytes bounds what is read of an answer (outputs and artifacts can be large).
	maxAnswerBytes = 1 << 30
	// connectTimeout bounds the TCP connect.
	connectTimeout = 10 * time.Second
	// exchangeSlack is added to the run's own timeout (or the largest) for the whole exchange.
	exchangeSlack = 120 * time.Second
	// defaultRunBudget is the exchange budget of a run that sets no timeout: the daemon's
	// built-in maximum timeout.
	defaultRunBudget = 600 * time.Second
)

// secret holds the caller token. It is kept behind a pointer so that even printing a copy
// of a Client with %+v shows an address, never the token.
type secret struct{ token string }

func (*secret) String() string   { return "<redacted>" }
func (*secret) GoString() string { return "<redacted>" }

// Client is a client of one plimsolld. It is safe for concurrent use.
type Client struct {
	baseURL string
	token   *secret
	http    *http.Client
	maxBody int

	mu           sync.Mutex
	defaultFloor Isolation // the daemon's default floor, read once
}

// Option configures a Client.
type Option func(*Client)

// WithMaxBodyBytes sets the largest request body the client sends (default
// DefaultMaxBodyBytes); set it to the daemon's [daemon].max_body_bytes when that differs.
func WithMaxBodyBytes(n int) Option { return func(c *Client) { c.maxBody = n } }

// WithHTTPClient replaces the HTTP client. The default one uses no proxy from the
// environment and a fresh connection per exchange, so that a failed connect proves nothing
// was sent (then the error is not dispatched, reason environment); keep those properties.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.http = hc } }

// New returns a client of the daemon at baseURL (e.g. "http://127.0.0.1:7878") presenting
// token (a caller token, `plm_...`), which is sent in the Authorization header only and
// never appears in an error or in the client's printed form.
func New(baseURL, token string, opts ...Option) *Client {
	dialer := &net.Dialer{Timeout: connectTimeout}
	c := &Client{
		baseURL: strings.TrimRight(baseURL, "/"),
		token:   &secret{token},
		http: &http.Client{
			Transport: &http.Transport{
				Proxy:             nil,
				DialContext:       dialer.DialContext,
				DisableKeepAlives: true,
				ForceAttemptHTTP2: false,
			},
			// Redirects are answers too: a POST is never replayed elsewhere.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		maxBody: DefaultMaxBodyBytes,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// String prints the client without its token.
func (c *Client) String() string {
	return fmt.Sprintf("sandbox.Client(%s, token <redacted>)", c.baseURL)
}

// GoString prints the client without its token.
func (c *Client) GoString() string { return c.String() }

// BaseURL is the daemon's base URL.
func (c *Client) BaseURL() string { return c.baseURL }

// MaxBodyBytes is the largest request body this client sends.
func (c *Client) MaxBodyBytes() int { return c.maxBody }

// RunJavaScript runs req.Code with node and verifies the answer.
func (c *Client) RunJavaScript(ctx context.Context, req Request) (*Result, error) {
	return c.Run(ctx, req.with(JavaScript))
}

// RunPython runs req.Code with python3 and verifies the answer.
func (c *Client) RunPython(ctx context.Context, req Request) (*Result, error) {
	return c.Run(ctx, req.with(Python))
}

func (r Request) with(lang Language) RunRequest {
	return RunRequest{
		Run:              Snippet{Language: lang, Code: r.Code},
		MinimumIsolation: r.MinimumIsolation,
		Provider:         r.Provider,
		Limits:           r.Limits,
		Grant:            r.Grant,
	}
}

// NewRequestID returns a fresh request id: 128 random bits in lowercase hex.
func NewRequestID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("sandbox: the system's random source failed: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// Run sends a request under a fresh request id, waits for the run to end and verifies the
// answer: the echoed id, the tier against the floor, the provider against the one named,
// the three digests and the record. Any error says whether nothing ran
// (NotDispatchedReason, errors.Is(err, ErrNotDispatched)) or the code may have run
// (errors.Is(err, ErrMayHaveRun)); never retry the latter automatically.
func (c *Client) Run(ctx context.Context, req RunRequest) (*Result, error) {
	id := NewRequestID()
	refuse := func(err error) error { return refusedHere(id, ReasonRequest, err.Error(), err) }
	w, err := req.toWire(id)
	if err != nil {
		return nil, refuse(err)
	}
	body, err := json.Marshal(w)
	if err != nil {
		return nil, refuse(fmt.Errorf("the request does not serialise: %w", err))
	}
	// Over the daemon's limit it would be refused after being sent, and the refusal may
	// arrive as a closed connection ("may have run"): refuse it here, sending nothing.
	if len(body) > c.maxBody {
		return nil, refuse(&RequestTooLargeError{Size: len(body), Limit: c.maxBody})
	}
	// The request digest is over exactly the bytes that leave this process.
	var sent wireRequest
	if _, err := readStrict(body, &sent); err != nil {
		return nil, refuse(fmt.Errorf("the request does not read back: %w", err))
	}
	floor, fromDaemon := sent.MinimumIsolation, false
	if floor == "" {
		if floor, err = c.DefaultFloor(ctx); err != nil {
			reason := ReasonEnvironment
			var pe *ProvidersError
			if errors.As(err, &pe) && pe.Reason != "" {
				reason = pe.Reason
			}
			return nil, refusedHere(id, reason, "no floor was set and the daemon's default floor could not be read, so the run was not sent ("+err.Error()+"): set MinimumIsolation, or fix what the error says", err)
		}
		fromDaemon = true
	}

	budget := defaultRunBudget
	if sent.Limits != nil && sent.Limits.TimeoutMS > 0 {
		budget = time.Duration(sent.Limits.TimeoutMS) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, budget+exchangeSlack)
	defer cancel()
	url := c.baseURL + "/v1/runs"
	status, answer, err := c.exchange(ctx, http.MethodPost, url, body)
	if err != nil {
		var ns *notSent
		if errors.As(err, &ns) {
			return nil, refusedHere(id, ReasonEnvironment, fmt.Sprintf("cannot reach the daemon at %s (%v): check that plimsolld is running and the URL is right", url, ns.err), ns.err)
		}
		return nil, &MayHaveRunError{RequestID: id, Code: "transport",
			Message: fmt.Sprintf("the exchange with %s failed after the request may have been sent: %v", url, err), Err: err}
	}
	if status == http.StatusOK {
		var res Result
		if _, err := readStrict(answer, &res); err != nil {
			return nil, &MayHaveRunError{RequestID: id, Code: "bad_response", Status: status,
				Message: "not a run response: " + err.Error()}
		}
		return verify(&sent, floor, fromDaemon, &res)
	}
	e, err := readErrorAnswer(answer)
	if err != nil {
		return nil, &MayHaveRunError{RequestID: id, Code: "bad_response", Status: status, Message: err.Error()}
	}
	switch {
	case e.Error.NotDispatched != nil && e.RequestID != nil && *e.RequestID == id:
		return nil, &NotDispatchedError{RequestID: id, Reason: *e.Error.NotDispatched, Code: e.Error.Code,
			Message: e.Error.Message, Status: status}
	case e.Error.NotDispatched != nil:
		echoed := "(none)"
		if e.RequestID != nil {
			echoed = *e.RequestID
		}
		return nil, &MayHaveRunError{RequestID: id, Code: "unverified_refusal", Status: status,
			EchoedRequestID: e.RequestID, ClaimedReason: *e.Error.NotDispatched,
			Message: fmt.Sprintf("an answer claimed `not dispatched (%s)` but echoed request id %s, not %s; something between this client and the daemon mixed up answers (%s)",
				*e.Error.NotDispatched, echoed, id, e.Error.Message)}
	default:
		return nil, &MayHaveRunError{RequestID: id, Code: e.Error.Code, Status: status, EchoedRequestID: e.RequestID,
			Message: fmt.Sprintf("HTTP %d: %s", status, e.Error.Message)}
	}
}

// refusedHere is a refusal made by this client: nothing was sent, for reason, because of err.
func refusedHere(id string, reason Reason, message string, err error) *NotDispatchedError {
	return &NotDispatchedError{RequestID: id, Reason: reason, Code: string(reason), Message: message, Err: err}
}

// readErrorAnswer reads an answer other than 200 as the protocol's error response; its
// error says why the answer is not one.
func readErrorAnswer(answer []byte) (*wireError, error) {
	var e wireError
	if _, err := readStrict(answer, &e); err != nil {
		return nil, fmt.Errorf("not an error response (%v): %q", err, preview(answer))
	}
	return &e, nil
}

// verify checks a 200 answer to the request sent, against floor.
func verify(sent *wireRequest, floor Isolation, fromDaemon bool, res *Result) (*Result, error) {
	id := sent.RequestID
	for _, echoed := range []string{res.RequestID, res.Record.RequestID} {
		if echoed != id {
			e := echoed
			return nil, &MayHaveRunError{RequestID: id, Code: "request_id_mismatch", Status: http.StatusOK, EchoedRequestID: &e,
				Message: fmt.Sprintf("the result echoes request id %s, not %s; something between this client and the daemon mixed up answers, so this result is not yours", echoed, id)}
		}
	}
	if res.Protocol != Protocol {
		return nil, &MayHaveRunError{RequestID: id, Code: "bad_response", Status: http.StatusOK,
			Message: fmt.Sprintf("the result speaks protocol %d, this client protocol %d", res.Protocol, Protocol)}
	}
	// The tier comes before the digests: a run below the floor is the fact the caller most
	// needs, and it is an error even if every digest matched.
	weakest := res.Isolation
	if res.Record.Isolation.Rank() < weakest.Rank() {
		weakest = res.Record.Isolation
	}
	if !weakest.AtLeast(floor) {
		return nil, &EvidenceMismatchError{RequestID: id, Provider: res.Provider, Isolation: weakest, Floor: floor, DefaultFloor: fromDaemon}
	}
	// The record states the floor the daemon applied: the one sent, or its default floor when
	// none was sent. It must be there, the tier must meet it, and it must be the floor this
	// client held the run to (which also catches a daemon whose listing and records disagree).
	applied := res.Record.MinimumIsolation
	if applied == "" {
		return nil, &MayHaveRunError{RequestID: id, Code: "bad_response", Status: http.StatusOK,
			Message: "the record states no applied floor (`record.minimum_isolation`): the daemon is older than this client or faulty; upgrade plimsolld"}
	}
	if !weakest.AtLeast(applied) {
		return nil, &EvidenceMismatchError{RequestID: id, Provider: res.Provider, Isolation: weakest, Floor: applied, AppliedFloor: true}
	}
	if applied != floor {
		against := "the floor sent"
		if fromDaemon {
			against = "the daemon's default floor"
		}
		return nil, &RecordMismatchError{RequestID: id, Field: "minimum_isolation", Response: string(floor), Record: string(applied), Against: against}
	}
	if sent.Provider != "" {
		for _, named := range []string{res.Provider, res.Record.Provider} {
			if named != sent.Provider {
				return nil, &ProviderMismatchError{RequestID: id, Asked: sent.Provider, Provider: named}
			}
		}
	}
	// What the types cannot say: a pool member's age only with a warm start, and always with one.
	if problem := res.Output.startProblem(); problem != "" {
		return nil, &MayHaveRunError{RequestID: id, Code: "bad_response", Status: http.StatusOK, Message: problem}
	}
	digest := func(which DigestKind, computed, claimed string) error {
		if computed != claimed {
			return &DigestMismatchError{RequestID: id, Which: which, Computed: computed, Claimed: claimed}
		}
		return nil
	}
	requestSHA := sum(encodeRequest(sent))
	resultSHA := ResultSHA256(&res.Output)
	if err := digest(DigestRequest, requestSHA, res.RequestSHA256); err != nil {
		return nil, err
	}
	if err := digest(DigestResult, resultSHA, res.ResultSHA256); err != nil {
		return nil, err
	}
	if err := digest(DigestRecord, RecordSHA256(&res.Record), res.Record.RecordSHA256); err != nil {
		return nil, err
	}
	for _, f := range []struct{ field, response, record string }{
		{"request_sha256", requestSHA, res.Record.RequestSHA256},
		{"result_sha256", resultSHA, res.Record.ResultSHA256},
		{"provider", res.Provider, res.Record.Provider},
		{"isolation", string(res.Isolation), string(res.Record.Isolation)},
	} {
		if f.response != f.record {
			return nil, &RecordMismatchError{RequestID: id, Field: f.field, Response: f.response, Record: f.record}
		}
	}
	return res, nil
}

// Providers returns the daemon's providers, their tiers, availability and evidence, after
// recomputing each evidence digest. It also refreshes the cached default floor.
func (c *Client) Providers(ctx context.Context) (*Providers, error) {
	ctx, cancel := context.WithTimeout(ctx, exchangeSlack)
	defer cancel()
	url := c.baseURL + "/v1/providers"
	status, answer, err := c.exchange(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, &ProvidersError{URL: url, Message: err.Error(), Err: err}
	}
	bad := func(message string) error {
		return &ProvidersError{URL: url, Status: status, Code: "bad_response", Message: message}
	}
	if status != http.StatusOK {
		e, err := readErrorAnswer(answer)
		if err != nil {
			return nil, bad(err.Error())
		}
		pe := &ProvidersError{URL: url, Status: status, Code: e.Error.Code, Message: e.Error.Message}
		if e.Error.NotDispatched != nil {
			pe.Reason = *e.Error.NotDispatched
		}
		return nil, pe
	}
	var p Providers
	generic, err := readStrict(answer, &p)
	if err != nil {
		return nil, bad("not a providers response: " + err.Error())
	}
	list, _ := generic.(map[string]any)["providers"].([]any)
	for i := range p.Providers {
		info := &p.Providers[i]
		canonical, err := evidenceCanonical(list[i].(map[string]any)["evidence"])
		if err != nil {
			return nil, bad(fmt.Sprintf("provider %s: %v", info.Name, err))
		}
		if computed := sum(canonical); computed != info.EvidenceSHA256 {
			return nil, &DigestMismatchError{Which: DigestEvidence, Provider: info.Name, Computed: computed, Claimed: info.EvidenceSHA256}
		}
	}
	c.mu.Lock()
	c.defaultFloor = p.DefaultFloor
	c.mu.Unlock()
	return &p, nil
}

// DefaultFloor is the daemon's default floor (what a request that sets none gets), read
// from GET /v1/providers on first use and kept for the client's life.
func (c *Client) DefaultFloor(ctx context.Context) (Isolation, error) {
	c.mu.Lock()
	floor := c.defaultFloor
	c.mu.Unlock()
	if floor != "" {
		return floor, nil
	}
	p, err := c.Providers(ctx)
	if err != nil {
		return "", err
	}
	return p.DefaultFloor, nil
}

// Ready reports whether the daemon answers GET /readyz with 200 (every provider probed, at
// least one available); false when it is not ready or cannot be reached.
func (c *Client) Ready(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	status, _, err := c.exchange(ctx, http.MethodGet, c.baseURL+"/readyz", nil)
	return err == nil && status == http.StatusOK
}

// notSent wraps a failure that happened before any byte of the request could leave: a bad
// URL, or a failed connect (each exchange opens its own connection, with no proxy).
type notSent struct{ err error }

func (n *notSent) Error() string { return n.err.Error() }
func (n *notSent) Unwrap() error { return n.err }

// exchange sends one request and reads the whole answer.
func (c *Client) exchange(ctx context.Context, method, url string, body []byte) (int, []byte, error) {
	var reader io.Reader
	if body != nil {
		reader = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, reader)
	if err != nil {
		return 0, nil, &notSent{err}
	}
	req.Header.Set("Authorization", "Bearer "+c.token.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", "plimsoll-client-go/"+Version)
	resp, err := c.http.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return 0, nil, &notSent{op}
		}
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("reading the answer: %w", err)
	}
	if len(data) > maxAnswerBytes {
		return resp.StatusCode, nil, fmt.Errorf("the answer is over %d bytes", maxAnswerBytes)
	}
	return resp.StatusCode, data, nil
}

// Version is this client's version, sent in its User-Agent.
const Version = "0.1.0"

func preview(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	return string(b)
}
