// An NPC that acts through tools, from C#:
//   mcs -r:build/bindings/csharp/Ember.dll NpcTools.cs && LD_LIBRARY_PATH=build/bindings/csharp mono NpcTools.exe [MODEL.gguf]
// The player's lines come on stdin. For each, the NPC must call one of its
// tools (ToolChoice = "required"; the arguments are held to the tool's JSON
// schema), the game runs it and answers, and the NPC then speaks under a
// JSON schema ({"mood": ..., "say": ...}).
using System;
using Ember;

static class NpcTools
{
    const string Tools = @"[
      {""type"": ""function"", ""function"": {""name"": ""move_to"", ""description"": ""Walk to a place in the village"",
        ""parameters"": {""type"": ""object"", ""properties"": {""place"": {""enum"": [""well"", ""forge"", ""inn"", ""gate""]},
          ""run"": {""type"": ""boolean""}}, ""required"": [""place"", ""run""]}}},
      {""type"": ""function"", ""function"": {""name"": ""give_item"", ""description"": ""Give the player an item"",
        ""parameters"": {""type"": ""object"", ""properties"": {""item"": {""enum"": [""sword"", ""bread"", ""map"", ""coin""]},
          ""count"": {""type"": ""integer"", ""minimum"": 1, ""maximum"": 5}}, ""required"": [""item"", ""count""]}}},
      {""type"": ""function"", ""function"": {""name"": ""emote"", ""description"": ""Show a feeling with a gesture"",
        ""parameters"": {""type"": ""object"", ""properties"": {""gesture"": {""enum"": [""wave"", ""nod"", ""shrug"", ""laugh""]}},
          ""required"": [""gesture""]}}}]";
    const string Speech = @"{""type"": ""object"", ""properties"": {""mood"": {""enum"": [""happy"", ""neutral"", ""annoyed"", ""scared""]},
      ""say"": {""type"": ""string"", ""maxLength"": 60}}, ""required"": [""mood"", ""say""]}";

    static void Main(string[] args)
    {
        string path = args.Length > 0 ? args[0]
            : Environment.GetEnvironmentVariable("HOME") + "/.cache/ember/SmolLM2-135M-Instruct.Q4_1.gguf";
        int maxTokens = Math.Max(int.Parse(Environment.GetEnvironmentVariable("EMBER_MAX_TOKENS") ?? "128"), 96);
        using (var model = new Model(path))
        using (var engine = new Engine(model))
        using (var npc = engine.Session("You are Bram, the village blacksmith."))
        {
            npc.SetTools(Tools);
            for (string line; (line = Console.In.ReadLine()) != null; )
            {
                if (line.Trim().Length == 0) continue;
                npc.AddMessage("user", line.Trim());
                ToolCall[] calls;
                using (var stream = npc.Generate(new Sampling { MaxTokens = maxTokens, Temperature = 0.7f,
                                                                ToolChoice = "required", ParallelToolCalls = false }))
                {
                    stream.ReadAll();
                    calls = stream.ToolCalls;
                }
                foreach (var call in calls)
                {
                    // The game world would act here; the NPC is told it worked.
                    string result = "{\"ok\": true, \"tool\": \"" + call.Name + "\"}";
                    Console.WriteLine("[Bram calls {0}({1}) -> {2}]", call.Name, call.Arguments, result);
                    npc.AddMessage("tool", result);
                }
                using (var stream = npc.Generate(new Sampling { MaxTokens = maxTokens, Temperature = 0.7f,
                                                                ToolChoice = "none", JsonSchema = Speech }))
                {
                    Console.WriteLine("Bram: {0}", stream.ReadAll());
                }
            }
        }
    }
}
