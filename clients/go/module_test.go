// The module as a caller uses it: another module importing it through a `replace`
// directive, or a `go work` workspace, loads and type-checks (go vet) with no download
// (GOPROXY=off).

package sandbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

const consumer = `package main

import (
	"context"
	"errors"
	"fmt"

	"plimsoll/clients/go/sandbox"
)

func main() {
	provider := struct{ Sandbox *sandbox.Client }{sandbox.New("http://127.0.0.1:7878", "plm_...")}
	ctx := context.Background()
	res, err := provider.Sandbox.RunJavaScript(ctx, sandbox.Request{
		Code:             "console.log(6 * 7)",
		MinimumIsolation: sandbox.IsolationVM, // ErrInsufficientIsolation means nothing ran
	})
	if errors.Is(err, sandbox.ErrInsufficientIsolation) {
		fmt.Println("nothing ran")
		return
	}
	if err != nil {
		fmt.Println(sandbox.NotDispatchedReason(err))
		return
	}
	fmt.Println(res.Isolation, res.Output.Stdout)
}
`

func goVet(t *testing.T, dir string, env ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "vet", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"GOPROXY=off", "GOTOOLCHAIN=local"}, env...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go vet in %s: %v\n%s", dir, err, out)
	}
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestAnotherModuleUsesItThroughReplace(t *testing.T) {
	t.Parallel()
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "go.mod"), "module example.com/agent\n\ngo 1.19\n\n"+
		"require plimsoll/clients/go/sandbox v0.0.0\n\nreplace plimsoll/clients/go/sandbox => "+here+"\n")
	write(t, filepath.Join(dir, "main.go"), consumer)
	goVet(t, dir, "GOWORK=off", "GOFLAGS=-mod=mod")
}

func TestAnotherModuleUsesItThroughAWorkspace(t *testing.T) {
	t.Parallel()
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "go.work"), "go 1.19\n\nuse (\n\t./agent\n\t"+here+"\n)\n")
	write(t, filepath.Join(dir, "agent", "go.mod"), "module example.com/agent\n\ngo 1.19\n")
	write(t, filepath.Join(dir, "agent", "main.go"), consumer)
	goVet(t, filepath.Join(dir, "agent"), "GOFLAGS=", "GOWORK="+filepath.Join(dir, "go.work"))
}
