// Byte-for-byte comparison of ChatTemplate::apply against Python jinja2
// (HF settings). Expected outputs live in tests/golden/chat/*.golden and are
// remade with `python3 tools/chat_golden.py` (see its docstring for the
// format).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/chat/chat_template.h"
#include "core/util/status.h"

namespace {

using ember::ChatMessage;
using ember::ChatTemplate;
using ember::ChatTemplateOptions;

const std::string kDir = std::string(EMBER_TEST_DATA_DIR) + "/chat";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Expectation {
  bool ok = true;
  std::string kind;  // "raise" or "error" when !ok
  std::string text;  // output, or the error message
};

struct Case {
  std::string name;
  bool gen = true;
  std::vector<ChatMessage> messages;
  std::string tools_json;      // tools_case: the `tools` variable (JSON)
  std::string snippet_source;  // subset.golden only
  Expectation expect;
};

struct GoldenFile {
  std::string bos, eos;
  std::vector<ChatMessage> shared_messages;  // subset.golden: the one conversation
  bool shared_gen = true;
  std::vector<Case> cases;
};

class Reader {
 public:
  explicit Reader(std::string data) : d_(std::move(data)) {
    while (pos_ < d_.size() && d_[pos_] == '#') pos_ = d_.find('\n', pos_) + 1;
  }
  bool done() const { return pos_ >= d_.size(); }
  std::vector<std::string> line() {
    size_t e = d_.find('\n', pos_);
    if (e == std::string::npos) throw std::runtime_error("golden: truncated line");
    std::istringstream ss(d_.substr(pos_, e - pos_));
    pos_ = e + 1;
    std::vector<std::string> words;
    for (std::string w; ss >> w;) words.push_back(w);
    return words;
  }
  std::string bytes(size_t n) {
    if (pos_ + n + 1 > d_.size() || d_[pos_ + n] != '\n') throw std::runtime_error("golden: bad blob");
    std::string s = d_.substr(pos_, n);
    pos_ += n + 1;
    return s;
  }
  std::string blob(const std::string& keyword) {
    auto w = line();
    if (w.size() != 2 || w[0] != keyword) throw std::runtime_error("golden: expected " + keyword);
    return bytes(std::stoul(w[1]));
  }
  Expectation expectation() {
    auto w = line();
    Expectation e;
    if (w.size() == 3 && w[0] == "expect" && w[1] == "ok") {
      e.text = bytes(std::stoul(w[2]));
    } else if (w.size() == 4 && w[0] == "expect" && w[1] == "error") {
      e.ok = false;
      e.kind = w[2];
      e.text = bytes(std::stoul(w[3]));
    } else {
      throw std::runtime_error("golden: expected an expectation");
    }
    return e;
  }

 private:
  std::string d_;
  size_t pos_ = 0;
};

GoldenFile load(const std::string& path) {
  Reader r(read_file(path));
  GoldenFile g;
  g.bos = r.blob("bos");
  g.eos = r.blob("eos");
  while (!r.done()) {
    auto w = r.line();
    if (w.size() == 4 && (w[0] == "case" || w[0] == "tools_case")) {
      Case c;
      c.name = w[1] + (w[2] == "1" ? "/gen" : "/nogen");
      c.gen = w[2] == "1";
      if (w[0] == "tools_case") c.tools_json = r.blob("tools");
      size_t n = std::stoul(w[3]);
      for (size_t k = 0; k < n; ++k) {
        ChatMessage m;
        m.role = r.blob("role");
        m.content = r.blob("content");
        c.messages.push_back(std::move(m));
      }
      if (w[1] == "messages" && g.cases.empty() && path.find("subset") != std::string::npos) {
        g.shared_messages = c.messages;  // subset.golden: conversation shared by all snippets
        g.shared_gen = c.gen;
        continue;
      }
      c.expect = r.expectation();
      g.cases.push_back(std::move(c));
    } else if (w.size() == 2 && w[0] == "snippet") {
      Case c;
      c.name = w[1];
      c.messages = g.shared_messages;
      c.gen = g.shared_gen;
      c.snippet_source = r.blob("template");
      c.expect = r.expectation();
      g.cases.push_back(std::move(c));
    } else {
      throw std::runtime_error("golden: unexpected record in " + path);
    }
  }
  return g;
}

// Runs one case; returns an empty string on success, else a description.
std::string run_case(const ChatTemplate* parsed, const std::string& source, const Case& c, const GoldenFile& g) {
  ChatTemplateOptions opt;
  opt.add_generation_prompt = c.gen;
  opt.bos_token = g.bos;
  opt.eos_token = g.eos;
  opt.tools_json = c.tools_json;
  try {
    ChatTemplate t = parsed ? *parsed : ChatTemplate::parse(source);
    std::string out = t.apply(c.messages, opt);
    if (!c.expect.ok) return "expected an error (" + c.expect.text + ") but rendered: " + out;
    if (out != c.expect.text) return "output differs\n--- expected ---\n" + c.expect.text + "\n--- got ---\n" + out;
    return {};
  } catch (const ember::Error& e) {
    if (c.expect.ok) return std::string("unexpected error: ") + e.what();
    if (c.expect.kind == "raise") {
      if (e.code() != ember::StatusCode::kInvalidArgument)
        return std::string("raise_exception gave wrong code: ") + e.what();
      if (e.message() != c.expect.text) return "raise_exception message differs: got '" + e.message() + "'";
    }
    return {};
  }
}

void check_template_golden(const std::string& name) {
  std::string source = read_file(kDir + "/" + name + ".jinja");
  GoldenFile g = load(kDir + "/" + name + ".golden");
  ASSERT_GT(g.cases.size(), 10u);
  ChatTemplate parsed = ChatTemplate::parse(source);
  int failures = 0;
  for (const auto& c : g.cases) {
    std::string err = run_case(&parsed, source, c, g);
    if (!err.empty()) {
      ++failures;
      ADD_FAILURE() << name << " case " << c.name << ": " << err;
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(ChatGolden, SmolLM2) { check_template_golden("smollm2"); }
TEST(ChatGolden, Llama3) { check_template_golden("llama3"); }
TEST(ChatGolden, Llama3_1) { check_template_golden("llama3_1"); }
TEST(ChatGolden, Gemma2) { check_template_golden("gemma2"); }
TEST(ChatGolden, Gemma3) { check_template_golden("gemma3"); }
TEST(ChatGolden, Qwen2_5) { check_template_golden("qwen2_5"); }
TEST(ChatGolden, DeepSeekR1) { check_template_golden("deepseek_r1"); }

TEST(ChatGolden, EveryTemplateHasAGoldenFile) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kDir)) {
    if (entry.path().extension() != ".jinja") continue;
    ++n;
    std::string stem = entry.path().stem().string();
    EXPECT_TRUE(std::filesystem::exists(kDir + "/" + stem + ".golden")) << stem;
  }
  EXPECT_GE(n, 7);
}

TEST(ChatGolden, JinjaSubsetSnippets) {
  GoldenFile g = load(kDir + "/subset.golden");
  ASSERT_GT(g.cases.size(), 50u);
  int failures = 0;
  for (const auto& c : g.cases) {
    std::string err = run_case(nullptr, c.snippet_source, c, g);
    if (!err.empty()) {
      ++failures;
      ADD_FAILURE() << "snippet " << c.name << " [" << c.snippet_source << "]: " << err;
    }
  }
  EXPECT_EQ(failures, 0);
}

}  // namespace
