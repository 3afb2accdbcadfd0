#pragma once
// Strong ids: distinct types for values that must never be mixed up (a block id is not a request id).
#include <compare>
#include <cstdint>
#include <functional>

namespace di {

template <typename Tag, typename Rep = int64_t>
class StrongId {
 public:
  using rep_type = Rep;
  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep v) : v_(v) {}
  constexpr Rep value() const { return v_; }
  constexpr auto operator<=>(const StrongId&) const = default;

 private:
  Rep v_{};
};

using RequestId = StrongId<struct RequestIdTag, uint64_t>;
using BlockId = StrongId<struct BlockIdTag, int32_t>;
using LayerIdx = StrongId<struct LayerIdxTag, int32_t>;
using TokenId = int32_t;  // token ids travel in bulk arrays; a plain int32 keeps them zero-cost

}  // namespace di

template <typename Tag, typename Rep>
struct std::hash<di::StrongId<Tag, Rep>> {
  size_t operator()(const di::StrongId<Tag, Rep>& id) const noexcept {
    return std::hash<Rep>{}(id.value());
  }
};
