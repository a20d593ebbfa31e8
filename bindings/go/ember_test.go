// The binding scenarios of issue 11 (section 4), in Go.
package ember

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"ember/internal/emberc"
)

const prompt = "Name three colors."

// Every drafter drafts on it (tests/capi/speculative_test.cpp).
const counting = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
const kv = 64 << 20 // as bindings/tools/greedy_ref.c

func modelPath() string {
	if m := os.Getenv("EMBER_MODEL"); m != "" {
		return m
	}
	home := os.Getenv("EMBER_HOME")
	if home == "" {
		h, _ := os.UserHomeDir()
		home = filepath.Join(h, ".cache", "ember")
	}
	return filepath.Join(home, "SmolLM2-135M-Instruct.Q4_1.gguf")
}

var (
	shared     *Model
	sharedEng  *Engine
	sharedOnce sync.Once
)

func setup(t *testing.T) (*Model, *Engine) {
	t.Helper()
	if _, err := os.Stat(modelPath()); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("model missing: %s", modelPath())
		}
		t.Skipf("model not found at %s", modelPath())
	}
	sharedOnce.Do(func() {
		var err error
		if shared, err = LoadModel(modelPath()); err != nil {
			panic(err)
		}
		if sharedEng, err = NewEngine(shared, &EngineOptions{KVMemoryBytes: kv}); err != nil {
			panic(err)
		}
	})
	return shared, sharedEng
}

// must(f())(t) returns f's value, failing the test on f's error.
func must[T any](v T, err error) func(*testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func ok(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func greedy(n int) *Sampling {
	s := DefaultSampling()
	s.MaxTokens, s.Temperature = n, 0
	return &s
}

func runGreedy(t *testing.T, s *Session, opts *Sampling) *Stream {
	t.Helper()
	st := must(s.Generate(opts))(t)
	defer st.Close()
	must(st.ReadAll())(t)
	return st
}

func cAPIGreedy(t *testing.T, maxTokens int, message string) []int {
	t.Helper()
	ref := os.Getenv("EMBER_GREEDY_REF")
	if ref == "" {
		t.Fatal("EMBER_GREEDY_REF not set (run through CTest)")
	}
	out, err := exec.Command(ref, modelPath(), strconv.Itoa(maxTokens), message).Output()
	ok(t, err)
	var ids []int
	for _, f := range strings.Fields(string(out)) {
		ids = append(ids, must(strconv.Atoi(f))(t))
	}
	return ids
}

func expectStatus(t *testing.T, err error, status int) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("expected *ember.Error with status %d, got %v", status, err)
	}
	if e.Status != status || e.Message == "" {
		t.Fatalf("expected status %d with a message, got %d %q", status, e.Status, e.Message)
	}
	return e
}

// expectAllRefused: every one of bad is refused with StatusInvalidArgument
// (a stream started by mistake is closed before failing).
func expectAllRefused(t *testing.T, s *Session, bad []*Sampling, what string) {
	t.Helper()
	for i, b := range bad {
		st, err := s.Generate(b)
		if st != nil {
			st.Close()
			t.Fatalf("%s %d accepted", what, i)
		}
		expectStatus(t, err, StatusInvalidArgument)
	}
}

func TestLoadAndInfo(t *testing.T) {
	m, e := setup(t)
	info := must(m.Info())(t)
	if info.Architecture != "llama" || info.NLayers != 30 || info.VocabSize != 49152 || info.NParams < 100_000_000 {
		t.Fatalf("info %+v", info)
	}
	if d := must(e.Device())(t); d != "cpu" {
		t.Fatal(d)
	}
	if g := must(e.GPUIndex())(t); g != -1 {
		t.Fatal(g)
	}
	if b := must(e.BackendName())(t); !strings.HasPrefix(b, "cpu/") {
		t.Fatal(b)
	}
	var a, b, c int
	fmt.Sscanf(Version(), "%d.%d.%d", &a, &b, &c)
	if VersionNumber() != a*10000+b*100+c {
		t.Fatal(Version(), VersionNumber())
	}
	if isa := CPUISA(); isa != "scalar" && isa != "avx2" && isa != "avx512_vnni" {
		t.Fatal(isa)
	}
	if p := CUDAPlugin(); p != "absent" && p != "loadable" && p != "broken" {
		t.Fatal(p)
	}
}

func TestTokenizeRoundTrip(t *testing.T) {
	m, _ := setup(t)
	text := "Hello, world! Ünïcödé 🙂 and <|im_start|> text."
	ids := must(m.Tokenize(text, false, false))(t)
	if len(ids) == 0 {
		t.Fatal("no tokens")
	}
	if back := must(m.Detokenize(ids))(t); back != text {
		t.Fatalf("%q != %q", back, text)
	}
	if sp := must(m.Tokenize("<|im_start|>", false, true))(t); len(sp) != 1 {
		t.Fatal(sp)
	}
	if e := must(m.Detokenize(nil))(t); e != "" {
		t.Fatal(e)
	}
	_, err := m.Detokenize([]int{1_000_000_000})
	expectStatus(t, err, StatusInvalidArgument)
}

func TestGreedyMatchesTheCAPI(t *testing.T) {
	m, e := setup(t)
	expected := cAPIGreedy(t, 24, prompt)
	if len(expected) == 0 {
		t.Fatal("no reference tokens")
	}
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	ok(t, s.AddMessage("user", prompt))
	st := runGreedy(t, s, greedy(24))
	if fmt.Sprint(st.Tokens()) != fmt.Sprint(expected) {
		t.Fatalf("greedy tokens %v, the C API's %v", st.Tokens(), expected)
	}
	if txt := must(m.Detokenize(expected))(t); txt != st.Text() {
		t.Fatalf("%q != %q", txt, st.Text())
	}
}

func TestPiecesConcatenate(t *testing.T) {
	m, e := setup(t)
	s := must(e.NewSession(&SessionOptions{SystemPrompt: "You are brief."}))(t)
	defer s.Close()
	ok(t, s.AddMessage("user", prompt))
	o := DefaultSampling()
	o.MaxTokens, o.Temperature, o.Seed = 20, 0.8, 42
	st := must(s.Generate(&o))(t)
	var pieces []string
	for {
		p, err := st.Next()
		if err == io.EOF {
			break
		}
		ok(t, err)
		if p == "" {
			t.Fatal("empty piece")
		}
		pieces = append(pieces, p)
	}
	if len(pieces) < 2 || strings.Join(pieces, "") != st.Text() {
		t.Fatalf("pieces %q text %q", pieces, st.Text())
	}
	if txt := must(m.Detokenize(st.Tokens()))(t); txt != st.Text() {
		t.Fatal("text != detokenized tokens")
	}
	if r := st.EndReason(); r != EndMaxTokens && r != EndEOS {
		t.Fatal(r)
	}
	stats := must(st.Stats())(t)
	eos := int64(0) // (an end-of-generation token counts as generated; it is not sent)
	if st.EndReason() == EndEOS {
		eos = 1
	}
	if !stats.Finished || stats.GeneratedTokens != int64(len(st.Tokens()))+eos || stats.PromptTokens == 0 {
		t.Fatalf("%+v", stats)
	}
	ok(t, st.Close())
	if r := must(s.Chat("And three animals?", greedy(12)))(t); r == "" {
		t.Fatal("empty chat reply")
	}
}

func TestStopStrings(t *testing.T) {
	_, e := setup(t)
	s := must(e.NewSession(nil))(t)
	ok(t, s.AddMessage("user", prompt))
	full := runGreedy(t, s, greedy(24)).Text()
	s.Close()
	words := strings.Fields(full)
	if len(words) < 3 {
		t.Fatalf("few words in %q", full)
	}
	stop := words[2]
	expected := full[:strings.Index(full, stop)]
	s = must(e.NewSession(nil))(t)
	defer s.Close()
	ok(t, s.AddMessage("user", prompt))
	g := greedy(24)
	g.Stop = []string{stop, "\u2603never"}
	st := runGreedy(t, s, g)
	if st.EndReason() != EndStopString || st.Text() != expected {
		t.Fatalf("%v %q, expected %q", st.EndReason(), st.Text(), expected)
	}
}

func TestStructuredOutput(t *testing.T) {
	_, e := setup(t)
	s := must(e.NewSession(nil))(t)
	ok(t, s.AddMessage("user", "Where does the sun rise?"))
	g := greedy(8)
	g.Choices = []string{"east", "west"}
	if got := runGreedy(t, s, g).Text(); got != "east" && got != "west" {
		t.Fatalf("not a choice: %q", got)
	}
	s.Close()
	s = must(e.NewSession(nil))(t)
	defer s.Close()
	ok(t, s.AddMessage("user", "Which city is the capital of France? Answer in JSON."))
	g = greedy(48)
	g.JSONSchema = `{"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}`
	if got := runGreedy(t, s, g).Text(); !regexp.MustCompile(`^\{"city": "[^"]*"\}$`).MatchString(got) {
		t.Fatalf("not JSON of the schema: %q", got)
	}
	bad := greedy(4)
	bad.Regex = "("
	if _, err := s.Generate(bad); err == nil {
		t.Fatal("a bad regex was accepted")
	} else if ee, isErr := err.(*Error); !isErr || ee.Status != StatusInvalidArgument {
		t.Fatalf("bad regex: %v", err)
	}
}

func TestToolCalling(t *testing.T) {
	_, e := setup(t)
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	tools := `[{"type": "function", "function": {"name": "move_to", "description": "Walk to a point",
		"parameters": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
		"required": ["x", "y"]}}}]`
	ok(t, s.SetTools(tools))
	ok(t, s.AddMessage("user", "Walk to x 3, y 4."))
	g := greedy(64)
	g.ToolChoice = "move_to"
	st := runGreedy(t, s, g)
	if st.Text() != "" {
		t.Fatalf("text beside a forced call: %q", st.Text())
	}
	if len(st.Tokens()) == 0 {
		t.Fatal("the call's tokens are not in Tokens()")
	}
	calls := st.ToolCalls()
	if len(calls) != 1 || calls[0].Name != "move_to" || !strings.HasPrefix(calls[0].ID, "call_") {
		t.Fatalf("calls %+v", calls)
	}
	var args map[string]any
	ok(t, json.Unmarshal([]byte(calls[0].Arguments), &args))
	if len(args) != 2 {
		t.Fatalf("arguments %s", calls[0].Arguments)
	}
	for _, k := range []string{"x", "y"} {
		if v, isNum := args[k].(float64); !isNum || v != math.Trunc(v) {
			t.Fatalf("arguments %s: %s is not an integer", calls[0].Arguments, k)
		}
	}
	ok(t, s.AddMessage("tool", "arrived"))
	g = greedy(8)
	g.ToolChoice = "none"
	if calls := runGreedy(t, s, g).ToolCalls(); len(calls) != 0 {
		t.Fatalf("calls with ToolChoice none: %+v", calls)
	}
	g = greedy(4)
	g.ToolChoice = "fly_to"
	expectAllRefused(t, s, []*Sampling{g}, "an unknown tool")
	expectStatus(t, s.SetTools("not json"), StatusInvalidArgument)
	ok(t, s.SetTools(""))
	g = greedy(4)
	g.ToolChoice = "required"
	expectAllRefused(t, s, []*Sampling{g}, "required without tools")
}

func TestLogprobsAndLogitBias(t *testing.T) {
	_, e := setup(t)
	const text = "The capital of France is Paris. The capital of Italy is"
	s := must(e.NewSession(nil))(t)
	ok(t, s.AddText(text, false))
	g := greedy(6)
	g.IgnoreEOS, g.Logprobs, g.TopLogprobs = true, true, 3
	st := runGreedy(t, s, g)
	s.Close()
	tokens, lps := st.Tokens(), st.Logprobs()
	if len(tokens) != 6 || len(lps) != len(tokens) {
		t.Fatalf("tokens %v, logprobs %+v: one entry per token", tokens, lps)
	}
	for i, e := range lps {
		if e.Token != tokens[i] || !(e.Logprob <= 0) || len(e.TopTokens) != 3 || len(e.TopLogprobs) != 3 {
			t.Fatalf("entry %d %+v for token %d", i, e, tokens[i])
		}
		if e.TopTokens[0] != tokens[i] {
			t.Fatalf("entry %d %+v: greedy did not pick the most likely", i, e)
		}
	}
	s = must(e.NewSession(nil))(t)
	defer s.Close()
	ok(t, s.AddText(text, false))
	g = greedy(6)
	g.IgnoreEOS = true
	g.LogitBias = map[int]float32{tokens[0]: float32(math.Inf(-1))}
	st = runGreedy(t, s, g)
	for _, tok := range st.Tokens() {
		if tok == tokens[0] {
			t.Fatalf("banned token %d in %v", tokens[0], st.Tokens())
		}
	}
	if n := len(st.Logprobs()); n != 0 {
		t.Fatalf("%d logprobs without Logprobs", n)
	}
	top := greedy(2)
	top.TopLogprobs = 3 // without Logprobs
	negative := greedy(2)
	negative.LogitBias = map[int]float32{-5: 1}
	wide := greedy(2)
	wide.LogitBias = map[int]float32{1 << 32: 1} // not token 0
	expectAllRefused(t, s, []*Sampling{top, negative, wide}, "bad logits options")
}

func TestCancelFromAnotherGoroutine(t *testing.T) {
	_, e := setup(t)
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	ok(t, s.AddMessage("user", "Write a very long story about the sea."))
	g := greedy(400)
	g.IgnoreEOS = true
	st := must(s.Generate(g))(t)
	first := must(st.Next())(t)
	done := make(chan error)
	go func() { done <- st.Cancel() }()
	ok(t, <-done)
	rest, err := st.ReadAll()
	ok(t, err)
	if st.EndReason() != EndCancelled || len(st.Tokens()) >= 400 || !strings.HasPrefix(rest, first) {
		t.Fatalf("%v %d", st.EndReason(), len(st.Tokens()))
	}
	st.Close()
	must(s.Chat("Thanks.", greedy(4)))(t)
}

func TestTwoSessionsOnTwoGoroutines(t *testing.T) {
	_, e := setup(t)
	prompts := []string{"Name three colors.", "Count from one to five."}
	alone := make([]string, 2)
	for i, p := range prompts {
		s := must(e.NewSession(nil))(t)
		ok(t, s.AddMessage("user", p))
		alone[i] = fmt.Sprint(runGreedy(t, s, greedy(20)).Tokens())
		s.Close()
	}
	results := make([]string, 2)
	errs := make([]error, 2)
	var start, wg sync.WaitGroup
	start.Add(2)
	for i := range prompts {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s, err := e.NewSession(nil)
			if err == nil {
				defer s.Close()
				err = s.AddMessage("user", prompts[i])
			}
			start.Done()
			start.Wait()
			if err != nil {
				errs[i] = err
				return
			}
			st, err := s.Generate(greedy(20))
			if err != nil {
				errs[i] = err
				return
			}
			defer st.Close()
			_, errs[i] = st.ReadAll()
			results[i] = fmt.Sprint(st.Tokens())
		}(i)
	}
	wg.Wait()
	for i := range prompts {
		ok(t, errs[i])
		if results[i] != alone[i] {
			t.Fatalf("session %d: concurrent %s, alone %s", i, results[i], alone[i])
		}
	}
}

func TestSaveLoadContinueExactly(t *testing.T) {
	_, e := setup(t)
	path := filepath.Join(t.TempDir(), "chat.ember")
	a := must(e.NewSession(&SessionOptions{SystemPrompt: "You are brief."}))(t)
	ok(t, a.AddMessage("user", prompt))
	runGreedy(t, a, greedy(12))
	ok(t, a.Save(path))
	n := must(a.TokenCount())(t)
	ok(t, a.AddMessage("user", "Now three fruits."))
	contA := fmt.Sprint(runGreedy(t, a, greedy(16)).Tokens())
	a.Close()
	b := must(e.LoadSession(path))(t)
	defer b.Close()
	if m := must(b.TokenCount())(t); m != n {
		t.Fatalf("token count %d after load, %d saved", m, n)
	}
	ok(t, b.AddMessage("user", "Now three fruits."))
	if contB := fmt.Sprint(runGreedy(t, b, greedy(16)).Tokens()); contB != contA {
		t.Fatalf("continuation %s after load, %s before", contB, contA)
	}
	_, err := e.LoadSession(filepath.Join(t.TempDir(), "missing.ember"))
	expectStatus(t, err, StatusNotFound)
}

func TestMissingAndCorruptFiles(t *testing.T) {
	_, e := setup(t)
	_, err := LoadModel(filepath.Join(os.TempDir(), "ember-no-such-model.gguf"))
	me := expectStatus(t, err, StatusNotFound)
	if !strings.Contains(me.Message, "ember-no-such-model.gguf") || me.StatusName() != "EMBER_ERR_NOT_FOUND" {
		t.Fatal(me.Message, me.StatusName())
	}
	src := must(os.Open(modelPath()))(t)
	head := make([]byte, 100_000)
	must(io.ReadFull(src, head))(t)
	src.Close()
	corrupt := filepath.Join(t.TempDir(), "corrupt.gguf")
	ok(t, os.WriteFile(corrupt, head, 0o644)) // a truncated model
	_, err = LoadModel(corrupt)
	ce := expectStatus(t, err, StatusBadFormat)
	if !strings.Contains(ce.Message, "corrupt.gguf") || !strings.Contains(ce.Message, "gguf") {
		t.Fatal(ce.Message)
	}
	_, err = e.NewSession(&SessionOptions{Cache: "nope"})
	expectStatus(t, err, StatusInvalidArgument)
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	ok(t, s.AddMessage("user", "hi"))
	bad := DefaultSampling()
	bad.MaxTokens = 0
	_, err = s.Generate(&bad)
	if be := expectStatus(t, err, StatusInvalidArgument); !strings.Contains(be.Message, "max_tokens") {
		t.Fatal(be.Message)
	}
}

// The message must be the failing call's even when goroutines hop threads.
func TestErrorsFromManyGoroutines(t *testing.T) {
	_, e := setup(t)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < 50; j++ {
				name := fmt.Sprintf("missing-%d-%d.ember", i, j)
				_, err := e.LoadSession(filepath.Join(os.TempDir(), name))
				var ee *Error
				if !errors.As(err, &ee) || ee.Status != StatusNotFound || !strings.Contains(ee.Message, name) {
					t.Errorf("goroutine %d: %v", i, err)
					return
				}
				runtime.Gosched()
			}
		}(i)
	}
	wg.Wait()
}

func TestBusy(t *testing.T) {
	_, e := setup(t)
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	ok(t, s.AddMessage("user", prompt))
	g := greedy(50)
	g.IgnoreEOS = true
	st := must(s.Generate(g))(t)
	defer st.Close()
	_, err := s.Generate(greedy(5))
	expectStatus(t, err, StatusBusy)
}

func TestCloseInAnyOrder(t *testing.T) {
	setup(t)
	orders := [][]string{{"model", "engine", "session", "stream"}, {"stream", "session", "engine", "model"},
		{"engine", "model", "stream", "session"}, {"session", "stream", "model", "engine"}}
	for _, order := range orders {
		m := must(LoadModel(modelPath()))(t)
		e := must(NewEngine(m, &EngineOptions{KVMemoryBytes: 16 << 20}))(t)
		s := must(e.NewSession(nil))(t)
		ok(t, s.AddMessage("user", prompt))
		st := must(s.Generate(greedy(8)))(t)
		objs := map[string]io.Closer{"model": m, "engine": e, "session": s, "stream": st}
		for _, name := range order {
			ok(t, objs[name].Close())
			ok(t, objs[name].Close()) // twice is fine
			if !st.h.isClosed() {
				must(st.ReadAll())(t)
			}
			if !s.h.isClosed() && st.h.isClosed() {
				must(s.Chat("ok", greedy(2)))(t)
			}
		}
	}
}

func TestClosedHandlesError(t *testing.T) {
	setup(t)
	m := must(LoadModel(modelPath()))(t)
	e := must(NewEngine(m, &EngineOptions{KVMemoryBytes: 16 << 20}))(t)
	s := must(e.NewSession(nil))(t)
	ok(t, s.AddMessage("user", prompt))
	st := must(s.Generate(greedy(4)))(t)
	for _, c := range []io.Closer{st, s, e, m} {
		ok(t, c.Close())
	}
	_, err := m.Tokenize("x", false, false)
	expectStatus(t, err, StatusInvalidArgument)
	_, err = NewEngine(m, nil)
	expectStatus(t, err, StatusInvalidArgument)
	_, err = e.NewSession(nil)
	expectStatus(t, err, StatusInvalidArgument)
	expectStatus(t, s.AddMessage("user", "x"), StatusInvalidArgument)
	_, err = st.Next()
	if err == io.EOF {
		t.Fatal("a closed stream must report an error, not io.EOF")
	}
	expectStatus(t, err, StatusInvalidArgument)
	ok(t, st.Cancel()) // a no-op on a closed stream
}

func dropEverything(t *testing.T, manual bool) {
	m := must(LoadModel(modelPath()))(t)
	e := must(NewEngine(m, &EngineOptions{KVMemoryBytes: 16 << 20, ManualStep: manual}))(t)
	for i := 0; i < 3; i++ {
		s := must(e.NewSession(nil))(t)
		ok(t, s.AddMessage("user", "Write a long poem."))
		o := DefaultSampling()
		o.MaxTokens, o.IgnoreEOS = 500, true
		st := must(s.Generate(&o))(t)
		if !manual && i == 0 {
			must(st.Next())(t)
		}
	}
}

func TestDropToGCNeverBlocks(t *testing.T) {
	_, e := setup(t)
	for _, manual := range []bool{false, true} {
		t0 := time.Now()
		before := GCReleasedHandles()
		dropEverything(t, manual)
		// 3 streams + 3 sessions + engine + model, released by finalizers (one goroutine): a
		// release that waited for the engine (a manual one nobody steps: for ever) stalls the count.
		for GCReleasedHandles()-before < 8 && time.Since(t0) < 5*time.Second {
			runtime.GC()
			time.Sleep(20 * time.Millisecond)
		}
		if n := GCReleasedHandles() - before; n != 8 {
			t.Fatalf("finalizers released %d of 8 handles in %v", n, time.Since(t0))
		}
	}
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	must(s.Chat(prompt, greedy(2)))(t)
}

func TestManualStepEngine(t *testing.T) {
	m, _ := setup(t)
	e := must(NewEngine(m, &EngineOptions{ManualStep: true, KVMemoryBytes: 16 << 20}))(t)
	defer e.Close()
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	ok(t, s.AddMessage("user", prompt))
	st := must(s.Generate(greedy(8)))(t)
	defer st.Close()
	var sb strings.Builder
	for i := 0; i < 200 && !st.Finished(); i++ {
		must(e.Step(16, 0))(t)
		for {
			p, err := st.NextTimeout(0)
			if err == io.EOF {
				break
			}
			var ee *Error
			if errors.As(err, &ee) && ee.Status == StatusTimeout {
				break
			}
			ok(t, err)
			sb.WriteString(p)
		}
	}
	if !st.Finished() || sb.String() != st.Text() {
		t.Fatalf("finished %v, %q vs %q", st.Finished(), sb.String(), st.Text())
	}
	if fmt.Sprint(st.Tokens()) != fmt.Sprint(cAPIGreedy(t, 8, prompt)) {
		t.Fatal("manual greedy differs from the C API")
	}
}

func TestKVTypeQ8_0(t *testing.T) {
	m, f16 := setup(t)
	// A Q8_0 KV cache (half the memory per token, CPU only): a few greedy tokens come out, and
	// its session file (which records the KV type) is refused by the shared f16 engine.
	e := must(NewEngine(m, &EngineOptions{KVMemoryBytes: 16 << 20, KVType: "q8_0"}))(t)
	defer e.Close()
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	ok(t, s.AddMessage("user", prompt))
	st := runGreedy(t, s, greedy(6))
	if len(st.Tokens()) == 0 || st.Text() == "" {
		t.Fatalf("q8_0: tokens %v, text %q", st.Tokens(), st.Text())
	}
	if text := must(m.Detokenize(st.Tokens()))(t); text != st.Text() {
		t.Fatalf("q8_0: text %q, its tokens %q", st.Text(), text)
	}
	path := filepath.Join(t.TempDir(), "q8.ember")
	ok(t, s.Save(path))
	_, err := f16.LoadSession(path)
	if u := expectStatus(t, err, StatusUnsupported); !strings.Contains(u.Message, "q8_0") {
		t.Fatalf("f16 engine loading a q8_0 session: message %q", u.Message)
	}
	for _, bad := range []string{"q4_0", "F16", "auto"} {
		_, err = NewEngine(m, &EngineOptions{KVType: bad})
		if ee := expectStatus(t, err, StatusInvalidArgument); !strings.Contains(ee.Message, "kv type") {
			t.Fatalf("%q: message %q", bad, ee.Message)
		}
	}
}

func TestScore(t *testing.T) {
	m, e := setup(t)
	ids := must(m.Tokenize("The capital of France is Paris.", false, false))(t)
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	lp := must(s.Score(ids))(t)
	if len(lp) != len(ids) || !math.IsNaN(float64(lp[0])) {
		t.Fatal(lp)
	}
	for _, v := range lp[1:] {
		if v > 0 {
			t.Fatal(lp)
		}
	}
}

func TestEmbed(t *testing.T) {
	m, e := setup(t)
	texts := []string{"The quick brown fox jumps over the lazy dog.", "Dragons hate rain.", "Paris is in France."}
	info := must(m.Info())(t)
	if MaxEmbedInputs != emberc.MAX_EMBED_INPUTS {
		t.Fatalf("MaxEmbedInputs %d, the library's %d", MaxEmbedInputs, emberc.MAX_EMBED_INPUTS)
	}
	vectors := must(e.Embed(texts, nil))(t)
	if len(vectors) != len(texts) {
		t.Fatalf("%d vectors for %d texts", len(vectors), len(texts))
	}
	for _, v := range vectors {
		if len(v) != info.NEmbd {
			t.Fatalf("vector length %d, n_embd %d", len(v), info.NEmbd)
		}
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Fatal("not finite:", x)
			}
		}
	}
	if reflect.DeepEqual(vectors[0], vectors[1]) {
		t.Fatal("two texts, one vector")
	}
	if again := must(e.Embed(texts, &EmbedOptions{Pooling: PoolingMean}))(t); !reflect.DeepEqual(again, vectors) {
		t.Fatal("the same texts again: other vectors")
	}
	for i, text := range texts {
		if one := must(e.Embed([]string{text}, nil))(t); !reflect.DeepEqual(one[0], vectors[i]) {
			t.Fatalf("text %d alone differs from together", i)
		}
	}
	for _, v := range must(e.Embed(texts, &EmbedOptions{Normalize: true}))(t) {
		n := 0.0
		for _, x := range v {
			n += float64(x) * float64(x)
		}
		if math.Abs(math.Sqrt(n)-1) > 1e-4 {
			t.Fatal("normalised length", math.Sqrt(n))
		}
	}
	last := must(e.Embed(texts, &EmbedOptions{Pooling: PoolingLast}))(t)
	if len(last[0]) != info.NEmbd || reflect.DeepEqual(last[0], vectors[0]) {
		t.Fatal("last pooling equals mean")
	}
	if cls := must(e.Embed(texts[:1], &EmbedOptions{Pooling: "cls"}))(t); reflect.DeepEqual(cls[0], vectors[0]) {
		t.Fatal("cls pooling equals mean")
	}
	ids := make([][]int, len(texts))
	for i, text := range texts {
		ids[i] = must(m.Tokenize(text, true, false))(t)
	}
	if byTokens := must(e.EmbedTokens(ids, nil))(t); !reflect.DeepEqual(byTokens, vectors) {
		t.Fatal("the texts' tokens give other vectors")
	}
	if byTokens := must(e.EmbedTokens(ids, &EmbedOptions{Pooling: PoolingLast}))(t); !reflect.DeepEqual(byTokens, last) {
		t.Fatal("the texts' tokens give other vectors (last)")
	}
	// Bad input is an error; the engine goes on.
	for _, bad := range [][]string{{""}, {"a", ""}, {}, nil, {"a\x00b"}, make([]string, MaxEmbedInputs+1)} {
		_, err := e.Embed(bad, nil)
		expectStatus(t, err, StatusInvalidArgument)
	}
	for _, p := range []Pooling{"median", "MEAN"} {
		_, err := e.Embed(texts, &EmbedOptions{Pooling: p})
		expectStatus(t, err, StatusInvalidArgument)
	}
	for _, bad := range [][][]int{{}, {{}}, {{-1}}, {{info.VocabSize}}, {{1 << 40}}} {
		_, err := e.EmbedTokens(bad, nil)
		expectStatus(t, err, StatusInvalidArgument)
	}
	_, err := e.EmbedTokens([][]int{make([]int, info.ContextLength+1)}, nil)
	expectStatus(t, err, StatusContextFull)
	if again := must(e.Embed(texts[2:], nil))(t); !reflect.DeepEqual(again[0], vectors[2]) {
		t.Fatal("the engine does not go on")
	}
	closed := must(NewEngine(m, &EngineOptions{KVMemoryBytes: kv}))(t)
	closed.Close()
	_, err = closed.Embed(texts, nil)
	expectStatus(t, err, StatusInvalidArgument)
}

// specRun returns the tokens and stats of one stream on a fresh session
// (counting text, or a chat message).
func specRun(t *testing.T, e *Engine, countingText bool, opts *Sampling) ([]int, StreamStats) {
	t.Helper()
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	if countingText {
		ok(t, s.AddText(counting, false))
	} else {
		ok(t, s.AddMessage("user", prompt))
	}
	st := must(s.Generate(opts))(t)
	defer st.Close()
	must(st.ReadAll())(t)
	return st.Tokens(), must(st.Stats())(t)
}

func spec(n int, set func(*Sampling)) *Sampling {
	s := greedy(n)
	set(s)
	return s
}

// makeAdapter writes a rank-8 adapter for the test model (make_synthetic_model --lora-for).
func makeAdapter(t *testing.T) string {
	t.Helper()
	tool := os.Getenv("EMBER_MAKE_SYNTHETIC_MODEL")
	if tool == "" {
		t.Skip("EMBER_MAKE_SYNTHETIC_MODEL not set (run through CTest)")
	}
	path := filepath.Join(t.TempDir(), "lora.gguf")
	out, err := exec.Command(tool, "--lora-for", modelPath(), "--rank", "8", "--seed", "3", "--out", path).CombinedOutput()
	if err != nil {
		t.Fatalf("make_synthetic_model: %v\n%s", err, out)
	}
	return path
}

func loraGreedy(t *testing.T, e *Engine, loras []*Lora, scales []float32) []int {
	t.Helper()
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	if loras != nil {
		ok(t, s.SetLoras(loras, scales))
	}
	ok(t, s.AddMessage("user", prompt))
	return runGreedy(t, s, greedy(16)).Tokens()
}

func TestLora(t *testing.T) {
	m, e := setup(t)
	path := makeAdapter(t)
	lora := must(LoadLora(m, path))(t)
	defer lora.Close()
	info := must(lora.Info())(t)
	if info.MaxRank != 8 || info.NMatrices <= 0 || info.Bytes <= 0 || math.IsNaN(float64(info.Alpha)) ||
		math.IsInf(float64(info.Alpha), 0) {
		t.Fatalf("info %+v", info)
	}
	if lora.Model != m || lora.Path != path {
		t.Fatal("model or path")
	}
	base := loraGreedy(t, e, nil, nil)
	adapted := loraGreedy(t, e, []*Lora{lora}, []float32{1})
	if len(base) == 0 || len(adapted) == 0 || reflect.DeepEqual(base, adapted) {
		t.Fatalf("the adapter must change the greedy reply: %v vs %v", base, adapted)
	}
	if got := loraGreedy(t, e, []*Lora{lora}, nil); !reflect.DeepEqual(got, adapted) {
		t.Fatalf("nil scales (1.0): %v, want %v", got, adapted)
	}
	for name, got := range map[string][]int{
		"scale 0":     loraGreedy(t, e, []*Lora{lora}, []float32{0}),
		"no adapters": loraGreedy(t, e, []*Lora{}, nil),
	} {
		if !reflect.DeepEqual(got, base) {
			t.Fatalf("%s: %v, want the base %v", name, got, base)
		}
	}

	// Changed on one session: none restores the base model's output.
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	turn := func(want []int, what string) {
		t.Helper()
		ok(t, s.AddMessage("user", prompt))
		if got := runGreedy(t, s, greedy(16)).Tokens(); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: %v, want %v", what, got, want)
		}
	}
	ok(t, s.SetLoras([]*Lora{lora}, nil))
	turn(adapted, "with the adapter")
	ok(t, s.Reset())
	ok(t, s.SetLoras(nil, nil))
	turn(base, "set to none")

	// Refused sets return the library's message; the session goes on.
	ok(t, s.Reset())
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), -2000} {
		err := expectStatus(t, s.SetLoras([]*Lora{lora}, []float32{bad}), StatusInvalidArgument)
		if !strings.Contains(err.Message, "scale") {
			t.Fatal(err.Message)
		}
	}
	many := make([]*Lora, 17)
	for i := range many {
		many[i] = lora
	}
	if err := expectStatus(t, s.SetLoras(many, nil), StatusInvalidArgument); !strings.Contains(err.Message, "16") {
		t.Fatal(err.Message)
	}
	expectStatus(t, s.SetLoras([]*Lora{lora}, []float32{1, 1}), StatusInvalidArgument)
	expectStatus(t, s.SetLoras([]*Lora{lora, nil}, nil), StatusInvalidArgument)
	turn(base, "after refused sets")
	g := greedy(50)
	g.IgnoreEOS = true
	st := must(s.Generate(g))(t)
	expectStatus(t, s.SetLoras([]*Lora{lora}, nil), StatusBusy)
	st.Close()

	// Closing the adapter while a session uses it: the session keeps it alive.
	s2 := must(e.NewSession(nil))(t)
	defer s2.Close()
	dropped := must(LoadLora(m, path))(t)
	ok(t, s2.SetLoras([]*Lora{dropped}, nil))
	ok(t, dropped.Close())
	ok(t, s2.AddMessage("user", prompt))
	if got := runGreedy(t, s2, greedy(16)).Tokens(); !reflect.DeepEqual(got, adapted) {
		t.Fatalf("after close: %v, want %v", got, adapted)
	}
	expectStatus(t, s2.SetLoras([]*Lora{dropped}, nil), StatusInvalidArgument)
	_, err := dropped.Info()
	expectStatus(t, err, StatusInvalidArgument)
	ok(t, s2.Reset())
	ok(t, s2.AddMessage("user", prompt))
	if got := runGreedy(t, s2, greedy(16)).Tokens(); !reflect.DeepEqual(got, adapted) {
		t.Fatalf("the set it had: %v, want %v", got, adapted)
	}

	// ... and in the middle of a stream.
	s3 := must(e.NewSession(nil))(t)
	defer s3.Close()
	mid := must(LoadLora(m, path))(t)
	ok(t, s3.SetLoras([]*Lora{mid}, nil))
	ok(t, s3.AddMessage("user", prompt))
	st3 := must(s3.Generate(greedy(16)))(t)
	defer st3.Close()
	must(st3.Next())(t)
	ok(t, mid.Close())
	must(st3.ReadAll())(t)
	if got := st3.Tokens(); !reflect.DeepEqual(got, adapted) {
		t.Fatalf("closed mid-stream: %v, want %v", got, adapted)
	}

	// Not an adapter.
	_, err = LoadLora(m, modelPath())
	if be := expectStatus(t, err, StatusBadFormat); !strings.Contains(be.Message, "not an adapter") {
		t.Fatal(be.Message)
	}
	_, err = LoadLora(m, filepath.Join(t.TempDir(), "missing.gguf"))
	expectStatus(t, err, StatusNotFound)
	_, err = LoadLora(nil, path)
	expectStatus(t, err, StatusInvalidArgument)
}

func TestSpeculativeGreedyEqualsPlain(t *testing.T) {
	_, e := setup(t)
	draft := must(LoadModel(modelPath()))(t) // the same file loaded twice: exactness, not speed
	defer draft.Close()
	drafters := []struct {
		name string
		opts *Sampling
	}{
		{"ngram", spec(24, func(s *Sampling) { s.SpecDrafter = "ngram" })},
		{"self", spec(24, func(s *Sampling) { s.SpecDrafter, s.SpecSelfLayers = "self", 20 })},
		{"draft", spec(24, func(s *Sampling) { s.SpecDrafter, s.SpecDraftModel = "draft", draft })},
		{"draft (implied), chains", spec(24, func(s *Sampling) {
			s.SpecDraftModel, s.SpecThreshold, s.SpecMaxNodes, s.SpecMaxDepth, s.SpecAlpha = draft, 2, 6, 6, 0.5
		})},
	}
	for _, countingText := range []bool{true, false} {
		plain, ps := specRun(t, e, countingText, greedy(24))
		if len(plain) == 0 || ps.DraftedTokens != 0 || ps.VerifyPasses != 0 {
			t.Fatalf("plain: %v %+v", plain, ps)
		}
		for _, d := range drafters {
			what := fmt.Sprintf("%s (counting %v)", d.name, countingText)
			tokens, st := specRun(t, e, countingText, d.opts)
			if fmt.Sprint(tokens) != fmt.Sprint(plain) {
				t.Fatalf("%s: %v, want %v", what, tokens, plain)
			}
			if st.GeneratedTokens != ps.GeneratedTokens || st.AcceptedTokens > st.DraftedTokens {
				t.Fatalf("%s: %+v", what, st)
			}
			if countingText && (st.DraftedTokens == 0 || st.VerifyPasses == 0 ||
				math.Abs(st.MeanAcceptedLength-float64(st.AcceptedTokens)/float64(st.VerifyPasses)) > 1e-9) {
				t.Fatalf("%s: %+v", what, st)
			}
		}
	}
	// SpecNoLookup: the draft alone; one as costly as the model itself is never run.
	plain, _ := specRun(t, e, true, greedy(24))
	tokens, st := specRun(t, e, true, spec(24, func(s *Sampling) { s.SpecDraftModel, s.SpecNoLookup = draft, true }))
	if fmt.Sprint(tokens) != fmt.Sprint(plain) || st.DraftedTokens != 0 {
		t.Fatalf("draft alone: %v %+v, want %v and nothing drafted", tokens, st, plain)
	}
}

func TestSpeculativeStreamKeepsItsDraftModel(t *testing.T) {
	_, e := setup(t)
	plain, _ := specRun(t, e, true, greedy(16))
	draft := must(LoadModel(modelPath()))(t)
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	ok(t, s.AddText(counting, false))
	st := must(s.Generate(spec(16, func(o *Sampling) { o.SpecDraftModel = draft })))(t)
	defer st.Close()
	if st.DraftModel != draft {
		t.Fatal("the stream does not hold its draft model")
	}
	draft.Close() // the stream keeps it loaded until it ends
	must(st.ReadAll())(t)
	if fmt.Sprint(st.Tokens()) != fmt.Sprint(plain) {
		t.Fatalf("%v, want %v", st.Tokens(), plain)
	}
	if stats := must(st.Stats())(t); stats.VerifyPasses == 0 {
		t.Fatalf("%+v", stats)
	}
	s2 := must(e.NewSession(nil))(t)
	defer s2.Close()
	ok(t, s2.AddText(counting, false))
	_, err := s2.Generate(spec(4, func(o *Sampling) { o.SpecDraftModel = draft }))
	expectStatus(t, err, StatusInvalidArgument) // a closed model
}

func TestSpeculativeBadParameters(t *testing.T) {
	m, e := setup(t)
	bad := []*Sampling{
		spec(4, func(s *Sampling) { s.SpecDrafter, s.SpecMaxNodes = "ngram", 0 }),
		spec(4, func(s *Sampling) { s.SpecDrafter, s.SpecMaxNodes = "ngram", 1000 }),
		spec(4, func(s *Sampling) { s.SpecDrafter, s.SpecMaxDepth = "ngram", 0 }),
		spec(4, func(s *Sampling) { s.SpecDrafter, s.SpecThreshold = "ngram", float32(math.NaN()) }),
		spec(4, func(s *Sampling) { s.SpecDrafter, s.SpecAlpha = "ngram", 2 }),
		spec(4, func(s *Sampling) { s.SpecDrafter, s.SpecSelfLayers = "self", 1000 }),
		spec(4, func(s *Sampling) { s.SpecDrafter, s.SpecSelfLayers = "self", -1 }),
		spec(4, func(s *Sampling) { s.SpecDrafter = "draft" }), // no draft model
		spec(4, func(s *Sampling) { s.SpecDrafter = "eagle" }),
		spec(4, func(s *Sampling) { s.SpecDrafter, s.SpecDraftModel = "ngram", m }),
	}
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	ok(t, s.AddText(counting, false))
	expectAllRefused(t, s, bad, "bad parameters")
	_, err := s.Generate(bad[1])
	if be := expectStatus(t, err, StatusInvalidArgument); !strings.Contains(be.Message, "max_nodes") {
		t.Fatal(be.Message)
	}
	// A draft model with another vocabulary is refused by the engine.
	other := filepath.Join(filepath.Dir(modelPath()), "gemma-3-270m-q4_k_m.gguf")
	if _, err := os.Stat(other); err == nil {
		gemma := must(LoadModel(other))(t)
		_, err := s.Generate(spec(4, func(o *Sampling) { o.SpecDraftModel = gemma }))
		if ve := expectStatus(t, err, StatusInvalidArgument); !strings.Contains(ve.Message, "vocabulary") {
			t.Fatal(ve.Message)
		}
		gemma.Close()
	} else if os.Getenv("CI") != "" {
		t.Fatalf("model missing: %s", other)
	}
	// Nothing above left the session busy.
	if n := len(runGreedy(t, s, spec(4, func(o *Sampling) { o.SpecDrafter = "ngram" })).Tokens()); n != 4 {
		t.Fatalf("%d tokens after the errors", n)
	}
}

func TestSamplingDefaultsAreTheLibrarys(t *testing.T) {
	g := DefaultSampling()
	d := emberc.NewEb_sampling()
	defer emberc.DeleteEb_sampling(d)
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"MaxTokens", g.MaxTokens, d.GetMax_tokens()}, {"Temperature", g.Temperature, d.GetTemperature()},
		{"TopK", g.TopK, d.GetTop_k()}, {"TopP", g.TopP, d.GetTop_p()}, {"MinP", g.MinP, d.GetMin_p()},
		{"RepeatPenalty", g.RepeatPenalty, d.GetRepeat_penalty()},
		{"PresencePenalty", g.PresencePenalty, d.GetPresence_penalty()},
		{"FrequencyPenalty", g.FrequencyPenalty, d.GetFrequency_penalty()},
		{"PenaltyLastN", g.PenaltyLastN, d.GetPenalty_last_n()},
		{"ParallelToolCalls", b2i(!g.NoParallelToolCalls), d.GetParallel_tool_calls()},
		{"Logprobs", b2i(g.Logprobs), d.GetLogprobs()}, {"TopLogprobs", g.TopLogprobs, d.GetTop_logprobs()},
	} {
		if c.got != c.want {
			t.Errorf("DefaultSampling().%s = %v, want the library's %v", c.name, c.got, c.want)
		}
	}
}

func TestPenaltiesReachTheEngine(t *testing.T) {
	_, e := setup(t)
	plain, _ := specRun(t, e, true, greedy(24)) // greedy repeats ", " and digits
	penalised := []struct {
		name string
		opts *Sampling
	}{
		{"frequency", spec(24, func(s *Sampling) { s.FrequencyPenalty = 5 })},
		{"presence", spec(24, func(s *Sampling) { s.PresencePenalty = 5 })},
		{"frequency, whole history", spec(24, func(s *Sampling) { s.FrequencyPenalty, s.PenaltyLastN = 5, -1 })},
	}
	for _, p := range penalised {
		if tokens, _ := specRun(t, e, true, p.opts); fmt.Sprint(tokens) == fmt.Sprint(plain) {
			t.Fatalf("%s penalty: the greedy tokens did not change: %v", p.name, tokens)
		}
	}
	// An empty window (PenaltyLastN 0) turns the penalties off.
	off, _ := specRun(t, e, true, spec(24, func(s *Sampling) {
		s.FrequencyPenalty, s.PresencePenalty, s.PenaltyLastN = 5, 5, 0
	}))
	if fmt.Sprint(off) != fmt.Sprint(plain) {
		t.Fatalf("penalties with PenaltyLastN 0: %v, want %v", off, plain)
	}
}

func TestPenaltiesBadValues(t *testing.T) {
	_, e := setup(t)
	bad := []*Sampling{
		spec(4, func(s *Sampling) { s.PenaltyLastN = -2 }),
		spec(4, func(s *Sampling) { s.PresencePenalty = float32(math.NaN()) }),
		spec(4, func(s *Sampling) { s.FrequencyPenalty = float32(math.Inf(1)) }),
		spec(4, func(s *Sampling) { s.PresencePenalty = 101 }),
		spec(4, func(s *Sampling) { s.FrequencyPenalty = -101 }),
	}
	s := must(e.NewSession(nil))(t)
	defer s.Close()
	ok(t, s.AddText(counting, false))
	expectAllRefused(t, s, bad, "bad penalty")
	_, err := s.Generate(bad[0])
	if be := expectStatus(t, err, StatusInvalidArgument); !strings.Contains(be.Message, "penalty_last_n") {
		t.Fatal(be.Message)
	}
	// Nothing above left the session busy.
	if n := len(runGreedy(t, s, spec(4, func(o *Sampling) { o.PenaltyLastN = -1 })).Tokens()); n != 4 {
		t.Fatalf("%d tokens after the errors", n)
	}
}
