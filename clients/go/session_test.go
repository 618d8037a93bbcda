// Sessions against a real plimsolld offering crun alone (docs/sessions.md), and against real
// HTTP proxies on loopback in front of it that alter, replay or slip calls into what passes
// through them.

package sandbox_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"plimsoll/clients/go/sandbox"
	"plimsoll/clients/go/sandbox/internal/testdaemon"
)

// otherCaller is the second caller of the sessions daemon.
const otherCaller = "go-client-test-other"

var sessionShared struct {
	once sync.Once
	d    *testdaemon.Daemon
	err  error
}

// sessionDaemon is the suite's plimsolld for sessions, started on first use: crun alone, no
// warm pools, two callers.
func sessionDaemon(t *testing.T) *testdaemon.Daemon {
	t.Helper()
	if why := testdaemon.Missing(); why != "" {
		testdaemon.SkipOrFail(t, why)
	}
	sessionShared.once.Do(func() {
		start := time.Now()
		sessionShared.d, sessionShared.err = testdaemon.Start(testdaemon.Options{
			Providers: []string{"crun"},
			// Each open session holds one of max_concurrent's (4) uid slots for its life.
			Extra:   "\n[pools]\n\n[sessions]\nmax_total = 3\nmax_per_caller = 2\n",
			Callers: []string{otherCaller},
		})
		if sessionShared.err == nil {
			fmt.Fprintf(os.Stderr, "plimsolld (sessions, crun) started and probed in %s: %s\n", time.Since(start).Round(time.Millisecond), sessionShared.d.URL)
		}
	})
	if sessionShared.err != nil {
		t.Fatalf("cannot start plimsolld: %v", sessionShared.err)
	}
	needContainer(t, sandbox.New(sessionShared.d.URL, sessionShared.d.Token))
	return sessionShared.d
}

func sessionClient(t *testing.T) *sandbox.Client {
	d := sessionDaemon(t)
	return sandbox.New(d.URL, d.Token)
}

// open opens a session of language and closes it when the test ends (unless it was closed).
func open(t *testing.T, c *sandbox.Client, language sandbox.Language) *sandbox.Session {
	t.Helper()
	s, err := c.OpenSession(ctx(t), sandbox.SessionOptions{Language: language})
	if err != nil {
		t.Fatalf("open a %s session: %v", language, err)
	}
	t.Cleanup(func() { closeQuietly(s) })
	return s
}

func closeQuietly(s *sandbox.Session) {
	if s.Info().EndReason == "" {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = s.Close(c)
	}
}

// cell runs code and fails the test unless it exited 0.
func cell(t *testing.T, s *sandbox.Session, code string) *sandbox.Result {
	t.Helper()
	res, err := s.Cell(ctx(t), code, sandbox.CellOptions{})
	if err != nil {
		t.Fatalf("cell %q: %v", code, err)
	}
	if res.Output.ExitCode == nil || *res.Output.ExitCode != 0 {
		t.Fatalf("cell %q: exit %v, stderr %q", code, res.Output.ExitCode, res.Output.Stderr)
	}
	return res
}

func TestASessionKeepsItsStateAcrossCellsAndChainsItsRecords(t *testing.T) {
	c := sessionClient(t)
	for _, tc := range []struct {
		language             sandbox.Language
		define, bump, report string
	}{
		{sandbox.Python, "n = 0\ndef twice(x):\n    return 2 * x", "n += 1", "print(twice(n))"},
		{sandbox.JavaScript, "var n = 0; function twice(x) { return 2 * x }", "n += 1", "console.log(twice(n))"},
	} {
		s := open(t, c, tc.language)
		info := s.Info()
		if info.Provider != "crun" || info.Isolation != sandbox.IsolationContainer || info.MinimumIsolation != sandbox.IsolationContainer ||
			info.Language != tc.language || info.Calls != 0 || !info.InterpreterAlive || info.EndReason != "" || s.ID() != info.SessionID {
			t.Fatalf("%s: opened %+v", tc.language, info)
		}
		var previous *sandbox.Result
		for i, code := range []string{tc.define, tc.bump, tc.bump, tc.bump, tc.report} {
			res := cell(t, s, code)
			link := res.Record.Session
			if link == nil || link.SessionID != s.ID() || link.Sequence != uint64(i+1) {
				t.Fatalf("%s: call %d links %+v", tc.language, i+1, link)
			}
			if (previous == nil) != (link.PreviousRecordSHA256 == "") || (previous != nil && link.PreviousRecordSHA256 != previous.Record.RecordSHA256) {
				t.Errorf("%s: call %d names previous record %q", tc.language, i+1, link.PreviousRecordSHA256)
			}
			if res.Output.StateKept == nil || !*res.Output.StateKept || res.Output.InterpreterEnd != "" {
				t.Errorf("%s: call %d: state kept %v, interpreter end %q", tc.language, i+1, res.Output.StateKept, res.Output.InterpreterEnd)
			}
			if res.Output.Wall == nil || res.Record.Provider != "crun" || res.Record.MinimumIsolation != sandbox.IsolationContainer {
				t.Errorf("%s: call %d: wall %v, record %+v", tc.language, i+1, res.Output.Wall, res.Record)
			}
			previous = res
		}
		if got := previous.Output.Stdout.String(); got != "6\n" {
			t.Errorf("%s: the state did not survive: %q", tc.language, got)
		}
		if info := s.Info(); info.Calls != 5 || info.LastRecordSHA256 != previous.Record.RecordSHA256 {
			t.Errorf("%s: after five calls: %+v", tc.language, info)
		}
		now, err := s.Refresh(ctx(t))
		if err != nil || now.Calls != 5 || now.LastRecordSHA256 != previous.Record.RecordSHA256 || !now.InterpreterAlive {
			t.Errorf("%s: refreshed %+v, %v", tc.language, now, err)
		}
		list, err := c.ListSessions(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, l := range list.Sessions {
			found = found || l.SessionID == s.ID()
		}
		if !found {
			t.Errorf("%s: the list lacks the session: %+v", tc.language, list)
		}
		closed, err := s.Close(ctx(t))
		if err != nil || closed.EndReason != sandbox.EndClosed || closed.SessionID != s.ID() {
			t.Fatalf("%s: close: %+v, %v", tc.language, closed, err)
		}
	}
}

func TestAFileAStepWroteIsReadByACellAndTheInterpreterEndsExplicitly(t *testing.T) {
	s := open(t, sessionClient(t), sandbox.Python)
	cell(t, s, "import json\nmarker = 1")
	res, err := s.Steps(ctx(t), []string{"printf 'step wrote this' > /work/from-step", "ls /work"}, sandbox.StepsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Output.Steps) != 2 || res.Output.ExitCode == nil || *res.Output.ExitCode != 0 || res.Output.Steps[1].Stdout.String() != "from-step\n" {
		t.Fatalf("steps: %+v", res.Output)
	}
	if res.Output.StateKept != nil || res.Output.InterpreterEnd != "" {
		t.Errorf("steps spoke of the interpreter: %v %q", res.Output.StateKept, res.Output.InterpreterEnd)
	}
	read := cell(t, s, "print(json.dumps(open('/work/from-step').read()))")
	if got := read.Output.Stdout.String(); got != "\"step wrote this\"\n" {
		t.Errorf("the cell read %q", got)
	}
	// A failing step stops the steps; it is a result.
	res, err = s.Steps(ctx(t), []string{"false", "echo never"}, sandbox.StepsOptions{})
	if err != nil || len(res.Output.Steps) != 1 || res.Output.ExitCode == nil || *res.Output.ExitCode != 1 {
		t.Errorf("a failing step: %+v, %v", res, err)
	}
	// No step: refused here, unsent (nothing to upload or read back either).
	_, err = s.Steps(ctx(t), nil, sandbox.StepsOptions{})
	var nd *sandbox.NotDispatchedError
	if !errors.As(err, &nd) || nd.Reason != sandbox.ReasonRequest || nd.Status != 0 {
		t.Errorf("no steps: %v", err)
	}

	// The interpreter ends (it exits during a cell): said on the result, then every cell is
	// refused, nothing run, until one asks for a restart.
	ended, err := s.Cell(ctx(t), "import os\nos._exit(3)", sandbox.CellOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ended.Output.InterpreterEnd != sandbox.EndInterpreterCrash || ended.Output.StateKept == nil || *ended.Output.StateKept {
		t.Fatalf("an exiting interpreter: end %q, state kept %v", ended.Output.InterpreterEnd, ended.Output.StateKept)
	}
	if s.Info().InterpreterAlive {
		t.Error("the session says its interpreter is alive")
	}
	_, err = s.Cell(ctx(t), "print(1)", sandbox.CellOptions{})
	if !errors.As(err, &nd) || nd.Code != "interpreter_ended" || nd.Status != http.StatusConflict || !errors.Is(err, sandbox.ErrInterpreterEnded) || nd.Reason != sandbox.ReasonRequest {
		t.Fatalf("a cell after the end: %v", err)
	}
	fresh, err := s.Cell(ctx(t), "print('fresh', 'marker' in globals())", sandbox.CellOptions{Restart: true})
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Output.Stdout.String() != "fresh False\n" || fresh.Output.StateKept == nil || *fresh.Output.StateKept {
		t.Errorf("a restarted interpreter: %q, state kept %v", fresh.Output.Stdout, fresh.Output.StateKept)
	}
	// /work outlived the interpreter.
	if again := cell(t, s, "print(open('/work/from-step').read())"); again.Output.Stdout.String() != "step wrote this\n" {
		t.Errorf("after the restart: %q", again.Output.Stdout)
	}
}

func TestPutAndGetAreByteExact(t *testing.T) {
	s := open(t, sessionClient(t), sandbox.Python)
	blob := []byte{}
	for b := 0; b < 256; b++ {
		blob = append(blob, byte(b))
	}
	blob = append(blob, 0xff, 0xfe, 0x00, '\n', 0xc3, 0x28)
	for _, path := range []string{"data/blob.bin", "héllo wörld?#.bin"} {
		put, err := s.Put(ctx(t), path, blob)
		if err != nil {
			t.Fatalf("put %q: %v", path, err)
		}
		// No step ran, so no exit code: the file was written, or the answer would say.
		if put.Output.ExitCode != nil || len(put.Output.Steps) != 0 || put.Output.TimedOut || put.Record.Session == nil {
			t.Errorf("put %q: %+v", path, put.Output)
		}
		art, got, err := s.Get(ctx(t), path)
		if err != nil {
			t.Fatalf("get %q: %v", path, err)
		}
		if !art.Found || art.Truncated || art.Size != uint64(len(blob)) || !bytes.Equal(art.Content, blob) || art.Path != path {
			t.Errorf("get %q: %+v", path, art)
		}
		if got.Record.Session.Sequence != put.Record.Session.Sequence+1 || got.Record.Session.PreviousRecordSHA256 != put.Record.RecordSHA256 {
			t.Errorf("get %q is not the call after the put: %+v", path, got.Record.Session)
		}
	}
	// What a cell sees is what was put.
	res := cell(t, s, "import hashlib\nprint(hashlib.sha256(open('/work/data/blob.bin', 'rb').read()).hexdigest())")
	want := fmt.Sprintf("%x\n", sha256.Sum256(blob))
	if res.Output.Stdout.String() != want {
		t.Errorf("the sandbox holds %q, want %q", res.Output.Stdout, want)
	}
	// And what a cell writes is what is read, empty files included.
	cell(t, s, "open('/work/empty', 'wb').close()")
	art, _, err := s.Get(ctx(t), "empty")
	if err != nil || !art.Found || art.Size != 0 || len(art.Content) != 0 {
		t.Errorf("an empty file: %+v, %v", art, err)
	}
	art, _, err = s.Get(ctx(t), "missing.bin")
	if err != nil || art.Found || len(art.Content) != 0 {
		t.Errorf("a missing file: %+v, %v", art, err)
	}
	// A path out of /work is refused here, unsent.
	for _, bad := range []string{"a/../../etc/x", "/etc/passwd", ""} {
		_, err := s.Put(ctx(t), bad, []byte("x"))
		var nd *sandbox.NotDispatchedError
		if !errors.As(err, &nd) || nd.Reason != sandbox.ReasonRequest || nd.Status != 0 {
			t.Errorf("put %q: %v", bad, err)
		}
		if _, _, err := s.Get(ctx(t), bad); !errors.As(err, &nd) || nd.Status != 0 {
			t.Errorf("get %q: %v", bad, err)
		}
	}
}

func TestStreamingDeliversTheFirstChunkBeforeTheCellEnds(t *testing.T) {
	s := open(t, sessionClient(t), sandbox.Python)
	var chunks []sandbox.Chunk
	var firstAt time.Time
	res, err := s.Cell(ctx(t), "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')", sandbox.CellOptions{
		OnChunk: func(c sandbox.Chunk) {
			if firstAt.IsZero() {
				firstAt = time.Now()
			}
			chunks = append(chunks, c)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	answeredAt := time.Now()
	if len(chunks) == 0 {
		t.Fatal("no chunk came")
	}
	if c := chunks[0]; c.Stream != sandbox.Stdout || c.Offset != 0 || c.Bytes.String() != "first\n" {
		t.Errorf("first chunk %+v", c)
	}
	// The cell sleeps 1.5 s between its two lines: the first came while it slept.
	if gap := answeredAt.Sub(firstAt); gap < time.Second {
		t.Errorf("the first chunk came only %s before the answer", gap)
	}
	var streamed []byte
	for _, c := range chunks {
		if c.Stream == sandbox.Stdout {
			if c.Offset != uint64(len(streamed)) {
				t.Errorf("chunk at offset %d after %d bytes", c.Offset, len(streamed))
			}
			streamed = append(streamed, c.Bytes...)
		}
	}
	if string(streamed) != "first\nsecond\n" || res.Output.Stdout.String() != "first\nsecond\n" {
		t.Errorf("streamed %q, result %q", streamed, res.Output.Stdout)
	}
	if res.Record.Session == nil || res.Record.Session.Sequence != 1 {
		t.Errorf("the streamed answer's link: %+v", res.Record.Session)
	}
	// Steps stream too, both streams, and the next call follows the streamed one.
	var steps []sandbox.Chunk
	res, err = s.Steps(ctx(t), []string{"echo out; echo err >&2", "echo more"}, sandbox.StepsOptions{OnChunk: func(c sandbox.Chunk) { steps = append(steps, c) }})
	if err != nil {
		t.Fatal(err)
	}
	var out, errs []byte
	for _, c := range steps {
		if c.Stream == sandbox.Stdout {
			out = append(out, c.Bytes...)
		} else {
			errs = append(errs, c.Bytes...)
		}
	}
	if string(out) != "out\nmore\n" || string(errs) != "err\n" || res.Record.Session.Sequence != 2 {
		t.Errorf("streamed steps: %q %q, sequence %d", out, errs, res.Record.Session.Sequence)
	}
	// A streamed refusal (its status 200, its last line the error) is read as any other.
	if _, err := s.Close(ctx(t)); err != nil {
		t.Fatal(err)
	}
	_, err = s.Cell(ctx(t), "print(1)", sandbox.CellOptions{OnChunk: func(sandbox.Chunk) { t.Error("a chunk from a closed session") }})
	var nd *sandbox.NotDispatchedError
	if !errors.As(err, &nd) || nd.Code != "session_ended" || nd.EndReason != sandbox.EndClosed || nd.Status != http.StatusOK || !errors.Is(err, sandbox.ErrSessionEnded) {
		t.Errorf("a streamed cell after close: %#v", err)
	}
}

func TestACallAfterCloseIsSessionEndedClosed(t *testing.T) {
	s := open(t, sessionClient(t), sandbox.JavaScript)
	cell(t, s, "var kept = 1")
	closed, err := s.Close(ctx(t))
	if err != nil || closed.EndReason != sandbox.EndClosed {
		t.Fatalf("close: %+v, %v", closed, err)
	}
	if s.Info().EndReason != sandbox.EndClosed {
		t.Errorf("the session's info says %q", s.Info().EndReason)
	}
	check := func(what string, err error) {
		t.Helper()
		var nd *sandbox.NotDispatchedError
		if !errors.As(err, &nd) || nd.Code != "session_ended" || nd.EndReason != sandbox.EndClosed || nd.Reason != sandbox.ReasonRequest || nd.Status != http.StatusGone {
			t.Errorf("%s after close: %#v", what, err)
			return
		}
		if !errors.Is(err, sandbox.ErrSessionEnded) || !errors.Is(err, sandbox.ErrNotDispatched) || errors.Is(err, sandbox.ErrMayHaveRun) {
			t.Errorf("%s after close: errors.Is: %v", what, err)
		}
		if !strings.Contains(err.Error(), "closed") {
			t.Errorf("%s after close: message %v", what, err)
		}
	}
	_, err = s.Cell(ctx(t), "console.log(kept)", sandbox.CellOptions{})
	check("a cell", err)
	_, err = s.Steps(ctx(t), []string{"true"}, sandbox.StepsOptions{})
	check("steps", err)
	_, err = s.Put(ctx(t), "f", []byte("x"))
	check("a put", err)
	_, _, err = s.Get(ctx(t), "f")
	check("a get", err)
	_, err = s.Close(ctx(t))
	check("a second close", err)
	_, err = s.Refresh(ctx(t))
	var se *sandbox.SessionError
	if !errors.As(err, &se) || !errors.Is(err, sandbox.ErrSessionEnded) || se.EndReason != sandbox.EndClosed {
		t.Errorf("a refresh after close: %v", err)
	}
	_, err = sessionClient(t).ResumeSession(ctx(t), s.ID())
	if !errors.Is(err, sandbox.ErrSessionEnded) {
		t.Errorf("resuming a closed session: %v", err)
	}
}

// tokenSwap is a proxy that relays everything to the daemon, with another caller's token
// once swap is set.
func tokenSwap(t *testing.T, d *testdaemon.Daemon, other string) (*sandbox.Client, *atomic.Bool) {
	swap := new(atomic.Bool)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		token := ""
		if swap.Load() {
			token = other
		}
		reply(w, relay(t, d.URL, r, body, token))
	}))
	t.Cleanup(proxy.Close)
	return sandbox.New(proxy.URL, d.Token), swap
}

func TestAnotherCallersSessionIsNotFound(t *testing.T) {
	d := sessionDaemon(t)
	other := d.Tokens[otherCaller]
	c, swap := tokenSwap(t, d, other)
	mine := open(t, c, sandbox.Python)
	cell(t, mine, "x = 'mine'")
	theirs := open(t, sandbox.New(d.URL, other), sandbox.Python)
	cell(t, theirs, "x = 'theirs'")

	// Another caller sees nothing of it: not in its list, not found by id.
	list, err := sandbox.New(d.URL, other).ListSessions(ctx(t))
	if err != nil || len(list.Sessions) != 1 || list.Sessions[0].SessionID != theirs.ID() {
		t.Errorf("the other caller's list: %+v, %v", list, err)
	}
	_, err = sandbox.New(d.URL, other).ResumeSession(ctx(t), mine.ID())
	var se *sandbox.SessionError
	if !errors.As(err, &se) || se.Status != http.StatusNotFound || !errors.Is(err, sandbox.ErrSessionNotFound) {
		t.Errorf("the other caller resuming mine: %v", err)
	}
	// Calls of this session made with the other caller's token: refused, nothing ran, as
	// for an unknown id.
	swap.Store(true)
	check := func(what string, status int, err error) {
		t.Helper()
		var nd *sandbox.NotDispatchedError
		if !errors.As(err, &nd) || nd.Code != "session_not_found" || nd.Status != status || nd.Reason != sandbox.ReasonRequest || !errors.Is(err, sandbox.ErrSessionNotFound) {
			t.Errorf("%s with another caller's token: %#v", what, err)
		}
	}
	_, err = mine.Cell(ctx(t), "print(x)", sandbox.CellOptions{})
	check("a cell", http.StatusNotFound, err)
	// Streamed, the refusal is the stream's last line, under status 200.
	_, err = mine.Cell(ctx(t), "print(x)", sandbox.CellOptions{OnChunk: func(sandbox.Chunk) {}})
	check("a streamed cell", http.StatusOK, err)
	_, err = mine.Put(ctx(t), "f", []byte("x"))
	check("a put", http.StatusNotFound, err)
	_, _, err = mine.Get(ctx(t), "f")
	check("a get", http.StatusNotFound, err)
	_, err = mine.Close(ctx(t))
	check("a close", http.StatusNotFound, err)
	swap.Store(false)
	// The session was untouched: its chain goes on where it stood.
	res := cell(t, mine, "print(x)")
	if res.Output.Stdout.String() != "mine\n" || res.Record.Session.Sequence != 2 {
		t.Errorf("after the refusals: %q, sequence %d", res.Output.Stdout, res.Record.Session.Sequence)
	}
	// An id this daemon never gave.
	unknown := mine.ID()[:21] + strings.Repeat("0", 32)
	if _, err := c.ResumeSession(ctx(t), unknown); !errors.Is(err, sandbox.ErrSessionNotFound) {
		t.Errorf("an unknown id: %v", err)
	}
	if _, err := c.ResumeSession(ctx(t), "ses_../../v1/runs"); !errors.As(err, &se) || se.Code != "request" || se.Status != 0 {
		t.Errorf("not a session id: %v", err)
	}
}

// A session resumed by id goes on from where the daemon says its chain stands; the Session
// that did not see those calls then finds a call missing from its chain.
func TestAResumedSessionFollowsTheChainAndTheOtherHandleCatchesTheGap(t *testing.T) {
	c := sessionClient(t)
	s := open(t, c, sandbox.Python)
	first := cell(t, s, "n = 41")
	resumed, err := c.ResumeSession(ctx(t), s.ID())
	if err != nil {
		t.Fatal(err)
	}
	if info := resumed.Info(); info.Calls != 1 || info.LastRecordSHA256 != first.Record.RecordSHA256 {
		t.Fatalf("resumed at %+v", info)
	}
	res := cell(t, resumed, "n += 1\nprint(n)")
	if res.Output.Stdout.String() != "42\n" || res.Record.Session.Sequence != 2 || res.Record.Session.PreviousRecordSHA256 != first.Record.RecordSHA256 {
		t.Errorf("the resumed session's call: %q %+v", res.Output.Stdout, res.Record.Session)
	}
	_, err = s.Cell(ctx(t), "print(n)", sandbox.CellOptions{})
	var cm *sandbox.ChainMismatchError
	if !errors.As(err, &cm) || cm.Field != "sequence" || cm.Want != "2" || cm.Got != "3" || cm.SessionID != s.ID() {
		t.Fatalf("the stale handle: %v", err)
	}
	if !errors.Is(err, sandbox.ErrChainMismatch) || !errors.Is(err, sandbox.ErrMayHaveRun) {
		t.Errorf("errors.Is: %v", err)
	}
	if _, ok := sandbox.NotDispatchedReason(err); ok {
		t.Error("a chain mismatch reads not dispatched")
	}
	// That call ran: the stale handle sends nothing more until it resyncs.
	if _, err := s.Steps(ctx(t), []string{"true"}, sandbox.StepsOptions{}); !errors.Is(err, sandbox.ErrChainInDoubt) {
		t.Errorf("after the gap: %v", err)
	}
	if info, err := s.Resync(ctx(t)); err != nil || info.Calls != 3 {
		t.Fatalf("resync: %+v, %v", info, err)
	}
	if res := cell(t, s, "print(n)"); res.Output.Stdout.String() != "42\n" || res.Record.Session.Sequence != 4 {
		t.Errorf("after the resync: %q, sequence %d", res.Output.Stdout, res.Record.Session.Sequence)
	}
}

// ---------------------------------------------------------------------------------------
// Proxies in front of the sessions daemon.

// relayed is an answer as the daemon gave it.
type relayed struct {
	status      int
	contentType string
	body        []byte
}

// relayClient opens a connection per request and keeps none: kept-alive connections would
// pile up against the daemon's limit of connections per peer.
var relayClient = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}

// relay forwards one request to the daemon as it came (method, path and query, the headers
// a client sends, the body), with token instead of the caller's when one is given.
func relay(t *testing.T, upstream string, r *http.Request, body []byte, token string) relayed {
	req, err := http.NewRequest(r.Method, upstream+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return relayed{status: 502}
	}
	for _, h := range []string{"Authorization", "Content-Type", "Accept", "plimsoll-request-id"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := relayClient.Do(req)
	if err != nil {
		t.Error(err)
		return relayed{status: 502}
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	return relayed{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: answer}
}

func reply(w http.ResponseWriter, a relayed) {
	if a.contentType != "" {
		w.Header().Set("Content-Type", a.contentType)
	}
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

// rewriteAnswer applies f to the run response in an answer, whole or streamed.
func rewriteAnswer(t *testing.T, a relayed, f func(map[string]any)) relayed {
	if !strings.HasPrefix(a.contentType, "application/x-ndjson") {
		v := decode(t, a.body)
		f(v)
		a.body = encode(t, v)
		return a
	}
	lines := bytes.Split(bytes.TrimSuffix(a.body, []byte("\n")), []byte("\n"))
	for i, line := range lines {
		v := decode(t, line)
		if resp, ok := v["response"].(map[string]any); ok {
			f(resp)
			lines[i] = encode(t, v)
		}
	}
	a.body = append(bytes.Join(lines, []byte("\n")), '\n')
	return a
}

// isCall reports whether r is a call of a session (a cell, steps or a file).
func isCall(r *http.Request) bool {
	return strings.Contains(r.URL.Path, "/cells") || strings.Contains(r.URL.Path, "/steps") || strings.Contains(r.URL.Path, "/files/")
}

// callProxy relays everything to the sessions daemon and hands the answer to each session
// call, with the call's number (1 for the first call through it) and its request id, to
// rewrite.
func callProxy(t *testing.T, rewrite func(n int, id string, a relayed) relayed) *sandbox.Client {
	d := sessionDaemon(t)
	var mu sync.Mutex
	calls := 0
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		a := relay(t, d.URL, r, body, "")
		if isCall(r) {
			mu.Lock()
			calls++
			n := calls
			mu.Unlock()
			id := r.Header.Get("plimsoll-request-id")
			if id == "" {
				id, _ = decode(t, body)["request_id"].(string)
			}
			a = rewrite(n, id, a)
		}
		reply(w, a)
	}))
	t.Cleanup(proxy.Close)
	return sandbox.New(proxy.URL, d.Token)
}

// streamed is the CellOptions of a cell with or without streaming.
func streamed(on bool) sandbox.CellOptions {
	if on {
		return sandbox.CellOptions{OnChunk: func(sandbox.Chunk) {}}
	}
	return sandbox.CellOptions{}
}

func TestAProxyThatAltersACallsAnswerIsCaught(t *testing.T) {
	for _, stream := range []bool{false, true} {
		c := callProxy(t, func(n int, id string, a relayed) relayed {
			if n != 2 {
				return a
			}
			return rewriteAnswer(t, a, func(v map[string]any) {
				result := member(v, "result")
				if result["stdout"] != "42\n" {
					t.Errorf("stdout was %v", result["stdout"])
				}
				result["stdout"] = "43\n"
			})
		})
		s := open(t, c, sandbox.Python)
		cell(t, s, "n = 42")
		_, err := s.Cell(ctx(t), "print(n)", streamed(stream))
		var dm *sandbox.DigestMismatchError
		if !errors.As(err, &dm) || dm.Which != sandbox.DigestResult || !errors.Is(err, sandbox.ErrMayHaveRun) {
			t.Fatalf("stream %v: want a result digest mismatch, got %v", stream, err)
		}
		if _, ok := sandbox.NotDispatchedReason(err); ok {
			t.Errorf("stream %v: reads not dispatched", stream)
		}
		closeQuietly(s)
	}
}

func TestAProxyThatReplaysAnEarlierAnswerForALaterCallIsCaught(t *testing.T) {
	for _, tc := range []struct {
		stream, redress bool
	}{{false, false}, {true, false}, {false, true}, {true, true}} {
		var first relayed
		c := callProxy(t, func(n int, id string, a relayed) relayed {
			switch n {
			case 1:
				first = a
			case 2:
				if !tc.redress {
					return first
				}
				// Re-dressed: the earlier answer under this call's id, its record digest
				// recomputed.
				return rewriteAnswer(t, first, func(v map[string]any) {
					v["request_id"] = id
					record := member(v, "record")
					record["request_id"] = id
					resign(t, record)
				})
			}
			return a
		})
		s := open(t, c, sandbox.Python)
		opts := streamed(tc.stream)
		if _, err := s.Cell(ctx(t), "print('same')", opts); err != nil {
			t.Fatal(err)
		}
		// The same code again: the replayed answer is a true answer to the same request,
		// with the first call's place in the chain.
		_, err := s.Cell(ctx(t), "print('same')", opts)
		var mh *sandbox.MayHaveRunError
		var cm *sandbox.ChainMismatchError
		switch {
		case !tc.redress && (!errors.As(err, &mh) || mh.Code != "request_id_mismatch"):
			t.Fatalf("%+v: want a request id mismatch, got %v", tc, err)
		case tc.redress && (!errors.As(err, &cm) || cm.Field != "sequence" || cm.Want != "2" || cm.Got != "1"):
			t.Fatalf("%+v: want a chain mismatch on the sequence, got %v", tc, err)
		}
		if _, ok := sandbox.NotDispatchedReason(err); ok || !errors.Is(err, sandbox.ErrMayHaveRun) {
			t.Errorf("%+v: reads not dispatched: %v", tc, err)
		}
		closeQuietly(s)
	}
}

// The record's link (or what the chain fixes) rewritten and the record digest recomputed:
// only the chain check catches it.
func TestAProxyThatRewritesTheChainIsCaught(t *testing.T) {
	var mu sync.Mutex
	var rewrite func(record map[string]any)
	setRewrite := func(f func(record map[string]any)) {
		mu.Lock()
		defer mu.Unlock()
		rewrite = f
	}
	c := callProxy(t, func(n int, id string, a relayed) relayed {
		mu.Lock()
		f := rewrite
		mu.Unlock()
		if f == nil || a.status != http.StatusOK {
			return a
		}
		return rewriteAnswer(t, a, func(v map[string]any) {
			record := member(v, "record")
			f(record)
			resign(t, record)
		})
	})
	s := open(t, c, sandbox.Python)
	cell(t, s, "n = 1")
	for _, tc := range []struct {
		field  string
		change func(record map[string]any)
	}{
		{"session", func(record map[string]any) { delete(record, "session") }},
		{"session_id", func(record map[string]any) {
			link := record["session"].(map[string]any)
			link["session_id"] = link["session_id"].(string)[:21] + strings.Repeat("f", 32)
		}},
		{"sequence", func(record map[string]any) { record["session"].(map[string]any)["sequence"] = json.Number("7") }},
		{"previous_record_sha256", func(record map[string]any) {
			record["session"].(map[string]any)["previous_record_sha256"] = strings.Repeat("0", 64)
		}},
		{"evidence_sha256", func(record map[string]any) { record["evidence_sha256"] = strings.Repeat("e", 64) }},
		{"environment", func(record map[string]any) { record["environment"] = "sha256:" + strings.Repeat("1", 64) }},
	} {
		setRewrite(tc.change)
		_, err := s.Cell(ctx(t), "n += 1", sandbox.CellOptions{})
		setRewrite(nil)
		var cm *sandbox.ChainMismatchError
		if !errors.As(err, &cm) || cm.Field != tc.field || !errors.Is(err, sandbox.ErrMayHaveRun) {
			t.Fatalf("%s: want a chain mismatch on it, got %v", tc.field, err)
		}
		// The call did run at the daemon, so where the chain stands is in doubt here:
		// nothing more is sent until a resync takes the daemon's word for it.
		if !errors.Is(s.Doubt(), sandbox.ErrChainMismatch) {
			t.Errorf("%s: the doubt is %v", tc.field, s.Doubt())
		}
		_, err = s.Cell(ctx(t), "n += 1", sandbox.CellOptions{})
		var nd *sandbox.NotDispatchedError
		if !errors.As(err, &nd) || nd.Code != "chain_in_doubt" || nd.Status != 0 || !errors.Is(err, sandbox.ErrChainInDoubt) {
			t.Fatalf("%s: the call after: %v", tc.field, err)
		}
		if _, _, err := s.Get(ctx(t), "f"); !errors.Is(err, sandbox.ErrChainInDoubt) {
			t.Fatalf("%s: a get after: %v", tc.field, err)
		}
		info, err := s.Resync(ctx(t))
		if err != nil || s.Doubt() != nil {
			t.Fatalf("%s: resync: %v", tc.field, err)
		}
		if info.Calls != s.Info().Calls || info.LastRecordSHA256 == "" {
			t.Errorf("%s: resynced at %+v", tc.field, info)
		}
	}
	// Each rewritten call ran once; none of the refused ones did.
	if res := cell(t, s, "print(n)"); res.Output.Stdout.String() != "7\n" {
		t.Errorf("after the rewrites: %q", res.Output.Stdout)
	}
}

// A proxy that slips a call of its own into the session (with the caller's token) between
// two of the client's: the client's next answer is not the next link of its chain.
func TestAProxyThatSlipsInACallIsCaught(t *testing.T) {
	d := sessionDaemon(t)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.HasSuffix(r.URL.Path, "/cells") && bytes.Contains(body, []byte("second")) {
			slipped := []byte(fmt.Sprintf(`{"protocol":1,"request_id":%q,"run":{"kind":"snippet","language":"python","code":"x = 'slipped in'"}}`, sandbox.NewRequestID()))
			if a := relay(t, d.URL, r, slipped, ""); a.status != http.StatusOK {
				t.Errorf("the slipped call: %d %s", a.status, a.body)
			}
		}
		reply(w, relay(t, d.URL, r, body, ""))
	}))
	t.Cleanup(proxy.Close)
	s := open(t, sandbox.New(proxy.URL, d.Token), sandbox.Python)
	first := cell(t, s, "x = 'first'")
	_, err := s.Cell(ctx(t), "print('second', x)", sandbox.CellOptions{})
	var cm *sandbox.ChainMismatchError
	if !errors.As(err, &cm) || cm.Field != "sequence" || cm.Want != "2" || cm.Got != "3" {
		t.Fatalf("want a chain mismatch on the sequence, got %v", err)
	}
	if s.Info().LastRecordSHA256 != first.Record.RecordSHA256 {
		t.Error("the chain moved on an answer that failed its check")
	}
	if _, err := s.Resync(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if res := cell(t, s, "print(x)"); res.Output.Stdout.String() != "slipped in\n" || res.Record.Session.Sequence != 4 {
		t.Errorf("after the resync: %q, sequence %d", res.Output.Stdout, res.Record.Session.Sequence)
	}
}

// A refusal of a session call echoing another id is not believed, end reason or not.
func TestASessionRefusalWhoseEchoIsRewrittenIsNotHonoured(t *testing.T) {
	c := callProxy(t, func(n int, id string, a relayed) relayed {
		if a.status == http.StatusOK {
			return a
		}
		v := decode(t, a.body)
		v["request_id"] = "another-id"
		a.body = encode(t, v)
		return a
	})
	s := open(t, c, sandbox.Python)
	if _, err := s.Close(ctx(t)); err != nil {
		t.Fatal(err)
	}
	_, err := s.Cell(ctx(t), "print(1)", sandbox.CellOptions{})
	var mh *sandbox.MayHaveRunError
	if !errors.As(err, &mh) || mh.Code != "unverified_refusal" || mh.EndReason != sandbox.EndClosed || errors.Is(err, sandbox.ErrSessionEnded) {
		t.Fatalf("%v", err)
	}
	if _, ok := sandbox.NotDispatchedReason(err); ok {
		t.Error("reads not dispatched")
	}
}
