// A record's trial steps (record field 13) without a daemon: read strictly and digested as
// the golden vectors say, a score by its IEEE 754 bits (-0 is not 0), null and an empty list
// as absent.

package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

func trialVectors(t *testing.T) map[string]vector {
	t.Helper()
	byName := map[string]vector{}
	for _, v := range loadVectors(t) {
		byName[v.Name] = v
	}
	for _, name := range []string{"record/trials", "record/trials-nulls", "record/trials-two-steps", "record/null-trials"} {
		if _, ok := byName[name]; !ok {
			t.Fatalf("no vector %s", name)
		}
	}
	return byName
}

func readRecord(t *testing.T, data []byte) (Record, error) {
	t.Helper()
	var r Record
	_, err := readStrict(data, &r)
	return r, err
}

// withTrials is the record/trials vector's input with its trials replaced by raw JSON.
func withTrials(t *testing.T, byName map[string]vector, trials string) []byte {
	t.Helper()
	var g map[string]json.RawMessage
	if err := json.Unmarshal(byName["record/trials"].Input, &g); err != nil {
		t.Fatal(err)
	}
	g["trials"] = json.RawMessage(trials)
	return encodeJSON(t, g)
}

func TestTheTrialVectorsAreReadAndCovered(t *testing.T) {
	byName := trialVectors(t)
	r, err := readRecord(t, byName["record/trials"].Input)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Trials) != 1 {
		t.Fatalf("record/trials reads %d trial steps", len(r.Trials))
	}
	s := r.Trials[0]
	want := SimulatorRef{Name: "cartpole", Version: "1.0.0", SHA256: "d7156572f87f3c557127a511301424f5c8cc718a269bf4274b5e0258d5b6656e"}
	if s.Step != 1 || s.Pass || s.Simulator != want || len(s.Trials) != 2 {
		t.Fatalf("record/trials reads %+v", s)
	}
	ok, failed := s.Trials[0], s.Trials[1]
	if ok.Scenario == nil || *ok.Scenario != "standard" || ok.End != TrialCompleted || ok.Reason != nil || ok.Score != nil || !ok.Pass || ok.Ticks != 2000 {
		t.Errorf("the passing trial reads %+v", ok)
	}
	if failed.Scenario != nil || failed.End != TrialFailed || failed.Reason == nil || *failed.Reason != "the pole fell past 12 degrees" ||
		failed.Score == nil || *failed.Score != 0.094 || failed.Pass || failed.Ticks != 188 || failed.End.IsControllerFault() {
		t.Errorf("the failing trial reads %+v", failed)
	}
	if got := RecordSHA256(&r); got != byName["record/trials"].SHA256 {
		t.Errorf("record/trials digests to %s", got)
	}
	// Nulls are absent, at every depth.
	nulls, err := readRecord(t, byName["record/trials-nulls"].Input)
	if err != nil || RecordSHA256(&nulls) != RecordSHA256(&r) {
		t.Errorf("record/trials-nulls: %v", err)
	}
	two, err := readRecord(t, byName["record/trials-two-steps"].Input)
	if err != nil || len(two.Trials) != 2 || two.Trials[1].Step != 3 {
		t.Fatalf("record/trials-two-steps: %v %+v", err, two.Trials)
	}
	last := two.Trials[1].Trials
	if *last[0].Score != 1 || *last[1].Score != 0 || !math.Signbit(*last[1].Score) || !last[1].End.IsControllerFault() {
		t.Errorf("the scores read %v and %v", *last[0].Score, *last[1].Score)
	}
	// An empty list, null and none are one: the record of a run without trial steps keeps its
	// digest.
	for _, empty := range []string{"[]", "null"} {
		e, err := readRecord(t, withTrials(t, byName, empty))
		if err != nil || len(e.Trials) != 0 || RecordSHA256(&e) != byName["record/image"].SHA256 {
			t.Errorf("trials %s: %v", empty, err)
		}
	}
}

func TestEveryMemberOfATrialStepIsCovered(t *testing.T) {
	byName := trialVectors(t)
	base, err := readRecord(t, byName["record/trials"].Input)
	if err != nil {
		t.Fatal(err)
	}
	str := func(s string) *string { return &s }
	num := func(f float64) *float64 { return &f }
	edits := map[string]func(s *TrialStepRecord){
		"step":              func(s *TrialStepRecord) { s.Step = 2 },
		"pass":              func(s *TrialStepRecord) { s.Pass = true },
		"simulator.name":    func(s *TrialStepRecord) { s.Simulator.Name = "tank" },
		"simulator.version": func(s *TrialStepRecord) { s.Simulator.Version = "1.0.1" },
		"simulator.sha256":  func(s *TrialStepRecord) { s.Simulator.SHA256 = strings.Repeat("0", 64) },
		"scenario":          func(s *TrialStepRecord) { s.Trials[0].Scenario = str("other") },
		"no scenario":       func(s *TrialStepRecord) { s.Trials[0].Scenario = nil },
		"an empty scenario": func(s *TrialStepRecord) { s.Trials[1].Scenario = str("") },
		"end":               func(s *TrialStepRecord) { s.Trials[0].End = TrialFailed },
		"reason":            func(s *TrialStepRecord) { s.Trials[0].Reason = str("why") },
		"ticks":             func(s *TrialStepRecord) { s.Trials[0].Ticks = 1999 },
		"score":             func(s *TrialStepRecord) { s.Trials[1].Score = num(0.095) },
		"-0 for 0":          func(s *TrialStepRecord) { s.Trials[0].Score = num(math.Copysign(0, -1)) },
		"trial pass":        func(s *TrialStepRecord) { s.Trials[0].Pass = false },
		"fingerprint":       func(s *TrialStepRecord) { s.Trials[0].Fingerprint = strings.Repeat("0", 64) },
		"order":             func(s *TrialStepRecord) { s.Trials[0], s.Trials[1] = s.Trials[1], s.Trials[0] },
		"no trials":         func(s *TrialStepRecord) { s.Trials = nil },
	}
	zero := base
	zero.Trials = []TrialStepRecord{base.Trials[0]}
	zero.Trials[0].Trials = append([]TrialOutcome(nil), base.Trials[0].Trials...)
	zero.Trials[0].Trials[0].Score = num(0)
	for what, edit := range edits {
		c := base
		c.Trials = []TrialStepRecord{base.Trials[0]}
		c.Trials[0].Trials = append([]TrialOutcome(nil), base.Trials[0].Trials...)
		ref := &base
		if what == "-0 for 0" {
			ref = &zero
		}
		edit(&c.Trials[0])
		if RecordSHA256(&c) == RecordSHA256(ref) {
			t.Errorf("%s: not covered", what)
		}
	}
	if RecordSHA256(&base) != byName["record/trials"].SHA256 {
		t.Fatal("an edit changed the base record")
	}
	// A JSON integer is its binary64 value: 1 and 1.0 read and digest alike.
	trials := string(mustMember(t, byName["record/trials"].Input, "trials"))
	one := func(score string) string {
		r, err := readRecord(t, withTrials(t, byName, strings.Replace(trials, "0.094", score, 1)))
		if err != nil {
			t.Fatalf("score %s: %v", score, err)
		}
		return RecordSHA256(&r)
	}
	if one("1") != one("1.0") || one("1") != one("1e0") || one("1") == one("1.0000000000000002") {
		t.Error("a score is not digested by its binary64 value")
	}
}

func TestARecordsTrialsAreReadStrictly(t *testing.T) {
	byName := trialVectors(t)
	var steps []map[string]any
	if err := json.Unmarshal(mustMember(t, byName["record/trials"].Input, "trials"), &steps); err != nil {
		t.Fatal(err)
	}
	edit := func(f func(s map[string]any)) string {
		var c []map[string]any
		if err := json.Unmarshal(encodeJSON(t, steps), &c); err != nil {
			t.Fatal(err)
		}
		f(c[0])
		return string(encodeJSON(t, c))
	}
	trial := func(s map[string]any, i int) map[string]any { return s["trials"].([]any)[i].(map[string]any) }
	same := edit(func(map[string]any) {})
	for what, trials := range map[string]string{
		"an unknown member":           edit(func(s map[string]any) { s["extra"] = 1 }),
		"no simulator":                edit(func(s map[string]any) { delete(s, "simulator") }),
		"trials null":                 edit(func(s map[string]any) { s["trials"] = nil }),
		"a step below 0":              edit(func(s map[string]any) { s["step"] = -1 }),
		"a step above u32":            edit(func(s map[string]any) { s["step"] = uint64(1) << 32 }),
		"an unknown simulator member": edit(func(s map[string]any) { s["simulator"].(map[string]any)["abi"] = 1 }),
		"verdict/1's end":             edit(func(s map[string]any) { trial(s, 0)["end"] = "fell" }),
		"a verdict member":            edit(func(s map[string]any) { trial(s, 0)["detail"] = "x" }),
		"a score as a string":         edit(func(s map[string]any) { trial(s, 1)["score"] = "1" }),
		"a score as a boolean":        edit(func(s map[string]any) { trial(s, 1)["score"] = true }),
		"fractional ticks":            edit(func(s map[string]any) { trial(s, 0)["ticks"] = 1.5 }),
		"a null trial":                edit(func(s map[string]any) { s["trials"] = append(s["trials"].([]any), nil) }),
		"an object for the list":      `{"0":` + same[1:len(same)-1] + `}`,
		"an overflowing score":        strings.Replace(same, "0.094", "1e999", 1),
	} {
		if _, err := readRecord(t, withTrials(t, byName, trials)); err == nil {
			t.Errorf("%s: read", what)
		}
	}
}

// mustMember is one member of a JSON object, raw.
func mustMember(t *testing.T, object []byte, name string) []byte {
	t.Helper()
	var g map[string]json.RawMessage
	if err := json.Unmarshal(object, &g); err != nil {
		t.Fatal(err)
	}
	return g[name]
}

// The trial helper: the request `plimsoll trial` builds.

func TestATrialIsOneTrialStepWithItsScenariosAndTrajectories(t *testing.T) {
	controller := File{Path: "c.py", Content: []byte("print(0)\n")}
	scenarios := []File{{Path: "hidden-1.json", Content: []byte("{}")}, {Path: "h2.json", Content: []byte("{}")}}
	p, err := Trial{Simulator: "tank", Controller: controller, Scenarios: scenarios, FirstDeadlineMS: 5000, Reproducible: true}.Project()
	if err != nil {
		t.Fatal(err)
	}
	// The step crates/cli/src/trial.rs's test expects for the same trial, word for word.
	want := Project{
		Files: []File{controller, scenarios[0], scenarios[1]},
		Steps: []Step{{Run: "plimsoll-trial-runner --simulator tank --scenario hidden-1.json --trajectory hidden-1.bin " +
			"--scenario h2.json --trajectory h2.bin --first-deadline-ms 5000 --reproducible -- python3 c.py"}},
		Artifacts: []string{"hidden-1.bin", "h2.bin"},
	}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("project:\n%+v\nwant\n%+v", p, want)
	}
	every, err := Trial{
		Simulator:       "motor",
		SimulatorSHA256: strings.Repeat("0f", 32),
		Controller:      File{Path: "ctl.js", Content: []byte("x")},
		Scenarios:       []File{{Path: "a,b:c=d+e@f%g_h-1.2", Content: []byte("{}")}},
		TickDeadlineMS:  250,
	}.Project()
	if err != nil {
		t.Fatal(err)
	}
	if want := "plimsoll-trial-runner --simulator motor --simulator-sha256 " + strings.Repeat("0f", 32) +
		" --scenario a,b:c=d+e@f%g_h-1.2 --trajectory a,b:c=d+e@f%g_h-1.2.bin --tick-deadline-ms 250 -- node ctl.js"; every.Steps[0].Run != want {
		t.Errorf("step %q, want %q", every.Steps[0].Run, want)
	}
	for _, name := range []string{"c.mjs", "c.cjs", "..js"} {
		p, err := Trial{Simulator: "tank", Controller: File{Path: name}, Scenarios: scenarios}.Project()
		if err != nil || !strings.HasSuffix(p.Steps[0].Run, " -- node "+name) {
			t.Errorf("%s: %v %+v", name, err, p.Steps)
		}
	}
}

func TestWhatTheRunnerCouldNotTakeIsRefusedUnsent(t *testing.T) {
	// No daemon listens there: a refusal that sent nothing is the only answer possible.
	c := New("http://127.0.0.1:9", "plm_test")
	base := func() Trial {
		return Trial{Simulator: "tank", Controller: File{Path: "c.py"}, Scenarios: []File{{Path: "s.json"}},
			MinimumIsolation: IsolationContainer}
	}
	scenarios := func(names ...string) []File {
		var out []File
		for _, n := range names {
			out = append(out, File{Path: n, Content: []byte("{}")})
		}
		return out
	}
	cases := []struct {
		edit func(*Trial)
		says string
	}{
		{func(t *Trial) { t.Scenarios = scenarios("a b.json") }, "may hold only"},
		{func(t *Trial) { t.Scenarios = scenarios("--uid=0.json") }, "not start with -"},
		{func(t *Trial) { t.Controller.Path = "-c.py" }, "not start with -"},
		{func(t *Trial) { t.Scenarios = scenarios("x/s.json") }, "may hold only"},
		{func(t *Trial) { t.Controller.Path = "c d.py" }, "may hold only"},
		{func(t *Trial) { t.Controller.Path = "" }, "may hold only"},
		{func(t *Trial) { t.Controller.Path = "é.py" }, "may hold only"},
		{func(t *Trial) { t.Scenarios = scenarios("s.json", "s.json") }, "another file of the trial is named s.json"},
		{func(t *Trial) { t.Scenarios = scenarios("c.py") }, "another file of the trial is named c.py"},
		{func(t *Trial) { t.Scenarios = scenarios("s.bin.json", "s.bin"); t.Controller.Path = "c.js" }, "would overwrite"},
		{func(t *Trial) { t.Controller.Path = "c.bin.json" }, "a .js file"},
		{func(t *Trial) { t.Controller.Path = "c.rb" }, "a .js file"},
		{func(t *Trial) { t.Controller.Path = ".py" }, "a .js file"},
		{func(t *Trial) { t.Controller.Path = "py" }, "a .js file"},
		{func(t *Trial) { t.Scenarios = nil }, "no scenario"},
		{func(t *Trial) { t.Simulator = "Tank" }, "[a-z0-9]"},
		{func(t *Trial) { t.Simulator = "" }, "[a-z0-9]"},
		{func(t *Trial) { t.Simulator = strings.Repeat("t", 65) }, "[a-z0-9]"},
		{func(t *Trial) { t.Simulator = "tank --sim x" }, "[a-z0-9]"},
		{func(t *Trial) { t.SimulatorSHA256 = "xyz" }, "64 lowercase hex"},
		{func(t *Trial) { t.SimulatorSHA256 = strings.Repeat("A", 64) }, "64 lowercase hex"},
	}
	for _, tc := range cases {
		trial := base()
		tc.edit(&trial)
		if _, err := trial.Project(); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%+v: Project: %v, want %q", trial, err, tc.says)
		}
		res, err := c.Trial(context.Background(), trial)
		var nd *NotDispatchedError
		if res != nil || !errors.As(err, &nd) || nd.Reason != ReasonRequest || nd.Status != 0 ||
			!strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "nothing was sent") {
			t.Errorf("%+v: Trial: %v", trial, err)
		}
		if !errors.Is(err, ErrInvalidRequest) || errors.Is(err, ErrMayHaveRun) {
			t.Errorf("%+v: %v is not ErrInvalidRequest", trial, err)
		}
		if reason, ok := NotDispatchedReason(err); !ok || reason != ReasonRequest {
			t.Errorf("%+v: NotDispatchedReason %q %v", trial, reason, ok)
		}
	}
}
