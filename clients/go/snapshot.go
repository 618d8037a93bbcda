// snapshot.go: snapshots and forks of sessions (docs/sessions.md): a session's sandbox saved
// with its interpreter's memory, and new sessions opened from it, each checked to continue
// the chain of the session the snapshot was taken of.

package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// RestoreOptions shape a session opened from a snapshot (Client.RestoreSession).
type RestoreOptions struct {
	// SHA256 is the digest the snapshot must have (its SnapshotInfo.SHA256), or "": sent, so
	// that the daemon refuses (nothing restored) a snapshot whose files no longer hash to
	// it, and the new session's origin must name it.
	SHA256 string
	// Snapshot is the snapshot as this client was given it (by Session.Snapshot,
	// Session.Fork or Client.ListSnapshots), or nil. When set, its SHA256 is sent (unless
	// SHA256 is set, which must then be the same), and the new session must say it was
	// restored from that snapshot's session, at that snapshot's call count and last record,
	// at its provider and in its language.
	Snapshot *SnapshotInfo
}

// Snapshot saves the session's sandbox with its interpreter's memory (POST
// /v1/sessions/{id}/snapshot) and goes on: the session's chain does not move. The answer is
// checked: the echoed request id, a snapshot of this session, at this session's provider,
// tier and language, taken at the call count and last record this client verified (else a
// *ChainMismatchError, and the session sends nothing more until Resync). A refusal is
// believed only when it echoes the request id: `unsupported` for a provider or language that
// cannot be snapshotted honestly (only runsc sessions in Python can), `capacity` over the
// snapshot quotas.
func (s *Session) Snapshot(ctx context.Context) (*SnapshotInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := NewRequestID()
	if err := s.inDoubt(id); err != nil {
		return nil, err
	}
	body, err := json.Marshal(wireSnapshotRequest{Protocol: Protocol, RequestID: id})
	if err != nil {
		return nil, refusedHere(id, ReasonRequest, "the request does not serialise: "+err.Error(), err)
	}
	var snap SnapshotInfo
	if err := s.client.smallExchange(ctx, http.MethodPost, s.client.sessionURL(s.id)+"/snapshot", id, body, &snap, "a snapshot"); err != nil {
		return nil, err
	}
	if err := s.checkSnapshot(id, &snap); err != nil {
		return nil, err
	}
	return &snap, nil
}

// Fork snapshots the session and opens count new sessions from the snapshot (POST
// /v1/sessions/{id}/fork), each with its interpreter's state and fresh randomness; the
// session itself goes on, its chain unmoved. It returns the snapshot (kept by the daemon
// until it expires or is deleted) and the copies, each a Session whose chain continues this
// one's: its first call is the sequence after the snapshot's call count, hanging from the
// snapshot's last record. The answer is checked as Snapshot's, and every copy as the
// continuation of this session: a new session, forked from this one, from the snapshot
// answered (its digest, call count and last record), at this session's provider, floor and
// language (and image, if its open named one), its calls and last record those of the
// snapshot. When the answer is this request's but fails a check, the client closes the
// copies before returning the error (a *CleanupError if a close fails too). A count below 1
// is refused here, unsent; above the daemon's max_fork, by the daemon (`request`); over the
// session limits (a fork counts count new sessions), `capacity`.
func (s *Session) Fork(ctx context.Context, count int) (*SnapshotInfo, []*Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := NewRequestID()
	if err := s.inDoubt(id); err != nil {
		return nil, nil, err
	}
	if count < 1 || uint64(count) > math.MaxUint32 {
		err := fmt.Errorf("a fork of %d copies: ask for at least 1 (and at most the daemon's max_fork)", count)
		return nil, nil, refusedHere(id, ReasonRequest, err.Error(), err)
	}
	body, err := json.Marshal(wireForkRequest{Protocol: Protocol, RequestID: id, Count: uint32(count)})
	if err != nil {
		return nil, nil, refusedHere(id, ReasonRequest, "the request does not serialise: "+err.Error(), err)
	}
	var answer ForkAnswer
	if err := s.client.smallExchange(ctx, http.MethodPost, s.client.sessionURL(s.id)+"/fork", id, body, &answer, "a fork answer"); err != nil {
		return nil, nil, err
	}
	if answer.RequestID != id {
		return nil, nil, echoMismatch(id, answer.RequestID, "the fork")
	}
	// The answer is this request's: the copies it names are open, and closed again if the
	// answer fails a check.
	copies := make([]*Session, 0, len(answer.Sessions))
	for i := range answer.Sessions {
		info := answer.Sessions[i]
		copies = append(copies, &Session{client: s.client, id: info.SessionID, info: info, image: s.image,
			sequence: info.Calls, last: info.LastRecordSHA256})
	}
	if err := s.checkFork(id, &answer, count); err != nil {
		return nil, nil, s.closeCopies(err, copies)
	}
	return &answer.Snapshot, copies, nil
}

// checkFork checks a fork answer that echoes id; s.mu is held.
func (s *Session) checkFork(id string, answer *ForkAnswer, count int) error {
	bad := func(message string) error {
		return &MayHaveRunError{RequestID: id, Code: "bad_response", Status: http.StatusOK, Message: message}
	}
	if answer.Protocol != Protocol {
		return bad(fmt.Sprintf("the fork answer speaks protocol %d, this client protocol %d", answer.Protocol, Protocol))
	}
	if err := s.checkSnapshot(id, &answer.Snapshot); err != nil {
		return err
	}
	if len(answer.Sessions) != count {
		return bad(fmt.Sprintf("the fork answers %d copies, not the %d asked for", len(answer.Sessions), count))
	}
	seen := map[string]bool{s.id: true}
	for i := range answer.Sessions {
		info := &answer.Sessions[i]
		if info.RequestID != id {
			return echoMismatch(id, info.RequestID, fmt.Sprintf("the fork's copy %d", i))
		}
		if err := validateSessionID(info.SessionID); err != nil {
			return bad(fmt.Sprintf("the fork's copy %d: %v", i, err))
		}
		if seen[info.SessionID] {
			return bad(fmt.Sprintf("the fork's copy %d is session %s, which the answer (or this session) already is", i, info.SessionID))
		}
		seen[info.SessionID] = true
		if err := checkMade(id, info, OriginForked, &answer.Snapshot, "", "the copy does not continue the chain of the session it was forked from"); err != nil {
			return err
		}
		// A copy is this session again: its provider, floor, language and image.
		if info.Provider != s.info.Provider {
			return &ProviderMismatchError{RequestID: id, Asked: s.info.Provider, Provider: info.Provider}
		}
		if info.MinimumIsolation != s.info.MinimumIsolation || info.Language != s.info.Language {
			return bad(fmt.Sprintf("the fork's copy %s has floor %s and language %s, the session forked %s and %s",
				info.SessionID, info.MinimumIsolation, info.Language, s.info.MinimumIsolation, s.info.Language))
		}
		if s.image != "" {
			if err := checkImage(id, s.image, info.Image, "the fork's copy"); err != nil {
				return err
			}
		}
	}
	return nil
}

// closeCopies closes the copies of a fork whose answer failed a check (never the session
// forked), and returns err, or a *CleanupError when a close failed too.
func (s *Session) closeCopies(err error, copies []*Session) error {
	var cleanup error
	closed := map[string]bool{s.id: true}
	for _, c := range copies {
		if closed[c.id] || validateSessionID(c.id) != nil {
			continue
		}
		closed[c.id] = true
		closeCtx, cancel := context.WithTimeout(context.Background(), exchangeSlack)
		if _, cerr := c.Close(closeCtx); cerr != nil && cleanup == nil {
			cleanup = cerr
		}
		cancel()
	}
	if cleanup != nil {
		return &CleanupError{Err: err, Cleanup: cleanup}
	}
	return err
}

// checkSnapshot checks a snapshot answered to request id against this session: s.mu is held.
// A snapshot taken at another place in the chain than the one this client verified puts the
// session in doubt.
func (s *Session) checkSnapshot(id string, snap *SnapshotInfo) error {
	bad := func(message string) error {
		return &MayHaveRunError{RequestID: id, Code: "bad_response", Status: http.StatusOK, Message: message}
	}
	if snap.RequestID != id {
		return echoMismatch(id, snap.RequestID, "the snapshot")
	}
	if err := snap.check(); err != nil {
		return bad(err.Error())
	}
	mismatch := func(field, want, got string) error {
		return &ChainMismatchError{RequestID: id, SessionID: s.id, Field: field, Want: want, Got: got,
			Subject: "the snapshot is not of this session's chain as this client verified it"}
	}
	if snap.SessionID != s.id {
		return mismatch("snapshot.session_id", s.id, snap.SessionID)
	}
	if snap.Provider != s.info.Provider || snap.Isolation != s.info.Isolation || snap.Language != s.info.Language {
		return bad(fmt.Sprintf("the snapshot says provider %s, tier %s, language %s; the session is at %s, %s, in %s",
			snap.Provider, snap.Isolation, snap.Language, s.info.Provider, s.info.Isolation, s.info.Language))
	}
	var err error
	if snap.Calls != s.sequence {
		err = mismatch("snapshot.calls", strconv.FormatUint(s.sequence, 10), strconv.FormatUint(snap.Calls, 10))
	} else if snap.LastRecordSHA256 != s.last {
		err = mismatch("snapshot.last_record_sha256", orNone(s.last), orNone(snap.LastRecordSHA256))
	}
	if err != nil {
		// The daemon's chain is not where this client's stands: nothing more is sent until
		// Resync takes the daemon's word for it.
		s.doubt = err
	}
	return err
}

// check is what every snapshot answer must be, whatever asked for it: its protocol, ids and
// digests of the right shapes, and a language.
func (snap *SnapshotInfo) check() error {
	if snap.Protocol != Protocol {
		return fmt.Errorf("the snapshot speaks protocol %d, this client protocol %d", snap.Protocol, Protocol)
	}
	if err := validateSnapshotID(snap.SnapshotID); err != nil {
		return err
	}
	if err := validateSessionID(snap.SessionID); err != nil {
		return fmt.Errorf("snapshot %s: %w", snap.SnapshotID, err)
	}
	if !isSHA256Hex(snap.SHA256) {
		return fmt.Errorf("snapshot %s: its sha256 %q is not 64 lowercase hex digits", snap.SnapshotID, snap.SHA256)
	}
	if snap.Language != JavaScript && snap.Language != Python {
		return fmt.Errorf("snapshot %s: language `%s` is not one of javascript, python", snap.SnapshotID, snap.Language)
	}
	if (snap.Calls == 0) != (snap.LastRecordSHA256 == "") {
		return fmt.Errorf("snapshot %s says its session had answered %d calls, last record %q", snap.SnapshotID, snap.Calls, snap.LastRecordSHA256)
	}
	return nil
}

// checkMade checks a session made from a snapshot (restored, or a fork's copy) that the
// answer to request id gave: its origin says start, and continues the chain of snap (when
// known) and of the snapshot digest asked for (sha256, when one was); its own chain starts
// where its origin says. subject says what fails, for a *ChainMismatchError.
func checkMade(id string, info *SessionInfo, start OriginStart, snap *SnapshotInfo, sha256, subject string) error {
	bad := func(message string) error {
		return &MayHaveRunError{RequestID: id, Code: "bad_response", Status: http.StatusOK, Message: message}
	}
	mismatch := func(field, want, got string) error {
		return &ChainMismatchError{RequestID: id, SessionID: info.SessionID, Field: field, Want: want, Got: got, Subject: subject}
	}
	if info.Protocol != Protocol {
		return bad(fmt.Sprintf("the session speaks protocol %d, this client protocol %d", info.Protocol, Protocol))
	}
	if info.EndReason != "" {
		return bad(fmt.Sprintf("the new session %s says it has ended (%s)", info.SessionID, info.EndReason))
	}
	if info.Language != JavaScript && info.Language != Python {
		return bad(fmt.Sprintf("the new session's language `%s` is not one of javascript, python", info.Language))
	}
	if !info.Isolation.AtLeast(info.MinimumIsolation) {
		return &EvidenceMismatchError{RequestID: id, Provider: info.Provider, Isolation: info.Isolation, Floor: info.MinimumIsolation, SessionFloor: true}
	}
	o := info.Origin
	if o == nil {
		return mismatch("origin", "a `"+string(start)+"` origin", "(none)")
	}
	if o.Start != start {
		return mismatch("origin.start", string(start), string(o.Start))
	}
	if sha256 != "" && o.SnapshotSHA256 != sha256 {
		return mismatch("origin.snapshot_sha256", sha256, o.SnapshotSHA256)
	}
	if (o.ParentCalls == 0) != (o.ParentRecordSHA256 == "") {
		return bad(fmt.Sprintf("the new session %s says its parent had answered %d calls, last record %q", info.SessionID, o.ParentCalls, o.ParentRecordSHA256))
	}
	if snap != nil {
		for _, f := range []struct{ field, want, got string }{
			{"origin.parent_session_id", snap.SessionID, o.ParentSessionID},
			{"origin.snapshot_sha256", snap.SHA256, o.SnapshotSHA256},
			{"origin.parent_calls", strconv.FormatUint(snap.Calls, 10), strconv.FormatUint(o.ParentCalls, 10)},
			{"origin.parent_record_sha256", orNone(snap.LastRecordSHA256), orNone(o.ParentRecordSHA256)},
		} {
			if f.want != f.got {
				return mismatch(f.field, f.want, f.got)
			}
		}
	}
	// Its chain starts where its parent's stood: a copy continues it.
	if info.Calls != o.ParentCalls {
		return mismatch("calls", strconv.FormatUint(o.ParentCalls, 10), strconv.FormatUint(info.Calls, 10))
	}
	if info.LastRecordSHA256 != o.ParentRecordSHA256 {
		return mismatch("last_record_sha256", orNone(o.ParentRecordSHA256), orNone(info.LastRecordSHA256))
	}
	if info.SessionID == o.ParentSessionID {
		return bad(fmt.Sprintf("the new session has its parent's id %s", info.SessionID))
	}
	return nil
}

// RestoreSession opens a new session of this caller from the snapshot snapshotID (POST
// /v1/snapshots/{id}/sessions): the interpreter's state as it was when the snapshot was
// taken, its chain continuing the snapshot's session's from there. The answer is checked:
// the echoed request id, the session restored (its origin `restored`), from the snapshot
// digest asked for (RestoreOptions.SHA256) and, when RestoreOptions.Snapshot is given, from
// that snapshot's session at its call count and last record, at its provider and in its
// language; its calls and last record those its origin names. A refusal is believed only
// when it echoes the request id: ErrSnapshotNotFound for an unknown, expired, deleted or
// another caller's snapshot (alike), `request` for a digest that is not the snapshot's,
// `environment` for a snapshot whose files changed on disk, `capacity` over the session
// limits. When the answer is this request's but fails a check, the client closes that
// session before returning the error.
func (c *Client) RestoreSession(ctx context.Context, snapshotID string, opts RestoreOptions) (*Session, error) {
	id := NewRequestID()
	refuse := func(err error) error { return refusedHere(id, ReasonRequest, err.Error(), err) }
	if err := validateSnapshotID(snapshotID); err != nil {
		return nil, refuse(err)
	}
	sha256 := opts.SHA256
	if snap := opts.Snapshot; snap != nil {
		if snap.SnapshotID != snapshotID {
			return nil, refuse(fmt.Errorf("RestoreOptions.Snapshot is snapshot %s, not %s", snap.SnapshotID, snapshotID))
		}
		if sha256 == "" {
			sha256 = snap.SHA256
		} else if sha256 != snap.SHA256 {
			return nil, refuse(fmt.Errorf("RestoreOptions.SHA256 %s is not the digest %s of RestoreOptions.Snapshot", sha256, snap.SHA256))
		}
	}
	if sha256 != "" && !isSHA256Hex(sha256) {
		return nil, refuse(fmt.Errorf("the snapshot digest %q is not 64 lowercase hex digits", sha256))
	}
	body, err := json.Marshal(wireSnapshotOpen{Protocol: Protocol, RequestID: id, SHA256: sha256})
	if err != nil {
		return nil, refuse(fmt.Errorf("the request does not serialise: %w", err))
	}
	var info SessionInfo
	if err := c.smallExchange(ctx, http.MethodPost, c.baseURL+"/v1/snapshots/"+snapshotID+"/sessions", id, body, &info, "a session"); err != nil {
		return nil, err
	}
	if info.RequestID != id {
		return nil, echoMismatch(id, info.RequestID, "the restored session")
	}
	if err := validateSessionID(info.SessionID); err != nil {
		return nil, &MayHaveRunError{RequestID: id, Code: "bad_response", Status: http.StatusOK, Message: err.Error()}
	}
	s := &Session{client: c, id: info.SessionID, info: info, sequence: info.Calls, last: info.LastRecordSHA256}
	if err := checkRestored(id, &info, opts.Snapshot, sha256); err != nil {
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

// checkRestored checks a session restored from a snapshot (snap, when the client knows it;
// sha256, the digest asked for).
func checkRestored(id string, info *SessionInfo, snap *SnapshotInfo, sha256 string) error {
	if err := checkMade(id, info, OriginRestored, snap, sha256, "the restored session does not continue the chain of the snapshot it was restored from"); err != nil {
		return err
	}
	if snap == nil {
		return nil
	}
	if info.Provider != snap.Provider {
		return &ProviderMismatchError{RequestID: id, Asked: snap.Provider, Provider: info.Provider}
	}
	if info.Isolation != snap.Isolation || info.Language != snap.Language {
		return &MayHaveRunError{RequestID: id, Code: "bad_response", Status: http.StatusOK,
			Message: fmt.Sprintf("the restored session is at tier %s in %s; the snapshot was at %s in %s", info.Isolation, info.Language, snap.Isolation, snap.Language)}
	}
	return nil
}

// ListSnapshots is this caller's snapshots, oldest first (GET /v1/snapshots).
func (c *Client) ListSnapshots(ctx context.Context) (*SnapshotList, error) {
	url := c.baseURL + "/v1/snapshots"
	var list SnapshotList
	if err := c.sessionGet(ctx, "", url, &list); err != nil {
		return nil, err
	}
	for i := range list.Snapshots {
		if err := list.Snapshots[i].check(); err != nil {
			return nil, &SessionError{URL: url, Status: http.StatusOK, Code: "bad_response", Message: fmt.Sprintf("snapshots[%d]: %v", i, err)}
		}
	}
	return &list, nil
}

// DeleteSnapshot deletes this caller's snapshot snapshotID (DELETE /v1/snapshots/{id}): its
// files are removed, and no session can be opened from it any more. The answer is the
// snapshot deleted, and must echo the request id (sent in the plimsoll-request-id header);
// ErrSnapshotNotFound when there is no such snapshot of this caller.
func (c *Client) DeleteSnapshot(ctx context.Context, snapshotID string) (*SnapshotInfo, error) {
	id := NewRequestID()
	if err := validateSnapshotID(snapshotID); err != nil {
		return nil, refusedHere(id, ReasonRequest, err.Error(), err)
	}
	var snap SnapshotInfo
	if err := c.smallExchange(ctx, http.MethodDelete, c.baseURL+"/v1/snapshots/"+snapshotID, id, nil, &snap, "a snapshot"); err != nil {
		return nil, err
	}
	if snap.RequestID != id {
		return nil, echoMismatch(id, snap.RequestID, "the deletion")
	}
	if err := snap.check(); err != nil {
		return nil, &MayHaveRunError{RequestID: id, Code: "bad_response", Status: http.StatusOK, Message: err.Error()}
	}
	if snap.SnapshotID != snapshotID {
		return nil, &MayHaveRunError{RequestID: id, Code: "bad_response", Status: http.StatusOK,
			Message: fmt.Sprintf("the deletion answers for snapshot %s, not %s", snap.SnapshotID, snapshotID)}
	}
	return &snap, nil
}

// smallExchange sends one request of the snapshot API under request id, its body JSON (or,
// with none, the id in the plimsoll-request-id header), and reads a 200 answer strictly into
// v (what names it for an error). A refusal is believed only when it echoes id.
func (c *Client) smallExchange(ctx context.Context, method, url, id string, body []byte, v any, what string) error {
	var headers map[string]string
	if body == nil {
		headers = map[string]string{requestIDHeader: id}
	}
	ctx, cancel := context.WithTimeout(ctx, exchangeSlack)
	defer cancel()
	status, answer, err := c.exchangeWith(ctx, method, url, body, headers)
	if err != nil {
		return sendFailure(id, url, err)
	}
	if status != http.StatusOK {
		return refusal(id, status, answer)
	}
	if _, err := readStrict(answer, v); err != nil {
		return &MayHaveRunError{RequestID: id, Code: "bad_response", Status: status, Message: "not " + what + ": " + err.Error()}
	}
	return nil
}

// echoMismatch is the error of an answer (what) that echoes another request id than id.
func echoMismatch(id, echoed, what string) error {
	return &MayHaveRunError{RequestID: id, Code: "request_id_mismatch", Status: http.StatusOK, EchoedRequestID: &echoed,
		Message: fmt.Sprintf("%s answers request id %q, not %s; something between this client and the daemon mixed up answers, so it is not yours", what, echoed, id)}
}

// validateSnapshotID checks the shape of a snapshot id: `snp_`, 16 lowercase hex digits,
// `_`, 32 lowercase hex digits. The id goes into URL paths: nothing else is let through.
func validateSnapshotID(id string) error {
	if strings.HasPrefix(id, "snp_") && validateSessionID("ses_"+id[len("snp_"):]) == nil {
		return nil
	}
	return fmt.Errorf("%q is not a snapshot id (`snp_`, 16 and 32 lowercase hex digits joined by `_`)", id)
}

// orNone is v, or "(none)" for "".
func orNone(v string) string {
	if v == "" {
		return "(none)"
	}
	return v
}
