// Command agenttool is an agent tool that wraps one plimsoll run: the function an agent
// framework calls with the code its model wrote, returning the output plus the isolation
// tier that actually ran it, or, when nothing ran, why.
//
//	echo 'console.log(6 * 7)' | agenttool -url http://127.0.0.1:7878 -token-file token -floor container
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"plimsoll/clients/go/sandbox"
)

// ToolInput is what the model sends: a language and the code.
type ToolInput struct {
	Language string `json:"language"`
	Code     string `json:"code"`
}

// ToolOutput is what the model reads back.
type ToolOutput struct {
	// Ran is true when the run finished and its answer verified.
	Ran bool `json:"ran"`
	// Isolation is the tier that actually ran the code; Provider the provider.
	Isolation sandbox.Isolation `json:"isolation,omitempty"`
	Provider  string            `json:"provider,omitempty"`
	Stdout    string            `json:"stdout"`
	Stderr    string            `json:"stderr"`
	ExitCode  *int32            `json:"exit_code,omitempty"`
	TimedOut  bool              `json:"timed_out,omitempty"`
	// NotDispatched is the reason nothing ran, when nothing did.
	NotDispatched sandbox.Reason `json:"not_dispatched,omitempty"`
	// MayHaveRun is true when the code may have run but no verified result came back: the
	// model must not simply try again.
	MayHaveRun bool   `json:"may_have_run,omitempty"`
	Error      string `json:"error,omitempty"`
}

// RunCode is the tool: it runs in.Code at floor or above and reports what happened.
func RunCode(ctx context.Context, c *sandbox.Client, floor sandbox.Isolation, in ToolInput) ToolOutput {
	req := sandbox.Request{Code: in.Code, MinimumIsolation: floor, Limits: &sandbox.Limits{TimeoutMS: 10_000}}
	var res *sandbox.Result
	var err error
	switch strings.ToLower(in.Language) {
	case "javascript", "js":
		res, err = c.RunJavaScript(ctx, req)
	case "python", "py":
		res, err = c.RunPython(ctx, req)
	default:
		return ToolOutput{NotDispatched: sandbox.ReasonRequest, Error: fmt.Sprintf("language %q: use javascript or python", in.Language)}
	}
	if err != nil {
		out := ToolOutput{Error: err.Error()}
		if reason, ok := sandbox.NotDispatchedReason(err); ok {
			out.NotDispatched = reason
		} else {
			out.MayHaveRun = errors.Is(err, sandbox.ErrMayHaveRun)
		}
		return out
	}
	return ToolOutput{
		Ran:       true,
		Isolation: res.Isolation,
		Provider:  res.Provider,
		Stdout:    res.Output.Stdout.Text(),
		Stderr:    res.Output.Stderr.Text(),
		ExitCode:  res.Output.ExitCode,
		TimedOut:  res.Output.TimedOut,
	}
}

// run is main with its inputs and outputs given: it reads the code from stdin and writes the
// tool's output as one JSON line to stdout.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("agenttool", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "http://127.0.0.1:7878", "plimsolld's base URL")
	tokenFile := fs.String("token-file", "", "a file holding the caller token (`plimsoll callers add NAME` prints one)")
	floor := fs.String("floor", "container", "the weakest tier accepted: process, container, kernel or vm")
	language := fs.String("language", "javascript", "javascript or python")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *tokenFile == "" {
		fmt.Fprintln(stderr, "agenttool: -token-file is required: write the caller token to a file and pass its path")
		return 2
	}
	token, err := os.ReadFile(*tokenFile)
	if err != nil {
		fmt.Fprintf(stderr, "agenttool: cannot read the token file: %v\n", err)
		return 2
	}
	code, err := io.ReadAll(stdin)
	if err != nil {
		fmt.Fprintf(stderr, "agenttool: cannot read the code from stdin: %v\n", err)
		return 2
	}
	c := sandbox.New(*url, strings.TrimSpace(string(token)))
	out := RunCode(context.Background(), c, sandbox.Isolation(*floor), ToolInput{Language: *language, Code: string(code)})
	if err := json.NewEncoder(stdout).Encode(out); err != nil {
		fmt.Fprintf(stderr, "agenttool: %v\n", err)
		return 1
	}
	return 0
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
