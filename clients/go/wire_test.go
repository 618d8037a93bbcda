// The strict reading of answers, the Bytes forms and the errors, without a daemon.

package sandbox

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

const plainResult = `{"exit_code":0,"timed_out":false,"stdout":"1\n","stdout_truncated":false,"stderr":"","stderr_truncated":false}`

func TestReadStrictRefusesWhatTheProtocolRefuses(t *testing.T) {
	for name, body := range map[string]string{
		"duplicate member":        `{"exit_code":0,"exit_code":1,"timed_out":false,"stdout":"","stdout_truncated":false,"stderr":"","stderr_truncated":false}`,
		"nested duplicate":        `{"exit_code":0,"timed_out":false,"stdout":{"base64":"AA==","base64":"AQ=="},"stdout_truncated":false,"stderr":"","stderr_truncated":false}`,
		"unknown member":          `{"exit_code":0,"timed_out":false,"stdout":"","stdout_truncated":false,"stderr":"","stderr_truncated":false,"extra":1}`,
		"member in another case":  `{"exit_code":0,"timed_out":false,"Stdout":"","stdout":"","stdout_truncated":false,"stderr":"","stderr_truncated":false}`,
		"missing required member": `{"exit_code":0,"stdout":"","stdout_truncated":false,"stderr":"","stderr_truncated":false}`,
		"required member null":    `{"exit_code":0,"timed_out":null,"stdout":"","stdout_truncated":false,"stderr":"","stderr_truncated":false}`,
		"lone surrogate":          `{"exit_code":0,"timed_out":false,"stdout":"\ud800","stdout_truncated":false,"stderr":"","stderr_truncated":false}`,
		"lone low surrogate":      `{"exit_code":0,"timed_out":false,"stdout":"a\udc00","stdout_truncated":false,"stderr":"","stderr_truncated":false}`,
		"bad base64":              `{"exit_code":0,"timed_out":false,"stdout":{"base64":"AA"},"stdout_truncated":false,"stderr":"","stderr_truncated":false}`,
		"base64 with a newline":   `{"exit_code":0,"timed_out":false,"stdout":{"base64":"AAAA\nAAAA"},"stdout_truncated":false,"stderr":"","stderr_truncated":false}`,
		"base64 unused bits":      `{"exit_code":0,"timed_out":false,"stdout":{"base64":"AB=="},"stdout_truncated":false,"stderr":"","stderr_truncated":false}`,
		"bytes object extra":      `{"exit_code":0,"timed_out":false,"stdout":{"base64":"AA==","x":1},"stdout_truncated":false,"stderr":"","stderr_truncated":false}`,
		"fractional integer":      `{"exit_code":1.0,"timed_out":false,"stdout":"","stdout_truncated":false,"stderr":"","stderr_truncated":false}`,
		"exit code out of range":  `{"exit_code":2147483648,"timed_out":false,"stdout":"","stdout_truncated":false,"stderr":"","stderr_truncated":false}`,
		"not UTF-8":               "{\"exit_code\":0,\"timed_out\":false,\"stdout\":\"\xff\",\"stdout_truncated\":false,\"stderr\":\"\",\"stderr_truncated\":false}",
		"two values":              plainResult + plainResult,
	} {
		var o Output
		if _, err := readStrict([]byte(body), &o); err == nil {
			t.Errorf("%s: read without error", name)
		}
	}
	var o Output
	if _, err := readStrict([]byte(plainResult), &o); err != nil || o.Stdout.String() != "1\n" {
		t.Fatalf("plain: %v", err)
	}
	// A valid surrogate pair is fine.
	if _, err := readStrict([]byte(strings.Replace(plainResult, `"1\n"`, `"\ud83d\ude00"`, 1)), &o); err != nil || o.Stdout.String() != "😀" {
		t.Errorf("a surrogate pair: %v %q", err, o.Stdout)
	}
}

// An optional member sent as null reads as absent, with the digest of the absent one.
func TestNullIsAbsent(t *testing.T) {
	withNulls := `{"exit_code":null,"signal":null,"timed_out":false,"oom_killed":null,"stdout":"1\n","stdout_truncated":false,"stderr":"","stderr_truncated":false,"steps":null,"artifacts":null,"calls":null}`
	without := `{"timed_out":false,"stdout":"1\n","stdout_truncated":false,"stderr":"","stderr_truncated":false}`
	var a, b Output
	if _, err := readStrict([]byte(withNulls), &a); err != nil {
		t.Fatal(err)
	}
	if _, err := readStrict([]byte(without), &b); err != nil {
		t.Fatal(err)
	}
	if ResultSHA256(&a) != ResultSHA256(&b) || a.ExitCode != nil || a.OOMKilled {
		t.Errorf("null and absent differ: %+v", a)
	}
}

func TestBytesTravelAsTextOrBase64(t *testing.T) {
	for _, tc := range []struct {
		b    Bytes
		wire string
	}{
		{Bytes("héllo\n"), `"héllo\n"`},
		{Bytes{0, 0xff, 0xfe}, `{"base64":"AP/+"}`},
		{nil, `""`},
	} {
		out, err := json.Marshal(tc.b)
		if err != nil || string(out) != tc.wire {
			t.Errorf("%v: %s %v", []byte(tc.b), out, err)
		}
		var back Bytes
		if err := json.Unmarshal(out, &back); err != nil || string(back) != string(tc.b) {
			t.Errorf("%s: back %v %v", out, []byte(back), err)
		}
	}
	var b Bytes
	if err := json.Unmarshal([]byte(`{"base64":"aMOpbGxvCg=="}`), &b); err != nil || b.String() != "héllo\n" {
		t.Errorf("base64 text: %q %v", b, err)
	}
	if got := (Bytes{'a', 0xff, 'b'}).Text(); got != "a\uFFFDb" {
		t.Errorf("Text: %q", got)
	}
}

func TestErrorsMatchTheirSentinels(t *testing.T) {
	for _, r := range Reasons {
		e := &NotDispatchedError{Reason: r, Message: "m"}
		if !errors.Is(e, ErrNotDispatched) || !errors.Is(e, ReasonError(r)) || errors.Is(e, ErrMayHaveRun) {
			t.Errorf("%s: sentinels", r)
		}
		if got, ok := NotDispatchedReason(e); !ok || got != r {
			t.Errorf("%s: NotDispatchedReason %q %v", r, got, ok)
		}
		for _, other := range Reasons {
			if other != r && errors.Is(e, ReasonError(other)) {
				t.Errorf("%s matches %s", r, other)
			}
		}
	}
	if !errors.Is(&NotDispatchedError{Reason: ReasonIsolation}, ErrInsufficientIsolation) {
		t.Error("isolation is not ErrInsufficientIsolation")
	}
	if _, ok := NotDispatchedReason(nil); ok {
		t.Error("nil reads not dispatched")
	}
	mayHaveRun := []error{
		&MayHaveRunError{Code: "transport"},
		&EvidenceMismatchError{Isolation: IsolationProcess, Floor: IsolationVM},
		&ProviderMismatchError{},
		&DigestMismatchError{Which: DigestResult},
		&RecordMismatchError{},
	}
	for _, e := range mayHaveRun {
		if !errors.Is(e, ErrMayHaveRun) || errors.Is(e, ErrNotDispatched) {
			t.Errorf("%T: sentinels", e)
		}
		if _, ok := NotDispatchedReason(e); ok {
			t.Errorf("%T reads not dispatched", e)
		}
	}
	// Wrapped by the caller, the promise is still readable.
	wrapped := wrap(&NotDispatchedError{Reason: ReasonCapacity, Err: &RequestTooLargeError{}})
	if r, ok := NotDispatchedReason(wrapped); !ok || r != ReasonCapacity || !errors.Is(wrapped, ErrCapacity) || !errors.Is(wrapped, ErrRequestTooLarge) {
		t.Errorf("wrapped: %v", wrapped)
	}
}

type wrapped struct{ err error }

func (w wrapped) Error() string { return "tool: " + w.err.Error() }
func (w wrapped) Unwrap() error { return w.err }
func wrap(err error) error      { return wrapped{err} }

func TestTiersAreOrdered(t *testing.T) {
	for i, floor := range Isolations {
		for j, tier := range Isolations {
			if tier.AtLeast(floor) != (j >= i) {
				t.Errorf("%s at least %s: %v", tier, floor, tier.AtLeast(floor))
			}
		}
	}
	if Isolation("gpu").Valid() || Isolation("gpu").AtLeast(IsolationProcess) || IsolationVM.AtLeast("") {
		t.Error("a string that is not a tier compares")
	}
}

// The body sent puts request_id before run, leaves absent members out and sends no null.
func TestTheBodySent(t *testing.T) {
	w, err := RunRequest{Run: Project{Files: []File{{Path: "a", Content: []byte{0xff}}}, Steps: []Step{{Run: "cat a"}}},
		MinimumIsolation: IsolationContainer}.toWire("id-1")
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"protocol":1,"request_id":"id-1","minimum_isolation":"container","run":{"kind":"project","files":[{"path":"a","content":{"base64":"/w=="}}],"steps":[{"run":"cat a"}]}}`
	if string(body) != want {
		t.Errorf("body\n got %s\nwant %s", body, want)
	}
}
