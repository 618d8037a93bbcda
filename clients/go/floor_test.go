// The record's applied floor and the null rule, without a daemon: the cases a real daemon
// never sends but a party in the middle could.

package sandbox

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// honest is a 200 answer to sent whose digests and record all agree, with the record's
// applied floor set to applied ("" leaves it out).
func honest(t *testing.T, sent *wireRequest, tier, applied Isolation) *Result {
	t.Helper()
	var o Output
	if _, err := readStrict([]byte(plainResult), &o); err != nil {
		t.Fatal(err)
	}
	res := &Result{Protocol: Protocol, RequestID: sent.RequestID, Provider: "p", Isolation: tier, DurationMS: 1,
		RequestSHA256: sum(encodeRequest(sent)), ResultSHA256: ResultSHA256(&o), Output: o}
	res.Record = Record{RequestID: sent.RequestID, RequestSHA256: res.RequestSHA256, ResultSHA256: res.ResultSHA256,
		Provider: "p", Isolation: tier, MinimumIsolation: applied, EvidenceSHA256: strings.Repeat("e", 64),
		Environment: "test", StartedUnixMS: 1, EndedUnixMS: 2}
	res.Record.RecordSHA256 = RecordSHA256(&res.Record)
	return res
}

func encodeJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sentWith(floor Isolation) *wireRequest {
	code := "console.log(1)"
	return &wireRequest{Protocol: Protocol, RequestID: "r-1", MinimumIsolation: floor,
		Run: wireRun{Kind: "snippet", Language: JavaScript, Code: &code}}
}

func TestTheRecordsAppliedFloorIsChecked(t *testing.T) {
	sent := sentWith(IsolationProcess)
	if _, err := verify(sent, IsolationProcess, floorSent, honest(t, sent, IsolationProcess, IsolationProcess)); err != nil {
		t.Fatalf("an honest answer: %v", err)
	}
	// Absent: a daemon older than this client, or one that hides the floor it applied.
	_, err := verify(sent, IsolationProcess, floorSent, honest(t, sent, IsolationProcess, ""))
	var mh *MayHaveRunError
	if !errors.As(err, &mh) || mh.Code != "bad_response" || !strings.Contains(err.Error(), "minimum_isolation") {
		t.Errorf("absent: %v", err)
	}
	// Lowered below the floor sent: the tier still meets it, the record does not agree.
	container := sentWith(IsolationContainer)
	_, err = verify(container, IsolationContainer, floorSent, honest(t, container, IsolationContainer, IsolationProcess))
	var rm *RecordMismatchError
	if !errors.As(err, &rm) || rm.Field != "minimum_isolation" || rm.Response != "container" || rm.Record != "process" || rm.Against != "the floor sent" {
		t.Errorf("lowered: %v", err)
	}
	// Raised above the tier that ran.
	_, err = verify(sent, IsolationProcess, floorSent, honest(t, sent, IsolationProcess, IsolationKernel))
	var em *EvidenceMismatchError
	if !errors.As(err, &em) || !em.AppliedFloor || em.Floor != IsolationKernel {
		t.Errorf("raised: %v", err)
	}
	// None sent: it must be the daemon's default floor this client learnt.
	none := sentWith("")
	if _, err := verify(none, IsolationContainer, floorDefault, honest(t, none, IsolationContainer, IsolationContainer)); err != nil {
		t.Errorf("the default floor: %v", err)
	}
	_, err = verify(none, IsolationContainer, floorDefault, honest(t, none, IsolationVM, IsolationVM))
	if !errors.As(err, &rm) || rm.Field != "minimum_isolation" || rm.Response != "container" || !strings.Contains(err.Error(), "default floor") {
		t.Errorf("another floor than the default: %v", err)
	}
}

func TestTheAppliedFloorIsReadAndCoveredByTheRecordDigest(t *testing.T) {
	base := honest(t, sentWith(IsolationContainer), IsolationContainer, IsolationContainer).Record
	other := base
	other.MinimumIsolation = IsolationProcess
	if RecordSHA256(&other) == RecordSHA256(&base) {
		t.Error("the applied floor is not covered by the record digest")
	}
	older := base
	older.MinimumIsolation = ""
	var r Record
	withNull := strings.Replace(string(encodeJSON(t, base)), `"minimum_isolation":"container"`, `"minimum_isolation":null`, 1)
	if _, err := readStrict([]byte(withNull), &r); err != nil || r.MinimumIsolation != "" || RecordSHA256(&r) != RecordSHA256(&older) {
		t.Errorf("null: %v %+v", err, r)
	}
	bad := strings.Replace(withNull, `"minimum_isolation":null`, `"minimum_isolation":"strong"`, 1)
	if _, err := readStrict([]byte(bad), &r); err == nil {
		t.Error("a floor that is not a tier was read")
	}
	bad = strings.Replace(withNull, `"isolation":"container"`, `"isolation":null`, 1)
	if _, err := readStrict([]byte(bad), &r); err == nil || !strings.Contains(err.Error(), "isolation") {
		t.Errorf("a null tier: %v", err)
	}
}

// Each vector with nulls at every depth reads as the same value as its twin without them.
func TestNullsAtEveryDepthReadAsTheirTwins(t *testing.T) {
	byName := map[string]vector{}
	for _, v := range loadVectors(t) {
		byName[v.Name] = v
	}
	read := func(name string, into any) {
		v, ok := byName[name]
		if !ok {
			t.Fatalf("no vector %s", name)
		}
		if _, err := readStrict(v.Input, into); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	var a, b Output
	read("result/nested-nulls", &a)
	read("result/defaults", &b)
	if !reflect.DeepEqual(a, b) {
		t.Errorf("results differ:\n%+v\n%+v", a, b)
	}
	var ra, rb Record
	read("record/null-floor", &ra)
	read("record/plain", &rb)
	if !reflect.DeepEqual(ra, rb) {
		t.Errorf("records differ:\n%+v\n%+v", ra, rb)
	}
	var qa, qb wireRequest
	read("request/project-nested-nulls", &qa)
	read("request/project-defaults", &qb)
	qa.RequestID, qb.RequestID = "", ""
	if !reflect.DeepEqual(qa, qb) {
		t.Errorf("requests differ:\n%+v\n%+v", qa, qb)
	}
}

// A result's start is read (null as absent), and a member age without a warm start, or a
// warm start without one, is a bad response.
func TestTheStartIsReadAndAMemberAgeNeedsAWarmStart(t *testing.T) {
	sent := sentWith(IsolationProcess)
	with := func(start Start, age *uint64) *Result {
		res := honest(t, sent, IsolationProcess, IsolationProcess)
		res.Output.Start, res.Output.MemberAgeMS = start, age
		res.ResultSHA256 = ResultSHA256(&res.Output)
		res.Record.ResultSHA256 = res.ResultSHA256
		res.Record.RecordSHA256 = RecordSHA256(&res.Record)
		return res
	}
	age := uint64(1500)
	for _, ok := range []*Result{with(StartWarm, &age), with(StartCold, nil), with("", nil)} {
		if _, err := verify(sent, IsolationProcess, floorSent, ok); err != nil {
			t.Errorf("start %q, age %v: %v", ok.Output.Start, ok.Output.MemberAgeMS, err)
		}
	}
	for _, bad := range []struct {
		res  *Result
		says string
	}{
		{with("", &age), "`start` is absent"},
		{with(StartCold, &age), "`start` is \"cold\""},
		{with(StartWarm, nil), "`member_age_ms` is absent"},
	} {
		_, err := verify(sent, IsolationProcess, floorSent, bad.res)
		var mh *MayHaveRunError
		if !errors.As(err, &mh) || mh.Code != "bad_response" || !strings.Contains(err.Error(), "malformed") || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("%s: %v", bad.says, err)
		}
	}
	var o Output
	warm := strings.Replace(plainResult, `"exit_code"`, `"start":"warm","member_age_ms":1500,"exit_code"`, 1)
	if _, err := readStrict([]byte(warm), &o); err != nil || o.Start != StartWarm || o.MemberAgeMS == nil || *o.MemberAgeMS != 1500 {
		t.Errorf("warm: %v %+v", err, o)
	}
	o = Output{}
	null := strings.Replace(plainResult, `"exit_code"`, `"start":null,"member_age_ms":null,"exit_code"`, 1)
	if _, err := readStrict([]byte(null), &o); err != nil || o.Start != "" || o.MemberAgeMS != nil {
		t.Errorf("null: %v %+v", err, o)
	}
	hot := strings.Replace(plainResult, `"exit_code"`, `"start":"hot","exit_code"`, 1)
	if _, err := readStrict([]byte(hot), &o); err == nil || !strings.Contains(err.Error(), "not a start") {
		t.Errorf("a start that is neither warm nor cold: %v", err)
	}
}

const wallJSON = `{"uid":2000100,"euid":2000100,"gid":2000100,"cap_eff":"0000000000000000",` +
	`"no_new_privs":true,"seccomp":2,"namespaces":[{"name":"net","id":"net:[4026532302]","same_as_host":false}],` +
	`"root_read_only":true,"network_interfaces":["lo"],"memory_limit_bytes":268435456}`

func withWall(wall string) string {
	return strings.Replace(plainResult, `"exit_code"`, `"start":"cold","wall":`+wall+`,"exit_code"`, 1)
}

func TestTheWallIsReadStrictlyAndCoveredByTheResultDigest(t *testing.T) {
	var o Output
	if _, err := readStrict([]byte(withWall(wallJSON)), &o); err != nil || o.Wall == nil {
		t.Fatalf("a wall: %v %+v", err, o)
	}
	w := o.Wall
	if w.UID != 2000100 || w.Seccomp == nil || *w.Seccomp != 2 || w.NoNewPrivs == nil || !*w.NoNewPrivs ||
		len(w.Namespaces) != 1 || w.Namespaces[0].SameAsHost == nil || *w.Namespaces[0].SameAsHost ||
		w.CapAmb != nil || w.PidsLimit != nil || len(w.Groups) != 0 || !w.RootReadOnly {
		t.Errorf("read as %+v", w)
	}
	digest := ResultSHA256(&o)
	var nulls Output
	nullWall := strings.Replace(wallJSON, `"uid"`, `"cap_amb":null,"pids_limit":null,"groups":null,"uid"`, 1)
	if _, err := readStrict([]byte(withWall(nullWall)), &nulls); err != nil || ResultSHA256(&nulls) != digest {
		t.Errorf("null members did not digest as absent: %v", err)
	}
	changed := o
	other := *o.Wall
	other.UID = 0
	changed.Wall = &other
	if ResultSHA256(&changed) == digest {
		t.Error("the wall's uid is not covered by the result digest")
	}
	changed.Wall = nil
	if ResultSHA256(&changed) == digest {
		t.Error("the wall is not covered by the result digest")
	}
	for _, bad := range []struct{ wall, says string }{
		{strings.Replace(wallJSON, `"uid"`, `"extra":1,"uid"`, 1), "unknown member `extra`"},
		{strings.Replace(wallJSON, `,"root_read_only":true`, ``, 1), "missing member `root_read_only`"},
		{strings.Replace(wallJSON, `"uid":2000100`, `"uid":4294967296`, 1), "uid"},
		{strings.Replace(wallJSON, `"euid"`, `"groups":[-1],"euid"`, 1), "groups"},
		{strings.Replace(wallJSON, `,"id":"net:[4026532302]"`, ``, 1), "missing member `id`"},
		{strings.Replace(wallJSON, `"no_new_privs":true`, `"no_new_privs":"yes"`, 1), "no_new_privs"},
	} {
		var o Output
		if _, err := readStrict([]byte(withWall(bad.wall)), &o); err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("%s: %v", bad.says, err)
		}
	}
}
