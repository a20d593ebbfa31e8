// Streaming chat with Ember from C#:
//   mcs -r:build/bindings/csharp/Ember.dll Chat.cs && LD_LIBRARY_PATH=build/bindings/csharp mono Chat.exe [MODEL.gguf]
using System;
using Ember;

static class Chat
{
    static void Main(string[] args)
    {
        string path = args.Length > 0 ? args[0]
            : Environment.GetEnvironmentVariable("HOME") + "/.cache/ember/SmolLM2-135M-Instruct.Q4_1.gguf";
        int maxTokens = int.Parse(Environment.GetEnvironmentVariable("EMBER_MAX_TOKENS") ?? "256");
        using (var model = new Model(path))
        using (var engine = new Engine(model))
        using (var session = engine.Session("You are a helpful assistant."))
        {
            Console.Error.WriteLine("ember {0} on {1}; one message per line, Ctrl-D quits", Library.Version, engine.BackendName);
            for (string line; (line = Console.In.ReadLine()) != null; )
            {
                if (line.Trim().Length == 0) continue;
                session.AddMessage("user", line.Trim());
                using (var stream = session.Generate(new Sampling { MaxTokens = maxTokens, Temperature = 0.7f }))
                {
                    foreach (string piece in stream) Console.Write(piece);
                    Console.WriteLine();
                    Console.Error.WriteLine("[{0:F0} tok/s, {1}]", stream.Stats.TokensPerSecond, stream.EndReason);
                }
            }
        }
    }
}
