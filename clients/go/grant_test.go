// A run with a grant against a real plimsolld and a real HTTP API on loopback: the calls
// come back on the result (covered by its digest), the credential never reaches the sandbox.

package sandbox_test

import (
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
