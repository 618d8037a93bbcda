// Trials against the suite's real plimsolld at crun: the default image's tank examines its
// accepted and failing controllers on a hidden scenario, and a simulator the image lacks is
// refused before anything runs. The image's simulators are listed by Providers.

package sandbox_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"plimsoll/clients/go/sandbox"
)

// acceptedFingerprint is the SHA-256 of the accepted tank controller's trajectory on
// hidden-1: the same on every host and tier, whichever language the controller is written in.
const acceptedFingerprint = "f0fe0f868cdd7b2fd62fee9132f4ec5f62ec04980aac34d0ec552f134d1e0e47"

func repoFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tankTrial is a trial of the tank controller `name` on hidden-1, with generous deadlines:
// the tests share two cores with everything else.
func tankTrial(t *testing.T, name string) sandbox.Trial {
	return sandbox.Trial{
		Simulator:       "tank",
		Controller:      sandbox.File{Path: name, Content: repoFile(t, "examples/controllers/tank/"+name)},
		Scenarios:       []sandbox.File{{Path: "hidden-1.json", Content: repoFile(t, "sims/tank/scenarios/hidden-1.json")}},
		FirstDeadlineMS: 20000,
		TickDeadlineMS:  5000,
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestTheDefaultImageListsItsSimulators(t *testing.T) {
	c := client(t)
	needContainer(t, c)
	p, err := c.Providers(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	image, ok := p.DefaultImage()
	if !ok {
		t.Fatalf("no default image: %+v", p.Images)
	}
	var names []string
	for _, s := range image.Simulators {
		names = append(names, s.Name)
		if s.Path != "/opt/plimsoll/simulators/"+s.Name+".wasm" || len(s.SHA256) != 64 {
			t.Errorf("simulator %+v", s)
		}
	}
	if !reflect.DeepEqual(names, []string{"cartpole", "tank", "motor"}) {
		t.Errorf("simulators %v", names)
	}
}

func TestTheAcceptedTankControllersPass(t *testing.T) {
	c := client(t)
	needContainer(t, c)
	p, err := c.Providers(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"accepted.py", "accepted.js"} {
		trial := tankTrial(t, name)
		trial.Reproducible = true
		trial.MinimumIsolation = sandbox.IsolationContainer
		res, err := c.Trial(ctx(t), trial)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if res.Output.ExitCode == nil || *res.Output.ExitCode != 0 || len(res.Record.Trials) != 1 {
			t.Fatalf("%s: exit %v, steps %+v, trials %+v", name, res.Output.ExitCode, res.Output.Steps, res.Record.Trials)
		}
		step := res.Record.Trials[0]
		if step.Step != 0 || !step.Pass || step.Simulator.Name != "tank" || len(step.Trials) != 1 {
			t.Fatalf("%s: %+v", name, step)
		}
		// The simulator the record names is the module the image it ran in declares.
		if res.Record.Image == nil {
			t.Fatalf("%s: no image in the record", name)
		}
		image, ok := p.Image(res.Record.Image.Identity)
		declared, declares := image.Simulator("tank")
		if !ok || !declares || step.Simulator.SHA256 != declared.SHA256 {
			t.Errorf("%s: simulator %s, the image declares %+v", name, step.Simulator.SHA256, image.Simulators)
		}
		trial0 := step.Trials[0]
		if trial0.Scenario == nil || *trial0.Scenario != "hidden-1" || trial0.End != sandbox.TrialCompleted ||
			!trial0.Pass || trial0.Ticks != 1800 || trial0.Score == nil || *trial0.Score < 0.75 {
			t.Errorf("%s: trial %+v", name, trial0)
		}
		// The trajectory is the artifact, and its SHA-256 is the fingerprint.
		if len(res.Output.Artifacts) != 1 || res.Output.Artifacts[0].Path != "hidden-1.bin" || !res.Output.Artifacts[0].Found || res.Output.Artifacts[0].Truncated {
			t.Fatalf("%s: artifacts %+v", name, res.Output.Artifacts)
		}
		if got := sha256Hex(res.Output.Artifacts[0].Content); got != trial0.Fingerprint || got != acceptedFingerprint {
			t.Errorf("%s: trajectory %s, fingerprint %s, want %s", name, got, trial0.Fingerprint, acceptedFingerprint)
		}
	}
}

func TestTheFailingTankControllersOverflow(t *testing.T) {
	c := client(t)
	needContainer(t, c)
	cx := ctx(t)
	var wg sync.WaitGroup
	for _, name := range []string{"failing.py", "failing.js"} {
		name, trial := name, tankTrial(t, name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Trial(cx, trial)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			// A failed exam is a result: the runner exits 1 and the record says why.
			if res.Output.ExitCode == nil || *res.Output.ExitCode != 1 || len(res.Record.Trials) != 1 || res.Record.Trials[0].Pass {
				t.Errorf("%s: exit %v, trials %+v", name, res.Output.ExitCode, res.Record.Trials)
				return
			}
			trial := res.Record.Trials[0].Trials[0]
			if trial.End != sandbox.TrialFailed || trial.Pass || trial.Reason == nil || !strings.Contains(*trial.Reason, "overflowed") {
				t.Errorf("%s: trial %+v", name, trial)
			}
			if len(res.Output.Artifacts) != 1 || sha256Hex(res.Output.Artifacts[0].Content) != trial.Fingerprint {
				t.Errorf("%s: the trajectory is not the fingerprint's", name)
			}
		}()
	}
	wg.Wait()
}

func TestASimulatorTheImageLacksIsRefusedAndNothingRuns(t *testing.T) {
	c := client(t)
	needContainer(t, c)
	trial := tankTrial(t, "accepted.py")
	trial.Simulator = "boat"
	trial.MinimumIsolation = sandbox.IsolationContainer
	res, err := c.Trial(ctx(t), trial)
	var nd *sandbox.NotDispatchedError
	if res != nil || !errors.As(err, &nd) || nd.Reason != sandbox.ReasonEnvironment || nd.Status == 0 {
		t.Fatalf("%+v, %v", res, err)
	}
	if reason, ok := sandbox.NotDispatchedReason(err); !ok || reason != sandbox.ReasonEnvironment {
		t.Errorf("NotDispatchedReason: %s %v", reason, ok)
	}
	if !errors.Is(err, sandbox.ErrEnvironment) || errors.Is(err, sandbox.ErrMayHaveRun) || !strings.Contains(err.Error(), "boat") {
		t.Errorf("%v", err)
	}
}
