// Trials (docs/simulators.md, docs/trials.md): a controller examined against a simulator its
// image carries, sent as a project of one trial step: the request `plimsoll trial` builds
// (crates/cli/src/trial.rs), so every client and the CLI send the same bytes for one trial.

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// TrialRunner is the first word of a trial step.
const TrialRunner = "plimsoll-trial-runner"

// Trial is a trial and the options of its run. Controller.Path and each Scenarios[i].Path
// are plain file names (letters, digits and `-_.,:=+@%`): the runner's words are not read
// by a shell. A trial takes no grant.
type Trial struct {
	// Simulator names the simulator, as the image declares it (Providers' ImageInfo.Simulators).
	Simulator string
	// SimulatorSHA256 is the SHA-256 (64 lowercase hex digits) its module must have; "": any.
	SimulatorSHA256 string
	// Controller is the controller's file: `*.js`, `*.mjs`, `*.cjs` (run by node) or `*.py`
	// (run by python3).
	Controller File
	// Scenarios are the scenario files (at least one), each a name and the scenario's JSON.
	Scenarios []File
	// FirstDeadlineMS is the answer deadline of the first tick; 0: the runner's (1000 ms).
	FirstDeadlineMS uint64
	// TickDeadlineMS is the answer deadline of every later tick; 0: the runner's (100 ms).
	TickDeadlineMS uint64
	// Reproducible leaves the wall time out of the verdict, so identical trials give
	// identical results.
	Reproducible bool
	// MinimumIsolation, Provider, Limits, Image: as in Request.
	MinimumIsolation Isolation
	Provider         string
	Limits           *Limits
	Image            string
}

// isPlainName reports whether a file name can be one of the runner's words.
func isPlainName(s string) bool {
	// A leading `-` would make the name read as one of the runner's options.
	if s == "" || s[0] == '-' {
		return false
	}
	for _, c := range []byte(s) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.IndexByte("-_.,:=+@%", c) >= 0
		if !ok {
			return false
		}
	}
	return true
}

// IsSimulatorName reports whether s is a simulator name: `[a-z0-9][a-z0-9._-]{0,63}`.
func IsSimulatorName(s string) bool {
	// The same alphabet and length as an image name.
	return IsImageName(s)
}

func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// interpreter is the program that runs a controller, from its extension as Rust's
// Path::extension reads it (after the last dot, none when nothing precedes the dot).
func interpreter(name string) (string, bool) {
	dot := strings.LastIndexByte(name, '.')
	if dot <= 0 {
		return "", false
	}
	switch name[dot+1:] {
	case "js", "mjs", "cjs":
		return "node", true
	case "py":
		return "python3", true
	}
	return "", false
}

// Project is the trial's project: the controller and each scenario as files named by their
// Path, one `plimsoll-trial-runner` step naming the simulator, each scenario with its
// trajectory (its name with `.json` replaced by `.bin`), and the trajectories as the
// artifacts, in the scenarios' order. Its error says what the runner could not take: a name
// with a character its words cannot carry, two files of one name, a controller that is
// neither JavaScript nor Python, no scenario.
func (t Trial) Project() (Project, error) {
	if !IsSimulatorName(t.Simulator) {
		return Project{}, fmt.Errorf("simulator %q: a simulator name matches [a-z0-9][a-z0-9._-]{0,63} (Providers lists each image's simulators)", t.Simulator)
	}
	if len(t.Scenarios) == 0 {
		return Project{}, errors.New("no scenario: a trial needs at least one")
	}
	plain := func(what, name string) error {
		if isPlainName(name) {
			return nil
		}
		return fmt.Errorf("%s %q: a trial's file name may hold only letters, digits and -_.,:=+@%% and not start with - (rename it)", what, name)
	}
	controller := t.Controller.Path
	if err := plain("controller", controller); err != nil {
		return Project{}, err
	}
	run, ok := interpreter(controller)
	if !ok {
		return Project{}, fmt.Errorf("controller %q: name a .js file (run by node) or a .py file (run by python3)", controller)
	}
	words := []string{TrialRunner, "--simulator", t.Simulator}
	if t.SimulatorSHA256 != "" {
		if !isSHA256Hex(t.SimulatorSHA256) {
			return Project{}, fmt.Errorf("SimulatorSHA256 must be 64 lowercase hex digits, not %q", t.SimulatorSHA256)
		}
		words = append(words, "--simulator-sha256", t.SimulatorSHA256)
	}
	names := map[string]bool{controller: true}
	files := []File{t.Controller}
	var trajectories []string
	for _, s := range t.Scenarios {
		if err := plain("scenario", s.Path); err != nil {
			return Project{}, err
		}
		if names[s.Path] {
			return Project{}, fmt.Errorf("scenario %q: another file of the trial is named %s; rename one", s.Path, s.Path)
		}
		names[s.Path] = true
		trajectory := strings.TrimSuffix(s.Path, ".json") + ".bin"
		if names[trajectory] {
			return Project{}, fmt.Errorf("scenario %q: its trajectory %s would overwrite another file of the trial; rename one", s.Path, trajectory)
		}
		names[trajectory] = true
		files = append(files, s)
		trajectories = append(trajectories, trajectory)
		words = append(words, "--scenario", s.Path, "--trajectory", trajectory)
	}
	if t.FirstDeadlineMS != 0 {
		words = append(words, "--first-deadline-ms", strconv.FormatUint(t.FirstDeadlineMS, 10))
	}
	if t.TickDeadlineMS != 0 {
		words = append(words, "--tick-deadline-ms", strconv.FormatUint(t.TickDeadlineMS, 10))
	}
	if t.Reproducible {
		words = append(words, "--reproducible")
	}
	words = append(words, "--", run, controller)
	return Project{Files: files, Steps: []Step{{Run: strings.Join(words, " ")}}, Artifacts: trajectories}, nil
}

// Trial examines t.Controller against t.Simulator on t.Scenarios (docs/simulators.md), as
// `plimsoll trial` does: one project of one trial step (Trial.Project), sent and verified
// as Run sends and verifies any run. The verdict is Result.Record.Trials[0] (the simulator's
// name, version and SHA-256, each trial's end, reason, ticks, score and fingerprint), and
// the trajectories are Result.Output.Artifacts, in the scenarios' order. What the runner
// could not take is refused here, unsent (a *NotDispatchedError, reason `request`); a
// simulator the image does not declare is refused by the daemon (reason `environment`). A
// failed exam is a result: the runner's step exits 1 and the record says which trial failed
// and why.
func (c *Client) Trial(ctx context.Context, t Trial) (*Result, error) {
	project, err := t.Project()
	if err != nil {
		return nil, refusedHere("", ReasonRequest, err.Error()+"; nothing was sent", err)
	}
	return c.Run(ctx, RunRequest{
		Run:              project,
		MinimumIsolation: t.MinimumIsolation,
		Provider:         t.Provider,
		Limits:           t.Limits,
		Image:            t.Image,
	})
}
