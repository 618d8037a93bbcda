// Snapshots and forks without a daemon: the origin (record field 14) read and digested, and
// the checks of a snapshot, a fork, a restore and every later call of a copy, on answers a
// real daemon never sends but a party in the middle could. The answers are synthetic (served
// by an httptest server) and every digest in them is right: only the check under test can
// fail them.

package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

const (
	parentID    = "ses_0123456789abcdef_00112233445566778899aabbccddeeff"
	snapshotID  = "snp_0123456789abcdef_0000000000000000000000000000000a"
	snapshotSHA = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"
)

var parentRecord = strings.Repeat("1e", 32)

// copyID is the id of a fork's copy n.
func copyID(n int) string {
	return "ses_0123456789abcdef_" + strings.Repeat("c", 31) + string(rune('0'+n))
}

// forkedFrom is the origin of a copy of the parent after its call 2.
func forkedFrom() *SessionOrigin {
	return &SessionOrigin{Start: OriginForked, SnapshotSHA256: snapshotSHA, ParentSessionID: parentID,
		ParentRecordSHA256: parentRecord, ParentCalls: 2}
}

func TestTheOriginIsReadStrictlyAndEveryMemberIsCovered(t *testing.T) {
	v := vectorNamed(t, "record/forked-call")
	var r Record
	if _, err := readStrict(v.Input, &r); err != nil {
		t.Fatal(err)
	}
	if o := r.Session.Origin; o == nil || o.Start != OriginForked || o.ParentCalls != 2 || RecordSHA256(&r) != v.SHA256 {
		t.Fatalf("the forked call reads %+v", r.Session)
	}
	base := RecordSHA256(&r)
	for name, change := range map[string]func(o *SessionOrigin){
		"start":                func(o *SessionOrigin) { o.Start = OriginRestored },
		"snapshot_sha256":      func(o *SessionOrigin) { o.SnapshotSHA256 = strings.Repeat("b2", 32) },
		"parent_session_id":    func(o *SessionOrigin) { o.ParentSessionID = copyID(1) },
		"parent_record_sha256": func(o *SessionOrigin) { o.ParentRecordSHA256 = "" },
		"parent_calls":         func(o *SessionOrigin) { o.ParentCalls = 3 },
		"the whole origin":     func(o *SessionOrigin) { *o = SessionOrigin{} },
	} {
		c := r
		link := *r.Session
		origin := *link.Origin
		change(&origin)
		link.Origin, c.Session = &origin, &link
		if RecordSHA256(&c) == base {
			t.Errorf("changing the origin's %s left the record digest alone", name)
		}
	}
	// No origin: the record of a session opened fresh, whose digest has no field 14.
	c := r
	link := *r.Session
	link.Origin, c.Session = nil, &link
	if enc := encodeRecord(&c); RecordSHA256(&c) == base || strings.Contains(string(enc), "origin") {
		t.Error("a record without an origin is digested with one")
	}
	var compact strings.Builder
	compact.Write(encodeJSON(t, json.RawMessage(v.Input)))
	for bad, says := range map[string]string{
		`"start":"cloned"`:            "not an origin's start",
		`"start":"forked","extra":1`:  "unknown member `extra`",
		`"start":null`:                "missing member `start`",
		`"start":"forked","Start":""`: "unknown member `Start`",
	} {
		in := strings.Replace(compact.String(), `"start":"forked"`, bad, 1)
		if in == compact.String() {
			t.Fatal("the vector's origin has no start")
		}
		var r Record
		if _, err := readStrict([]byte(in), &r); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v", bad, err)
		}
	}
	missing := strings.Replace(compact.String(), `"parent_calls":2,`, "", 1)
	if _, err := readStrict([]byte(missing), &r); err == nil || !strings.Contains(err.Error(), "missing member `parent_calls`") {
		t.Errorf("no parent_calls: %v", err)
	}
}

// A copy's Session starts its chain from its SessionInfo, and every record must carry the
// session's origin: a different one, or none, is a chain mismatch; a session opened fresh
// takes no record with one.
func TestEveryCallOfACopyMustCarryItsOrigin(t *testing.T) {
	sid := copyID(1)
	s := testSession(sid)
	s.info.Origin = forkedFrom()
	s.sequence, s.last = 2, parentRecord
	sent := sentWith("")
	withOrigin := func(o *SessionOrigin) *Result {
		res := linked(t, sent, sid, 3, parentRecord)
		res.Record.Session.Origin = o
		res.Record.RecordSHA256 = RecordSHA256(&res.Record)
		return res
	}
	for name, o := range map[string]*SessionOrigin{
		"none":              nil,
		"another parent":    {Start: OriginForked, SnapshotSHA256: snapshotSHA, ParentSessionID: copyID(2), ParentRecordSHA256: parentRecord, ParentCalls: 2},
		"restored":          {Start: OriginRestored, SnapshotSHA256: snapshotSHA, ParentSessionID: parentID, ParentRecordSHA256: parentRecord, ParentCalls: 2},
		"another snapshot":  {Start: OriginForked, SnapshotSHA256: strings.Repeat("b2", 32), ParentSessionID: parentID, ParentRecordSHA256: parentRecord, ParentCalls: 2},
		"another call":      {Start: OriginForked, SnapshotSHA256: snapshotSHA, ParentSessionID: parentID, ParentRecordSHA256: parentRecord, ParentCalls: 1},
		"another record":    {Start: OriginForked, SnapshotSHA256: snapshotSHA, ParentSessionID: parentID, ParentRecordSHA256: strings.Repeat("2f", 32), ParentCalls: 2},
		"no parent record":  {Start: OriginForked, SnapshotSHA256: snapshotSHA, ParentSessionID: parentID, ParentCalls: 2},
		"an empty one":      {},
		"another's restore": {Start: OriginRestored, SnapshotSHA256: snapshotSHA, ParentSessionID: sid, ParentCalls: 0},
	} {
		_, err := s.follow(withOrigin(o), callJob)
		var cm *ChainMismatchError
		if !errors.As(err, &cm) || cm.Field != "origin" || cm.Want != forkedFrom().String() || cm.Got != o.String() ||
			!errors.Is(err, ErrChainMismatch) || !errors.Is(err, ErrMayHaveRun) {
			t.Errorf("%s: %v", name, err)
		}
		if s.sequence != 2 || s.last != parentRecord {
			t.Fatalf("%s: the chain moved on an answer that failed its check", name)
		}
	}
	first := withOrigin(forkedFrom())
	if _, err := s.follow(first, callJob); err != nil {
		t.Fatalf("the copy's first call: %v", err)
	}
	if s.sequence != 3 || s.last != first.Record.RecordSHA256 {
		t.Fatalf("the chain did not move: %d %s", s.sequence, s.last)
	}
	// A session opened fresh: a record that claims an origin is not its.
	fresh := testSession(parentID)
	res := linked(t, sent, parentID, 1, "")
	res.Record.Session.Origin = forkedFrom()
	res.Record.RecordSHA256 = RecordSHA256(&res.Record)
	var cm *ChainMismatchError
	if _, err := fresh.follow(res, callJob); !errors.As(err, &cm) || cm.Field != "origin" || cm.Want != "(none)" {
		t.Errorf("an origin on a fresh session's record: %v", err)
	}
}

// snapshotFake is an httptest server answering the snapshot API from what its hooks build,
// closing any session asked to, and noting every request.
type snapshotFake struct {
	mu sync.Mutex
	// snapshot, fork and restore build the answer (status, JSON value) to a request of id.
	snapshot, fork, restore func(id string) (int, any)
	// call builds the answer to a copy's cell.
	call func(t *testing.T, sid string, body []byte) any
	seen []string
	// sent is the body of the last POST.
	sent map[string]any
}

func (f *snapshotFake) serve(t *testing.T) *Client {
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.seen = append(f.seen, r.Method+" "+r.URL.Path)
		var id string
		if len(body) > 0 {
			f.sent = map[string]any{}
			_ = json.Unmarshal(body, &f.sent)
			id, _ = f.sent["request_id"].(string)
		}
		status, out := http.StatusNotFound, any(map[string]any{"protocol": 1, "request_id": nil,
			"error": map[string]any{"code": "not_found", "message": "no such route", "not_dispatched": "request"}})
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/sessions/"+parentID+"/snapshot":
			status, out = f.snapshot(id)
		case r.Method == http.MethodPost && r.URL.Path == "/v1/sessions/"+parentID+"/fork":
			status, out = f.fork(id)
		case r.Method == http.MethodPost && r.URL.Path == "/v1/snapshots/"+snapshotID+"/sessions":
			status, out = f.restore(id)
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/cells"):
			sid := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/sessions/"), "/cells")
			status, out = http.StatusOK, f.call(t, sid, body)
		case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/v1/sessions/"):
			info := madeInfo(strings.TrimPrefix(r.URL.Path, "/v1/sessions/"), r.Header.Get(requestIDHeader), nil)
			info.EndReason = EndClosed
			status, out = http.StatusOK, info
		}
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(status)
		_ = json.NewEncoder(rw).Encode(out)
	}))
	t.Cleanup(srv.Close)
	return New(srv.URL, "t")
}

// requests is every request the fake was sent since n, as "METHOD path".
func (f *snapshotFake) requests(n int) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.seen[n:]...)
}

func (f *snapshotFake) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.seen)
}

// madeInfo is a session of the parent's kind, answering request rid, with this origin and
// the calls and last record the origin says.
func madeInfo(sid, rid string, origin *SessionOrigin) SessionInfo {
	info := SessionInfo{Protocol: Protocol, RequestID: rid, SessionID: sid, Language: Python, Provider: "p",
		Isolation: IsolationContainer, MinimumIsolation: IsolationContainer, EvidenceSHA256: strings.Repeat("e", 64),
		Environment: "test", Wall: Wall{RootReadOnly: true}, InterpreterAlive: true, Origin: origin}
	if origin != nil {
		info.Calls, info.LastRecordSHA256 = origin.ParentCalls, origin.ParentRecordSHA256
	}
	return info
}

// snapshotOf is the parent's snapshot after its call 2, answering rid.
func snapshotOf(rid string) SnapshotInfo {
	return SnapshotInfo{Protocol: Protocol, RequestID: rid, SnapshotID: snapshotID, SessionID: parentID, SHA256: snapshotSHA,
		Bytes: 4096, Provider: "p", Isolation: IsolationContainer, Language: Python, Calls: 2, LastRecordSHA256: parentRecord,
		CheckpointMS: 120, CreatedUnixMS: 1, ExpiresUnixMS: 2}
}

// honestFork is the answer to a fork of the parent into two, request rid.
func honestFork(rid string) ForkAnswer {
	return ForkAnswer{Protocol: Protocol, RequestID: rid, Snapshot: snapshotOf(rid),
		Sessions: []SessionInfo{madeInfo(copyID(1), rid, forkedFrom()), madeInfo(copyID(2), rid, forkedFrom())}}
}

// parent is the parent session, its chain at call 2, as a Session of c.
func parent(c *Client) *Session {
	s := testSession(parentID)
	s.client, s.info.Language = c, Python
	s.sequence, s.last = 2, parentRecord
	s.info.Calls, s.info.LastRecordSHA256 = 2, parentRecord
	return s
}

// copyCall answers a copy's cell honestly, next in the copy's chain from its fork, its
// record carrying origin.
func copyCall(origin *SessionOrigin) func(t *testing.T, sid string, body []byte) any {
	return func(t *testing.T, sid string, body []byte) any {
		var w wireRequest
		if _, err := readStrict(body, &w); err != nil {
			t.Errorf("the client sent %s: %v", body, err)
		}
		res := honest(t, &w, IsolationContainer, IsolationContainer)
		kept := true
		res.Output.StateKept = &kept
		res.ResultSHA256 = ResultSHA256(&res.Output)
		res.Record.ResultSHA256 = res.ResultSHA256
		res.Record.Session = &SessionLink{SessionID: sid, Sequence: 3, PreviousRecordSHA256: parentRecord, Origin: origin}
		res.Record.RecordSHA256 = RecordSHA256(&res.Record)
		return res
	}
}

func TestAForkIsCheckedAndEachCopyContinuesTheParentsChain(t *testing.T) {
	f := &snapshotFake{fork: func(id string) (int, any) { return http.StatusOK, honestFork(id) }, call: copyCall(forkedFrom())}
	c := f.serve(t)
	s := parent(c)
	snap, copies, err := s.Fork(context.Background(), 2)
	if err != nil {
		t.Fatalf("an honest fork: %v", err)
	}
	if snap.SnapshotID != snapshotID || len(copies) != 2 || f.sent["count"] != float64(2) {
		t.Fatalf("fork: %+v, %d copies, sent %v", snap, len(copies), f.sent)
	}
	for i, copy := range copies {
		if copy.ID() != copyID(i+1) || copy.sequence != 2 || copy.last != parentRecord || *copy.Info().Origin != *forkedFrom() {
			t.Errorf("copy %d: %s at %d %s", i, copy.ID(), copy.sequence, copy.last)
		}
		res, err := copy.Cell(context.Background(), "print(1)", CellOptions{})
		if err != nil || res.Record.Session.Sequence != 3 || copy.Info().Calls != 3 {
			t.Fatalf("copy %d's first call: %v", i, err)
		}
	}
	if s.sequence != 2 || s.last != parentRecord || s.doubt != nil {
		t.Error("the fork moved the parent's chain")
	}

	// A copy's call whose record carries another origin, its digest recomputed: the copy's
	// chain does not take it, and the copy sends nothing more until it resyncs.
	other := forkedFrom()
	other.ParentSessionID = copyID(9)
	f.call = copyCall(other)
	_, copies, err = s.Fork(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	_, err = copies[0].Cell(context.Background(), "print(1)", CellOptions{})
	var cm *ChainMismatchError
	if !errors.As(err, &cm) || cm.Field != "origin" || cm.SessionID != copyID(1) || cm.Subject != "" || !errors.Is(err, ErrMayHaveRun) {
		t.Fatalf("a copy's call with another origin: %v", err)
	}
	if copies[0].sequence != 2 || !errors.Is(copies[0].Doubt(), ErrChainMismatch) {
		t.Error("the copy's chain moved, or is not in doubt")
	}
	f.call = copyCall(nil)
	if _, err := copies[1].Cell(context.Background(), "print(1)", CellOptions{}); !errors.As(err, &cm) || cm.Field != "origin" || cm.Got != "(none)" {
		t.Errorf("a copy's call without an origin: %v", err)
	}
}

func TestAForkAnswerThatDoesNotHangFromTheParentIsRefusedAndItsCopiesClosed(t *testing.T) {
	f := &snapshotFake{}
	c := f.serve(t)
	closedBoth := []string{"POST /v1/sessions/" + parentID + "/fork", "DELETE /v1/sessions/" + copyID(1), "DELETE /v1/sessions/" + copyID(2)}
	for _, tc := range []struct {
		name, field string
		change      func(a *ForkAnswer)
	}{
		{"a copy naming another parent", "origin.parent_session_id", func(a *ForkAnswer) { a.Sessions[1].Origin.ParentSessionID = copyID(7) }},
		{"a copy restored, not forked", "origin.start", func(a *ForkAnswer) { a.Sessions[0].Origin.Start = OriginRestored }},
		{"a copy without an origin", "origin", func(a *ForkAnswer) { a.Sessions[0].Origin = nil }},
		{"a copy from another snapshot", "origin.snapshot_sha256", func(a *ForkAnswer) { a.Sessions[1].Origin.SnapshotSHA256 = strings.Repeat("b2", 32) }},
		{"a copy after another call", "origin.parent_calls", func(a *ForkAnswer) {
			o := a.Sessions[0].Origin
			o.ParentCalls = 1
			a.Sessions[0].Calls = 1
		}},
		{"a copy hanging from another record", "origin.parent_record_sha256", func(a *ForkAnswer) {
			a.Sessions[0].Origin.ParentRecordSHA256 = strings.Repeat("2f", 32)
			a.Sessions[0].LastRecordSHA256 = strings.Repeat("2f", 32)
		}},
		{"a copy whose chain starts afresh", "calls", func(a *ForkAnswer) { a.Sessions[1].Calls, a.Sessions[1].LastRecordSHA256 = 0, "" }},
		{"a copy whose chain starts at another record", "last_record_sha256", func(a *ForkAnswer) { a.Sessions[1].LastRecordSHA256 = strings.Repeat("2f", 32) }},
		{"a snapshot of another session", "snapshot.session_id", func(a *ForkAnswer) { a.Snapshot.SessionID = copyID(7) }},
	} {
		tc := tc
		f.fork = func(id string) (int, any) {
			a := honestFork(id)
			tc.change(&a)
			return http.StatusOK, a
		}
		s := parent(c)
		before := f.count()
		snap, copies, err := s.Fork(context.Background(), 2)
		var cm *ChainMismatchError
		if !errors.As(err, &cm) || cm.Field != tc.field || cm.Subject == "" || !errors.Is(err, ErrChainMismatch) || !errors.Is(err, ErrMayHaveRun) {
			t.Errorf("%s: want a chain mismatch on %s, got %v", tc.name, tc.field, err)
		}
		if _, ok := NotDispatchedReason(err); ok || snap != nil || copies != nil {
			t.Errorf("%s: reads not dispatched, or returned the fork", tc.name)
		}
		if got := f.requests(before); strings.Join(got, ", ") != strings.Join(closedBoth, ", ") {
			t.Errorf("%s: sent %v, want the fork and both copies closed", tc.name, got)
		}
		if s.sequence != 2 || s.doubt != nil {
			t.Errorf("%s: the parent's chain moved or is in doubt: %v", tc.name, s.doubt)
		}
	}

	// A copy that is the parent itself: the fork is refused, and the parent never closed.
	f.fork = func(id string) (int, any) {
		a := honestFork(id)
		a.Sessions[1].SessionID = parentID
		return http.StatusOK, a
	}
	before := f.count()
	_, _, err := parent(c).Fork(context.Background(), 2)
	var mh *MayHaveRunError
	if !errors.As(err, &mh) || mh.Code != "bad_response" {
		t.Errorf("a copy that is its parent: %v", err)
	}
	if got := f.requests(before); strings.Join(got, ", ") != strings.Join(closedBoth[:2], ", ") {
		t.Errorf("a copy that is its parent: sent %v", got)
	}
	// Fewer copies than asked; a copy at another provider; a member the protocol lacks.
	for name, tc := range map[string]struct {
		change func(a *ForkAnswer) any
		check  func(err error) bool
	}{
		"one copy": {func(a *ForkAnswer) any { a.Sessions = a.Sessions[:1]; return a },
			func(err error) bool { return errors.As(err, &mh) && mh.Code == "bad_response" }},
		"another provider": {func(a *ForkAnswer) any { a.Sessions[0].Provider = "q"; return a },
			func(err error) bool { return errors.Is(err, ErrProviderMismatch) }},
		"a copy answering another request": {func(a *ForkAnswer) any { a.Sessions[0].RequestID = "another"; return a },
			func(err error) bool { return errors.As(err, &mh) && mh.Code == "request_id_mismatch" }},
		"an unknown member": {func(a *ForkAnswer) any {
			var v map[string]any
			_ = json.Unmarshal(encodeJSON(t, a), &v)
			v["sessions"].([]any)[0].(map[string]any)["parent"] = parentID
			return v
		}, func(err error) bool {
			return errors.As(err, &mh) && mh.Code == "bad_response" && strings.Contains(err.Error(), "unknown member `parent`")
		}},
	} {
		tc := tc
		f.fork = func(id string) (int, any) { a := honestFork(id); return http.StatusOK, tc.change(&a) }
		if _, _, err := parent(c).Fork(context.Background(), 2); !tc.check(err) || !errors.Is(err, ErrMayHaveRun) {
			t.Errorf("%s: %v", name, err)
		}
	}

	// The whole answer echoing another request: not this one's, so nothing is closed.
	f.fork = func(id string) (int, any) { return http.StatusOK, honestFork("another") }
	before = f.count()
	_, _, err = parent(c).Fork(context.Background(), 2)
	if !errors.As(err, &mh) || mh.Code != "request_id_mismatch" || len(f.requests(before)) != 1 {
		t.Errorf("another request's fork: %v, sent %v", err, f.requests(before))
	}
	// A snapshot taken at another place in the chain than the one verified here: the
	// parent's chain is in doubt until a resync.
	f.fork = func(id string) (int, any) { a := honestFork(id); a.Snapshot.Calls = 3; return http.StatusOK, a }
	s := parent(c)
	_, _, err = s.Fork(context.Background(), 2)
	var cm *ChainMismatchError
	if !errors.As(err, &cm) || cm.Field != "snapshot.calls" || cm.Want != "2" || cm.Got != "3" || !errors.Is(s.Doubt(), ErrChainMismatch) {
		t.Fatalf("a snapshot after another call: %v (doubt %v)", err, s.Doubt())
	}
	before = f.count()
	if _, _, err := s.Fork(context.Background(), 2); !errors.Is(err, ErrChainInDoubt) || f.count() != before {
		t.Errorf("a fork while in doubt: %v", err)
	}
	if _, err := s.Snapshot(context.Background()); !errors.Is(err, ErrChainInDoubt) || f.count() != before {
		t.Errorf("a snapshot while in doubt: %v", err)
	}
	// Refusals: believed with this request's id, not with another's.
	refuse := func(echo func(id string) any) func(id string) (int, any) {
		return func(id string) (int, any) {
			return http.StatusUnprocessableEntity, map[string]any{"protocol": 1, "request_id": echo(id),
				"error": map[string]any{"code": "unsupported", "message": "no", "not_dispatched": "unsupported"}}
		}
	}
	f.fork = refuse(func(id string) any { return id })
	_, _, err = parent(c).Fork(context.Background(), 2)
	var nd *NotDispatchedError
	if !errors.As(err, &nd) || nd.Reason != ReasonUnsupported || nd.Status != http.StatusUnprocessableEntity || !errors.Is(err, ErrUnsupported) {
		t.Errorf("a refusal: %v", err)
	}
	f.fork = refuse(func(string) any { return "another" })
	if _, _, err = parent(c).Fork(context.Background(), 2); !errors.As(err, &mh) || mh.Code != "unverified_refusal" {
		t.Errorf("another's refusal: %v", err)
	}
	// No copy: refused here, unsent.
	before = f.count()
	if _, _, err := parent(c).Fork(context.Background(), 0); !errors.As(err, &nd) || nd.Status != 0 || f.count() != before {
		t.Errorf("a fork of 0: %v", err)
	}
}

func TestASnapshotIsOfTheChainVerifiedHere(t *testing.T) {
	f := &snapshotFake{snapshot: func(id string) (int, any) { return http.StatusOK, snapshotOf(id) }}
	c := f.serve(t)
	snap, err := parent(c).Snapshot(context.Background())
	if err != nil || snap.SnapshotID != snapshotID || snap.Calls != 2 {
		t.Fatalf("an honest snapshot: %+v, %v", snap, err)
	}
	for name, tc := range map[string]struct {
		change func(s *SnapshotInfo)
		field  string
	}{
		"of another session":   {func(s *SnapshotInfo) { s.SessionID = copyID(1) }, "snapshot.session_id"},
		"before the last call": {func(s *SnapshotInfo) { s.Calls = 1 }, "snapshot.calls"},
		"at another record":    {func(s *SnapshotInfo) { s.LastRecordSHA256 = strings.Repeat("2f", 32) }, "snapshot.last_record_sha256"},
	} {
		tc := tc
		f.snapshot = func(id string) (int, any) { s := snapshotOf(id); tc.change(&s); return http.StatusOK, s }
		_, err := parent(c).Snapshot(context.Background())
		var cm *ChainMismatchError
		if !errors.As(err, &cm) || cm.Field != tc.field || !errors.Is(err, ErrMayHaveRun) {
			t.Errorf("%s: %v", name, err)
		}
	}
	var mh *MayHaveRunError
	for name, change := range map[string]func(s *SnapshotInfo){
		"another request":  func(s *SnapshotInfo) { s.RequestID = "another" },
		"a bad id":         func(s *SnapshotInfo) { s.SnapshotID = "snp_../x" },
		"a bad digest":     func(s *SnapshotInfo) { s.SHA256 = "A1" },
		"another provider": func(s *SnapshotInfo) { s.Provider = "q" },
		"another language": func(s *SnapshotInfo) { s.Language = JavaScript },
	} {
		change := change
		f.snapshot = func(id string) (int, any) { s := snapshotOf(id); change(&s); return http.StatusOK, s }
		if _, err := parent(c).Snapshot(context.Background()); !errors.As(err, &mh) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestARestoredSessionIsCheckedAgainstTheSnapshotItCameFrom(t *testing.T) {
	restoredID := copyID(5)
	restoredFrom := func() *SessionOrigin {
		o := forkedFrom()
		o.Start = OriginRestored
		return o
	}
	f := &snapshotFake{restore: func(id string) (int, any) { return http.StatusOK, madeInfo(restoredID, id, restoredFrom()) },
		call: copyCall(restoredFrom())}
	c := f.serve(t)
	snap := snapshotOf("")
	r, err := c.RestoreSession(context.Background(), snapshotID, RestoreOptions{Snapshot: &snap})
	if err != nil {
		t.Fatalf("an honest restore: %v", err)
	}
	if f.sent["sha256"] != snapshotSHA || r.sequence != 2 || r.last != parentRecord {
		t.Errorf("sent %v; the chain at %d %s", f.sent, r.sequence, r.last)
	}
	if res, err := r.Cell(context.Background(), "print(1)", CellOptions{}); err != nil || res.Record.Session.Sequence != 3 {
		t.Errorf("the restored session's first call: %v", err)
	}
	// By id alone, no digest: none sent, and only the origin's own consistency is checked.
	if _, err := c.RestoreSession(context.Background(), snapshotID, RestoreOptions{}); err != nil {
		t.Errorf("by id alone: %v", err)
	} else if _, sent := f.sent["sha256"]; sent {
		t.Error("a digest was sent")
	}

	closedIt := []string{"POST /v1/snapshots/" + snapshotID + "/sessions", "DELETE /v1/sessions/" + restoredID}
	for _, tc := range []struct {
		name, field string
		opts        RestoreOptions
		change      func(i *SessionInfo)
	}{
		{"from another session", "origin.parent_session_id", RestoreOptions{Snapshot: &snap}, func(i *SessionInfo) { i.Origin.ParentSessionID = copyID(7) }},
		{"forked, not restored", "origin.start", RestoreOptions{Snapshot: &snap}, func(i *SessionInfo) { i.Origin.Start = OriginForked }},
		{"with no origin", "origin", RestoreOptions{SHA256: snapshotSHA}, func(i *SessionInfo) { i.Origin = nil }},
		{"from another digest than asked", "origin.snapshot_sha256", RestoreOptions{SHA256: snapshotSHA}, func(i *SessionInfo) { i.Origin.SnapshotSHA256 = strings.Repeat("b2", 32) }},
		{"after another call", "origin.parent_calls", RestoreOptions{Snapshot: &snap}, func(i *SessionInfo) { i.Origin.ParentCalls, i.Calls = 1, 1 }},
		{"with its chain afresh", "calls", RestoreOptions{}, func(i *SessionInfo) { i.Calls, i.LastRecordSHA256 = 0, "" }},
	} {
		tc := tc
		f.restore = func(id string) (int, any) {
			i := madeInfo(restoredID, id, restoredFrom())
			tc.change(&i)
			return http.StatusOK, i
		}
		before := f.count()
		_, err := c.RestoreSession(context.Background(), snapshotID, tc.opts)
		var cm *ChainMismatchError
		if !errors.As(err, &cm) || cm.Field != tc.field || cm.SessionID != restoredID || cm.Subject == "" || !errors.Is(err, ErrMayHaveRun) {
			t.Errorf("%s: want a chain mismatch on %s, got %v", tc.name, tc.field, err)
		}
		if got := f.requests(before); strings.Join(got, ", ") != strings.Join(closedIt, ", ") {
			t.Errorf("%s: sent %v, want the restore and its close", tc.name, got)
		}
	}
	// Refused here, unsent: options that disagree, a digest that is not one, an id that is
	// not a snapshot's.
	before := f.count()
	other := snap
	other.SnapshotID = "snp_0123456789abcdef_" + strings.Repeat("0", 31) + "b"
	for name, tc := range map[string]struct {
		id   string
		opts RestoreOptions
	}{
		"another snapshot's info": {snapshotID, RestoreOptions{Snapshot: &other}},
		"two digests":             {snapshotID, RestoreOptions{SHA256: strings.Repeat("b2", 32), Snapshot: &snap}},
		"not a digest":            {snapshotID, RestoreOptions{SHA256: "A1"}},
		"not a snapshot id":       {parentID, RestoreOptions{}},
	} {
		_, err := c.RestoreSession(context.Background(), tc.id, tc.opts)
		var nd *NotDispatchedError
		if !errors.As(err, &nd) || nd.Reason != ReasonRequest || nd.Status != 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
	if f.count() != before {
		t.Errorf("sent %v", f.requests(before))
	}
	// The daemon's refusal, echoing this request: no such snapshot.
	f.restore = func(id string) (int, any) {
		return http.StatusNotFound, map[string]any{"protocol": 1, "request_id": id,
			"error": map[string]any{"code": "snapshot_not_found", "message": "no such snapshot", "not_dispatched": "request"}}
	}
	_, err = c.RestoreSession(context.Background(), snapshotID, RestoreOptions{})
	var nd *NotDispatchedError
	if !errors.As(err, &nd) || nd.Code != "snapshot_not_found" || !errors.Is(err, ErrSnapshotNotFound) || !strings.Contains(err.Error(), "snapshot_not_found") {
		t.Errorf("no such snapshot: %v", err)
	}
}

func TestSnapshotIDsHaveOneShape(t *testing.T) {
	if err := validateSnapshotID(snapshotID); err != nil {
		t.Errorf("%s: %v", snapshotID, err)
	}
	for _, bad := range []string{"", "snp_", parentID, snapshotID + "0", strings.ToUpper(snapshotID), "snp_../../v1/runs",
		"snp_0123456789abcdef/" + strings.Repeat("a", 32)} {
		if validateSnapshotID(bad) == nil {
			t.Errorf("%q passed", bad)
		}
	}
}
