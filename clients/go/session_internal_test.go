// Sessions without a daemon: the session id's shape, the reading of a streamed answer line
// by line, and the chain check, on answers a real daemon never sends but a party in the
// middle could.

package sandbox

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
)

func TestSessionIDsHaveOneShape(t *testing.T) {
	good := "ses_0123456789abcdef_" + strings.Repeat("a", 32)
	if err := validateSessionID(good); err != nil {
		t.Errorf("%s: %v", good, err)
	}
	for _, bad := range []string{"", "ses_", good + "0", strings.ToUpper(good), "ses_0123456789abcdef/" + strings.Repeat("a", 32),
		"ses_0123456789abcdef_" + strings.Repeat("a", 31) + "/", "xes_0123456789abcdef_" + strings.Repeat("a", 32),
		"ses_0123456789abcdef_" + strings.Repeat("a", 16) + "_" + strings.Repeat("a", 15), "ses_../../v1/runs"} {
		if validateSessionID(bad) == nil {
			t.Errorf("%q passed", bad)
		}
	}
}

// linked is an honest answer to sent, at this place in session sid's chain.
func linked(t *testing.T, sent *wireRequest, sid string, sequence uint64, previous string) *Result {
	t.Helper()
	res := honest(t, sent, IsolationContainer, IsolationContainer)
	res.Record.Session = &SessionLink{SessionID: sid, Sequence: sequence, PreviousRecordSHA256: previous}
	res.Record.RecordSHA256 = RecordSHA256(&res.Record)
	return res
}

func testSession(sid string) *Session {
	return &Session{id: sid, info: SessionInfo{SessionID: sid, Provider: "p", Isolation: IsolationContainer,
		MinimumIsolation: IsolationContainer, EvidenceSHA256: strings.Repeat("e", 64), Environment: "test"}}
}

func TestTheChainIsFollowedLinkByLink(t *testing.T) {
	sid := "ses_0123456789abcdef_" + strings.Repeat("a", 32)
	s := testSession(sid)
	sent := sentWith("")
	first := linked(t, sent, sid, 1, "")
	if _, err := s.follow(first, callJob); err != nil {
		t.Fatalf("the first call: %v", err)
	}
	if s.sequence != 1 || s.last != first.Record.RecordSHA256 || s.info.Calls != 1 {
		t.Fatalf("the chain did not move: %d %s", s.sequence, s.last)
	}
	for _, tc := range []struct {
		field string
		res   *Result
	}{
		{"session", honest(t, sent, IsolationContainer, IsolationContainer)},
		{"session_id", linked(t, sent, "ses_0123456789abcdef_"+strings.Repeat("b", 32), 2, first.Record.RecordSHA256)},
		{"sequence", linked(t, sent, sid, 1, "")},                                    // repeated
		{"sequence", linked(t, sent, sid, 3, strings.Repeat("1", 64))},               // one missing
		{"previous_record_sha256", linked(t, sent, sid, 2, "")},                      // unlinked
		{"previous_record_sha256", linked(t, sent, sid, 2, strings.Repeat("1", 64))}, // another's
	} {
		_, err := s.follow(tc.res, callJob)
		var cm *ChainMismatchError
		if !errors.As(err, &cm) || cm.Field != tc.field || !errors.Is(err, ErrMayHaveRun) || !errors.Is(err, ErrChainMismatch) {
			t.Errorf("%s: %v", tc.field, err)
		}
	}
	if s.sequence != 1 || s.last != first.Record.RecordSHA256 {
		t.Fatal("the chain moved on an answer that failed its check")
	}
	for field, change := range map[string]func(*Record){
		"provider":        func(r *Record) { r.Provider = "q" },
		"isolation":       func(r *Record) { r.Isolation = IsolationVM },
		"evidence_sha256": func(r *Record) { r.EvidenceSHA256 = strings.Repeat("f", 64) },
		"environment":     func(r *Record) { r.Environment = "elsewhere" },
	} {
		res := linked(t, sent, sid, 2, first.Record.RecordSHA256)
		change(&res.Record)
		_, err := s.follow(res, callJob)
		var cm *ChainMismatchError
		if !errors.As(err, &cm) || cm.Field != field {
			t.Errorf("%s: %v", field, err)
		}
	}
	// A cell says whether the state was kept; steps and files say nothing of it.
	kept, end := true, false
	res := linked(t, sent, sid, 2, first.Record.RecordSHA256)
	for name, tc := range map[string]struct {
		kind callKind
		set  func(o *Output)
	}{
		"a cell without state_kept":     {callCell, func(o *Output) {}},
		"a job with state_kept":         {callJob, func(o *Output) { o.StateKept = &kept }},
		"an end with the state kept":    {callCell, func(o *Output) { o.StateKept, o.InterpreterEnd = &kept, EndCellTimeout }},
		"a session's end on a cell":     {callCell, func(o *Output) { o.StateKept, o.InterpreterEnd = &end, EndClosed }},
		"a job with an interpreter end": {callJob, func(o *Output) { o.InterpreterEnd = EndInterpreterCrash }},
	} {
		r := *res
		r.Output.StateKept, r.Output.InterpreterEnd = nil, ""
		tc.set(&r.Output)
		_, err := s.follow(&r, tc.kind)
		var mh *MayHaveRunError
		if !errors.As(err, &mh) || mh.Code != "bad_response" {
			t.Errorf("%s: %v", name, err)
		}
	}
	res.Output.StateKept, res.Output.InterpreterEnd = &end, EndOutOfMemory
	if _, err := s.follow(res, callCell); err != nil || s.info.InterpreterAlive || s.sequence != 2 {
		t.Errorf("an interpreter end: %v, alive %v", err, s.info.InterpreterAlive)
	}
}

// streamOf reads a streamed answer to sent made of these lines.
func streamOf(t *testing.T, sent *wireRequest, lines ...string) ([]Chunk, *Result, error) {
	t.Helper()
	var chunks []Chunk
	x := &runExchange{url: "http://daemon/v1/sessions/x/cells", sent: sent, floor: IsolationContainer, source: floorSession,
		onChunk: func(c Chunk) { chunks = append(chunks, c) }}
	// One byte at a time: a line is read whole however the body arrives.
	res, err := x.readStream(iotest.OneByteReader(strings.NewReader(strings.Join(lines, ""))))
	return chunks, res, err
}

func TestAStreamedAnswerIsReadLineByLine(t *testing.T) {
	sent := sentWith("")
	sid := "ses_0123456789abcdef_" + strings.Repeat("a", 32)
	answer := string(encodeJSON(t, linked(t, sent, sid, 1, "")))
	chunk := `{"chunk":{"preview":true,"stream":"stdout","offset":0,"bytes":"first\n"}}` + "\n"
	binary := `{"chunk":{"preview":true,"stream":"stderr","offset":0,"bytes":{"base64":"/wA="}}}` + "\n"

	chunks, res, err := streamOf(t, sent, chunk, binary, `{"response":`+answer+"}\n")
	if err != nil || res == nil {
		t.Fatalf("an honest stream: %v", err)
	}
	if len(chunks) != 2 || chunks[0].Stream != Stdout || chunks[0].Bytes.String() != "first\n" ||
		chunks[1].Stream != Stderr || string(chunks[1].Bytes) != "\xff\x00" {
		t.Errorf("chunks %+v", chunks)
	}
	// Empty lines are keep-alives, sent while the call is silent.
	if chunks, _, err := streamOf(t, sent, "\n", chunk, "\n", "\n", `{"response":`+answer+"}\n"); err != nil || len(chunks) != 1 {
		t.Errorf("keep-alives: %d chunks, %v", len(chunks), err)
	}
	// The last line without its newline is still a line.
	if _, _, err := streamOf(t, sent, chunk, `{"response":`+answer+"}"); err != nil {
		t.Errorf("no final newline: %v", err)
	}
	// The final response is verified as a whole answer is.
	altered := strings.Replace(answer, `"stdout":"`, `"stdout":"x`, 1)
	if _, _, err := streamOf(t, sent, chunk, `{"response":`+altered+"}\n"); !errors.Is(err, ErrDigestMismatch) {
		t.Errorf("an altered response: %v", err)
	}
	for name, lines := range map[string][]string{
		"no preview":        {strings.Replace(chunk, "true", "false", 1)},
		"two members":       {`{"chunk":{"preview":true,"stream":"stdout","offset":0,"bytes":""},"response":{}}` + "\n"},
		"no member":         {"{}\n"},
		"an unknown member": {`{"chunks":[]}` + "\n"},
		"a bad stream":      {strings.Replace(chunk, "stdout", "stdin", 1)},
		"not JSON":          {"data: hello\n"},
		"a duplicate":       {`{"chunk":{"preview":true,"preview":true,"stream":"stdout","offset":0,"bytes":""}}` + "\n"},
	} {
		_, _, err := streamOf(t, sent, lines...)
		var mh *MayHaveRunError
		if !errors.As(err, &mh) || mh.Code != "bad_response" {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Cut short: may have run.
	for name, lines := range map[string][]string{"empty": nil, "chunks only": {chunk, chunk}, "keep-alives only": {chunk, "\n", "\n"},
		"a cut line": {chunk, `{"response":{"prot`}} {
		_, _, err := streamOf(t, sent, lines...)
		var mh *MayHaveRunError
		if !errors.As(err, &mh) || (mh.Code != "transport" && mh.Code != "bad_response") {
			t.Errorf("%s: %v", name, err)
		}
		if _, ok := NotDispatchedReason(err); ok {
			t.Errorf("%s reads not dispatched", name)
		}
	}
	// An error line: believed only with this request's id.
	refusal := func(id string) string {
		return `{"error":{"protocol":1,"request_id":"` + id + `","error":{"code":"session_ended","message":"ended","not_dispatched":"request","end_reason":"idle_timeout"}}}` + "\n"
	}
	_, _, err = streamOf(t, sent, refusal(sent.RequestID))
	var nd *NotDispatchedError
	if !errors.As(err, &nd) || nd.Status != http.StatusOK || nd.EndReason != EndIdleTimeout || !errors.Is(err, ErrSessionEnded) {
		t.Errorf("a refusal: %v", err)
	}
	_, _, err = streamOf(t, sent, chunk, refusal("another"))
	var mh *MayHaveRunError
	if !errors.As(err, &mh) || mh.Code != "unverified_refusal" || mh.EndReason != EndIdleTimeout {
		t.Errorf("another's refusal: %v", err)
	}
}

// After a call that may have run unverified, the session sends nothing until a resync.
func TestACallInDoubtStopsTheSession(t *testing.T) {
	s := testSession("ses_0123456789abcdef_" + strings.Repeat("a", 32))
	refused := &NotDispatchedError{RequestID: "r-1", Reason: ReasonCapacity, Code: "capacity"}
	if _, err := s.settle(nil, refused); err != refused || s.doubt != nil || s.inDoubt("r-2") != nil {
		t.Fatalf("a refusal put the chain in doubt: %v", s.doubt)
	}
	broken := &MayHaveRunError{RequestID: "r-3", Code: "transport", Message: "reset"}
	if _, err := s.settle(nil, broken); err != broken || s.doubt != broken {
		t.Fatalf("a broken exchange left the chain trusted")
	}
	err := s.inDoubt("r-4")
	var nd *NotDispatchedError
	if !errors.As(err, &nd) || nd.Code != "chain_in_doubt" || nd.Reason != ReasonRequest || nd.Status != 0 || nd.RequestID != "r-4" {
		t.Fatalf("a call in doubt: %#v", err)
	}
	// This call did not run: it matches nothing that says it may have.
	if !errors.Is(err, ErrChainInDoubt) || !errors.Is(err, ErrNotDispatched) || errors.Is(err, ErrMayHaveRun) {
		t.Errorf("errors.Is: %v", err)
	}
	if !strings.Contains(err.Error(), "chain_in_doubt") || !strings.Contains(err.Error(), "Resync") || !strings.Contains(err.Error(), "reset") {
		t.Errorf("the refusal: %v", err)
	}
}
