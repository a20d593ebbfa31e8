// Package ember is the Go binding of Ember, an embeddable LLM inference
// engine. It is a thin layer over the SWIG-generated package
// ember/internal/emberc (from bindings/ember.i; generate it with
// `go generate` or let CMake build the module under build/bindings/go).
//
//	model, err := ember.LoadModel(path)
//	engine, err := ember.NewEngine(model, nil)
//	session, err := engine.NewSession(&ember.SessionOptions{SystemPrompt: "You are brief."})
//	session.AddMessage("user", "Hello!")
//	stream, err := session.Generate(nil)
//	for {
//		piece, err := stream.Next()
//		if err == io.EOF { break }
//		fmt.Print(piece)
//	}
//
// Every handle has Close (idempotent, any order: an engine keeps its model
// alive, a session its engine, a stream its session); a closed handle returns
// an *Error with StatusInvalidArgument. Handles dropped without Close are
// released by finalizers that never block on the engine.
//
// Errors are *Error values with the library's status and message. The
// library's message is per OS thread; every call pins its goroutine
// (runtime.LockOSThread) across the native call and the read of the message,
// so the message is that call's even though goroutines move between threads.
package ember

//go:generate swig -go -cgo -intgosize 64 -I../../include -outdir internal/emberc -o internal/emberc/ember_wrap.c ../ember.i

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"ember/internal/emberc"
)

// Status codes (ember_status).
const (
	StatusOK              = 0
	StatusInvalidArgument = 1
	StatusNotFound        = 2
	StatusBadFormat       = 3
	StatusUnsupported     = 4
	StatusOutOfMemory     = 5
	StatusContextFull     = 6
	StatusBusy            = 7
	StatusCancelled       = 8
	StatusTimeout         = 9
	StatusInternal        = 10
	StatusEndOfStream     = 11
)

// Error is a failed Ember call.
type Error struct {
	Status  int    // ember_status
	Message string // the library's message
}

func (e *Error) Error() string { return e.Message }

// StatusName is the status's constant name, e.g. "EMBER_ERR_NOT_FOUND".
func (e *Error) StatusName() string { return emberc.Ember_status_string(e.Status) }

// call runs f on a pinned OS thread and returns the failure it recorded.
func call[T any](f func() T) (T, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := f()
	if st := emberc.Eb_last_status(); st != 0 {
		return r, &Error{Status: st, Message: emberc.Eb_last_message()}
	}
	return r, nil
}

func call0(f func()) error {
	_, err := call(func() struct{} { f(); return struct{}{} })
	return err
}

// handle guards one native handle: calls use it between acquire and release;
// close releases it once, after the calls in flight.
type handle[T any] struct {
	mu      sync.Mutex
	ptr     T
	valid   bool
	busy    int
	closed  bool
	release func(T)
	what    string
}

func newHandle[T any](p T, release func(T), what string) *handle[T] {
	return &handle[T]{ptr: p, valid: true, release: release, what: what}
}

func (h *handle[T]) acquire() (T, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		var zero T
		return zero, &Error{Status: StatusInvalidArgument, Message: "the " + h.what + " is closed"}
	}
	h.busy++
	return h.ptr, nil
}

func (h *handle[T]) done() {
	h.mu.Lock()
	h.busy--
	var p T
	free := h.closed && h.busy == 0 && h.valid
	if free {
		p, h.valid = h.ptr, false
	}
	how := h.release
	h.mu.Unlock()
	if free {
		how(p)
	}
}

func (h *handle[T]) isClosed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

// close closes the handle; true when this call closed it.
func (h *handle[T]) close(how func(T)) bool {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return false
	}
	h.closed = true
	if how != nil {
		h.release = how
	}
	if h.busy > 0 || !h.valid { // the last call in flight releases it
		h.mu.Unlock()
		return true
	}
	p, r := h.ptr, h.release
	h.valid = false
	h.mu.Unlock()
	r(p)
	return true
}

var gcReleased atomic.Int64

// gcClose is the finalizers' path: it counts what it released.
func gcClose[T any](h *handle[T], how func(T)) {
	if h.close(how) {
		gcReleased.Add(1)
	}
}

// GCReleasedHandles is a diagnostic: how many handles finalizers have released
// so far (handles dropped without Close; none of those releases waits for the engine).
func GCReleasedHandles() int64 { return gcReleased.Load() }

// use runs f with the native handle and returns f's result and recorded failure.
func use[T any, R any](h *handle[T], f func(T) R) (R, error) {
	p, err := h.acquire()
	if err != nil {
		var zero R
		return zero, err
	}
	defer h.done()
	return call(func() R { return f(p) })
}

func use0[T any](h *handle[T], f func(T)) error {
	_, err := use(h, func(p T) struct{} { f(p); return struct{}{} })
	return err
}

// Version is the library's version, "MAJOR.MINOR.PATCH".
func Version() string { return emberc.Ember_version() }

// VersionNumber is MAJOR*10000 + MINOR*100 + PATCH.
func VersionNumber() int { return emberc.Ember_version_number() }

// CPUISA is the CPU kernels in use: "scalar", "avx2" or "avx512_vnni".
func CPUISA() string { return emberc.Eb_cpu_isa_name() }

// CUDAPlugin says whether the CUDA plugin is "absent", "loadable" or "broken".
func CUDAPlugin() string {
	switch emberc.Eb_cuda_plugin() {
	case 0:
		return "absent"
	case 1:
		return "loadable"
	case 2:
		return "broken"
	}
	return "unknown"
}

func tokensIn(ids []int) emberc.Eb_tokens {
	t := emberc.NewEb_tokens(int64(len(ids)))
	for i, v := range ids {
		t.Set(int64(i), v)
	}
	return t
}

func tokensOut(t emberc.Eb_tokens) []int {
	out := make([]int, t.Size())
	for i := range out {
		out[i] = t.Get(int64(i))
	}
	emberc.DeleteEb_tokens(t)
	return out
}

// ModelInfo is a model's metadata.
type ModelInfo struct {
	Architecture, Name                                         string
	NParams                                                    int64
	ContextLength, VocabSize, NLayers, NEmbd, NHeads, NKVHeads int
	BOSToken, EOSToken                                         int
}

// Model is a GGUF model (weights, tokenizer, chat template); safe for concurrent use.
type Model struct {
	h    *handle[emberc.Struct_SS_ember_model]
	Path string
}

// LoadModel loads a GGUF model.
func LoadModel(path string) (*Model, error) {
	p, err := call(func() emberc.Struct_SS_ember_model { return emberc.Eb_model_load(path) })
	if err != nil {
		return nil, err
	}
	m := &Model{h: newHandle(p, emberc.Ember_model_destroy, "Model"), Path: path}
	runtime.SetFinalizer(m, func(m *Model) { gcClose(m.h, nil) })
	return m, nil
}

// Close releases the model; engines using it keep it alive.
func (m *Model) Close() error { m.h.close(nil); return nil }

// Info returns the model's metadata.
func (m *Model) Info() (ModelInfo, error) {
	raw := emberc.NewEb_model_info()
	defer emberc.DeleteEb_model_info(raw)
	err := use0(m.h, func(p emberc.Struct_SS_ember_model) { emberc.Eb_model_info_get(p, raw) })
	if err != nil {
		return ModelInfo{}, err
	}
	return ModelInfo{raw.GetArchitecture(), raw.GetName(), raw.GetN_params(), raw.GetContext_length(),
		raw.GetVocab_size(), raw.GetN_layers(), raw.GetN_embd(), raw.GetN_heads(), raw.GetN_kv_heads(),
		raw.GetBos_token(), raw.GetEos_token()}, nil
}

// Tokenize converts text to token ids (special tokens recognised when parseSpecial).
func (m *Model) Tokenize(text string, addSpecial, parseSpecial bool) ([]int, error) {
	t, err := use(m.h, func(p emberc.Struct_SS_ember_model) emberc.Eb_tokens {
		return emberc.Eb_tokenize(p, text, b2i(addSpecial), b2i(parseSpecial))
	})
	if err != nil {
		return nil, err
	}
	return tokensOut(t), nil
}

// Detokenize converts token ids to text.
func (m *Model) Detokenize(ids []int) (string, error) {
	t := tokensIn(ids)
	defer emberc.DeleteEb_tokens(t)
	return use(m.h, func(p emberc.Struct_SS_ember_model) string { return emberc.Eb_detokenize(p, t) })
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// LoraInfo is a LoRA adapter's metadata (ember_lora_info_t).
type LoraInfo struct {
	NMatrices int     // matrices adapted
	MaxRank   int     // the largest rank of its pairs
	Alpha     float32 // adapter.lora.alpha (0: none; each term is then scaled by its scale alone)
	Bytes     int64   // the adapter's tensors
}

// Lora is a LoRA adapter (C ABI 1.6) loaded for a model; use it with
// Session.SetLoras. Immutable and safe for concurrent use: share it across
// sessions and engines of the model. Sessions using it keep it alive, so
// Close is safe at any time.
type Lora struct {
	h     *handle[emberc.Struct_SS_ember_lora]
	Model *Model
	Path  string
}

// LoadLora loads a LoRA adapter in llama.cpp's GGUF format for model (made
// for its architecture and shapes; the file is read once). Errors:
// StatusNotFound, StatusBadFormat (not an adapter, corrupt),
// StatusInvalidArgument (an adapter for another model), StatusUnsupported.
func LoadLora(model *Model, path string) (*Lora, error) {
	if model == nil {
		return nil, &Error{StatusInvalidArgument, "model is nil"}
	}
	p, err := use(model.h, func(m emberc.Struct_SS_ember_model) emberc.Struct_SS_ember_lora {
		return emberc.Eb_lora_load(m, path)
	})
	if err != nil {
		return nil, err
	}
	l := &Lora{h: newHandle(p, emberc.Ember_lora_destroy, "Lora"), Model: model, Path: path}
	runtime.SetFinalizer(l, func(l *Lora) { gcClose(l.h, nil) })
	return l, nil
}

// Close releases the adapter; sessions using it keep it alive.
func (l *Lora) Close() error { l.h.close(nil); return nil }

// Info returns the adapter's metadata.
func (l *Lora) Info() (LoraInfo, error) {
	raw := emberc.NewEb_lora_info()
	defer emberc.DeleteEb_lora_info(raw)
	err := use0(l.h, func(p emberc.Struct_SS_ember_lora) { emberc.Eb_lora_info_get(p, raw) })
	if err != nil {
		return LoraInfo{}, err
	}
	return LoraInfo{raw.GetN_matrices(), raw.GetMax_rank(), raw.GetAlpha(), raw.GetBytes()}, nil
}

// EngineOptions are an engine's settings; the zero value is the library's defaults on the CPU.
type EngineOptions struct {
	Device        string // "cpu" (default), "cuda" or "auto"
	NThreads      int    // CPU threads, 0 = all cores
	ManualStep    bool   // the host runs steps with Step
	KVMemoryBytes int64  // KV pool budget, 0 = 512 MiB
	// KVType is the KV cache's element type (EMBER_KV_*): "f16" (default, also "") or "q8_0",
	// which halves the KV memory per token (the same budget holds ~1.9x the tokens; greedy
	// output can differ from f16's). q8_0 is CPU-only and needs the model's head_dim
	// to be a multiple of 32 (StatusUnsupported otherwise); a session saved from a q8_0 engine
	// loads only into a q8_0 engine. Another value: StatusInvalidArgument.
	KVType string
}

// Engine is a model bound to a device; safe for concurrent use.
type Engine struct {
	h     *handle[emberc.Struct_SS_ember_engine]
	Model *Model
	nEmbd int // for Embed (read at creation: the model may be closed later, the engine keeps it)
}

// NewEngine creates an engine (opts may be nil).
func NewEngine(model *Model, opts *EngineOptions) (*Engine, error) {
	if opts == nil {
		opts = &EngineOptions{}
	}
	device := emberc.DEVICE_CPU
	switch opts.Device {
	case "", "cpu":
	case "cuda":
		device = emberc.DEVICE_CUDA
	case "auto":
		device = emberc.DEVICE_AUTO
	default:
		return nil, &Error{StatusInvalidArgument, fmt.Sprintf("unknown device %q (cpu, cuda or auto)", opts.Device)}
	}
	kvDtype := emberc.KV_F16
	switch opts.KVType {
	case "", "f16":
	case "q8_0":
		kvDtype = emberc.KV_Q8_0
	default:
		return nil, &Error{StatusInvalidArgument, fmt.Sprintf("unknown kv type %q (f16 or q8_0)", opts.KVType)}
	}
	info, err := model.Info()
	if err != nil {
		return nil, err
	}
	p, err := use(model.h, func(m emberc.Struct_SS_ember_model) emberc.Struct_SS_ember_engine {
		return emberc.Eb_engine_create(m, device, opts.NThreads, b2i(opts.ManualStep), opts.KVMemoryBytes, kvDtype)
	})
	if err != nil {
		return nil, err
	}
	e := &Engine{h: newHandle(p, emberc.Ember_engine_destroy, "Engine"), Model: model, nEmbd: info.NEmbd}
	runtime.SetFinalizer(e, func(e *Engine) { gcClose(e.h, nil) })
	return e, nil
}

// Close releases the engine; its sessions keep it alive.
func (e *Engine) Close() error { e.h.close(nil); return nil }

// Device says where the engine runs: "cpu" or "cuda" (an "auto" engine says what it chose).
func (e *Engine) Device() (string, error) {
	d, err := use(e.h, emberc.Eb_engine_device)
	if d == emberc.DEVICE_CUDA {
		return "cuda", err
	}
	return "cpu", err
}

// GPUIndex is the GPU of a CUDA engine, -1 on the CPU.
func (e *Engine) GPUIndex() (int, error) { return use(e.h, emberc.Eb_engine_gpu_index) }

// BackendName is e.g. "cpu/avx2".
func (e *Engine) BackendName() (string, error) { return use(e.h, emberc.Eb_engine_backend_name) }

// Step runs engine steps for about maxMs milliseconds (manual mode only); returns the tokens processed.
func (e *Engine) Step(maxMs, maxTokens int) (int64, error) {
	return use(e.h, func(p emberc.Struct_SS_ember_engine) int64 { return emberc.Eb_engine_step(p, maxMs, maxTokens) })
}

// Pooling is how an embedding pools the hidden states of its input's tokens (EMBER_POOLING_*).
type Pooling string

const (
	PoolingMean Pooling = "mean" // the mean over every token (the default; "" too)
	PoolingLast Pooling = "last" // the last token's
	PoolingCLS  Pooling = "cls"  // the first token's (BOS where the model adds one)
)

// MaxEmbedInputs is the most inputs one Embed or EmbedTokens call takes (EMBER_MAX_EMBED_INPUTS).
const MaxEmbedInputs = 4096

// EmbedOptions are an embedding's settings; the zero value is the library's defaults.
type EmbedOptions struct {
	Pooling      Pooling // "" or "mean" (default), "last" or "cls"
	Normalize    bool    // each vector scaled to L2 length 1
	ParseSpecial bool    // texts: special-token text (e.g. "<|im_start|>") is the special token
}

func (o *EmbedOptions) pooling() (int, error) {
	switch o.Pooling {
	case "", PoolingMean:
		return emberc.POOLING_MEAN, nil
	case PoolingLast:
		return emberc.POOLING_LAST, nil
	case PoolingCLS:
		return emberc.POOLING_CLS, nil
	}
	return 0, &Error{StatusInvalidArgument, fmt.Sprintf("unknown pooling %q (mean, last or cls)", string(o.Pooling))}
}

func checkEmbedCount(n int) error {
	if n > MaxEmbedInputs {
		return &Error{StatusInvalidArgument, fmt.Sprintf("%d inputs (at most %d per call)", n, MaxEmbedInputs)}
	}
	return nil
}

// Embed returns embeddings (C ABI 1.5, ember_engine_embed): one vector of the
// model's NEmbd floats per text, in order: the model's hidden state after its
// final norm, pooled over the text's tokens (opts.Pooling), scaled to L2
// length 1 with opts.Normalize (opts may be nil: mean pooling, not
// normalised). Texts are tokenized with the model's BOS/EOS (as llama.cpp
// embeds). The inputs run through the engine's scheduler beside its streams;
// the call blocks until all are done (a manual-step engine runs its steps
// itself). Errors: StatusInvalidArgument (no texts, more than MaxEmbedInputs,
// an empty text or one with a NUL byte, an unknown pooling),
// StatusContextFull (a text longer than the model's context).
func (e *Engine) Embed(texts []string, opts *EmbedOptions) ([][]float32, error) {
	if opts == nil {
		opts = &EmbedOptions{}
	}
	pooling, err := opts.pooling()
	if err != nil {
		return nil, err
	}
	if err := checkEmbedCount(len(texts)); err != nil {
		return nil, err
	}
	in := emberc.NewEb_embed_inputs()
	defer emberc.DeleteEb_embed_inputs(in)
	for i, text := range texts {
		if strings.IndexByte(text, 0) >= 0 {
			return nil, &Error{StatusInvalidArgument, fmt.Sprintf("text %d contains a NUL byte", i)}
		}
		if err := call0(func() { in.Add_text(text) }); err != nil {
			return nil, err
		}
	}
	return e.embed(in, pooling, opts.Normalize, opts.ParseSpecial)
}

// EmbedTokens is Embed for inputs given as token ids
// (ember_engine_embed_tokens): nothing is added, so Model.Tokenize(text,
// true, false) gives the vector of Embed of the text; opts.ParseSpecial is not
// used. StatusInvalidArgument also for an id outside the vocabulary.
func (e *Engine) EmbedTokens(inputs [][]int, opts *EmbedOptions) ([][]float32, error) {
	if opts == nil {
		opts = &EmbedOptions{}
	}
	pooling, err := opts.pooling()
	if err != nil {
		return nil, err
	}
	if err := checkEmbedCount(len(inputs)); err != nil {
		return nil, err
	}
	in := emberc.NewEb_embed_inputs()
	defer emberc.DeleteEb_embed_inputs(in)
	for _, ids := range inputs {
		for _, id := range ids {
			if id < math.MinInt32 || id > math.MaxInt32 {
				return nil, &Error{StatusInvalidArgument, fmt.Sprintf("token id %d out of range", id)}
			}
		}
		t := tokensIn(ids)
		err := call0(func() { in.Add_tokens(t) })
		emberc.DeleteEb_tokens(t)
		if err != nil {
			return nil, err
		}
	}
	return e.embed(in, pooling, opts.Normalize, false)
}

func (e *Engine) embed(in emberc.Eb_embed_inputs, pooling int, normalize, parseSpecial bool) ([][]float32, error) {
	d := e.nEmbd
	f, err := use(e.h, func(p emberc.Struct_SS_ember_engine) emberc.Eb_floats {
		return emberc.Eb_engine_embed(p, in, d, pooling, b2i(normalize), b2i(parseSpecial))
	})
	if err != nil {
		return nil, err
	}
	defer emberc.DeleteEb_floats(f)
	n := int(f.Size()) / d
	flat := make([]float32, n*d)
	for i := range flat {
		flat[i] = f.Get(int64(i))
	}
	out := make([][]float32, n)
	for i := range out {
		out[i] = flat[i*d : (i+1)*d : (i+1)*d]
	}
	return out, nil
}

// SessionOptions are a session's settings; the zero value is a full-cache session.
type SessionOptions struct {
	SystemPrompt string
	Cache        string // "full" (default), "window" or "sink" (StreamingLLM)
	SinkTokens   int    // SINK: first tokens kept; used when Cache is "sink" (0 means 4)
	WindowTokens int    // WINDOW/SINK: recent tokens kept; 0 = the context minus the sinks
	NCtx         int    // 0 = the model's context
}

// NewSession starts a conversation (opts may be nil).
func (e *Engine) NewSession(opts *SessionOptions) (*Session, error) {
	if opts == nil {
		opts = &SessionOptions{}
	}
	policy := emberc.CACHE_FULL
	switch opts.Cache {
	case "", "full":
	case "window":
		policy = emberc.CACHE_WINDOW
	case "sink":
		policy = emberc.CACHE_SINK
	default:
		return nil, &Error{StatusInvalidArgument, fmt.Sprintf("unknown cache policy %q (full, window or sink)", opts.Cache)}
	}
	sink := opts.SinkTokens
	if sink == 0 {
		sink = 4
	}
	p, err := use(e.h, func(h emberc.Struct_SS_ember_engine) emberc.Struct_SS_ember_session {
		return emberc.Eb_session_create(h, opts.SystemPrompt, policy, sink, opts.WindowTokens, opts.NCtx)
	})
	if err != nil {
		return nil, err
	}
	return newSession(e, p), nil
}

// LoadSession restores a session saved with Session.Save.
func (e *Engine) LoadSession(path string) (*Session, error) {
	p, err := use(e.h, func(h emberc.Struct_SS_ember_engine) emberc.Struct_SS_ember_session {
		return emberc.Eb_session_load(h, path)
	})
	if err != nil {
		return nil, err
	}
	return newSession(e, p), nil
}

// Session is one conversation: one stream at a time, one goroutine at a time.
type Session struct {
	h      *handle[emberc.Struct_SS_ember_session]
	Engine *Engine
}

func newSession(e *Engine, p emberc.Struct_SS_ember_session) *Session {
	s := &Session{h: newHandle(p, emberc.Ember_session_destroy, "Session"), Engine: e}
	runtime.SetFinalizer(s, func(s *Session) { gcClose(s.h, nil) })
	return s
}

// Close releases the session (a running stream is cancelled and keeps it alive).
func (s *Session) Close() error { s.h.close(nil); return nil }

// AddMessage appends a chat message ("system", "user", "assistant", or "tool": a tool's result).
func (s *Session) AddMessage(role, content string) error {
	return use0(s.h, func(p emberc.Struct_SS_ember_session) { emberc.Eb_session_add_message(p, role, content) })
}

// SetTools sets the tools the model may call from the next stream on: an
// OpenAI tool list as JSON text, [{"type": "function", "function": {"name",
// "description", "parameters"}}, ...]; "" = none. Calls come out in
// Stream.ToolCalls, not in the text; send a result back with
// AddMessage("tool", result).
func (s *Session) SetTools(toolsJSON string) error {
	return use0(s.h, func(p emberc.Struct_SS_ember_session) { emberc.Eb_session_set_tools(p, toolsJSON) })
}

// SetLoras sets the LoRA adapters the next turns decode with, in order (C ABI
// 1.6), with their scales (scales nil: all 1.0; 0 is the base model); no
// adapters = none. Each adds scale * alpha / rank * B A x to its matrices'
// rows, as llama.cpp does. Changing the set between turns recomputes the
// history under the new one. The session keeps the adapters alive (closing a
// Lora afterwards is safe). Errors: StatusInvalidArgument (more than 16
// adapters, a scale that is not finite or beyond +-1000, an adapter of
// another model, a closed or nil Lora, scales of another length), StatusBusy
// (a stream runs).
func (s *Session) SetLoras(loras []*Lora, scales []float32) error {
	if scales != nil && len(scales) != len(loras) {
		return &Error{StatusInvalidArgument, fmt.Sprintf("%d scales for %d adapters", len(scales), len(loras))}
	}
	for i, l := range loras {
		if l == nil {
			return &Error{StatusInvalidArgument, fmt.Sprintf("adapter %d is nil", i)}
		}
	}
	set := emberc.NewEb_lora_set()
	defer emberc.DeleteEb_lora_set(set)
	// Every adapter stays open across the call; the session then keeps them alive itself.
	for i, l := range loras {
		p, err := l.h.acquire()
		if err != nil {
			return err
		}
		defer l.h.done()
		scale := float32(1)
		if scales != nil {
			scale = scales[i]
		}
		if err := call0(func() { set.Add(p, scale) }); err != nil {
			return err
		}
	}
	return use0(s.h, func(p emberc.Struct_SS_ember_session) { emberc.Eb_session_set_loras(p, set) })
}

// AddText appends raw text (completion mode).
func (s *Session) AddText(text string, parseSpecial bool) error {
	return use0(s.h, func(p emberc.Struct_SS_ember_session) { emberc.Eb_session_add_text(p, text, b2i(parseSpecial)) })
}

// AddTokens appends token ids (completion mode).
func (s *Session) AddTokens(ids []int) error {
	t := tokensIn(ids)
	defer emberc.DeleteEb_tokens(t)
	return use0(s.h, func(p emberc.Struct_SS_ember_session) { emberc.Eb_session_add_tokens(p, t) })
}

// Reset forgets the conversation.
func (s *Session) Reset() error { return use0(s.h, emberc.Eb_session_reset) }

// TokenCount is the number of tokens the session holds.
func (s *Session) TokenCount() (int64, error) { return use(s.h, emberc.Eb_session_token_count) }

// Save writes the session to a file (Engine.LoadSession restores it).
func (s *Session) Save(path string) error {
	return use0(s.h, func(p emberc.Struct_SS_ember_session) { emberc.Eb_session_save(p, path) })
}

// Score appends tokens and returns log p(token | everything before it) for each (NaN for the very first).
func (s *Session) Score(tokens []int) ([]float32, error) {
	t := tokensIn(tokens)
	defer emberc.DeleteEb_tokens(t)
	f, err := use(s.h, func(p emberc.Struct_SS_ember_session) emberc.Eb_floats { return emberc.Eb_session_score(p, t) })
	if err != nil {
		return nil, err
	}
	defer emberc.DeleteEb_floats(f)
	out := make([]float32, f.Size())
	for i := range out {
		out[i] = f.Get(int64(i))
	}
	return out, nil
}

// Sampling controls generation. Start from DefaultSampling() (the library's defaults).
type Sampling struct {
	MaxTokens        int
	Temperature      float32 // 0 = greedy
	TopK             int
	TopP, MinP       float32
	RepeatPenalty    float32
	PresencePenalty  float32 // subtracted once from each token in the penalty window, -100..100 (default 0 = off)
	FrequencyPenalty float32 // subtracted per occurrence of a token in the penalty window, -100..100 (default 0 = off)
	PenaltyLastN     int     // penalty window: the last tokens, prompt included; -1 = all, 0 = off (default 64)
	Seed             uint64
	IgnoreEOS        bool
	Stop             []string // generation ends before the first match (not emitted)

	// Speculative decoding (same output, greedy or sampled; see docs/API.md).
	SpecDrafter    string  // "" or "none" (default), "ngram" (prompt lookup), "self", "draft"
	SpecSelfLayers int     // "self": the layers that draft; 0 = 7/8 of the model's
	SpecDraftModel *Model  // "draft": same vocabulary (selects "draft" when SpecDrafter is ""); the stream holds it
	SpecThreshold  float32 // a draft candidate this likely opens a branch (above 1: chains)
	SpecMaxNodes   int     // drafted tokens per tree, 1..64
	SpecMaxDepth   int     // drafted tokens per branch, 1..64
	SpecAlpha      float32 // verify when the best branch's confidence falls below this, 0..1 (then adapts)
	SpecNoLookup   bool    // "self", "draft": the model alone, without prompt lookup beside it

	// Structured output (at most one; see docs/API.md).
	JSONSchema string   // the reply is compact JSON that validates against this JSON Schema
	Grammar    string   // the reply is a sentence of this GBNF grammar (llama.cpp's notation, rule "root")
	Regex      string   // the whole reply matches this regular expression
	Choices    []string // the reply is exactly one of these
	JSONObject bool     // the reply is a JSON object (OpenAI's json_object)

	// Tool calling, for a session with tools (Session.SetTools; see docs/API.md).
	// Calls come out in Stream.ToolCalls, not in the text.
	ToolChoice          string // "" or "auto" (default), "none", "required" (at least one call) or a tool's name (exactly one call, of it)
	NoParallelToolCalls bool   // at most one call per reply (default: several)

	// Logits (see docs/API.md).
	LogitBias   map[int]float32 // token id -> bias added to its logit before a token is chosen; float32(math.Inf(-1)) bans it
	Logprobs    bool            // record each generated token's log-probability (Stream.Logprobs)
	TopLogprobs int             // with Logprobs: the most likely tokens of each row, 0..20
}

// DefaultSampling returns the library's defaults.
func DefaultSampling() Sampling {
	d := emberc.NewEb_sampling()
	defer emberc.DeleteEb_sampling(d)
	return Sampling{MaxTokens: d.GetMax_tokens(), Temperature: d.GetTemperature(), TopK: d.GetTop_k(),
		TopP: d.GetTop_p(), MinP: d.GetMin_p(), RepeatPenalty: d.GetRepeat_penalty(),
		PresencePenalty: d.GetPresence_penalty(), FrequencyPenalty: d.GetFrequency_penalty(),
		PenaltyLastN: d.GetPenalty_last_n(), Seed: uint64(d.GetSeed()),
		SpecSelfLayers: d.GetSpec_self_layers(), SpecThreshold: d.GetSpec_threshold(),
		SpecMaxNodes: d.GetSpec_max_nodes(), SpecMaxDepth: d.GetSpec_max_depth(), SpecAlpha: d.GetSpec_alpha(),
		Logprobs: d.GetLogprobs() != 0, TopLogprobs: d.GetTop_logprobs()}
}

// drafter is o's SPEC_* constant.
func (o *Sampling) drafter() (int, error) {
	d := o.SpecDrafter
	if d == "" {
		d = "none"
		if o.SpecDraftModel != nil {
			d = "draft"
		}
	}
	kinds := map[string]int{"none": emberc.SPEC_NONE, "ngram": emberc.SPEC_NGRAM, "self": emberc.SPEC_SELF,
		"draft": emberc.SPEC_DRAFT}
	kind, ok := kinds[d]
	if !ok {
		return 0, &Error{StatusInvalidArgument, fmt.Sprintf("unknown spec drafter %q (none, ngram, self or draft)", d)}
	}
	if o.SpecDraftModel != nil && kind != emberc.SPEC_DRAFT {
		return 0, &Error{StatusInvalidArgument, fmt.Sprintf("a spec draft model needs the drafter \"draft\", not %q", d)}
	}
	return kind, nil
}

// Generate starts generating from everything added so far (nil: DefaultSampling()).
func (s *Session) Generate(opts *Sampling) (*Stream, error) {
	o := DefaultSampling()
	if opts != nil {
		o = *opts
	}
	drafter, err := o.drafter()
	if err != nil {
		return nil, err
	}
	// In id order, so that the native list does not depend on the map's.
	biased := make([]int, 0, len(o.LogitBias))
	for id := range o.LogitBias {
		if id < math.MinInt32 || id > math.MaxInt32 { // would wrap to another id on the way to int32_t
			return nil, &Error{StatusInvalidArgument, fmt.Sprintf("logit bias: token id %d is out of range", id)}
		}
		biased = append(biased, id)
	}
	sort.Ints(biased)
	raw := emberc.NewEb_sampling()
	defer emberc.DeleteEb_sampling(raw)
	raw.SetMax_tokens(o.MaxTokens)
	raw.SetTemperature(o.Temperature)
	raw.SetTop_k(o.TopK)
	raw.SetTop_p(o.TopP)
	raw.SetMin_p(o.MinP)
	raw.SetRepeat_penalty(o.RepeatPenalty)
	raw.SetPresence_penalty(o.PresencePenalty)
	raw.SetFrequency_penalty(o.FrequencyPenalty)
	raw.SetPenalty_last_n(o.PenaltyLastN)
	raw.SetSeed(int64(o.Seed))
	raw.SetIgnore_eos(b2i(o.IgnoreEOS))
	for _, x := range o.Stop {
		raw.Add_stop(x)
	}
	raw.SetSpec_drafter(drafter)
	raw.SetSpec_self_layers(o.SpecSelfLayers)
	raw.SetSpec_threshold(o.SpecThreshold)
	raw.SetSpec_max_nodes(o.SpecMaxNodes)
	raw.SetSpec_max_depth(o.SpecMaxDepth)
	raw.SetSpec_alpha(o.SpecAlpha)
	raw.SetSpec_lookup(b2i(!o.SpecNoLookup))
	if o.JSONSchema != "" {
		raw.Set_json_schema(o.JSONSchema)
	}
	if o.Grammar != "" {
		raw.Set_grammar(o.Grammar)
	}
	if o.Regex != "" {
		raw.Set_regex(o.Regex)
	}
	for _, c := range o.Choices {
		raw.Add_choice(c)
	}
	raw.SetJson_object(b2i(o.JSONObject))
	switch o.ToolChoice {
	case "", "auto":
		raw.SetTool_choice(emberc.TOOL_CHOICE_AUTO)
	case "none":
		raw.SetTool_choice(emberc.TOOL_CHOICE_NONE)
	case "required":
		raw.SetTool_choice(emberc.TOOL_CHOICE_REQUIRED)
	default:
		raw.SetTool_choice(emberc.TOOL_CHOICE_FUNCTION)
		raw.Set_tool_name(o.ToolChoice)
	}
	raw.SetParallel_tool_calls(b2i(!o.NoParallelToolCalls))
	for _, id := range biased {
		raw.Add_logit_bias(id, o.LogitBias[id])
	}
	raw.SetLogprobs(b2i(o.Logprobs))
	raw.SetTop_logprobs(o.TopLogprobs)
	start := func() (emberc.Struct_SS_ember_stream, error) {
		return use(s.h, func(h emberc.Struct_SS_ember_session) emberc.Struct_SS_ember_stream {
			return emberc.Eb_stream_start(h, raw)
		})
	}
	var p emberc.Struct_SS_ember_stream
	if o.SpecDraftModel == nil {
		p, err = start()
	} else {
		// The draft model stays open across the start; the stream then keeps it loaded.
		var d emberc.Struct_SS_ember_model
		if d, err = o.SpecDraftModel.h.acquire(); err == nil {
			raw.SetSpec_draft_model(d)
			p, err = start()
			o.SpecDraftModel.h.done()
		}
	}
	if err != nil {
		return nil, err
	}
	st := &Stream{h: newHandle(p, emberc.Ember_stream_destroy, "Stream"), Session: s, DraftModel: o.SpecDraftModel,
		ev: emberc.NewEb_event()}
	// The finalizer never waits for, or runs, engine steps: ember_stream_release.
	runtime.SetFinalizer(st, func(st *Stream) {
		gcClose(st.h, emberc.Ember_stream_release)
		emberc.DeleteEb_event(st.ev)
	})
	return st, nil
}

// Chat adds a user message and returns the whole reply.
func (s *Session) Chat(content string, opts *Sampling) (string, error) {
	if err := s.AddMessage("user", content); err != nil {
		return "", err
	}
	st, err := s.Generate(opts)
	if err != nil {
		return "", err
	}
	defer st.Close()
	return st.ReadAll()
}

// EndReason says why a stream ended.
type EndReason int

const (
	EndNone EndReason = iota
	EndEOS
	EndStopString
	EndMaxTokens
	EndCancelled
	EndContextFull
)

func (r EndReason) String() string {
	return [...]string{"none", "eos", "stop_string", "max_tokens", "cancelled", "context_full"}[r]
}

// ToolCall is a call the model made to one of the session's tools (Session.SetTools).
type ToolCall struct {
	ID        string // "call_<n>", unique in the session
	Name      string // one of the session's tools
	Arguments string // compact JSON text that validates against the tool's parameters
}

// TokenLogprob is a generated token's log-probability in the row it was
// chosen from (after logit bias and constraints, before penalties and
// temperature), and the row's most likely tokens (Sampling.Logprobs,
// Sampling.TopLogprobs).
type TokenLogprob struct {
	Token       int
	Logprob     float32
	TopTokens   []int     // the row's most likely tokens, most likely first (Sampling.TopLogprobs of them)
	TopLogprobs []float32 // their log-probabilities, in the same order
}

// Stream is one generation. Next returns its text pieces, then io.EOF;
// ToolCalls holds the tool calls read so far (not in the text), Logprobs
// the tokens' log-probabilities (with Sampling.Logprobs).
// Cancel may be called from any goroutine.
type Stream struct {
	h          *handle[emberc.Struct_SS_ember_stream]
	Session    *Session
	DraftModel *Model // the speculative draft model (Sampling.SpecDraftModel), held as long as the stream; or nil
	mu         sync.Mutex
	ev         emberc.Eb_event
	text       strings.Builder
	tokens     []int
	toolCalls  []ToolCall
	logprobs   []TokenLogprob
	ended      bool
	reason     EndReason
}

// Next returns the next text piece, waiting for it; io.EOF at the end.
func (st *Stream) Next() (string, error) { return st.NextTimeout(-1) }

// NextTimeout is Next waiting at most timeoutMs (0 = poll; manual-step engines):
// an *Error with StatusTimeout when nothing came in time.
func (st *Stream) NextTimeout(timeoutMs int) (string, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for !st.ended {
		got, err := use(st.h, func(p emberc.Struct_SS_ember_stream) int { return emberc.Eb_stream_next(p, st.ev, timeoutMs) })
		if err != nil {
			return "", err
		}
		if got == 0 {
			return "", &Error{StatusTimeout, "no event within the timeout"}
		}
		if got < 0 {
			st.ended = true
			break
		}
		if st.ev.GetKind() == emberc.EVENT_END {
			st.ended, st.reason = true, EndReason(st.ev.GetEnd_reason())
			break
		}
		n := st.ev.N_tokens()
		for i := int64(0); i < n; i++ {
			st.tokens = append(st.tokens, st.ev.Token(i))
		}
		if st.ev.Has_logprobs() != 0 {
			k := st.ev.N_top()
			for i := int64(0); i < n; i++ {
				e := TokenLogprob{st.ev.Token(i), st.ev.Logprob(i), make([]int, k), make([]float32, k)}
				for j := 0; j < k; j++ {
					e.TopTokens[j], e.TopLogprobs[j] = st.ev.Top_token(i, j), st.ev.Top_logprob(i, j)
				}
				st.logprobs = append(st.logprobs, e)
			}
		}
		if st.ev.GetKind() == emberc.EVENT_TOOL_CALL {
			st.toolCalls = append(st.toolCalls, ToolCall{st.ev.Tool_call_id(), st.ev.Tool_name(), st.ev.Tool_arguments()})
			continue
		}
		if piece := st.ev.Text(); piece != "" {
			st.text.WriteString(piece)
			return piece, nil
		}
	}
	return "", io.EOF
}

// ReadAll waits for the end and returns the whole text.
func (st *Stream) ReadAll() (string, error) {
	for {
		if _, err := st.Next(); err == io.EOF {
			return st.Text(), nil
		} else if err != nil {
			return st.Text(), err
		}
	}
}

// Text is everything read so far.
func (st *Stream) Text() string { st.mu.Lock(); defer st.mu.Unlock(); return st.text.String() }

// Tokens are the token ids read so far.
func (st *Stream) Tokens() []int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return append([]int(nil), st.tokens...)
}

// ToolCalls are the tool calls read so far (all of them once Next returned io.EOF).
func (st *Stream) ToolCalls() []ToolCall {
	st.mu.Lock()
	defer st.mu.Unlock()
	return append([]ToolCall(nil), st.toolCalls...)
}

// Logprobs are, with Sampling.Logprobs, one entry per generated token read so far (as Tokens).
func (st *Stream) Logprobs() []TokenLogprob {
	st.mu.Lock()
	defer st.mu.Unlock()
	return append([]TokenLogprob(nil), st.logprobs...)
}

// EndReason is why it ended (valid once Next returned io.EOF).
func (st *Stream) EndReason() EndReason { st.mu.Lock(); defer st.mu.Unlock(); return st.reason }

// Finished reports whether the end was read.
func (st *Stream) Finished() bool { st.mu.Lock(); defer st.mu.Unlock(); return st.ended }

// Cancel requests the end (EndCancelled soon after); any goroutine; a no-op once closed.
func (st *Stream) Cancel() error {
	if st.h.isClosed() {
		return nil
	}
	err := use0(st.h, emberc.Eb_stream_cancel)
	if err != nil && st.h.isClosed() {
		return nil
	}
	return err
}

// StreamStats are a stream's statistics.
type StreamStats struct {
	PromptTokens, GeneratedTokens                               int64
	TimeToFirstTokenMs, TokensPerSecond, PrefillTokensPerSecond float64
	Finished                                                    bool
	EndReason                                                   EndReason
	// Speculative decoding (0 without it): tokens the drafter proposed, drafted
	// tokens the model accepted, model passes that verified a tree.
	DraftedTokens, AcceptedTokens, VerifyPasses int64
	MeanAcceptedLength                          float64 // AcceptedTokens / VerifyPasses
}

// Stats returns the stream's statistics.
func (st *Stream) Stats() (StreamStats, error) {
	raw := emberc.NewEb_stats()
	defer emberc.DeleteEb_stats(raw)
	if err := use0(st.h, func(p emberc.Struct_SS_ember_stream) { emberc.Eb_stream_stats_get(p, raw) }); err != nil {
		return StreamStats{}, err
	}
	return StreamStats{raw.GetPrompt_tokens(), raw.GetGenerated_tokens(), raw.GetTime_to_first_token_ms(),
		raw.GetTokens_per_second(), raw.GetPrefill_tokens_per_second(), raw.GetFinished() != 0,
		EndReason(raw.GetEnd_reason()), raw.GetDrafted_tokens(), raw.GetAccepted_tokens(), raw.GetVerify_passes(),
		raw.GetMean_accepted_length()}, nil
}

// Close cancels the stream if still running, waits for it to stop and releases it.
func (st *Stream) Close() error {
	st.Cancel()
	st.h.close(nil)
	return nil
}
