// wire.go: the request as it travels, its checks before sending, and the strict reading of
// answers (no duplicate or unknown members, required members present, null read as absent).

package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode/utf8"
)

// wireRequest is the body of POST /v1/runs. Members are declared in the order they are
// sent: request_id before run, so that a refusal of a body the daemon does not read whole
// (401, 413) still echoes it.
type wireRequest struct {
	Protocol         uint32    `json:"protocol"`
	RequestID        string    `json:"request_id"`
	MinimumIsolation Isolation `json:"minimum_isolation,omitempty"`
	Provider         string    `json:"provider,omitempty"`
	Limits           *Limits   `json:"limits,omitempty"`
	Run              wireRun   `json:"run"`
	Grant            string    `json:"grant,omitempty"`
	Image            string    `json:"image,omitempty"`
}

// wireRun is a RunSpec as it travels: `kind` first, then the members of that kind.
type wireRun struct {
	Kind      string     `json:"kind"`
	Language  Language   `json:"language,omitempty"`
	Code      *string    `json:"code,omitempty"`
	Files     []wireFile `json:"files,omitempty"`
	Steps     []wireStep `json:"steps,omitempty"`
	Artifacts []string   `json:"artifacts,omitempty"`
}

type wireFile struct {
	Path       string `json:"path"`
	Content    Bytes  `json:"content"`
	Executable bool   `json:"executable,omitempty"`
}

type wireStep struct {
	Name *string `json:"name,omitempty"`
	Run  string  `json:"run"`
}

// wireError is any answer that is not a run response.
type wireError struct {
	Protocol  uint32  `json:"protocol"`
	RequestID *string `json:"request_id"`
	Error     struct {
		Code          string  `json:"code"`
		Message       string  `json:"message"`
		NotDispatched *Reason `json:"not_dispatched"`
		// EndReason: for a call to a session that has ended, why it ended.
		EndReason EndReason `json:"end_reason,omitempty"`
	} `json:"error"`
}

// wireSessionOpen is the body of POST /v1/sessions; request_id before the rest, as a run's.
type wireSessionOpen struct {
	Protocol         uint32    `json:"protocol"`
	RequestID        string    `json:"request_id"`
	Language         Language  `json:"language"`
	MinimumIsolation Isolation `json:"minimum_isolation,omitempty"`
	Provider         string    `json:"provider,omitempty"`
	Grant            string    `json:"grant,omitempty"`
	Limits           *Limits   `json:"limits,omitempty"`
	IdleTimeoutMS    uint64    `json:"idle_timeout_ms,omitempty"`
	MaxLifetimeMS    uint64    `json:"max_lifetime_ms,omitempty"`
	Image            string    `json:"image,omitempty"`
}

// validate makes the checks the daemon makes on an open before anything starts.
func (w wireSessionOpen) validate() error {
	if w.Language != JavaScript && w.Language != Python {
		return fmt.Errorf("language `%s` is not one of javascript, python", w.Language)
	}
	if w.MinimumIsolation != "" && !w.MinimumIsolation.Valid() {
		return fmt.Errorf("minimum_isolation `%s` is not a tier: use IsolationProcess, IsolationContainer, IsolationKernel or IsolationVM", w.MinimumIsolation)
	}
	if !utf8.ValidString(w.Provider) {
		return errors.New("provider is not valid UTF-8")
	}
	if !utf8.ValidString(w.Grant) {
		return errors.New("grant is not valid UTF-8")
	}
	if w.Image != "" {
		return validateImage(w.Image)
	}
	return nil
}

// wireSnapshotRequest is the body of POST /v1/sessions/{id}/snapshot.
type wireSnapshotRequest struct {
	Protocol  uint32 `json:"protocol"`
	RequestID string `json:"request_id"`
}

// wireForkRequest is the body of POST /v1/sessions/{id}/fork.
type wireForkRequest struct {
	Protocol  uint32 `json:"protocol"`
	RequestID string `json:"request_id"`
	Count     uint32 `json:"count"`
}

// wireSnapshotOpen is the body of POST /v1/snapshots/{id}/sessions.
type wireSnapshotOpen struct {
	Protocol  uint32 `json:"protocol"`
	RequestID string `json:"request_id"`
	SHA256    string `json:"sha256,omitempty"`
}

// streamLine is one line of a streamed answer (application/x-ndjson): exactly one member.
type streamLine struct {
	Chunk    *streamChunk    `json:"chunk,omitempty"`
	Response json.RawMessage `json:"response,omitempty"`
	Error    json.RawMessage `json:"error,omitempty"`
}

// streamChunk is output as it came: a preview, in no digest.
type streamChunk struct {
	Preview bool         `json:"preview"`
	Stream  OutputStream `json:"stream"`
	Offset  uint64       `json:"offset"`
	Bytes   Bytes        `json:"bytes"`
}

// toWire turns a request into its wire form with this id, or says why it has none (the
// checks of its members are validate's).
func (r RunRequest) toWire(id string) (wireRequest, error) {
	w := wireRequest{
		Protocol:         Protocol,
		RequestID:        id,
		MinimumIsolation: r.MinimumIsolation,
		Provider:         r.Provider,
		Limits:           r.Limits,
		Grant:            r.Grant,
		Image:            r.Image,
	}
	switch spec := r.Run.(type) {
	case Snippet:
		w.Run = snippetWire(spec)
	case *Snippet:
		if spec == nil {
			return w, errors.New("run is a nil *Snippet: set Run to a Snippet or a Project")
		}
		w.Run = snippetWire(*spec)
	case Project:
		w.Run = projectWire(spec)
	case *Project:
		if spec == nil {
			return w, errors.New("run is a nil *Project: set Run to a Snippet or a Project")
		}
		w.Run = projectWire(*spec)
	case nil:
		return w, errors.New("run is missing: set Run to a Snippet or a Project")
	default:
		return w, fmt.Errorf("run is a %T: set Run to a Snippet or a Project", spec)
	}
	return w, nil
}

func snippetWire(s Snippet) wireRun {
	code := s.Code
	return wireRun{Kind: "snippet", Language: s.Language, Code: &code}
}

func projectWire(p Project) wireRun {
	w := wireRun{Kind: "project", Artifacts: p.Artifacts}
	for _, f := range p.Files {
		w.Files = append(w.Files, wireFile{Path: f.Path, Content: Bytes(f.Content), Executable: f.Executable})
	}
	for _, s := range p.Steps {
		step := wireStep{Run: s.Run}
		if s.Name != "" {
			name := s.Name
			step.Name = &name
		}
		w.Steps = append(w.Steps, step)
	}
	return w
}

// validate makes the checks a daemon makes before anything runs, so that a request it would
// refuse is refused here, unsent.
func (w wireRequest) validate() error { return w.check(true) }

// validateSessionCall is validate for a call in a session, where a project may have no
// step when it writes files or reads artifacts (an upload, a download).
func (w wireRequest) validateSessionCall() error { return w.check(false) }

func (w wireRequest) check(stepsRequired bool) error {
	texts := []struct{ where, text string }{
		{"provider", w.Provider}, {"grant", w.Grant}, {"minimum_isolation", string(w.MinimumIsolation)},
	}
	if w.MinimumIsolation != "" && !w.MinimumIsolation.Valid() {
		return fmt.Errorf("minimum_isolation `%s` is not a tier: use IsolationProcess, IsolationContainer, IsolationKernel or IsolationVM", w.MinimumIsolation)
	}
	if w.Image != "" {
		if err := validateImage(w.Image); err != nil {
			return err
		}
	}
	switch w.Run.Kind {
	case "snippet":
		if w.Run.Language != JavaScript && w.Run.Language != Python {
			return fmt.Errorf("language `%s` is not one of javascript, python", w.Run.Language)
		}
		if strings.TrimSpace(*w.Run.Code) == "" {
			return errors.New("run.code is empty: send the code to run")
		}
		texts = append(texts, struct{ where, text string }{"run.code", *w.Run.Code})
	case "project":
		if len(w.Run.Steps) == 0 && (stepsRequired || (len(w.Run.Files) == 0 && len(w.Run.Artifacts) == 0)) {
			return errors.New("run.steps is empty: a project needs at least one step")
		}
		for i, s := range w.Run.Steps {
			if strings.TrimSpace(s.Run) == "" {
				return fmt.Errorf("run.steps[%d].run is empty", i)
			}
			where := fmt.Sprintf("run.steps[%d]", i)
			texts = append(texts, struct{ where, text string }{where + ".run", s.Run})
			if s.Name != nil {
				texts = append(texts, struct{ where, text string }{where + ".name", *s.Name})
			}
		}
		seen := map[string]bool{}
		for i, f := range w.Run.Files {
			if err := validatePath(f.Path); err != nil {
				return fmt.Errorf("run.files[%d]: %w", i, err)
			}
			if seen[f.Path] {
				return fmt.Errorf("run.files: `%s` appears twice", f.Path)
			}
			seen[f.Path] = true
		}
		for i, a := range w.Run.Artifacts {
			if err := validatePath(a); err != nil {
				return fmt.Errorf("run.artifacts[%d]: %w", i, err)
			}
		}
	}
	// JSON strings are Unicode: invalid UTF-8 would be replaced on the way out, and the
	// daemon would run something else than what was asked. (File contents are Bytes, which
	// travel as base64 when they are not UTF-8.)
	for _, t := range texts {
		if !utf8.ValidString(t.text) {
			return fmt.Errorf("%s is not valid UTF-8: send text (file contents may be any bytes)", t.where)
		}
	}
	return nil
}

// validatePath checks a project path: relative to /work, `/`-separated, at most 4096 bytes,
// no empty, `.` or `..` segment, no NUL, no backslash, valid UTF-8.
func validatePath(p string) error {
	bad := p == "" || len(p) > 4096 || strings.HasPrefix(p, "/") ||
		strings.ContainsAny(p, "\x00\\") || !utf8.ValidString(p)
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			bad = true
		}
	}
	if bad {
		return fmt.Errorf("path %q must be relative to /work, with no empty, `.` or `..` segments, no NUL and no backslash", p)
	}
	return nil
}

// readStrict decodes one JSON answer into v (a pointer to a wire type) the way the protocol
// reads: valid UTF-8 with no lone surrogate escape, no duplicate member names, no unknown
// members (names matched exactly, case included: encoding/json alone matches them without
// case), every required member present and not null. An optional member sent as null reads
// as absent. It also returns the value as generic JSON (numbers as json.Number).
func readStrict(data []byte, v any) (any, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("the body is not valid UTF-8")
	}
	if err := checkSurrogates(data); err != nil {
		return nil, err
	}
	if err := checkDuplicates(data); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("more than one JSON value in the body")
	}
	if err := checkShape(generic, reflect.TypeOf(v).Elem(), "answer"); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return nil, err
	}
	return generic, nil
}

var unmarshalerType = reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()

// checkShape walks a generic JSON value beside the Go type it decodes into. A struct field
// is required unless it is a pointer or tagged omitempty.
func checkShape(value any, t reflect.Type, where string) error {
	if t.Kind() == reflect.Ptr {
		if value == nil {
			return nil
		}
		return checkShape(value, t.Elem(), where)
	}
	if reflect.PtrTo(t).Implements(unmarshalerType) {
		return nil // Bytes, Isolation, Reason check themselves
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := value.(map[string]any)
		if !ok {
			return fmt.Errorf("%s must be an object", where)
		}
		known := map[string]bool{}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			name, opts, _ := strings.Cut(tag, ",")
			if name == "" || name == "-" {
				continue
			}
			known[name] = true
			member, present := obj[name]
			required := f.Type.Kind() != reflect.Ptr && !strings.Contains(opts, "omitempty")
			if required && (!present || member == nil) {
				return fmt.Errorf("%s: missing member `%s`", where, name)
			}
			if present && member != nil {
				if err := checkShape(member, f.Type, where+"."+name); err != nil {
					return err
				}
			}
		}
		for name := range obj {
			if !known[name] {
				return fmt.Errorf("%s: unknown member `%s`", where, name)
			}
		}
	case reflect.Slice:
		arr, ok := value.([]any)
		if !ok {
			return fmt.Errorf("%s must be a list", where)
		}
		for i, item := range arr {
			if err := checkShape(item, t.Elem(), fmt.Sprintf("%s[%d]", where, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		obj, ok := value.(map[string]any)
		if !ok {
			return fmt.Errorf("%s must be an object", where)
		}
		for k, item := range obj {
			if err := checkShape(item, t.Elem(), where+"."+k); err != nil {
				return err
			}
		}
	case reflect.String:
		if _, ok := value.(string); !ok {
			return fmt.Errorf("%s must be a string", where)
		}
	case reflect.Bool:
		if _, ok := value.(bool); !ok {
			return fmt.Errorf("%s must be true or false", where)
		}
	case reflect.Float32, reflect.Float64: // encoding/json refuses one out of range
		if _, ok := value.(json.Number); !ok {
			return fmt.Errorf("%s must be a number", where)
		}
	default: // integers: encoding/json checks the range and refuses fractions
		n, ok := value.(json.Number)
		if !ok || strings.ContainsAny(string(n), ".eE") {
			return fmt.Errorf("%s must be an integer", where)
		}
	}
	return nil
}

// checkDuplicates refuses an object holding one member name twice, at any depth: what a
// reader does with a duplicate is not defined, and two readers may disagree.
func checkDuplicates(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type level struct {
		keys    map[string]bool
		object  bool
		wantKey bool
	}
	var stack []*level
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var top *level
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				if top != nil && top.object {
					top.wantKey = true // this value fills the member; a key comes next
				}
				stack = append(stack, &level{keys: map[string]bool{}, object: d == '{', wantKey: d == '{'})
			case '}', ']':
				stack = stack[:len(stack)-1]
			}
			continue
		}
		if top != nil && top.object {
			if top.wantKey {
				k, _ := tok.(string)
				if top.keys[k] {
					return fmt.Errorf("member `%s` appears twice in one object", k)
				}
				top.keys[k] = true
				top.wantKey = false
			} else {
				top.wantKey = true
			}
		}
	}
}

// checkSurrogates refuses a string escape of a lone UTF-16 surrogate (`"\ud800"`): it is not
// Unicode, has no UTF-8 to digest, and encoding/json would quietly read it as U+FFFD.
func checkSurrogates(data []byte) error {
	inString := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if !inString {
			if c == '"' {
				inString = true
			}
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if i+1 < len(data) && data[i+1] == 'u' {
				u, ok := hex4(data, i+2)
				if ok && u >= 0xD800 && u <= 0xDBFF {
					low, okLow := uint32(0), false
					if i+7 < len(data) && data[i+6] == '\\' && data[i+7] == 'u' {
						low, okLow = hex4(data, i+8)
					}
					if !okLow || low < 0xDC00 || low > 0xDFFF {
						return errors.New("a string holds a lone surrogate escape: not valid Unicode")
					}
					i += 11
					continue
				}
				if ok && u >= 0xDC00 && u <= 0xDFFF {
					return errors.New("a string holds a lone surrogate escape: not valid Unicode")
				}
				i += 5
				continue
			}
			i++ // skip the escaped character
		}
	}
	return nil
}

func hex4(data []byte, at int) (uint32, bool) {
	if at+4 > len(data) {
		return 0, false
	}
	var v uint32
	for _, c := range data[at : at+4] {
		v <<= 4
		switch {
		case c >= '0' && c <= '9':
			v |= uint32(c - '0')
		case c >= 'a' && c <= 'f':
			v |= uint32(c-'a') + 10
		case c >= 'A' && c <= 'F':
			v |= uint32(c-'A') + 10
		default:
			return 0, false
		}
	}
	return v, true
}
