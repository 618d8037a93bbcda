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
		Image:            r.Image,
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
// answer: the echoed id, the tier against the floor, the provider and the image against the
// ones named, the three digests and the record. Any error says whether nothing ran
// (NotDispatchedReason, errors.Is(err, ErrNotDispatched)) or the code may have run
// (errors.Is(err, ErrMayHaveRun)); never retry the latter automatically.
func (c *Client) Run(ctx context.Context, req RunRequest) (*Result, error) {
	id := NewRequestID()
	refuse := func(err error) error { return refusedHere(id, ReasonRequest, err.Error(), err) }
	w, err := req.toWire(id)
	if err == nil {
		err = w.validate()
	}
	if err != nil {
		return nil, refuse(err)
	}
	body, sent, err := c.prepare(w)
	if err != nil {
		return nil, refuse(err)
	}
	floor, source := sent.MinimumIsolation, floorSent
	if floor == "" {
		if floor, err = c.defaultFloorOrRefusal(ctx, id, "run"); err != nil {
			return nil, err
		}
		source = floorDefault
	}
	return c.runExchange(ctx, runExchange{method: http.MethodPost, url: c.baseURL + "/v1/runs", body: body,
		sent: sent, floor: floor, source: source})
}

// prepare serialises a request, refuses it when it is over the body limit, and reads it
// back: the request digest is over exactly the bytes that leave this process.
func (c *Client) prepare(w wireRequest) ([]byte, *wireRequest, error) {
	body, sent, err := serialise(w)
	if err != nil {
		return nil, nil, err
	}
	// Over the daemon's limit it would be refused after being sent, and the refusal may
	// arrive as a closed connection ("may have run"): refuse it here, sending nothing.
	if len(body) > c.maxBody {
		return nil, nil, &RequestTooLargeError{Size: len(body), Limit: c.maxBody}
	}
	return body, sent, nil
}

// serialise is a request's JSON and the request as that JSON reads back.
func serialise(w wireRequest) ([]byte, *wireRequest, error) {
	body, err := json.Marshal(w)
	if err != nil {
		return nil, nil, fmt.Errorf("the request does not serialise: %w", err)
	}
	var sent wireRequest
	if _, err := readStrict(body, &sent); err != nil {
		return nil, nil, fmt.Errorf("the request does not read back: %w", err)
	}
	return body, &sent, nil
}

// defaultFloorOrRefusal is the daemon's default floor, or the refusal (made here, nothing
// sent) of a request that set no floor when that floor cannot be read.
func (c *Client) defaultFloorOrRefusal(ctx context.Context, id, what string) (Isolation, error) {
	floor, err := c.DefaultFloor(ctx)
	if err == nil {
		return floor, nil
	}
	reason := ReasonEnvironment
	var pe *ProvidersError
	if errors.As(err, &pe) && pe.Reason != "" {
		reason = pe.Reason
	}
	return "", refusedHere(id, reason, "no floor was set and the daemon's default floor could not be read, so the "+what+" was not sent ("+err.Error()+"): set MinimumIsolation, or fix what the error says", err)
}

// floorSource says which floor a run was held to.
type floorSource int

const (
	// floorSent: the floor the request carried.
	floorSent floorSource = iota
	// floorDefault: none was sent; the daemon's default floor, learnt from GET /v1/providers.
	floorDefault
	// floorSession: a session call; the floor its session was opened with (checked then).
	floorSession
)

func (f floorSource) String() string {
	switch f {
	case floorDefault:
		return "the daemon's default floor"
	case floorSession:
		return "the session's floor"
	}
	return "the floor sent"
}

// runExchange is one exchange whose answer is a run response.
type runExchange struct {
	method, url string
	// body is what is sent (nil: none).
	body []byte
	// headers are set on the request besides the client's own.
	headers map[string]string
	// sent is the request the answer's digest must cover.
	sent   *wireRequest
	floor  Isolation
	source floorSource
	// onChunk, when set, asks for a streamed answer and is given each chunk as it comes.
	onChunk func(Chunk)
}

// runExchange sends one request whose answer is a run response (whole, or streamed when
// x.onChunk is set) and verifies that answer.
func (c *Client) runExchange(ctx context.Context, x runExchange) (*Result, error) {
	id := x.sent.RequestID
	budget := defaultRunBudget
	if x.sent.Limits != nil && x.sent.Limits.TimeoutMS > 0 {
		budget = time.Duration(x.sent.Limits.TimeoutMS) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, budget+exchangeSlack)
	defer cancel()
	headers := x.headers
	if x.onChunk != nil {
		headers = map[string]string{"Accept": ndjson}
		for k, v := range x.headers {
			headers[k] = v
		}
	}
	resp, err := c.send(ctx, x.method, x.url, x.body, headers)
	if err != nil {
		return nil, sendFailure(id, x.url, err)
	}
	defer resp.Body.Close()
	if x.onChunk != nil && resp.StatusCode == http.StatusOK && isNDJSON(resp.Header) {
		return x.readStream(resp.Body)
	}
	answer, err := readAnswer(resp.Body)
	if err != nil {
		return nil, &MayHaveRunError{RequestID: id, Code: "transport", Status: resp.StatusCode,
			Message: fmt.Sprintf("the exchange with %s failed after the request was sent: %v", x.url, err), Err: err}
	}
	return x.answered(resp.StatusCode, answer)
}

// answered verifies a whole answer: a run response when status is 200, a refusal otherwise.
func (x *runExchange) answered(status int, answer []byte) (*Result, error) {
	if status != http.StatusOK {
		return nil, refusal(x.sent.RequestID, status, answer)
	}
	var res Result
	if _, err := readStrict(answer, &res); err != nil {
		return nil, &MayHaveRunError{RequestID: x.sent.RequestID, Code: "bad_response", Status: status,
			Message: "not a run response: " + err.Error()}
	}
	return verify(x.sent, x.floor, x.source, &res)
}

// sendFailure is the error of an exchange whose answer never came: not dispatched when the
// connection never opened, may have run otherwise.
func sendFailure(id, url string, err error) error {
	var ns *notSent
	if errors.As(err, &ns) {
		return refusedHere(id, ReasonEnvironment, fmt.Sprintf("cannot reach the daemon at %s (%v): check that plimsolld is running and the URL is right", url, ns.err), ns.err)
	}
	return &MayHaveRunError{RequestID: id, Code: "transport",
		Message: fmt.Sprintf("the exchange with %s failed after the request may have been sent: %v", url, err), Err: err}
}

// refusal reads an answer other than a run response to the request sent under id: its
// not-dispatched mark is believed only when it echoes id.
func refusal(id string, status int, answer []byte) error {
	e, err := readErrorAnswer(answer)
	if err != nil {
		return &MayHaveRunError{RequestID: id, Code: "bad_response", Status: status, Message: err.Error()}
	}
	switch {
	case e.Error.NotDispatched != nil && e.RequestID != nil && *e.RequestID == id:
		return &NotDispatchedError{RequestID: id, Reason: *e.Error.NotDispatched, Code: e.Error.Code,
			Message: e.Error.Message, Status: status, EndReason: e.Error.EndReason}
	case e.Error.NotDispatched != nil:
		echoed := "(none)"
		if e.RequestID != nil {
			echoed = *e.RequestID
		}
		return &MayHaveRunError{RequestID: id, Code: "unverified_refusal", Status: status,
			EchoedRequestID: e.RequestID, ClaimedReason: *e.Error.NotDispatched, EndReason: e.Error.EndReason,
			Message: fmt.Sprintf("an answer claimed `not dispatched (%s)` but echoed request id %s, not %s; something between this client and the daemon mixed up answers (%s)",
				*e.Error.NotDispatched, echoed, id, e.Error.Message)}
	default:
		return &MayHaveRunError{RequestID: id, Code: e.Error.Code, Status: status, EchoedRequestID: e.RequestID,
			EndReason: e.Error.EndReason, Message: fmt.Sprintf("HTTP %d: %s", status, e.Error.Message)}
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

// verify checks a 200 answer to the request sent, against floor (from source).
func verify(sent *wireRequest, floor Isolation, source floorSource, res *Result) (*Result, error) {
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
		return nil, &EvidenceMismatchError{RequestID: id, Provider: res.Provider, Isolation: weakest, Floor: floor,
			DefaultFloor: source == floorDefault, SessionFloor: source == floorSession}
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
		return nil, &RecordMismatchError{RequestID: id, Field: "minimum_isolation", Response: string(floor), Record: string(applied), Against: source.String()}
	}
	if sent.Provider != "" {
		for _, named := range []string{res.Provider, res.Record.Provider} {
			if named != sent.Provider {
				return nil, &ProviderMismatchError{RequestID: id, Asked: sent.Provider, Provider: named}
			}
		}
	}
	// The image named, like the tier: the record must say the code ran in it.
	if sent.Image != "" {
		if err := checkImage(id, sent.Image, res.Record.Image, "the run"); err != nil {
			return nil, err
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
	for i, image := range p.Images {
		for j, l := range image.Languages {
			if l != JavaScript && l != Python {
				return nil, bad(fmt.Sprintf("not a providers response: images[%d].languages[%d] `%s` is not one of javascript, python", i, j, l))
			}
		}
		for j, s := range image.Simulators {
			if !isSHA256Hex(s.SHA256) {
				return nil, bad(fmt.Sprintf("not a providers response: images[%d].simulators[%d].sha256 %q is not 64 lowercase hex digits", i, j, s.SHA256))
			}
		}
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
	return c.exchangeWith(ctx, method, url, body, nil)
}

// exchangeWith is exchange with headers of its own.
func (c *Client) exchangeWith(ctx context.Context, method, url string, body []byte, headers map[string]string) (int, []byte, error) {
	resp, err := c.send(ctx, method, url, body, headers)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := readAnswer(resp.Body)
	return resp.StatusCode, data, err
}

// send sends one request; the caller reads and closes the answer's body. Its error is a
// *notSent when nothing can have left.
func (c *Client) send(ctx context.Context, method, url string, body []byte, headers map[string]string) (*http.Response, error) {
	var reader io.Reader
	if body != nil {
		reader = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, reader)
	if err != nil {
		return nil, &notSent{err}
	}
	req.Header.Set("Authorization", "Bearer "+c.token.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", "plimsoll-client-go/"+Version)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, &notSent{op}
		}
		return nil, err
	}
	return resp, nil
}

// readAnswer reads a whole answer, at most maxAnswerBytes.
func readAnswer(body io.Reader) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(body, maxAnswerBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	if len(data) > maxAnswerBytes {
		return nil, fmt.Errorf("the answer is over %d bytes", maxAnswerBytes)
	}
	return data, nil
}

// Version is this client's version, sent in its User-Agent.
const Version = "0.1.0"

func preview(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	return string(b)
}
