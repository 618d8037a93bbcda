// The agent tool against a real plimsolld.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"plimsoll/clients/go/sandbox"
	"plimsoll/clients/go/sandbox/internal/testdaemon"
)

func TestTheToolReturnsOutputAndTier(t *testing.T) {
	if why := testdaemon.Missing(); why != "" {
		testdaemon.SkipOrFail(t, why)
	}
	d, err := testdaemon.Start(testdaemon.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	c := sandbox.New(d.URL, d.Token)
	ctx := context.Background()

	out := RunCode(ctx, c, sandbox.IsolationProcess, ToolInput{Language: "python", Code: "print(6 * 7)"})
	if !out.Ran || out.Isolation != sandbox.IsolationProcess || out.Stdout != "42\n" || out.ExitCode == nil || *out.ExitCode != 0 {
		t.Errorf("process: %+v", out)
	}
	// Nothing offers vm here: the tool says nothing ran, and why.
	out = RunCode(ctx, c, sandbox.IsolationVM, ToolInput{Language: "javascript", Code: "console.log(1)"})
	if out.Ran || out.NotDispatched != sandbox.ReasonIsolation || out.MayHaveRun || out.Error == "" {
		t.Errorf("vm: %+v", out)
	}

	p, err := c.Providers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range p.Providers {
		if info.Name == "crun" && !info.Available {
			testdaemon.SkipOrFail(t, "crun is not available (the image comes from `make images`)")
		}
	}
	// The command, as an agent framework would run it.
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(d.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"-url", d.URL, "-token-file", tokenFile, "-floor", "container"},
		strings.NewReader("console.log(6 * 7)"), &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var got ToolOutput
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if !got.Ran || got.Isolation != sandbox.IsolationContainer || got.Provider != "crun" || got.Stdout != "42\n" {
		t.Errorf("container: %+v", got)
	}
	if strings.Contains(stdout.String()+stderr.String(), d.Token) {
		t.Error("the token was printed")
	}
}
