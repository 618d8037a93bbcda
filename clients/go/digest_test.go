// The digest encoding against every golden vector of crates/wire/tests/golden, read from the
// repository at test time, so a change to the vectors is picked up.

package sandbox

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
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

// egressAnswer is a 200 answer to sent carrying result (a vector's input, as its JSON) and
// claiming resultSHA256 for it (the vector's digest, not one computed here); the request's
// and record's digests are honest.
func egressAnswer(t *testing.T, sent *wireRequest, result json.RawMessage, resultSHA256 string) []byte {
	t.Helper()
	record := Record{RequestID: sent.RequestID, RequestSHA256: sum(encodeRequest(sent)), ResultSHA256: resultSHA256,
		Provider: "crun", Isolation: IsolationContainer, MinimumIsolation: IsolationContainer,
		EvidenceSHA256: strings.Repeat("e", 64), Environment: "sha256:" + strings.Repeat("1", 64),
		StartedUnixMS: 1, EndedUnixMS: 2}
	record.RecordSHA256 = RecordSHA256(&record)
	answer, err := json.Marshal(map[string]any{
		"protocol": 1, "request_id": sent.RequestID, "provider": "crun", "isolation": "container",
		"duration_ms": 700, "request_sha256": record.RequestSHA256, "result_sha256": resultSHA256,
		"result": result, "record": record,
	})
	if err != nil {
		t.Fatal(err)
	}
	return answer
}

func vectorNamed(t *testing.T, name string) vector {
	t.Helper()
	for _, v := range loadVectors(t) {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no golden vector %s", name)
	return vector{}
}

// A result carrying egress receipts verifies against the digest its vector gives, through the
// whole path an answer takes (strict reading, then every check).
func TestAResultWithEgressReceiptsVerifiesAgainstTheVectorsDigest(t *testing.T) {
	for _, name := range []string{"result/egress-receipts", "result/egress-receipts-nulls"} {
		v := vectorNamed(t, name)
		sent := sentWith(IsolationContainer)
		x := runExchange{sent: sent, floor: IsolationContainer, source: floorSent}
		res, err := x.answered(200, egressAnswer(t, sent, v.Input, v.SHA256))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if res.ResultSHA256 != v.SHA256 {
			t.Errorf("%s: result digest %s", name, res.ResultSHA256)
		}
		g := res.Output.Egress
		if len(g) != 4 {
			t.Fatalf("%s: %d receipts", name, len(g))
		}
		str := func(s string) *string { return &s }
		want := EgressReceipt{Host: "api.example.com", Port: 443, Kind: "connect", Address: str("93.184.215.14:443"),
			SNI: str("api.example.com"), BytesUp: 517, BytesDown: 4821, StartMS: 112, EndMS: 348, Verdict: "allowed",
			Rule: "host *.example.com port 443", Ended: str("closed")}
		if !reflect.DeepEqual(g[0], want) {
			t.Errorf("%s: the CONNECT receipt reads %+v", name, g[0])
		}
		if g[1].Kind != "http" || g[1].SNI != nil || !strings.HasSuffix(g[1].Rule, " via 10.0.0.0/8") {
			t.Errorf("%s: the http receipt reads %+v", name, g[1])
		}
		if g[2].Verdict != "refused" || g[2].Address != nil || g[2].SNI != nil || g[2].Ended != nil {
			t.Errorf("%s: the refused receipt reads %+v", name, g[2])
		}
		if g[3].Port != 0 || g[3].Rule != "bad_request" {
			t.Errorf("%s: the unparsed target reads %+v", name, g[3])
		}
	}
}

// Any change to a receipt (a time, an address, a verdict, the order, one dropped) no longer
// matches the digest the daemon gave: every member is covered.
func TestAChangedEgressReceiptFailsTheVectorsDigest(t *testing.T) {
	v := vectorNamed(t, "result/egress-receipts")
	type receipts = []map[string]any
	for what, change := range map[string]func(receipts) receipts{
		"a start time":    func(g receipts) receipts { g[0]["start_ms"] = 113; return g },
		"an end time":     func(g receipts) receipts { g[0]["end_ms"] = 349; return g },
		"the address":     func(g receipts) receipts { g[0]["address"] = "93.184.215.15:443"; return g },
		"the SNI dropped": func(g receipts) receipts { delete(g[0], "sni"); return g },
		"a verdict":       func(g receipts) receipts { g[2]["verdict"] = "allowed"; return g },
		"a port":          func(g receipts) receipts { g[3]["port"] = 1; return g },
		"the order":       func(g receipts) receipts { return receipts{g[3], g[2], g[1], g[0]} },
		"one dropped":     func(g receipts) receipts { return g[:3] },
	} {
		var result map[string]any
		dec := json.NewDecoder(strings.NewReader(string(v.Input)))
		dec.UseNumber()
		if err := dec.Decode(&result); err != nil {
			t.Fatal(err)
		}
		var g receipts
		for _, item := range result["egress"].([]any) {
			g = append(g, item.(map[string]any))
		}
		result["egress"] = change(g)
		sent := sentWith(IsolationContainer)
		x := runExchange{sent: sent, floor: IsolationContainer, source: floorSent}
		_, err := x.answered(200, egressAnswer(t, sent, encodeJSON(t, result), v.SHA256))
		var dm *DigestMismatchError
		if !errors.As(err, &dm) || dm.Which != DigestResult || dm.Claimed != v.SHA256 {
			t.Errorf("%s: %v", what, err)
		}
		if reason, ok := NotDispatchedReason(err); ok {
			t.Errorf("%s: a digest mismatch said nothing ran (%s)", what, reason)
		}
	}
}

func TestEgressReceiptsAreReadStrictlyAndNoneIsTheOldDigest(t *testing.T) {
	plain := vectorNamed(t, "result/plain")
	for _, empty := range []string{"[]", "null"} {
		var o Output
		in := strings.Replace(string(plain.Input), `"exit_code"`, `"egress":`+empty+`,"exit_code"`, 1)
		if _, err := readStrict([]byte(in), &o); err != nil {
			t.Fatalf("egress %s: %v", empty, err)
		}
		if len(o.Egress) != 0 || ResultSHA256(&o) != plain.SHA256 {
			t.Errorf("egress %s changed the result or its digest", empty)
		}
	}
	v := vectorNamed(t, "result/egress-receipts")
	var compact bytes.Buffer
	if err := json.Compact(&compact, v.Input); err != nil {
		t.Fatal(err)
	}
	for bad, says := range map[string]string{
		`"port":443,"extra":1`: "unknown member `extra`",
		`"port":65536`:         "port",
		`"port":null`:          "missing member `port`",
		`"port":443.5`:         "must be an integer",
	} {
		in := strings.Replace(compact.String(), `"port":443`, bad, 1)
		if in == compact.String() {
			t.Fatal("the vector's first receipt has no port 443")
		}
		var o Output
		if _, err := readStrict([]byte(in), &o); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
