// Package testdaemon starts a real plimsolld for the client's tests: the binary the
// repository built (target/debug/plimsolld), on a loopback port the kernel picks, with a
// fresh state directory, settings and callers file, and a caller created for the test. It
// is restarted (SIGTERM, then the same daemon again on the same address) by Restart,
// stopped (SIGTERM, then SIGKILL) by Stop, and sent SIGTERM by the kernel if the test
// process dies first.
package testdaemon

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	// listenTimeout bounds how long plimsolld may take to bind its port.
	listenTimeout = 60 * time.Second
	// probeTimeout bounds how long its providers' probes may take.
	probeTimeout = 120 * time.Second
	// stopTimeout bounds how long it may take to stop after SIGTERM.
	stopTimeout = 30 * time.Second
	// noneProbed is the line the daemon logs when no provider passed its probe.
	noneProbed = "no provider passed its probe"
)

// uidsPerPort mirrors plimsoll_daemon::testing::uid_base_for_port: a daemon whose uid range
// is picked from a loopback port this process holds meets no other test's uids.
const uidsPerPort = 1024

// UIDBaseForPort is the first sandbox uid of the range for a held port.
func UIDBaseForPort(port int) uint32 { return 1_000_000_000 + uint32(port)*uidsPerPort }

// Strict reports whether tests run strictly (CI=true or CI=1): every skip is then a failure.
func Strict() bool {
	v := os.Getenv("CI")
	return v == "true" || v == "1"
}

// SkipOrFail prints `SKIP <test>: <reason>` and skips the test, or fails it under CI=true.
func SkipOrFail(t testing.TB, reason string) {
	t.Helper()
	if Strict() {
		t.Fatalf("SKIP not allowed under CI=true: %s: %s", t.Name(), reason)
	}
	fmt.Fprintf(os.Stderr, "SKIP %s: %s\n", t.Name(), reason)
	t.Skipf("SKIP %s: %s", t.Name(), reason)
}

// RepoRoot is the repository this package lives in.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", "..", ".."))
}

// Plimsolld is the daemon binary the tests use.
func Plimsolld() string { return filepath.Join(RepoRoot(), "target", "debug", "plimsolld") }

// Router is the repository's plimsoll-router binary.
func Router() string { return filepath.Join(RepoRoot(), "target", "debug", "plimsoll-router") }

// ThroughRouter: with PLIMSOLL_TEST_ROUTER=1 every daemon is reached through a plimsoll-router
// in front of it (docs/cluster.md), so the whole suite checks that the router passes answers
// on untouched.
func ThroughRouter() bool { return os.Getenv("PLIMSOLL_TEST_ROUTER") == "1" }

// Image is the sandbox image directory the container tier uses, symlinks resolved.
func Image() string {
	dir := filepath.Join(RepoRoot(), "build", "images", "sandbox")
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		return real
	}
	return dir
}

// Missing says what this host lacks to start a daemon ("" when nothing): root, the binary.
func Missing() string {
	if os.Geteuid() != 0 {
		return "running sandboxes needs root (plimsolld switches each run to a sandbox uid)"
	}
	if _, err := os.Stat(Plimsolld()); err != nil {
		return fmt.Sprintf("no plimsolld at %s: build it with `make build` (cargo build --workspace)", Plimsolld())
	}
	return ""
}

// CallerName is the name of the caller each daemon is started with.
const CallerName = "go-client-test"

// Daemon is a running plimsolld child.
type Daemon struct {
	// URL is its base URL, e.g. http://127.0.0.1:40123.
	URL string
	// Token is a caller token it accepts (caller CallerName).
	Token string
	// Tokens holds a token of each caller of Options.Callers, by name.
	Tokens map[string]string
	// Log is its log file (JSON lines).
	Log string
	// Dir holds its settings, callers file and state.
	Dir string

	// NodeURL is the daemon's own base URL (URL is the router's with PLIMSOLL_TEST_ROUTER=1).
	NodeURL string

	cmd     *exec.Cmd
	done    chan struct{}
	uidPort net.Listener
	router  *exec.Cmd
	// args (but --listen) and env are what it was started with; a restart reuses them.
	args   []string
	env    []string
	starts int
}

// Options shape the daemon.
type Options struct {
	// Providers to configure (default process and crun).
	Providers []string
	// Extra is TOML appended to the top level of the settings (before any section).
	Extra string
	// Daemon is TOML appended to the [daemon] section.
	Daemon string
	// Grants is a grants file (TOML) passed with --grants; empty: none.
	Grants string
	// Env is added to the daemon's environment (the secrets grant profiles name).
	Env []string
	// Callers are more callers besides CallerName, each with a token of its own (Tokens).
	Callers []string
	// MaxConcurrent is the runs at once, in total and per caller (each open session holds
	// one for its whole life); 0: 4.
	MaxConcurrent int
}

// Start writes the settings and callers file, starts plimsolld and waits until every
// provider has been probed.
func Start(opts Options) (*Daemon, error) {
	if why := Missing(); why != "" {
		return nil, errors.New(why)
	}
	if len(opts.Providers) == 0 {
		opts.Providers = []string{"process", "crun"}
	}
	dir, err := os.MkdirTemp("", "plimsoll-go-client-")
	if err != nil {
		return nil, err
	}
	d := &Daemon{Dir: dir, Log: filepath.Join(dir, "plimsolld.log"), done: make(chan struct{})}
	fail := func(err error) (*Daemon, error) {
		d.Stop()
		return nil, err
	}
	// Sandbox uids must traverse it to reach their run directories under state.
	if err := os.Chmod(dir, 0o711); err != nil {
		return fail(err)
	}
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o711); err != nil {
		return fail(err)
	}
	callers := filepath.Join(dir, "callers.toml")
	if d.Tokens, err = writeCallers(callers, append([]string{CallerName}, opts.Callers...)); err != nil {
		return fail(err)
	}
	d.Token = d.Tokens[CallerName]
	if d.uidPort, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return fail(fmt.Errorf("cannot bind a loopback port (it picks the daemon's uid range): %w", err))
	}
	uidBase := UIDBaseForPort(d.uidPort.Addr().(*net.TCPAddr).Port)
	if opts.MaxConcurrent == 0 {
		opts.MaxConcurrent = 4
	}
	// The run uids, a controller uid per run and a probe uid per provider, inside the range.
	if 2*opts.MaxConcurrent+len(opts.Providers) >= uidsPerPort {
		return fail(fmt.Errorf("max_concurrent %d needs more uids than a port's range holds (%d)", opts.MaxConcurrent, uidsPerPort))
	}
	quoted := make([]string, len(opts.Providers))
	for i, p := range opts.Providers {
		quoted[i] = fmt.Sprintf("%q", p)
	}
	settings := fmt.Sprintf("providers = [%s]\ndefault_floor = \"container\"\nstate_dir = %q\n"+
		"sandbox_uid_base = %d\nmax_concurrent = %d\nmax_per_caller = %d\n%s\n\n"+
		"[oci]\nimage = %q\n\n[daemon]\ncallers_file = %q\n%s\n",
		strings.Join(quoted, ", "), state, uidBase, opts.MaxConcurrent, opts.MaxConcurrent, opts.Extra, Image(), callers, opts.Daemon)
	config := filepath.Join(dir, "plimsoll.toml")
	if err := os.WriteFile(config, []byte(settings), 0o600); err != nil {
		return fail(err)
	}
	d.args = []string{"--config", config}
	if opts.Grants != "" {
		grants := filepath.Join(dir, "grants.toml")
		if err := os.WriteFile(grants, []byte(opts.Grants), 0o600); err != nil {
			return fail(err)
		}
		d.args = append(d.args, "--grants", grants)
	}
	// A clean environment: the daemon reads only what is given here.
	d.env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PLIMSOLL_LOG=info"}, opts.Env...)
	if err := d.launch("127.0.0.1:0"); err != nil {
		return fail(err)
	}
	addr, err := d.waitListening()
	if err != nil {
		return fail(err)
	}
	d.URL = "http://" + addr
	d.NodeURL = d.URL
	if err := d.waitProbed(d.URL); err != nil {
		return fail(err)
	}
	if ThroughRouter() {
		if err := d.startRouter(callers); err != nil {
			return fail(err)
		}
	}
	return d, nil
}

// launch starts plimsolld on listen, its log in d.Log.
func (d *Daemon) launch(listen string) error {
	logFile, err := os.Create(d.Log)
	if err != nil {
		return err
	}
	defer logFile.Close()
	d.cmd = exec.Command(Plimsolld(), append(append([]string(nil), d.args...), "--listen", listen)...)
	d.cmd.Env = d.env
	d.cmd.Dir = d.Dir
	d.cmd.Stdout = nil
	d.cmd.Stderr = logFile
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := d.cmd.Start(); err != nil {
		return fmt.Errorf("cannot start %s: %w", Plimsolld(), err)
	}
	d.starts++
	done := make(chan struct{})
	d.done = done
	cmd := d.cmd
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	return nil
}

// Restart sends the daemon SIGTERM, waits for it to exit, and starts it again on the same
// settings, state directory and address (so clients, and the router in front, find it where
// it was); it returns once the new daemon is ready, which is once it has restored what the
// stopped one saved, and with a router once the router has learnt it. The stopped daemon's
// exit status is returned with any error.
func (d *Daemon) Restart() (*os.ProcessState, error) {
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return nil, err
	}
	select {
	case <-d.done:
	case <-time.After(stopTimeout):
		return nil, fmt.Errorf("plimsolld did not stop within %s of SIGTERM; see %s", stopTimeout, d.Log)
	}
	status := d.cmd.ProcessState
	listen := strings.TrimPrefix(d.NodeURL, "http://")
	d.Log = filepath.Join(d.Dir, fmt.Sprintf("plimsolld.%d.log", d.starts+1))
	if err := d.launch(listen); err != nil {
		return status, err
	}
	addr, err := d.waitListening()
	if err != nil {
		return status, err
	}
	if addr != listen {
		return status, fmt.Errorf("plimsolld came back on %s, not %s", addr, listen)
	}
	if err := d.waitProbed(d.NodeURL); err != nil {
		return status, err
	}
	if d.router != nil {
		return status, d.waitRouterLearnt()
	}
	return status, nil
}

// waitRouterLearnt waits until the router in front has learnt the daemon as it is now: its
// instance, and usable (a daemon is ready only once it restored what an earlier one saved,
// so the router then knows the instances it adopted too).
func (d *Daemon) waitRouterLearnt() error {
	resp, err := http.Get(d.NodeURL + "/readyz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	instance, node := resp.Header.Get("Plimsoll-Instance"), strings.TrimPrefix(d.NodeURL, "http://")
	deadline := time.Now().Add(listenTimeout)
	var last string
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest(http.MethodGet, d.URL+"/v1/nodes", nil)
		req.Header.Set("Authorization", "Bearer "+d.Token)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			var list struct {
				Nodes []struct {
					Node     string `json:"node"`
					Instance string `json:"instance"`
					Usable   bool   `json:"usable"`
				} `json:"nodes"`
			}
			err = json.NewDecoder(resp.Body).Decode(&list)
			resp.Body.Close()
			for _, n := range list.Nodes {
				if err == nil && n.Node == node && n.Instance == instance && n.Usable {
					return nil
				}
			}
			last = fmt.Sprintf("%+v (%v)", list.Nodes, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the router never learnt %s as instance %s: %s", node, instance, last)
}

// startRouter puts a plimsoll-router in front of the daemon (its own caller in the same
// callers file, learning the daemon every 200 ms); URL becomes the router's once it is ready.
func (d *Daemon) startRouter(callers string) error {
	token, entry, err := newCaller("router")
	if err != nil {
		return err
	}
	f, err := os.OpenFile(callers, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(entry)
	f.Close()
	if err != nil {
		return err
	}
	tokenFile := filepath.Join(d.Dir, "router.token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return err
	}
	logPath := filepath.Join(d.Dir, "router.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	d.router = exec.Command(Router(), "--listen", "127.0.0.1:0", "--refresh-ms", "200",
		"--nodes", strings.TrimPrefix(d.NodeURL, "http://"), "--callers", callers, "--token-file", tokenFile)
	d.router.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "PLIMSOLL_LOG=info"}
	d.router.Stderr = logFile
	d.router.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.router.Start(); err != nil {
		return fmt.Errorf("cannot start %s: %w", Router(), err)
	}
	deadline := time.Now().Add(listenTimeout)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(logPath)
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			var line struct {
				Message string `json:"message"`
				Addr    string `json:"addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "listening" && line.Addr != "" {
				url := "http://" + line.Addr
				for time.Now().Before(deadline) {
					resp, err := http.Get(url + "/readyz")
					if err == nil {
						resp.Body.Close()
						if resp.StatusCode == http.StatusOK {
							break
						}
					}
					time.Sleep(50 * time.Millisecond)
				}
				d.URL = url
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("plimsoll-router did not start listening; see %s", logPath)
}

// writeCallers creates a callers file holding these callers and returns their tokens by
// name: each `plm_` and 256 random bits in unpadded base64url; the file holds only the
// tokens' SHA-256.
func writeCallers(path string, names []string) (map[string]string, error) {
	tokens := map[string]string{}
	var text strings.Builder
	for _, name := range names {
		token, entry, err := newCaller(name)
		if err != nil {
			return nil, err
		}
		text.WriteString(entry)
		tokens[name] = token
	}
	return tokens, os.WriteFile(path, []byte(text.String()), 0o600)
}

// newCaller mints a caller's token and its callers-file entry.
func newCaller(name string) (token, entry string, err error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	token = "plm_" + base64.RawURLEncoding.EncodeToString(b[:])
	digest := sha256.Sum256([]byte(token))
	return token, fmt.Sprintf("[[caller]]\nname = %q\ntoken_sha256 = %q\n\n", name, hex.EncodeToString(digest[:])), nil
}

func (d *Daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// LogText is the daemon's log so far.
func (d *Daemon) LogText() string {
	b, _ := os.ReadFile(d.Log)
	return string(b)
}

func (d *Daemon) tail() string {
	lines := strings.Split(strings.TrimRight(d.LogText(), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

func (d *Daemon) waitListening() (string, error) {
	deadline := time.Now().Add(listenTimeout)
	for {
		sc := bufio.NewScanner(strings.NewReader(d.LogText()))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line struct {
				Message string `json:"message"`
				Addr    string `json:"addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "listening" && line.Addr != "" {
				return line.Addr, nil
			}
		}
		if d.exited() {
			return "", fmt.Errorf("plimsolld exited before it listened; the end of its log (%s):\n%s", d.Log, d.tail())
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("plimsolld did not start listening within %s; see %s", listenTimeout, d.Log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (d *Daemon) waitProbed(url string) error {
	deadline := time.Now().Add(probeTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		cancel()
		if err == nil && resp.StatusCode == http.StatusOK {
			return nil
		}
		if strings.Contains(d.LogText(), noneProbed) {
			return nil
		}
		if d.exited() {
			return fmt.Errorf("plimsolld exited before it was ready; the end of its log (%s):\n%s", d.Log, d.tail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("plimsolld probed its providers for more than %s; see %s", probeTimeout, d.Log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop sends SIGTERM, waits (SIGKILL after stopTimeout), and removes its directory.
func (d *Daemon) Stop() {
	if d.router != nil && d.router.Process != nil {
		_ = d.router.Process.Kill()
		_ = d.router.Wait()
	}
	if d.cmd != nil && d.cmd.Process != nil && !d.exited() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(stopTimeout):
			fmt.Fprintf(os.Stderr, "plimsolld did not stop within %s of SIGTERM; killing it\n", stopTimeout)
			_ = d.cmd.Process.Kill()
			<-d.done
		}
	}
	if d.uidPort != nil {
		d.uidPort.Close()
	}
	if d.Dir != "" {
		_ = os.RemoveAll(d.Dir)
	}
}
