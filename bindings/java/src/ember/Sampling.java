package ember;

import ember.lowlevel.eb_sampling;
import ember.lowlevel.emberc;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Sampling, stopping and speculative decoding for {@link Session#generate}; defaults are the
 * library's.
 */
public final class Sampling {
  private final eb_sampling defaults = new eb_sampling();
  int maxTokens = defaults.getMax_tokens();
  float temperature = defaults.getTemperature();
  int topK = defaults.getTop_k();
  float topP = defaults.getTop_p();
  float minP = defaults.getMin_p();
  float repeatPenalty = defaults.getRepeat_penalty();
  float presencePenalty = defaults.getPresence_penalty();
  float frequencyPenalty = defaults.getFrequency_penalty();
  int penaltyLastN = defaults.getPenalty_last_n();
  Long seed;
  boolean ignoreEos;
  final List<String> stop = new ArrayList<>();
  String specDrafter;
  int specSelfLayers = defaults.getSpec_self_layers();
  Model specDraftModel;
  float specThreshold = defaults.getSpec_threshold();
  int specMaxNodes = defaults.getSpec_max_nodes();
  int specMaxDepth = defaults.getSpec_max_depth();
  float specAlpha = defaults.getSpec_alpha();
  boolean specLookup = defaults.getSpec_lookup() != 0;

  public Sampling() {
    defaults.delete();
  }

  public Sampling maxTokens(int n) { maxTokens = n; return this; }
  /** 0 = greedy. */
  public Sampling temperature(float t) { temperature = t; return this; }
  public Sampling topK(int k) { topK = k; return this; }
  public Sampling topP(float p) { topP = p; return this; }
  public Sampling minP(float p) { minP = p; return this; }
  public Sampling repeatPenalty(float p) { repeatPenalty = p; return this; }
  /** Subtracted once from each token in the penalty window, -100..100 (default 0 = off). */
  public Sampling presencePenalty(float p) { presencePenalty = p; return this; }
  /** Subtracted per occurrence of a token in the penalty window, -100..100 (default 0 = off). */
  public Sampling frequencyPenalty(float p) { frequencyPenalty = p; return this; }
  /** Penalty window: the last tokens, prompt included; -1 = all, 0 = off (default 64). */
  public Sampling penaltyLastN(int n) { penaltyLastN = n; return this; }
  public Sampling seed(long s) { seed = s; return this; }
  public Sampling ignoreEos(boolean b) { ignoreEos = b; return this; }
  /** Stop strings: generation ends before the first match (not emitted). */
  public Sampling stop(String... strings) { stop.addAll(Arrays.asList(strings)); return this; }

  /**
   * Speculative decoding (same output, greedy or sampled; see docs/API.md): "none" (default),
   * "ngram" (prompt lookup), "self" (the model's first {@link #specSelfLayers} layers) or "draft"
   * ({@link #specDraftModel}).
   */
  public Sampling specDrafter(String drafter) { specDrafter = drafter; return this; }
  /** "self": the layers that draft; 0 = 7/8 of the model's. */
  public Sampling specSelfLayers(int n) { specSelfLayers = n; return this; }
  /**
   * "draft": a model with the same vocabulary (selects "draft" when no drafter is set). The stream
   * holds it (and keeps it loaded) until it ends.
   */
  public Sampling specDraftModel(Model m) { specDraftModel = m; return this; }
  /** A draft candidate this likely opens a branch (default 0.3; above 1: chains). */
  public Sampling specThreshold(float t) { specThreshold = t; return this; }
  /** Drafted tokens per tree, 1..64 (default 12). */
  public Sampling specMaxNodes(int n) { specMaxNodes = n; return this; }
  /** Drafted tokens per branch, 1..64 (default 8). */
  public Sampling specMaxDepth(int n) { specMaxDepth = n; return this; }
  /** Verify when the best branch's confidence falls below this, 0..1 (default 0.25; then adapts). */
  public Sampling specAlpha(float a) { specAlpha = a; return this; }
  /** self and draft: prompt lookup beside the model (default true); false: the model alone. */
  public Sampling specLookup(boolean on) { specLookup = on; return this; }

  // Structured output (at most one; see docs/API.md).
  String jsonSchema, grammar, regex;
  final List<String> choices = new ArrayList<>();
  boolean jsonObject;
  /** The reply is compact JSON that validates against this JSON Schema (JSON text). */
  public Sampling jsonSchema(String schema) { jsonSchema = schema; return this; }
  /** The reply is a sentence of this GBNF grammar (llama.cpp's notation, rule "root"). */
  public Sampling grammar(String g) { grammar = g; return this; }
  /** The whole reply matches this regular expression. */
  public Sampling regex(String re) { regex = re; return this; }
  /** The reply is exactly one of these. */
  public Sampling choices(String... options) { choices.addAll(Arrays.asList(options)); return this; }
  /** The reply is a JSON object (OpenAI's json_object). */
  public Sampling jsonObject(boolean on) { jsonObject = on; return this; }

  // Tool calling, for a session with tools (Session.setTools; see docs/API.md).
  String toolChoice;
  boolean parallelToolCalls = defaults.getParallel_tool_calls() != 0;
  /**
   * "auto" (default: free text, tool calls or both), "none" (no calls), "required" (at least one
   * call) or a tool's name (exactly one call, of that tool). Calls come out in {@link
   * Stream#toolCalls}, not in the text.
   */
  public Sampling toolChoice(String choice) { toolChoice = choice; return this; }
  /** Several calls per reply (default true); false: at most one. */
  public Sampling parallelToolCalls(boolean on) { parallelToolCalls = on; return this; }

  // Logits (see docs/API.md).
  final Map<Integer, Float> logitBias = new LinkedHashMap<>();
  boolean logprobs = defaults.getLogprobs() != 0;
  int topLogprobs = defaults.getTop_logprobs();
  /**
   * Adds {@code bias} to the token's logit before a token is chosen; {@link Float#NEGATIVE_INFINITY}
   * bans it. Repeatable, one entry per token (a second call for a token replaces its bias).
   */
  public Sampling logitBias(int token, float bias) { logitBias.put(token, bias); return this; }
  /** Records each generated token's log-probability ({@link Stream#logprobs}); default false. */
  public Sampling logprobs(boolean on) { logprobs = on; return this; }
  /** With {@link #logprobs}: the most likely tokens of each row, 0..20 (default 0). */
  public Sampling topLogprobs(int n) { topLogprobs = n; return this; }

  int drafter() {
    String d = specDrafter != null ? specDrafter : specDraftModel != null ? "draft" : "none";
    int kind;
    switch (d) {
      case "none": kind = emberc.SPEC_NONE; break;
      case "ngram": kind = emberc.SPEC_NGRAM; break;
      case "self": kind = emberc.SPEC_SELF; break;
      case "draft": kind = emberc.SPEC_DRAFT; break;
      default:
        throw new EmberException(EmberException.INVALID_ARGUMENT, "unknown spec drafter '" + d + "' (none, ngram, self or draft)");
    }
    if (specDraftModel != null && kind != emberc.SPEC_DRAFT) {
      throw new EmberException(EmberException.INVALID_ARGUMENT, "a spec draft model needs the drafter 'draft', not '" + d + "'");
    }
    return kind;
  }

  /** The native struct, without the draft model (Session.generate sets it while the model is held). */
  eb_sampling toNative() {
    int drafter = drafter();
    eb_sampling s = new eb_sampling();
    s.setMax_tokens(maxTokens);
    s.setTemperature(temperature);
    s.setTop_k(topK);
    s.setTop_p(topP);
    s.setMin_p(minP);
    s.setRepeat_penalty(repeatPenalty);
    s.setPresence_penalty(presencePenalty);
    s.setFrequency_penalty(frequencyPenalty);
    s.setPenalty_last_n(penaltyLastN);
    if (seed != null) s.setSeed(seed);
    s.setIgnore_eos(ignoreEos ? 1 : 0);
    for (String x : stop) s.add_stop(x);
    s.setSpec_drafter(drafter);
    s.setSpec_self_layers(specSelfLayers);
    s.setSpec_threshold(specThreshold);
    s.setSpec_max_nodes(specMaxNodes);
    s.setSpec_max_depth(specMaxDepth);
    s.setSpec_alpha(specAlpha);
    s.setSpec_lookup(specLookup ? 1 : 0);
    if (jsonSchema != null) s.set_json_schema(jsonSchema);
    if (grammar != null) s.set_grammar(grammar);
    if (regex != null) s.set_regex(regex);
    for (String c : choices) s.add_choice(c);
    s.setJson_object(jsonObject ? 1 : 0);
    if (toolChoice != null) {
      switch (toolChoice) {
        case "auto": s.setTool_choice(emberc.TOOL_CHOICE_AUTO); break;
        case "none": s.setTool_choice(emberc.TOOL_CHOICE_NONE); break;
        case "required": s.setTool_choice(emberc.TOOL_CHOICE_REQUIRED); break;
        default:
          s.setTool_choice(emberc.TOOL_CHOICE_FUNCTION);
          s.set_tool_name(toolChoice);
      }
    }
    s.setParallel_tool_calls(parallelToolCalls ? 1 : 0);
    for (Map.Entry<Integer, Float> b : logitBias.entrySet()) s.add_logit_bias(b.getKey(), b.getValue());
    s.setLogprobs(logprobs ? 1 : 0);
    s.setTop_logprobs(topLogprobs);
    return s;
  }
}
