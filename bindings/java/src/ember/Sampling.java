package ember;

import ember.lowlevel.eb_sampling;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/** Sampling and stopping for {@link Session#generate}; defaults are the library's. */
public final class Sampling {
  private final eb_sampling defaults = new eb_sampling();
  int maxTokens = defaults.getMax_tokens();
  float temperature = defaults.getTemperature();
  int topK = defaults.getTop_k();
  float topP = defaults.getTop_p();
  float minP = defaults.getMin_p();
  float repeatPenalty = defaults.getRepeat_penalty();
  Long seed;
  boolean ignoreEos;
  final List<String> stop = new ArrayList<>();

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
  public Sampling seed(long s) { seed = s; return this; }
  public Sampling ignoreEos(boolean b) { ignoreEos = b; return this; }
  /** Stop strings: generation ends before the first match (not emitted). */
  public Sampling stop(String... strings) { stop.addAll(Arrays.asList(strings)); return this; }

  eb_sampling toNative() {
    eb_sampling s = new eb_sampling();
    s.setMax_tokens(maxTokens);
    s.setTemperature(temperature);
    s.setTop_k(topK);
    s.setTop_p(topP);
    s.setMin_p(minP);
    s.setRepeat_penalty(repeatPenalty);
    if (seed != null) s.setSeed(seed);
    s.setIgnore_eos(ignoreEos ? 1 : 0);
    for (String x : stop) s.add_stop(x);
    return s;
  }
}
