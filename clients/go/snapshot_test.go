// Snapshots and forks of sessions against a real plimsolld offering runsc (the one provider
// here whose sessions can be snapshotted): a Python session holding `x = 41` snapshotted and
// going on, a session restored from the snapshot, a fork into 4 copies each printing 42 and
// a random number of its own, every call verified as the next link of its chain; then the
// refusals: another caller's or an unknown snapshot, a JavaScript session's, the limits. And
// sessions that outlive a daemon restart: saved on SIGTERM, restored by the next daemon under
// their ids, their chains going on across the restore.

package sandbox_test

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"plimsoll/clients/go/sandbox"
	"plimsoll/clients/go/sandbox/internal/testdaemon"
)

var snapshotShared struct {
	once sync.Once
	d    *testdaemon.Daemon
	err  error
}

// snapshotDaemon is the suite's plimsolld for snapshots, started on first use: runsc alone,
// no warm pools, room for a session, a restored one and a fork of 4 open at once, two callers.
func snapshotDaemon(t *testing.T) *testdaemon.Daemon {
	t.Helper()
	if why := testdaemon.Missing(); why != "" {
		testdaemon.SkipOrFail(t, why)
	}
	snapshotShared.once.Do(func() {
		start := time.Now()
		snapshotShared.d, snapshotShared.err = testdaemon.Start(testdaemon.Options{
			Providers: []string{"runsc"},
			// Each open session holds a run slot for its life: 8 sessions, and room for more.
			MaxConcurrent: 10,
			Extra:         "\n[pools]\n\n[sessions]\nmax_total = 8\nmax_per_caller = 8\n",
			Callers:       []string{otherCaller},
		})
		if snapshotShared.err == nil {
			fmt.Fprintf(os.Stderr, "plimsolld (snapshots, runsc) started and probed in %s: %s\n", time.Since(start).Round(time.Millisecond), snapshotShared.d.URL)
		}
	})
	if snapshotShared.err != nil {
		t.Fatalf("cannot start plimsolld: %v", snapshotShared.err)
	}
	needProvider(t, sandbox.New(snapshotShared.d.URL, snapshotShared.d.Token), "runsc")
	return snapshotShared.d
}

// openAt opens a session of language at provider and closes it when the test ends.
func openAt(t *testing.T, c *sandbox.Client, language sandbox.Language, provider string) *sandbox.Session {
	t.Helper()
	s, err := c.OpenSession(ctx(t), sandbox.SessionOptions{Language: language, Provider: provider})
	if err != nil {
		t.Fatalf("open a %s session at %s: %v", language, provider, err)
	}
	t.Cleanup(func() { closeQuietly(s) })
	return s
}

// refusedAs checks that err is the daemon's refusal (our request id echoed, nothing done)
// with this reason, code and HTTP status.
func refusedAs(t *testing.T, what string, err error, reason sandbox.Reason, code string, status int) *sandbox.NotDispatchedError {
	t.Helper()
	var nd *sandbox.NotDispatchedError
	if !errors.As(err, &nd) || nd.Reason != reason || nd.Code != code || nd.Status != status {
		t.Fatalf("%s: want a %d refusal (%s, %s), got %#v", what, status, reason, code, err)
	}
	if !errors.Is(err, sandbox.ErrNotDispatched) || !errors.Is(err, sandbox.ReasonError(reason)) || errors.Is(err, sandbox.ErrMayHaveRun) {
		t.Errorf("%s: errors.Is: %v", what, err)
	}
	return nd
}

// stdoutFields is a result's stdout split into words.
func stdoutFields(res *sandbox.Result) []string { return strings.Fields(res.Output.Stdout.String()) }

func TestASessionAtRunscIsSnapshottedRestoredAndForked(t *testing.T) {
	d := snapshotDaemon(t)
	c := sandbox.New(d.URL, d.Token)
	s := openAt(t, c, sandbox.Python, "runsc")
	if info := s.Info(); info.Origin != nil || info.Provider != "runsc" {
		t.Fatalf("opened %+v", info)
	}
	// A fork counts its copies against the session limits: 1 open + 8 is over 8, refused
	// before anything is taken.
	_, _, err := s.Fork(ctx(t), 8)
	refusedAs(t, "a fork over the session limits", err, sandbox.ReasonCapacity, "capacity", http.StatusTooManyRequests)
	r1 := cell(t, s, "import os, random\nx = 41\nprint(x)")

	// A snapshot: of this session's chain at call 1; the session goes on from it.
	snap, err := s.Snapshot(ctx(t))
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if snap.SessionID != s.ID() || snap.Calls != 1 || snap.LastRecordSHA256 != r1.Record.RecordSHA256 ||
		snap.Provider != "runsc" || snap.Language != sandbox.Python || snap.Bytes == 0 || len(snap.SHA256) != 64 ||
		len(snap.RequestID) != 32 || !strings.HasPrefix(snap.SnapshotID, "snp_") || snap.ExpiresUnixMS <= snap.CreatedUnixMS {
		t.Errorf("snapshot %+v", snap)
	}
	r2 := cell(t, s, "print(x + 1)")
	if got := r2.Output.Stdout.String(); got != "42\n" {
		t.Errorf("the session after its snapshot printed %q", got)
	}
	if link := r2.Record.Session; link.Sequence != 2 || link.PreviousRecordSHA256 != r1.Record.RecordSHA256 || link.Origin != nil {
		t.Errorf("the session's call after its snapshot links %+v", link)
	}

	// A digest that is not the snapshot's: refused, nothing restored.
	_, err = c.RestoreSession(ctx(t), snap.SnapshotID, sandbox.RestoreOptions{SHA256: strings.Repeat("0", 64)})
	refusedAs(t, "a restore naming another digest", err, sandbox.ReasonRequest, "request", http.StatusBadRequest)

	// A session restored from the snapshot: x is there, its chain goes on from call 1.
	restored, err := c.RestoreSession(ctx(t), snap.SnapshotID, sandbox.RestoreOptions{Snapshot: snap})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	t.Cleanup(func() { closeQuietly(restored) })
	info := restored.Info()
	want := sandbox.SessionOrigin{Start: sandbox.OriginRestored, SnapshotSHA256: snap.SHA256, ParentSessionID: s.ID(),
		ParentRecordSHA256: r1.Record.RecordSHA256, ParentCalls: 1}
	if info.Origin == nil || *info.Origin != want || restored.ID() == s.ID() || info.Calls != 1 || info.LastRecordSHA256 != r1.Record.RecordSHA256 {
		t.Fatalf("restored %+v, origin %v", info, info.Origin)
	}
	rr := cell(t, restored, "print(x + 1)")
	if got := rr.Output.Stdout.String(); got != "42\n" {
		t.Errorf("the restored session printed %q", got)
	}
	if link := rr.Record.Session; link.SessionID != restored.ID() || link.Sequence != 2 || link.PreviousRecordSHA256 != r1.Record.RecordSHA256 ||
		link.Origin == nil || *link.Origin != want {
		t.Errorf("the restored session's first call links %+v, origin %v", link, link.Origin)
	}

	// A fork into 4 after call 2: each copy has x and randomness of its own.
	fsnap, copies, err := s.Fork(ctx(t), 4)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	for _, copy := range copies {
		copy := copy
		t.Cleanup(func() { closeQuietly(copy) })
	}
	if len(copies) != 4 || fsnap.SessionID != s.ID() || fsnap.Calls != 2 || fsnap.LastRecordSHA256 != r2.Record.RecordSHA256 || fsnap.SnapshotID == snap.SnapshotID {
		t.Fatalf("fork: %d copies, snapshot %+v", len(copies), fsnap)
	}
	forked := sandbox.SessionOrigin{Start: sandbox.OriginForked, SnapshotSHA256: fsnap.SHA256, ParentSessionID: s.ID(),
		ParentRecordSHA256: r2.Record.RecordSHA256, ParentCalls: 2}
	probe := "print(x + 1, random.random())"
	randoms := map[string]bool{}
	for i, copy := range copies {
		info := copy.Info()
		if info.Origin == nil || *info.Origin != forked || info.Calls != 2 || info.LastRecordSHA256 != r2.Record.RecordSHA256 || copy.ID() == s.ID() {
			t.Fatalf("copy %d: %+v, origin %v", i, info, info.Origin)
		}
		res := cell(t, copy, probe)
		words := stdoutFields(res)
		if len(words) != 2 || words[0] != "42" {
			t.Fatalf("copy %d printed %q", i, res.Output.Stdout)
		}
		randoms[words[1]] = true
		if link := res.Record.Session; link.SessionID != copy.ID() || link.Sequence != 3 || link.PreviousRecordSHA256 != r2.Record.RecordSHA256 ||
			link.Origin == nil || *link.Origin != forked {
			t.Errorf("copy %d's first call links %+v, origin %v", i, link, link.Origin)
		}
		// Its next call hangs from its own first, the origin on it still.
		next := cell(t, copy, "print(x)")
		if link := next.Record.Session; link.Sequence != 4 || link.PreviousRecordSHA256 != res.Record.RecordSHA256 || link.Origin == nil || *link.Origin != forked {
			t.Errorf("copy %d's second call links %+v", i, link)
		}
	}
	// The parent, unchanged by the fork, goes on drawing from its own state.
	r3 := cell(t, s, probe)
	words := stdoutFields(r3)
	t.Logf("the copies' random.random(): %v; the parent's: %v", randoms, words)
	if len(randoms) != 4 {
		t.Errorf("the copies drew %d different random.random() values, not 4: %v", len(randoms), randoms)
	}
	if len(words) != 2 || words[0] != "42" || randoms[words[1]] {
		t.Errorf("the parent printed %q after the fork", r3.Output.Stdout)
	}
	if link := r3.Record.Session; link.Sequence != 3 || link.PreviousRecordSHA256 != r2.Record.RecordSHA256 || link.Origin != nil {
		t.Errorf("the parent's call after the fork links %+v", link)
	}
	// A handle resumed by id follows a copy's chain as its own.
	resumed, err := c.ResumeSession(ctx(t), copies[0].ID())
	if err != nil {
		t.Fatal(err)
	}
	if info := resumed.Info(); info.Origin == nil || *info.Origin != forked || info.Calls != 4 {
		t.Errorf("the copy resumed: %+v", info)
	}
	if res := cell(t, resumed, "print(x * 2)"); res.Output.Stdout.String() != "82\n" || res.Record.Session.Sequence != 5 {
		t.Errorf("the resumed copy: %q, sequence %d", res.Output.Stdout, res.Record.Session.Sequence)
	}

	// Both snapshots listed, oldest first.
	list, err := c.ListSnapshots(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, l := range list.Snapshots {
		if l.SessionID != s.ID() {
			t.Errorf("listed a snapshot of %s", l.SessionID)
		}
		ids = append(ids, l.SnapshotID)
	}
	if !reflect.DeepEqual(ids, []string{snap.SnapshotID, fsnap.SnapshotID}) {
		t.Errorf("listed %v, want %s then %s", ids, snap.SnapshotID, fsnap.SnapshotID)
	}

	// Another caller's snapshot is not found, as an unknown one is, with the same words.
	other := sandbox.New(d.URL, d.Tokens[otherCaller])
	unknown := snap.SnapshotID[:len("snp_0123456789abcdef_")] + strings.Repeat("0", 32)
	_, err = other.RestoreSession(ctx(t), snap.SnapshotID, sandbox.RestoreOptions{Snapshot: snap})
	theirs := refusedAs(t, "another caller's snapshot", err, sandbox.ReasonRequest, "snapshot_not_found", http.StatusNotFound)
	_, err = other.RestoreSession(ctx(t), unknown, sandbox.RestoreOptions{})
	nobodys := refusedAs(t, "an unknown snapshot", err, sandbox.ReasonRequest, "snapshot_not_found", http.StatusNotFound)
	if theirs.Message != nobodys.Message || !errors.Is(err, sandbox.ErrSnapshotNotFound) {
		t.Errorf("another caller's snapshot answered %q, an unknown one %q", theirs.Message, nobodys.Message)
	}
	_, err = other.DeleteSnapshot(ctx(t), snap.SnapshotID)
	refusedAs(t, "another caller deleting it", err, sandbox.ReasonRequest, "snapshot_not_found", http.StatusNotFound)
	if list, err := other.ListSnapshots(ctx(t)); err != nil || len(list.Snapshots) != 0 {
		t.Errorf("another caller's list: %+v, %v", list, err)
	}
	// Not a snapshot id: refused here, unsent.
	_, err = c.RestoreSession(ctx(t), "snp_../../v1/runs", sandbox.RestoreOptions{})
	refusedAs(t, "not a snapshot id", err, sandbox.ReasonRequest, "request", 0)

	// Deleted: gone from the list, and nothing opens from it.
	gone, err := c.DeleteSnapshot(ctx(t), snap.SnapshotID)
	if err != nil || gone.SnapshotID != snap.SnapshotID || gone.SHA256 != snap.SHA256 {
		t.Fatalf("delete: %+v, %v", gone, err)
	}
	_, err = c.RestoreSession(ctx(t), snap.SnapshotID, sandbox.RestoreOptions{Snapshot: snap})
	refusedAs(t, "a deleted snapshot", err, sandbox.ReasonRequest, "snapshot_not_found", http.StatusNotFound)
	if list, err := c.ListSnapshots(ctx(t)); err != nil || len(list.Snapshots) != 1 || list.Snapshots[0].SnapshotID != fsnap.SnapshotID {
		t.Errorf("after the delete: %+v, %v", list, err)
	}
	if _, err := c.DeleteSnapshot(ctx(t), fsnap.SnapshotID); err != nil {
		t.Errorf("delete the fork's snapshot: %v", err)
	}
}

// A JavaScript session cannot be snapshotted honestly (node's randomness cannot be re-seeded
// in a copy): refused, nothing taken, and the session goes on.
func TestAJavaScriptSessionsSnapshotIsRefused(t *testing.T) {
	d := snapshotDaemon(t)
	c := sandbox.New(d.URL, d.Token)
	js := openAt(t, c, sandbox.JavaScript, "runsc")
	cell(t, js, "var x = 41")
	_, err := js.Snapshot(ctx(t))
	nd := refusedAs(t, "a JavaScript snapshot", err, sandbox.ReasonUnsupported, "unsupported", http.StatusUnprocessableEntity)
	if !errors.Is(err, sandbox.ErrUnsupported) || nd.Message == "" {
		t.Errorf("a JavaScript snapshot: %v", err)
	}
	_, _, err = js.Fork(ctx(t), 2)
	refusedAs(t, "a JavaScript fork", err, sandbox.ReasonUnsupported, "unsupported", http.StatusUnprocessableEntity)
	// No copy: refused here, unsent; more than the daemon's max_fork (8): refused by it.
	_, _, err = js.Fork(ctx(t), 0)
	refusedAs(t, "a fork of 0", err, sandbox.ReasonRequest, "request", 0)
	_, _, err = js.Fork(ctx(t), 9)
	refusedAs(t, "a fork of 9", err, sandbox.ReasonRequest, "request", http.StatusBadRequest)
	res := cell(t, js, "console.log(x + 1)")
	if res.Output.Stdout.String() != "42\n" || res.Record.Session.Sequence != 2 || res.Record.Session.Origin != nil {
		t.Errorf("after the refusals: %q, %+v", res.Output.Stdout, res.Record.Session)
	}
	list, err := c.ListSnapshots(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range list.Snapshots {
		if l.SessionID == js.ID() {
			t.Errorf("a snapshot of the JavaScript session was kept: %+v", l)
		}
	}
}

// Two runsc sessions, each with a call before the daemon's SIGTERM; the same daemon started
// again restores both under their ids. One's next call is the first its client sees of the
// restore (the chain crosses it on the record's origin, then a Refresh takes the new
// sandbox's wall); the other is resynced first (the chain takes the restore from the
// daemon's show). Both go on with their state. The daemon is this test's own: it restarts.
func TestASessionOutlivesADaemonRestart(t *testing.T) {
	if why := testdaemon.Missing(); why != "" {
		testdaemon.SkipOrFail(t, why)
	}
	d, err := testdaemon.Start(testdaemon.Options{
		Providers:     []string{"runsc"},
		MaxConcurrent: 10,
		Extra:         "\n[pools]\n\n[sessions]\nmax_total = 8\nmax_per_caller = 8\n",
	})
	if err != nil {
		t.Fatalf("cannot start plimsolld: %v", err)
	}
	t.Cleanup(d.Stop)
	c := sandbox.New(d.URL, d.Token)
	needProvider(t, c, "runsc")
	s := openAt(t, c, sandbox.Python, "runsc")
	u := openAt(t, c, sandbox.Python, "runsc")
	r1 := cell(t, s, "x = 41")
	u1 := cell(t, u, "y = 6")
	if s.Info().Origin != nil || u.Info().Origin != nil {
		t.Fatalf("fresh sessions with an origin: %+v, %+v", s.Info(), u.Info())
	}

	status, err := d.Restart()
	if err != nil || !status.Success() {
		t.Fatalf("restart: %v (the stopped daemon: %v)\n%s", err, status, d.LogText())
	}

	r2 := cell(t, s, "print(x + 1)")
	if got := r2.Output.Stdout.String(); got != "42\n" {
		t.Errorf("after the restart the session printed %q", got)
	}
	link := r2.Record.Session
	want := sandbox.SessionOrigin{Start: sandbox.OriginRestored, SnapshotSHA256: link.Origin.SnapshotSHA256,
		ParentSessionID: s.ID(), ParentRecordSHA256: r1.Record.RecordSHA256, ParentCalls: 1}
	if link.Sequence != 2 || link.PreviousRecordSHA256 != r1.Record.RecordSHA256 || *link.Origin != want || len(want.SnapshotSHA256) != 64 {
		t.Fatalf("the first call after the restart links %+v, origin %v", link, link.Origin)
	}
	if o := s.Info().Origin; o == nil || *o != want {
		t.Errorf("the session's origin after the restore: %v", o)
	}
	info, err := s.Refresh(ctx(t))
	if err != nil || info.Origin == nil || *info.Origin != want || info.Calls != 2 {
		t.Fatalf("the daemon's show after the restore: %v, %+v", err, info)
	}
	r3 := cell(t, s, "print(x)")
	if got := r3.Output.Stdout.String(); got != "41\n" || r3.Record.Session.Sequence != 3 || *r3.Record.Session.Origin != want {
		t.Errorf("the next call: %q, %+v", got, r3.Record.Session)
	}

	shown, err := u.Resync(ctx(t))
	if err != nil {
		t.Fatalf("resync after the restart: %v", err)
	}
	if o := shown.Origin; o == nil || o.Start != sandbox.OriginRestored || o.ParentSessionID != u.ID() || o.ParentCalls != 1 ||
		o.ParentRecordSHA256 != u1.Record.RecordSHA256 {
		t.Fatalf("the resynced session's origin: %v", o)
	}
	u2 := cell(t, u, "print(y * 7)")
	if got := u2.Output.Stdout.String(); got != "42\n" || u2.Record.Session.Sequence != 2 || u2.Record.Session.PreviousRecordSHA256 != u1.Record.RecordSHA256 {
		t.Errorf("the resynced session's next call: %q, %+v", got, u2.Record.Session)
	}
}
