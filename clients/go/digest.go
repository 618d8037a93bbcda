// digest.go: the request, result and record digests (docs/protocol.md, "The digest
// encoding") and the evidence digest over canonical JSON.

package sandbox

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

const (
	requestDomain = "plimsoll/run-request/v1"
	resultDomain  = "plimsoll/run-result/v1"
	recordDomain  = "plimsoll/run-record/v1"
)

// encoding builds a top-level or nested encoding: frames of field names and values.
type encoding struct{ buf []byte }

func topLevel(domain string) *encoding {
	e := &encoding{}
	e.frame([]byte(domain))
	return e
}

func (e *encoding) frame(x []byte) {
	e.buf = binary.BigEndian.AppendUint64(e.buf, uint64(len(x)))
	e.buf = append(e.buf, x...)
}

func (e *encoding) field(name string, value []byte) {
	e.frame([]byte(name))
	e.frame(value)
}

func (e *encoding) str(name, value string)    { e.field(name, []byte(value)) }
func (e *encoding) u64(name string, v uint64) { e.field(name, binary.BigEndian.AppendUint64(nil, v)) }
func (e *encoding) i64(name string, v int64) {
	e.field(name, binary.BigEndian.AppendUint64(nil, uint64(v)))
}

func (e *encoding) boolean(name string, v bool) {
	if v {
		e.field(name, []byte{1})
	} else {
		e.field(name, []byte{0})
	}
}

// list writes a list field, or nothing for an empty list.
func (e *encoding) list(name string, items [][]byte) {
	if len(items) == 0 {
		return
	}
	v := binary.BigEndian.AppendUint64(nil, uint64(len(items)))
	for _, it := range items {
		v = binary.BigEndian.AppendUint64(v, uint64(len(it)))
		v = append(v, it...)
	}
	e.field(name, v)
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// encodeRequest is the request encoding; the request_id is not part of it.
func encodeRequest(r *wireRequest) []byte {
	e := topLevel(requestDomain)
	e.u64("protocol", uint64(r.Protocol))
	if r.MinimumIsolation != "" {
		e.str("minimum_isolation", string(r.MinimumIsolation))
	}
	if r.Provider != "" {
		e.str("provider", r.Provider)
	}
	if l := r.Limits; l != nil {
		n := &encoding{}
		for _, f := range []struct {
			name string
			v    uint64
		}{{"timeout_ms", l.TimeoutMS}, {"memory_bytes", l.MemoryBytes}, {"output_bytes", l.OutputBytes},
			{"pids", l.Pids}, {"disk_bytes", l.DiskBytes}, {"artifact_bytes", l.ArtifactBytes}} {
			if f.v != 0 {
				n.u64(f.name, f.v)
			}
		}
		e.field("limits", n.buf)
	}
	run := &encoding{}
	run.str("kind", r.Run.Kind)
	if r.Run.Kind == "snippet" {
		run.str("language", string(r.Run.Language))
		code := ""
		if r.Run.Code != nil {
			code = *r.Run.Code
		}
		run.str("code", code)
	} else {
		var files, steps, artifacts [][]byte
		for _, f := range r.Run.Files {
			n := &encoding{}
			n.str("path", f.Path)
			n.field("content", f.Content)
			n.boolean("executable", f.Executable)
			files = append(files, n.buf)
		}
		for _, s := range r.Run.Steps {
			n := &encoding{}
			if s.Name != nil {
				n.str("name", *s.Name)
			}
			n.str("run", s.Run)
			steps = append(steps, n.buf)
		}
		for _, a := range r.Run.Artifacts {
			artifacts = append(artifacts, []byte(a))
		}
		run.list("files", files)
		run.list("steps", steps)
		run.list("artifacts", artifacts)
	}
	e.field("run", run.buf)
	if r.Grant != "" {
		e.str("grant", r.Grant)
	}
	// The image named (field 7), as sent; nothing when none was, so every request that names
	// none keeps its digest.
	if r.Image != "" {
		e.str("image", r.Image)
	}
	return e.buf
}

// outcome writes fields 1 to 8 of a result or a step.
func (e *encoding) outcome(exit, signal *int32, timedOut, oom bool, stdout Bytes, stdoutTrunc bool, stderr Bytes, stderrTrunc bool) {
	if exit != nil {
		e.i64("exit_code", int64(*exit))
	}
	if signal != nil {
		e.i64("signal", int64(*signal))
	}
	e.boolean("timed_out", timedOut)
	e.boolean("oom_killed", oom)
	e.field("stdout", stdout)
	e.boolean("stdout_truncated", stdoutTrunc)
	e.field("stderr", stderr)
	e.boolean("stderr_truncated", stderrTrunc)
}

// encodeResult is the result encoding; durations and latencies are not part of it.
func encodeResult(o *Output) []byte {
	e := topLevel(resultDomain)
	e.outcome(o.ExitCode, o.Signal, o.TimedOut, o.OOMKilled, o.Stdout, o.StdoutTruncated, o.Stderr, o.StderrTruncated)
	var steps, artifacts, calls [][]byte
	for _, s := range o.Steps {
		n := &encoding{}
		if s.Name != nil {
			n.str("name", *s.Name)
		}
		n.outcome(s.ExitCode, s.Signal, s.TimedOut, s.OOMKilled, s.Stdout, s.StdoutTruncated, s.Stderr, s.StderrTruncated)
		steps = append(steps, n.buf)
	}
	for _, a := range o.Artifacts {
		n := &encoding{}
		n.str("path", a.Path)
		n.boolean("found", a.Found)
		n.u64("size", a.Size)
		n.field("content", a.Content)
		n.boolean("truncated", a.Truncated)
		artifacts = append(artifacts, n.buf)
	}
	for _, c := range o.Calls {
		n := &encoding{}
		n.str("method", c.Method)
		if c.Route != nil {
			n.str("route", *c.Route)
		}
		if c.Status != nil {
			n.u64("status", uint64(*c.Status))
		}
		if c.Error != nil {
			n.str("error", *c.Error)
		}
		n.u64("request_bytes", c.RequestBytes)
		n.u64("response_bytes", c.ResponseBytes)
		// Left out when absent, so a call listed before the member existed keeps its digest.
		if c.Credential != "" {
			n.str("credential", string(c.Credential))
		}
		calls = append(calls, n.buf)
	}
	e.list("steps", steps)
	e.list("artifacts", artifacts)
	e.list("calls", calls)
	// How the sandbox started, and a warm member's age: left out when absent, so a result
	// written before the members existed keeps its digest.
	if o.Start != "" {
		e.str("start", string(o.Start))
	}
	if o.MemberAgeMS != nil {
		e.u64("member_age_ms", *o.MemberAgeMS)
	}
	// What the sandbox looked like before its code was handed over (field 14), likewise.
	if o.Wall != nil {
		e.field("wall", encodeWall(o.Wall))
	}
	// A session's cell only (fields 15 and 16), likewise left out when absent.
	if o.StateKept != nil {
		e.boolean("state_kept", *o.StateKept)
	}
	if o.InterpreterEnd != "" {
		e.str("interpreter_end", string(o.InterpreterEnd))
	}
	// The egress receipts (field 17), every member covered, the times included; nothing
	// when there are none, so a result without receipts keeps its digest.
	egress := make([][]byte, 0, len(o.Egress))
	for i := range o.Egress {
		egress = append(egress, encodeEgressReceipt(&o.Egress[i]))
	}
	e.list("egress", egress)
	return e.buf
}

// encodeEgressReceipt is an egress receipt's nested encoding (docs/protocol.md, result
// field 17).
func encodeEgressReceipt(g *EgressReceipt) []byte {
	e := &encoding{}
	e.str("host", g.Host)
	e.u64("port", uint64(g.Port))
	e.str("kind", g.Kind)
	if g.Address != nil {
		e.str("address", *g.Address)
	}
	if g.SNI != nil {
		e.str("sni", *g.SNI)
	}
	e.u64("bytes_up", g.BytesUp)
	e.u64("bytes_down", g.BytesDown)
	e.u64("start_ms", g.StartMS)
	e.u64("end_ms", g.EndMS)
	e.str("verdict", g.Verdict)
	e.str("rule", g.Rule)
	if g.Ended != nil {
		e.str("ended", *g.Ended)
	}
	return e.buf
}

// encodeWall is a wall's nested encoding (docs/protocol.md, result field 14).
func encodeWall(w *Wall) []byte {
	e := &encoding{}
	e.u64("uid", uint64(w.UID))
	e.u64("euid", uint64(w.EUID))
	e.u64("gid", uint64(w.GID))
	var groups [][]byte
	for _, g := range w.Groups {
		groups = append(groups, binary.BigEndian.AppendUint64(nil, uint64(g)))
	}
	e.list("groups", groups)
	for _, c := range []struct {
		name string
		set  *string
	}{{"cap_inh", w.CapInh}, {"cap_prm", w.CapPrm}, {"cap_eff", w.CapEff}, {"cap_bnd", w.CapBnd}, {"cap_amb", w.CapAmb}} {
		if c.set != nil {
			e.str(c.name, *c.set)
		}
	}
	if w.NoNewPrivs != nil {
		e.boolean("no_new_privs", *w.NoNewPrivs)
	}
	if w.Seccomp != nil {
		e.u64("seccomp", uint64(*w.Seccomp))
	}
	var namespaces [][]byte
	for _, n := range w.Namespaces {
		ne := &encoding{}
		ne.str("name", n.Name)
		ne.str("id", n.ID)
		if n.SameAsHost != nil {
			ne.boolean("same_as_host", *n.SameAsHost)
		}
		namespaces = append(namespaces, ne.buf)
	}
	e.list("namespaces", namespaces)
	e.boolean("root_read_only", w.RootReadOnly)
	var interfaces [][]byte
	for _, i := range w.NetworkInterfaces {
		interfaces = append(interfaces, []byte(i))
	}
	e.list("network_interfaces", interfaces)
	if w.MemoryLimitBytes != nil {
		e.u64("memory_limit_bytes", *w.MemoryLimitBytes)
	}
	if w.PidsLimit != nil {
		e.u64("pids_limit", *w.PidsLimit)
	}
	return e.buf
}

// encodeRecord is the record encoding: every member but record_sha256.
func encodeRecord(r *Record) []byte {
	e := topLevel(recordDomain)
	e.str("request_id", r.RequestID)
	e.str("request_sha256", r.RequestSHA256)
	e.str("result_sha256", r.ResultSHA256)
	e.str("provider", r.Provider)
	e.str("isolation", string(r.Isolation))
	// The applied floor, left out when absent: a record written before it existed keeps its
	// digest.
	if r.MinimumIsolation != "" {
		e.str("minimum_isolation", string(r.MinimumIsolation))
	}
	e.str("evidence_sha256", r.EvidenceSHA256)
	e.str("environment", r.Environment)
	e.u64("started_unix_ms", r.StartedUnixMS)
	e.u64("ended_unix_ms", r.EndedUnixMS)
	// A session call's link (field 11): its members as fields of the record itself, not
	// nested; nothing outside sessions, so every other record keeps its digest.
	if s := r.Session; s != nil {
		e.str("session_id", s.SessionID)
		e.u64("sequence", s.Sequence)
		if s.PreviousRecordSHA256 != "" {
			e.str("previous_record_sha256", s.PreviousRecordSHA256)
		}
	}
	// The image the code ran in (field 12), nested; nothing when absent, so a record of the
	// process tier, or written before the member existed, keeps its digest.
	if i := r.Image; i != nil {
		n := &encoding{}
		n.str("name", i.Name)
		n.str("identity", i.Identity)
		e.field("image", n.buf)
	}
	// What each trial step's verdict said (field 13), a list of nested; nothing when empty,
	// so a record of a run without trial steps keeps its digest.
	steps := make([][]byte, 0, len(r.Trials))
	for i := range r.Trials {
		steps = append(steps, encodeTrialStep(&r.Trials[i]))
	}
	e.list("trials", steps)
	// Where a restored or forked session came from (field 14), nested; nothing for a session
	// opened fresh (and outside sessions), so its records keep their digests.
	if s := r.Session; s != nil && s.Origin != nil {
		o := s.Origin
		n := &encoding{}
		n.str("start", string(o.Start))
		n.str("snapshot_sha256", o.SnapshotSHA256)
		n.str("parent_session_id", o.ParentSessionID)
		if o.ParentRecordSHA256 != "" {
			n.str("parent_record_sha256", o.ParentRecordSHA256)
		}
		n.u64("parent_calls", o.ParentCalls)
		e.field("origin", n.buf)
	}
	return e.buf
}

// encodeTrialStep is a trial step's nested encoding (docs/protocol.md, record field 13).
func encodeTrialStep(s *TrialStepRecord) []byte {
	e := &encoding{}
	e.u64("step", uint64(s.Step))
	sim := &encoding{}
	sim.str("name", s.Simulator.Name)
	sim.str("version", s.Simulator.Version)
	sim.str("sha256", s.Simulator.SHA256)
	e.field("simulator", sim.buf)
	e.boolean("pass", s.Pass)
	trials := make([][]byte, 0, len(s.Trials))
	for _, t := range s.Trials {
		n := &encoding{}
		if t.Scenario != nil {
			n.str("scenario", *t.Scenario)
		}
		n.str("end", string(t.End))
		if t.Reason != nil {
			n.str("reason", *t.Reason)
		}
		n.u64("ticks", t.Ticks)
		if t.Score != nil {
			// The IEEE 754 binary64 bits, big-endian: -0 keeps its sign.
			n.u64("score", math.Float64bits(*t.Score))
		}
		n.boolean("pass", t.Pass)
		n.str("fingerprint", t.Fingerprint)
		trials = append(trials, n.buf)
	}
	e.list("trials", trials)
	return e.buf
}

// ResultSHA256 recomputes the result digest of an output.
func ResultSHA256(o *Output) string { return sum(encodeResult(o)) }

// RecordSHA256 recomputes the record digest of a record (its RecordSHA256 is not covered).
func RecordSHA256(r *Record) string { return sum(encodeRecord(r)) }

// canonicalJSON writes a generic JSON value (as read with json.Number) in the canonical form
// of the evidence digest: no whitespace, members sorted by the UTF-8 bytes of their names,
// null members left out, minimal string escapes, integers in plain decimal.
func canonicalJSON(v any, out *strings.Builder) error {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k, item := range x {
			if item != nil {
				keys = append(keys, k)
			}
		}
		// Go compares strings bytewise: the order of their UTF-8 bytes.
		sort.Strings(keys)
		out.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				out.WriteByte(',')
			}
			canonicalString(k, out)
			out.WriteByte(':')
			if err := canonicalJSON(x[k], out); err != nil {
				return err
			}
		}
		out.WriteByte('}')
	case []any:
		out.WriteByte('[')
		for i, item := range x {
			if i > 0 {
				out.WriteByte(',')
			}
			if err := canonicalJSON(item, out); err != nil {
				return err
			}
		}
		out.WriteByte(']')
	case string:
		canonicalString(x, out)
	case bool:
		out.WriteString(strconv.FormatBool(x))
	case json.Number:
		if u, err := strconv.ParseUint(string(x), 10, 64); err == nil {
			out.WriteString(strconv.FormatUint(u, 10))
		} else if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			out.WriteString(strconv.FormatInt(i, 10))
		} else {
			return fmt.Errorf("evidence holds %s, not an integer", x)
		}
	case nil:
		out.WriteString("null") // only inside a list; members that are null are left out
	default:
		return fmt.Errorf("unexpected JSON value %T", v)
	}
	return nil
}

func canonicalString(s string, out *strings.Builder) {
	out.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			out.WriteString(`\"`)
		case '\\':
			out.WriteString(`\\`)
		case '\b':
			out.WriteString(`\b`)
		case '\f':
			out.WriteString(`\f`)
		case '\n':
			out.WriteString(`\n`)
		case '\r':
			out.WriteString(`\r`)
		case '\t':
			out.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(out, `\u%04x`, r)
			} else {
				out.WriteRune(r)
			}
		}
	}
	out.WriteByte('"')
}

// evidenceCanonical is the canonical JSON of an evidence value read as generic JSON.
func evidenceCanonical(v any) ([]byte, error) {
	var b strings.Builder
	if err := canonicalJSON(v, &b); err != nil {
		return nil, err
	}
	return []byte(b.String()), nil
}
