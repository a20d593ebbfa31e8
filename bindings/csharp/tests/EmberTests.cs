// The binding scenarios of issue 11 (section 4), in C#, with a tiny assert
// runner (no NUnit): run with mono, exit status 0 when all pass.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Threading;
using Ember;
using Stream = Ember.Stream;

static class EmberTests
{
    const string Prompt = "Name three colors.";
    // Every drafter drafts on it (tests/capi/speculative_test.cpp).
    const string Counting = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,";
    const long Kv = 64L << 20; // as bindings/tools/greedy_ref.c
    static Model model;
    static Engine engine;

    class Failure : Exception { public Failure(string m) : base(m) { } }

    static void Check(bool ok, string what) { if (!ok) throw new Failure(what); }

    static void Eq<T>(T expected, T actual, string what)
    {
        if (!EqualityComparer<T>.Default.Equals(expected, actual))
            throw new Failure(what + ": expected <" + expected + "> got <" + actual + ">");
    }

    static EmberException Throws(int status, Action body)
    {
        try { body(); }
        catch (EmberException e)
        {
            Eq(status, e.Status, "status of '" + e.Message + "'");
            Check(e.Message.Length > 0, "the exception carries a message");
            return e;
        }
        throw new Failure("expected EmberException with status " + status);
    }

    static string ModelPath()
    {
        string m = Environment.GetEnvironmentVariable("EMBER_MODEL");
        if (!string.IsNullOrEmpty(m)) return m;
        string home = Environment.GetEnvironmentVariable("EMBER_HOME");
        if (string.IsNullOrEmpty(home)) home = Environment.GetEnvironmentVariable("HOME") + "/.cache/ember";
        return home + "/SmolLM2-135M-Instruct.Q4_1.gguf";
    }

    static string Ids(IEnumerable<int> ids) { return string.Join(" ", ids); }

    static string CApiGreedy(int maxTokens, string message)
    {
        string reference = Environment.GetEnvironmentVariable("EMBER_GREEDY_REF");
        Check(!string.IsNullOrEmpty(reference), "EMBER_GREEDY_REF is set (run through CTest)");
        var psi = new ProcessStartInfo(reference) { UseShellExecute = false, RedirectStandardOutput = true };
        psi.Arguments = "\"" + ModelPath() + "\" " + maxTokens + " \"" + message + "\"";
        using (var p = Process.Start(psi))
        {
            string output = p.StandardOutput.ReadToEnd().Trim();
            p.WaitForExit();
            Eq(0, p.ExitCode, "greedy_ref exit status");
            return string.Join(" ", output.Split((char[])null, StringSplitOptions.RemoveEmptyEntries));
        }
    }

    static Sampling Greedy(int n) { return new Sampling { MaxTokens = n, Temperature = 0 }; }

    static Stream RunGreedy(Session s, Sampling sampling)
    {
        using (var st = s.Generate(sampling)) { st.ReadAll(); return st; }
    }

    static void LoadAndInfo()
    {
        Eq("llama", model.Info.Architecture, "architecture");
        Eq(30, model.Info.NLayers, "layers");
        Eq(49152, model.Info.VocabSize, "vocab");
        Check(model.Info.NParams > 100000000L, "n_params");
        Eq("cpu", engine.Device, "device");
        Eq(-1, engine.GpuIndex, "gpu index");
        Check(engine.BackendName.StartsWith("cpu/"), "backend name");
        var v = Library.Version.Split('.').Select(int.Parse).ToArray();
        Eq(v[0] * 10000 + v[1] * 100 + v[2], Library.VersionNumber, "version number");
        Check(new[] { "scalar", "avx2", "avx512_vnni" }.Contains(Library.CpuIsa), "cpu isa");
        Check(new[] { "absent", "loadable", "broken" }.Contains(Library.CudaPlugin), "cuda plugin");
    }

    static void TokenizeRoundTrip()
    {
        string text = "Hello, world! Ünïcödé 🙂 and <|im_start|> text.";
        int[] ids = model.Tokenize(text);
        Check(ids.Length > 0, "tokens");
        Eq(text, model.Detokenize(ids), "round trip");
        Eq(1, model.Tokenize("<|im_start|>", parseSpecial: true).Length, "special token");
        Eq("", model.Detokenize(new int[0]), "empty");
        Throws(EmberException.InvalidArgument, () => model.Detokenize(new[] { 1000000000 }));
    }

    static void GreedyMatchesTheCApi()
    {
        string expected = CApiGreedy(24, Prompt);
        Check(expected.Length > 0, "reference tokens");
        using (var s = engine.Session())
        {
            s.AddMessage("user", Prompt);
            var st = RunGreedy(s, Greedy(24));
            Eq(expected, Ids(st.Tokens), "greedy tokens vs the C API");
            Eq(model.Detokenize(expected.Split(' ').Select(int.Parse).ToArray()), st.Text, "greedy text");
        }
    }

    static void PiecesConcatenate()
    {
        using (var s = engine.Session("You are brief."))
        {
            s.AddMessage("user", Prompt);
            using (var st = s.Generate(new Sampling { MaxTokens = 20, Temperature = 0.8f, Seed = 42 }))
            {
                var pieces = st.ToList();
                Check(pieces.Count > 1, "several pieces");
                Check(pieces.All(p => p.Length > 0), "non-empty pieces");
                Eq(st.Text, string.Concat(pieces), "pieces concatenate to the text");
                Eq(model.Detokenize(st.Tokens), st.Text, "text = detokenized tokens");
                Check(st.EndReason == EndReason.MaxTokens || st.EndReason == EndReason.Eos, "end reason " + st.EndReason);
                var stats = st.Stats;
                Check(stats.Finished, "finished");
                // (An end-of-generation token counts as generated; it is not sent.)
                long eos = st.EndReason == EndReason.Eos ? 1 : 0;
                Eq((long)st.Tokens.Length + eos, stats.GeneratedTokens, "generated tokens");
                Check(stats.PromptTokens > 0, "prompt tokens");
            }
            Check(s.Chat("And three animals?", Greedy(12)).Length > 0, "chat reply");
        }
    }

    static void StopStrings()
    {
        string full;
        using (var s = engine.Session())
        {
            s.AddMessage("user", Prompt);
            full = RunGreedy(s, Greedy(24)).Text;
        }
        var words = full.Split((char[])null, StringSplitOptions.RemoveEmptyEntries);
        Check(words.Length >= 3, "enough words in '" + full + "'");
        string stop = words[2];
        string expected = full.Substring(0, full.IndexOf(stop, StringComparison.Ordinal));
        using (var s = engine.Session())
        {
            s.AddMessage("user", Prompt);
            var g = Greedy(24);
            g.Stop.Add(stop);
            g.Stop.Add("\u2603never");
            var st = RunGreedy(s, g);
            Eq<EndReason?>(EndReason.StopString, st.EndReason, "end reason");
            Eq(expected, st.Text, "text before the stop string");
        }
    }

    static void StructuredOutput()
    {
        using (var s = engine.Session())
        {
            s.AddMessage("user", "Where does the sun rise?");
            var g = Greedy(8);
            g.Choices.Add("east");
            g.Choices.Add("west");
            var st = RunGreedy(s, g);
            Check(st.Text == "east" || st.Text == "west", "a choice: '" + st.Text + "'");
        }
        using (var s = engine.Session())
        {
            s.AddMessage("user", "Which city is the capital of France? Answer in JSON.");
            var g = Greedy(48);
            g.JsonSchema = "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 20}}, \"required\": [\"city\"]}";
            var st = RunGreedy(s, g);
            Check(System.Text.RegularExpressions.Regex.IsMatch(st.Text, "^\\{\"city\": \"[^\"]*\"\\}$"), "JSON of the schema: '" + st.Text + "'");
            try
            {
                var bad = Greedy(4);
                bad.Regex = "(";
                s.Generate(bad).Dispose();
                Check(false, "a bad regex is refused");
            }
            catch (EmberException e)
            {
                Eq(EmberException.InvalidArgument, e.Status, "status of a bad regex");
            }
        }
    }

    static void ToolCalling()
    {
        const string tools = "[{\"type\": \"function\", \"function\": {\"name\": \"move_to\", \"description\": \"Walk to a point\", "
            + "\"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}, \"y\": {\"type\": \"integer\"}}, "
            + "\"required\": [\"x\", \"y\"]}}}]";
        using (var s = engine.Session())
        {
            s.SetTools(tools);
            s.AddMessage("user", "Walk to x 3, y 4.");
            var g = Greedy(64);
            g.ToolChoice = "move_to";
            var st = RunGreedy(s, g);
            Eq("", st.Text, "text beside a forced call");
            Check(st.Tokens.Length > 0, "the call's tokens are in Tokens");
            var calls = st.ToolCalls;
            Eq(1, calls.Length, "calls " + string.Join(", ", calls.Select(c => c.ToString())));
            Eq("move_to", calls[0].Name, "name");
            Check(calls[0].Id.StartsWith("call_"), "id: " + calls[0].Id);
            // The tests reference no JSON library: the compact arguments, keys in the schema's order.
            Check(System.Text.RegularExpressions.Regex.IsMatch(calls[0].Arguments, "^\\{\"x\": *-?[0-9]+, *\"y\": *-?[0-9]+\\}$"),
                  "arguments: " + calls[0].Arguments);
            s.AddMessage("tool", "arrived");
            var none = Greedy(8);
            none.ToolChoice = "none";
            Eq(0, RunGreedy(s, none).ToolCalls.Length, "calls with ToolChoice none");
            var unknown = Greedy(4);
            unknown.ToolChoice = "fly_to";
            Throws(EmberException.InvalidArgument, () => s.Generate(unknown).Dispose());
            Throws(EmberException.InvalidArgument, () => s.SetTools("not json"));
            s.SetTools(null);
            var required = Greedy(4);
            required.ToolChoice = "required";
            // No tools left to require.
            Throws(EmberException.InvalidArgument, () => s.Generate(required).Dispose());
        }
    }

    static void LogprobsAndLogitBias()
    {
        const string text = "The capital of France is Paris. The capital of Italy is";
        int[] tokens;
        TokenLogprob[] lps;
        using (var s = engine.Session())
        {
            s.AddText(text);
            var g = Greedy(6);
            g.IgnoreEos = true;
            g.Logprobs = true;
            g.TopLogprobs = 3;
            var st = RunGreedy(s, g);
            tokens = st.Tokens;
            lps = st.Logprobs;
        }
        Eq(6, tokens.Length, "tokens");
        Eq(tokens.Length, lps.Length, "one entry per token: " + string.Join(", ", lps.Select(e => e.ToString())));
        for (int i = 0; i < tokens.Length; i++)
        {
            var e = lps[i];
            Eq(tokens[i], e.Token, "entry " + i + " token");
            Check(e.Logprob <= 0f, "entry " + i + " logprob " + e.Logprob);
            Eq(3, e.TopTokens.Length, "entry " + i + " alternatives");
            Eq(3, e.TopLogprobs.Length, "entry " + i + " alternatives' logprobs");
            Eq(tokens[i], e.TopTokens[0], "entry " + i + ": greedy picks the most likely");
        }
        using (var s = engine.Session())
        {
            s.AddText(text);
            var g = Greedy(6);
            g.IgnoreEos = true;
            g.LogitBias[tokens[0]] = float.NegativeInfinity;
            var st = RunGreedy(s, g);
            Check(!st.Tokens.Contains(tokens[0]), "banned token " + tokens[0] + " in " + Ids(st.Tokens));
            Eq(0, st.Logprobs.Length, "logprobs without Logprobs");
            var top = Greedy(2);
            top.TopLogprobs = 3; // without Logprobs
            Throws(EmberException.InvalidArgument, () => s.Generate(top).Dispose());
            var negative = Greedy(2);
            negative.LogitBias[-5] = 1f;
            Throws(EmberException.InvalidArgument, () => s.Generate(negative).Dispose());
        }
    }

    static bool Same(float[] a, float[] b) { return a.SequenceEqual(b); }

    static bool Same(float[][] a, float[][] b)
    {
        return a.Length == b.Length && a.Zip(b, (x, y) => x.SequenceEqual(y)).All(ok => ok);
    }

    // Embeddings (C ABI 1.5).
    static void Embed()
    {
        var texts = new[] { "The quick brown fox jumps over the lazy dog.", "Dragons hate rain.", "Paris is in France." };
        int d = model.Info.NEmbd;
        float[][] vectors = engine.Embed(texts);
        Eq(texts.Length, vectors.Length, "one vector per text");
        foreach (var v in vectors)
        {
            Eq(d, v.Length, "vector length = n_embd");
            Check(v.All(x => !float.IsNaN(x) && !float.IsInfinity(x)), "finite values");
        }
        Check(!Same(vectors[0], vectors[1]), "two texts, two vectors");
        Check(Same(vectors, engine.Embed(texts)), "the same texts again: the same vectors");
        Check(Same(vectors, engine.Embed(new List<string>(texts))), "a List");
        for (int i = 0; i < texts.Length; i++) Check(Same(vectors[i], engine.Embed(texts[i])), "one at a time = together (" + i + ")");
        foreach (var v in engine.Embed(texts, normalize: true))
        {
            double n = Math.Sqrt(v.Sum(x => (double)x * x));
            Check(Math.Abs(n - 1.0) < 1e-4, "normalised: length " + n);
        }
        float[][] last = engine.Embed(texts, Pooling.Last);
        Eq(d, last[0].Length, "last: n_embd");
        Check(!Same(last[0], vectors[0]), "last pooling differs from mean");
        Check(!Same(engine.Embed(texts[0], Pooling.Cls), vectors[0]), "cls pooling differs from mean");
        var ids = texts.Select(t => model.Tokenize(t, addSpecial: true, parseSpecial: false)).ToArray();
        Check(Same(vectors, engine.EmbedTokens(ids)), "tokens of the texts = the texts");
        Check(Same(vectors[1], engine.EmbedTokens(ids[1])), "one token list");
        Check(Same(last, engine.EmbedTokens(ids, Pooling.Last)), "tokens, last");
        // Bad input throws; the engine goes on.
        Throws(EmberException.InvalidArgument, () => engine.Embed(""));
        Throws(EmberException.InvalidArgument, () => engine.Embed(new[] { "a", "" }));
        Throws(EmberException.InvalidArgument, () => engine.Embed(new string[0]));
        Throws(EmberException.InvalidArgument, () => engine.Embed(new[] { "a", null }));
        Throws(EmberException.InvalidArgument, () => engine.Embed((IReadOnlyList<string>)null));
        Throws(EmberException.InvalidArgument, () => engine.Embed("a\0b"));
        Throws(EmberException.InvalidArgument, () => engine.Embed(texts, (Pooling)7));
        Throws(EmberException.InvalidArgument, () => engine.Embed(texts, (Pooling)(-1)));
        Throws(EmberException.InvalidArgument, () => engine.Embed(new string[Engine.MaxEmbedInputs + 1]));
        Throws(EmberException.InvalidArgument, () => engine.EmbedTokens(new int[0]));
        Throws(EmberException.InvalidArgument, () => engine.EmbedTokens(new int[0][]));
        Throws(EmberException.InvalidArgument, () => engine.EmbedTokens(new[] { -1 }));
        Throws(EmberException.InvalidArgument, () => engine.EmbedTokens(new[] { model.Info.VocabSize }));
        Throws(EmberException.ContextFull, () => engine.EmbedTokens(new int[model.Info.ContextLength + 1]));
        Check(Same(vectors[2], engine.Embed(texts[2])), "the engine goes on");
        var closed = new Engine(model, kvMemoryBytes: Kv);
        closed.Dispose();
        Throws(EmberException.InvalidArgument, () => closed.Embed(texts));
    }

    /// <summary>A rank-8 adapter for the test model (make_synthetic_model --lora-for); null when the tool is unknown.</summary>
    static string MakeAdapter(string dir)
    {
        string tool = Environment.GetEnvironmentVariable("EMBER_MAKE_SYNTHETIC_MODEL");
        if (string.IsNullOrEmpty(tool)) return null;
        string output = Path.Combine(dir, "lora.gguf");
        var psi = new ProcessStartInfo(tool) { UseShellExecute = false, RedirectStandardOutput = true };
        psi.Arguments = "--lora-for \"" + ModelPath() + "\" --rank 8 --seed 3 --out \"" + output + "\"";
        using (var p = Process.Start(psi))
        {
            p.StandardOutput.ReadToEnd();
            p.WaitForExit();
            Eq(0, p.ExitCode, "make_synthetic_model exit status");
        }
        return output;
    }

    static string LoraGreedy(IList<Lora> loras, IList<float> scales)
    {
        using (var s = engine.Session())
        {
            if (loras != null) s.SetLoras(loras, scales);
            s.AddMessage("user", Prompt);
            return Ids(RunGreedy(s, Greedy(16)).Tokens);
        }
    }

    static void LoraAdapters()
    {
        string dir = Path.Combine(Path.GetTempPath(), "ember-lora-" + Guid.NewGuid().ToString("N"));
        Directory.CreateDirectory(dir);
        try
        {
            string path = MakeAdapter(dir);
            if (path == null) { Console.WriteLine("SKIP lora: EMBER_MAKE_SYNTHETIC_MODEL not set (run through CTest)"); return; }
            string baseIds = LoraGreedy(null, null);
            string adapted;
            using (var lora = new Lora(model, path))
            {
                var info = lora.Info;
                Eq(8, info.MaxRank, "max rank");
                Check(info.NMatrices > 0, "matrices adapted: " + info);
                Check(info.Bytes > 0, "bytes: " + info);
                Check(!float.IsNaN(info.Alpha) && !float.IsInfinity(info.Alpha), "alpha: " + info);
                Check(lora.Model == model, "model");
                adapted = LoraGreedy(new[] { lora }, new[] { 1.0f });
                Check(baseIds.Length > 0 && adapted.Length > 0, "tokens");
                Check(adapted != baseIds, "the adapter changes the greedy reply");
                Eq(adapted, LoraGreedy(new[] { lora }, null), "null scales: 1.0");
                Eq(baseIds, LoraGreedy(new[] { lora }, new[] { 0.0f }), "scale 0");
                Eq(baseIds, LoraGreedy(new Lora[0], null), "no adapters");
                // Changed on one session: none restores the base model's output.
                using (var s = engine.Session())
                {
                    s.SetLoras(lora);
                    s.AddMessage("user", Prompt);
                    Eq(adapted, Ids(RunGreedy(s, Greedy(16)).Tokens), "with the adapter");
                    s.Reset();
                    s.SetLoras();
                    s.AddMessage("user", Prompt);
                    Eq(baseIds, Ids(RunGreedy(s, Greedy(16)).Tokens), "set to none");
                    s.SetLoras(lora);
                    s.SetLoras(null);
                    s.Reset();
                    s.AddMessage("user", Prompt);
                    Eq(baseIds, Ids(RunGreedy(s, Greedy(16)).Tokens), "set to null");
                }
                // Refused sets throw with the library's message; the session goes on.
                using (var s = engine.Session())
                {
                    foreach (float bad in new[] { float.NaN, float.PositiveInfinity, -2000f })
                    {
                        var e = Throws(EmberException.InvalidArgument, () => s.SetLoras(new[] { lora }, new[] { bad }));
                        Check(e.Message.Contains("scale"), "message names the scale: " + e.Message);
                    }
                    var many = Enumerable.Repeat(lora, 17).ToArray();
                    var tooMany = Throws(EmberException.InvalidArgument, () => s.SetLoras(many));
                    Check(tooMany.Message.Contains("16"), "message names the limit: " + tooMany.Message);
                    Throws(EmberException.InvalidArgument, () => s.SetLoras(new[] { lora }, new[] { 1f, 1f }));
                    Throws(EmberException.InvalidArgument, () => s.SetLoras(lora, null));
                    s.AddMessage("user", Prompt);
                    Eq(baseIds, Ids(RunGreedy(s, Greedy(16)).Tokens), "after refused sets");
                    using (var st = s.Generate(new Sampling { MaxTokens = 50, Temperature = 0, IgnoreEos = true }))
                        Throws(EmberException.Busy, () => s.SetLoras(lora));
                }
            }
            // Disposing the adapter while a session uses it: the session keeps it alive.
            using (var s = engine.Session())
            {
                var dropped = new Lora(model, path);
                s.SetLoras(dropped);
                dropped.Dispose();
                Check(dropped.IsClosed, "closed");
                s.AddMessage("user", Prompt);
                Eq(adapted, Ids(RunGreedy(s, Greedy(16)).Tokens), "after dispose");
                Throws(EmberException.InvalidArgument, () => s.SetLoras(dropped));
                Throws(EmberException.InvalidArgument, () => { var unused = dropped.Info; });
                s.Reset();
                s.AddMessage("user", Prompt);
                Eq(adapted, Ids(RunGreedy(s, Greedy(16)).Tokens), "the set it had");
            }
            // ... and in the middle of a stream.
            using (var s = engine.Session())
            using (var mid = new Lora(model, path))
            {
                s.SetLoras(mid);
                s.AddMessage("user", Prompt);
                using (var st = s.Generate(Greedy(16)))
                {
                    st.NextPiece();
                    mid.Dispose();
                    st.ReadAll();
                    Eq(adapted, Ids(st.Tokens), "disposed mid-stream");
                }
            }
            // Not an adapter.
            var notAdapter = Throws(EmberException.BadFormat, () => new Lora(model, ModelPath()));
            Check(notAdapter.Message.Contains("not an adapter"), "message: " + notAdapter.Message);
            Throws(EmberException.NotFound, () => new Lora(model, Path.Combine(dir, "missing.gguf")));
        }
        finally
        {
            Directory.Delete(dir, true);
        }
    }

    static void CancelFromAnotherThread()
    {
        using (var s = engine.Session())
        {
            s.AddMessage("user", "Write a very long story about the sea.");
            var g = Greedy(400);
            g.IgnoreEos = true;
            using (var st = s.Generate(g))
            {
                string first = st.NextPiece();
                Check(first != null, "a first piece");
                var t = new Thread(st.Cancel);
                t.Start();
                t.Join();
                string rest = string.Concat(st);
                Eq<EndReason?>(EndReason.Cancelled, st.EndReason, "end reason");
                Check(st.Tokens.Length < 400, "stopped early");
                Eq(st.Text, first + rest, "pieces");
            }
            Check(s.Chat("Thanks.", Greedy(4)) != null, "session usable after cancel");
        }
    }

    static void TwoSessionsOnTwoThreads()
    {
        string[] prompts = { "Name three colors.", "Count from one to five." };
        var alone = new List<string>();
        foreach (var p in prompts)
            using (var s = engine.Session()) { s.AddMessage("user", p); alone.Add(Ids(RunGreedy(s, Greedy(20)).Tokens)); }
        var results = new string[2];
        var errors = new Exception[2];
        var barrier = new Barrier(2);
        var threads = Enumerable.Range(0, 2).Select(k => new Thread(() =>
        {
            try
            {
                using (var s = engine.Session())
                {
                    s.AddMessage("user", prompts[k]);
                    barrier.SignalAndWait();
                    results[k] = Ids(RunGreedy(s, Greedy(20)).Tokens);
                }
            }
            catch (Exception e) { errors[k] = e; }
        })).ToArray();
        foreach (var t in threads) t.Start();
        foreach (var t in threads) t.Join();
        Check(errors[0] == null && errors[1] == null, "threads: " + errors[0] + " " + errors[1]);
        Eq(string.Join("|", alone), string.Join("|", results), "concurrent = alone");
    }

    static void SaveLoadContinue()
    {
        string dir = Path.Combine(Path.GetTempPath(), "ember-cs-" + Guid.NewGuid().ToString("N"));
        Directory.CreateDirectory(dir);
        try
        {
            string path = Path.Combine(dir, "chat.ember");
            string contA;
            long n;
            using (var a = engine.Session("You are brief."))
            {
                a.AddMessage("user", Prompt);
                RunGreedy(a, Greedy(12));
                a.Save(path);
                n = a.TokenCount;
                a.AddMessage("user", "Now three fruits.");
                contA = Ids(RunGreedy(a, Greedy(16)).Tokens);
            }
            using (var b = engine.LoadSession(path))
            {
                Eq(n, b.TokenCount, "token count after load");
                b.AddMessage("user", "Now three fruits.");
                Eq(contA, Ids(RunGreedy(b, Greedy(16)).Tokens), "continuation after load");
            }
            Throws(EmberException.NotFound, () => engine.LoadSession(Path.Combine(dir, "missing.ember")));
        }
        finally { Directory.Delete(dir, true); }
    }

    // ---------------------------------------------------------------- speculative decoding
    /// The tokens and stats of one stream on a fresh session (counting text, or a chat message).
    static KeyValuePair<int[], StreamStats> SpecRun(bool counting, Sampling sampling)
    {
        using (var s = engine.Session())
        {
            if (counting) s.AddText(Counting);
            else s.AddMessage("user", Prompt);
            using (var st = s.Generate(sampling))
            {
                st.ReadAll();
                return new KeyValuePair<int[], StreamStats>(st.Tokens, st.Stats);
            }
        }
    }

    static void SpeculativeGreedyEqualsPlain()
    {
        using (var draft = new Model(ModelPath())) // the same file loaded twice: exactness, not speed
        {
            var drafters = new List<KeyValuePair<string, Func<Sampling>>>
            {
                new KeyValuePair<string, Func<Sampling>>("ngram", () => { var g = Greedy(24); g.SpecDrafter = "ngram"; return g; }),
                new KeyValuePair<string, Func<Sampling>>("self", () => { var g = Greedy(24); g.SpecDrafter = "self"; g.SpecSelfLayers = 20; return g; }),
                new KeyValuePair<string, Func<Sampling>>("draft", () => { var g = Greedy(24); g.SpecDrafter = "draft"; g.SpecDraftModel = draft; return g; }),
                new KeyValuePair<string, Func<Sampling>>("draft (implied), chains", () =>
                    new Sampling { MaxTokens = 24, Temperature = 0, SpecDraftModel = draft, SpecThreshold = 2f, SpecMaxNodes = 6,
                                   SpecMaxDepth = 6, SpecAlpha = 0.5f }),
            };
            foreach (bool counting in new[] { true, false })
            {
                var plain = SpecRun(counting, Greedy(24));
                Check(plain.Key.Length > 0, "plain tokens");
                Eq(0L, plain.Value.DraftedTokens, "drafted without speculation");
                Eq(0L, plain.Value.VerifyPasses, "verify passes without speculation");
                foreach (var d in drafters)
                {
                    string what = d.Key + (counting ? " on counting" : " on chat");
                    var r = SpecRun(counting, d.Value());
                    var st = r.Value;
                    Eq(Ids(plain.Key), Ids(r.Key), what);
                    Eq(plain.Value.GeneratedTokens, st.GeneratedTokens, "generated " + what);
                    Check(st.AcceptedTokens <= st.DraftedTokens, "accepted <= drafted " + what);
                    if (counting)
                    {
                        Check(st.DraftedTokens > 0, "drafted " + what);
                        Check(st.VerifyPasses > 0, "verify passes " + what);
                        Check(Math.Abs(st.MeanAcceptedLength - (double)st.AcceptedTokens / st.VerifyPasses) < 1e-9, "mean " + what);
                    }
                }
            }
            // SpecLookup = false: the draft alone; one as costly as the model itself is never run.
            var plainRun = SpecRun(true, Greedy(24));
            var alone = Greedy(24);
            alone.SpecDraftModel = draft;
            alone.SpecLookup = false;
            var aloneRun = SpecRun(true, alone);
            Eq(Ids(plainRun.Key), Ids(aloneRun.Key), "draft alone");
            Eq(0L, aloneRun.Value.DraftedTokens, "drafted by the draft alone");
        }
    }

    static void SpeculativeStreamKeepsItsDraftModel()
    {
        var plain = SpecRun(true, Greedy(16)).Key;
        var draft = new Model(ModelPath());
        using (var s = engine.Session())
        {
            s.AddText(Counting);
            var g = Greedy(16);
            g.SpecDraftModel = draft;
            using (var st = s.Generate(g))
            {
                Check(ReferenceEquals(st.DraftModel, draft), "the stream holds its draft model");
                draft.Dispose(); // the stream keeps it loaded until it ends
                st.ReadAll();
                Eq(Ids(plain), Ids(st.Tokens), "tokens with the draft model closed");
                Check(st.Stats.VerifyPasses > 0, "verify passes");
            }
        }
        Throws(EmberException.InvalidArgument, () => { var g = Greedy(4); g.SpecDraftModel = draft; SpecRun(true, g); });
    }

    static Sampling Spec(string drafter, Action<Sampling> set = null)
    {
        var g = Greedy(4);
        g.SpecDrafter = drafter;
        if (set != null) set(g);
        return g;
    }

    static void SpeculativeBadParameters()
    {
        var bad = new[]
        {
            Spec("ngram", g => g.SpecMaxNodes = 0), Spec("ngram", g => g.SpecMaxNodes = 1000),
            Spec("ngram", g => g.SpecMaxDepth = 0), Spec("ngram", g => g.SpecThreshold = float.NaN),
            Spec("ngram", g => g.SpecAlpha = 2f), Spec("self", g => g.SpecSelfLayers = 1000),
            Spec("self", g => g.SpecSelfLayers = -1), Spec("draft"), // no draft model
            Spec("eagle"), Spec("ngram", g => g.SpecDraftModel = model),
        };
        using (var s = engine.Session())
        {
            s.AddText(Counting);
            foreach (var b in bad) Throws(EmberException.InvalidArgument, () => s.Generate(b));
            var e = Throws(EmberException.InvalidArgument, () => s.Generate(Spec("ngram", g => g.SpecMaxNodes = 1000)));
            Check(e.Message.Contains("max_nodes"), "message: " + e.Message);
            // A draft model with another vocabulary is refused by the engine.
            string other = Path.Combine(Path.GetDirectoryName(ModelPath()), "gemma-3-270m-q4_k_m.gguf");
            if (File.Exists(other))
            {
                using (var gemma = new Model(other))
                {
                    var v = Throws(EmberException.InvalidArgument, () => s.Generate(Spec(null, g => g.SpecDraftModel = gemma)));
                    Check(v.Message.Contains("vocabulary"), "message: " + v.Message);
                }
            }
            else
            {
                Check(Environment.GetEnvironmentVariable("CI") == null, "model missing: " + other);
            }
            // Nothing above left the session busy.
            Eq(4, RunGreedy(s, Spec("ngram")).Tokens.Length, "tokens after the errors");
        }
    }

    static void SamplingDefaultsAreTheLibrarys()
    {
        var g = new Sampling();
        using (var d = new Ember.LowLevel.eb_sampling())
        {
            Eq(d.max_tokens, g.MaxTokens, "MaxTokens");
            Eq(d.temperature, g.Temperature, "Temperature");
            Eq(d.top_k, g.TopK, "TopK");
            Eq(d.top_p, g.TopP, "TopP");
            Eq(d.min_p, g.MinP, "MinP");
            Eq(d.repeat_penalty, g.RepeatPenalty, "RepeatPenalty");
            Eq(d.presence_penalty, g.PresencePenalty, "PresencePenalty");
            Eq(d.frequency_penalty, g.FrequencyPenalty, "FrequencyPenalty");
            Eq(d.penalty_last_n, g.PenaltyLastN, "PenaltyLastN");
            Eq(d.spec_drafter, Ember.LowLevel.emberc.SPEC_NONE, "spec_drafter");
            Eq(d.spec_self_layers, g.SpecSelfLayers, "SpecSelfLayers");
            Eq(d.spec_threshold, g.SpecThreshold, "SpecThreshold");
            Eq(d.spec_max_nodes, g.SpecMaxNodes, "SpecMaxNodes");
            Eq(d.spec_max_depth, g.SpecMaxDepth, "SpecMaxDepth");
            Eq(d.spec_alpha, g.SpecAlpha, "SpecAlpha");
            Eq(d.spec_lookup, g.SpecLookup ? 1 : 0, "SpecLookup");
            Eq(d.tool_choice, Ember.LowLevel.emberc.TOOL_CHOICE_AUTO, "tool_choice");
            Eq(d.parallel_tool_calls, g.ParallelToolCalls ? 1 : 0, "ParallelToolCalls");
            Eq(d.logprobs, g.Logprobs ? 1 : 0, "Logprobs");
            Eq(d.top_logprobs, g.TopLogprobs, "TopLogprobs");
        }
    }

    // ---------------------------------------------------------------- penalties
    static Sampling Penalised(int n, Action<Sampling> set)
    {
        var g = Greedy(n);
        set(g);
        return g;
    }

    static void PenaltiesReachTheEngine()
    {
        var plain = SpecRun(true, Greedy(24)).Key; // greedy repeats ", " and digits
        var penalised = new List<KeyValuePair<string, Sampling>>
        {
            new KeyValuePair<string, Sampling>("frequency", Penalised(24, g => g.FrequencyPenalty = 5f)),
            new KeyValuePair<string, Sampling>("presence", Penalised(24, g => g.PresencePenalty = 5f)),
            new KeyValuePair<string, Sampling>("frequency, whole history",
                                               Penalised(24, g => { g.FrequencyPenalty = 5f; g.PenaltyLastN = -1; })),
        };
        foreach (var p in penalised)
        {
            var tokens = SpecRun(true, p.Value).Key;
            Check(Ids(plain) != Ids(tokens), p.Key + " penalty: greedy tokens unchanged " + Ids(tokens));
        }
        // An empty window (PenaltyLastN 0) turns the penalties off.
        var off = Penalised(24, g => { g.FrequencyPenalty = 5f; g.PresencePenalty = 5f; g.PenaltyLastN = 0; });
        Eq(Ids(plain), Ids(SpecRun(true, off).Key), "penalties with PenaltyLastN 0");
    }

    static void PenaltiesBadValues()
    {
        var bad = new[]
        {
            Penalised(4, g => g.PenaltyLastN = -2), Penalised(4, g => g.PresencePenalty = float.NaN),
            Penalised(4, g => g.FrequencyPenalty = float.PositiveInfinity), Penalised(4, g => g.PresencePenalty = 101f),
            Penalised(4, g => g.FrequencyPenalty = -101f),
        };
        using (var s = engine.Session())
        {
            s.AddText(Counting);
            // A stream started by mistake is disposed at once, so that it cannot upset the tests after this one.
            foreach (var b in bad) Throws(EmberException.InvalidArgument, () => s.Generate(b).Dispose());
            var e = Throws(EmberException.InvalidArgument,
                           () => s.Generate(Penalised(4, g => g.PenaltyLastN = -2)).Dispose());
            Check(e.Message.Contains("penalty_last_n"), "message: " + e.Message);
            // Nothing above left the session busy.
            Eq(4, RunGreedy(s, Penalised(4, g => g.PenaltyLastN = -1)).Tokens.Length, "tokens after the errors");
        }
    }

    static void MissingAndCorruptFiles()
    {
        string missing = Path.Combine(Path.GetTempPath(), "ember-no-such-model.gguf");
        var e = Throws(EmberException.NotFound, () => new Model(missing));
        Check(e.Message.Contains("ember-no-such-model.gguf"), "message names the file: " + e.Message);
        Eq("EMBER_ERR_NOT_FOUND", e.StatusName, "status name");
        string corrupt = Path.Combine(Path.GetTempPath(), "ember-corrupt-" + Guid.NewGuid().ToString("N") + ".gguf");
        var head = new byte[100000];
        using (var f = File.OpenRead(ModelPath())) f.Read(head, 0, head.Length);
        File.WriteAllBytes(corrupt, head); // a truncated model
        try
        {
            var c = Throws(EmberException.BadFormat, () => new Model(corrupt));
            Check(c.Message.Contains(Path.GetFileName(corrupt)) && c.Message.Contains("gguf"), "library message: " + c.Message);
        }
        finally { File.Delete(corrupt); }
        Throws(EmberException.InvalidArgument, () => engine.Session(cache: "nope"));
        using (var s = engine.Session())
        {
            s.AddMessage("user", "hi");
            var m = Throws(EmberException.InvalidArgument, () => s.Generate(new Sampling { MaxTokens = 0 }));
            Check(m.Message.Contains("max_tokens"), "message: " + m.Message);
        }
    }

    static void Busy()
    {
        using (var s = engine.Session())
        {
            s.AddMessage("user", Prompt);
            var g = Greedy(50);
            g.IgnoreEos = true;
            using (s.Generate(g)) Throws(EmberException.Busy, () => s.Generate(Greedy(5)));
        }
    }

    static void CloseInAnyOrder()
    {
        string[][] orders = {
            new[] { "model", "engine", "session", "stream" }, new[] { "stream", "session", "engine", "model" },
            new[] { "engine", "model", "stream", "session" }, new[] { "session", "stream", "model", "engine" } };
        foreach (var order in orders)
        {
            var m = new Model(ModelPath());
            var e = new Engine(m, kvMemoryBytes: 16L << 20);
            var s = e.Session();
            s.AddMessage("user", Prompt);
            var st = s.Generate(Greedy(8));
            var objs = new Dictionary<string, IDisposable> { { "model", m }, { "engine", e }, { "session", s }, { "stream", st } };
            foreach (var name in order)
            {
                objs[name].Dispose();
                objs[name].Dispose(); // twice is fine
                if (!st.IsClosed) st.ReadAll();
                if (!s.IsClosed && st.IsClosed) Check(s.Chat("ok", Greedy(2)) != null, "session still works");
            }
        }
    }

    static void ClosedHandlesThrow()
    {
        var m = new Model(ModelPath());
        var e = new Engine(m, kvMemoryBytes: 16L << 20);
        var s = e.Session();
        s.AddMessage("user", Prompt);
        var st = s.Generate(Greedy(4));
        st.Dispose();
        s.Dispose();
        e.Dispose();
        m.Dispose();
        Throws(EmberException.InvalidArgument, () => m.Tokenize("x"));
        Throws(EmberException.InvalidArgument, () => new Engine(m));
        Throws(EmberException.InvalidArgument, () => e.Session());
        Throws(EmberException.InvalidArgument, () => s.AddMessage("user", "x"));
        Throws(EmberException.InvalidArgument, () => st.NextPiece());
        st.Cancel(); // a no-op on a closed stream
    }

    static void DropEverything(bool manual)
    {
        var m = new Model(ModelPath());
        var e = new Engine(m, kvMemoryBytes: 16L << 20, manualStep: manual);
        for (int i = 0; i < 3; i++)
        {
            var s = e.Session();
            s.AddMessage("user", "Write a long poem.");
            var st = s.Generate(new Sampling { MaxTokens = 500, IgnoreEos = true });
            if (!manual && i == 0) st.NextPiece();
        }
    }

    static void DropToGcNeverBlocks()
    {
        foreach (bool manual in new[] { false, true })
        {
            var sw = Stopwatch.StartNew();
            DropEverything(manual);
            GC.Collect();
            GC.WaitForPendingFinalizers(); // the finalizers must not block on the engine
            GC.Collect();
            GC.WaitForPendingFinalizers();
            Check(sw.Elapsed.TotalSeconds < 5.0, "dropping to the GC took " + sw.Elapsed.TotalSeconds + " s");
        }
        using (var s = engine.Session()) Check(s.Chat(Prompt, Greedy(2)) != null, "engine still works");
    }

    static void ManualStepEngine()
    {
        using (var e = new Engine(model, manualStep: true, kvMemoryBytes: 16L << 20))
        using (var s = e.Session())
        {
            s.AddMessage("user", Prompt);
            using (var st = s.Generate(Greedy(8)))
            {
                var sb = new System.Text.StringBuilder();
                for (int i = 0; i < 200 && !st.IsFinished; i++)
                {
                    e.Step(16);
                    try { for (string p; (p = st.NextPiece(0)) != null; ) sb.Append(p); }
                    catch (EmberException x) { Eq(EmberException.Timeout, x.Status, "poll status"); }
                }
                Check(st.IsFinished, "finished");
                Eq(st.Text, sb.ToString(), "pieces");
                Eq(CApiGreedy(8, Prompt), Ids(st.Tokens), "manual greedy vs the C API");
            }
        }
    }

    static void KvTypeQ8_0()
    {
        // A Q8_0 KV cache (half the memory per token, CPU only): a few greedy tokens come out, and
        // its session file (which records the KV type) is refused by the shared f16 engine.
        string dir = Path.Combine(Path.GetTempPath(), "ember-cs-q8-" + Guid.NewGuid().ToString("N"));
        Directory.CreateDirectory(dir);
        try
        {
            string path = Path.Combine(dir, "q8.ember");
            using (var e = new Engine(model, kvMemoryBytes: 16L << 20, kvType: "q8_0"))
            using (var s = e.Session())
            {
                s.AddMessage("user", Prompt);
                var st = RunGreedy(s, Greedy(6));
                Check(st.Tokens.Length > 0, "q8_0 tokens");
                Check(st.Text.Length > 0, "q8_0 text");
                Eq(model.Detokenize(st.Tokens), st.Text, "q8_0 text = its tokens");
                s.Save(path);
            }
            var u = Throws(EmberException.Unsupported, () => engine.LoadSession(path));
            Check(u.Message.Contains("q8_0"), "message: " + u.Message);
        }
        finally { Directory.Delete(dir, true); }
        foreach (var bad in new[] { "q4_0", "F16", "", null })
        {
            var x = Throws(EmberException.InvalidArgument, () => new Engine(model, kvType: bad));
            Check(x.Message.Contains("kv type"), "message: " + x.Message);
        }
    }

    static int Main()
    {
        if (!File.Exists(ModelPath()))
        {
            if (Environment.GetEnvironmentVariable("CI") != null) { Console.WriteLine("FAIL: model missing: " + ModelPath()); return 1; }
            Console.WriteLine("SKIP: model not found at " + ModelPath());
            return 0;
        }
        var tests = new List<KeyValuePair<string, Action>>
        {
            new KeyValuePair<string, Action>("load_and_info", LoadAndInfo),
            new KeyValuePair<string, Action>("tokenize_round_trip", TokenizeRoundTrip),
            new KeyValuePair<string, Action>("greedy_matches_the_c_api", GreedyMatchesTheCApi),
            new KeyValuePair<string, Action>("pieces_concatenate_to_the_reply", PiecesConcatenate),
            new KeyValuePair<string, Action>("stop_strings", StopStrings),
            new KeyValuePair<string, Action>("structured_output", StructuredOutput),
            new KeyValuePair<string, Action>("tool_calling", ToolCalling),
            new KeyValuePair<string, Action>("logprobs_and_logit_bias", LogprobsAndLogitBias),
            new KeyValuePair<string, Action>("embed", Embed),
            new KeyValuePair<string, Action>("lora", LoraAdapters),
            new KeyValuePair<string, Action>("cancel_from_another_thread", CancelFromAnotherThread),
            new KeyValuePair<string, Action>("two_sessions_on_two_threads", TwoSessionsOnTwoThreads),
            new KeyValuePair<string, Action>("save_load_continue_exactly", SaveLoadContinue),
            new KeyValuePair<string, Action>("speculative_greedy_equals_plain", SpeculativeGreedyEqualsPlain),
            new KeyValuePair<string, Action>("speculative_stream_keeps_its_draft_model", SpeculativeStreamKeepsItsDraftModel),
            new KeyValuePair<string, Action>("speculative_bad_parameters", SpeculativeBadParameters),
            new KeyValuePair<string, Action>("sampling_defaults_are_the_librarys", SamplingDefaultsAreTheLibrarys),
            new KeyValuePair<string, Action>("penalties_reach_the_engine", PenaltiesReachTheEngine),
            new KeyValuePair<string, Action>("penalties_bad_values", PenaltiesBadValues),
            new KeyValuePair<string, Action>("missing_and_corrupt_files", MissingAndCorruptFiles),
            new KeyValuePair<string, Action>("busy", Busy),
            new KeyValuePair<string, Action>("close_in_any_order", CloseInAnyOrder),
            new KeyValuePair<string, Action>("closed_handles_throw", ClosedHandlesThrow),
            new KeyValuePair<string, Action>("drop_to_gc_never_blocks", DropToGcNeverBlocks),
            new KeyValuePair<string, Action>("manual_step_engine", ManualStepEngine),
            new KeyValuePair<string, Action>("kv_type_q8_0", KvTypeQ8_0),
        };
        model = new Model(ModelPath());
        engine = new Engine(model, kvMemoryBytes: Kv);
        int failed = 0;
        foreach (var t in tests)
        {
            var sw = Stopwatch.StartNew();
            try
            {
                t.Value();
                Console.WriteLine("PASS {0} ({1:F2} s)", t.Key, sw.Elapsed.TotalSeconds);
            }
            catch (Exception e)
            {
                failed++;
                Console.WriteLine("FAIL {0}: {1}", t.Key, e);
            }
        }
        engine.Dispose();
        model.Dispose();
        Console.WriteLine("{0} passed, {1} failed", tests.Count - failed, failed);
        return failed == 0 ? 0 : 1;
    }
}
