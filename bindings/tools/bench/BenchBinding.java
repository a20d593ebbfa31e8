// The Java binding's side of bindings/tools/bench_bindings.py (a benchmark, not a test).
//   java -Dember.library.path=libember_java.so -cp ember.jar:ember-bench.jar BenchBinding \
//       MODEL N PROMPT decode|drain [REPS]
// Each repetition: a fresh session on one engine (KV pool 64 MiB, as greedy_ref), one user
// message, a greedy reply of exactly N tokens (ignore_eos), read through the binding's Stream.
//   decode: times from the first piece to the end as the consumer sees it ("decode_s T tokens N").
//   drain:  waits for the stream to end, then times reading its queued events: the binding's own
//           cost with the engine out of the way ("drain_s T tokens N").
// The last repetition's token ids go to stdout (the driver checks them against the C API's).
import ember.Engine;
import ember.Model;
import ember.Sampling;
import ember.Session;
import ember.Stream;
import java.util.Arrays;
import java.util.Locale;
import java.util.stream.Collectors;

public final class BenchBinding {
  public static void main(String[] args) throws InterruptedException {
    if (args.length < 4) {
      System.err.println("usage: BenchBinding MODEL N PROMPT decode|drain [REPS]");
      System.exit(2);
    }
    final int n = Integer.parseInt(args[1]);
    final boolean drain = args[3].equals("drain");
    final int reps = args.length > 4 ? Integer.parseInt(args[4]) : 1;
    int[] tokens = new int[0];
    try (Model model = new Model(args[0]);
        Engine engine = new Engine(model, new Engine.Options().kvMemoryBytes(64L << 20))) {
      for (int r = 0; r < reps; r++) {
        try (Session session = engine.session()) {
          session.addMessage("user", args[2]);
          try (Stream stream = session.generate(new Sampling().maxTokens(n).temperature(0f).ignoreEos(true))) {
            double seconds;
            if (drain) {
              while (!stream.stats().finished) Thread.sleep(1);
              final long t0 = System.nanoTime();
              for (String piece : stream) {
              }
              seconds = (System.nanoTime() - t0) * 1e-9;
            } else {
              long first = -1;
              for (String piece : stream) {
                if (first < 0) first = System.nanoTime();
              }
              seconds = (System.nanoTime() - first) * 1e-9;
            }
            tokens = stream.tokens();
            System.err.printf(Locale.ROOT, "%s %.9f tokens %d%n", drain ? "drain_s" : "decode_s", seconds, tokens.length);
          }
        }
      }
    }
    System.out.println(Arrays.stream(tokens).mapToObj(Integer::toString).collect(Collectors.joining(" ")));
  }
}
