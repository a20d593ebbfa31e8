// Streaming chat with Ember from Java:
//   java -Dember.library.path=build/bindings/java/libember_java.so -cp build/bindings/java/ember.jar:. Chat [MODEL.gguf]
import ember.Ember;
import ember.Engine;
import ember.Model;
import ember.Sampling;
import ember.Session;
import ember.Stream;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

public final class Chat {
  public static void main(String[] args) throws Exception {
    String path = args.length > 0 ? args[0] : System.getProperty("user.home") + "/.cache/ember/SmolLM2-135M-Instruct.Q4_1.gguf";
    int maxTokens = Integer.parseInt(System.getenv().getOrDefault("EMBER_MAX_TOKENS", "256"));
    try (Model model = new Model(path);
         Engine engine = new Engine(model);
         Session session = engine.session("You are a helpful assistant.")) {
      System.err.println("ember " + Ember.version() + " on " + engine.backendName() + "; one message per line, Ctrl-D quits");
      BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
      for (String line; (line = in.readLine()) != null; ) {
        if (line.isBlank()) continue;
        session.addMessage("user", line.strip());
        try (Stream stream = session.generate(new Sampling().maxTokens(maxTokens).temperature(0.7f))) {
          for (String piece : stream) {
            System.out.print(piece);
            System.out.flush();
          }
          System.out.println();
          System.err.printf("[%.0f tok/s, %s]%n", stream.stats().tokensPerSecond, stream.endReason());
        }
      }
    }
  }
}
