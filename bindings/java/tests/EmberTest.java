package ember.tests;

import ember.Ember;
import ember.EmberException;
import ember.EndReason;
import ember.Engine;
import ember.Lora;
import ember.LoraInfo;
import ember.Model;
import ember.Pooling;
import ember.Sampling;
import ember.Session;
import ember.Stream;
import ember.StreamStats;
import ember.TokenLogprob;
import ember.ToolCall;
import ember.lowlevel.eb_sampling;
import java.io.File;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CyclicBarrier;

/** The binding scenarios of issue 11 (section 4), in Java, with a tiny assert runner (no JUnit). */
public final class EmberTest {
  static final String PROMPT = "Name three colors.";
  // Every drafter drafts on it (tests/capi/speculative_test.cpp).
  static final String COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,";
  static final long KV = 64L << 20; // as bindings/tools/greedy_ref.c

  static Model model;
  static Engine engine;

  // ---------------------------------------------------------------- runner
  static final class Failure extends RuntimeException {
    private static final long serialVersionUID = 1L;
    Failure(String m) { super(m); }
  }

  static void check(boolean ok, String what) {
    if (!ok) throw new Failure(what);
  }

  static void eq(Object expected, Object actual, String what) {
    if (expected == null ? actual != null : !expected.equals(actual)) {
      throw new Failure(what + ": expected <" + expected + "> got <" + actual + ">");
    }
  }

  interface Body { void run() throws Exception; }

  static EmberException expectThrows(int status, Body body) throws Exception {
    try {
      body.run();
    } catch (EmberException e) {
      eq(status, e.status(), "status of '" + e.getMessage() + "'");
      check(!e.getMessage().isEmpty(), "the exception carries a message");
      return e;
    }
    throw new Failure("expected EmberException with status " + status);
  }

  static String modelPath() {
    String m = System.getenv("EMBER_MODEL");
    if (m != null && !m.isEmpty()) return m;
    String home = System.getenv("EMBER_HOME");
    if (home == null || home.isEmpty()) home = System.getProperty("user.home") + "/.cache/ember";
    return home + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  }

  static int[] cApiGreedy(int maxTokens, String message) throws Exception {
    String ref = System.getenv("EMBER_GREEDY_REF");
    check(ref != null, "EMBER_GREEDY_REF is set (run through CTest)");
    Process p = new ProcessBuilder(ref, modelPath(), Integer.toString(maxTokens), message).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).trim();
    String err = new String(p.getErrorStream().readAllBytes(), StandardCharsets.UTF_8);
    eq(0, p.waitFor(), "greedy_ref exit status (" + err + ")");
    return Arrays.stream(out.split("\\s+")).mapToInt(Integer::parseInt).toArray();
  }

  static Sampling greedy(int n) { return new Sampling().maxTokens(n).temperature(0); }

  static Stream runGreedy(Session s, Sampling sampling) {
    try (Stream st = s.generate(sampling)) {
      st.readAll();
      return st;
    }
  }

  // ---------------------------------------------------------------- tests
  static void loadAndInfo() {
    eq("llama", model.info().architecture, "architecture");
    eq(30, model.info().nLayers, "layers");
    eq(49152, model.info().vocabSize, "vocab");
    check(model.info().nParams > 100_000_000L, "n_params");
    eq("cpu", engine.device(), "device");
    eq(-1, engine.gpuIndex(), "gpu index");
    check(engine.backendName().startsWith("cpu/"), "backend name");
    String v = Ember.version();
    String[] p = v.split("\\.");
    eq(Integer.parseInt(p[0]) * 10000 + Integer.parseInt(p[1]) * 100 + Integer.parseInt(p[2]), Ember.versionNumber(), "version number");
    check(Arrays.asList("scalar", "avx2", "avx512_vnni").contains(Ember.cpuIsa()), "cpu isa");
    check(Arrays.asList("absent", "loadable", "broken").contains(Ember.cudaPlugin()), "cuda plugin");
  }

  static void tokenizeRoundTrip() throws Exception {
    String text = "Hello, world! Ünïcödé 🙂 and <|im_start|> text.";
    int[] ids = model.tokenize(text);
    check(ids.length > 0, "tokens");
    eq(text, model.detokenize(ids), "round trip");
    eq(1, model.tokenize("<|im_start|>", false, true).length, "special token");
    eq("", model.detokenize(new int[0]), "empty");
    expectThrows(EmberException.INVALID_ARGUMENT, () -> model.detokenize(new int[] {1_000_000_000}));
  }

  static void greedyMatchesTheCApi() throws Exception {
    int[] expected = cApiGreedy(24, PROMPT);
    check(expected.length > 0, "reference tokens");
    try (Session s = engine.session()) {
      s.addMessage("user", PROMPT);
      Stream st = runGreedy(s, greedy(24));
      eq(Arrays.toString(expected), Arrays.toString(st.tokens()), "greedy tokens vs the C API");
      eq(model.detokenize(expected), st.text(), "greedy text");
    }
  }

  static void piecesConcatenate() {
    try (Session s = engine.session("You are brief.")) {
      s.addMessage("user", PROMPT);
      try (Stream st = s.generate(new Sampling().maxTokens(20).temperature(0.8f).seed(42))) {
        StringBuilder sb = new StringBuilder();
        int n = 0;
        for (String piece : st) {
          check(!piece.isEmpty(), "non-empty piece");
          sb.append(piece);
          n++;
        }
        check(n > 1, "several pieces");
        eq(st.text(), sb.toString(), "pieces concatenate to the text");
        eq(model.detokenize(st.tokens()), st.text(), "text = detokenized tokens");
        check(st.endReason() == EndReason.MAX_TOKENS || st.endReason() == EndReason.EOS, "end reason " + st.endReason());
        StreamStats stats = st.stats();
        check(stats.finished, "finished");
        // (An end-of-generation token counts as generated; it is not sent.)
        long eos = st.endReason() == EndReason.EOS ? 1 : 0;
        eq((long) st.tokens().length + eos, stats.generatedTokens, "generated tokens");
        check(stats.promptTokens > 0, "prompt tokens");
      }
      String reply = s.chat("And three animals?", greedy(12));
      check(!reply.isEmpty(), "chat reply");
    }
  }

  static void stopStrings() {
    String full;
    try (Session s = engine.session()) {
      s.addMessage("user", PROMPT);
      full = runGreedy(s, greedy(24)).text();
    }
    String[] words = full.trim().split("\\s+");
    check(words.length >= 3, "enough words in '" + full + "'");
    String stop = words[2];
    String expected = full.substring(0, full.indexOf(stop));
    try (Session s = engine.session()) {
      s.addMessage("user", PROMPT);
      Stream st = runGreedy(s, greedy(24).stop(stop, "\u2603never"));
      eq(EndReason.STOP_STRING, st.endReason(), "end reason");
      eq(expected, st.text(), "text before the stop string");
    }
  }

  static void structuredOutput() {
    try (Session s = engine.session()) {
      s.addMessage("user", "Where does the sun rise?");
      Stream st = runGreedy(s, greedy(8).choices("east", "west"));
      check(st.text().equals("east") || st.text().equals("west"), "a choice: '" + st.text() + "'");
    }
    try (Session s = engine.session()) {
      s.addMessage("user", "Which city is the capital of France? Answer in JSON.");
      String schema = "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 20}}, \"required\": [\"city\"]}";
      Stream st = runGreedy(s, greedy(48).jsonSchema(schema));
      check(st.text().matches("\\{\"city\": \"[^\"]*\"\\}"), "JSON of the schema: '" + st.text() + "'");
      try {
        s.generate(greedy(4).regex("(")).close();
        check(false, "a bad regex is refused");
      } catch (EmberException e) {
        eq(EmberException.INVALID_ARGUMENT, e.status(), "status of a bad regex");
      }
    }
  }

  static void toolCalling() throws Exception {
    String tools = "[{\"type\": \"function\", \"function\": {\"name\": \"move_to\", \"description\": \"Walk to a point\", "
        + "\"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}, \"y\": {\"type\": \"integer\"}}, "
        + "\"required\": [\"x\", \"y\"]}}}]";
    try (Session s = engine.session()) {
      s.setTools(tools);
      s.addMessage("user", "Walk to x 3, y 4.");
      Stream st = runGreedy(s, greedy(64).toolChoice("move_to"));
      eq("", st.text(), "text beside a forced call");
      check(st.tokens().length > 0, "the call's tokens are in tokens()");
      List<ToolCall> calls = st.toolCalls();
      eq(1, calls.size(), "calls " + calls);
      eq("move_to", calls.get(0).name, "name");
      check(calls.get(0).id.startsWith("call_"), "id: " + calls.get(0).id);
      check(calls.get(0).arguments.matches("\\{\"x\": *-?[0-9]+, *\"y\": *-?[0-9]+\\}"), "arguments: " + calls.get(0).arguments);
      s.addMessage("tool", "arrived");
      st = runGreedy(s, greedy(8).toolChoice("none"));
      eq(0, st.toolCalls().size(), "calls with toolChoice none");
      expectThrows(EmberException.INVALID_ARGUMENT, () -> s.generate(greedy(4).toolChoice("fly_to")).close());
      expectThrows(EmberException.INVALID_ARGUMENT, () -> s.setTools("not json"));
      s.setTools(null);
      // No tools left to require.
      expectThrows(EmberException.INVALID_ARGUMENT, () -> s.generate(greedy(4).toolChoice("required")).close());
    }
  }

  static float[][] normsOf(float[][] vs) {
    float[][] out = new float[vs.length][1];
    for (int i = 0; i < vs.length; i++) {
      double n = 0;
      for (float x : vs[i]) n += (double) x * x;
      out[i][0] = (float) Math.sqrt(n);
    }
    return out;
  }

  // Embeddings (C ABI 1.5).
  static void embed() throws Exception {
    String[] texts = {"The quick brown fox jumps over the lazy dog.", "Dragons hate rain.", "Paris is in France."};
    int d = model.info().nEmbd;
    float[][] vectors = engine.embed(texts);
    eq(texts.length, vectors.length, "one vector per text");
    for (float[] v : vectors) {
      eq(d, v.length, "vector length = n_embd");
      for (float x : v) check(Float.isFinite(x), "finite values");
    }
    check(!Arrays.equals(vectors[0], vectors[1]), "two texts, two vectors");
    check(Arrays.deepEquals(vectors, engine.embed(texts)), "the same texts again: the same vectors");
    check(Arrays.deepEquals(vectors, engine.embed(Arrays.asList(texts))), "a List");
    for (int i = 0; i < texts.length; i++) {
      check(Arrays.equals(vectors[i], engine.embed(texts[i])[0]), "one at a time = together (" + i + ")");
    }
    for (float[] n : normsOf(engine.embed(texts, new Engine.EmbedOptions().normalize(true)))) {
      check(Math.abs(n[0] - 1.0) < 1e-4, "normalised: length " + n[0]);
    }
    float[][] last = engine.embed(texts, new Engine.EmbedOptions().pooling(Pooling.LAST));
    eq(d, last[0].length, "last: n_embd");
    check(!Arrays.equals(last[0], vectors[0]), "last pooling differs from mean");
    float[][] cls = engine.embed(texts, new Engine.EmbedOptions().pooling(Pooling.CLS));
    check(!Arrays.equals(cls[0], vectors[0]), "cls pooling differs from mean");
    int[][] ids = new int[texts.length][];
    for (int i = 0; i < texts.length; i++) ids[i] = model.tokenize(texts[i], true, false);
    check(Arrays.deepEquals(vectors, engine.embedTokens(ids)), "tokens of the texts = the texts");
    check(Arrays.deepEquals(last, engine.embedTokens(ids, new Engine.EmbedOptions().pooling(Pooling.LAST))), "tokens, last");
    // Bad input throws; the engine goes on.
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.embed(""));
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.embed("a", ""));
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.embed());
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.embed(new ArrayList<String>()));
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.embed("a", null));
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.embed((List<String>) null));
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.embed("a\0b"));
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.embed(texts, new Engine.EmbedOptions().pooling(null)));
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.embed(texts, null));
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.embed(new String[Engine.MAX_EMBED_INPUTS + 1]));
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.embedTokens(new int[0]));
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.embedTokens());
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.embedTokens(new int[] {-1}));
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.embedTokens(new int[] {model.info().vocabSize}));
    expectThrows(EmberException.CONTEXT_FULL, () -> engine.embedTokens(new int[model.info().contextLength + 1]));
    check(Arrays.equals(vectors[2], engine.embed(texts[2])[0]), "the engine goes on");
    Engine closed = new Engine(model, new Engine.Options().kvMemoryBytes(KV));
    closed.close();
    expectThrows(EmberException.INVALID_ARGUMENT, () -> closed.embed(texts));
  }

  static void logprobsAndLogitBias() throws Exception {
    String text = "The capital of France is Paris. The capital of Italy is";
    int[] tokens;
    List<TokenLogprob> lps;
    try (Session s = engine.session()) {
      s.addText(text);
      Stream st = runGreedy(s, greedy(6).ignoreEos(true).logprobs(true).topLogprobs(3));
      tokens = st.tokens();
      lps = st.logprobs();
    }
    eq(6, tokens.length, "tokens");
    eq(tokens.length, lps.size(), "one entry per token: " + lps);
    for (int i = 0; i < tokens.length; i++) {
      TokenLogprob e = lps.get(i);
      eq(tokens[i], e.token, "entry " + i + " token");
      check(e.logprob <= 0f, "entry " + i + " logprob " + e.logprob);
      eq(3, e.topTokens().length, "entry " + i + " alternatives");
      eq(3, e.topLogprobs().length, "entry " + i + " alternatives' logprobs");
      eq(tokens[i], e.topTokens()[0], "entry " + i + ": greedy picks the most likely");
    }
    try (Session s = engine.session()) {
      s.addText(text);
      Stream st = runGreedy(s, greedy(6).ignoreEos(true).logitBias(tokens[0], Float.NEGATIVE_INFINITY));
      for (int t : st.tokens()) check(t != tokens[0], "banned token " + tokens[0] + " in " + Arrays.toString(st.tokens()));
      eq(0, st.logprobs().size(), "logprobs without logprobs(true)");
      expectThrows(EmberException.INVALID_ARGUMENT, () -> s.generate(greedy(2).topLogprobs(3)).close());
      expectThrows(EmberException.INVALID_ARGUMENT, () -> s.generate(greedy(2).logitBias(-5, 1f)).close());
    }
  }

  static void cancelFromAnotherThread() throws Exception {
    try (Session s = engine.session()) {
      s.addMessage("user", "Write a very long story about the sea.");
      try (Stream st = s.generate(greedy(400).ignoreEos(true))) {
        check(st.hasNext(), "a first piece");
        String first = st.next();
        Thread t = new Thread(st::cancel);
        t.start();
        t.join();
        StringBuilder rest = new StringBuilder();
        for (String p : st) rest.append(p);
        eq(EndReason.CANCELLED, st.endReason(), "end reason");
        check(st.tokens().length < 400, "stopped early");
        eq(st.text(), first + rest, "pieces");
      }
      check(s.chat("Thanks.", greedy(4)) != null, "session usable after cancel");
    }
  }

  static void twoSessionsOnTwoThreads() throws Exception {
    String[] prompts = {"Name three colors.", "Count from one to five."};
    List<String> alone = new ArrayList<>();
    for (String p : prompts) {
      try (Session s = engine.session()) {
        s.addMessage("user", p);
        alone.add(Arrays.toString(runGreedy(s, greedy(20)).tokens()));
      }
    }
    String[] results = new String[2];
    Throwable[] errors = new Throwable[2];
    CyclicBarrier barrier = new CyclicBarrier(2);
    Thread[] threads = new Thread[2];
    for (int i = 0; i < 2; i++) {
      final int k = i;
      threads[i] = new Thread(() -> {
        try (Session s = engine.session()) {
          s.addMessage("user", prompts[k]);
          barrier.await();
          results[k] = Arrays.toString(runGreedy(s, greedy(20)).tokens());
        } catch (Throwable e) {
          errors[k] = e;
        }
      });
      threads[i].start();
    }
    for (Thread t : threads) t.join();
    eq(null, errors[0], "thread 0");
    eq(null, errors[1], "thread 1");
    eq(alone, Arrays.asList(results), "concurrent = alone");
  }

  static void saveLoadContinue() throws Exception {
    Path dir = Files.createTempDirectory("ember-java");
    String path = dir.resolve("chat.ember").toString();
    String contA;
    long n;
    try (Session a = engine.session("You are brief.")) {
      a.addMessage("user", PROMPT);
      runGreedy(a, greedy(12));
      a.save(path);
      n = a.tokenCount();
      a.addMessage("user", "Now three fruits.");
      contA = Arrays.toString(runGreedy(a, greedy(16)).tokens());
    }
    try (Session b = engine.loadSession(path)) {
      eq(n, b.tokenCount(), "token count after load");
      b.addMessage("user", "Now three fruits.");
      eq(contA, Arrays.toString(runGreedy(b, greedy(16)).tokens()), "continuation after load");
    }
    expectThrows(EmberException.NOT_FOUND, () -> engine.loadSession(dir.resolve("missing.ember").toString()));
    new File(path).delete();
    dir.toFile().delete();
  }

  // ---------------------------------------------------------------- speculative decoding
  /** The tokens and stats of one stream on a fresh session (counting text, or a chat message). */
  static final class Run {
    int[] tokens;
    StreamStats stats;
  }

  static Run specRun(boolean counting, Sampling sampling) {
    try (Session s = engine.session()) {
      if (counting) s.addText(COUNTING);
      else s.addMessage("user", PROMPT);
      try (Stream st = s.generate(sampling)) {
        st.readAll();
        Run r = new Run();
        r.tokens = st.tokens();
        r.stats = st.stats();
        return r;
      }
    }
  }

  static void speculativeGreedyEqualsPlain() throws Exception {
    try (Model draft = new Model(modelPath())) { // the same file loaded twice: exactness, not speed
      Map<String, Sampling> drafters = new LinkedHashMap<>();
      drafters.put("ngram", greedy(24).specDrafter("ngram"));
      drafters.put("self", greedy(24).specDrafter("self").specSelfLayers(20));
      drafters.put("draft", greedy(24).specDrafter("draft").specDraftModel(draft));
      drafters.put("draft (implied), chains", greedy(24).specDraftModel(draft).specThreshold(2f).specMaxNodes(6)
          .specMaxDepth(6).specAlpha(0.5f));
      for (boolean counting : new boolean[] {true, false}) {
        Run plain = specRun(counting, greedy(24));
        StreamStats ps = plain.stats;
        check(plain.tokens.length > 0, "plain tokens");
        eq(0L, ps.draftedTokens, "drafted without speculation");
        eq(0L, ps.verifyPasses, "verify passes without speculation");
        for (Map.Entry<String, Sampling> d : drafters.entrySet()) {
          String what = d.getKey() + (counting ? " on counting" : " on chat");
          Run r = specRun(counting, d.getValue());
          StreamStats st = r.stats;
          eq(Arrays.toString(plain.tokens), Arrays.toString(r.tokens), what);
          eq(ps.generatedTokens, st.generatedTokens, "generated " + what);
          check(st.acceptedTokens <= st.draftedTokens, "accepted <= drafted " + what);
          if (counting) {
            check(st.draftedTokens > 0, "drafted " + what);
            check(st.verifyPasses > 0, "verify passes " + what);
            check(Math.abs(st.meanAcceptedLength - (double) st.acceptedTokens / st.verifyPasses) < 1e-9, "mean " + what);
          }
        }
      }
      // specLookup(false): the draft alone; one as costly as the model itself is never run.
      Run plain = specRun(true, greedy(24));
      Run alone = specRun(true, greedy(24).specDraftModel(draft).specLookup(false));
      eq(Arrays.toString(plain.tokens), Arrays.toString(alone.tokens), "draft alone");
      eq(0L, alone.stats.draftedTokens, "drafted by the draft alone");
    }
  }

  /** A rank-8 adapter for the test model (make_synthetic_model --lora-for); null when the tool is unknown. */
  static String makeAdapter(Path dir) throws Exception {
    String tool = System.getenv("EMBER_MAKE_SYNTHETIC_MODEL");
    if (tool == null || tool.isEmpty()) return null;
    String out = dir.resolve("lora.gguf").toString();
    Process p = new ProcessBuilder(tool, "--lora-for", modelPath(), "--rank", "8", "--seed", "3", "--out", out)
        .redirectErrorStream(true).start();
    String log = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    eq(0, p.waitFor(), "make_synthetic_model exit status (" + log + ")");
    return out;
  }

  static int[] loraGreedy(Lora[] loras, float[] scales) {
    try (Session s = engine.session()) {
      if (loras != null) s.setLoras(Arrays.asList(loras), scales);
      s.addMessage("user", PROMPT);
      return runGreedy(s, greedy(16)).tokens();
    }
  }

  static void lora() throws Exception {
    Path dir = Files.createTempDirectory("ember-lora");
    try {
      String path = makeAdapter(dir);
      if (path == null) {
        System.out.println("SKIP lora: EMBER_MAKE_SYNTHETIC_MODEL not set (run through CTest)");
        return;
      }
      int[] base = loraGreedy(null, null);
      int[] adapted;
      try (Lora lora = new Lora(model, path)) {
        LoraInfo info = lora.info();
        eq(8, info.maxRank, "max rank");
        check(info.nMatrices > 0, "matrices adapted: " + info);
        check(info.bytes > 0, "bytes: " + info);
        check(Float.isFinite(info.alpha), "alpha: " + info);
        check(lora.model() == model, "model");
        adapted = loraGreedy(new Lora[] {lora}, new float[] {1.0f});
        check(base.length > 0 && adapted.length > 0, "tokens");
        check(!Arrays.equals(base, adapted), "the adapter changes the greedy reply");
        eq(Arrays.toString(adapted), Arrays.toString(loraGreedy(new Lora[] {lora}, null)), "null scales: 1.0");
        eq(Arrays.toString(base), Arrays.toString(loraGreedy(new Lora[] {lora}, new float[] {0.0f})), "scale 0");
        eq(Arrays.toString(base), Arrays.toString(loraGreedy(new Lora[0], null)), "no adapters");
        // Changed on one session: none restores the base model's output.
        try (Session s = engine.session()) {
          s.setLoras(lora);
          s.addMessage("user", PROMPT);
          eq(Arrays.toString(adapted), Arrays.toString(runGreedy(s, greedy(16)).tokens()), "with the adapter");
          s.reset();
          s.setLoras();
          s.addMessage("user", PROMPT);
          eq(Arrays.toString(base), Arrays.toString(runGreedy(s, greedy(16)).tokens()), "set to none");
          s.setLoras(lora);
          s.setLoras(null, null);
          s.reset();
          s.addMessage("user", PROMPT);
          eq(Arrays.toString(base), Arrays.toString(runGreedy(s, greedy(16)).tokens()), "set to null");
        }
        // Refused sets throw with the library's message; the session goes on.
        try (Session s = engine.session()) {
          for (float bad : new float[] {Float.NaN, Float.POSITIVE_INFINITY, -2000f}) {
            EmberException e = expectThrows(EmberException.INVALID_ARGUMENT,
                () -> s.setLoras(List.of(lora), new float[] {bad}));
            check(e.getMessage().contains("scale"), "message names the scale: " + e.getMessage());
          }
          Lora[] many = new Lora[17];
          Arrays.fill(many, lora);
          EmberException e = expectThrows(EmberException.INVALID_ARGUMENT, () -> s.setLoras(many));
          check(e.getMessage().contains("16"), "message names the limit: " + e.getMessage());
          expectThrows(EmberException.INVALID_ARGUMENT, () -> s.setLoras(List.of(lora), new float[] {1f, 1f}));
          expectThrows(EmberException.INVALID_ARGUMENT, () -> s.setLoras(lora, null));
          s.addMessage("user", PROMPT);
          eq(Arrays.toString(base), Arrays.toString(runGreedy(s, greedy(16)).tokens()), "after refused sets");
          try (Stream st = s.generate(greedy(50).ignoreEos(true))) {
            expectThrows(EmberException.BUSY, () -> s.setLoras(lora));
          }
        }
      }
      // Closing the adapter while a session uses it: the session keeps it alive.
      try (Session s = engine.session()) {
        Lora dropped = new Lora(model, path);
        s.setLoras(dropped);
        dropped.close();
        check(dropped.isClosed(), "closed");
        s.addMessage("user", PROMPT);
        eq(Arrays.toString(adapted), Arrays.toString(runGreedy(s, greedy(16)).tokens()), "after close");
        expectThrows(EmberException.INVALID_ARGUMENT, () -> s.setLoras(dropped));
        expectThrows(EmberException.INVALID_ARGUMENT, dropped::info);
        s.reset();
        s.addMessage("user", PROMPT);
        eq(Arrays.toString(adapted), Arrays.toString(runGreedy(s, greedy(16)).tokens()), "the set it had");
      }
      // ... and in the middle of a stream.
      try (Session s = engine.session(); Lora mid = new Lora(model, path)) {
        s.setLoras(mid);
        s.addMessage("user", PROMPT);
        try (Stream st = s.generate(greedy(16))) {
          st.next();
          mid.close();
          st.readAll();
          eq(Arrays.toString(adapted), Arrays.toString(st.tokens()), "closed mid-stream");
        }
      }
      // Not an adapter.
      EmberException e = expectThrows(EmberException.BAD_FORMAT, () -> new Lora(model, modelPath()));
      check(e.getMessage().contains("not an adapter"), "message: " + e.getMessage());
      expectThrows(EmberException.NOT_FOUND, () -> new Lora(model, dir.resolve("missing.gguf").toString()));
    } finally {
      try (java.util.stream.Stream<Path> files = Files.list(dir)) {
        for (Path f : (Iterable<Path>) files::iterator) Files.deleteIfExists(f);
      }
      Files.deleteIfExists(dir);
    }
  }

  static void speculativeStreamKeepsItsDraftModel() throws Exception {
    int[] plain = specRun(true, greedy(16)).tokens;
    Model draft = new Model(modelPath());
    try (Session s = engine.session()) {
      s.addText(COUNTING);
      try (Stream st = s.generate(greedy(16).specDraftModel(draft))) {
        check(st.draftModel() == draft, "the stream holds its draft model");
        draft.close(); // the stream keeps it loaded until it ends
        st.readAll();
        eq(Arrays.toString(plain), Arrays.toString(st.tokens()), "tokens with the draft model closed");
        check(st.stats().verifyPasses > 0, "verify passes");
      }
    }
    expectThrows(EmberException.INVALID_ARGUMENT, () -> specRun(true, greedy(4).specDraftModel(draft)));
  }

  static void speculativeBadParameters() throws Exception {
    List<Sampling> bad = Arrays.asList(
        greedy(4).specDrafter("ngram").specMaxNodes(0), greedy(4).specDrafter("ngram").specMaxNodes(1000),
        greedy(4).specDrafter("ngram").specMaxDepth(0), greedy(4).specDrafter("ngram").specThreshold(Float.NaN),
        greedy(4).specDrafter("ngram").specAlpha(2f), greedy(4).specDrafter("self").specSelfLayers(1000),
        greedy(4).specDrafter("self").specSelfLayers(-1), greedy(4).specDrafter("draft"), // no draft model
        greedy(4).specDrafter("eagle"), greedy(4).specDrafter("ngram").specDraftModel(model));
    try (Session s = engine.session()) {
      s.addText(COUNTING);
      for (Sampling b : bad) expectThrows(EmberException.INVALID_ARGUMENT, () -> s.generate(b));
      EmberException e = expectThrows(EmberException.INVALID_ARGUMENT, () -> s.generate(greedy(4).specDrafter("ngram").specMaxNodes(1000)));
      check(e.getMessage().contains("max_nodes"), "message: " + e.getMessage());
      // A draft model with another vocabulary is refused by the engine.
      File other = new File(new File(modelPath()).getParentFile(), "gemma-3-270m-q4_k_m.gguf");
      if (other.exists()) {
        try (Model gemma = new Model(other.getPath())) {
          EmberException v = expectThrows(EmberException.INVALID_ARGUMENT, () -> s.generate(greedy(4).specDraftModel(gemma)));
          check(v.getMessage().contains("vocabulary"), "message: " + v.getMessage());
        }
      } else {
        check(System.getenv("CI") == null, "model missing: " + other);
      }
      // Nothing above left the session busy.
      eq(4, runGreedy(s, greedy(4).specDrafter("ngram")).tokens().length, "tokens after the errors");
    }
  }

  // ---------------------------------------------------------------- penalties
  /** A package-private field of a Sampling (the builder has no getters). */
  static Object field(Sampling s, String name) throws Exception {
    Field f = Sampling.class.getDeclaredField(name);
    f.setAccessible(true);
    return f.get(s);
  }

  static void samplingDefaultsAreTheLibrarys() throws Exception {
    Sampling g = new Sampling();
    eb_sampling d = new eb_sampling();
    try {
      eq(d.getMax_tokens(), field(g, "maxTokens"), "maxTokens");
      eq(d.getTemperature(), field(g, "temperature"), "temperature");
      eq(d.getTop_k(), field(g, "topK"), "topK");
      eq(d.getTop_p(), field(g, "topP"), "topP");
      eq(d.getMin_p(), field(g, "minP"), "minP");
      eq(d.getRepeat_penalty(), field(g, "repeatPenalty"), "repeatPenalty");
      eq(d.getPresence_penalty(), field(g, "presencePenalty"), "presencePenalty");
      eq(d.getFrequency_penalty(), field(g, "frequencyPenalty"), "frequencyPenalty");
      eq(d.getPenalty_last_n(), field(g, "penaltyLastN"), "penaltyLastN");
      eq(d.getParallel_tool_calls() != 0, field(g, "parallelToolCalls"), "parallelToolCalls");
      eq(d.getLogprobs() != 0, field(g, "logprobs"), "logprobs");
      eq(d.getTop_logprobs(), field(g, "topLogprobs"), "topLogprobs");
    } finally {
      d.delete();
    }
  }

  static void penaltiesReachTheEngine() {
    int[] plain = specRun(true, greedy(24)).tokens; // greedy repeats ", " and digits
    Map<String, Sampling> penalised = new LinkedHashMap<>();
    penalised.put("frequency", greedy(24).frequencyPenalty(5f));
    penalised.put("presence", greedy(24).presencePenalty(5f));
    penalised.put("frequency, whole history", greedy(24).frequencyPenalty(5f).penaltyLastN(-1));
    for (Map.Entry<String, Sampling> p : penalised.entrySet()) {
      int[] tokens = specRun(true, p.getValue()).tokens;
      check(!Arrays.equals(plain, tokens), p.getKey() + " penalty: greedy tokens unchanged " + Arrays.toString(tokens));
    }
    // An empty window (penaltyLastN 0) turns the penalties off.
    int[] off = specRun(true, greedy(24).frequencyPenalty(5f).presencePenalty(5f).penaltyLastN(0)).tokens;
    eq(Arrays.toString(plain), Arrays.toString(off), "penalties with penaltyLastN 0");
  }

  static void penaltiesBadValues() throws Exception {
    List<Sampling> bad = Arrays.asList(greedy(4).penaltyLastN(-2), greedy(4).presencePenalty(Float.NaN),
        greedy(4).frequencyPenalty(Float.POSITIVE_INFINITY), greedy(4).presencePenalty(101f),
        greedy(4).frequencyPenalty(-101f));
    try (Session s = engine.session()) {
      s.addText(COUNTING);
      // A stream started by mistake is closed at once, so that it cannot upset the tests after this one.
      for (Sampling b : bad) expectThrows(EmberException.INVALID_ARGUMENT, () -> s.generate(b).close());
      EmberException e =
          expectThrows(EmberException.INVALID_ARGUMENT, () -> s.generate(greedy(4).penaltyLastN(-2)).close());
      check(e.getMessage().contains("penalty_last_n"), "message: " + e.getMessage());
      // Nothing above left the session busy.
      eq(4, runGreedy(s, greedy(4).penaltyLastN(-1)).tokens().length, "tokens after the errors");
    }
  }

  static void missingAndCorruptFiles() throws Exception {
    String missing = System.getProperty("java.io.tmpdir") + "/ember-no-such-model.gguf";
    EmberException e = expectThrows(EmberException.NOT_FOUND, () -> new Model(missing));
    check(e.getMessage().contains("ember-no-such-model.gguf"), "message names the file: " + e.getMessage());
    eq("EMBER_ERR_NOT_FOUND", e.statusName(), "status name");
    File corrupt = File.createTempFile("ember-corrupt", ".gguf");
    try (FileInputStream in = new FileInputStream(modelPath()); FileOutputStream out = new FileOutputStream(corrupt)) {
      out.write(in.readNBytes(100_000)); // a truncated model
    }
    try {
      EmberException c = expectThrows(EmberException.BAD_FORMAT, () -> new Model(corrupt.getPath()));
      check(c.getMessage().contains(corrupt.getName()) && c.getMessage().contains("gguf"), "library message: " + c.getMessage());
    } finally {
      corrupt.delete();
    }
    expectThrows(EmberException.INVALID_ARGUMENT, () -> engine.session(new Session.Options().cache("nope")));
    try (Session s = engine.session()) {
      s.addMessage("user", "hi");
      EmberException m = expectThrows(EmberException.INVALID_ARGUMENT, () -> s.generate(new Sampling().maxTokens(0)));
      check(m.getMessage().contains("max_tokens"), "message: " + m.getMessage());
    }
  }

  static void busy() throws Exception {
    try (Session s = engine.session()) {
      s.addMessage("user", PROMPT);
      try (Stream st = s.generate(greedy(50).ignoreEos(true))) {
        expectThrows(EmberException.BUSY, () -> s.generate(greedy(5)));
      }
    }
  }

  static void closeInAnyOrder() {
    String[][] orders = {{"model", "engine", "session", "stream"}, {"stream", "session", "engine", "model"},
                         {"engine", "model", "stream", "session"}, {"session", "stream", "model", "engine"}};
    for (String[] order : orders) {
      Model m = new Model(modelPath());
      Engine e = new Engine(m, new Engine.Options().kvMemoryBytes(16L << 20));
      Session s = e.session();
      s.addMessage("user", PROMPT);
      Stream st = s.generate(greedy(8));
      Map<String, AutoCloseable> objs = new LinkedHashMap<>();
      objs.put("model", m);
      objs.put("engine", e);
      objs.put("session", s);
      objs.put("stream", st);
      for (String name : order) {
        try {
          objs.get(name).close();
          objs.get(name).close(); // twice is fine
        } catch (Exception x) {
          throw new Failure("close " + name + ": " + x);
        }
        if (!st.isClosed()) st.readAll();
        if (!s.isClosed() && st.isClosed()) check(s.chat("ok", greedy(2)) != null, "session still works");
      }
    }
  }

  static void closedHandlesThrow() throws Exception {
    Model m = new Model(modelPath());
    Engine e = new Engine(m, new Engine.Options().kvMemoryBytes(16L << 20));
    Session s = e.session();
    s.addMessage("user", PROMPT);
    Stream st = s.generate(greedy(4));
    st.close();
    s.close();
    e.close();
    m.close();
    expectThrows(EmberException.INVALID_ARGUMENT, () -> m.tokenize("x"));
    expectThrows(EmberException.INVALID_ARGUMENT, () -> new Engine(m));
    expectThrows(EmberException.INVALID_ARGUMENT, () -> e.session());
    expectThrows(EmberException.INVALID_ARGUMENT, () -> s.addMessage("user", "x"));
    expectThrows(EmberException.INVALID_ARGUMENT, () -> st.hasNext());
    st.cancel(); // a no-op on a closed stream
  }

  static void dropToGcNeverBlocks() throws Exception {
    for (boolean manual : new boolean[] {false, true}) {
      long t0 = System.nanoTime();
      long before = Ember.gcReleasedHandles();
      dropEverything(manual);
      // 3 streams + 3 sessions + engine + model, all released on the Cleaner's thread; a release
      // that waited for the engine (a manual one nobody steps: for ever) would stall the count.
      while (Ember.gcReleasedHandles() - before < 8 && System.nanoTime() - t0 < 5_000_000_000L) {
        System.gc();
        Thread.sleep(20);
      }
      double s = (System.nanoTime() - t0) / 1e9;
      eq(8L, Ember.gcReleasedHandles() - before, "handles released by the GC within " + s + " s");
    }
    try (Session s = engine.session()) {
      check(s.chat(PROMPT, greedy(2)) != null, "engine still works");
    }
  }

  static void dropEverything(boolean manual) {
    Model m = new Model(modelPath());
    Engine e = new Engine(m, new Engine.Options().kvMemoryBytes(16L << 20).manualStep(manual));
    for (int i = 0; i < 3; i++) {
      Session s = e.session();
      s.addMessage("user", "Write a long poem.");
      Stream st = s.generate(new Sampling().maxTokens(500).ignoreEos(true));
      if (!manual && i == 0) st.next();
    }
  }

  static void manualStepEngine() throws Exception {
    try (Engine e = new Engine(model, new Engine.Options().manualStep(true).kvMemoryBytes(16L << 20));
         Session s = e.session()) {
      s.addMessage("user", PROMPT);
      try (Stream st = s.generate(greedy(8))) {
        StringBuilder sb = new StringBuilder();
        for (int i = 0; i < 200 && !st.isFinished(); i++) {
          e.step(16, 0);
          try {
            for (String p; (p = st.nextPiece(0)) != null; ) sb.append(p);
          } catch (EmberException x) {
            eq(EmberException.TIMEOUT, x.status(), "poll status");
          }
        }
        check(st.isFinished(), "finished");
        eq(st.text(), sb.toString(), "pieces");
        eq(Arrays.toString(cApiGreedy(8, PROMPT)), Arrays.toString(st.tokens()), "manual greedy vs the C API");
      }
    }
  }

  static void kvTypeQ8_0() throws Exception {
    // A Q8_0 KV cache (half the memory per token, CPU only): a few greedy tokens come out, and
    // its session file (which records the KV type) is refused by the shared f16 engine.
    Path dir = Files.createTempDirectory("ember-java-q8");
    String path = dir.resolve("q8.ember").toString();
    try {
      try (Engine e = new Engine(model, new Engine.Options().kvMemoryBytes(16L << 20).kvType("q8_0"));
           Session s = e.session()) {
        s.addMessage("user", PROMPT);
        Stream st = runGreedy(s, greedy(6));
        check(st.tokens().length > 0, "q8_0 tokens");
        check(!st.text().isEmpty(), "q8_0 text");
        eq(model.detokenize(st.tokens()), st.text(), "q8_0 text = its tokens");
        s.save(path);
      }
      EmberException u = expectThrows(EmberException.UNSUPPORTED, () -> engine.loadSession(path));
      check(u.getMessage().contains("q8_0"), "message: " + u.getMessage());
    } finally {
      new File(path).delete();
      dir.toFile().delete();
    }
    for (String bad : new String[] {"q4_0", "F16", "", null}) {
      EmberException x = expectThrows(EmberException.INVALID_ARGUMENT,
          () -> new Engine(model, new Engine.Options().kvType(bad)));
      check(x.getMessage().contains("kv type"), "message: " + x.getMessage());
    }
  }

  public static void main(String[] args) throws Exception {
    if (!new File(modelPath()).exists()) {
      if (System.getenv("CI") != null) {
        System.err.println("FAIL: model missing: " + modelPath());
        System.exit(1);
      }
      System.out.println("SKIP: model not found at " + modelPath());
      return;
    }
    Map<String, Body> tests = new LinkedHashMap<>();
    tests.put("load_and_info", EmberTest::loadAndInfo);
    tests.put("tokenize_round_trip", EmberTest::tokenizeRoundTrip);
    tests.put("greedy_matches_the_c_api", EmberTest::greedyMatchesTheCApi);
    tests.put("pieces_concatenate_to_the_reply", EmberTest::piecesConcatenate);
    tests.put("stop_strings", EmberTest::stopStrings);
    tests.put("structured_output", EmberTest::structuredOutput);
    tests.put("tool_calling", EmberTest::toolCalling);
    tests.put("logprobs_and_logit_bias", EmberTest::logprobsAndLogitBias);
    tests.put("embed", EmberTest::embed);
    tests.put("lora", EmberTest::lora);
    tests.put("cancel_from_another_thread", EmberTest::cancelFromAnotherThread);
    tests.put("two_sessions_on_two_threads", EmberTest::twoSessionsOnTwoThreads);
    tests.put("save_load_continue_exactly", EmberTest::saveLoadContinue);
    tests.put("speculative_greedy_equals_plain", EmberTest::speculativeGreedyEqualsPlain);
    tests.put("speculative_stream_keeps_its_draft_model", EmberTest::speculativeStreamKeepsItsDraftModel);
    tests.put("speculative_bad_parameters", EmberTest::speculativeBadParameters);
    tests.put("sampling_defaults_are_the_librarys", EmberTest::samplingDefaultsAreTheLibrarys);
    tests.put("penalties_reach_the_engine", EmberTest::penaltiesReachTheEngine);
    tests.put("penalties_bad_values", EmberTest::penaltiesBadValues);
    tests.put("missing_and_corrupt_files", EmberTest::missingAndCorruptFiles);
    tests.put("busy", EmberTest::busy);
    tests.put("close_in_any_order", EmberTest::closeInAnyOrder);
    tests.put("closed_handles_throw", EmberTest::closedHandlesThrow);
    tests.put("drop_to_gc_never_blocks", EmberTest::dropToGcNeverBlocks);
    tests.put("manual_step_engine", EmberTest::manualStepEngine);
    tests.put("kv_type_q8_0", EmberTest::kvTypeQ8_0);
    model = new Model(modelPath());
    engine = new Engine(model, new Engine.Options().kvMemoryBytes(KV));
    int failed = 0;
    for (Map.Entry<String, Body> t : tests.entrySet()) {
      long t0 = System.nanoTime();
      try {
        t.getValue().run();
        System.out.printf("PASS %s (%.2f s)%n", t.getKey(), (System.nanoTime() - t0) / 1e9);
      } catch (Throwable e) {
        failed++;
        System.out.printf("FAIL %s: %s%n", t.getKey(), e);
        e.printStackTrace(System.out);
      }
    }
    engine.close();
    model.close();
    System.out.printf("%d passed, %d failed%n", tests.size() - failed, failed);
    System.exit(failed == 0 ? 0 : 1);
  }
}
