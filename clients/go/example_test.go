package sandbox_test

import (
	"context"
	"errors"
	"fmt"

	"plimsoll/clients/go/sandbox"
)

// The announcement's example: ask for a floor; ErrInsufficientIsolation means nothing ran,
// and res.Isolation reports the boundary that actually ran.
func ExampleClient_RunJavaScript() {
	provider := struct{ Sandbox *sandbox.Client }{sandbox.New("http://127.0.0.1:7878", "plm_...")}
	ctx := context.Background()

	res, err := provider.Sandbox.RunJavaScript(ctx, sandbox.Request{
		Code:             "console.log(6 * 7)",
		MinimumIsolation: sandbox.IsolationVM, // ErrInsufficientIsolation means nothing ran
	})
	switch {
	case errors.Is(err, sandbox.ErrInsufficientIsolation):
		fmt.Println("nothing ran: no provider here meets the vm floor")
	case err != nil:
		if reason, ok := sandbox.NotDispatchedReason(err); ok {
			fmt.Println("nothing ran:", reason, err)
		} else {
			fmt.Println("the code may have run; do not retry blindly:", err)
		}
	default:
		fmt.Printf("%s ran it (%s): %s", res.Provider, res.Isolation, res.Output.Stdout)
	}
}

// A project: files, shell steps, artifacts; exact bytes both ways.
func ExampleClient_Run() {
	c := sandbox.New("http://127.0.0.1:7878", "plm_...")
	res, err := c.Run(context.Background(), sandbox.RunRequest{
		Run: sandbox.Project{
			Files:     []sandbox.File{{Path: "data.bin", Content: []byte{0x00, 0xff}}},
			Steps:     []sandbox.Step{{Name: "copy", Run: "mkdir -p out && cp data.bin out/"}},
			Artifacts: []string{"out/data.bin"},
		},
		MinimumIsolation: sandbox.IsolationContainer,
		Limits:           &sandbox.Limits{TimeoutMS: 10_000},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%x at %s\n", res.Output.Artifacts[0].Content, res.Isolation)
}
