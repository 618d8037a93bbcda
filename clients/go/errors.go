// errors.go: the client's errors. Each says whether the code could have run; test them with
// errors.Is and errors.As, never by their text.

package sandbox

import (
	"errors"
	"fmt"
	"strings"
)

// sentinel is an error value to compare with errors.Is.
type sentinel struct{ text string }

func (s *sentinel) Error() string { return s.text }

// ErrNotDispatched matches every error that promises nothing ran: a request refused here
// before sending, a daemon that could not be reached, or a refusal from the daemon that
// echoed this request's id. Each also matches its reason's sentinel below.
var ErrNotDispatched error = &sentinel{"not dispatched"}

// One sentinel per not-dispatched reason.
var (
	// ErrInvalidRequest: reason `request` (malformed, out of bounds, over the body limit).
	ErrInvalidRequest error = &sentinel{"not dispatched (request)"}
	// ErrPermissionDenied: reason `permission` (unknown caller or token, grant not allowed).
	ErrPermissionDenied error = &sentinel{"not dispatched (permission)"}
	// ErrProtocolNotServed: reason `protocol`.
	ErrProtocolNotServed error = &sentinel{"not dispatched (protocol)"}
	// ErrUnsupported: reason `unsupported` (no provider meeting the floor can do this run).
	ErrUnsupported error = &sentinel{"not dispatched (unsupported)"}
	// ErrInsufficientIsolation: reason `isolation`: no available provider meets the floor,
	// and nothing ran.
	ErrInsufficientIsolation error = &sentinel{"not dispatched (isolation)"}
	// ErrEnvironment: reason `environment` (a provider's environment failed its check, the
	// named provider is unavailable, or the daemon could not be reached).
	ErrEnvironment error = &sentinel{"not dispatched (environment)"}
	// ErrCapacity: reason `capacity` (admission limits); retrying later may succeed.
	ErrCapacity error = &sentinel{"not dispatched (capacity)"}
)

// ReasonError returns the sentinel of a reason (nil for a string that is not one).
func ReasonError(r Reason) error {
	switch r {
	case ReasonRequest:
		return ErrInvalidRequest
	case ReasonPermission:
		return ErrPermissionDenied
	case ReasonProtocol:
		return ErrProtocolNotServed
	case ReasonUnsupported:
		return ErrUnsupported
	case ReasonIsolation:
		return ErrInsufficientIsolation
	case ReasonEnvironment:
		return ErrEnvironment
	case ReasonCapacity:
		return ErrCapacity
	}
	return nil
}

// ErrMayHaveRun matches every run error that does not promise nothing ran: the code may
// have run (or did). Never retry such a call automatically: a retry may run the code twice.
var ErrMayHaveRun error = &sentinel{"the code may have run"}

// ErrEvidenceMismatch matches an *EvidenceMismatchError: the run used a tier below the floor.
var ErrEvidenceMismatch error = &sentinel{"evidence mismatch"}

// ErrProviderMismatch matches a *ProviderMismatchError: another provider than the one named ran it.
var ErrProviderMismatch error = &sentinel{"provider mismatch"}

// ErrImageMismatch matches an *ImageMismatchError: the code ran in another image than the one
// named, or the answer names none.
var ErrImageMismatch error = &sentinel{"image mismatch"}

// ErrDigestMismatch matches a *DigestMismatchError: a digest recomputed here differs.
var ErrDigestMismatch error = &sentinel{"digest mismatch"}

// ErrRecordMismatch matches a *RecordMismatchError: the record disagrees with the response.
var ErrRecordMismatch error = &sentinel{"record mismatch"}

// ErrRequestTooLarge matches a *RequestTooLargeError (also a not-dispatched `request` error).
var ErrRequestTooLarge error = &sentinel{"request too large"}

// One sentinel per refusal code of the sessions API (docs/sessions.md, "Refusals and
// limits"). A *NotDispatchedError or *SessionError with that code matches it.
var (
	// ErrSessionNotFound: code `session_not_found`: no such session for this caller (an
	// unknown id, another caller's, or one from before the daemon restarted).
	ErrSessionNotFound error = &sentinel{"session not found"}
	// ErrSessionEnded: code `session_ended`: the session has ended (EndReason says why).
	ErrSessionEnded error = &sentinel{"session ended"}
	// ErrInterpreterEnded: code `interpreter_ended`: the session's interpreter ended in an
	// earlier cell; send the cell with CellOptions.Restart.
	ErrInterpreterEnded error = &sentinel{"interpreter ended"}
	// ErrSandboxChanged: code `sandbox_changed`: the session's sandbox differed from what it
	// was at open; the session has ended.
	ErrSandboxChanged error = &sentinel{"sandbox changed"}
	// ErrChainInDoubt: code `chain_in_doubt`, a refusal made here: an earlier call of the
	// session may have run without an answer this client could verify, so no call is sent
	// until Session.Resync.
	ErrChainInDoubt error = &sentinel{"session chain in doubt"}
	// ErrSnapshotNotFound: code `snapshot_not_found`: no such snapshot for this caller (an
	// unknown id, another caller's, an expired or deleted one: the daemon answers all alike).
	ErrSnapshotNotFound error = &sentinel{"snapshot not found"}
)

// codeError returns the sentinel of a sessions refusal code (nil for any other code).
func codeError(code string) error {
	switch code {
	case "session_not_found":
		return ErrSessionNotFound
	case "session_ended":
		return ErrSessionEnded
	case "interpreter_ended":
		return ErrInterpreterEnded
	case "sandbox_changed":
		return ErrSandboxChanged
	case "chain_in_doubt":
		return ErrChainInDoubt
	case "snapshot_not_found":
		return ErrSnapshotNotFound
	}
	return nil
}

// ErrChainMismatch matches a *ChainMismatchError: a session call's record is not the next
// link of the session's chain.
var ErrChainMismatch error = &sentinel{"session chain mismatch"}

// NotDispatchedReason returns why nothing ran when err promises that, and false otherwise
// (also for a nil error): without the promise the code may have run.
func NotDispatchedReason(err error) (Reason, bool) {
	var nd *NotDispatchedError
	if errors.As(err, &nd) {
		return nd.Reason, true
	}
	return "", false
}

// NotDispatchedError says nothing ran, and why.
type NotDispatchedError struct {
	// RequestID is the id the request carried (or would have carried); empty only when the
	// daemon could not be reached.
	RequestID string
	// Reason is why nothing ran.
	Reason Reason
	// Code is the daemon's error code, or the reason's name for a refusal made here.
	Code string
	// Message says what went wrong and what to do.
	Message string
	// Status is the HTTP status of the daemon's refusal; 0 when nothing was sent (200 for a
	// streamed answer whose last line is the refusal).
	Status int
	// EndReason says why the session ended, for a refusal of a call to an ended session
	// (codes `session_ended`, `sandbox_changed`, or `session_not_found` after a daemon
	// restart); "" otherwise.
	EndReason EndReason
	// Err is the cause of a refusal made here (a *RequestTooLargeError, a connect error).
	Err error
}

func (e *NotDispatchedError) Error() string {
	if e.EndReason != "" {
		return fmt.Sprintf("not dispatched (%s, %s, the session ended: %s): %s", e.Reason, e.Code, e.EndReason, e.Message)
	}
	if codeError(e.Code) != nil {
		return fmt.Sprintf("not dispatched (%s, %s): %s", e.Reason, e.Code, e.Message)
	}
	return fmt.Sprintf("not dispatched (%s): %s", e.Reason, e.Message)
}

// Is matches ErrNotDispatched, the reason's sentinel and a sessions code's sentinel
// (ErrSessionNotFound, ErrSessionEnded, ErrInterpreterEnded, ErrSandboxChanged,
// ErrChainInDoubt, ErrSnapshotNotFound).
func (e *NotDispatchedError) Is(target error) bool {
	return target == ErrNotDispatched || target == ReasonError(e.Reason) || (target != nil && target == codeError(e.Code))
}

// Unwrap returns the cause, if any.
func (e *NotDispatchedError) Unwrap() error { return e.Err }

// RequestTooLargeError: the request body is over the client's limit (the daemon's
// max_body_bytes, 8 MiB by default); it was not sent.
type RequestTooLargeError struct {
	Size, Limit int
}

func (e *RequestTooLargeError) Error() string {
	return fmt.Sprintf("the request is %d bytes, over this client's limit of %d bytes (the daemon's max_body_bytes): send less, or raise the limit with WithMaxBodyBytes to match the daemon's", e.Size, e.Limit)
}

// Is matches ErrRequestTooLarge.
func (e *RequestTooLargeError) Is(target error) bool { return target == ErrRequestTooLarge }

// MayHaveRunError: the exchange ended without a verified result, and the code may have run.
type MayHaveRunError struct {
	// RequestID is the id sent.
	RequestID string
	// Code is the daemon's error code for its own failures (`sandbox_failed`, `internal`), or
	// the check that failed here: `unverified_refusal` (a refusal echoing another id or none),
	// `request_id_mismatch` (a result echoing another id), `transport`, `bad_response`.
	Code string
	// Status is the HTTP status, 0 when no answer was read.
	Status int
	// Message says what happened.
	Message string
	// EchoedRequestID is the id an answer echoed when it was not ours (nil: none).
	EchoedRequestID *string
	// ClaimedReason is the reason an unverified refusal claimed.
	ClaimedReason Reason
	// EndReason is the end reason the answer gave for a session, if any (believe it no more
	// than the rest of an answer that could not be verified).
	EndReason EndReason
	// Err is the transport error, if any.
	Err error
}

func (e *MayHaveRunError) Error() string {
	return fmt.Sprintf("the code may have run (request %s, %s): %s; do not retry blindly", e.RequestID, e.Code, e.Message)
}

// Is matches ErrMayHaveRun.
func (e *MayHaveRunError) Is(target error) bool { return target == ErrMayHaveRun }

// Unwrap returns the transport error, if any.
func (e *MayHaveRunError) Unwrap() error { return e.Err }

// EvidenceMismatchError: the result says the run used a tier below the floor (the one sent,
// or the daemon's default floor when none was sent). The code ran: this is not a refusal.
type EvidenceMismatchError struct {
	RequestID string
	// Provider is the provider the answer names.
	Provider string
	// Isolation is the tier the answer states (the weaker of response and record).
	Isolation Isolation
	// Floor is the floor checked against.
	Floor Isolation
	// DefaultFloor is true when no floor was sent and Floor is the daemon's default.
	DefaultFloor bool
	// AppliedFloor is true when Floor is the one the record says the daemon applied
	// (Record.MinimumIsolation).
	AppliedFloor bool
	// SessionFloor is true when Floor is the floor of the session the call was sent to (the
	// one its open sent, or the daemon's default floor then), or, at open, the floor the
	// daemon says it opened the session with.
	SessionFloor bool
}

func (e *EvidenceMismatchError) Error() string {
	which := "the floor asked for"
	switch {
	case e.AppliedFloor:
		which = "the floor the record says the daemon applied,"
	case e.SessionFloor:
		which = "the session's floor"
	case e.DefaultFloor:
		which = "the daemon's default floor (no floor was sent)"
	}
	return fmt.Sprintf("evidence mismatch for request %s: the run used `%s` (provider %s), below %s `%s`; the code ran, but not behind the wall you required", e.RequestID, e.Isolation, e.Provider, which, e.Floor)
}

// Is matches ErrEvidenceMismatch and ErrMayHaveRun.
func (e *EvidenceMismatchError) Is(target error) bool {
	return target == ErrEvidenceMismatch || target == ErrMayHaveRun
}

// ProviderMismatchError: the request named a provider and another one answered. The code
// ran: this is not a refusal.
type ProviderMismatchError struct {
	RequestID string
	// Asked is the provider the request named.
	Asked string
	// Provider is the provider the answer (response or record) names.
	Provider string
}

func (e *ProviderMismatchError) Error() string {
	return fmt.Sprintf("provider mismatch for request %s: the run used provider `%s`, not `%s` as asked; the code ran, but not where you required", e.RequestID, e.Provider, e.Asked)
}

// Is matches ErrProviderMismatch and ErrMayHaveRun.
func (e *ProviderMismatchError) Is(target error) bool {
	return target == ErrProviderMismatch || target == ErrMayHaveRun
}

// ImageMismatchError: the request (or the session's open) named an image, and the answer's
// record (or the session) names another one, or none: a request is never served by another
// image than the one it named (docs/protocol.md). The code ran: this is not a refusal. It is
// an evidence mismatch, as a tier below the floor is.
type ImageMismatchError struct {
	RequestID string
	// Asked is the image named: a name or an identity.
	Asked string
	// Image is the image the record (or the session) names; nil: none.
	Image *ImageRef
	// Subject is what ran: "the run", "the session" (its open), "the session call".
	Subject string
}

func (e *ImageMismatchError) Error() string {
	subject := e.Subject
	if subject == "" {
		subject = "the run"
	}
	ran := "names no image (no `image` member)"
	if e.Image != nil {
		ran = fmt.Sprintf("ran in image `%s` (%s)", e.Image.Name, e.Image.Identity)
	}
	return fmt.Sprintf("evidence mismatch for request %s: %s %s, not the image `%s` asked for; the code ran, but not in the image you named", e.RequestID, subject, ran, e.Asked)
}

// Is matches ErrImageMismatch, ErrEvidenceMismatch (the same kind of failure as a tier below
// the floor) and ErrMayHaveRun.
func (e *ImageMismatchError) Is(target error) bool {
	return target == ErrImageMismatch || target == ErrEvidenceMismatch || target == ErrMayHaveRun
}

// checkImage is the error when image (what a record or a session names; nil: nothing) is not
// the image asked names, by its name or its identity; nil when it is.
func checkImage(id, asked string, image *ImageRef, subject string) error {
	if image != nil && image.Answers(asked) {
		return nil
	}
	return &ImageMismatchError{RequestID: id, Asked: asked, Image: image, Subject: subject}
}

// DigestKind says which digest a DigestMismatchError concerns.
type DigestKind string

// The digests a client recomputes.
const (
	DigestRequest  DigestKind = "request"
	DigestResult   DigestKind = "result"
	DigestRecord   DigestKind = "record"
	DigestEvidence DigestKind = "evidence"
)

// DigestMismatchError: a digest recomputed here differs from the one in the answer. The
// answer was altered on the way or the daemon is faulty; never use the result.
type DigestMismatchError struct {
	RequestID string
	// Which is the digest.
	Which DigestKind
	// Computed is what this client computed; Claimed what the answer stated.
	Computed, Claimed string
	// Provider names the provider, for an evidence digest.
	Provider string
}

func (e *DigestMismatchError) Error() string {
	if e.Which == DigestEvidence {
		return fmt.Sprintf("evidence digest mismatch for provider %s: computed %s, the answer says %s; the answer was altered on the way or the daemon is faulty", e.Provider, e.Computed, e.Claimed)
	}
	return fmt.Sprintf("%s digest mismatch for request %s: computed %s, the answer says %s; the answer was altered on the way or the daemon is faulty, and the code may have run", e.Which, e.RequestID, e.Computed, e.Claimed)
}

// Is matches ErrDigestMismatch, and ErrMayHaveRun for a run's digests.
func (e *DigestMismatchError) Is(target error) bool {
	return target == ErrDigestMismatch || (target == ErrMayHaveRun && e.Which != DigestEvidence)
}

// RecordMismatchError: the run record disagrees with the response around it.
type RecordMismatchError struct {
	RequestID string
	// Field is the member that differs; Response and Record its two values. For
	// `minimum_isolation`, Response is the floor sent, or the daemon's default floor when none
	// was sent.
	Field, Response, Record string
	// Against names what the record was held against when it is not the response ("the floor
	// sent", "the daemon's default floor").
	Against string
}

func (e *RecordMismatchError) Error() string {
	against := e.Against
	if against == "" {
		against = "the response"
	}
	return fmt.Sprintf("the run record disagrees with %s on `%s` for request %s: %s %s, record %s; the answer was altered or the daemon is faulty, and the code may have run", against, e.Field, e.RequestID, against, e.Response, e.Record)
}

// Is matches ErrRecordMismatch and ErrMayHaveRun.
func (e *RecordMismatchError) Is(target error) bool {
	return target == ErrRecordMismatch || target == ErrMayHaveRun
}

// ProvidersError: GET /v1/providers gave no usable answer (Status 0: none was read).
type ProvidersError struct {
	URL     string
	Status  int
	Code    string
	Message string
	// Reason is the daemon's not-dispatched mark on its refusal, if it set one.
	Reason Reason
	Err    error
}

func (e *ProvidersError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("the providers of %s could not be read: %s", e.URL, e.Message)
	}
	return fmt.Sprintf("the daemon at %s answered HTTP %d (%s): %s", e.URL, e.Status, e.Code, e.Message)
}

// Unwrap returns the cause, if any.
func (e *ProvidersError) Unwrap() error { return e.Err }

// ChainMismatchError: a session call's answer verified as a run's, but its record is not the
// next link of this session's chain: it names another session, a sequence number or
// previous record that says a call is missing, repeated or reordered, another provider,
// tier, evidence or environment than the session's, or another origin (docs/sessions.md,
// "Chained records"). The call may have run; the session's chain, as this client follows
// it, does not move. Snapshots and forks fail with it too (Subject set): a snapshot that is
// not of the chain this client verified, or a restored session or a fork's copy that does
// not continue the chain of the snapshot it was made from.
type ChainMismatchError struct {
	RequestID string
	// SessionID is the session the call was sent to (or snapshotted, or forked); for a
	// restored session or a fork's copy, that new session.
	SessionID string
	// Field is the member that differs: `session` (the record names none), `session_id`,
	// `sequence`, `previous_record_sha256`, `provider`, `isolation`, `evidence_sha256`,
	// `environment`, `origin` (the record's origin is not its session's, or it has none, or
	// has one and its session none; the one change taken is a restore of the session under
	// its own id after a daemon restart, at the call after the last one verified, whose
	// `isolation` and `evidence_sha256` are then the new ones). For a snapshot (of Snapshot
	// or Fork):
	// `snapshot.session_id`, `snapshot.calls`, `snapshot.last_record_sha256`. For a restored
	// session or a copy: `origin` (it has none), `origin.start`, `origin.snapshot_sha256`,
	// `origin.parent_session_id`, `origin.parent_calls`, `origin.parent_record_sha256`, and
	// `calls`, `last_record_sha256` (its chain does not start where its origin says).
	Field string
	// Want is what the chain expects; Got what the answer says.
	Want, Got string
	// Subject is "" for a call's record; otherwise what does not hold: "the snapshot is not
	// of this session's chain as this client verified it", "the copy does not continue the
	// chain of the session it was forked from", "the restored session does not continue the
	// chain of the snapshot it was restored from".
	Subject string
}

func (e *ChainMismatchError) Error() string {
	if e.Subject != "" {
		return fmt.Sprintf("session %s, request %s: %s: `%s` is %q, the chain expects %q; the answer was altered or the daemon is faulty, and the request may have been carried out", e.SessionID, e.RequestID, e.Subject, e.Field, e.Got, e.Want)
	}
	return fmt.Sprintf("session %s, request %s: the answer's record is not the next link of the session's chain: `%s` is %q, the chain expects %q (a call of this session is missing, repeated or reordered, or the answer is another's); the code may have run", e.SessionID, e.RequestID, e.Field, e.Got, e.Want)
}

// Is matches ErrChainMismatch and ErrMayHaveRun.
func (e *ChainMismatchError) Is(target error) bool {
	return target == ErrChainMismatch || target == ErrMayHaveRun
}

// SessionError: showing, listing or resuming sessions, or listing snapshots (a GET: nothing
// runs) gave no usable answer. Status 0: none was read.
type SessionError struct {
	// SessionID is the session asked about ("" for a list).
	SessionID string
	URL       string
	Status    int
	// Code is the daemon's error code (`session_not_found`, `session_ended`,
	// `unauthenticated`, ...) or `bad_response`, `transport`, `request` (an id that is not a
	// session id, refused here).
	Code    string
	Message string
	// Reason is the daemon's not-dispatched mark on its refusal, if it set one.
	Reason Reason
	// EndReason says why the session ended, when the daemon said.
	EndReason EndReason
	Err       error
}

func (e *SessionError) Error() string {
	what := "the sessions"
	if strings.HasSuffix(e.URL, "/v1/snapshots") {
		what = "the snapshots"
	}
	if e.SessionID != "" {
		what = "session " + e.SessionID
	}
	if e.Status == 0 {
		return fmt.Sprintf("%s could not be read (%s): %s", what, e.Code, e.Message)
	}
	if e.EndReason != "" {
		return fmt.Sprintf("%s: the daemon answered HTTP %d (%s, ended: %s): %s", what, e.Status, e.Code, e.EndReason, e.Message)
	}
	return fmt.Sprintf("%s: the daemon answered HTTP %d (%s): %s", what, e.Status, e.Code, e.Message)
}

// Is matches a sessions code's sentinel (ErrSessionNotFound, ErrSessionEnded, ...).
func (e *SessionError) Is(target error) bool { return target != nil && target == codeError(e.Code) }

// Unwrap returns the cause, if any.
func (e *SessionError) Unwrap() error { return e.Err }

// CleanupError: an operation failed, and cleaning up after it failed too. Err is the first
// failure (errors.Is and errors.As see it); Cleanup is the second.
type CleanupError struct {
	Err     error
	Cleanup error
}

func (e *CleanupError) Error() string {
	return fmt.Sprintf("%v; cleaning up after it failed too: %v", e.Err, e.Cleanup)
}

// Unwrap returns the first failure.
func (e *CleanupError) Unwrap() error { return e.Err }
