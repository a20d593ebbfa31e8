// Gemma 3 (general.architecture = "gemma3"): embeddings scaled by
// sqrt(n_embd), GeGLU, per-head RMS norm of Q and K,
// norms after attention and after the FFN, NEOX RoPE, queries scaled before
// attention, and interleaved local (sliding-window, own RoPE base) and global
// layers. Facts as llama.cpp reads them (src/models/gemma3.cpp): five local
// layers then one global, local base 10000 unless the file says otherwise.
#include <cmath>
#include <string>

#include "core/gguf/gguf.h"
#include "core/model/arch/decoder.h"
#include "core/model/arch/registry.h"
#include "core/util/status.h"

namespace ember {

namespace {

class Gemma3Forward final : public Decoder {
 public:
  Gemma3Forward(std::shared_ptr<const Model> model, Backend& backend, int32_t block_size)
      : Decoder(std::move(model), backend, block_size) {
    const ModelConfig& c = config();
    embd_scale_ = std::sqrt(static_cast<float>(c.n_embd));
    // gemma_pytorch's query_pre_attn_scalar: n_embd / n_heads for the 27B
    // model (62 layers), head_dim for the others.
    // (The whole model's heads and layers: this may be one tensor-parallel
    // rank's share of the heads, or one pipeline stage's layers.)
    const int32_t model_layers = shard().pp > 1 ? shard().model_layers : c.n_layers;
    query_scale_ = model_layers == 62 ? 1.0f / std::sqrt(static_cast<float>(c.n_embd / (c.n_heads * shard().tp)))
                                      : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  }

 private:
  void layers(Pass& p, int32_t n_layers) override {
    const ModelConfig& c = config();
    if (shard().first_stage()) scale_x(p, embd_scale_);  // the embeddings, before the first layer
    // The queries are scaled before attention (as llama.cpp's graph does),
    // and the softmax takes them as they are.
    p.ap.scale = 1.0f;
    for (int32_t il = 0; il < n_layers; ++il) {
      const LayerWeights& w = layer(il);
      const bool swa = c.layer_is_swa(il);
      norm(p, *w.attn_norm, x(), h());
      qkv(p, w);
      qk_norm(p, w);
      rope(p, c.layer_rope_base(il), swa ? 1.0f : c.rope_freq_scale);
      scale_q(p, query_scale_);
      attention(p, il, w, swa ? c.sliding_window : 0);
      norm(p, *w.post_attn_norm, h(), h());
      residual(p);
      norm(p, *w.ffn_norm, x(), h());
      glu_ffn(p, w, /*gelu=*/true);
      norm(p, *w.post_ffn_norm, h(), h());
      residual(p);
    }
  }

  float embd_scale_ = 0.0f, query_scale_ = 0.0f;
};

void load_hparams(const gguf::GgufFile& f, const std::string& a, ModelConfig& c) {
  c.rope_style = RopeStyle::kNeox;
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

void load_layer(const TensorGetter& get, const ModelConfig& c, const std::string& p, LayerWeightDescs& l) {
  load_llama_layer(get, c, p, l);
  l.q_norm = get(p + "attn_q_norm.weight", c.head_dim, 1, true);
  l.k_norm = get(p + "attn_k_norm.weight", c.head_dim, 1, true);
  l.post_attn_norm = get(p + "post_attention_norm.weight", c.n_embd, 1, true);
  l.post_ffn_norm = get(p + "post_ffw_norm.weight", c.n_embd, 1, true);
}

// Google's template for Gemma 3 instruction-tuned models (the 270M file has
// no tokenizer.chat_template; llama.cpp falls back to the same format).
const char* const kChatTemplate = R"({{ bos_token }}
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

}  // namespace

EMBER_ARCHITECTURE(gemma3, {"gemma3", load_hparams, load_layer, make_decoder<Gemma3Forward>, kChatTemplate})

}  // namespace ember
