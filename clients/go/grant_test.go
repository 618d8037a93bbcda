// Grants against a real plimsolld and a real HTTP API on loopback: a run's calls come back on
// its result (covered by its digest), the credential never reaches the sandbox; a session
// holds its grant (an API or an egress grant) for its whole life.

package sandbox_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"plimsoll/clients/go/sandbox"
	"plimsoll/clients/go/sandbox/internal/testdaemon"
)

func TestARunWithAGrantCallsTheAPIThroughTheBroker(t *testing.T) {
	daemon(t) // root and the binary
	const secret = "api-secret-for-the-go-client-test"
	var mu sync.Mutex
	var seen []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"item":"tea"}`, strings.TrimPrefix(r.URL.Path, "/orders/"))
	}))
	defer api.Close()
	grants := fmt.Sprintf("[profiles.orders-dev]\nbase_url = %q\nroutes = [\"GET /orders/*\"]\ncallers = [%q]\ncall_budget = 5\n\n"+
		"[profiles.orders-dev.credential]\nkind = \"static\"\nsecret_env = \"GO_CLIENT_TEST_API_TOKEN\"\n", api.URL, testdaemon.CallerName)
	d, err := testdaemon.Start(testdaemon.Options{Providers: []string{"process"}, Grants: grants,
		Env: []string{"GO_CLIENT_TEST_API_TOKEN=" + secret}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	c := sandbox.New(d.URL, d.Token)
	res, err := c.RunJavaScript(ctx(t), sandbox.Request{
		Code: `(async () => {
  const order = await host.get('/orders/42');
  console.log(JSON.stringify(order));
  try { await host.get('/admin'); } catch (e) { console.log('refused', e.code); }
  console.log(Object.keys(process.env).length);
})();`,
		MinimumIsolation: sandbox.IsolationProcess,
		Grant:            "orders-dev",
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, d.LogText())
	}
	if got := res.Output.Stdout.String(); !strings.HasPrefix(got, "{\"id\":\"42\",\"item\":\"tea\"}\nrefused route_not_allowed\n") {
		t.Errorf("stdout %q, stderr %q", got, res.Output.Stderr)
	}
	if strings.Contains(res.Output.Stdout.String()+res.Output.Stderr.String(), secret) {
		t.Error("the credential reached the sandbox")
	}
	calls := res.Output.Calls
	if len(calls) != 2 {
		t.Fatalf("calls: %+v", calls)
	}
	if c0 := calls[0]; c0.Method != "GET" || c0.Route == nil || *c0.Route != "/orders/*" || c0.Status == nil || *c0.Status != 200 || c0.Error != nil || c0.ResponseBytes == 0 {
		t.Errorf("call 0: %+v", c0)
	}
	if c1 := calls[1]; c1.Route != nil || c1.Status != nil || c1.Error == nil || *c1.Error != "route_not_allowed" {
		t.Errorf("call 1: %+v", c1)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0] != "GET /orders/42 Bearer "+secret {
		t.Errorf("the API saw %q", seen)
	}
}

// A session open sends the grant it names: a listener on loopback reads the body and refuses
// the open as a daemon refuses a grant it will not give, echoing the request id (so the
// refusal is believed: nothing opened). No daemon is needed.
func TestASessionOpenSendsTheGrantItNames(t *testing.T) {
	var mu sync.Mutex
	var sent []map[string]any
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Errorf("the open is not JSON: %v", err)
		}
		mu.Lock()
		sent = append(sent, map[string]any{"method": r.Method, "path": r.URL.Path, "body": body})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, `{"protocol":1,"request_id":%q,"error":{"code":"permission","message":"grant not allowed: this caller may not use that grant profile","not_dispatched":"permission"}}`, body["request_id"])
	}))
	defer server.Close()
	c := sandbox.New(server.URL, "plm_test")
	_, err := c.OpenSession(ctx(t), sandbox.SessionOptions{Language: sandbox.Python, MinimumIsolation: sandbox.IsolationContainer, Grant: "pkgs"})
	var nd *sandbox.NotDispatchedError
	if !errors.As(err, &nd) || nd.Reason != sandbox.ReasonPermission {
		t.Fatalf("open: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 1 {
		t.Fatalf("sent %d requests", len(sent))
	}
	body := sent[0]["body"].(map[string]any)
	if sent[0]["method"] != "POST" || sent[0]["path"] != "/v1/sessions" || body["grant"] != "pkgs" || body["language"] != "python" {
		t.Errorf("sent %v", sent[0])
	}
}

// A session at crun holds its grant for its whole life, against a real plimsolld: with the
// API grant every cell may call the API through the broker, and each result lists the calls
// since the call before; with an egress grant a cell's connection to a host the grant does
// not list is refused by the broker (nothing resolved or connected: no network needed), and
// its receipt is on that cell's result alone. A grant the caller may not use opens nothing.
func TestASessionHoldsItsGrantForItsWholeLife(t *testing.T) {
	if why := testdaemon.Missing(); why != "" {
		testdaemon.SkipOrFail(t, why)
	}
	const secret = "api-secret-for-the-go-session-test"
	var mu sync.Mutex
	var seen []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"item":"tea"}`, strings.TrimPrefix(r.URL.Path, "/orders/"))
	}))
	defer api.Close()
	grants := fmt.Sprintf("[profiles.orders]\nbase_url = %q\nroutes = [\"GET /orders/*\"]\ncallers = [%q]\ncall_budget = 5\n\n"+
		"[profiles.orders.credential]\nkind = \"static\"\nsecret_env = \"GO_CLIENT_TEST_API_TOKEN\"\n\n"+
		"[egress.pkgs]\ncallers = [%q]\nhosts = [\"pypi.plimsoll.test\"]\nports = [80]\n",
		api.URL, testdaemon.CallerName, testdaemon.CallerName)
	d, err := testdaemon.Start(testdaemon.Options{Providers: []string{"crun"}, Extra: "\n[pools]\n", Grants: grants,
		Env: []string{"GO_CLIENT_TEST_API_TOKEN=" + secret}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	c := sandbox.New(d.URL, d.Token)
	needContainer(t, c)

	s, err := c.OpenSession(ctx(t), sandbox.SessionOptions{Language: sandbox.JavaScript, MinimumIsolation: sandbox.IsolationContainer, Grant: "orders"})
	if err != nil {
		t.Fatalf("open with the API grant: %v\n%s", err, d.LogText())
	}
	t.Cleanup(func() { closeQuietly(s) })
	first := cell(t, s, "host.get('/orders/7').then((o) => console.log(o.item))")
	if got := first.Output.Stdout.String(); got != "tea\n" {
		t.Errorf("first cell: %q, stderr %q", got, first.Output.Stderr)
	}
	if calls := first.Output.Calls; len(calls) != 1 || calls[0].Route == nil || *calls[0].Route != "/orders/*" || calls[0].Status == nil || *calls[0].Status != 200 {
		t.Errorf("first cell's calls: %+v", calls)
	}
	second := cell(t, s, "host.get('/orders/8').then((o) => console.log(o.id))")
	if got := second.Output.Stdout.String(); got != "8\n" || len(second.Output.Calls) != 1 {
		t.Errorf("second cell: %q, calls %+v", got, second.Output.Calls)
	}
	if calls := cell(t, s, "console.log(1)").Output.Calls; len(calls) != 0 {
		t.Errorf("a cell that called nothing lists %+v", calls)
	}
	if _, err := s.Close(ctx(t)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(seen) != 2 || seen[0] != "GET /orders/7 Bearer "+secret || seen[1] != "GET /orders/8 Bearer "+secret {
		t.Errorf("the API saw %q", seen)
	}
	mu.Unlock()

	e, err := c.OpenSession(ctx(t), sandbox.SessionOptions{Language: sandbox.Python, MinimumIsolation: sandbox.IsolationContainer, Grant: "pkgs"})
	if err != nil {
		t.Fatalf("open with the egress grant: %v\n%s", err, d.LogText())
	}
	t.Cleanup(func() { closeQuietly(e) })
	reached := cell(t, e, "import urllib.request\n"+
		"try:\n    urllib.request.urlopen('http://elsewhere.plimsoll.test/simple/', timeout=20)\n"+
		"except Exception as e:\n    print('refused', getattr(e, 'code', e))")
	if got := reached.Output.Stdout.String(); got != "refused 403\n" {
		t.Errorf("the cell printed %q, stderr %q", got, reached.Output.Stderr)
	}
	if r := reached.Output.Egress; len(r) != 1 || r[0].Host != "elsewhere.plimsoll.test" || r[0].Port != 80 || r[0].Kind != "http" ||
		r[0].Verdict != "refused" || r[0].Rule != "host_not_allowed" || r[0].Address != nil || r[0].SNI != nil || r[0].Ended != nil ||
		r[0].BytesUp != 0 || r[0].BytesDown != 0 {
		t.Errorf("receipts: %+v", r)
	}
	if r := cell(t, e, "print(1)").Output.Egress; len(r) != 0 {
		t.Errorf("a cell that reached nothing lists %+v", r)
	}

	_, err = c.OpenSession(ctx(t), sandbox.SessionOptions{Language: sandbox.Python, MinimumIsolation: sandbox.IsolationContainer, Grant: "no-such-grant"})
	var nd *sandbox.NotDispatchedError
	if !errors.As(err, &nd) || nd.Reason != sandbox.ReasonPermission {
		t.Errorf("an unknown grant: %v", err)
	}
}
