#!/usr/bin/env python3
"""An NPC that acts through tools, from Python: python3 npc_tools.py [MODEL.gguf]

The player's lines come on stdin, one per line. For each, the NPC (a chat
session with three tools) must call one of them (tool_choice="required"):
its arguments are held to the tool's JSON schema, so the game can run them
without checking. The game answers with the tool's result, and the NPC then
says one line in words, under a JSON schema giving its mood and the line.
"""
import json
import os
import sys

import ember

TOOLS = [
    {"type": "function", "function": {
        "name": "move_to", "description": "Walk to a place in the village",
        "parameters": {"type": "object", "properties": {
            "place": {"enum": ["well", "forge", "inn", "gate"]}, "run": {"type": "boolean"}},
            "required": ["place", "run"]}}},
    {"type": "function", "function": {
        "name": "give_item", "description": "Give the player an item from the inventory",
        "parameters": {"type": "object", "properties": {
            "item": {"enum": ["sword", "bread", "map", "coin"]}, "count": {"type": "integer", "minimum": 1, "maximum": 5}},
            "required": ["item", "count"]}}},
    {"type": "function", "function": {
        "name": "emote", "description": "Show a feeling with a gesture",
        "parameters": {"type": "object", "properties": {"gesture": {"enum": ["wave", "nod", "shrug", "laugh"]}},
                       "required": ["gesture"]}}},
]
SPEECH = {"type": "object", "properties": {
    "mood": {"enum": ["happy", "neutral", "annoyed", "scared"]}, "say": {"type": "string", "maxLength": 60}},
    "required": ["mood", "say"]}


def run_tool(name, args):
    """The game world: what each tool does, as the result the NPC is told."""
    if name == "move_to":
        return {"arrived": args["place"], "ran": args["run"]}
    if name == "give_item":
        return {"given": args["item"], "count": args["count"], "player_thanks": True}
    return {"gesture_seen": args["gesture"]}


path = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/ember/SmolLM2-135M-Instruct.Q4_1.gguf")
max_tokens = max(int(os.environ.get("EMBER_MAX_TOKENS", "128")), 96)  # room for a call's JSON

with ember.Model(path) as model, ember.Engine(model) as engine:
    with engine.session(system_prompt="You are Bram, the village blacksmith.") as npc:
        npc.set_tools(TOOLS)
        for line in sys.stdin:
            if not line.strip():
                continue
            npc.add_message("user", line.strip())
            with npc.generate(max_tokens=max_tokens, temperature=0.7, tool_choice="required",
                              parallel_tool_calls=False) as stream:
                stream.read()
                calls = stream.tool_calls
            for call in calls:
                result = run_tool(call.name, call.args)
                print(f"[Bram calls {call.name}({call.arguments}) -> {json.dumps(result)}]")
                npc.add_message("tool", json.dumps(result))
            with npc.generate(max_tokens=max_tokens, temperature=0.7, tool_choice="none",
                              json_schema=SPEECH) as stream:
                speech = json.loads(stream.read())
            print(f"Bram ({speech['mood']}): {speech['say']}")
