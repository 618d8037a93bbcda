// Package sandbox is the official Go client of plimsolld, the plimsoll daemon: it runs
// untrusted code (typically code an AI agent wrote) in a sandbox whose isolation tier is
// stated on every result.
//
// Every call sends a fresh request id, refuses an over-size request before sending it,
// honours a "not dispatched" mark only when the answer echoes that id, recomputes the
// request, result and record digests of docs/protocol.md, and re-checks the tier against
// the floor it asked for (or, when it asked for none, the daemon's default floor) and the
// provider and the image against the ones it named. Sessions (Client.OpenSession) keep one sandbox across
// calls (cells in an interpreter that keeps its state, steps, files), each call verified as
// a run and as the next link of the session's chain, cells and steps streamed on request. A
// session at runsc can be snapshotted (Session.Snapshot), restored (Client.RestoreSession) and
// forked (Session.Fork), each new session checked to continue the chain it came from.
// Standard library only.
//
//	c := sandbox.New("http://127.0.0.1:7878", token)
//	res, err := c.RunJavaScript(ctx, sandbox.Request{
//		Code:             "console.log(6 * 7)",
//		MinimumIsolation: sandbox.IsolationContainer,
//	})
//	if reason, ok := sandbox.NotDispatchedReason(err); ok {
//		// nothing ran, and reason says why
//	}
//	// res.Isolation reports the boundary that actually ran.
package sandbox

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Protocol is the protocol number this client speaks.
const Protocol = 1

// Isolation is an isolation tier, weakest first: process < container < kernel < vm.
type Isolation string

// The four tiers.
const (
	// IsolationProcess: a child process of the daemon; no OS-level wall, never for hostile code.
	IsolationProcess Isolation = "process"
	// IsolationContainer: an OCI runtime (crun, runc): the shared host kernel is the wall.
	IsolationContainer Isolation = "container"
	// IsolationKernel: a user-space kernel or emulator between the code and the host kernel.
	IsolationKernel Isolation = "kernel"
	// IsolationVM: hardware virtualisation.
	IsolationVM Isolation = "vm"
)

// Isolations lists the tiers, weakest first.
var Isolations = []Isolation{IsolationProcess, IsolationContainer, IsolationKernel, IsolationVM}

// Rank is the tier's place in the order (0 for process, 3 for vm), or -1 for a string that
// is not a tier.
func (i Isolation) Rank() int {
	for n, t := range Isolations {
		if t == i {
			return n
		}
	}
	return -1
}

// Valid reports whether i is one of the four tiers.
func (i Isolation) Valid() bool { return i.Rank() >= 0 }

// AtLeast reports whether i is a tier at or above floor.
func (i Isolation) AtLeast(floor Isolation) bool {
	return i.Valid() && floor.Valid() && i.Rank() >= floor.Rank()
}

// UnmarshalJSON accepts only the four tier names.
func (i *Isolation) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("a tier must be a string: %w", err)
	}
	if !Isolation(s).Valid() {
		return fmt.Errorf("`%s` is not a tier (process, container, kernel, vm)", s)
	}
	*i = Isolation(s)
	return nil
}

// Start says how a run's sandbox started.
type Start string

// The two starts.
const (
	// StartWarm: a fresh sandbox started ahead of the request (a warm pool member) and used
	// for exactly one run.
	StartWarm Start = "warm"
	// StartCold: a sandbox started for the request.
	StartCold Start = "cold"
)

// UnmarshalJSON accepts only the two start names.
func (s *Start) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	var v string
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("a start must be a string: %w", err)
	}
	if Start(v) != StartWarm && Start(v) != StartCold {
		return fmt.Errorf("`%s` is not a start (warm, cold)", v)
	}
	*s = Start(v)
	return nil
}

// CredentialKind says which kind of credential the broker attached to a grant's call.
type CredentialKind string

// The two credential kinds.
const (
	// CredentialStatic: the profile's static secret (development only), the same on every
	// call of every run.
	CredentialStatic CredentialKind = "static"
	// CredentialMinted: a short-lived JWT minted for the run.
	CredentialMinted CredentialKind = "minted"
)

// UnmarshalJSON accepts only the two credential kind names.
func (k *CredentialKind) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	var v string
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("a credential kind must be a string: %w", err)
	}
	if CredentialKind(v) != CredentialStatic && CredentialKind(v) != CredentialMinted {
		return fmt.Errorf("`%s` is not a credential kind (static, minted)", v)
	}
	*k = CredentialKind(v)
	return nil
}

// Reason says why nothing ran: the not-dispatched mark of a refusal.
type Reason string

// The seven reasons (docs/protocol.md, ErrorResponse).
const (
	// ReasonRequest: the request is malformed or out of bounds.
	ReasonRequest Reason = "request"
	// ReasonPermission: the caller is unknown or not allowed what it asked for.
	ReasonPermission Reason = "permission"
	// ReasonProtocol: the protocol number is not served.
	ReasonProtocol Reason = "protocol"
	// ReasonUnsupported: no provider meeting the floor can do this kind of run.
	ReasonUnsupported Reason = "unsupported"
	// ReasonIsolation: no available provider meets the floor.
	ReasonIsolation Reason = "isolation"
	// ReasonEnvironment: a provider's environment failed its check, or the daemon cannot be
	// reached (nothing was sent).
	ReasonEnvironment Reason = "environment"
	// ReasonCapacity: admission limits; retrying later may succeed.
	ReasonCapacity Reason = "capacity"
)

// Reasons lists the seven reasons.
var Reasons = []Reason{ReasonRequest, ReasonPermission, ReasonProtocol, ReasonUnsupported,
	ReasonIsolation, ReasonEnvironment, ReasonCapacity}

// UnmarshalJSON accepts only the seven reasons: an unknown one cannot promise anything.
func (r *Reason) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("a reason must be a string: %w", err)
	}
	for _, known := range Reasons {
		if Reason(s) == known {
			*r = known
			return nil
		}
	}
	return fmt.Errorf("`%s` is not a not-dispatched reason", s)
}

// Language is a snippet's language.
type Language string

// The two snippet languages.
const (
	// JavaScript is run by node.
	JavaScript Language = "javascript"
	// Python is run by python3.
	Python Language = "python"
)

// Bytes are exact bytes (program output, file contents, artifacts), which need not be
// UTF-8. On the wire they are a JSON string when valid UTF-8, else {"base64": "..."}.
type Bytes []byte

// String returns the bytes as a Go string (which holds any bytes; invalid UTF-8 is kept).
func (b Bytes) String() string { return string(b) }

// Text returns the bytes as text, with each invalid UTF-8 sequence replaced by U+FFFD.
func (b Bytes) Text() string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]rune, 0, len(b))
	for s := []byte(b); len(s) > 0; {
		r, n := utf8.DecodeRune(s)
		out = append(out, r)
		s = s[n:]
	}
	return string(out)
}

// MarshalJSON writes a string for valid UTF-8 and the base64 object otherwise.
func (b Bytes) MarshalJSON() ([]byte, error) {
	if utf8.Valid(b) {
		return json.Marshal(string(b))
	}
	return json.Marshal(map[string]string{"base64": base64.StdEncoding.EncodeToString(b)})
}

// UnmarshalJSON accepts either wire form, and refuses base64 that is not canonical
// (standard alphabet, padded, no line breaks, unused bits zero).
func (b *Bytes) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		*b = Bytes(s)
		return nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return fmt.Errorf(`bytes must be a string or {"base64": "..."}: %w`, err)
	}
	raw, ok := obj["base64"]
	if len(obj) != 1 || !ok {
		return fmt.Errorf(`bytes as an object must have exactly one member, "base64"`)
	}
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		return fmt.Errorf(`"base64" must be a string: %w`, err)
	}
	decoded, err := base64.StdEncoding.Strict().DecodeString(text)
	if err != nil || base64.StdEncoding.EncodeToString(decoded) != text {
		return fmt.Errorf("bad base64 (standard alphabet, padded, no line breaks): %q", text)
	}
	*b = Bytes(decoded)
	return nil
}

// Limits are the limits a request asks for. A zero member is left out (the operator's
// default applies); the operator's maximum bounds each one. A breach is a result (timed
// out, truncated, killed by the memory limit), not an error.
type Limits struct {
	// TimeoutMS is the wall-clock budget for the whole run, in milliseconds.
	TimeoutMS uint64 `json:"timeout_ms,omitempty"`
	// MemoryBytes is the memory for the sandbox.
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	// OutputBytes is the bytes kept per output stream per step.
	OutputBytes uint64 `json:"output_bytes,omitempty"`
	// Pids is the processes and threads the sandbox may hold at once.
	Pids uint64 `json:"pids,omitempty"`
	// DiskBytes is the writable disk for the sandbox.
	DiskBytes uint64 `json:"disk_bytes,omitempty"`
	// ArtifactBytes is the bytes kept per returned artifact.
	ArtifactBytes uint64 `json:"artifact_bytes,omitempty"`
}

// Request is what RunJavaScript and RunPython send: code in their language, and the
// options every run has. An empty string or nil member is left out of the request.
type Request struct {
	// Code is the source text; not blank.
	Code string
	// MinimumIsolation is the floor, the weakest tier accepted. Empty: the daemon's default
	// floor, which the client reads once from GET /v1/providers and checks the result against.
	MinimumIsolation Isolation
	// Provider names the one provider to run on (it must still meet the floor).
	Provider string
	// Limits asks for limits; nil leaves `limits` out (an empty Limits sends `{}`).
	Limits *Limits
	// Grant names a grant profile the operator defined.
	Grant string
	// Image names the image to run in: an image name ("python-data") or identity
	// ("sha256:" and 64 lowercase hex digits). Empty: the operator's default image. The
	// record must name it (Record.Image), or the run fails with an *ImageMismatchError.
	Image string
}

// RunSpec is what to run: a Snippet or a Project.
type RunSpec interface {
	kind() string
}

// Snippet is a piece of code in one language.
type Snippet struct {
	Language Language
	Code     string
}

func (Snippet) kind() string { return "snippet" }

// Project is files written under /work, shell steps run in order by /bin/sh -c in /work
// (the first that fails stops the run), and artifacts returned. The process tier runs no
// projects: ask for the container tier or above.
type Project struct {
	// Files are written before the first step, in order.
	Files []File
	// Steps run in order; at least one.
	Steps []Step
	// Artifacts are paths under /work returned after the steps, in this order.
	Artifacts []string
}

func (Project) kind() string { return "project" }

// File is one project file. Path is relative to /work, `/`-separated, with no empty, `.`
// or `..` segment.
type File struct {
	Path       string
	Content    []byte
	Executable bool
}

// Step is one shell step. Name is a label for people (empty: none).
type Step struct {
	Name string
	Run  string
}

// RunRequest is a whole run request but for the protocol number and request id, which the
// client adds.
type RunRequest struct {
	// Run is what to run: Snippet or Project (or a pointer to one).
	Run RunSpec
	// MinimumIsolation, Provider, Limits, Grant, Image: as in Request.
	MinimumIsolation Isolation
	Provider         string
	Limits           *Limits
	Grant            string
	Image            string
}

// Result is a verified answer to a run: the run happened, and every check passed.
type Result struct {
	Protocol uint32 `json:"protocol"`
	// RequestID is the id this client sent, echoed.
	RequestID string `json:"request_id"`
	// Provider is the provider that ran it.
	Provider string `json:"provider"`
	// Isolation is the boundary that actually ran it, from the provider's evidence.
	Isolation Isolation `json:"isolation"`
	// DurationMS is the wall time from dispatch to result.
	DurationMS uint64 `json:"duration_ms"`
	// RequestSHA256 is the request digest (recomputed here from the bytes sent).
	RequestSHA256 string `json:"request_sha256"`
	// ResultSHA256 is the result digest (recomputed here).
	ResultSHA256 string `json:"result_sha256"`
	// Output is what the run produced.
	Output Output `json:"result"`
	// Record is the run record a signer needs (its digest recomputed here).
	Record Record `json:"record"`
}

// Output is the outcome of a run (the protocol's RunResult).
type Output struct {
	// ExitCode is the exit status of the snippet or of the last project step that ran; nil
	// when a signal ended it.
	ExitCode *int32 `json:"exit_code"`
	// Signal is the signal that ended it, if one did.
	Signal *int32 `json:"signal,omitempty"`
	// TimedOut: the wall timeout fired and the sandbox was killed.
	TimedOut bool `json:"timed_out"`
	// OOMKilled: the memory limit was hit and the code was killed for it.
	OOMKilled       bool  `json:"oom_killed,omitempty"`
	Stdout          Bytes `json:"stdout"`
	StdoutTruncated bool  `json:"stdout_truncated"`
	Stderr          Bytes `json:"stderr"`
	StderrTruncated bool  `json:"stderr_truncated"`
	// Steps has one entry per project step that ran, in order (none for a snippet).
	Steps []StepOutput `json:"steps,omitempty"`
	// Artifacts are the project's artifacts, in the order asked.
	Artifacts []Artifact `json:"artifacts,omitempty"`
	// Calls lists every call the run made through its grant's broker, in order.
	Calls []GrantCall `json:"calls,omitempty"`
	// Start says how the sandbox started, StartWarm or StartCold. Read as optional so that
	// an older result parses ("" when absent or null); every result the daemon writes now
	// has it.
	Start Start `json:"start,omitempty"`
	// MemberAgeMS is how long the warm pool member waited between being started and being
	// claimed; present exactly when Start is StartWarm (a verified Result is checked for it).
	MemberAgeMS *uint64 `json:"member_age_ms,omitempty"`
	// Wall is what the sandbox looked like just before its code was handed over; nil where
	// the provider reads none. Inside the result digest.
	Wall *Wall `json:"wall,omitempty"`
	// StateKept is set on a session's cell only: whether the interpreter that ran it is the
	// one of the session's previous cell, alive with its state after this one (false when it
	// ended during this cell, or when this cell started a fresh one). nil outside cells.
	StateKept *bool `json:"state_kept,omitempty"`
	// InterpreterEnd is set on a session's cell only, when its interpreter ended during it
	// (EndInterpreterCrash, EndOutOfMemory, EndCellTimeout): its state is lost, and the next
	// cell must ask for a restart. "" when it did not end.
	InterpreterEnd EndReason `json:"interpreter_end,omitempty"`
	// Egress lists every connection the code asked the broker's egress proxy for, allowed or
	// refused, in the order the broker took them (empty without an egress grant). Inside the
	// result digest (field 17), the times included.
	Egress []EgressReceipt `json:"egress,omitempty"`
}

// Wall is a run's sandbox as /proc showed it for the process that ran the code, just before
// the code was handed over (docs/protocol.md, Wall). A capability set, NoNewPrivs or Seccomp
// is nil where the kernel shows no such line (gVisor).
type Wall struct {
	UID    uint32   `json:"uid"`
	EUID   uint32   `json:"euid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
	// The capability sets, 16 hex digits each.
	CapInh     *string `json:"cap_inh,omitempty"`
	CapPrm     *string `json:"cap_prm,omitempty"`
	CapEff     *string `json:"cap_eff,omitempty"`
	CapBnd     *string `json:"cap_bnd,omitempty"`
	CapAmb     *string `json:"cap_amb,omitempty"`
	NoNewPrivs *bool   `json:"no_new_privs,omitempty"`
	// Seccomp is the seccomp mode: 0 none, 1 strict, 2 filter.
	Seccomp           *uint32         `json:"seccomp,omitempty"`
	Namespaces        []WallNamespace `json:"namespaces,omitempty"`
	RootReadOnly      bool            `json:"root_read_only"`
	NetworkInterfaces []string        `json:"network_interfaces,omitempty"`
	MemoryLimitBytes  *uint64         `json:"memory_limit_bytes,omitempty"`
	PidsLimit         *uint64         `json:"pids_limit,omitempty"`
}

// WallNamespace is one namespace of a run's sandbox.
type WallNamespace struct {
	// Name is its kind, as /proc names it (mnt, net, pid, ...).
	Name string `json:"name"`
	// ID is its identity (net:[4026532281]).
	ID string `json:"id"`
	// SameAsHost says whether it is the daemon's own; nil where comparing says nothing (a
	// guest kernel's).
	SameAsHost *bool `json:"same_as_host,omitempty"`
}

// startProblem says what is malformed in o's Start and MemberAgeMS (a member age is present
// exactly when the start is warm), or "".
func (o *Output) startProblem() string {
	if o.MemberAgeMS != nil && o.Start != StartWarm {
		was := "absent"
		if o.Start != "" {
			was = fmt.Sprintf("%q", string(o.Start))
		}
		return fmt.Sprintf("the result is malformed: `member_age_ms` is present but `start` is %s, not \"warm\" (only a warm start has a pool member's age)", was)
	}
	if o.Start == StartWarm && o.MemberAgeMS == nil {
		return "the result is malformed: `start` is \"warm\" but `member_age_ms` is absent (a warm start always says how long its pool member waited)"
	}
	return ""
}

// StepOutput is the outcome of one project step (the protocol's StepResult).
type StepOutput struct {
	// Name is the step's label, if it had one.
	Name            *string `json:"name,omitempty"`
	ExitCode        *int32  `json:"exit_code"`
	Signal          *int32  `json:"signal,omitempty"`
	TimedOut        bool    `json:"timed_out"`
	OOMKilled       bool    `json:"oom_killed,omitempty"`
	Stdout          Bytes   `json:"stdout"`
	StdoutTruncated bool    `json:"stdout_truncated"`
	Stderr          Bytes   `json:"stderr"`
	StderrTruncated bool    `json:"stderr_truncated"`
	// DurationMS is the step's wall time (not covered by the result digest).
	DurationMS uint64 `json:"duration_ms"`
}

// Artifact is one returned file.
type Artifact struct {
	// Path is the path asked for, relative to /work.
	Path string `json:"path"`
	// Found is false when the file did not exist or was not a regular file.
	Found bool `json:"found"`
	// Size is the file's size on disk (0 when not found).
	Size uint64 `json:"size"`
	// Content is the content, at most the artifact limit.
	Content Bytes `json:"content"`
	// Truncated: the file was larger than the artifact limit.
	Truncated bool `json:"truncated"`
}

// GrantCall is one call a run made through its grant's broker.
type GrantCall struct {
	Method string `json:"method"`
	// Route is the route template matched; nil when none matched.
	Route *string `json:"route,omitempty"`
	// Status is the API's HTTP status; nil when the API was not called or did not answer.
	Status *uint16 `json:"status,omitempty"`
	// Error says why the broker refused the call or it failed.
	Error         *string `json:"error,omitempty"`
	RequestBytes  uint64  `json:"request_bytes"`
	ResponseBytes uint64  `json:"response_bytes"`
	// LatencyMS is not covered by the result digest.
	LatencyMS uint64 `json:"latency_ms"`
	// Credential is the kind of credential the broker attached, CredentialStatic or
	// CredentialMinted. Read as optional so that an older result parses ("" when absent or
	// null); the daemon sets it on every call it lists. Inside the result digest.
	Credential CredentialKind `json:"credential,omitempty"`
}

// EgressReceipt is one connection the run's code asked the broker for through its egress
// proxy, allowed or refused (docs/protocol.md, EgressReceipt). Every member is inside the
// result digest, the times included. Kind, Verdict, Rule and Ended are the strings sent, so a
// value a later daemon adds still reads.
type EgressReceipt struct {
	// Host is the host the code named (lowercased), or the IP literal or the target as sent
	// (at most 255 bytes) when it was refused before it parsed.
	Host string `json:"host"`
	// Port is the port the code named; 0 when it named none that parsed.
	Port uint16 `json:"port"`
	// Kind is "connect" (a CONNECT tunnel) or "http" (one plain-HTTP request).
	Kind string `json:"kind"`
	// Address is the address the broker connected to, ip:port ([v6]:port); nil when it
	// connected to none.
	Address *string `json:"address,omitempty"`
	// SNI is the server name the TLS ClientHello carried; nil for plain HTTP or when none was
	// read.
	SNI *string `json:"sni,omitempty"`
	// BytesUp is the bytes from the code to the host, BytesDown from the host to the code.
	BytesUp   uint64 `json:"bytes_up"`
	BytesDown uint64 `json:"bytes_down"`
	// StartMS is when the broker accepted the request, EndMS when the connection ended, in
	// milliseconds from the run's start.
	StartMS uint64 `json:"start_ms"`
	EndMS   uint64 `json:"end_ms"`
	// Verdict is "allowed" or "refused".
	Verdict string `json:"verdict"`
	// Rule is what decided: for "allowed", the rule that allowed it ("host *.example.com
	// port 443", with " via <range>" when an address range let a non-public address
	// through); for "refused", the check's code ("host_not_allowed", "ip_literal", ...).
	Rule string `json:"rule"`
	// Ended is how an allowed connection ended ("closed", "deadline", "budget_bytes", ...);
	// nil for a refused one.
	Ended *string `json:"ended,omitempty"`
}

// Record is the run record: the facts a signer needs, with a digest over them.
type Record struct {
	RequestID     string    `json:"request_id"`
	RequestSHA256 string    `json:"request_sha256"`
	ResultSHA256  string    `json:"result_sha256"`
	Provider      string    `json:"provider"`
	Isolation     Isolation `json:"isolation"`
	// MinimumIsolation is the floor the daemon held the run to: the one sent, or its default
	// floor when none was. Read as optional so that an older record parses ("" when absent
	// or null); a verified Result always has it.
	MinimumIsolation Isolation `json:"minimum_isolation,omitempty"`
	EvidenceSHA256   string    `json:"evidence_sha256"`
	// Environment is the sandbox image identity, or the engine version at the process tier.
	Environment   string `json:"environment"`
	StartedUnixMS uint64 `json:"started_unix_ms"`
	EndedUnixMS   uint64 `json:"ended_unix_ms"`
	// Session is a session call's place in its session's chain; nil for a run outside a
	// session. Inside the record digest (record field 11).
	Session *SessionLink `json:"session,omitempty"`
	// Image is the image the code ran in; nil at the process tier (which has no image) and
	// in a record written before the member existed. Inside the record digest (field 12).
	Image *ImageRef `json:"image,omitempty"`
	// Trials is what each trial step's verdict said, in step order; empty for a run without
	// trial steps (and when absent or null). Inside the record digest (field 13).
	Trials       []TrialStepRecord `json:"trials,omitempty"`
	RecordSHA256 string            `json:"record_sha256"`
}

// TrialStepRecord is one trial step of a project, as the record carries its verdict: the
// step's index among the project's steps (from 0), the simulator, whether every trial
// passed, and each trial's outcome, in the order the step named its scenarios.
type TrialStepRecord struct {
	Step      uint32         `json:"step"`
	Simulator SimulatorRef   `json:"simulator"`
	Pass      bool           `json:"pass"`
	Trials    []TrialOutcome `json:"trials"`
}

// SimulatorRef is the simulator a trial step ran: its metadata's name and version, and the
// SHA-256 of its WebAssembly module.
type SimulatorRef struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
}

// TrialOutcome is how one trial (one scenario) ended.
type TrialOutcome struct {
	// Scenario is the scenario's name (never its file's path); nil when it had none.
	Scenario *string  `json:"scenario,omitempty"`
	End      TrialEnd `json:"end"`
	// Reason says why, in words (the simulator's reason, or the controller's fault); nil
	// when there is none.
	Reason *string `json:"reason,omitempty"`
	// Ticks is the number of ticks run (records in the trajectory).
	Ticks uint64 `json:"ticks"`
	// Score is the simulator's score of the trial; nil from a simulator that does not score.
	// Digested by its IEEE 754 bits, so -0 is not 0.
	Score *float64 `json:"score,omitempty"`
	Pass  bool     `json:"pass"`
	// Fingerprint is the SHA-256 of the trial's trajectory.
	Fingerprint string `json:"fingerprint"`
}

// TrialEnd says how a trial ended.
type TrialEnd string

// The six ends of a trial (docs/trials.md).
const (
	// TrialCompleted: the simulator completed it.
	TrialCompleted TrialEnd = "completed"
	// TrialFailed: the simulator ended it as failed.
	TrialFailed TrialEnd = "failed"
	// TrialControllerTimeout: the controller gave no full answer before a tick's deadline.
	TrialControllerTimeout TrialEnd = "controller_timeout"
	// TrialControllerGarbage: the controller answered something that is not an action.
	TrialControllerGarbage TrialEnd = "controller_garbage"
	// TrialControllerExited: the controller exited, or closed its input or output.
	TrialControllerExited TrialEnd = "controller_exited"
	// TrialControllerFlood: the controller wrote too much.
	TrialControllerFlood TrialEnd = "controller_flood"
)

// IsControllerFault reports whether the controller caused this end; such a trial never
// passes.
func (e TrialEnd) IsControllerFault() bool {
	return e != TrialCompleted && e != TrialFailed
}

// UnmarshalJSON accepts only the six trial ends.
func (e *TrialEnd) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	var v string
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("a trial end must be a string: %w", err)
	}
	switch TrialEnd(v) {
	case TrialCompleted, TrialFailed, TrialControllerTimeout, TrialControllerGarbage,
		TrialControllerExited, TrialControllerFlood:
		*e = TrialEnd(v)
		return nil
	}
	return fmt.Errorf("`%s` is not a trial end (completed, failed, controller_timeout, controller_garbage, controller_exited, controller_flood)", v)
}

// ImageRef names the image a run or a session ran in: its name in the daemon's image store
// and its identity (`sha256:` over its manifest, the record's Environment).
type ImageRef struct {
	Name     string `json:"name"`
	Identity string `json:"identity"`
}

// Answers reports whether a request's image (selector, a name or an identity) names i.
func (i ImageRef) Answers(selector string) bool {
	return selector == i.Name || selector == i.Identity
}

// String is the image's name and identity.
func (i ImageRef) String() string { return i.Name + " (" + i.Identity + ")" }

// ImageInfo is one image the daemon keeps, as GET /v1/providers lists it.
type ImageInfo struct {
	// Name and Identity each name it in a request's image.
	Name     string `json:"name"`
	Identity string `json:"identity"`
	// Default: a request that names no image gets it.
	Default bool `json:"default"`
	// Languages are the interpreters its check found in it (JavaScript, Python).
	Languages []Language `json:"languages,omitempty"`
	// VMDisk: the VM provider can boot it (it has a disk made from it).
	VMDisk bool `json:"vm_disk,omitempty"`
	// Simulators are the trial simulators it declares (docs/simulators.md), in its index's
	// order; empty when none.
	Simulators []SimulatorEntry `json:"simulators,omitempty"`
}

// SimulatorEntry is a trial simulator an image declares: the name a trial names it by, its
// WebAssembly module's path inside the image, and the module's SHA-256 (what a trial's
// record names as its SimulatorRef.SHA256).
type SimulatorEntry struct {
	Name   string `json:"name"`
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
}

// Simulator is the simulator of this name the image declares, if it declares one.
func (i ImageInfo) Simulator(name string) (SimulatorEntry, bool) {
	for _, s := range i.Simulators {
		if s.Name == name {
			return s, true
		}
	}
	return SimulatorEntry{}, false
}

// Answers reports whether a request's image (selector, a name or an identity) names i.
func (i ImageInfo) Answers(selector string) bool {
	return selector == i.Name || selector == i.Identity
}

// ImageNameMax is the longest image name.
const ImageNameMax = 64

// IsImageName reports whether s is an image name: 1 to 64 characters of `a-z 0-9 . _ -`,
// the first a letter or a digit. A name never holds `:`, so a selector with one is an
// identity.
func IsImageName(s string) bool {
	if s == "" || len(s) > ImageNameMax {
		return false
	}
	for i, c := range []byte(s) {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !ok && i > 0 {
			ok = c == '.' || c == '_' || c == '-'
		}
		if !ok {
			return false
		}
	}
	return true
}

// IsImageIdentity reports whether s is an image identity: `sha256:` and 64 lowercase hex
// digits.
func IsImageIdentity(s string) bool {
	if !strings.HasPrefix(s, "sha256:") {
		return false
	}
	hex := s[len("sha256:"):]
	if len(hex) != 64 {
		return false
	}
	for _, c := range []byte(hex) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// validateImage checks a request's image: an image name or an image identity.
func validateImage(s string) error {
	if IsImageName(s) || IsImageIdentity(s) {
		return nil
	}
	return fmt.Errorf("image %q is neither an image name (1 to %d characters of a-z 0-9 . _ -, starting with a letter or digit) nor an identity (sha256: and 64 lowercase hex characters): Providers lists the daemon's images", s, ImageNameMax)
}

// SessionLink is where a session call's record sits in its session's chain: a call
// missing, repeated or reordered breaks it (docs/sessions.md, "Chained records").
type SessionLink struct {
	// SessionID is the session's id.
	SessionID string `json:"session_id"`
	// Sequence is 1 for the session's first call, then one more for each call after it.
	Sequence uint64 `json:"sequence"`
	// PreviousRecordSHA256 is the record digest of the session's previous call; "" exactly
	// for sequence 1.
	PreviousRecordSHA256 string `json:"previous_record_sha256,omitempty"`
	// Origin says where a restored or forked session came from, on every one of its calls'
	// records (equal to its SessionInfo.Origin); nil for a session opened fresh. Inside the
	// record digest (record field 14).
	Origin *SessionOrigin `json:"origin,omitempty"`
}

// OriginStart says how a session that did not open fresh began: from a snapshot.
type OriginStart string

// The two starts from a snapshot.
const (
	// OriginRestored: opened from a snapshot (Client.RestoreSession), or the same session
	// brought back by the next daemon after a restart.
	OriginRestored OriginStart = "restored"
	// OriginForked: one of the copies of a fork (Session.Fork).
	OriginForked OriginStart = "forked"
)

// UnmarshalJSON accepts only the two starts from a snapshot.
func (o *OriginStart) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	var v string
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("an origin's start must be a string: %w", err)
	}
	if OriginStart(v) != OriginRestored && OriginStart(v) != OriginForked {
		return fmt.Errorf("`%s` is not an origin's start (restored, forked)", v)
	}
	*o = OriginStart(v)
	return nil
}

// SessionOrigin is where a restored or forked session came from (docs/protocol.md,
// SessionOrigin): on its SessionInfo, and on every one of its calls' records. Its chain
// continues its parent's: its first call is sequence ParentCalls + 1, hanging from
// ParentRecordSHA256.
type SessionOrigin struct {
	// Start is OriginRestored or OriginForked.
	Start OriginStart `json:"start"`
	// SnapshotSHA256 is the digest of the snapshot it was made from, recomputed over the
	// snapshot's files when it was restored.
	SnapshotSHA256 string `json:"snapshot_sha256"`
	// ParentSessionID is the session the snapshot was taken of.
	ParentSessionID string `json:"parent_session_id"`
	// ParentRecordSHA256 is the parent's last record digest when the snapshot was taken (the
	// previous record of this session's first call); "" when the parent had answered no call.
	ParentRecordSHA256 string `json:"parent_record_sha256,omitempty"`
	// ParentCalls is the parent's call count then.
	ParentCalls uint64 `json:"parent_calls"`
}

// String is the origin in one line; "(none)" for nil.
func (o *SessionOrigin) String() string {
	if o == nil {
		return "(none)"
	}
	record := o.ParentRecordSHA256
	if record == "" {
		record = "(none)"
	}
	return fmt.Sprintf("%s from session %s after call %d (record %s), snapshot %s", o.Start, o.ParentSessionID, o.ParentCalls, record, o.SnapshotSHA256)
}

// sameOrigin reports whether a and b are the same origin, or both none.
func sameOrigin(a, b *SessionOrigin) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// SnapshotInfo is a snapshot of a session: its sandbox saved with its interpreter's memory
// (Session.Snapshot, Session.Fork, Client.ListSnapshots, Client.DeleteSnapshot).
type SnapshotInfo struct {
	Protocol uint32 `json:"protocol"`
	// RequestID is the id of the request this answers (snapshot, fork, delete); "" in a list.
	RequestID string `json:"request_id,omitempty"`
	// SnapshotID is its id (`snp_` + 16 hex digits naming the daemon instance + `_` + 32).
	SnapshotID string `json:"snapshot_id"`
	// SessionID is the session it was taken of.
	SessionID string `json:"session_id"`
	// SHA256 is the digest over its files: what RestoreOptions.SHA256 names, and what the
	// origin of every session made from it states.
	SHA256 string `json:"sha256"`
	// Bytes is its size on disk, what counts against the snapshot quotas.
	Bytes uint64 `json:"bytes"`
	// Provider, Isolation and Language are its session's.
	Provider  string    `json:"provider"`
	Isolation Isolation `json:"isolation"`
	Language  Language  `json:"language"`
	// Calls is its session's call count when it was taken.
	Calls uint64 `json:"calls"`
	// LastRecordSHA256 is its session's last record digest then; "" before the first call.
	LastRecordSHA256 string `json:"last_record_sha256,omitempty"`
	// CheckpointMS is how long the checkpoint took (the session was paused that long).
	CheckpointMS  uint64 `json:"checkpoint_ms"`
	CreatedUnixMS uint64 `json:"created_unix_ms"`
	// ExpiresUnixMS is when the daemon removes it.
	ExpiresUnixMS uint64 `json:"expires_unix_ms"`
}

// SnapshotList is the answer to GET /v1/snapshots: the caller's own snapshots, oldest first.
type SnapshotList struct {
	Protocol  uint32         `json:"protocol"`
	Snapshots []SnapshotInfo `json:"snapshots"`
}

// ForkAnswer is the answer to POST /v1/sessions/{id}/fork: the snapshot taken of the
// session (kept until it expires or is deleted) and the copies restored from it, each a new
// session whose origin says it was forked.
type ForkAnswer struct {
	Protocol  uint32        `json:"protocol"`
	RequestID string        `json:"request_id"`
	Snapshot  SnapshotInfo  `json:"snapshot"`
	Sessions  []SessionInfo `json:"sessions"`
}

// Providers is the answer to GET /v1/providers.
type Providers struct {
	Protocol uint32 `json:"protocol"`
	// DefaultFloor is the floor a request gets when it sets none.
	DefaultFloor Isolation `json:"default_floor"`
	// Providers are listed cheapest first.
	Providers []ProviderInfo `json:"providers"`
	// Images are the images a request may name, the default one marked (empty from a daemon
	// without images).
	Images []ImageInfo `json:"images,omitempty"`
}

// Image is the image a request's image of this value (a name or an identity) would name, if
// the daemon has it.
func (p *Providers) Image(selector string) (ImageInfo, bool) {
	for _, i := range p.Images {
		if i.Answers(selector) {
			return i, true
		}
	}
	return ImageInfo{}, false
}

// DefaultImage is the image a request that names none gets, if the daemon lists one.
func (p *Providers) DefaultImage() (ImageInfo, bool) {
	for _, i := range p.Images {
		if i.Default {
			return i, true
		}
	}
	return ImageInfo{}, false
}

// ProviderInfo is one provider of the daemon.
type ProviderInfo struct {
	Name      string    `json:"name"`
	Isolation Isolation `json:"isolation"`
	// Available: offered now, its last probe matched what its tier claims.
	Available bool `json:"available"`
	// UnavailableReason says why not, and what to do.
	UnavailableReason *string  `json:"unavailable_reason,omitempty"`
	Evidence          Evidence `json:"evidence"`
	// EvidenceSHA256 is the digest of Evidence's canonical JSON (recomputed here).
	EvidenceSHA256 string `json:"evidence_sha256"`
}

// Evidence is what the daemon checked about a provider. It is what the daemon saw on this
// host, not attestation.
type Evidence struct {
	Provider      string            `json:"provider"`
	Isolation     Isolation         `json:"isolation"`
	Config        map[string]string `json:"config"`
	Binaries      []BinaryIdentity  `json:"binaries"`
	Probe         *ProbeReport      `json:"probe,omitempty"`
	Checks        map[string]string `json:"checks"`
	Environment   string            `json:"environment"`
	CheckedUnixMS uint64            `json:"checked_unix_ms"`
}

// BinaryIdentity names one binary the wall rests on.
type BinaryIdentity struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
}

// ProbeReport is what the startup probe saw from inside the wall.
type ProbeReport struct {
	UID               uint32                   `json:"uid"`
	EUID              uint32                   `json:"euid"`
	GID               uint32                   `json:"gid"`
	Groups            []uint32                 `json:"groups"`
	Capabilities      map[string]string        `json:"capabilities"`
	NoNewPrivs        bool                     `json:"no_new_privs"`
	SeccompMode       uint32                   `json:"seccomp_mode"`
	Environment       []string                 `json:"environment"`
	Cwd               string                   `json:"cwd"`
	Namespaces        map[string]NamespaceSeen `json:"namespaces"`
	Mounts            map[string]string        `json:"mounts"`
	WriteAttempts     map[string]string        `json:"write_attempts"`
	ReadAttempts      map[string]string        `json:"read_attempts"`
	NetworkInterfaces []string                 `json:"network_interfaces"`
	SocketAttempts    map[string]string        `json:"socket_attempts"`
	Limits            map[string]string        `json:"limits"`
	KernelRelease     string                   `json:"kernel_release"`
	Hostname          string                   `json:"hostname"`
}

// NamespaceSeen is one namespace as the probe saw it.
type NamespaceSeen struct {
	ID         string `json:"id"`
	SameAsHost *bool  `json:"same_as_host,omitempty"`
}
