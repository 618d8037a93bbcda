// The digest encoding against every golden vector of crates/wire/tests/golden, read from the
// repository at test time, so a change to the vectors is picked up.

package sandbox

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const vectorsPath = "../../crates/wire/tests/golden/vectors.json"

type vector struct {
	Name          string          `json:"name"`
	Kind          string          `json:"kind"`
	Note          string          `json:"note"`
	Input         json.RawMessage `json:"input"`
	EncodingHex   string          `json:"encoding_hex"`
	CanonicalJSON string          `json:"canonical_json"`
	SHA256        string          `json:"sha256"`
	SameDigestAs  *string         `json:"same_digest_as"`
}

func loadVectors(t *testing.T) []vector {
	t.Helper()
	data, err := os.ReadFile(filepath.FromSlash(vectorsPath))
	if err != nil {
		t.Fatalf("cannot read the golden vectors (%v): run the tests from clients/go in the repository", err)
	}
	var file struct {
		Vectors []vector `json:"vectors"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatalf("the golden vectors do not parse: %v", err)
	}
	if len(file.Vectors) == 0 {
		t.Fatal("no golden vectors")
	}
	return file.Vectors
}

// encodeVector computes the encoding of a vector's input with this client's code.
func encodeVector(t *testing.T, v vector) []byte {
	t.Helper()
	switch v.Kind {
	case "request":
		var r wireRequest
		if _, err := readStrict(v.Input, &r); err != nil {
			t.Fatalf("%s: input does not read: %v", v.Name, err)
		}
		return encodeRequest(&r)
	case "result":
		var o Output
		if _, err := readStrict(v.Input, &o); err != nil {
			t.Fatalf("%s: input does not read: %v", v.Name, err)
		}
		return encodeResult(&o)
	case "record":
		var r Record
		if _, err := readStrict(v.Input, &r); err != nil {
			t.Fatalf("%s: input does not read: %v", v.Name, err)
		}
		if got := RecordSHA256(&r); got != sum(encodeRecord(&r)) {
			t.Fatalf("RecordSHA256 disagrees with the encoding")
		}
		return encodeRecord(&r)
	case "evidence":
		var e Evidence
		generic, err := readStrict(v.Input, &e)
		if err != nil {
			t.Fatalf("%s: input does not read: %v", v.Name, err)
		}
		canonical, err := evidenceCanonical(generic)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		if string(canonical) != v.CanonicalJSON {
			t.Errorf("%s: canonical JSON\n got %s\nwant %s", v.Name, canonical, v.CanonicalJSON)
		}
		return canonical
	}
	t.Fatalf("%s: unknown vector kind %q", v.Name, v.Kind)
	return nil
}

func TestEveryGoldenVector(t *testing.T) {
	vectors := loadVectors(t)
	byName := map[string]vector{}
	for _, v := range vectors {
		byName[v.Name] = v
	}
	kinds := map[string]int{}
	for _, v := range vectors {
		v := v
		kinds[v.Kind]++
		t.Run(v.Name, func(t *testing.T) {
			enc := encodeVector(t, v)
			if got := hex.EncodeToString(enc); got != v.EncodingHex {
				t.Errorf("encoding\n got %s\nwant %s", got, v.EncodingHex)
			}
			if got := sum(enc); got != v.SHA256 {
				t.Errorf("sha256 got %s, want %s", got, v.SHA256)
			}
			if v.SameDigestAs != nil {
				other, ok := byName[*v.SameDigestAs]
				if !ok {
					t.Fatalf("same_digest_as names %q, which is not a vector", *v.SameDigestAs)
				}
				if v.SHA256 != other.SHA256 {
					t.Errorf("vector says its digest equals %s's, but the file's digests differ", other.Name)
				}
			}
		})
	}
	for _, k := range []string{"request", "result", "record", "evidence"} {
		if kinds[k] == 0 {
			t.Errorf("no %s vector in %s", k, vectorsPath)
		}
	}
	t.Logf("%d golden vectors checked", len(vectors))
}

// The worked example of docs/protocol.md, byte for byte.
func TestWorkedExample(t *testing.T) {
	code := "print(1)"
	r := wireRequest{Protocol: 1, RequestID: "r-1", Run: wireRun{Kind: "snippet", Language: Python, Code: &code}}
	enc := encodeRequest(&r)
	if len(enc) != 167 {
		t.Errorf("the encoding is %d bytes, the document says 167", len(enc))
	}
	if got := sum(enc); got != "3ecb51db6b7614d58c732f7e7f49fcd72edb1b21e366f985f1ba93a2069b53bc" {
		t.Errorf("request_sha256 %s", got)
	}
	// The request id is not part of the digest.
	r.RequestID = "something-else"
	if sum(encodeRequest(&r)) != sum(enc) {
		t.Error("the request id changed the digest")
	}
	// "limits": {} is a present, empty field.
	r.Limits = &Limits{}
	if sum(encodeRequest(&r)) == sum(enc) {
		t.Error("an empty limits object left the digest alone")
	}
}

// A step's duration and a call's latency are outside the result digest; everything else is in.
func TestResultDigestCoversWhatItShould(t *testing.T) {
	zero := int32(0)
	base := func() Output {
		return Output{ExitCode: &zero, Stdout: Bytes("x"), Steps: []StepOutput{{ExitCode: &zero, DurationMS: 5}},
			Calls: []GrantCall{{Method: "GET", LatencyMS: 1}}}
	}
	o := base()
	d := ResultSHA256(&o)
	o.Steps[0].DurationMS = 500
	o.Calls[0].LatencyMS = 9
	if ResultSHA256(&o) != d {
		t.Error("a duration or latency changed the result digest")
	}
	for name, change := range map[string]func(*Output){
		"exit code": func(o *Output) { one := int32(1); o.ExitCode = &one },
		"no exit":   func(o *Output) { o.ExitCode = nil },
		"stdout":    func(o *Output) { o.Stdout = Bytes("y") },
		"oom":       func(o *Output) { o.OOMKilled = true },
		"steps":     func(o *Output) { o.Steps = nil },
		"call":      func(o *Output) { s := uint16(200); o.Calls[0].Status = &s },
		"start":     func(o *Output) { o.Start = StartCold },
		"member age": func(o *Output) {
			age := uint64(0)
			o.Start, o.MemberAgeMS = StartWarm, &age
		},
	} {
		o := base()
		change(&o)
		if ResultSHA256(&o) == d {
			t.Errorf("changing the %s left the result digest alone", name)
		}
	}
}

// A warm start's member age is covered on its own: two warm results that differ only in it
// have different digests.
func TestTheMemberAgeIsCovered(t *testing.T) {
	one, two := uint64(1500), uint64(1501)
	a := Output{Start: StartWarm, MemberAgeMS: &one}
	b := Output{Start: StartWarm, MemberAgeMS: &two}
	if ResultSHA256(&a) == ResultSHA256(&b) {
		t.Error("member_age_ms is not covered by the result digest")
	}
}

func TestTheCallsCredentialKindIsReadStrictlyAndCovered(t *testing.T) {
	call := func(kind string) string {
		c := `{"method":"GET","request_bytes":0,"response_bytes":2,"latency_ms":1`
		if kind != "" {
			c += `,"credential":` + kind
		}
		return strings.Replace(plainResult, `"exit_code"`, `"calls":[`+c+`}],"exit_code"`, 1)
	}
	digests := map[string]string{}
	for _, kind := range []string{"", "null", `"static"`, `"minted"`} {
		var o Output
		if _, err := readStrict([]byte(call(kind)), &o); err != nil {
			t.Fatalf("credential %s: %v", kind, err)
		}
		digests[kind] = ResultSHA256(&o)
	}
	if digests[""] != digests["null"] {
		t.Error("a null credential is not the same as an absent one")
	}
	if digests[`"static"`] == digests[""] || digests[`"static"`] == digests[`"minted"`] {
		t.Error("the credential kind is not covered by the result digest")
	}
	var o Output
	if _, err := readStrict([]byte(call(`"borrowed"`)), &o); err == nil || !strings.Contains(err.Error(), "not a credential kind") {
		t.Errorf("a credential kind that is neither static nor minted: %v", err)
	}
}
