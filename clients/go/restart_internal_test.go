// Sessions that outlive a daemon restart, without a daemon: on SIGTERM the daemon saves a
// runsc session and the next one restores it under the same id, its records carrying that
// restore as their origin from the call after the last one saved, at the tier and evidence
// the restoring daemon measured. The chain takes that change there and nowhere else, from a
// call's record or from the daemon's show (Refresh, Resync). The answers are synthetic and
// every digest in them is right: only the check under test can fail them.

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
	restartedID = "ses_0123456789abcdef_" + "0a0b0c0d0e0f0a0b0c0d0e0f0a0b0c0d"
	restoredSHA = "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e"
)

var newEvidence = strings.Repeat("d", 64)

// restoredAt is the origin of restartedID restored under its own id after its call `calls`,
// whose record is `record`.
func restoredAt(calls uint64, record string) *SessionOrigin {
	return &SessionOrigin{Start: OriginRestored, SnapshotSHA256: restoredSHA, ParentSessionID: restartedID,
		ParentRecordSHA256: record, ParentCalls: calls}
}

// restartCall is an honest answer to sent at this place of restartedID's chain, carrying
// origin, run at kernel tier under the restoring daemon's evidence unless change says
// otherwise (its digest recomputed after change).
func restartCall(t *testing.T, sent *wireRequest, sequence uint64, previous string, origin *SessionOrigin, change func(r *Record)) *Result {
	t.Helper()
	res := honest(t, sent, IsolationKernel, IsolationContainer)
	res.Record.EvidenceSHA256 = newEvidence
	res.Record.Session = &SessionLink{SessionID: restartedID, Sequence: sequence, PreviousRecordSHA256: previous, Origin: origin}
	if change != nil {
		change(&res.Record)
	}
	res.Isolation = res.Record.Isolation
	res.Record.RecordSHA256 = RecordSHA256(&res.Record)
	return res
}

// oneCall is a session opened fresh, its chain after call 1 (no origin), and that call's
// record digest.
func oneCall(t *testing.T) (*Session, string) {
	t.Helper()
	s := testSession(restartedID)
	first := linked(t, sentWith(""), restartedID, 1, "")
	if _, err := s.follow(first, callJob); err != nil {
		t.Fatalf("the first call: %v", err)
	}
	return s, first.Record.RecordSHA256
}

func TestARestoreUnderItsOwnIDIsTakenAtTheCallAfterTheLastVerified(t *testing.T) {
	sent := sentWith("")
	s, r1 := oneCall(t)
	second := restartCall(t, sent, 2, r1, restoredAt(1, r1), nil)
	if _, err := s.follow(second, callJob); err != nil {
		t.Fatalf("the first call after the restart: %v", err)
	}
	// From here the session's origin, tier and evidence are the restore's.
	if o := s.info.Origin; o == nil || *o != *restoredAt(1, r1) || s.info.Isolation != IsolationKernel || s.info.EvidenceSHA256 != newEvidence {
		t.Fatalf("the session after the restore: %+v", s.info)
	}
	if s.sequence != 2 || s.last != second.Record.RecordSHA256 || s.info.Provider != "p" || s.info.Environment != "test" {
		t.Fatalf("the chain: %d %s, %+v", s.sequence, s.last, s.info)
	}
	third := restartCall(t, sent, 3, s.last, restoredAt(1, r1), nil)
	if _, err := s.follow(third, callJob); err != nil {
		t.Fatalf("the next call under the restore: %v", err)
	}
	// A later record whose origin reverts or names the restore at another call, or whose
	// tier or evidence go back: refused, the chain where it was.
	info := s.info
	for _, tc := range []struct {
		name, field string
		origin      *SessionOrigin
		change      func(r *Record)
	}{
		{"the origin dropped", "origin", nil, nil},
		{"the origin dropped, the first sandbox back", "origin", nil, func(r *Record) {
			r.Isolation, r.EvidenceSHA256 = IsolationContainer, strings.Repeat("e", 64)
		}},
		{"a restore after call 2", "origin", restoredAt(2, second.Record.RecordSHA256), nil},
		{"the first tier back", "isolation", restoredAt(1, r1), func(r *Record) { r.Isolation = IsolationContainer }},
		{"the first evidence back", "evidence_sha256", restoredAt(1, r1), func(r *Record) { r.EvidenceSHA256 = strings.Repeat("e", 64) }},
	} {
		_, err := s.follow(restartCall(t, sent, 4, s.last, tc.origin, tc.change), callJob)
		var cm *ChainMismatchError
		if !errors.As(err, &cm) || cm.Field != tc.field || !errors.Is(err, ErrMayHaveRun) {
			t.Errorf("%s: want a chain mismatch on %s, got %v", tc.name, tc.field, err)
		}
		if s.sequence != 3 || s.last != third.Record.RecordSHA256 || !sameOrigin(s.info.Origin, info.Origin) || s.info.Isolation != info.Isolation {
			t.Fatalf("%s: the chain or the session moved", tc.name)
		}
	}
	// Another restart, after call 3: that restore is taken there, back at the first tier.
	r3 := third.Record.RecordSHA256
	fourth := restartCall(t, sent, 4, r3, restoredAt(3, r3), func(r *Record) { r.Isolation = IsolationContainer })
	if _, err := s.follow(fourth, callJob); err != nil || s.info.Origin.ParentCalls != 3 || s.info.Isolation != IsolationContainer {
		t.Fatalf("a second restart: %v, %+v", err, s.info)
	}
}

func TestNoOtherChangeOfOriginOrSandboxIsTaken(t *testing.T) {
	sent := sentWith("")
	for _, tc := range []struct {
		name, field string
		origin      func(r1 string) *SessionOrigin
		change      func(r *Record)
	}{
		// Off by one either way: not the call after the last one verified here.
		{"restored after call 0", "origin", func(string) *SessionOrigin { return restoredAt(0, "") }, nil},
		{"restored after call 2", "origin", func(r1 string) *SessionOrigin { return restoredAt(2, r1) }, nil},
		// Another session's restore, a fork, another parent record.
		{"another session's", "origin", func(r1 string) *SessionOrigin {
			o := restoredAt(1, r1)
			o.ParentSessionID = parentID
			return o
		}, nil},
		{"forked", "origin", func(r1 string) *SessionOrigin {
			o := restoredAt(1, r1)
			o.Start = OriginForked
			return o
		}, nil},
		{"another parent record", "origin", func(string) *SessionOrigin { return restoredAt(1, strings.Repeat("2f", 32)) }, nil},
		{"no parent record", "origin", func(string) *SessionOrigin { return restoredAt(1, "") }, nil},
		// Its provider and environment stay the session's across a restore.
		{"another provider", "provider", func(r1 string) *SessionOrigin { return restoredAt(1, r1) }, func(r *Record) { r.Provider = "q" }},
		{"another environment", "environment", func(r1 string) *SessionOrigin { return restoredAt(1, r1) }, func(r *Record) { r.Environment = "elsewhere" }},
		// Without a restore, the tier and evidence are the session's.
		{"another tier", "isolation", func(string) *SessionOrigin { return nil }, nil},
		{"other evidence", "evidence_sha256", func(string) *SessionOrigin { return nil }, func(r *Record) { r.Isolation = IsolationContainer }},
	} {
		s, r1 := oneCall(t)
		info := s.info
		_, err := s.follow(restartCall(t, sent, 2, r1, tc.origin(r1), tc.change), callJob)
		var cm *ChainMismatchError
		if !errors.As(err, &cm) || cm.Field != tc.field || !errors.Is(err, ErrChainMismatch) {
			t.Errorf("%s: want a chain mismatch on %s, got %v", tc.name, tc.field, err)
		}
		if s.sequence != 1 || s.last != r1 || s.resandboxed || !sameOrigin(s.info.Origin, nil) || s.info.Isolation != info.Isolation || s.info.EvidenceSHA256 != info.EvidenceSHA256 {
			t.Errorf("%s: the chain or the session moved: %+v", tc.name, s.info)
		}
	}
}

func TestARestoreBeforeTheFirstCallAndOfACopyAreTaken(t *testing.T) {
	sent := sentWith("")
	// Saved before its first call: the restore names call 0 and no record.
	s := testSession(restartedID)
	if _, err := s.follow(restartCall(t, sent, 1, "", restoredAt(0, ""), nil), callJob); err != nil || s.info.Origin == nil {
		t.Fatalf("a restore before the first call: %v", err)
	}
	// A forked copy (its chain at its parent's call 2) restored under its own id after its
	// call 3: the fork's origin gives way to the restore's, once.
	c := testSession(restartedID)
	forked := forkedFrom()
	c.info.Origin, c.sequence, c.last = forked, 2, parentRecord
	third := restartCall(t, sent, 3, parentRecord, forked, func(r *Record) {
		r.Isolation, r.EvidenceSHA256 = IsolationContainer, strings.Repeat("e", 64)
	})
	if _, err := c.follow(third, callJob); err != nil {
		t.Fatalf("the copy's call 3: %v", err)
	}
	r3 := third.Record.RecordSHA256
	if _, err := c.follow(restartCall(t, sent, 4, r3, restoredAt(3, r3), nil), callJob); err != nil || c.info.Origin.Start != OriginRestored {
		t.Fatalf("the copy restored under its own id: %v", err)
	}
	_, err := c.follow(restartCall(t, sent, 5, c.last, forked, nil), callJob)
	var cm *ChainMismatchError
	if !errors.As(err, &cm) || cm.Field != "origin" {
		t.Errorf("the fork's origin back: %v", err)
	}
}

// restartFake answers a session's cells and its show from hooks, on loopback.
type restartFake struct {
	mu sync.Mutex
	// call answers the cell sent; show is the session shown.
	call func(w *wireRequest) *Result
	show func() SessionInfo
}

func (f *restartFake) serve(t *testing.T) *Client {
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		defer f.mu.Unlock()
		var out any
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/v1/sessions/"+restartedID:
			out = f.show()
		case r.Method == http.MethodPost && r.URL.Path == "/v1/sessions/"+restartedID+"/cells":
			var w wireRequest
			if _, err := readStrict(body, &w); err != nil {
				t.Errorf("the client sent %s: %v", body, err)
			}
			out = f.call(&w)
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
			rw.WriteHeader(http.StatusNotFound)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(out)
	}))
	t.Cleanup(srv.Close)
	return New(srv.URL, "t")
}

// restartSession is restartedID opened fresh at c, before any call, as the daemon showed it.
func restartSession(c *Client) *Session {
	info := madeInfo(restartedID, "", nil)
	info.OpenedUnixMS = 1_700_000_000_000
	return &Session{client: c, id: restartedID, info: info}
}

// cellAnswer answers cell w at this place of the chain, carrying origin; restored answers
// run at kernel tier under the restoring daemon's evidence.
func cellAnswer(t *testing.T, w *wireRequest, sequence uint64, previous string, origin *SessionOrigin) *Result {
	tier, evidence := IsolationContainer, strings.Repeat("e", 64)
	if origin != nil {
		tier, evidence = IsolationKernel, newEvidence
	}
	res := honest(t, w, tier, IsolationContainer)
	kept := true
	res.Output.StateKept = &kept
	res.ResultSHA256 = ResultSHA256(&res.Output)
	res.Record.ResultSHA256, res.Record.EvidenceSHA256 = res.ResultSHA256, evidence
	res.Record.Session = &SessionLink{SessionID: restartedID, Sequence: sequence, PreviousRecordSHA256: previous, Origin: origin}
	res.Record.RecordSHA256 = RecordSHA256(&res.Record)
	return res
}

// shownAfterRestart is the session as the restoring daemon shows it: restored after call
// `calls` (record `record`), `now` calls and last record `last`, in a new sandbox (another
// wall, the tier and evidence measured again, its opening time given again).
func shownAfterRestart(origin *SessionOrigin, now uint64, last string) SessionInfo {
	info := madeInfo(restartedID, "", nil)
	info.Origin, info.Calls, info.LastRecordSHA256 = origin, now, last
	info.Isolation, info.EvidenceSHA256 = IsolationKernel, newEvidence
	info.Wall = Wall{RootReadOnly: true, Namespaces: []WallNamespace{{Name: "net", ID: "net:[4026532999]"}}}
	info.OpenedUnixMS = 1_700_000_000_001
	return info
}

func TestASessionRestoredByARestartGoesOnThroughCallsAndShows(t *testing.T) {
	ctx := context.Background()
	var records []string
	origin := (*SessionOrigin)(nil)
	var shown SessionInfo
	f := &restartFake{
		call: func(w *wireRequest) *Result {
			previous := ""
			if len(records) > 0 {
				previous = records[len(records)-1]
			}
			res := cellAnswer(t, w, uint64(len(records)+1), previous, origin)
			records = append(records, res.Record.RecordSHA256)
			return res
		},
		show: func() SessionInfo { return shown },
	}
	s := restartSession(f.serve(t))
	if _, err := s.Cell(ctx, "x = 41", CellOptions{}); err != nil {
		t.Fatalf("call 1: %v", err)
	}
	r1 := records[0]
	origin = restoredAt(1, r1) // the daemon restarted
	res, err := s.Cell(ctx, "print(x + 1)", CellOptions{})
	if err != nil || res.Record.Session.Sequence != 2 || s.Info().Origin == nil || s.Info().Isolation != IsolationKernel {
		t.Fatalf("the first call after the restart: %v, %+v", err, s.Info())
	}
	// The daemon's show of the restored session: its new wall and opening time are taken
	// once; after that the wall is fixed again.
	shown = shownAfterRestart(restoredAt(1, r1), 2, records[1])
	if info, err := s.Refresh(ctx); err != nil || info.Wall.Namespaces == nil {
		t.Fatalf("a refresh after the restore: %v", err)
	}
	shown.Wall = Wall{RootReadOnly: true}
	if _, err := s.Refresh(ctx); err == nil || !strings.Contains(err.Error(), "wall") {
		t.Errorf("another wall after the restore's was shown: %v", err)
	}
	// A call whose record drops the origin again: refused, the chain in doubt.
	origin = nil
	_, err = s.Cell(ctx, "print(x)", CellOptions{})
	var cm *ChainMismatchError
	if !errors.As(err, &cm) || cm.Field != "origin" || !errors.Is(s.Doubt(), ErrChainMismatch) {
		t.Fatalf("a record without the restore's origin: %v", err)
	}
	// The resync that follows takes the daemon's word only with the restore's origin.
	shown = shownAfterRestart(nil, 3, records[2])
	var se *SessionError
	if _, err := s.Resync(ctx); !errors.As(err, &se) || !strings.Contains(err.Error(), "origin") || s.Doubt() == nil {
		t.Errorf("a resync showing no origin: %v", err)
	}
	shown = shownAfterRestart(restoredAt(1, r1), 3, records[2])
	if info, err := s.Resync(ctx); err != nil || info.Calls != 3 || s.Doubt() != nil {
		t.Fatalf("a resync under the restore: %v", err)
	}
	origin = restoredAt(1, r1)
	if res, err := s.Cell(ctx, "print(x)", CellOptions{}); err != nil || res.Record.Session.Sequence != 4 {
		t.Errorf("call 4: %v", err)
	}
}

func TestAResyncTakesARestoreAtTheChainItKnowsAndNothingElse(t *testing.T) {
	ctx := context.Background()
	var shown SessionInfo
	var origin *SessionOrigin
	first := ""
	f := &restartFake{
		call: func(w *wireRequest) *Result {
			if first == "" {
				res := cellAnswer(t, w, 1, "", nil)
				first = res.Record.RecordSHA256
				return res
			}
			return cellAnswer(t, w, 2, first, origin)
		},
		show: func() SessionInfo { return shown },
	}
	c := f.serve(t)
	s := restartSession(c)
	if _, err := s.Cell(ctx, "x = 41", CellOptions{}); err != nil {
		t.Fatal(err)
	}
	r1 := first
	at := func(change func(o *SessionOrigin)) *SessionOrigin {
		o := restoredAt(1, r1)
		if change != nil {
			change(o)
		}
		return o
	}
	for name, change := range map[string]func(i *SessionInfo){
		"restored after call 0":    func(i *SessionInfo) { i.Origin = restoredAt(0, "") },
		"restored after call 2":    func(i *SessionInfo) { i.Origin, i.Calls = restoredAt(2, r1), 2 },
		"another session's":        func(i *SessionInfo) { i.Origin = at(func(o *SessionOrigin) { o.ParentSessionID = parentID }) },
		"forked":                   func(i *SessionInfo) { i.Origin = at(func(o *SessionOrigin) { o.Start = OriginForked }) },
		"another parent record":    func(i *SessionInfo) { i.Origin = at(func(o *SessionOrigin) { o.ParentRecordSHA256 = parentRecord }) },
		"no restore, another tier": func(i *SessionInfo) { i.Origin = nil },
		"no restore, another wall": func(i *SessionInfo) {
			i.Origin, i.Isolation, i.EvidenceSHA256 = nil, IsolationContainer, strings.Repeat("e", 64)
		},
		"restored, another provider":     func(i *SessionInfo) { i.Provider = "q" },
		"restored, another environment":  func(i *SessionInfo) { i.Environment = "elsewhere" },
		"restored, another floor":        func(i *SessionInfo) { i.MinimumIsolation = IsolationKernel },
		"restored, below its floor":      func(i *SessionInfo) { i.Isolation = IsolationProcess },
		"restored, opened an hour later": func(i *SessionInfo) { i.OpenedUnixMS += 3_600_000 },
	} {
		shown = shownAfterRestart(restoredAt(1, r1), 1, r1)
		change(&shown)
		before := s.Info()
		_, err := s.Resync(ctx)
		var se *SessionError
		if !errors.As(err, &se) || se.Code != "bad_response" {
			t.Errorf("%s: %v", name, err)
		}
		if s.sequence != 1 || s.last != r1 || !sameOrigin(s.Info().Origin, nil) || s.Info().Isolation != before.Isolation {
			t.Fatalf("%s: the session moved: %+v", name, s.Info())
		}
	}
	// Restored right after call 1, in a new sandbox: taken, and the next call carries it.
	shown = shownAfterRestart(restoredAt(1, r1), 1, r1)
	if info, err := s.Resync(ctx); err != nil || info.Origin == nil || s.Info().Isolation != IsolationKernel {
		t.Fatalf("a resync after the restart: %v", err)
	}
	origin = restoredAt(1, r1)
	if res, err := s.Cell(ctx, "print(x + 1)", CellOptions{}); err != nil || res.Record.Session.Sequence != 2 {
		t.Fatalf("the call after: %v", err)
	}
}
