// Gemma 3 (general.architecture = "gemma3"): the shared decoder with
// embeddings scaled by sqrt(n_embd), GeGLU, per-head RMS norm of Q and K,
// norms after attention and after the FFN, NEOX RoPE, queries scaled before
// attention, and interleaved local (sliding-window, own RoPE base) and global
// layers. Facts as llama.cpp reads them (src/models/gemma3.cpp): five local
// layers then one global, local base 10000 unless the file says otherwise.
#include <cmath>
#include <string>

#include "core/gguf/gguf.h"
#include "core/model/arch/registry.h"
#include "core/model/model.h"
#include "core/util/status.h"

namespace ember {

void load_gemma3_hparams(const gguf::GgufFile& f, const std::string& a, ModelConfig& c) {
  c.rope_style = RopeStyle::kNeox;
  c.ffn_act = FfnActivation::kGelu;
  c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
  c.qk_norm = true;
  c.post_norms = true;
  // gemma_pytorch's query_pre_attn_scalar: n_embd / n_heads for the 27B
  // model (62 layers), head_dim for the others.
  c.attention_scale = c.n_layers == 62 ? 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_heads))
                                       : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (f.get_float(a + "final_logit_softcapping").value_or(0.0) != 0.0) {
    fail(StatusCode::kUnsupported, "model: gemma3 with final_logit_softcapping is not supported");
  }
  const int64_t window = f.get_int(a + "attention.sliding_window").value_or(0);
  if (window < 0 || window > (1 << 24)) fail(StatusCode::kBadFormat, "model: attention.sliding_window out of range");
  if (window > 0) {
    c.sliding_window = static_cast<int32_t>(window);
    const int64_t pattern = f.get_int(a + "attention.sliding_window_pattern").value_or(6);
    if (pattern < 0 || pattern > 1024) {
      fail(StatusCode::kBadFormat, "model: attention.sliding_window_pattern out of range");
    }
    c.is_swa.assign(c.n_layers, 0);
    for (int32_t il = 0; il < c.n_layers; ++il) c.is_swa[il] = pattern == 0 || il % pattern < pattern - 1;
    c.rope_freq_base_swa = static_cast<float>(f.get_float(a + "rope.freq_base_swa").value_or(10000.0));
    if (!(c.rope_freq_base_swa > 0.0f)) fail(StatusCode::kBadFormat, "model: rope.freq_base_swa out of range");
  }
}

// Google's template for Gemma 3 instruction-tuned models (the 270M file has
// no tokenizer.chat_template; llama.cpp falls back to the same format).
const char* const kGemmaChatTemplate = R"({{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
)";

}  // namespace ember
