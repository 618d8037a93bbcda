// Images without a daemon: a request's image (field 7) and a record's (field 12) read and
// digested as the golden vectors say, a selector checked before anything is sent, the
// providers listing's images, and the re-check that a run, a session and each of its calls
// ran in the image named. The answers are synthetic (built here, or served by an httptest
// server, not a daemon), and every digest in them is right: only the image check can fail
// them.

package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
)

var (
	imageIdentity = "sha256:" + strings.Repeat("5f", 32)
	otherIdentity = "sha256:" + strings.Repeat("6a", 32)
	pythonData    = &ImageRef{Name: "python-data", Identity: imageIdentity}
	sandboxImage  = &ImageRef{Name: "sandbox", Identity: otherIdentity}
)

func TestTheImageVectorsAreReadAndCovered(t *testing.T) {
	byName := map[string]vector{}
	for _, v := range loadVectors(t) {
		byName[v.Name] = v
	}
	for _, name := range []string{"request/image-by-name", "request/image-by-identity",
		"request/every-optional-field-and-image", "record/image", "record/session-call-image"} {
		if _, ok := byName[name]; !ok {
			t.Fatalf("no vector %s", name)
		}
	}
	var r Record
	if _, err := readStrict(byName["record/image"].Input, &r); err != nil {
		t.Fatal(err)
	}
	if r.Image == nil || *r.Image != *pythonData || !r.Image.Answers("python-data") || !r.Image.Answers(imageIdentity) || r.Image.Answers("sandbox") {
		t.Fatalf("record/image reads %+v", r.Image)
	}
	if got := RecordSHA256(&r); got != byName["record/image"].SHA256 {
		t.Fatalf("record/image digests to %s", got)
	}
	// withImage is the record/image vector's input, its image replaced by image (raw JSON).
	withImage := func(image string) []byte {
		var g map[string]any
		if err := json.Unmarshal(byName["record/image"].Input, &g); err != nil {
			t.Fatal(err)
		}
		g["image"] = json.RawMessage(image)
		return encodeJSON(t, g)
	}
	// Absent and null are one: the record without it keeps the digest it always had.
	var null Record
	if _, err := readStrict(withImage("null"), &null); err != nil || null.Image != nil {
		t.Fatalf("a null image: %v, %+v", err, null.Image)
	}
	plain := r
	plain.Image = nil
	if RecordSHA256(&null) != RecordSHA256(&plain) || RecordSHA256(&plain) == RecordSHA256(&r) {
		t.Error("a null image is not read as absent, or an image is not covered")
	}
	for _, changed := range []ImageRef{{Name: "sandbox", Identity: imageIdentity}, {Name: "python-data", Identity: otherIdentity}} {
		c := r
		c.Image = &changed
		if RecordSHA256(&c) == RecordSHA256(&r) {
			t.Errorf("%+v: not covered", changed)
		}
	}
	for name, image := range map[string]string{
		"no identity":    `{"name":"python-data"}`,
		"unknown member": `{"name":"python-data","identity":"` + imageIdentity + `","tag":"latest"}`,
		"a string":       `"python-data"`,
	} {
		var bad Record
		if _, err := readStrict(withImage(image), &bad); err == nil {
			t.Errorf("%s: read", name)
		}
	}
	// A request's image, as sent, is field 7.
	for _, name := range []string{"request/image-by-name", "request/image-by-identity"} {
		var w wireRequest
		if _, err := readStrict(byName[name].Input, &w); err != nil || w.Image == "" {
			t.Fatalf("%s: %v (%q)", name, err, w.Image)
		}
		if w.validate() != nil || sum(encodeRequest(&w)) != byName[name].SHA256 {
			t.Errorf("%s: digest", name)
		}
		w.Image = ""
		if sum(encodeRequest(&w)) == byName[name].SHA256 {
			t.Errorf("%s: the image is not covered", name)
		}
	}
}

func TestImageNamesAndIdentitiesAreToldApart(t *testing.T) {
	for _, good := range []string{"sandbox", "python-data", "a", "0.1_x-y", strings.Repeat("x", 64)} {
		if !IsImageName(good) || validateImage(good) != nil {
			t.Errorf("%q is a name", good)
		}
	}
	for _, bad := range []string{"", "Sandbox", "-x", ".x", "a b", "a/b", "a:b", strings.Repeat("x", 65), imageIdentity} {
		if IsImageName(bad) {
			t.Errorf("%q is not a name", bad)
		}
	}
	if !IsImageIdentity(imageIdentity) || validateImage(imageIdentity) != nil {
		t.Error("an identity")
	}
	for _, bad := range []string{"sha256:", "sha256:" + strings.Repeat("0A", 32), "sha512:" + strings.Repeat("0a", 32), "sha256:" + strings.Repeat("0a", 33)} {
		if IsImageIdentity(bad) || validateImage(bad) == nil {
			t.Errorf("%q is not an identity", bad)
		}
	}
}

// imaged is an honest answer to sent, its record naming image (nil: none).
func imaged(t *testing.T, sent *wireRequest, image *ImageRef) *Result {
	t.Helper()
	res := honest(t, sent, IsolationContainer, IsolationContainer)
	res.Record.Image = image
	res.Record.RecordSHA256 = RecordSHA256(&res.Record)
	return res
}

func sentNaming(image string) *wireRequest {
	w := sentWith(IsolationContainer)
	w.Image = image
	return w
}

// isImageMismatch checks err is an image mismatch about asked, where image ran.
func isImageMismatch(t *testing.T, err error, asked string, image *ImageRef, subject string) {
	t.Helper()
	var im *ImageMismatchError
	if !errors.As(err, &im) || im.Asked != asked || (im.Image == nil) != (image == nil) || (image != nil && *im.Image != *image) {
		t.Fatalf("want an image mismatch (asked %s, ran %v), got %v", asked, image, err)
	}
	// The code ran: an evidence mismatch, as the tier's is; never not dispatched.
	if !errors.Is(err, ErrImageMismatch) || !errors.Is(err, ErrEvidenceMismatch) || !errors.Is(err, ErrMayHaveRun) {
		t.Errorf("errors.Is: %v", err)
	}
	if _, ok := NotDispatchedReason(err); ok || errors.Is(err, ErrNotDispatched) {
		t.Errorf("an image mismatch reads not dispatched: %v", err)
	}
	if !strings.Contains(err.Error(), subject) || !strings.Contains(err.Error(), "evidence mismatch") {
		t.Errorf("message: %v", err)
	}
}

func TestARunMustRunInTheImageItNamed(t *testing.T) {
	for _, asked := range []string{"python-data", imageIdentity} {
		sent := sentNaming(asked)
		res, err := verify(sent, IsolationContainer, floorSent, imaged(t, sent, pythonData))
		if err != nil || res.Record.Image == nil || res.Record.Image.Name != "python-data" {
			t.Fatalf("%s: the image named: %v", asked, err)
		}
		for _, ran := range []*ImageRef{sandboxImage, nil} {
			_, err := verify(sent, IsolationContainer, floorSent, imaged(t, sent, ran))
			isImageMismatch(t, err, asked, ran, "the run")
		}
	}
	// Naming none, whichever ran is taken.
	none := sentNaming("")
	for _, ran := range []*ImageRef{pythonData, sandboxImage, nil} {
		if _, err := verify(none, IsolationContainer, floorSent, imaged(t, none, ran)); err != nil {
			t.Errorf("no image named, %v ran: %v", ran, err)
		}
	}
	// The image comes before the digests, as the tier does: a record's image swapped with its
	// digest left stale is an image mismatch when one was named, a digest mismatch otherwise.
	stale := imaged(t, none, pythonData)
	stale.Record.Image = sandboxImage
	if _, err := verify(none, IsolationContainer, floorSent, stale); !errors.Is(err, ErrDigestMismatch) {
		t.Errorf("stale, none named: %v", err)
	}
	named := sentNaming("python-data")
	swapped := imaged(t, named, pythonData)
	swapped.Record.Image = sandboxImage
	if _, err := verify(named, IsolationContainer, floorSent, swapped); !errors.Is(err, ErrImageMismatch) {
		t.Errorf("stale, named: %v", err)
	}
}

func sessionNamed(image *ImageRef) *SessionInfo {
	return &SessionInfo{SessionID: "ses_0123456789abcdef_" + strings.Repeat("a", 32), Language: Python, Provider: "p",
		Isolation: IsolationContainer, MinimumIsolation: IsolationContainer, EvidenceSHA256: strings.Repeat("e", 64),
		Environment: "test", Image: image}
}

func TestASessionMustOpenInTheImageItNamed(t *testing.T) {
	for _, asked := range []string{"python-data", imageIdentity} {
		w := &wireSessionOpen{Protocol: Protocol, RequestID: "r-open", Language: Python, MinimumIsolation: IsolationContainer, Image: asked}
		if err := w.validate(); err != nil {
			t.Fatal(err)
		}
		if err := checkOpened("r-open", w, IsolationContainer, floorSent, sessionNamed(pythonData)); err != nil {
			t.Fatalf("%s: the image named: %v", asked, err)
		}
		for _, ran := range []*ImageRef{sandboxImage, nil} {
			isImageMismatch(t, checkOpened("r-open", w, IsolationContainer, floorSent, sessionNamed(ran)), asked, ran, "the session")
		}
	}
	none := &wireSessionOpen{Protocol: Protocol, RequestID: "r-open", Language: Python}
	for _, ran := range []*ImageRef{pythonData, nil} {
		if err := checkOpened("r-open", none, IsolationContainer, floorSent, sessionNamed(ran)); err != nil {
			t.Errorf("no image named: %v", err)
		}
	}
}

func TestEveryCallOfASessionMustRunInTheImageItsOpenNamed(t *testing.T) {
	for _, asked := range []string{"python-data", imageIdentity} {
		sid := "ses_0123456789abcdef_" + strings.Repeat("a", 32)
		s := testSession(sid)
		s.image = asked
		s.info.Image = pythonData
		sent := sentWith("")
		first := linked(t, sent, sid, 1, "")
		first.Record.Image = pythonData
		first.Record.RecordSHA256 = RecordSHA256(&first.Record)
		if _, err := s.follow(first, callJob); err != nil {
			t.Fatalf("%s: the image named: %v", asked, err)
		}
		for _, ran := range []*ImageRef{sandboxImage, nil} {
			res := linked(t, sent, sid, 2, first.Record.RecordSHA256)
			res.Record.Image = ran
			res.Record.RecordSHA256 = RecordSHA256(&res.Record)
			_, err := s.follow(res, callJob)
			isImageMismatch(t, err, asked, ran, "the session call")
			if s.sequence != 1 {
				t.Fatal("the chain moved on an answer that failed its check")
			}
		}
	}
	// A session that named none holds its calls to no image.
	sid := "ses_0123456789abcdef_" + strings.Repeat("b", 32)
	s := testSession(sid)
	res := linked(t, sentWith(""), sid, 1, "")
	if _, err := s.follow(res, callJob); err != nil {
		t.Errorf("no image named: %v", err)
	}
}

// fakeDaemon is an httptest server answering what the client sends with synthetic answers
// whose digests are all right, their records (and the session) naming run, open and call.
type fakeDaemon struct {
	mu             sync.Mutex
	run, open, cll *ImageRef
	shown          *ImageRef
	seen           []map[string]any
}

func (f *fakeDaemon) serve(t *testing.T) *httptest.Server {
	sid := "ses_0123456789abcdef_" + strings.Repeat("c", 32)
	info := func(rid string, image *ImageRef) SessionInfo {
		i := *sessionNamed(image)
		i.SessionID, i.RequestID, i.Protocol, i.Wall = sid, rid, Protocol, Wall{RootReadOnly: true}
		return i
	}
	answer := func(body []byte, image *ImageRef, link *SessionLink) any {
		var w wireRequest
		if _, err := readStrict(body, &w); err != nil {
			t.Errorf("the client sent %s: %v", body, err)
		}
		res := honest(t, &w, IsolationContainer, IsolationContainer)
		if link != nil {
			kept := true
			res.Output.StateKept = &kept
			res.ResultSHA256 = ResultSHA256(&res.Output)
			res.Record.ResultSHA256 = res.ResultSHA256
		}
		res.Record.Session, res.Record.Image = link, image
		res.Record.RecordSHA256 = RecordSHA256(&res.Record)
		return res
	}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		defer f.mu.Unlock()
		seen := map[string]any{"method": r.Method, "path": r.URL.Path}
		if len(body) > 0 {
			var v map[string]any
			_ = json.Unmarshal(body, &v)
			seen["body"] = v
		}
		f.seen = append(f.seen, seen)
		var out any
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/v1/providers":
			out = map[string]any{"protocol": 1, "default_floor": "container", "providers": []any{},
				"images": []any{map[string]any{"name": "python-data", "identity": imageIdentity, "default": true, "languages": []string{"python"}}}}
		case r.Method == http.MethodPost && r.URL.Path == "/v1/runs":
			out = answer(body, f.run, nil)
		case r.Method == http.MethodPost && r.URL.Path == "/v1/sessions":
			var open struct {
				RequestID string `json:"request_id"`
			}
			_ = json.Unmarshal(body, &open)
			out = info(open.RequestID, f.open)
		case r.Method == http.MethodPost && r.URL.Path == "/v1/sessions/"+sid+"/cells":
			out = answer(body, f.cll, &SessionLink{SessionID: sid, Sequence: 1})
		case r.Method == http.MethodGet && r.URL.Path == "/v1/sessions/"+sid:
			out = info("", f.shown)
		case r.Method == http.MethodDelete && r.URL.Path == "/v1/sessions/"+sid:
			i := info(r.Header.Get(requestIDHeader), f.open)
			i.EndReason = EndClosed
			out = i
		default:
			http.NotFound(rw, r)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(out)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func (f *fakeDaemon) set(run, open, call, shown *ImageRef) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.run, f.open, f.cll, f.shown = run, open, call, shown
}

func (f *fakeDaemon) sent() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]any(nil), f.seen...)
}

func TestThroughTheClientTheImageIsSentAndChecked(t *testing.T) {
	f := &fakeDaemon{}
	c := New(f.serve(t).URL, "t")
	ctx := context.Background()
	lastBody := func() map[string]any {
		s := f.sent()
		b, _ := s[len(s)-1]["body"].(map[string]any)
		return b
	}

	// A selector that names no image is refused here, nothing sent.
	for _, bad := range []string{"Sandbox", "a:b", strings.Repeat("x", 65), "sha256:" + strings.Repeat("0A", 32)} {
		_, err := c.RunPython(ctx, Request{Code: "print(1)", MinimumIsolation: IsolationContainer, Image: bad})
		if reason, ok := NotDispatchedReason(err); !ok || reason != ReasonRequest || !strings.Contains(err.Error(), "neither an image name") {
			t.Errorf("run %q: %v", bad, err)
		}
		_, err = c.OpenSession(ctx, SessionOptions{Language: Python, MinimumIsolation: IsolationContainer, Image: bad})
		if reason, ok := NotDispatchedReason(err); !ok || reason != ReasonRequest {
			t.Errorf("open %q: %v", bad, err)
		}
	}
	if n := len(f.sent()); n != 0 {
		t.Fatalf("%d requests were sent", n)
	}

	// A run: the image is sent, and the record must name it.
	f.set(pythonData, pythonData, pythonData, pythonData)
	for _, asked := range []string{"python-data", imageIdentity} {
		res, err := c.RunPython(ctx, Request{Code: "print(1)", MinimumIsolation: IsolationContainer, Image: asked})
		if err != nil || res.Record.Image == nil || *res.Record.Image != *pythonData || lastBody()["image"] != asked {
			t.Fatalf("%s: %v", asked, err)
		}
	}
	if _, err := c.Run(ctx, RunRequest{Run: Project{Steps: []Step{{Run: "true"}}}, MinimumIsolation: IsolationContainer, Image: "python-data"}); err != nil {
		t.Fatalf("a project: %v", err)
	}
	for _, ran := range []*ImageRef{sandboxImage, nil} {
		f.set(ran, nil, nil, nil)
		_, err := c.RunPython(ctx, Request{Code: "print(1)", MinimumIsolation: IsolationContainer, Image: "python-data"})
		isImageMismatch(t, err, "python-data", ran, "the run")
	}
	if _, err := c.RunPython(ctx, Request{Code: "print(1)", MinimumIsolation: IsolationContainer}); err != nil {
		t.Fatalf("no image named: %v", err)
	} else if _, named := lastBody()["image"]; named {
		t.Error("a run that names no image sent one")
	}

	// A session: opened in the image named, else closed again; each call's record names it.
	f.set(nil, pythonData, pythonData, pythonData)
	s, err := c.OpenSession(ctx, SessionOptions{Language: Python, MinimumIsolation: IsolationContainer, Image: "python-data"})
	if err != nil || lastBody()["image"] != "python-data" || s.Info().Image == nil {
		t.Fatalf("open: %v", err)
	}
	if res, err := s.Cell(ctx, "print(1)", CellOptions{}); err != nil || res.Record.Image == nil {
		t.Fatalf("a call: %v", err)
	}
	// What the daemon shows later must be the image of the open.
	f.set(nil, pythonData, pythonData, sandboxImage)
	var se *SessionError
	if _, err := s.Refresh(ctx); !errors.As(err, &se) || se.Code != "bad_response" {
		t.Errorf("shown in another image: %v", err)
	}
	for _, ran := range []*ImageRef{sandboxImage, nil} {
		f.set(nil, pythonData, ran, pythonData)
		s, err := c.OpenSession(ctx, SessionOptions{Language: Python, MinimumIsolation: IsolationContainer, Image: imageIdentity})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		_, err = s.Cell(ctx, "print(1)", CellOptions{})
		isImageMismatch(t, err, imageIdentity, ran, "the session call")
	}
	for _, ran := range []*ImageRef{sandboxImage, nil} {
		f.set(nil, ran, pythonData, ran)
		before := len(f.sent())
		_, err := c.OpenSession(ctx, SessionOptions{Language: Python, MinimumIsolation: IsolationContainer, Image: "python-data"})
		isImageMismatch(t, err, "python-data", ran, "the session")
		var methods []string
		for _, r := range f.sent()[before:] {
			methods = append(methods, r["method"].(string))
		}
		if strings.Join(methods, " ") != "POST DELETE" {
			t.Errorf("the session opened in another image was not closed again: %v", methods)
		}
	}
}

func TestTheProvidersListingReadsItsImages(t *testing.T) {
	serve := func(listing string) *Client {
		srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			rw.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(rw, listing)
		}))
		t.Cleanup(srv.Close)
		return New(srv.URL, "t")
	}
	ctx := context.Background()
	tank := `{"name":"tank","path":"/opt/plimsoll/simulators/tank.wasm","sha256":"` + strings.Repeat("7a", 32) + `"}`
	images := `[{"name":"sandbox","identity":"` + otherIdentity + `","default":true,"languages":["python","javascript"],"vm_disk":true,` +
		`"simulators":[{"name":"cartpole","path":"/opt/plimsoll/simulators/cartpole.wasm","sha256":"` + strings.Repeat("c", 64) + `"},` + tank + `]},` +
		`{"name":"python-data","identity":"` + imageIdentity + `","default":false,"languages":["python"]}]`
	p, err := serve(`{"protocol":1,"default_floor":"container","providers":[],"images":` + images + `}`).Providers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Images) != 2 || !p.Images[0].VMDisk || p.Images[1].VMDisk || len(p.Images[0].Languages) != 2 || p.Images[1].Languages[0] != Python {
		t.Fatalf("images: %+v", p.Images)
	}
	// The simulators an image declares, in its index's order; none when left out.
	want := []SimulatorEntry{
		{Name: "cartpole", Path: "/opt/plimsoll/simulators/cartpole.wasm", SHA256: strings.Repeat("c", 64)},
		{Name: "tank", Path: "/opt/plimsoll/simulators/tank.wasm", SHA256: strings.Repeat("7a", 32)},
	}
	if !reflect.DeepEqual(p.Images[0].Simulators, want) || len(p.Images[1].Simulators) != 0 {
		t.Errorf("simulators: %+v", p.Images)
	}
	if s, ok := p.Images[0].Simulator("tank"); !ok || s != want[1] {
		t.Errorf("Simulator(tank): %+v", s)
	}
	if _, ok := p.Images[0].Simulator("boat"); ok {
		t.Error("Simulator(boat)")
	}
	for _, none := range []string{`,"simulators":null`, `,"simulators":[]`} {
		p, err := serve(`{"protocol":1,"default_floor":"container","providers":[],"images":[{"name":"sandbox","identity":"` +
			otherIdentity + `","default":true` + none + `}]}`).Providers(ctx)
		if err != nil || len(p.Images[0].Simulators) != 0 {
			t.Errorf("%q: %v", none, err)
		}
	}
	if i, ok := p.Image(imageIdentity); !ok || i.Name != "python-data" {
		t.Errorf("Image(identity): %+v", i)
	}
	if i, ok := p.Image("python-data"); !ok || i.Identity != imageIdentity {
		t.Errorf("Image(name): %+v", i)
	}
	if _, ok := p.Image("nope"); ok {
		t.Error("Image(nope)")
	}
	if i, ok := p.DefaultImage(); !ok || i.Name != "sandbox" {
		t.Errorf("DefaultImage: %+v", i)
	}
	// A daemon without images: absent, null or empty.
	for _, none := range []string{``, `,"images":null`, `,"images":[]`} {
		p, err := serve(`{"protocol":1,"default_floor":"container","providers":[]` + none + `}`).Providers(ctx)
		if err != nil || len(p.Images) != 0 {
			t.Errorf("%q: %v", none, err)
		}
		if _, ok := p.DefaultImage(); ok {
			t.Errorf("%q: a default image", none)
		}
	}
	for name, image := range map[string]string{
		"unknown language": `{"name":"sandbox","identity":"` + otherIdentity + `","default":true,"languages":["ruby"]}`,
		"unknown member":   `{"name":"sandbox","identity":"` + otherIdentity + `","default":true,"size":1}`,
		"no default":       `{"name":"sandbox","identity":"` + otherIdentity + `"}`,
		"simulator member": `{"name":"sandbox","identity":"` + otherIdentity + `","default":true,"simulators":[{"name":"tank","path":"/t","sha256":"` + strings.Repeat("7a", 32) + `","abi":1}]}`,
		"simulator digest": `{"name":"sandbox","identity":"` + otherIdentity + `","default":true,"simulators":[{"name":"tank","path":"/t","sha256":"` + strings.Repeat("7A", 32) + `"}]}`,
		"short digest":     `{"name":"sandbox","identity":"` + otherIdentity + `","default":true,"simulators":[{"name":"tank","path":"/t","sha256":"` + strings.Repeat("a", 63) + `"}]}`,
		"no path":          `{"name":"sandbox","identity":"` + otherIdentity + `","default":true,"simulators":[{"name":"tank","sha256":"` + strings.Repeat("7a", 32) + `"}]}`,
		"null digest":      `{"name":"sandbox","identity":"` + otherIdentity + `","default":true,"simulators":[{"name":"tank","path":"/t","sha256":null}]}`,
		"numeric name":     `{"name":"sandbox","identity":"` + otherIdentity + `","default":true,"simulators":[{"name":1,"path":"/t","sha256":"` + strings.Repeat("7a", 32) + `"}]}`,
		"null simulator":   `{"name":"sandbox","identity":"` + otherIdentity + `","default":true,"simulators":[null]}`,
		"simulators map":   `{"name":"sandbox","identity":"` + otherIdentity + `","default":true,"simulators":{}}`,
	} {
		_, err := serve(`{"protocol":1,"default_floor":"container","providers":[],"images":[` + image + `]}`).Providers(ctx)
		var pe *ProvidersError
		if !errors.As(err, &pe) || pe.Code != "bad_response" {
			t.Errorf("%s: %v", name, err)
		}
	}
}
