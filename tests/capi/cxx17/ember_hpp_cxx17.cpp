// Compiled with -std=c++17 -Wall -Wextra -Werror -pedantic -Wconversion
// -Wshadow (tests/CMakeLists.txt): ember.hpp must stay C++17 and warning-free.
// Instantiates every member so that templates and inline bodies are checked.
#include "ember/ember.hpp"

#include <iostream>

namespace {

[[maybe_unused]] void use_everything(const std::string& path) {
  ember::Model model(path, ember::model_params());
  const ember::ModelInfo info = model.info();
  const std::vector<int32_t> ids = model.tokenize("hello", true, false);
  std::cout << info.name << model.detokenize(ids);
  ember::Engine engine(model, ember::engine_params());
  (void)engine.cache_stats();
  (void)engine.scheduler_stats();
  (void)engine.score(ids);
  (void)engine.step(10, 0);
  ember::Session session(engine, ember::session_params());
  ember::Session with_system(engine, 512, "system");
  session.add_message("user", "hi");
  with_system.add_text("text", false);
  with_system.add_tokens(ids);
  with_system.reset();
  (void)session.token_count();
  (void)with_system.score(ids);
  (void)with_system.cache_info();
  with_system.save("/tmp/x.session");
  ember::Session restored = ember::Session::load(engine, "/tmp/x.session");
  ember::Stream stream = session.stream(ember::stream_params(), {"stop"});
  stream.set_callback([](const ember::Event& e) { return e.is_end(); });
  for (const ember::Event& e : stream) std::cout << e.text;
  (void)stream.next(std::chrono::milliseconds(10));
  (void)stream.next();
  (void)stream.done();
  (void)stream.end_reason();
  (void)stream.stats();
  stream.cancel();
  stream.wait();
  std::cout << session.stream().text() << ember::version();
  try {
    ember::Model bad("");
  } catch (const ember::Error& e) {
    std::cout << e.status() << e.status_name() << e.what();
  }
}

}  // namespace
