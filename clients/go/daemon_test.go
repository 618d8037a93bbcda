// The client against a real plimsolld (process and crun providers) that the suite starts,
// and against real HTTP proxies on loopback in front of it that swap, alter or downgrade
// what passes through them.

package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"plimsoll/clients/go/sandbox"
	"plimsoll/clients/go/sandbox/internal/testdaemon"
)

var shared struct {
	once sync.Once
	d    *testdaemon.Daemon
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.d != nil {
		shared.d.Stop()
	}
	if sessionShared.d != nil {
		sessionShared.d.Stop()
	}
	if snapshotShared.d != nil {
		snapshotShared.d.Stop()
	}
	os.Exit(code)
}

// daemon is the suite's plimsolld, started on first use (process and crun).
func daemon(t *testing.T) *testdaemon.Daemon {
	t.Helper()
	if why := testdaemon.Missing(); why != "" {
		testdaemon.SkipOrFail(t, why)
	}
	shared.once.Do(func() {
		start := time.Now()
		shared.d, shared.err = testdaemon.Start(testdaemon.Options{})
		if shared.err == nil {
			fmt.Fprintf(os.Stderr, "plimsolld started and probed in %s: %s\n", time.Since(start).Round(time.Millisecond), shared.d.URL)
		}
	})
	if shared.err != nil {
		t.Fatalf("cannot start plimsolld: %v", shared.err)
	}
	return shared.d
}

func client(t *testing.T, opts ...sandbox.Option) *sandbox.Client {
	d := daemon(t)
	return sandbox.New(d.URL, d.Token, opts...)
}

// needContainer skips (or fails, under CI=true) unless the crun provider is available.
func needContainer(t *testing.T, c *sandbox.Client) {
	t.Helper()
	needProvider(t, c, "crun")
}

// needProvider skips (or fails, under CI=true) unless the daemon's provider name is available.
func needProvider(t *testing.T, c *sandbox.Client, name string) {
	t.Helper()
	p, err := c.Providers(context.Background())
	if err != nil {
		t.Fatalf("providers: %v", err)
	}
	for _, info := range p.Providers {
		if info.Name == name {
			if !info.Available {
				why := name + " is not available"
				if info.UnavailableReason != nil {
					why += ": " + *info.UnavailableReason
				}
				testdaemon.SkipOrFail(t, why+" (the image comes from `make images`: "+testdaemon.Image()+")")
			}
			return
		}
	}
	t.Fatalf("the daemon lists no %s provider", name)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// caller holds a client in a field named Sandbox, as the announcement's `provider` does.
type caller struct {
	Sandbox *sandbox.Client
}

// The example of the project's announcement, as written.
func TestAnnouncementExample(t *testing.T) {
	provider := caller{Sandbox: client(t)}
	ctx := ctx(t)

	res, err := provider.Sandbox.RunJavaScript(ctx, sandbox.Request{
		Code:             "console.log(6 * 7)",
		MinimumIsolation: sandbox.IsolationVM, // ErrInsufficientIsolation means nothing ran
	})
	// res.Isolation reports the boundary that actually ran.

	// This host offers no vm tier: refused, nothing ran.
	if !errors.Is(err, sandbox.ErrInsufficientIsolation) {
		t.Fatalf("want ErrInsufficientIsolation, got %v", err)
	}
	if reason, ok := sandbox.NotDispatchedReason(err); !ok || reason != sandbox.ReasonIsolation {
		t.Fatalf("NotDispatchedReason = %q, %v; want isolation", reason, ok)
	}
	if !errors.Is(err, sandbox.ErrNotDispatched) || errors.Is(err, sandbox.ErrMayHaveRun) {
		t.Fatalf("a refusal must be not dispatched and not may-have-run: %v", err)
	}
	if res != nil {
		t.Fatalf("a refusal returned a result: %+v", res)
	}
	var nd *sandbox.NotDispatchedError
	if !errors.As(err, &nd) || nd.Status != http.StatusUnprocessableEntity || nd.Code != "isolation" {
		t.Fatalf("want a 422 isolation refusal, got %#v", err)
	}
	if !strings.HasPrefix(err.Error(), "not dispatched (isolation): ") {
		t.Errorf("message: %v", err)
	}

	needContainer(t, provider.Sandbox)
	res, err = provider.Sandbox.RunJavaScript(ctx, sandbox.Request{
		Code:             "console.log(6 * 7)",
		MinimumIsolation: sandbox.IsolationContainer, // ErrInsufficientIsolation means nothing ran
	})
	if err != nil {
		t.Fatalf("container run: %v", err)
	}
	if res.Isolation != sandbox.IsolationContainer || res.Provider != "crun" {
		t.Errorf("ran on %s (%s), want crun (container)", res.Provider, res.Isolation)
	}
	if got := res.Output.Stdout.String(); got != "42\n" {
		t.Errorf("stdout %q", got)
	}
	if res.Output.ExitCode == nil || *res.Output.ExitCode != 0 {
		t.Errorf("exit code %v", res.Output.ExitCode)
	}
}

func TestRunAtEachTierTheHostHas(t *testing.T) {
	c := client(t)
	ctx := ctx(t)
	res, err := c.RunJavaScript(ctx, sandbox.Request{Code: "console.log(6 * 7)", MinimumIsolation: sandbox.IsolationProcess})
	if err != nil {
		t.Fatalf("process run: %v", err)
	}
	if res.Isolation != sandbox.IsolationProcess || res.Provider != "process" || res.Output.Stdout.String() != "42\n" {
		t.Errorf("process run: %s %s %q", res.Provider, res.Isolation, res.Output.Stdout)
	}
	if len(res.RequestID) != 32 || res.Record.RequestID != res.RequestID {
		t.Errorf("request id %q (record %q): want 128-bit hex", res.RequestID, res.Record.RequestID)
	}
	if res.Record.MinimumIsolation != sandbox.IsolationProcess {
		t.Errorf("the record states the applied floor %q, not the one sent", res.Record.MinimumIsolation)
	}
	again, err := c.RunJavaScript(ctx, sandbox.Request{Code: "console.log(6 * 7)", MinimumIsolation: sandbox.IsolationProcess})
	if err != nil {
		t.Fatal(err)
	}
	if again.RequestID == res.RequestID {
		t.Error("two runs carried the same request id")
	}
	if again.RequestSHA256 != res.RequestSHA256 {
		t.Error("the same request gave another digest")
	}
	// A result also says how its sandbox started (warm or cold, a member's age) and its wall
	// (its uid), all inside the digest: the digests agree exactly when the results do.
	if again.Output.Stdout.String() != res.Output.Stdout.String() {
		t.Errorf("the same code said %q, then %q", res.Output.Stdout, again.Output.Stdout)
	}
	if (again.ResultSHA256 == res.ResultSHA256) != reflect.DeepEqual(again.Output, res.Output) {
		t.Errorf("result digests %s and %s disagree with the results:\n%+v\n%+v", res.ResultSHA256, again.ResultSHA256, res.Output, again.Output)
	}

	py, err := c.RunPython(ctx, sandbox.Request{Code: "import sys; print(6 * 7); sys.stderr.write('e\\n'); sys.exit(3)", MinimumIsolation: sandbox.IsolationProcess})
	if err != nil {
		t.Fatalf("python run: %v", err)
	}
	if py.Output.Stdout.String() != "42\n" || py.Output.Stderr.String() != "e\n" || py.Output.ExitCode == nil || *py.Output.ExitCode != 3 {
		t.Errorf("python: %q %q %v", py.Output.Stdout, py.Output.Stderr, py.Output.ExitCode)
	}

	needContainer(t, c)
	ct, err := c.RunPython(ctx, sandbox.Request{Code: "print(6 * 7)", MinimumIsolation: sandbox.IsolationContainer})
	if err != nil {
		t.Fatalf("container run: %v", err)
	}
	if ct.Isolation != sandbox.IsolationContainer || ct.Provider != "crun" || ct.Output.Stdout.String() != "42\n" {
		t.Errorf("container run: %s %s %q", ct.Provider, ct.Isolation, ct.Output.Stdout)
	}
	if !strings.HasPrefix(ct.Record.Environment, "sha256:") {
		t.Logf("container environment: %s", ct.Record.Environment)
	}
}

// With no floor sent, the result is checked against the daemon's default floor.
func TestNoFloorTakesTheDaemonsDefault(t *testing.T) {
	c := client(t)
	floor, err := c.DefaultFloor(ctx(t))
	if err != nil || floor != sandbox.IsolationContainer {
		t.Fatalf("default floor %q, %v", floor, err)
	}
	needContainer(t, c)
	res, err := c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log('default')"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Isolation.AtLeast(sandbox.IsolationContainer) {
		t.Errorf("ran at %s", res.Isolation)
	}
	// The record states the floor the daemon applied: its default, the one the client learnt.
	if res.Record.MinimumIsolation != sandbox.IsolationContainer {
		t.Errorf("the record states the applied floor %q, not the default floor", res.Record.MinimumIsolation)
	}
}

func TestProvidersListsTiersAndVerifiesEvidence(t *testing.T) {
	c := client(t)
	p, err := c.Providers(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if p.Protocol != 1 || p.DefaultFloor != sandbox.IsolationContainer {
		t.Errorf("protocol %d, default floor %s", p.Protocol, p.DefaultFloor)
	}
	names := map[string]sandbox.ProviderInfo{}
	for _, info := range p.Providers {
		names[info.Name] = info
		if len(info.EvidenceSHA256) != 64 || info.Evidence.Provider != info.Name {
			t.Errorf("%s: evidence %s for %s", info.Name, info.EvidenceSHA256, info.Evidence.Provider)
		}
	}
	if pr, ok := names["process"]; !ok || !pr.Available || pr.Isolation != sandbox.IsolationProcess {
		t.Errorf("process provider: %+v", pr)
	}
	if cr, ok := names["crun"]; !ok || cr.Isolation != sandbox.IsolationContainer {
		t.Errorf("crun provider: %+v", cr)
	}
	if !c.Ready(ctx(t)) {
		t.Error("the daemon is not ready")
	}
	// The record names the evidence of the provider that ran.
	res, err := c.RunJavaScript(ctx(t), sandbox.Request{Code: "1", MinimumIsolation: sandbox.IsolationProcess})
	if err != nil {
		t.Fatal(err)
	}
	if res.Record.EvidenceSHA256 != names["process"].EvidenceSHA256 {
		t.Errorf("record evidence %s, providers say %s", res.Record.EvidenceSHA256, names["process"].EvidenceSHA256)
	}
}

func TestProjectRoundTripsExactBytes(t *testing.T) {
	c := client(t)
	needContainer(t, c)
	blob := []byte{0x00, 0xff, 0xfe, 0x80, '\n', 'h', 'i', 0xc3, 0x28}
	script := "#!/bin/sh\nset -eu\nmkdir -p out\ncp data/blob.bin out/copy.bin\nprintf 'built\\n'\nprintf '\\377\\000' >&2\n"
	res, err := c.Run(ctx(t), sandbox.RunRequest{
		Run: sandbox.Project{
			Files: []sandbox.File{
				{Path: "build.sh", Content: []byte(script), Executable: true},
				{Path: "data/blob.bin", Content: blob},
				{Path: "héllo.txt", Content: []byte("héllo\n")},
			},
			Steps: []sandbox.Step{
				{Name: "build", Run: "./build.sh"},
				{Run: "cat héllo.txt && od -An -tx1 data/blob.bin | tr -d ' \\n'"},
			},
			Artifacts: []string{"out/copy.bin", "héllo.txt", "missing.txt"},
		},
		MinimumIsolation: sandbox.IsolationContainer,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Output.Steps) != 2 {
		t.Fatalf("steps: %+v", res.Output.Steps)
	}
	s0, s1 := res.Output.Steps[0], res.Output.Steps[1]
	if s0.Name == nil || *s0.Name != "build" || s1.Name != nil {
		t.Errorf("step names %v %v", s0.Name, s1.Name)
	}
	if s0.Stdout.String() != "built\n" || !bytes.Equal(s0.Stderr, []byte{0xff, 0x00}) {
		t.Errorf("step 0: %q %q", s0.Stdout, s0.Stderr)
	}
	if want := "héllo\n00fffe800a6869c328"; s1.Stdout.String() != want {
		t.Errorf("step 1 stdout %q, want %q", s1.Stdout, want)
	}
	arts := res.Output.Artifacts
	if len(arts) != 3 {
		t.Fatalf("artifacts: %+v", arts)
	}
	if a := arts[0]; a.Path != "out/copy.bin" || !a.Found || a.Size != uint64(len(blob)) || !bytes.Equal(a.Content, blob) || a.Truncated {
		t.Errorf("artifact 0: %+v", a)
	}
	if a := arts[1]; !a.Found || a.Content.String() != "héllo\n" {
		t.Errorf("artifact 1: %+v", a)
	}
	if a := arts[2]; a.Found || len(a.Content) != 0 || a.Size != 0 {
		t.Errorf("artifact 2: %+v", a)
	}
	if res.Output.ExitCode == nil || *res.Output.ExitCode != 0 {
		t.Errorf("exit %v", res.Output.ExitCode)
	}
}

func TestLimitsAreSentAndBreachesAreResults(t *testing.T) {
	c := client(t)
	res, err := c.RunJavaScript(ctx(t), sandbox.Request{
		Code:             "process.stdout.write('x'.repeat(5000)); while (true) {}",
		MinimumIsolation: sandbox.IsolationProcess,
		Limits:           &sandbox.Limits{TimeoutMS: 1500, OutputBytes: 100},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Output.TimedOut || !res.Output.StdoutTruncated || len(res.Output.Stdout) != 100 {
		t.Errorf("timed out %v, truncated %v, %d bytes", res.Output.TimedOut, res.Output.StdoutTruncated, len(res.Output.Stdout))
	}
	// Above the operator's maximum: refused, nothing ran.
	_, err = c.RunJavaScript(ctx(t), sandbox.Request{Code: "1", MinimumIsolation: sandbox.IsolationProcess,
		Limits: &sandbox.Limits{TimeoutMS: 1 << 40}})
	if reason, ok := sandbox.NotDispatchedReason(err); !ok || reason != sandbox.ReasonRequest || !errors.Is(err, sandbox.ErrInvalidRequest) {
		t.Errorf("a limit above the maximum: %v", err)
	}
}

func TestGrantsAndProvidersAreSent(t *testing.T) {
	c := client(t)
	// This daemon has no grants file: every grant is refused, before anything runs.
	_, err := c.Run(ctx(t), sandbox.RunRequest{Run: sandbox.Snippet{Language: sandbox.JavaScript, Code: "1"},
		MinimumIsolation: sandbox.IsolationProcess, Grant: "github-readonly"})
	if !errors.Is(err, sandbox.ErrPermissionDenied) {
		t.Errorf("a grant without a grants file: %v", err)
	}
	res, err := c.Run(ctx(t), sandbox.RunRequest{Run: &sandbox.Snippet{Language: sandbox.Python, Code: "print('p')"},
		MinimumIsolation: sandbox.IsolationProcess, Provider: "process"})
	if err != nil || res.Provider != "process" {
		t.Fatalf("named provider: %v", err)
	}
	_, err = c.Run(ctx(t), sandbox.RunRequest{Run: sandbox.Snippet{Language: sandbox.Python, Code: "1"}, Provider: "nowhere"})
	if reason, _ := sandbox.NotDispatchedReason(err); reason != sandbox.ReasonRequest {
		t.Errorf("an unknown provider: %v", err)
	}
	// The named provider is below the floor.
	_, err = c.Run(ctx(t), sandbox.RunRequest{Run: sandbox.Snippet{Language: sandbox.Python, Code: "1"},
		Provider: "process", MinimumIsolation: sandbox.IsolationContainer})
	if !errors.Is(err, sandbox.ErrInsufficientIsolation) {
		t.Errorf("a named provider below the floor: %v", err)
	}
	// A project on the process tier: no provider meeting the floor can run it.
	_, err = c.Run(ctx(t), sandbox.RunRequest{Run: sandbox.Project{Steps: []sandbox.Step{{Run: "true"}}},
		Provider: "process", MinimumIsolation: sandbox.IsolationProcess})
	if !errors.Is(err, sandbox.ErrUnsupported) {
		t.Errorf("a project on the process tier: %v", err)
	}
}

func TestABadTokenIsRefusedAndNeverPrinted(t *testing.T) {
	d := daemon(t)
	secret := "plm_not-a-valid-token-but-still-secret"
	c := sandbox.New(d.URL, secret)
	_, err := c.RunJavaScript(ctx(t), sandbox.Request{Code: "1", MinimumIsolation: sandbox.IsolationProcess})
	if !errors.Is(err, sandbox.ErrPermissionDenied) {
		t.Fatalf("bad token: %v", err)
	}
	_, perr := c.Providers(ctx(t))
	var pe *sandbox.ProvidersError
	if !errors.As(perr, &pe) || pe.Status != http.StatusUnauthorized {
		t.Errorf("providers with a bad token: %v", perr)
	}
	// No floor and a bad token: the default floor cannot be read, and nothing is sent.
	_, nofloor := c.RunJavaScript(ctx(t), sandbox.Request{Code: "1"})
	if reason, _ := sandbox.NotDispatchedReason(nofloor); reason != sandbox.ReasonPermission {
		t.Errorf("no floor, bad token: %v", nofloor)
	}
	good := sandbox.New(d.URL, d.Token)
	for _, text := range []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err), perr.Error(), nofloor.Error(),
		fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), fmt.Sprintf("%v %+v %#v", good, good, caller{good}), fmt.Sprintf("%+v %#v", caller{good}, caller{good})} {
		if strings.Contains(text, secret) || strings.Contains(text, d.Token) {
			t.Errorf("a token was printed: %s", text)
		}
	}
}

func TestARefusedConnectionIsNotDispatched(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	l.Close() // a port that was just free: the connect is refused
	c := sandbox.New(url, "t")
	_, err = c.RunJavaScript(ctx(t), sandbox.Request{Code: "1", MinimumIsolation: sandbox.IsolationProcess})
	if reason, ok := sandbox.NotDispatchedReason(err); !ok || reason != sandbox.ReasonEnvironment || !errors.Is(err, sandbox.ErrEnvironment) {
		t.Fatalf("connection refused: %v", err)
	}
	if c.Ready(ctx(t)) {
		t.Error("ready with nothing listening")
	}
}

func TestARequestOverTheBodyLimitIsRefusedHereAndNotSent(t *testing.T) {
	// A real listener that nothing should ever connect to.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if conn, err := l.Accept(); err == nil {
			conn.Close()
			accepted <- struct{}{}
		}
	}()
	url := "http://" + l.Addr().String()
	c := sandbox.New(url, "t")
	if c.MaxBodyBytes() != sandbox.DefaultMaxBodyBytes || sandbox.DefaultMaxBodyBytes != 8*1024*1024 {
		t.Fatalf("default limit %d", c.MaxBodyBytes())
	}
	for _, tc := range []struct {
		c    *sandbox.Client
		code string
	}{
		{c, "console.log('" + strings.Repeat("x", 9<<20) + "')"},
		{sandbox.New(url, "t", sandbox.WithMaxBodyBytes(4096)), "console.log('" + strings.Repeat("x", 5000) + "')"},
	} {
		_, err := tc.c.RunJavaScript(ctx(t), sandbox.Request{Code: tc.code, MinimumIsolation: sandbox.IsolationProcess})
		var tooLarge *sandbox.RequestTooLargeError
		if !errors.As(err, &tooLarge) || !errors.Is(err, sandbox.ErrRequestTooLarge) || tooLarge.Limit != tc.c.MaxBodyBytes() {
			t.Fatalf("want a RequestTooLargeError, got %v", err)
		}
		if reason, ok := sandbox.NotDispatchedReason(err); !ok || reason != sandbox.ReasonRequest || !errors.Is(err, sandbox.ErrInvalidRequest) {
			t.Errorf("over the limit: %v", err)
		}
		if !strings.Contains(err.Error(), "limit") {
			t.Errorf("message: %v", err)
		}
	}
	select {
	case <-accepted:
		t.Fatal("the client connected although the request was over its limit")
	case <-time.After(100 * time.Millisecond):
	}
}

// A daemon with a smaller body limit than the client knows: its 413 still echoes this
// request's id (the client sends request_id before run), so it reads "nothing ran".
func TestTheDaemons413EchoesOurIDSoItReadsNotDispatched(t *testing.T) {
	daemon(t) // root and the binary
	d, err := testdaemon.Start(testdaemon.Options{Providers: []string{"process"}, Daemon: "max_body_bytes = 4096"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	c := sandbox.New(d.URL, d.Token)
	_, err = c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log('" + strings.Repeat("x", 5000) + "')", MinimumIsolation: sandbox.IsolationProcess})
	var nd *sandbox.NotDispatchedError
	if !errors.As(err, &nd) || nd.Reason != sandbox.ReasonRequest || nd.Status != http.StatusRequestEntityTooLarge {
		t.Fatalf("want a 413 not dispatched (request), got %v", err)
	}
}

func TestAnInvalidRequestIsNotSent(t *testing.T) {
	c := sandbox.New("http://127.0.0.1:9", "t")
	for name, req := range map[string]sandbox.RunRequest{
		"blank code":     {Run: sandbox.Snippet{Language: sandbox.Python, Code: "  \n"}},
		"no run":         {},
		"nil snippet":    {Run: (*sandbox.Snippet)(nil)},
		"bad language":   {Run: sandbox.Snippet{Language: "ruby", Code: "1"}},
		"bad tier":       {Run: sandbox.Snippet{Language: sandbox.Python, Code: "1"}, MinimumIsolation: "gpu"},
		"no steps":       {Run: sandbox.Project{}},
		"blank step":     {Run: sandbox.Project{Steps: []sandbox.Step{{Run: " "}}}},
		"dotdot path":    {Run: sandbox.Project{Steps: []sandbox.Step{{Run: "true"}}, Files: []sandbox.File{{Path: "a/../b"}}}},
		"absolute path":  {Run: sandbox.Project{Steps: []sandbox.Step{{Run: "true"}}, Artifacts: []string{"/etc/passwd"}}},
		"duplicate file": {Run: sandbox.Project{Steps: []sandbox.Step{{Run: "true"}}, Files: []sandbox.File{{Path: "a"}, {Path: "a"}}}},
		"not utf-8 code": {Run: sandbox.Snippet{Language: sandbox.Python, Code: "print('\xff')"}},
	} {
		_, err := c.Run(context.Background(), req)
		if reason, ok := sandbox.NotDispatchedReason(err); !ok || reason != sandbox.ReasonRequest {
			t.Errorf("%s: %v", name, err)
		}
		var nd *sandbox.NotDispatchedError
		if errors.As(err, &nd) && (nd.Status != 0 || len(nd.RequestID) != 32) {
			t.Errorf("%s: status %d, id %q", name, nd.Status, nd.RequestID)
		}
	}
}

// ---------------------------------------------------------------------------------------
// Real HTTP proxies on loopback, in front of the real daemon.

// forward sends one request on to the daemon, passing the caller's authorization through.
func forward(t *testing.T, upstream string, r *http.Request, body []byte) (int, []byte) {
	req, err := http.NewRequest(r.Method, upstream+r.URL.Path, bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return 502, nil
	}
	req.Header.Set("Authorization", r.Header.Get("Authorization"))
	req.Header.Set("Content-Type", "application/json")
	resp, err := relayClient.Do(req)
	if err != nil {
		t.Error(err)
		return 502, nil
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, answer
}

func decode(t *testing.T, b []byte) map[string]any {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v map[string]any
	if err := dec.Decode(&v); err != nil {
		t.Errorf("not JSON: %v: %s", err, b)
	}
	return v
}

func encode(t *testing.T, v map[string]any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Error(err)
	}
	return b
}

// rewriting is a proxy that rewrites request bodies on the way in and answers to runs on the
// way out.
func rewriting(t *testing.T, request, response func(map[string]any)) *sandbox.Client {
	return proxying(t, http.MethodPost, request, response)
}

// proxying rewrites request bodies, and answers to requests of this method.
func proxying(t *testing.T, method string, request, response func(map[string]any)) *sandbox.Client {
	d := daemon(t)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if request != nil && len(body) > 0 {
			v := decode(t, body)
			request(v)
			body = encode(t, v)
		}
		status, answer := forward(t, d.URL, r, body)
		if response != nil && r.Method == method {
			v := decode(t, answer)
			response(v)
			answer = encode(t, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(answer)
	}))
	t.Cleanup(proxy.Close)
	return sandbox.New(proxy.URL, d.Token)
}

func member(v map[string]any, path ...string) map[string]any {
	for _, p := range path {
		v = v[p].(map[string]any)
	}
	return v
}

func TestAProxyThatSwapsAnswersCannotMakeARunReadNotDispatched(t *testing.T) {
	d := daemon(t)
	type answer struct {
		status int
		body   []byte
	}
	var mu sync.Mutex
	held := map[int]answer{}
	both := make(chan struct{})
	n := 0
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		me := n
		n++
		mu.Unlock()
		status, got := forward(t, d.URL, r, body)
		mu.Lock()
		held[me] = answer{status, got}
		if len(held) == 2 {
			close(both)
		}
		mu.Unlock()
		<-both
		mu.Lock()
		other := held[1-me]
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(other.status)
		_, _ = w.Write(other.body)
	}))
	defer proxy.Close()
	c := sandbox.New(proxy.URL, d.Token)
	var refusedErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Refused by the daemon (no vm tier here): nothing ran.
		_, refusedErr = c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log('refused')", MinimumIsolation: sandbox.IsolationVM})
	}()
	_, ranErr := c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log('ran')", MinimumIsolation: sandbox.IsolationProcess})
	<-done

	// The run that ran got the other's refusal: it must not read "nothing ran".
	if _, ok := sandbox.NotDispatchedReason(ranErr); ok || !errors.Is(ranErr, sandbox.ErrMayHaveRun) || errors.Is(ranErr, sandbox.ErrNotDispatched) {
		t.Fatalf("the run that ran: %v", ranErr)
	}
	var mh *sandbox.MayHaveRunError
	if !errors.As(ranErr, &mh) || mh.Code != "unverified_refusal" || mh.ClaimedReason != sandbox.ReasonIsolation {
		t.Errorf("the run that ran: %#v", ranErr)
	}
	if !strings.Contains(ranErr.Error(), "may have run") {
		t.Errorf("message: %v", ranErr)
	}
	// The refused one got the other's result: it must not take it as its own.
	if !errors.As(refusedErr, &mh) || mh.Code != "request_id_mismatch" {
		t.Errorf("the refused run: %v", refusedErr)
	}
	if _, ok := sandbox.NotDispatchedReason(refusedErr); ok {
		t.Errorf("the refused run reads not dispatched: %v", refusedErr)
	}
}

func TestAProxyThatChangesOneByteOfAResultIsCaught(t *testing.T) {
	c := rewriting(t, nil, func(v map[string]any) {
		result := member(v, "result")
		if result["stdout"] != "42\n" {
			t.Errorf("stdout was %v", result["stdout"])
		}
		result["stdout"] = "43\n"
	})
	_, err := c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log(6 * 7)", MinimumIsolation: sandbox.IsolationProcess})
	var dm *sandbox.DigestMismatchError
	if !errors.As(err, &dm) || dm.Which != sandbox.DigestResult || dm.Computed == dm.Claimed {
		t.Fatalf("want a result digest mismatch, got %v", err)
	}
	if !errors.Is(err, sandbox.ErrDigestMismatch) || !errors.Is(err, sandbox.ErrMayHaveRun) {
		t.Errorf("errors.Is: %v", err)
	}
	if _, ok := sandbox.NotDispatchedReason(err); ok {
		t.Error("a digest mismatch reads not dispatched")
	}
	if !strings.Contains(err.Error(), dm.Computed) || !strings.Contains(err.Error(), dm.Claimed) {
		t.Errorf("message: %v", err)
	}
}

// A tier rewritten to below the floor: caught by the tier check whether or not the proxy
// recomputes the record digest.
func TestAnAnswerClaimingATierBelowTheFloorIsAnEvidenceMismatch(t *testing.T) {
	c := client(t)
	needContainer(t, c)
	for _, recompute := range []bool{false, true} {
		recompute := recompute
		c := rewriting(t, nil, func(v map[string]any) {
			if v["isolation"] != "container" {
				t.Errorf("isolation was %v", v["isolation"])
			}
			v["isolation"] = "process"
			record := member(v, "record")
			record["isolation"] = "process"
			if recompute {
				var r sandbox.Record
				if err := json.Unmarshal(encode(t, record), &r); err != nil {
					t.Error(err)
				}
				record["record_sha256"] = sandbox.RecordSHA256(&r)
			}
		})
		_, err := c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log(1)", MinimumIsolation: sandbox.IsolationContainer})
		var em *sandbox.EvidenceMismatchError
		if !errors.As(err, &em) || em.Isolation != sandbox.IsolationProcess || em.Floor != sandbox.IsolationContainer || em.DefaultFloor {
			t.Fatalf("recompute %v: want an evidence mismatch, got %v", recompute, err)
		}
		if !errors.Is(err, sandbox.ErrEvidenceMismatch) || !errors.Is(err, sandbox.ErrMayHaveRun) {
			t.Errorf("errors.Is: %v", err)
		}
		if _, ok := sandbox.NotDispatchedReason(err); ok || !strings.Contains(err.Error(), "the code ran") {
			t.Errorf("an evidence mismatch reads not dispatched: %v", err)
		}
	}

	// No floor sent: the daemon's default floor (container) is what the tier is checked against.
	c = rewriting(t, nil, func(v map[string]any) {
		v["isolation"] = "process"
		member(v, "record")["isolation"] = "process"
	})
	_, err := c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log(1)"})
	var em *sandbox.EvidenceMismatchError
	if !errors.As(err, &em) || !em.DefaultFloor || em.Floor != sandbox.IsolationContainer {
		t.Fatalf("no floor: want an evidence mismatch against the default floor, got %v", err)
	}
}

// A proxy that lowers the floor on the way in gets a real run below the floor: the daemon
// tells the truth about the tier, and the client catches it before it looks at digests.
func TestAProxyThatLowersTheFloorOnTheWayInIsAnEvidenceMismatch(t *testing.T) {
	c := rewriting(t, func(v map[string]any) {
		if v["minimum_isolation"] != "kernel" {
			t.Errorf("floor was %v", v["minimum_isolation"])
		}
		v["minimum_isolation"] = "process"
		v["provider"] = "process"
	}, nil)
	_, err := c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log(1)", MinimumIsolation: sandbox.IsolationKernel})
	var em *sandbox.EvidenceMismatchError
	if !errors.As(err, &em) || em.Isolation != sandbox.IsolationProcess || em.Floor != sandbox.IsolationKernel {
		t.Fatalf("want an evidence mismatch, got %v", err)
	}
}

// resign recomputes a record's digest after a rewrite, as a party in the middle would.
func resign(t *testing.T, record map[string]any) {
	t.Helper()
	var r sandbox.Record
	if err := json.Unmarshal(encode(t, record), &r); err != nil {
		t.Error(err)
	}
	record["record_sha256"] = sandbox.RecordSHA256(&r)
}

// A record without the floor the daemon applied is refused (may have run). The member is left
// out of the record digest when absent, so with the digest recomputed the record is one an
// older daemon could have written: only the applied-floor check catches it.
func TestARecordWithoutItsAppliedFloorIsRefused(t *testing.T) {
	drops := map[string]func(map[string]any){
		"removed": func(record map[string]any) { delete(record, "minimum_isolation") },
		"null":    func(record map[string]any) { record["minimum_isolation"] = nil },
	}
	for name, drop := range drops {
		drop := drop
		c := rewriting(t, nil, func(v map[string]any) {
			record := member(v, "record")
			if record["minimum_isolation"] != "process" {
				t.Errorf("the record's floor was %v", record["minimum_isolation"])
			}
			drop(record)
			resign(t, record)
		})
		_, err := c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log(1)", MinimumIsolation: sandbox.IsolationProcess})
		var mh *sandbox.MayHaveRunError
		if !errors.As(err, &mh) || mh.Code != "bad_response" || !strings.Contains(err.Error(), "states no applied floor (`record.minimum_isolation`)") {
			t.Fatalf("%s: want a bad response naming the applied floor, got %v", name, err)
		}
		if _, ok := sandbox.NotDispatchedReason(err); ok || !errors.Is(err, sandbox.ErrMayHaveRun) {
			t.Errorf("%s: a record without its floor reads not dispatched: %v", name, err)
		}
	}
}

// The record's floor lowered to process on a run sent with a container floor, the record
// digest recomputed: the tier still meets it, but it is not the floor sent.
func TestAnAppliedFloorLoweredWithItsDigestRecomputedIsARecordMismatch(t *testing.T) {
	c := client(t)
	needContainer(t, c)
	c = rewriting(t, nil, func(v map[string]any) {
		record := member(v, "record")
		if v["isolation"] != "container" || record["minimum_isolation"] != "container" {
			t.Errorf("isolation %v, applied floor %v", v["isolation"], record["minimum_isolation"])
		}
		record["minimum_isolation"] = "process"
		resign(t, record)
	})
	_, err := c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log(1)", MinimumIsolation: sandbox.IsolationContainer})
	var rm *sandbox.RecordMismatchError
	if !errors.As(err, &rm) || rm.Field != "minimum_isolation" || rm.Response != "container" || rm.Record != "process" {
		t.Fatalf("want a record mismatch on the applied floor, got %v", err)
	}
	if !errors.Is(err, sandbox.ErrRecordMismatch) || !strings.Contains(err.Error(), "the floor sent") {
		t.Errorf("errors.Is or message: %v", err)
	}
	if _, ok := sandbox.NotDispatchedReason(err); ok {
		t.Error("a record mismatch reads not dispatched")
	}
	// No floor sent: the record's floor must be the daemon's default floor (container).
	_, err = c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log(1)"})
	if !errors.As(err, &rm) || rm.Field != "minimum_isolation" || rm.Response != "container" || rm.Record != "process" || !strings.Contains(err.Error(), "default floor") {
		t.Fatalf("no floor: want a record mismatch against the default floor, got %v", err)
	}
}

// The record's floor raised above the tier that ran, its digest recomputed: a run below the
// floor the daemon says it applied.
func TestAnAppliedFloorRaisedAboveTheTierIsAnEvidenceMismatch(t *testing.T) {
	c := rewriting(t, nil, func(v map[string]any) {
		record := member(v, "record")
		record["minimum_isolation"] = "kernel"
		resign(t, record)
	})
	_, err := c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log(1)", MinimumIsolation: sandbox.IsolationProcess})
	var em *sandbox.EvidenceMismatchError
	if !errors.As(err, &em) || !em.AppliedFloor || em.Floor != sandbox.IsolationKernel || em.Isolation != sandbox.IsolationProcess {
		t.Fatalf("want an evidence mismatch against the applied floor, got %v", err)
	}
	if !strings.Contains(err.Error(), "the record says the daemon applied") {
		t.Errorf("message: %v", err)
	}
}

func TestANamedProviderMismatchIsCaught(t *testing.T) {
	c := client(t)
	needContainer(t, c)
	// The client names process; the proxy sends the run to crun instead.
	c = rewriting(t, func(v map[string]any) {
		if v["provider"] != "process" {
			t.Errorf("provider was %v", v["provider"])
		}
		v["provider"] = "crun"
	}, nil)
	_, err := c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log(1)", MinimumIsolation: sandbox.IsolationProcess, Provider: "process"})
	var pm *sandbox.ProviderMismatchError
	if !errors.As(err, &pm) || pm.Asked != "process" || pm.Provider != "crun" {
		t.Fatalf("want a provider mismatch, got %v", err)
	}
	if !errors.Is(err, sandbox.ErrProviderMismatch) || !errors.Is(err, sandbox.ErrMayHaveRun) {
		t.Errorf("errors.Is: %v", err)
	}
	if _, ok := sandbox.NotDispatchedReason(err); ok {
		t.Error("a provider mismatch reads not dispatched")
	}
}

func TestAProxyThatRewritesTheTierTheRecordOrTheIDIsCaught(t *testing.T) {
	run := func(response func(map[string]any)) error {
		_, err := rewriting(t, nil, response).RunJavaScript(ctx(t), sandbox.Request{Code: "console.log(1)", MinimumIsolation: sandbox.IsolationProcess})
		return err
	}
	// The record claims a stronger tier: its digest no longer matches.
	err := run(func(v map[string]any) { member(v, "record")["isolation"] = "vm" })
	var dm *sandbox.DigestMismatchError
	if !errors.As(err, &dm) || dm.Which != sandbox.DigestRecord {
		t.Errorf("record to vm: %v", err)
	}
	// The response claims a stronger tier than its record.
	err = run(func(v map[string]any) { v["isolation"] = "vm" })
	var rm *sandbox.RecordMismatchError
	if !errors.As(err, &rm) || rm.Field != "isolation" || !errors.Is(err, sandbox.ErrRecordMismatch) {
		t.Errorf("response to vm: %v", err)
	}
	// The request digest is over what this client sent, not what the daemon claims.
	err = run(func(v map[string]any) {
		v["request_sha256"] = strings.Repeat("0", 64)
	})
	if !errors.As(err, &dm) || dm.Which != sandbox.DigestRequest {
		t.Errorf("request digest: %v", err)
	}
	// The echoed id is rewritten: not ours.
	err = run(func(v map[string]any) { v["request_id"] = "someone-else" })
	var mh *sandbox.MayHaveRunError
	if !errors.As(err, &mh) || mh.Code != "request_id_mismatch" {
		t.Errorf("other id: %v", err)
	}
	// A member the protocol does not have: refused, may have run.
	err = run(func(v map[string]any) { v["extra"] = true })
	if !errors.As(err, &mh) || mh.Code != "bad_response" {
		t.Errorf("unknown member: %v", err)
	}
	// A member sent as null where it is optional reads as absent, and verifies.
	err = run(func(v map[string]any) { member(v, "result")["signal"] = nil })
	if err != nil {
		t.Errorf("an optional null: %v", err)
	}
}

func TestARefusalWhoseEchoIsRewrittenIsNotHonoured(t *testing.T) {
	for _, echo := range []any{nil, "another-id"} {
		echo := echo
		c := rewriting(t, nil, func(v map[string]any) {
			if _, ok := member(v, "error")["not_dispatched"].(string); !ok {
				t.Errorf("not a refusal: %v", v)
			}
			v["request_id"] = echo
		})
		_, err := c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log(1)", MinimumIsolation: sandbox.IsolationVM})
		var mh *sandbox.MayHaveRunError
		if !errors.As(err, &mh) || mh.Code != "unverified_refusal" {
			t.Fatalf("echo %v: %v", echo, err)
		}
		if _, ok := sandbox.NotDispatchedReason(err); ok || errors.Is(err, sandbox.ErrInsufficientIsolation) {
			t.Errorf("echo %v reads not dispatched: %v", echo, err)
		}
	}
}

// An error without the mark (the daemon says the code may have run) is not a refusal.
func TestAnErrorWithoutTheMarkMayHaveRun(t *testing.T) {
	c := rewriting(t, nil, func(v map[string]any) {
		member(v, "error")["not_dispatched"] = nil
		member(v, "error")["code"] = "sandbox_failed"
	})
	_, err := c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log(1)", MinimumIsolation: sandbox.IsolationVM})
	var mh *sandbox.MayHaveRunError
	if !errors.As(err, &mh) || mh.Code != "sandbox_failed" || mh.Status != http.StatusUnprocessableEntity {
		t.Fatalf("%v", err)
	}
	if _, ok := sandbox.NotDispatchedReason(err); ok {
		t.Error("reads not dispatched")
	}
}

func TestAnAnswerInAnotherProtocolIsNotTaken(t *testing.T) {
	c := rewriting(t, nil, func(v map[string]any) { v["protocol"] = 2 })
	_, err := c.RunJavaScript(ctx(t), sandbox.Request{Code: "console.log(1)", MinimumIsolation: sandbox.IsolationProcess})
	var mh *sandbox.MayHaveRunError
	if !errors.As(err, &mh) || mh.Code != "bad_response" || !strings.Contains(err.Error(), "protocol 2") {
		t.Fatalf("%v", err)
	}
}

// The exchange broken while the run is in flight: the code may have run.
func TestAnExchangeCutShortMayHaveRun(t *testing.T) {
	c := client(t)
	short, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := c.RunJavaScript(short, sandbox.Request{Code: "setTimeout(() => {}, 3000)", MinimumIsolation: sandbox.IsolationProcess})
	var mh *sandbox.MayHaveRunError
	if !errors.As(err, &mh) || mh.Code != "transport" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v", err)
	}
	if _, ok := sandbox.NotDispatchedReason(err); ok {
		t.Error("reads not dispatched")
	}
}

// Evidence altered on the way: its digest no longer matches.
func TestAProxyThatAltersEvidenceIsCaught(t *testing.T) {
	c := proxying(t, http.MethodGet, nil, func(v map[string]any) {
		first := v["providers"].([]any)[0].(map[string]any)
		first["evidence"].(map[string]any)["environment"] = "elsewhere"
	})
	_, err := c.Providers(ctx(t))
	var dm *sandbox.DigestMismatchError
	if !errors.As(err, &dm) || dm.Which != sandbox.DigestEvidence || dm.Provider == "" || !errors.Is(err, sandbox.ErrDigestMismatch) {
		t.Fatalf("%v", err)
	}
}
