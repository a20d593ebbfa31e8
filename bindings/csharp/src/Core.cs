// Ember for C#: the idiomatic classes over the SWIG-generated Ember.LowLevel
// (from bindings/ember.i). Every native call goes through Ember.LowLevel.
using System;
using System.Collections;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using System.Text;
using Ember.LowLevel;

namespace Ember
{
    /// <summary>A failed Ember call: Status is the ember_status, Message the library's message.</summary>
    public class EmberException : Exception
    {
        public const int InvalidArgument = 1, NotFound = 2, BadFormat = 3, Unsupported = 4, OutOfMemory = 5,
                         ContextFull = 6, Busy = 7, Cancelled = 8, Timeout = 9, Internal = 10, EndOfStream = 11;

        public EmberException(int status, string message) : base(message) { Status = status; }

        public int Status { get; private set; }

        /// <summary>The status's constant name, e.g. "EMBER_ERR_NOT_FOUND".</summary>
        public string StatusName { get { return emberc.ember_status_string(Status); } }
    }

    /// <summary>UTF-8 text from native memory (used by the SWIG exception hook).</summary>
    public static class Utf8
    {
        public static string FromNative(IntPtr p)
        {
            if (p == IntPtr.Zero) return null;
            int n = 0;
            while (Marshal.ReadByte(p, n) != 0) n++;
            byte[] bytes = new byte[n];
            Marshal.Copy(p, bytes, 0, n);
            return Encoding.UTF8.GetString(bytes);
        }
    }

    /// <summary>Library-wide queries.</summary>
    public static class Library
    {
        public static string Version { get { return emberc.ember_version(); } }
        public static int VersionNumber { get { return emberc.ember_version_number(); } }
        /// <summary>"scalar", "avx2" or "avx512_vnni".</summary>
        public static string CpuIsa { get { return emberc.eb_cpu_isa_name(); } }
        /// <summary>"absent", "loadable" or "broken".</summary>
        public static string CudaPlugin
        {
            get
            {
                switch (emberc.eb_cuda_plugin())
                {
                    case 0: return "absent";
                    case 1: return "loadable";
                    case 2: return "broken";
                    default: return "unknown";
                }
            }
        }
    }

    /// <summary>
    /// One native handle. Calls use it between Acquire and Release; Close releases it exactly once,
    /// after the calls in flight, so closing from another thread never frees a handle in use.
    /// </summary>
    internal sealed class Handle<T> where T : class
    {
        private T ptr;
        private Action<T> releaser;
        private readonly string what;
        private int busy;
        private bool closed;

        internal Handle(T ptr, Action<T> destroy, string what)
        {
            this.ptr = ptr;
            this.releaser = destroy;
            this.what = what;
        }

        internal T Acquire()
        {
            lock (this)
            {
                if (closed) throw new EmberException(EmberException.InvalidArgument, "the " + what + " is closed");
                busy++;
                return ptr;
            }
        }

        internal void Release()
        {
            T p = null;
            Action<T> how;
            lock (this)
            {
                busy--;
                if (closed && busy == 0 && ptr != null) { p = ptr; ptr = null; }
                how = releaser;
            }
            if (p != null) how(p);
        }

        internal R Call<R>(Func<T, R> f)
        {
            T h = Acquire();
            try { return f(h); } finally { Release(); }
        }

        internal void Run(Action<T> f)
        {
            T h = Acquire();
            try { f(h); } finally { Release(); }
        }

        internal bool IsClosed { get { lock (this) return closed; } }

        internal void Close(Action<T> how = null)
        {
            T p;
            Action<T> r;
            lock (this)
            {
                if (closed) return;
                closed = true;
                if (how != null) releaser = how;
                if (busy > 0) return; // the last call in flight releases it
                p = ptr;
                ptr = null;
                r = releaser;
            }
            if (p != null) r(p);
        }
    }

    internal static class Tokens
    {
        internal static eb_tokens Of(IList<int> ids)
        {
            var t = new eb_tokens(ids.Count);
            for (int i = 0; i < ids.Count; i++) t.set(i, ids[i]);
            return t;
        }

        internal static int[] ToArray(eb_tokens t)
        {
            using (t)
            {
                var a = new int[t.size()];
                for (int i = 0; i < a.Length; i++) a[i] = t.get(i);
                return a;
            }
        }
    }

    public sealed class ModelInfo
    {
        public string Architecture, Name;
        public long NParams;
        public int ContextLength, VocabSize, NLayers, NEmbd, NHeads, NKvHeads, BosToken, EosToken;
    }

    /// <summary>A GGUF model (weights, tokenizer, chat template). Immutable and thread-safe.</summary>
    public sealed class Model : IDisposable
    {
        internal readonly Handle<SWIGTYPE_p_ember_model> handle;
        private ModelInfo info;

        /// <summary>Loads a model; throws EmberException (NotFound, BadFormat, Unsupported, ...).</summary>
        public Model(string path)
        {
            handle = new Handle<SWIGTYPE_p_ember_model>(emberc.eb_model_load(path), emberc.ember_model_destroy, "Model");
        }

        ~Model() { if (handle != null) handle.Close(); } // null when the constructor threw

        public ModelInfo Info
        {
            get
            {
                if (info == null)
                {
                    using (var raw = new eb_model_info())
                    {
                        handle.Run(h => emberc.eb_model_info_get(h, raw));
                        info = new ModelInfo
                        {
                            Architecture = raw.architecture, Name = raw.name, NParams = raw.n_params,
                            ContextLength = raw.context_length, VocabSize = raw.vocab_size, NLayers = raw.n_layers,
                            NEmbd = raw.n_embd, NHeads = raw.n_heads, NKvHeads = raw.n_kv_heads,
                            BosToken = raw.bos_token, EosToken = raw.eos_token,
                        };
                    }
                }
                return info;
            }
        }

        public int[] Tokenize(string text, bool addSpecial = false, bool parseSpecial = false)
        {
            return handle.Call(h => Tokens.ToArray(emberc.eb_tokenize(h, text, addSpecial ? 1 : 0, parseSpecial ? 1 : 0)));
        }

        public string Detokenize(IList<int> ids)
        {
            using (var t = Tokens.Of(ids)) return handle.Call(h => emberc.eb_detokenize(h, t));
        }

        public bool IsClosed { get { return handle.IsClosed; } }

        /// <summary>Releases the model; engines using it keep it alive. Idempotent.</summary>
        public void Dispose()
        {
            handle.Close();
            GC.SuppressFinalize(this);
        }
    }

    /// <summary>LoRA adapter metadata (ember_lora_info_t).</summary>
    public sealed class LoraInfo
    {
        /// <summary>Matrices adapted.</summary>
        public int NMatrices;
        /// <summary>The largest rank of its pairs.</summary>
        public int MaxRank;
        /// <summary>adapter.lora.alpha (0: none; each term is then scaled by its scale alone).</summary>
        public float Alpha;
        /// <summary>The adapter's tensors.</summary>
        public long Bytes;

        public override string ToString()
        {
            return NMatrices + " matrices, rank <= " + MaxRank + ", alpha " + Alpha + ", " + Bytes + " bytes";
        }
    }

    /// <summary>A LoRA adapter (C ABI 1.6) in llama.cpp's GGUF format, loaded for a model (made for its
    /// architecture and shapes; the file is read once). Use it with Session.SetLoras; immutable and thread-safe,
    /// share it across sessions and engines of the model. Sessions using it keep it alive, so Dispose is safe at
    /// any time.</summary>
    public sealed class Lora : IDisposable
    {
        internal readonly Handle<SWIGTYPE_p_ember_lora> handle;
        private LoraInfo info;

        /// <summary>Loads an adapter for model; throws EmberException: NotFound, BadFormat (not an adapter,
        /// corrupt), InvalidArgument (an adapter for another model), Unsupported, ...</summary>
        public Lora(Model model, string path)
        {
            if (model == null) throw new EmberException(EmberException.InvalidArgument, "model is null");
            var h = model.handle.Call(m => emberc.eb_lora_load(m, path));
            handle = new Handle<SWIGTYPE_p_ember_lora>(h, emberc.ember_lora_destroy, "Lora");
            Model = model;
            Path = path;
        }

        ~Lora() { if (handle != null) handle.Close(); } // null when the constructor threw

        public Model Model { get; private set; }
        public string Path { get; private set; }

        public LoraInfo Info
        {
            get
            {
                if (info == null)
                {
                    using (var raw = new eb_lora_info())
                    {
                        handle.Run(h => emberc.eb_lora_info_get(h, raw));
                        info = new LoraInfo { NMatrices = raw.n_matrices, MaxRank = raw.max_rank, Alpha = raw.alpha, Bytes = raw.bytes };
                    }
                }
                return info;
            }
        }

        public bool IsClosed { get { return handle.IsClosed; } }

        /// <summary>Releases the adapter; sessions using it keep it alive. Idempotent.</summary>
        public void Dispose()
        {
            handle.Close();
            GC.SuppressFinalize(this);
        }

        public override string ToString() { return "Lora(" + Path + (IsClosed ? ", closed" : "") + ")"; }
    }

    /// <summary>How an embedding pools the hidden states of its input's tokens (EMBER_POOLING_*).</summary>
    public enum Pooling
    {
        /// <summary>The mean over every token (the default).</summary>
        Mean = 0,
        /// <summary>The last token's.</summary>
        Last = 1,
        /// <summary>The first token's (BOS where the model adds one).</summary>
        Cls = 2,
    }

    /// <summary>A model bound to a device, with its KV pool and scheduler. Thread-safe.</summary>
    public sealed class Engine : IDisposable
    {
        internal readonly Handle<SWIGTYPE_p_ember_engine> handle;
        private readonly int nEmbd; // for Embed (read at creation: the model may be closed later, the engine keeps it)

        /// <summary>The most inputs one Embed or EmbedTokens call takes (EMBER_MAX_EMBED_INPUTS).</summary>
        public static readonly int MaxEmbedInputs = emberc.MAX_EMBED_INPUTS;

        /// <param name="device">"cpu" (default), "cuda" or "auto"</param>
        /// <param name="nThreads">CPU threads, 0 = all cores</param>
        /// <param name="manualStep">true: the host runs steps with Step()</param>
        /// <param name="kvMemoryBytes">KV pool budget, 0 = 512 MiB</param>
        /// <param name="kvType">The KV cache's element type (EMBER_KV_*): "f16" (default) or "q8_0", which
        /// halves the KV memory per token (the same budget holds ~1.9x the tokens; greedy output can differ
        /// from f16's). q8_0 is CPU-only and needs the model's head_dim to be a multiple of 32
        /// (EmberException.Unsupported otherwise); a session saved from a q8_0 engine loads only into a q8_0
        /// engine. Another value: EmberException.InvalidArgument.</param>
        public Engine(Model model, string device = "cpu", int nThreads = 0, bool manualStep = false, long kvMemoryBytes = 0,
                      string kvType = "f16")
        {
            int dev;
            switch (device)
            {
                case "cpu": dev = emberc.DEVICE_CPU; break;
                case "cuda": dev = emberc.DEVICE_CUDA; break;
                case "auto": dev = emberc.DEVICE_AUTO; break;
                default: throw new EmberException(EmberException.InvalidArgument, "unknown device '" + device + "' (cpu, cuda or auto)");
            }
            int kvDtype;
            switch (kvType)
            {
                case "f16": kvDtype = emberc.KV_F16; break;
                case "q8_0": kvDtype = emberc.KV_Q8_0; break;
                default: throw new EmberException(EmberException.InvalidArgument, "unknown kv type '" + kvType + "' (f16 or q8_0)");
            }
            nEmbd = model.Info.NEmbd;
            var h = model.handle.Call(m => emberc.eb_engine_create(m, dev, nThreads, manualStep ? 1 : 0, kvMemoryBytes, kvDtype));
            handle = new Handle<SWIGTYPE_p_ember_engine>(h, emberc.ember_engine_destroy, "Engine");
            Model = model;
        }

        ~Engine() { if (handle != null) handle.Close(); }

        public Model Model { get; private set; }

        /// <summary>Where it runs: "cpu" or "cuda" (an "auto" engine says what it chose).</summary>
        public string Device { get { return handle.Call(h => emberc.eb_engine_device(h) == emberc.DEVICE_CUDA ? "cuda" : "cpu"); } }
        public int GpuIndex { get { return handle.Call(h => emberc.eb_engine_gpu_index(h)); } }
        public string BackendName { get { return handle.Call(h => emberc.eb_engine_backend_name(h)); } }

        /// <param name="cache">"full", "window" or "sink" (StreamingLLM: never runs out of context)</param>
        public Session Session(string systemPrompt = null, string cache = "full", int sinkTokens = 4, int windowTokens = 0, int nCtx = 0)
        {
            int policy;
            switch (cache)
            {
                case "full": policy = emberc.CACHE_FULL; break;
                case "window": policy = emberc.CACHE_WINDOW; break;
                case "sink": policy = emberc.CACHE_SINK; break;
                default: throw new EmberException(EmberException.InvalidArgument, "unknown cache policy '" + cache + "' (full, window or sink)");
            }
            var s = handle.Call(h => emberc.eb_session_create(h, systemPrompt ?? "", policy, sinkTokens, windowTokens, nCtx));
            return new Session(this, s);
        }

        /// <summary>Restores a session saved with Session.Save.</summary>
        public Session LoadSession(string path)
        {
            return new Session(this, handle.Call(h => emberc.eb_session_load(h, path)));
        }

        /// <summary>Manual mode only: runs steps for about maxMs milliseconds; returns the tokens processed.</summary>
        public long Step(int maxMs = 16, int maxTokens = 0)
        {
            return handle.Call(h => emberc.eb_engine_step(h, maxMs, maxTokens));
        }

        /// <summary>Embeddings (C ABI 1.5, ember_engine_embed): one vector of Model.Info.NEmbd floats per text,
        /// in order: the model's hidden state after its final norm, pooled over the text's tokens, scaled to L2
        /// length 1 when normalize. Texts are tokenized with the model's BOS/EOS (as llama.cpp embeds); special-token
        /// text is the special token only when parseSpecial. The inputs run through the engine's scheduler beside its
        /// streams; the call blocks until all are done (a manual-step engine runs its steps itself). Throws
        /// EmberException: InvalidArgument (no texts, more than MaxEmbedInputs, a null or empty text, an unknown
        /// pooling), ContextFull (a text longer than the model's context).</summary>
        public float[][] Embed(IReadOnlyList<string> texts, Pooling pooling = Pooling.Mean, bool normalize = false, bool parseSpecial = false)
        {
            if (texts == null) throw new EmberException(EmberException.InvalidArgument, "texts is null");
            CheckCount(texts.Count);
            using (var inputs = new eb_embed_inputs())
            {
                for (int i = 0; i < texts.Count; i++)
                {
                    string t = texts[i];
                    if (t == null) throw new EmberException(EmberException.InvalidArgument, "text " + i + " is null");
                    if (t.IndexOf('\0') >= 0) throw new EmberException(EmberException.InvalidArgument, "text " + i + " contains a NUL character");
                    inputs.add_text(t);
                }
                return Embed(inputs, pooling, normalize, parseSpecial);
            }
        }

        /// <summary>One text's embedding (as Embed of a list of one).</summary>
        public float[] Embed(string text, Pooling pooling = Pooling.Mean, bool normalize = false, bool parseSpecial = false)
        {
            return Embed(new[] { text }, pooling, normalize, parseSpecial)[0];
        }

        /// <summary>As Embed, for inputs given as token ids (ember_engine_embed_tokens): nothing is added, so
        /// Model.Tokenize(text, addSpecial: true) gives the vector of Embed(text). InvalidArgument also for an id
        /// outside the vocabulary.</summary>
        public float[][] EmbedTokens(IReadOnlyList<IReadOnlyList<int>> inputs, Pooling pooling = Pooling.Mean, bool normalize = false)
        {
            if (inputs == null) throw new EmberException(EmberException.InvalidArgument, "inputs is null");
            CheckCount(inputs.Count);
            using (var native = new eb_embed_inputs())
            {
                for (int i = 0; i < inputs.Count; i++)
                {
                    var ids = inputs[i];
                    if (ids == null) throw new EmberException(EmberException.InvalidArgument, "input " + i + " is null");
                    var list = ids as IList<int> ?? new List<int>(ids);
                    using (var t = Tokens.Of(list)) native.add_tokens(t);
                }
                return Embed(native, pooling, normalize, false);
            }
        }

        /// <summary>One token list's embedding (as EmbedTokens of a list of one).</summary>
        public float[] EmbedTokens(IReadOnlyList<int> tokens, Pooling pooling = Pooling.Mean, bool normalize = false)
        {
            if (tokens == null) throw new EmberException(EmberException.InvalidArgument, "tokens is null");
            return EmbedTokens(new[] { tokens }, pooling, normalize)[0];
        }

        private static void CheckCount(int n)
        {
            if (n > MaxEmbedInputs)
                throw new EmberException(EmberException.InvalidArgument, n + " inputs (at most " + MaxEmbedInputs + " per call)");
        }

        private float[][] Embed(eb_embed_inputs inputs, Pooling pooling, bool normalize, bool parseSpecial)
        {
            int d = nEmbd;
            return handle.Call(h =>
            {
                using (var f = emberc.eb_engine_embed(h, inputs, d, (int)pooling, normalize ? 1 : 0, parseSpecial ? 1 : 0))
                {
                    var vectors = new float[f.size() / d][];
                    for (int i = 0; i < vectors.Length; i++)
                    {
                        var v = new float[d];
                        for (int j = 0; j < d; j++) v[j] = f.get((long)i * d + j);
                        vectors[i] = v;
                    }
                    return vectors;
                }
            });
        }

        public bool IsClosed { get { return handle.IsClosed; } }

        public void Dispose()
        {
            handle.Close();
            GC.SuppressFinalize(this);
        }
    }

    public enum EndReason { None = 0, Eos = 1, StopString = 2, MaxTokens = 3, Cancelled = 4, ContextFull = 5 }

    /// <summary>Sampling, stopping and speculative decoding for Session.Generate; defaults are the library's.</summary>
    public sealed class Sampling
    {
        public int MaxTokens = 256;
        public float Temperature = 0.8f;
        public int TopK = 40;
        public float TopP = 0.95f;
        public float MinP = 0.05f;
        public float RepeatPenalty = 1.0f;
        /// <summary>Subtracted once from each token in the penalty window, -100..100 (default 0 = off).</summary>
        public float PresencePenalty = 0.0f;
        /// <summary>Subtracted per occurrence of a token in the penalty window, -100..100 (default 0 = off).</summary>
        public float FrequencyPenalty = 0.0f;
        /// <summary>Penalty window: the last tokens, prompt included; -1 = all, 0 = off (default 64).</summary>
        public int PenaltyLastN = 64;
        public long? Seed;
        public bool IgnoreEos;
        public IList<string> Stop = new List<string>();
        /// <summary>Speculative decoding (same output, greedy or sampled; see docs/API.md): "none" (default),
        /// "ngram" (prompt lookup), "self" (the model's first SpecSelfLayers layers) or "draft" (SpecDraftModel).</summary>
        public string SpecDrafter;
        /// <summary>"self": the layers that draft; 0 = 7/8 of the model's.</summary>
        public int SpecSelfLayers = 0;
        /// <summary>"draft": a model with the same vocabulary (selects "draft" when SpecDrafter is not set).
        /// The stream holds it (and keeps it loaded) until it ends.</summary>
        public Model SpecDraftModel;
        /// <summary>A draft candidate this likely opens a branch (above 1: chains).</summary>
        public float SpecThreshold = 0.3f;
        /// <summary>Drafted tokens per tree, 1..64.</summary>
        public int SpecMaxNodes = 12;
        /// <summary>Drafted tokens per branch, 1..64.</summary>
        public int SpecMaxDepth = 8;
        /// <summary>Verify when the best branch's confidence falls below this, 0..1 (then adapts).</summary>
        public float SpecAlpha = 0.25f;
        /// <summary>"self" and "draft": prompt lookup beside the model (false: the model alone).</summary>
        public bool SpecLookup = true;
        /// <summary>Structured output (at most one): the reply is compact JSON that validates against this JSON Schema.</summary>
        public string JsonSchema;
        /// <summary>The reply is a sentence of this GBNF grammar (llama.cpp's notation, rule "root").</summary>
        public string Grammar;
        /// <summary>The whole reply matches this regular expression.</summary>
        public string Regex;
        /// <summary>The reply is exactly one of these.</summary>
        public IList<string> Choices = new List<string>();
        /// <summary>The reply is a JSON object (OpenAI's json_object).</summary>
        public bool JsonObject;
        /// <summary>Tool calling, for a session with tools (Session.SetTools): "auto" (null, the default: free
        /// text, tool calls or both), "none" (no calls), "required" (at least one call) or a tool's name (exactly
        /// one call, of that tool). Calls come out in Stream.ToolCalls, not in the text.</summary>
        public string ToolChoice;
        /// <summary>Several tool calls per reply (false: at most one).</summary>
        public bool ParallelToolCalls = true;
        /// <summary>Logits: token id -> bias added to its logit before a token is chosen;
        /// float.NegativeInfinity bans the token.</summary>
        public IDictionary<int, float> LogitBias = new Dictionary<int, float>();
        /// <summary>Records each generated token's log-probability (Stream.Logprobs).</summary>
        public bool Logprobs;
        /// <summary>With Logprobs: the most likely tokens of each row, 0..20.</summary>
        public int TopLogprobs;

        private int Drafter()
        {
            string d = SpecDrafter ?? (SpecDraftModel != null ? "draft" : "none");
            int kind;
            switch (d)
            {
                case "none": kind = emberc.SPEC_NONE; break;
                case "ngram": kind = emberc.SPEC_NGRAM; break;
                case "self": kind = emberc.SPEC_SELF; break;
                case "draft": kind = emberc.SPEC_DRAFT; break;
                default: throw new EmberException(EmberException.InvalidArgument, "unknown spec drafter '" + d + "' (none, ngram, self or draft)");
            }
            if (SpecDraftModel != null && kind != emberc.SPEC_DRAFT)
                throw new EmberException(EmberException.InvalidArgument, "a spec draft model needs the drafter 'draft', not '" + d + "'");
            return kind;
        }

        /// <summary>The native struct, without the draft model (Session.Generate sets it while the model is held).</summary>
        internal eb_sampling ToNative()
        {
            int drafter = Drafter();
            var s = new eb_sampling();
            s.max_tokens = MaxTokens;
            s.temperature = Temperature;
            s.top_k = TopK;
            s.top_p = TopP;
            s.min_p = MinP;
            s.repeat_penalty = RepeatPenalty;
            s.presence_penalty = PresencePenalty;
            s.frequency_penalty = FrequencyPenalty;
            s.penalty_last_n = PenaltyLastN;
            if (Seed.HasValue) s.seed = Seed.Value;
            s.ignore_eos = IgnoreEos ? 1 : 0;
            foreach (var x in Stop) s.add_stop(x);
            s.spec_drafter = drafter;
            s.spec_self_layers = SpecSelfLayers;
            s.spec_threshold = SpecThreshold;
            s.spec_max_nodes = SpecMaxNodes;
            s.spec_max_depth = SpecMaxDepth;
            s.spec_alpha = SpecAlpha;
            s.spec_lookup = SpecLookup ? 1 : 0;
            if (JsonSchema != null) s.set_json_schema(JsonSchema);
            if (Grammar != null) s.set_grammar(Grammar);
            if (Regex != null) s.set_regex(Regex);
            foreach (var c in Choices) s.add_choice(c);
            s.json_object = JsonObject ? 1 : 0;
            switch (ToolChoice)
            {
                case null: break;
                case "auto": s.tool_choice = emberc.TOOL_CHOICE_AUTO; break;
                case "none": s.tool_choice = emberc.TOOL_CHOICE_NONE; break;
                case "required": s.tool_choice = emberc.TOOL_CHOICE_REQUIRED; break;
                default:
                    s.tool_choice = emberc.TOOL_CHOICE_FUNCTION;
                    s.set_tool_name(ToolChoice);
                    break;
            }
            s.parallel_tool_calls = ParallelToolCalls ? 1 : 0;
            foreach (var b in LogitBias) s.add_logit_bias(b.Key, b.Value);
            s.logprobs = Logprobs ? 1 : 0;
            s.top_logprobs = TopLogprobs;
            return s;
        }
    }

    public sealed class StreamStats
    {
        public long PromptTokens, GeneratedTokens;
        public double TimeToFirstTokenMs, TokensPerSecond, PrefillTokensPerSecond;
        public bool Finished;
        public EndReason EndReason;
        /// <summary>Speculative decoding (0 without it): tokens the drafter proposed, drafted tokens the
        /// model accepted, model passes that verified a tree.</summary>
        public long DraftedTokens, AcceptedTokens, VerifyPasses;
        /// <summary>AcceptedTokens / VerifyPasses.</summary>
        public double MeanAcceptedLength;
    }

    /// <summary>A call the model made to one of the session's tools (Session.SetTools).</summary>
    public sealed class ToolCall
    {
        internal ToolCall(string id, string name, string arguments)
        {
            Id = id;
            Name = name;
            Arguments = arguments;
        }

        /// <summary>"call_&lt;n&gt;", unique in the session.</summary>
        public string Id { get; private set; }
        /// <summary>One of the session's tools.</summary>
        public string Name { get; private set; }
        /// <summary>Compact JSON text that validates against the tool's parameters.</summary>
        public string Arguments { get; private set; }

        public override string ToString() { return Name + Arguments + " (" + Id + ")"; }
    }

    /// <summary>A generated token's log-probability in the row it was chosen from (after logit bias and
    /// constraints, before penalties and temperature), and the row's most likely tokens
    /// (Sampling.Logprobs, Sampling.TopLogprobs).</summary>
    public sealed class TokenLogprob
    {
        private readonly int[] topTokens;
        private readonly float[] topLogprobs;

        internal TokenLogprob(int token, float logprob, int[] topTokens, float[] topLogprobs)
        {
            Token = token;
            Logprob = logprob;
            this.topTokens = topTokens;
            this.topLogprobs = topLogprobs;
        }

        public int Token { get; private set; }
        public float Logprob { get; private set; }
        /// <summary>The row's most likely tokens, most likely first (Sampling.TopLogprobs of them).</summary>
        public int[] TopTokens { get { return (int[])topTokens.Clone(); } }
        /// <summary>Their log-probabilities, in the same order as TopTokens.</summary>
        public float[] TopLogprobs { get { return (float[])topLogprobs.Clone(); } }

        public override string ToString()
        {
            var sb = new StringBuilder().Append(Token).Append(": ").Append(Logprob).Append(" [");
            for (int k = 0; k < topTokens.Length; k++)
                sb.Append(k == 0 ? "" : ", ").Append(topTokens[k]).Append(": ").Append(topLogprobs[k]);
            return sb.Append("]").ToString();
        }
    }

    /// <summary>One conversation. One stream at a time; use it from one thread at a time.</summary>
    public sealed class Session : IDisposable
    {
        internal readonly Handle<SWIGTYPE_p_ember_session> handle;

        internal Session(Engine engine, SWIGTYPE_p_ember_session h)
        {
            Engine = engine;
            handle = new Handle<SWIGTYPE_p_ember_session>(h, emberc.ember_session_destroy, "Session");
        }

        ~Session() { if (handle != null) handle.Close(); }

        public Engine Engine { get; private set; }

        public void AddMessage(string role, string content) { handle.Run(h => emberc.eb_session_add_message(h, role, content)); }
        /// <summary>The tools the model may call from the next stream on: an OpenAI tool list as JSON text,
        /// [{"type": "function", "function": {"name", "description", "parameters"}}, ...]; null or "" = none.
        /// Calls come out in Stream.ToolCalls, not in the text; send a result back with AddMessage("tool", result).</summary>
        public void SetTools(string toolsJson) { handle.Run(h => emberc.eb_session_set_tools(h, toolsJson)); }
        /// <summary>The LoRA adapters the next turns decode with, in order (C ABI 1.6), with their scales (scales
        /// null: all 1.0; 0 is the base model); null or empty = none. Each adds scale * alpha / rank * B A x to its
        /// matrices' rows, as llama.cpp does. Changing the set between turns recomputes the history under the new
        /// one. The session keeps the adapters alive (disposing a Lora afterwards is safe). Throws EmberException:
        /// InvalidArgument (more than 16 adapters, a scale that is not finite or beyond +-1000, an adapter of
        /// another model, a disposed Lora, scales of another length), Busy (a stream runs).</summary>
        public void SetLoras(IList<Lora> loras, IList<float> scales = null)
        {
            int n = loras == null ? 0 : loras.Count;
            if (scales != null && scales.Count != n)
                throw new EmberException(EmberException.InvalidArgument, scales.Count + " scales for " + n + " adapters");
            for (int i = 0; i < n; i++)
                if (loras[i] == null) throw new EmberException(EmberException.InvalidArgument, "adapter " + i + " is null");
            int held = 0;
            using (var set = new eb_lora_set())
            {
                try
                {
                    // Every adapter stays open across the call; the session then keeps them alive itself.
                    for (int i = 0; i < n; i++)
                    {
                        var p = loras[i].handle.Acquire();
                        held++;
                        set.add(p, scales == null ? 1.0f : scales[i]);
                    }
                    handle.Run(h => emberc.eb_session_set_loras(h, set));
                }
                finally
                {
                    for (int i = 0; i < held; i++) loras[i].handle.Release();
                }
            }
        }

        /// <summary>As SetLoras(loras), each adapter at scale 1.0; none = the base model.</summary>
        public void SetLoras(params Lora[] loras) { SetLoras((IList<Lora>)loras, null); }

        public void AddText(string text, bool parseSpecial = false) { handle.Run(h => emberc.eb_session_add_text(h, text, parseSpecial ? 1 : 0)); }
        public void AddTokens(IList<int> ids) { using (var t = Tokens.Of(ids)) handle.Run(h => emberc.eb_session_add_tokens(h, t)); }
        public void Reset() { handle.Run(h => emberc.eb_session_reset(h)); }
        public long TokenCount { get { return handle.Call(h => emberc.eb_session_token_count(h)); } }
        public void Save(string path) { handle.Run(h => emberc.eb_session_save(h, path)); }

        /// <summary>Appends tokens; returns log p(token | everything before it) for each (NaN for the very first).</summary>
        public float[] Score(IList<int> tokens)
        {
            using (var t = Tokens.Of(tokens))
            {
                return handle.Call(h =>
                {
                    using (var f = emberc.eb_session_score(h, t))
                    {
                        var a = new float[f.size()];
                        for (int i = 0; i < a.Length; i++) a[i] = f.get(i);
                        return a;
                    }
                });
            }
        }

        /// <summary>Starts generating from everything added so far; enumerate the Stream for text pieces.</summary>
        public Stream Generate(Sampling sampling = null)
        {
            sampling = sampling ?? new Sampling();
            var draft = sampling.SpecDraftModel;
            using (var raw = sampling.ToNative())
            {
                if (draft == null) return new Stream(this, handle.Call(h => emberc.eb_stream_start(h, raw)), null);
                // The draft model stays open across the start; the stream then keeps it loaded.
                var st = draft.handle.Call(d =>
                {
                    raw.spec_draft_model = d;
                    return handle.Call(h => emberc.eb_stream_start(h, raw));
                });
                return new Stream(this, st, draft);
            }
        }

        /// <summary>Adds a user message and returns the whole reply.</summary>
        public string Chat(string content, Sampling sampling = null)
        {
            AddMessage("user", content);
            using (var s = Generate(sampling)) return s.ReadAll();
        }

        public bool IsClosed { get { return handle.IsClosed; } }

        public void Dispose()
        {
            handle.Close();
            GC.SuppressFinalize(this);
        }
    }

    /// <summary>
    /// One generation: enumerate it for text pieces. Text is everything so far, ToolCalls the tool calls
    /// read so far (not in the text), Logprobs the tokens' log-probabilities (with Sampling.Logprobs),
    /// EndReason and Stats say how it ended. Cancel() may be called from any thread. The finalizer cancels it without blocking (ember_stream_release).
    /// </summary>
    public sealed class Stream : IDisposable, IEnumerable<string>
    {
        internal readonly Handle<SWIGTYPE_p_ember_stream> handle;
        private readonly eb_event ev = new eb_event();
        private readonly StringBuilder text = new StringBuilder();
        private readonly List<int> tokens = new List<int>();
        private readonly List<ToolCall> toolCalls = new List<ToolCall>();
        private readonly List<TokenLogprob> logprobs = new List<TokenLogprob>();
        private readonly object readLock = new object();
        private EndReason? end;

        internal Stream(Session session, SWIGTYPE_p_ember_stream h, Model draftModel)
        {
            Session = session;
            DraftModel = draftModel;
            handle = new Handle<SWIGTYPE_p_ember_stream>(h, emberc.ember_stream_destroy, "Stream");
        }

        // The garbage collector never waits for, or runs, engine steps.
        ~Stream() { if (handle != null) handle.Close(emberc.ember_stream_release); }

        public Session Session { get; private set; }

        /// <summary>The speculative draft model (Sampling.SpecDraftModel), held as long as the stream; or null.</summary>
        public Model DraftModel { get; private set; }

        /// <summary>The next text piece, or null at the end. With timeoutMs &gt;= 0 throws
        /// EmberException(Timeout) when nothing came in time (manual-step engines poll with 0).</summary>
        public string NextPiece(int timeoutMs = -1)
        {
            lock (readLock)
            {
                while (end == null)
                {
                    int got = handle.Call(h => emberc.eb_stream_next(h, ev, timeoutMs));
                    if (got == 0) throw new EmberException(EmberException.Timeout, "no event within the timeout");
                    if (got < 0) { end = Ember.EndReason.None; break; }
                    if (ev.kind == emberc.EVENT_END) { end = (EndReason)ev.end_reason; break; }
                    long n = ev.n_tokens();
                    for (long i = 0; i < n; i++) tokens.Add(ev.token(i));
                    if (ev.has_logprobs() != 0)
                    {
                        int k = ev.n_top();
                        for (long i = 0; i < n; i++)
                        {
                            var topTokens = new int[k];
                            var topLogprobs = new float[k];
                            for (int j = 0; j < k; j++)
                            {
                                topTokens[j] = ev.top_token(i, j);
                                topLogprobs[j] = ev.top_logprob(i, j);
                            }
                            logprobs.Add(new TokenLogprob(ev.token(i), ev.logprob(i), topTokens, topLogprobs));
                        }
                    }
                    if (ev.kind == emberc.EVENT_TOOL_CALL)
                    {
                        toolCalls.Add(new ToolCall(ev.tool_call_id(), ev.tool_name(), ev.tool_arguments()));
                        continue;
                    }
                    string piece = ev.text();
                    if (piece.Length > 0)
                    {
                        text.Append(piece);
                        return piece;
                    }
                }
                return null;
            }
        }

        public IEnumerator<string> GetEnumerator()
        {
            for (string p; (p = NextPiece()) != null; ) yield return p;
        }

        IEnumerator IEnumerable.GetEnumerator() { return GetEnumerator(); }

        /// <summary>Waits for the end and returns the whole text.</summary>
        public string ReadAll()
        {
            while (NextPiece() != null) { }
            return Text;
        }

        public string Text { get { lock (readLock) return text.ToString(); } }
        /// <summary>The tool calls read so far (all of them once the stream is read to its end).</summary>
        public ToolCall[] ToolCalls { get { lock (readLock) return toolCalls.ToArray(); } }
        /// <summary>With Sampling.Logprobs: one entry per generated token read so far (as Tokens).</summary>
        public TokenLogprob[] Logprobs { get { lock (readLock) return logprobs.ToArray(); } }
        public int[] Tokens { get { lock (readLock) return tokens.ToArray(); } }
        /// <summary>null until the end was read.</summary>
        public EndReason? EndReason { get { return end; } }
        public bool IsFinished { get { return end != null; } }

        /// <summary>Requests the end (Cancelled soon after). Any thread; a no-op once closed.</summary>
        public void Cancel()
        {
            try { handle.Run(h => emberc.eb_stream_cancel(h)); }
            catch (EmberException) { if (!handle.IsClosed) throw; }
        }

        public StreamStats Stats
        {
            get
            {
                using (var raw = new eb_stats())
                {
                    handle.Run(h => emberc.eb_stream_stats_get(h, raw));
                    return new StreamStats
                    {
                        PromptTokens = raw.prompt_tokens, GeneratedTokens = raw.generated_tokens,
                        TimeToFirstTokenMs = raw.time_to_first_token_ms, TokensPerSecond = raw.tokens_per_second,
                        PrefillTokensPerSecond = raw.prefill_tokens_per_second, Finished = raw.finished != 0,
                        EndReason = (EndReason)raw.end_reason, DraftedTokens = raw.drafted_tokens,
                        AcceptedTokens = raw.accepted_tokens, VerifyPasses = raw.verify_passes,
                        MeanAcceptedLength = raw.mean_accepted_length,
                    };
                }
            }
        }

        public bool IsClosed { get { return handle.IsClosed; } }

        /// <summary>Cancels if still running, waits for it to stop and releases it. Idempotent.</summary>
        public void Dispose()
        {
            Cancel();
            handle.Close();
            GC.SuppressFinalize(this);
        }
    }
}
