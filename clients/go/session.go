// session.go: sessions (docs/sessions.md): one sandbox kept across calls (cells in an
// interpreter that keeps its state, shell steps, files), each call verified as a run is and
// checked against the session's chain; cells and steps streamed as they run.

package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
)

const (
	// ndjson is the media type of a streamed answer.
	ndjson = "application/x-ndjson"
	// requestIDHeader carries the request id of a session request without a JSON body
	// (DELETE, and a file's PUT and GET).
	requestIDHeader = "plimsoll-request-id"
)

// EndReason says why a session, or its interpreter, ended (docs/sessions.md, "Ends").
type EndReason string

// The nine end reasons.
const (
	// EndClosed: the caller closed the session (Session.Close).
	EndClosed EndReason = "closed"
	// EndIdleTimeout: no call came within the session's idle timeout.
	EndIdleTimeout EndReason = "idle_timeout"
	// EndMaxLifetime: the session's maximum lifetime passed.
	EndMaxLifetime EndReason = "max_lifetime"
	// EndInterpreterCrash: the interpreter exited or was killed during a cell (interpreter only).
	EndInterpreterCrash EndReason = "interpreter_crash"
	// EndOutOfMemory: the memory limit's OOM killer ended the interpreter (interpreter only).
	EndOutOfMemory EndReason = "out_of_memory"
	// EndCellTimeout: a cell ran past its timeout; the interpreter was killed (interpreter only).
	EndCellTimeout EndReason = "cell_timeout"
	// EndSandboxChanged: the sandbox, re-read before a call, differed from what it was at open.
	EndSandboxChanged EndReason = "sandbox_changed"
	// EndDaemonRestarted: the daemon that held the session stopped or was killed.
	EndDaemonRestarted EndReason = "daemon_restarted"
	// EndSandboxFailed: the sandbox failed under a call (that call may have run).
	EndSandboxFailed EndReason = "sandbox_failed"
)

// EndReasons lists the nine end reasons, in the order docs/sessions.md does.
var EndReasons = []EndReason{EndClosed, EndIdleTimeout, EndMaxLifetime, EndInterpreterCrash,
	EndOutOfMemory, EndCellTimeout, EndSandboxChanged, EndDaemonRestarted, EndSandboxFailed}

// EndsInterpreterOnly reports whether r ends only the interpreter (its state), not the
// session: the next cell must then ask for a restart.
func (r EndReason) EndsInterpreterOnly() bool {
	return r == EndInterpreterCrash || r == EndOutOfMemory || r == EndCellTimeout
}

// UnmarshalJSON accepts only the nine end reasons.
func (r *EndReason) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("an end reason must be a string: %w", err)
	}
	for _, known := range EndReasons {
		if EndReason(s) == known {
			*r = known
			return nil
		}
	}
	return fmt.Errorf("`%s` is not an end reason", s)
}

// OutputStream names an output stream.
type OutputStream string

// The two output streams.
const (
	Stdout OutputStream = "stdout"
	Stderr OutputStream = "stderr"
)

// UnmarshalJSON accepts only the two stream names.
func (o *OutputStream) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("a stream must be a string: %w", err)
	}
	if OutputStream(s) != Stdout && OutputStream(s) != Stderr {
		return fmt.Errorf("`%s` is not a stream (stdout, stderr)", s)
	}
	*o = OutputStream(s)
	return nil
}

// Chunk is output of a streamed cell or steps call as it was written. It is a preview,
// covered by no digest: the verified Result, whose output holds all of it, is what counts.
type Chunk struct {
	// Stream is the stream it was written to.
	Stream OutputStream
	// Offset counts the bytes of that stream before it, in the call (for steps, across the
	// call's steps).
	Offset uint64
	// Bytes are the bytes, exact.
	Bytes Bytes
}

// SessionOptions is what a session is opened with; the client adds the protocol number and
// a fresh request id.
type SessionOptions struct {
	// Language is the language of the session's interpreter (its cells).
	Language Language
	// MinimumIsolation is the floor. Empty: the daemon's default floor, which the client
	// reads once from GET /v1/providers and checks the session against.
	MinimumIsolation Isolation
	// Provider names a provider that keeps sessions (crun, runc, runsc).
	Provider string
	// Grant names a grant profile the operator defined (an API grant or an egress grant),
	// held for the session's whole life: each call's result lists the broker calls
	// (Output.Calls) and egress receipts (Output.Egress) since the call before. A call
	// cannot name one of its own. Empty: none.
	Grant string
	// Limits: memory, pids and disk for the session's whole life; timeout, output and
	// artifact caps as each call's defaults. nil leaves `limits` out.
	Limits *Limits
	// IdleTimeoutMS ends the session after this long without a call (0: the daemon's default).
	IdleTimeoutMS uint64
	// MaxLifetimeMS ends the session this long after it opened (0: the daemon's default).
	MaxLifetimeMS uint64
	// Image names the image the session runs in, fixed at open: a name or an identity
	// (empty: the operator's default image). The session, and every call's record, must name
	// it, or the open (or the call) fails with an *ImageMismatchError.
	Image string
}

// SessionInfo is a session as the daemon shows it (open, show, list, close).
type SessionInfo struct {
	Protocol uint32 `json:"protocol"`
	// RequestID is the id of the request this answers (open, close); "" on a GET.
	RequestID string `json:"request_id,omitempty"`
	// SessionID is its id (`ses_` + 16 hex digits naming the daemon instance + `_` + 32).
	SessionID string `json:"session_id"`
	// Language is its interpreter's language.
	Language Language `json:"language"`
	// Provider is the provider it runs at.
	Provider string `json:"provider"`
	// Isolation is that provider's tier, measured at open.
	Isolation Isolation `json:"isolation"`
	// MinimumIsolation is the floor it was opened with; every call's record states it.
	MinimumIsolation Isolation `json:"minimum_isolation"`
	// EvidenceSHA256 is the provider's evidence digest at open; every call's record names it.
	EvidenceSHA256 string `json:"evidence_sha256"`
	// Environment is the sandbox image identity; every call's record names it.
	Environment string `json:"environment"`
	// Image is the image it runs in, fixed at open (every call's record names it too); nil
	// from a daemon without images.
	Image *ImageRef `json:"image,omitempty"`
	// Wall is its sandbox at open, which every call's re-check compares with.
	Wall          Wall   `json:"wall"`
	OpenedUnixMS  uint64 `json:"opened_unix_ms"`
	ExpiresUnixMS uint64 `json:"expires_unix_ms"`
	IdleTimeoutMS uint64 `json:"idle_timeout_ms"`
	// Calls is how many calls it has answered (the sequence number of the last record).
	Calls uint64 `json:"calls"`
	// LastRecordSHA256 is the record digest of its last call; "" before the first.
	LastRecordSHA256 string `json:"last_record_sha256,omitempty"`
	// InterpreterAlive: its interpreter is alive with its state (false after it ended,
	// until a cell asks for a restart).
	InterpreterAlive bool `json:"interpreter_alive"`
	// EndReason says why it ended; "" while it is open.
	EndReason EndReason `json:"end_reason,omitempty"`
	// Origin says where it came from when it was restored or forked from a snapshot (every
	// call's record says the same); nil for a session opened fresh.
	Origin *SessionOrigin `json:"origin,omitempty"`
}

// SessionList is the answer to GET /v1/sessions: the caller's own open sessions.
type SessionList struct {
	Protocol uint32        `json:"protocol"`
	Sessions []SessionInfo `json:"sessions"`
}

// CellOptions shape one cell.
type CellOptions struct {
	// Restart starts a fresh interpreter before the cell (its state is then lost, and the
	// result says StateKept false): needed after an interpreter end.
	Restart bool
	// TimeoutMS is this cell's timeout (0: the session's).
	TimeoutMS uint64
	// OnChunk, when set, has the answer streamed and is called with each chunk of output as
	// it comes, in order, on the calling goroutine (it must not call the Session).
	OnChunk func(Chunk)
}

// StepsOptions shape one steps call.
type StepsOptions struct {
	// TimeoutMS is this call's timeout (0: the session's).
	TimeoutMS uint64
	// OnChunk: as in CellOptions.
	OnChunk func(Chunk)
}

// Session is an open session of this client's caller. Its calls are served one at a time,
// in order, and the client follows its chain: each call's record must name this session,
// the next sequence number and the previous call's record digest, and the session's
// provider, tier, evidence, environment and origin (where a restored or forked session came
// from; none for a session opened fresh). After a call that may have run without an
// answer it could verify, it sends nothing more (ErrChainInDoubt) until Resync. It is safe
// for concurrent use (calls wait for each other).
//
// A session can outlive a daemon restart: the daemon saves it on SIGTERM and the next one
// restores it under the same id. From the call after the last one saved, its records carry
// that restore as their origin (its parent: the session itself, at that call and record),
// and its tier and evidence are the ones the restoring daemon measured; its provider and
// environment stay. The client takes that change there (restoredHere), and nowhere else.
type Session struct {
	client *Client
	id     string
	// image is the image the open named ("" when it named none): every call's record must
	// name it.
	image string

	mu   sync.Mutex
	info SessionInfo
	// sequence and last are the chain as this client verified it: the last call's sequence
	// number and record digest.
	sequence uint64
	last     string
	// doubt is the error of a call that may have run without an answer this client could
	// verify: where the chain stands is then unknown, and no call is sent until Resync.
	doubt error
	// resandboxed: a call's record said the session was restored (a daemon restart) since
	// info was last shown, so its wall and opening time there are not known yet; the next
	// show takes them from the daemon.
	resandboxed bool
}

// ID is the session's id.
func (s *Session) ID() string { return s.id }

// Doubt is the error of the call that put the session's chain in doubt (a call that may
// have run without an answer this client could verify), or nil. While it is set, calls are
// refused here, unsent (code `chain_in_doubt`), until Resync.
func (s *Session) Doubt() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.doubt
}

// Info is the session as last seen: at open, after Refresh or Close, and with its calls,
// last record and interpreter updated by each verified call (and, from a call after a daemon
// restart restored the session, its origin, tier and evidence).
func (s *Session) Info() SessionInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info
}

// OpenSession opens a session and checks the answer: the echoed request id, the tier
// against the floor (the one set, or the daemon's default floor), the floor the daemon
// says it opened the session with, the provider if one was named. A refusal is believed
// only when it echoes the request id. An ErrMayHaveRun error here means a session may have
// been opened (ListSessions shows it; it ends at its idle timeout). When the answer is the
// daemon's but fails a check, the client closes that session before returning the error.
func (c *Client) OpenSession(ctx context.Context, opts SessionOptions) (*Session, error) {
	id := NewRequestID()
	refuse := func(err error) error { return refusedHere(id, ReasonRequest, err.Error(), err) }
	w := wireSessionOpen{Protocol: Protocol, RequestID: id, Language: opts.Language,
		MinimumIsolation: opts.MinimumIsolation, Provider: opts.Provider, Grant: opts.Grant, Limits: opts.Limits,
		IdleTimeoutMS: opts.IdleTimeoutMS, MaxLifetimeMS: opts.MaxLifetimeMS, Image: opts.Image}
	if err := w.validate(); err != nil {
		return nil, refuse(err)
	}
	body, err := json.Marshal(w)
	if err != nil {
		return nil, refuse(fmt.Errorf("the request does not serialise: %w", err))
	}
	if len(body) > c.maxBody {
		return nil, refuse(&RequestTooLargeError{Size: len(body), Limit: c.maxBody})
	}
	floor, source := w.MinimumIsolation, floorSent
	if floor == "" {
		if floor, err = c.defaultFloorOrRefusal(ctx, id, "session open"); err != nil {
			return nil, err
		}
		source = floorDefault
	}
	exchangeCtx, cancel := context.WithTimeout(ctx, exchangeSlack)
	defer cancel()
	url := c.baseURL + "/v1/sessions"
	status, answer, err := c.exchangeWith(exchangeCtx, http.MethodPost, url, body, nil)
	if err != nil {
		return nil, sendFailure(id, url, err)
	}
	if status != http.StatusOK {
		return nil, refusal(id, status, answer)
	}
	bad := func(message string) error {
		return &MayHaveRunError{RequestID: id, Code: "bad_response", Status: status, Message: message}
	}
	var info SessionInfo
	if _, err := readStrict(answer, &info); err != nil {
		return nil, bad("not a session: " + err.Error())
	}
	if info.RequestID != id {
		echoed := info.RequestID
		return nil, &MayHaveRunError{RequestID: id, Code: "request_id_mismatch", Status: status, EchoedRequestID: &echoed,
			Message: fmt.Sprintf("the session answers request id %q, not %s; something between this client and the daemon mixed up answers, so this session is not yours", echoed, id)}
	}
	if info.Protocol != Protocol {
		return nil, bad(fmt.Sprintf("the session speaks protocol %d, this client protocol %d", info.Protocol, Protocol))
	}
	if err := validateSessionID(info.SessionID); err != nil {
		return nil, bad(err.Error())
	}
	s := &Session{client: c, id: info.SessionID, info: info, image: opts.Image}
	if err := checkOpened(id, &w, floor, source, &info); err != nil {
		// The session is this request's and open, but not one to use: close it rather
		// than leave it to its idle timeout.
		closeCtx, cancel := context.WithTimeout(context.Background(), exchangeSlack)
		defer cancel()
		if _, cerr := s.Close(closeCtx); cerr != nil {
			return nil, &CleanupError{Err: err, Cleanup: cerr}
		}
		return nil, err
	}
	return s, nil
}

// checkOpened checks a new session against what its open asked for.
func checkOpened(id string, w *wireSessionOpen, floor Isolation, source floorSource, info *SessionInfo) error {
	bad := func(message string) error {
		return &MayHaveRunError{RequestID: id, Code: "bad_response", Status: http.StatusOK, Message: message}
	}
	if info.EndReason != "" {
		return bad(fmt.Sprintf("the new session %s says it has ended (%s)", info.SessionID, info.EndReason))
	}
	if info.Language != w.Language {
		return bad(fmt.Sprintf("the new session's interpreter is %q, not %q as asked", info.Language, w.Language))
	}
	if info.Calls != 0 || info.LastRecordSHA256 != "" {
		return bad(fmt.Sprintf("the new session %s says it has answered %d calls already", info.SessionID, info.Calls))
	}
	// As for a run: the tier against the floor, the floor the daemon states against the one
	// held, the provider against the one named.
	if !info.Isolation.AtLeast(floor) {
		return &EvidenceMismatchError{RequestID: id, Provider: info.Provider, Isolation: info.Isolation, Floor: floor, DefaultFloor: source == floorDefault}
	}
	if !info.Isolation.AtLeast(info.MinimumIsolation) {
		return &EvidenceMismatchError{RequestID: id, Provider: info.Provider, Isolation: info.Isolation, Floor: info.MinimumIsolation, SessionFloor: true}
	}
	if info.MinimumIsolation != floor {
		return &RecordMismatchError{RequestID: id, Field: "minimum_isolation", Response: string(floor), Record: string(info.MinimumIsolation), Against: source.String()}
	}
	if w.Provider != "" && info.Provider != w.Provider {
		return &ProviderMismatchError{RequestID: id, Asked: w.Provider, Provider: info.Provider}
	}
	if w.Image != "" {
		return checkImage(id, w.Image, info.Image, "the session")
	}
	return nil
}

// validateSessionID checks the shape of a session id: `ses_`, 16 lowercase hex digits, `_`,
// 32 lowercase hex digits. The id goes into URL paths: nothing else is let through.
func validateSessionID(id string) error {
	isHex := func(s string, n int) bool {
		if len(s) != n {
			return false
		}
		for _, c := range []byte(s) {
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
		return true
	}
	if strings.HasPrefix(id, "ses_") {
		daemon, session, found := strings.Cut(id[len("ses_"):], "_")
		if found && isHex(daemon, 16) && isHex(session, 32) {
			return nil
		}
	}
	return fmt.Errorf("%q is not a session id (`ses_`, 16 and 32 lowercase hex digits joined by `_`)", id)
}

// ResumeSession is this caller's open session id, resumed where the daemon says its chain
// stands (its last call's sequence number and record digest): for a caller that did not
// open it in this process. From there every call is checked as in a session opened here;
// the calls before are taken on the daemon's word (a signer checks them from their records).
func (c *Client) ResumeSession(ctx context.Context, id string) (*Session, error) {
	if err := validateSessionID(id); err != nil {
		return nil, &SessionError{SessionID: id, Code: "request", Message: err.Error()}
	}
	url := c.sessionURL(id)
	var info SessionInfo
	if err := c.sessionGet(ctx, id, url, &info); err != nil {
		return nil, err
	}
	bad := func(message string) error {
		return &SessionError{SessionID: id, URL: url, Status: http.StatusOK, Code: "bad_response", Message: message}
	}
	switch {
	case info.SessionID != id:
		return nil, bad(fmt.Sprintf("the answer is session %s", info.SessionID))
	case info.EndReason != "":
		return nil, bad(fmt.Sprintf("the answer says the session ended (%s)", info.EndReason))
	case !info.Isolation.AtLeast(info.MinimumIsolation):
		return nil, bad(fmt.Sprintf("the session's tier %s is below its floor %s", info.Isolation, info.MinimumIsolation))
	case (info.Calls == 0) != (info.LastRecordSHA256 == ""):
		return nil, bad(fmt.Sprintf("the session says it answered %d calls, last record %q", info.Calls, info.LastRecordSHA256))
	}
	return &Session{client: c, id: id, info: info, sequence: info.Calls, last: info.LastRecordSHA256}, nil
}

// ListSessions is this caller's open sessions.
func (c *Client) ListSessions(ctx context.Context) (*SessionList, error) {
	var list SessionList
	if err := c.sessionGet(ctx, "", c.baseURL+"/v1/sessions", &list); err != nil {
		return nil, err
	}
	return &list, nil
}

func (c *Client) sessionURL(id string) string { return c.baseURL + "/v1/sessions/" + id }

// sessionGet reads a session or the list (a GET: nothing runs) strictly into v.
func (c *Client) sessionGet(ctx context.Context, id, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, exchangeSlack)
	defer cancel()
	status, answer, err := c.exchange(ctx, http.MethodGet, url, nil)
	if err != nil {
		return &SessionError{SessionID: id, URL: url, Code: "transport", Message: err.Error(), Err: err}
	}
	bad := func(message string) error {
		return &SessionError{SessionID: id, URL: url, Status: status, Code: "bad_response", Message: message}
	}
	if status != http.StatusOK {
		e, err := readErrorAnswer(answer)
		if err != nil {
			return bad(err.Error())
		}
		se := &SessionError{SessionID: id, URL: url, Status: status, Code: e.Error.Code, Message: e.Error.Message, EndReason: e.Error.EndReason}
		if e.Error.NotDispatched != nil {
			se.Reason = *e.Error.NotDispatched
		}
		return se
	}
	generic, err := readStrict(answer, v)
	if err != nil {
		return bad("not a session answer: " + err.Error())
	}
	if p, _ := generic.(map[string]any)["protocol"].(json.Number); p.String() != strconv.Itoa(Protocol) {
		return bad(fmt.Sprintf("the answer speaks protocol %s, this client protocol %d", p, Protocol))
	}
	return nil
}

// Refresh reads the session as the daemon shows it now (its calls, last record, whether its
// interpreter is alive, why it ended) into Info. The chain this client follows is not
// moved by it. What was fixed at open must not have changed, but for a restore of the
// session under its own id (a daemon restart) right after the last call this client
// verified: then its origin, tier, evidence, wall and opening time are the restoring
// daemon's.
func (s *Session) Refresh(ctx context.Context) (*SessionInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.show(ctx)
}

// Resync takes the chain up where the daemon says it stands now (its last call's sequence
// number and record digest), as ResumeSession does, and lifts the doubt a call that may
// have run put on it: the calls since the last one this client verified are taken on the
// daemon's word (a signer checks them from their records). As for Refresh, the session must
// be the one opened, or restored under its own id after a daemon restart right after the
// last call this client verified; for any other change of origin, ResumeSession takes the
// daemon's word for all of it.
func (s *Session) Resync(ctx context.Context) (*SessionInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	info, err := s.show(ctx)
	if err != nil {
		return nil, err
	}
	if (info.Calls == 0) != (info.LastRecordSHA256 == "") {
		return nil, &SessionError{SessionID: s.id, URL: s.client.sessionURL(s.id), Status: http.StatusOK, Code: "bad_response",
			Message: fmt.Sprintf("the session says it answered %d calls, last record %q", info.Calls, info.LastRecordSHA256)}
	}
	s.sequence, s.last, s.doubt = info.Calls, info.LastRecordSHA256, nil
	return info, nil
}

// show reads the session as the daemon shows it now into s.info; s.mu is held.
func (s *Session) show(ctx context.Context) (*SessionInfo, error) {
	url := s.client.sessionURL(s.id)
	var info SessionInfo
	if err := s.client.sessionGet(ctx, s.id, url, &info); err != nil {
		return nil, err
	}
	// What is fixed at open stays so, but for a restore under the session's own id (a daemon
	// restart) at the chain verified here: its sandbox is the restoring daemon's, which gives
	// its tier, evidence and wall, and its opening time again from its age.
	bad := func(message string) error {
		return &SessionError{SessionID: s.id, URL: url, Status: http.StatusOK, Code: "bad_response", Message: message}
	}
	originChanged := !sameOrigin(info.Origin, s.info.Origin)
	restored := originChanged && s.restoredHere(info.Origin)
	if originChanged && !restored {
		return nil, bad(fmt.Sprintf("the session now shows origin %s, not %s: a session's origin changes only when a daemon restart restored it under its own id right after the last call this client verified (call %d); ResumeSession takes the daemon's word for its chain",
			info.Origin.String(), s.info.Origin.String(), s.sequence))
	}
	was, now := s.info, info
	for _, i := range []*SessionInfo{&was, &now} {
		i.Protocol, i.RequestID, i.ExpiresUnixMS, i.IdleTimeoutMS = 0, "", 0, 0
		i.Calls, i.LastRecordSHA256, i.InterpreterAlive, i.EndReason = 0, "", false, ""
		if restored || s.resandboxed {
			i.Wall, i.OpenedUnixMS = Wall{}, 0
		}
		if restored {
			i.Isolation, i.EvidenceSHA256, i.Origin = "", "", nil
		}
	}
	if !reflect.DeepEqual(was, now) {
		return nil, bad(fmt.Sprintf("the session now shows another provider, tier, floor, evidence, environment or wall than at open: %+v, was %+v", now, was))
	}
	if !info.Isolation.AtLeast(info.MinimumIsolation) {
		return nil, bad(fmt.Sprintf("the session's tier %s is below its floor %s", info.Isolation, info.MinimumIsolation))
	}
	if (restored || s.resandboxed) && absDiff(info.OpenedUnixMS, s.info.OpenedUnixMS) > restoredOpenSlackMS {
		return nil, bad(fmt.Sprintf("the restored session says it opened at %d ms, not %d ms as before the restart", info.OpenedUnixMS, s.info.OpenedUnixMS))
	}
	s.info, s.resandboxed = info, false
	return &info, nil
}

// restoredOpenSlackMS is how far a restored session's opening time may move: the restoring
// daemon gives it again from the session's age, which it counts to the millisecond.
const restoredOpenSlackMS = 1000

func absDiff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

// restoredHere reports whether o says the session was restored under its own id (a daemon
// restart saved it, the next daemon restored it) right after the last call this client
// verified: its parent is this session, at the chain's call and record. s.mu is held.
func (s *Session) restoredHere(o *SessionOrigin) bool {
	return o != nil && o.Start == OriginRestored && o.ParentSessionID == s.id &&
		o.ParentCalls == s.sequence && o.ParentRecordSHA256 == s.last
}

// Close closes the session: its sandbox is removed, and the answer says it ended `closed`.
// A refusal is believed only when it echoes the request id (sent in the
// plimsoll-request-id header): then the session was not closed by this call (for
// ErrSessionEnded, EndReason says why it had ended).
func (s *Session) Close(ctx context.Context) (*SessionInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := NewRequestID()
	ctx, cancel := context.WithTimeout(ctx, exchangeSlack)
	defer cancel()
	url := s.client.sessionURL(s.id)
	status, answer, err := s.client.exchangeWith(ctx, http.MethodDelete, url, nil, map[string]string{requestIDHeader: id})
	if err != nil {
		return nil, sendFailure(id, url, err)
	}
	if status != http.StatusOK {
		return nil, refusal(id, status, answer)
	}
	bad := func(message string) error {
		return &MayHaveRunError{RequestID: id, Code: "bad_response", Status: status, Message: message}
	}
	var info SessionInfo
	if _, err := readStrict(answer, &info); err != nil {
		return nil, bad("not a session: " + err.Error())
	}
	switch {
	case info.RequestID != id:
		echoed := info.RequestID
		return nil, &MayHaveRunError{RequestID: id, Code: "request_id_mismatch", Status: status, EchoedRequestID: &echoed,
			Message: fmt.Sprintf("the close answers request id %q, not %s", echoed, id)}
	case info.SessionID != s.id:
		return nil, bad(fmt.Sprintf("the close answers for session %s, not %s", info.SessionID, s.id))
	case info.EndReason != EndClosed:
		return nil, bad(fmt.Sprintf("the close answered end reason %q, not %q", info.EndReason, EndClosed))
	}
	s.info = info
	return &info, nil
}

// callKind is what a session call is: a cell (an interpreter's) or a job (files, steps,
// artifacts).
type callKind int

const (
	callCell callKind = iota
	callJob
)

// request is a session call's request under a fresh id: no floor, provider or grant (the
// session's hold), limits only a timeout.
func (s *Session) request(run wireRun, timeoutMS uint64) wireRequest {
	w := wireRequest{Protocol: Protocol, RequestID: NewRequestID(), Run: run}
	if timeoutMS > 0 {
		w.Limits = &Limits{TimeoutMS: timeoutMS}
	}
	return w
}

// Cell runs code in the session's interpreter, whose state (variables, imports, functions)
// is the previous cell's, and verifies the answer as a run's and as the next link of the
// session's chain. The result says StateKept, and InterpreterEnd when the interpreter ended
// during the cell (the next cell must then set Restart).
func (s *Session) Cell(ctx context.Context, code string, opts CellOptions) (*Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	path := "/cells"
	if opts.Restart {
		path += "?restart=true"
	}
	w := s.request(snippetWire(Snippet{Language: s.info.Language, Code: code}), opts.TimeoutMS)
	return s.jsonCall(ctx, path, w, opts.OnChunk, callCell)
}

// Steps runs shell steps in order by /bin/sh -c in the session's /work (the first that fails
// stops them) and verifies the answer as Cell does.
func (s *Session) Steps(ctx context.Context, steps []string, opts StepsOptions) (*Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	project := Project{}
	for _, run := range steps {
		project.Steps = append(project.Steps, Step{Run: run})
	}
	w := s.request(projectWire(project), opts.TimeoutMS)
	return s.jsonCall(ctx, "/steps", w, opts.OnChunk, callJob)
}

// inDoubt is the refusal, made here, of a call while the chain is in doubt; nil otherwise.
func (s *Session) inDoubt(id string) error {
	if s.doubt == nil {
		return nil
	}
	// The doubt's error is not wrapped: this call did not run, and must not match
	// ErrMayHaveRun (Session.Doubt says what happened to the earlier one).
	return &NotDispatchedError{RequestID: id, Reason: ReasonRequest, Code: "chain_in_doubt",
		Message: fmt.Sprintf("an earlier call of session %s may have run without an answer this client could verify (%v), so where its chain stands is unknown: nothing more is sent until Resync takes the daemon's word for it", s.id, s.doubt)}
}

// settle puts the chain in doubt after a call that may have run unverified.
func (s *Session) settle(res *Result, err error) (*Result, error) {
	if err != nil {
		if _, refused := NotDispatchedReason(err); !refused {
			s.doubt = err
		}
		return nil, err
	}
	return res, nil
}

// jsonCall sends a cell or steps call (a run request as its body) and follows the chain.
func (s *Session) jsonCall(ctx context.Context, path string, w wireRequest, onChunk func(Chunk), kind callKind) (*Result, error) {
	if err := s.inDoubt(w.RequestID); err != nil {
		return nil, err
	}
	if err := w.validateSessionCall(); err != nil {
		return nil, refusedHere(w.RequestID, ReasonRequest, err.Error(), err)
	}
	body, sent, err := s.client.prepare(w)
	if err != nil {
		return nil, refusedHere(w.RequestID, ReasonRequest, err.Error(), err)
	}
	res, err := s.client.runExchange(ctx, runExchange{method: http.MethodPost, url: s.client.sessionURL(s.id) + path,
		body: body, sent: sent, floor: s.info.MinimumIsolation, source: floorSession, onChunk: onChunk})
	if err == nil {
		res, err = s.follow(res, kind)
	}
	return s.settle(res, err)
}

// Put writes content, bytes exact, to /work/path in the session (PUT; the call stands for
// the project that writes that one file, whose digest its record carries).
func (s *Session) Put(ctx context.Context, path string, content []byte) (*Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.request(wireRun{Kind: "project", Files: []wireFile{{Path: path, Content: Bytes(content)}}}, 0)
	if err := s.inDoubt(w.RequestID); err != nil {
		return nil, err
	}
	if len(content) > s.client.maxBody {
		err := &RequestTooLargeError{Size: len(content), Limit: s.client.maxBody}
		return nil, refusedHere(w.RequestID, ReasonRequest, err.Error(), err)
	}
	if content == nil {
		content = []byte{}
	}
	return s.fileCall(ctx, http.MethodPut, path, w, content)
}

// Get reads /work/path from the session (GET; the call stands for the project that returns
// that one artifact). The artifact says whether the file was found, its size, its bytes
// (exact) and whether they were truncated at the artifact limit.
func (s *Session) Get(ctx context.Context, path string) (*Artifact, *Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.request(wireRun{Kind: "project", Artifacts: []string{path}}, 0)
	if err := s.inDoubt(w.RequestID); err != nil {
		return nil, nil, err
	}
	res, err := s.fileCall(ctx, http.MethodGet, path, w, nil)
	if err != nil {
		return nil, nil, err
	}
	return &res.Output.Artifacts[0], res, nil
}

// fileCall sends a file's PUT or GET, its request id in the header, and verifies the answer
// against the request it stands for.
func (s *Session) fileCall(ctx context.Context, method, path string, w wireRequest, body []byte) (*Result, error) {
	id := w.RequestID
	if err := w.validateSessionCall(); err != nil {
		return nil, refusedHere(id, ReasonRequest, err.Error(), err)
	}
	// The digest covers the request the call stands for, read back as a sent one is.
	_, sent, err := serialise(w)
	if err != nil {
		return nil, refusedHere(id, ReasonRequest, err.Error(), err)
	}
	segments := strings.Split(path, "/")
	for i, seg := range segments {
		segments[i] = url.PathEscape(seg)
	}
	headers := map[string]string{requestIDHeader: id}
	if body != nil {
		headers["Content-Type"] = "application/octet-stream"
	}
	res, err := s.client.runExchange(ctx, runExchange{method: method,
		url:  s.client.sessionURL(s.id) + "/files/" + strings.Join(segments, "/"),
		body: body, headers: headers, sent: sent, floor: s.info.MinimumIsolation, source: floorSession})
	if err == nil && method == http.MethodGet {
		if arts := res.Output.Artifacts; len(arts) != 1 || arts[0].Path != path {
			err = &MayHaveRunError{RequestID: id, Code: "bad_response", Status: http.StatusOK,
				Message: fmt.Sprintf("the answer to reading %q holds %d artifacts, not that one", path, len(arts))}
		}
	}
	if err == nil {
		res, err = s.follow(res, callJob)
	}
	return s.settle(res, err)
}

// follow checks a verified call's place in the session's chain and moves the chain on.
func (s *Session) follow(res *Result, kind callKind) (*Result, error) {
	mismatch := func(field, want, got string) error {
		return &ChainMismatchError{RequestID: res.RequestID, SessionID: s.id, Field: field, Want: want, Got: got}
	}
	link := res.Record.Session
	if link == nil {
		return nil, mismatch("session", s.id, "(none)")
	}
	// Every call of a restored or forked session says where it came from, as its session
	// does; a session opened fresh says nothing of the kind. Only a restore of this session
	// under its own id (a daemon restart), at the call after the last one verified here,
	// brings a new origin; from it on, the session runs in the sandbox the restoring daemon
	// made, at the tier and evidence that daemon measured.
	restored := !sameOrigin(link.Origin, s.info.Origin) && s.restoredHere(link.Origin)
	isolation, evidence := s.info.Isolation, s.info.EvidenceSHA256
	if restored {
		isolation, evidence = res.Record.Isolation, res.Record.EvidenceSHA256
	}
	type check struct{ field, want, got string }
	first := func(checks ...check) error {
		for _, f := range checks {
			if f.want != f.got {
				return mismatch(f.field, f.want, f.got)
			}
		}
		return nil
	}
	if err := first(
		check{"session_id", s.id, link.SessionID},
		check{"sequence", strconv.FormatUint(s.sequence+1, 10), strconv.FormatUint(link.Sequence, 10)},
		check{"previous_record_sha256", orNone(s.last), orNone(link.PreviousRecordSHA256)},
	); err != nil {
		return nil, err
	}
	if !restored && !sameOrigin(link.Origin, s.info.Origin) {
		return nil, mismatch("origin", s.info.Origin.String(), link.Origin.String())
	}
	if err := first(
		check{"provider", s.info.Provider, res.Record.Provider},
		check{"isolation", string(isolation), string(res.Record.Isolation)},
		check{"evidence_sha256", evidence, res.Record.EvidenceSHA256},
		check{"environment", s.info.Environment, res.Record.Environment},
	); err != nil {
		return nil, err
	}
	// The image the open named, like the session's floor: every call's record must name it.
	if s.image != "" {
		if err := checkImage(res.RequestID, s.image, res.Record.Image, "the session call"); err != nil {
			return nil, err
		}
	}
	// What the types cannot say: a cell says whether the state was kept, and an interpreter
	// end only ends the interpreter; a job says neither.
	o := &res.Output
	problem := ""
	switch {
	case kind == callCell && o.StateKept == nil:
		problem = "a cell's result does not say `state_kept`"
	case kind == callCell && o.InterpreterEnd != "" && (*o.StateKept || !o.InterpreterEnd.EndsInterpreterOnly()):
		problem = fmt.Sprintf("a cell's result says interpreter end %q with state kept %v", o.InterpreterEnd, *o.StateKept)
	case kind == callJob && (o.StateKept != nil || o.InterpreterEnd != ""):
		problem = "a result of steps or files speaks of the interpreter (`state_kept`, `interpreter_end`)"
	}
	if problem != "" {
		return nil, &MayHaveRunError{RequestID: res.RequestID, Code: "bad_response", Status: http.StatusOK, Message: "the result is malformed: " + problem}
	}
	if restored {
		origin := *link.Origin
		s.info.Origin, s.info.Isolation, s.info.EvidenceSHA256 = &origin, isolation, evidence
		s.resandboxed = true
	}
	s.sequence, s.last = link.Sequence, res.Record.RecordSHA256
	s.info.Calls, s.info.LastRecordSHA256 = link.Sequence, res.Record.RecordSHA256
	if kind == callCell {
		s.info.InterpreterAlive = o.InterpreterEnd == ""
	}
	return res, nil
}

// isNDJSON reports whether an answer is streamed.
func isNDJSON(h http.Header) bool {
	t, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && t == ndjson
}

// readStream reads a streamed answer: chunks to x.onChunk as they come, then the one final
// line, verified exactly as a whole answer is.
func (x *runExchange) readStream(body io.Reader) (*Result, error) {
	id := x.sent.RequestID
	limited := &io.LimitedReader{R: body, N: maxAnswerBytes + 1}
	r := bufio.NewReader(limited)
	bad := func(message string) error {
		return &MayHaveRunError{RequestID: id, Code: "bad_response", Status: http.StatusOK, Message: message}
	}
	for {
		line, err := r.ReadBytes('\n')
		if limited.N <= 0 {
			return nil, &MayHaveRunError{RequestID: id, Code: "transport", Status: http.StatusOK,
				Message: fmt.Sprintf("the streamed answer is over %d bytes", maxAnswerBytes)}
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, &MayHaveRunError{RequestID: id, Code: "transport", Status: http.StatusOK,
				Message: fmt.Sprintf("the stream from %s broke before its answer: %v", x.url, err), Err: err}
		}
		line = bytes.TrimSuffix(line, []byte{'\n'})
		if len(line) == 0 {
			if err != nil {
				return nil, &MayHaveRunError{RequestID: id, Code: "transport", Status: http.StatusOK,
					Message: fmt.Sprintf("the stream from %s ended before its answer", x.url), Err: io.ErrUnexpectedEOF}
			}
			continue // a keep-alive, sent while the call is silent
		}
		var l streamLine
		if _, perr := readStrict(line, &l); perr != nil {
			return nil, bad(fmt.Sprintf("not a stream line (%v): %q", perr, preview(line)))
		}
		members := 0
		for _, present := range []bool{l.Chunk != nil, l.Response != nil, l.Error != nil} {
			if present {
				members++
			}
		}
		if members != 1 {
			return nil, bad(fmt.Sprintf("a stream line holds %d of `chunk`, `response`, `error`, not one: %q", members, preview(line)))
		}
		switch {
		case l.Chunk != nil:
			if !l.Chunk.Preview {
				return nil, bad("a chunk does not say it is a preview")
			}
			x.onChunk(Chunk{Stream: l.Chunk.Stream, Offset: l.Chunk.Offset, Bytes: l.Chunk.Bytes})
		case l.Response != nil:
			return x.answered(http.StatusOK, l.Response)
		default:
			// The stream's status was 200; its last line is the refusal, read as any other.
			return nil, refusal(id, http.StatusOK, l.Error)
		}
		if err != nil {
			return nil, &MayHaveRunError{RequestID: id, Code: "transport", Status: http.StatusOK,
				Message: fmt.Sprintf("the stream from %s ended before its answer", x.url), Err: io.ErrUnexpectedEOF}
		}
	}
}
