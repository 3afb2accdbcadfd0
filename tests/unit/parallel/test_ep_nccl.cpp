// The NCCL path of the EP exchange (src/parallel/cuda/) at world size 1 against the host
// reference (run_ep_moe_reference): bit for bit in fp32, and in bf16 with identity experts.
// Needs one CUDA device; without one every GPU test skips with the reason (CI compiles it).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "parallel/cuda/cuda_check.h"
#include "parallel/cuda/ep_comm.h"
#include "parallel/cuda/ep_moe_cuda.h"
#include "parallel/cuda/ep_moe_latency.h"
#include "parallel/cuda/peer_exchange_group.h"
#include "parallel/ep_exchange_ref.h"

namespace di::parallel::cuda {
namespace {

// ---- experts: one host and one device definition that round identically --------------------

float expert_scale(int32_t e) {
  return 1.0f + 0.125f * static_cast<float>(e % 5);
}
float expert_shift(int32_t e) {
  return 0.03125f * static_cast<float>(e % 11) - 0.125f;
}

ExpertFn host_affine_expert() {
  return [](int32_t e, std::span<const float> in, std::span<float> out, int32_t) {
    for (size_t i = 0; i < in.size(); ++i) {
      const float product = in[i] * expert_scale(e);  // rounded, then the add rounds: no FMA
      out[i] = product + expert_shift(e);
    }
  };
}

ExpertFn host_identity_expert() {
  return [](int32_t, std::span<const float> in, std::span<float> out, int32_t) {
    std::copy(in.begin(), in.end(), out.begin());
  };
}

DeviceExpertFn device_expert(bool identity, int32_t hidden, RowDtype dtype) {
  return [=](int32_t e, const void* in, void* out, int32_t num_rows, cudaStream_t stream) {
    const float scale = identity ? 1.0f : expert_scale(e);
    const float shift = identity ? 0.0f : expert_shift(e);
    CUDA_CHECK(launch_affine_expert(
        AffineExpertParams{out, in, num_rows, hidden, scale, shift, dtype}, stream));
  };
}

// ---- bf16 on the host (round to nearest even; test data has no NaN) --------------------------

uint16_t to_bf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f = 0.0f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- placements and routing -----------------------------------------------------------------

// World size 1: every expert in a random slot of the one rank, the other slots empty.
ExpertPlacement shuffled_placement(int32_t num_experts, int32_t slots, std::mt19937& rng) {
  std::vector<int32_t> table(slots, kEmptySlot);
  std::vector<int32_t> order(slots);
  for (int32_t s = 0; s < slots; ++s) order[s] = s;
  std::shuffle(order.begin(), order.end(), rng);
  for (int32_t e = 0; e < num_experts; ++e) table[order[e]] = e;
  return ExpertPlacement(num_experts, 1, slots, table);
}

// Distinct experts per token; a fraction `drop` of entries is kNoExpert. With probability `skew`
// a token goes to the hot experts 0..top_k-1 (in a random order).
RankBatch random_batch(int32_t num_tokens, int32_t top_k, int32_t num_experts, int32_t hidden,
                       std::mt19937& rng, double drop = 0.0, double skew = 0.0) {
  RankBatch b;
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  std::uniform_real_distribution<float> weight(0.0f, 1.0f);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  b.x.resize(static_cast<size_t>(num_tokens) * hidden);
  for (float& v : b.x) v = value(rng);
  std::vector<int32_t> experts(num_experts);
  for (int32_t t = 0; t < num_tokens; ++t) {
    for (int32_t e = 0; e < num_experts; ++e) experts[e] = e;
    if (coin(rng) < skew) {
      std::shuffle(experts.begin(), experts.begin() + top_k, rng);
    } else {
      std::shuffle(experts.begin(), experts.end(), rng);
    }
    for (int32_t j = 0; j < top_k; ++j) {
      b.topk_ids.push_back(coin(rng) < drop ? kNoExpert : experts[j]);
      b.topk_weights.push_back(weight(rng));
    }
  }
  return b;
}

// Runs the device path on `stream` and returns the output as floats (bf16 widened exactly).
std::vector<float> run_on_stream(EpMoeCuda& layer, cudaStream_t stream,
                                 const ExpertPlacement& placement, const RankBatch& batch,
                                 int32_t top_k, int32_t hidden, RowDtype dtype, bool identity,
                                 EpMoeStats* stats) {
  const int32_t num_tokens = static_cast<int32_t>(batch.topk_ids.size()) / top_k;
  const size_t n = batch.x.size();
  const size_t elem = dtype_bytes(dtype);
  DeviceBuffer x, w, out;
  x.reserve(std::max<size_t>(n * elem, 1));
  w.reserve(std::max<size_t>(batch.topk_weights.size() * 4, 1));
  out.reserve(std::max<size_t>(n * elem, 1));
  if (dtype == RowDtype::kFloat32) {
    CUDA_CHECK(cudaMemcpy(x.data(), batch.x.data(), n * 4, cudaMemcpyHostToDevice));
  } else {
    std::vector<uint16_t> bits(n);
    for (size_t i = 0; i < n; ++i) bits[i] = to_bf16(batch.x[i]);
    CUDA_CHECK(cudaMemcpy(x.data(), bits.data(), n * 2, cudaMemcpyHostToDevice));
  }
  CUDA_CHECK(cudaMemcpy(w.data(), batch.topk_weights.data(), batch.topk_weights.size() * 4,
                        cudaMemcpyHostToDevice));
  // Poison the output so a token the combine skips shows up.
  CUDA_CHECK(cudaMemset(out.data(), 0x7F, std::max<size_t>(n * elem, 1)));
  CUDA_CHECK(cudaDeviceSynchronize());  // uploads and the poison land before the layer runs
  const EpMoeStats s =
      layer.forward(placement, EpMoeInput{x.data(), batch.topk_ids, w.as<float>(), num_tokens},
                    device_expert(identity, hidden, dtype), out.data());
  if (stats != nullptr) *stats = s;
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> result(n);
  if (dtype == RowDtype::kFloat32) {
    CUDA_CHECK(cudaMemcpy(result.data(), out.data(), n * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<uint16_t> bits(n);
    CUDA_CHECK(cudaMemcpy(bits.data(), out.data(), n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) result[i] = from_bf16(bits[i]);
  }
  return result;
}

// ---- the fixture: one communicator and stream for the whole suite ---------------------------

std::string gpu_missing_reason() {
  int num_devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&num_devices);
  if (err != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
  if (num_devices == 0) return "no CUDA device";
  return "";
}

class EpNcclTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    missing_ = gpu_missing_reason();
    if (!missing_.empty()) return;
    try {
      comm_ = std::make_unique<EpComm>(EpCommConfig{});
      transport_ = std::make_unique<NcclTransport>(*comm_);
      // A blocking stream: it also orders against the test's plain cudaMemcpy/cudaMemset.
      CUDA_CHECK(cudaStreamCreate(&stream_));
    } catch (const std::exception& e) {
      init_error_ = e.what();
    }
  }
  static void TearDownTestSuite() {
    transport_.reset();
    comm_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  void SetUp() override {
    if (!missing_.empty()) {
      GTEST_SKIP() << "test_ep_nccl needs one CUDA GPU (world size 1): " << missing_;
    }
    ASSERT_TRUE(init_error_.empty()) << "NCCL/CUDA setup failed: " << init_error_;
  }

  static std::vector<float> run_device(EpMoeCuda& layer, const ExpertPlacement& placement,
                                       const RankBatch& batch, int32_t top_k, int32_t hidden,
                                       RowDtype dtype, bool identity, EpMoeStats* stats = nullptr) {
    return run_on_stream(layer, stream_, placement, batch, top_k, hidden, dtype, identity, stats);
  }

  static inline std::string missing_;
  static inline std::string init_error_;
  static inline std::unique_ptr<EpComm> comm_;
  static inline std::unique_ptr<NcclTransport> transport_;
  static inline cudaStream_t stream_ = nullptr;
};

// Bitwise equality, reporting the first difference.
::testing::AssertionResult same_bits(const std::vector<float>& got,
                                     const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], 4) != 0) {
      return ::testing::AssertionFailure() << "first difference at element " << i << ": device "
                                           << got[i] << " reference " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<float> reference(const ExpertPlacement& placement, const RankBatch& batch,
                             int32_t top_k, int32_t hidden, bool identity) {
  const std::vector<RankBatch> batches{batch};
  auto out = run_ep_moe_reference(placement, batches, top_k, hidden,
                                  identity ? host_identity_expert() : host_affine_expert());
  return std::move(out[0]);
}

struct Case {
  int32_t num_tokens;
  int32_t hidden;
  int32_t top_k;
  int32_t num_experts;
  int32_t slots;  // > num_experts leaves empty slots
  double drop;
  double skew;
};

TEST_F(EpNcclTest, Fp32MatchesReferenceBitForBit) {
  std::mt19937 rng(1234);
  const Case cases[] = {
      {1, 1, 1, 1, 1, 0.0, 0.0},        {7, 7, 2, 4, 4, 0.0, 0.0},
      {129, 64, 8, 16, 24, 0.2, 0.0},   {300, 33, 6, 64, 64, 0.0, 0.0},
      {1000, 256, 8, 32, 40, 0.1, 0.0}, {513, 2048, 4, 8, 8, 0.0, 0.0},
      {64, 130, 3, 3, 9, 0.5, 0.0},
  };
  for (const Case& c : cases) {
    for (int32_t placement_kind = 0; placement_kind < 2; ++placement_kind) {
      const ExpertPlacement placement = placement_kind == 0
                                            ? ExpertPlacement::round_robin(c.num_experts, 1)
                                            : shuffled_placement(c.num_experts, c.slots, rng);
      const RankBatch batch =
          random_batch(c.num_tokens, c.top_k, c.num_experts, c.hidden, rng, c.drop, c.skew);
      EpMoeCuda layer(*transport_, c.hidden, c.top_k, RowDtype::kFloat32, stream_);
      for (const bool identity : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "tokens " << c.num_tokens << " hidden " << c.hidden << " top_k " << c.top_k
                     << " experts " << c.num_experts << " slots " << placement.slots_per_rank()
                     << " drop " << c.drop << " identity " << identity);
        const std::vector<float> want = reference(placement, batch, c.top_k, c.hidden, identity);
        const std::vector<float> got =
            run_device(layer, placement, batch, c.top_k, c.hidden, RowDtype::kFloat32, identity);
        EXPECT_TRUE(same_bits(got, want));
        // The reference itself equals the single-device MoE; so must we.
        const std::vector<float> single = run_moe_reference(
            batch, c.top_k, c.hidden, identity ? host_identity_expert() : host_affine_expert());
        EXPECT_TRUE(same_bits(got, single));
      }
    }
  }
}

TEST_F(EpNcclTest, ReusedLayerGrowsAndShrinksBuffers) {
  std::mt19937 rng(7);
  const int32_t hidden = 96, top_k = 4, num_experts = 12;
  const ExpertPlacement placement = shuffled_placement(num_experts, 16, rng);
  EpMoeCuda layer(*transport_, hidden, top_k, RowDtype::kFloat32, stream_);
  for (const int32_t num_tokens : {5, 700, 0, 3, 1200, 1}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << num_tokens);
    const RankBatch batch = random_batch(num_tokens, top_k, num_experts, hidden, rng, 0.1);
    EXPECT_TRUE(
        same_bits(run_device(layer, placement, batch, top_k, hidden, RowDtype::kFloat32, false),
                  reference(placement, batch, top_k, hidden, false)));
  }
}

TEST_F(EpNcclTest, EmptyInputs) {
  std::mt19937 rng(99);
  const int32_t hidden = 40, top_k = 4, num_experts = 8;
  const ExpertPlacement placement = shuffled_placement(num_experts, 10, rng);
  EpMoeCuda layer(*transport_, hidden, top_k, RowDtype::kFloat32, stream_);

  // No tokens at all: nothing is sent, nothing computed, nothing written.
  const RankBatch none = random_batch(0, top_k, num_experts, hidden, rng);
  EpMoeStats stats;
  EXPECT_TRUE(
      run_device(layer, placement, none, top_k, hidden, RowDtype::kFloat32, false, &stats).empty());
  EXPECT_EQ(stats.num_send_rows, 0);
  EXPECT_EQ(stats.num_entries, 0);

  // Tokens whose every entry is dropped: no rows move and the output is exactly zero.
  RankBatch dropped = random_batch(50, top_k, num_experts, hidden, rng);
  std::fill(dropped.topk_ids.begin(), dropped.topk_ids.end(), kNoExpert);
  const std::vector<float> got =
      run_device(layer, placement, dropped, top_k, hidden, RowDtype::kFloat32, false, &stats);
  EXPECT_EQ(stats.num_send_rows, 0);
  EXPECT_EQ(stats.num_entries_sent, 0);
  EXPECT_TRUE(same_bits(got, std::vector<float>(got.size(), 0.0f)));
  EXPECT_TRUE(same_bits(got, reference(placement, dropped, top_k, hidden, false)));
}

TEST_F(EpNcclTest, SkewedRouting) {
  std::mt19937 rng(5);
  const int32_t hidden = 128, top_k = 8, num_experts = 64;
  EpMoeCuda layer(*transport_, hidden, top_k, RowDtype::kFloat32, stream_);
  for (const double skew : {0.9, 1.0}) {
    SCOPED_TRACE(::testing::Message() << "skew " << skew);
    const ExpertPlacement placement = shuffled_placement(num_experts, 72, rng);
    const RankBatch batch = random_batch(2000, top_k, num_experts, hidden, rng, 0.05, skew);
    EpMoeStats stats;
    EXPECT_TRUE(same_bits(
        run_device(layer, placement, batch, top_k, hidden, RowDtype::kFloat32, false, &stats),
        reference(placement, batch, top_k, hidden, false)));
    // Most expanded rows sit in the hot experts' blocks.
    const ReceivePlan& rp = layer.last_receive_plan();
    int64_t hot = 0;
    for (int32_t s = 0; s < placement.slots_per_rank(); ++s) {
      const int32_t e = placement.expert_at(s);
      if (e != kEmptySlot && e < top_k) hot += rp.slot_indptr[s + 1] - rp.slot_indptr[s];
    }
    EXPECT_GE(hot, static_cast<int64_t>(0.85 * skew * stats.num_entries));
  }
  // One expert gets every token (top_k 1).
  const ExpertPlacement placement = ExpertPlacement::round_robin(num_experts, 1);
  RankBatch one = random_batch(999, 1, num_experts, hidden, rng);
  std::fill(one.topk_ids.begin(), one.topk_ids.end(), 17);
  EpMoeCuda layer1(*transport_, hidden, 1, RowDtype::kFloat32, stream_);
  EXPECT_TRUE(same_bits(run_device(layer1, placement, one, 1, hidden, RowDtype::kFloat32, false),
                        reference(placement, one, 1, hidden, false)));
}

// bf16 rows with identity experts: the only rounding is the final fp32 -> bf16 of the combine,
// so the output equals the fp32 reference on bf16-rounded inputs, rounded to bf16, bit for bit.
TEST_F(EpNcclTest, Bf16IdentityMatchesReferenceBitForBit) {
  std::mt19937 rng(42);
  for (const int32_t hidden : {1, 7, 64, 2048}) {
    SCOPED_TRACE(::testing::Message() << "hidden " << hidden);
    const int32_t top_k = 6, num_experts = 20;
    const ExpertPlacement placement = shuffled_placement(num_experts, 23, rng);
    RankBatch batch =
        random_batch(hidden == 2048 ? 300 : 777, top_k, num_experts, hidden, rng, 0.1);
    for (float& v : batch.x) v = from_bf16(to_bf16(v));
    EpMoeCuda layer(*transport_, hidden, top_k, RowDtype::kBfloat16, stream_);
    const std::vector<float> got =
        run_device(layer, placement, batch, top_k, hidden, RowDtype::kBfloat16, true);
    std::vector<float> want = reference(placement, batch, top_k, hidden, true);
    for (float& v : want) v = from_bf16(to_bf16(v));
    EXPECT_TRUE(same_bits(got, want));
  }
}

// bf16 with affine experts rounds after the expert too: close, not equal (DeepGEMM calc_diff).
TEST_F(EpNcclTest, Bf16AffineWithinTolerance) {
  std::mt19937 rng(43);
  const int32_t hidden = 256, top_k = 8, num_experts = 32;
  const ExpertPlacement placement = shuffled_placement(num_experts, 32, rng);
  RankBatch batch = random_batch(500, top_k, num_experts, hidden, rng);
  for (float& v : batch.x) v = from_bf16(to_bf16(v));
  EpMoeCuda layer(*transport_, hidden, top_k, RowDtype::kBfloat16, stream_);
  const std::vector<float> got =
      run_device(layer, placement, batch, top_k, hidden, RowDtype::kBfloat16, false);
  const std::vector<float> want = reference(placement, batch, top_k, hidden, false);
  double xy = 0.0, xx_yy = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    xy += static_cast<double>(got[i]) * want[i];
    xx_yy += static_cast<double>(got[i]) * got[i] + static_cast<double>(want[i]) * want[i];
  }
  EXPECT_LT(1.0 - 2.0 * xy / xx_yy, 1e-3);
}

// The N > 1 init path (unique id file + ncclCommInitRank), exercised with one rank.
TEST_F(EpNcclTest, CommFromUniqueIdFile) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("di_ep_id_" + std::to_string(::getpid()));
  std::filesystem::remove(path);
  EpCommConfig config;
  config.unique_id_path = path.string();
  EpComm comm(config);
  NcclTransport transport(comm);
  EXPECT_STREQ(comm.init_path(), "ncclCommInitRank");
  EXPECT_EQ(std::filesystem::file_size(path), sizeof(ncclUniqueId));
  std::mt19937 rng(3);
  const int32_t hidden = 48, top_k = 2;
  const ExpertPlacement placement = shuffled_placement(6, 8, rng);
  const RankBatch batch = random_batch(77, top_k, 6, hidden, rng);
  EpMoeCuda layer(transport, hidden, top_k, RowDtype::kFloat32, stream_);
  EXPECT_TRUE(
      same_bits(run_device(layer, placement, batch, top_k, hidden, RowDtype::kFloat32, false),
                reference(placement, batch, top_k, hidden, false)));
  std::filesystem::remove(path);
}

// ---- N simulated ranks on one GPU: the device path with an in-process transport --------------
//
// NCCL cannot put two ranks of one communicator on one GPU, so this replaces only the exchange:
// every rank runs EpMoeCuda::forward on its own host thread and stream, and all_to_all copies rows
// device to device between the ranks' buffers. Everything else (plans, uploads, gathers, experts,
// combine) is the code the NCCL path runs; the placements have redundant replicas.

// A generation barrier whose waits give up (throw) after a timeout or when a rank failed, so a
// broken test fails instead of hanging.
class LoopbackHub {
 public:
  explicit LoopbackHub(int32_t num_ranks) : num_ranks_(num_ranks), posted_(num_ranks) {}

  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    if (++arrived_ == num_ranks_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    const bool done = cv_.wait_for(lock, std::chrono::seconds(60),
                                   [&] { return generation_ != generation || failed_; });
    DI_CHECK(done && !failed_, "loopback barrier: {}", failed_ ? "another rank failed" : "timeout");
  }
  void fail() {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_ = true;
    cv_.notify_all();
  }
  int32_t num_ranks() const { return num_ranks_; }
  std::vector<std::span<const AllToAllRows>>& posted() { return posted_; }
  std::vector<const void*>& gather_src() { return gather_src_; }

 private:
  int32_t num_ranks_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int32_t arrived_ = 0;
  int64_t generation_ = 0;
  bool failed_ = false;
  std::vector<std::span<const AllToAllRows>> posted_;  // [num_ranks] this round's ops
  std::vector<const void*> gather_src_ = std::vector<const void*>(num_ranks_);  // all_gather
};

class LoopbackTransport final : public EpTransport {
 public:
  LoopbackTransport(LoopbackHub& hub, int32_t rank_idx) : hub_(hub), rank_idx_(rank_idx) {}
  int32_t rank_idx() const override { return rank_idx_; }
  int32_t num_ranks() const override { return hub_.num_ranks(); }

  void all_to_all(std::span<const AllToAllRows> ops, cudaStream_t stream) override {
    CUDA_CHECK(cudaStreamSynchronize(stream));  // our send rows are ready
    hub_.posted()[rank_idx_] = ops;
    hub_.arrive_and_wait();
    const int32_t q = rank_idx_;
    for (size_t i = 0; i < ops.size(); ++i) {
      for (int32_t r = 0; r < num_ranks(); ++r) {
        const std::span<const AllToAllRows> theirs = hub_.posted()[r];
        DI_CHECK(theirs.size() == ops.size(), "rank {} posted {} ops, rank {} {}", r, theirs.size(),
                 q, ops.size());
        const AllToAllRows& src = theirs[i];
        const int64_t rows = src.send_indptr[q + 1] - src.send_indptr[q];
        DI_CHECK(rows == ops[i].recv_indptr[r + 1] - ops[i].recv_indptr[r] &&
                     src.row_bytes == ops[i].row_bytes,
                 "op {}: rank {} sends {} rows to rank {}, which expects {}", i, r, rows, q,
                 ops[i].recv_indptr[r + 1] - ops[i].recv_indptr[r]);
        if (rows == 0) continue;
        CUDA_CHECK(cudaMemcpyAsync(
            static_cast<char*>(ops[i].recv) + ops[i].recv_indptr[r] * ops[i].row_bytes,
            static_cast<const char*>(src.send) + src.send_indptr[q] * src.row_bytes,
            static_cast<size_t>(rows * src.row_bytes), cudaMemcpyDeviceToDevice, stream));
      }
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    hub_.arrive_and_wait();  // nobody reuses a send buffer before every rank has copied it
  }

  void all_gather(const void* send, void* recv, int64_t bytes_per_rank,
                  cudaStream_t stream) override {
    CUDA_CHECK(cudaStreamSynchronize(stream));  // our send buffer is ready
    hub_.gather_src()[rank_idx_] = send;
    hub_.arrive_and_wait();
    for (int32_t r = 0; r < num_ranks(); ++r) {
      CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(recv) + r * bytes_per_rank,
                                 hub_.gather_src()[r], static_cast<size_t>(bytes_per_rank),
                                 cudaMemcpyDeviceToDevice, stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    hub_.arrive_and_wait();
  }

 private:
  LoopbackHub& hub_;
  int32_t rank_idx_;
};

// Runs body(r, stream) for every simulated rank r on its own thread and stream; returns each
// rank's error ("" when it finished). A rank that throws releases the others (hub.fail()).
template <typename F>
std::vector<std::string> run_simulated_ranks(LoopbackHub& hub, int32_t num_ranks, F&& body) {
  std::vector<std::string> errors(static_cast<size_t>(num_ranks));
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < num_ranks; ++r) {
    threads.emplace_back([&, r] {
      cudaStream_t stream = nullptr;
      try {
        CUDA_CHECK(cudaStreamCreate(&stream));
        body(r, stream);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        hub.fail();
      }
      if (stream != nullptr) cudaStreamDestroy(stream);
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

// Every expert once in a random slot; the other slots get a random expert the rank lacks
// (a redundant replica) or stay empty.
ExpertPlacement redundant_placement(int32_t num_experts, int32_t num_ranks, int32_t slots,
                                    std::mt19937& rng, double empty_fraction) {
  std::vector<int32_t> table(static_cast<size_t>(num_ranks) * slots, kEmptySlot);
  std::vector<int32_t> order(table.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::shuffle(order.begin(), order.end(), rng);
  for (int32_t e = 0; e < num_experts; ++e) table[order[e]] = e;
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (size_t i = num_experts; i < order.size(); ++i) {
    const int32_t slot = order[i];
    const auto rank_begin = table.begin() + (slot / slots) * slots;
    if (coin(rng) < empty_fraction) continue;
    std::vector<int32_t> lacking;
    for (int32_t e = 0; e < num_experts; ++e) {
      if (std::find(rank_begin, rank_begin + slots, e) == rank_begin + slots) lacking.push_back(e);
    }
    if (!lacking.empty()) table[slot] = lacking[rng() % lacking.size()];
  }
  return ExpertPlacement(num_experts, num_ranks, slots, table);
}

// Needs a GPU but not NCCL.
class EpLoopbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string missing = gpu_missing_reason();
    if (!missing.empty()) GTEST_SKIP() << "the loopback EP test needs one CUDA GPU: " << missing;
  }
};

TEST_F(EpLoopbackTest, SimulatedRanksWithRedundantReplicasMatchReference) {
  std::mt19937 rng(77);
  struct MultiCase {
    int32_t num_ranks, num_experts, slots, top_k, hidden;
    RowDtype dtype;
    double empty_fraction;  // of the slots left after one replica per expert
  };
  const MultiCase cases[] = {
      {2, 8, 6, 2, 40, RowDtype::kFloat32, 0.0},
      {3, 16, 7, 4, 33, RowDtype::kFloat32, 0.3},
      {4, 16, 6, 8, 256, RowDtype::kFloat32, 0.0},
      {4, 12, 5, 4, 64, RowDtype::kBfloat16, 0.0},
  };
  for (const MultiCase& c : cases) {
    const bool identity = c.dtype == RowDtype::kBfloat16;  // bf16 exact only with identity
    const ExpertPlacement placement =
        redundant_placement(c.num_experts, c.num_ranks, c.slots, rng, c.empty_fraction);
    int32_t num_redundant = 0;
    for (int32_t e = 0; e < c.num_experts; ++e) num_redundant += placement.num_replicas(e) - 1;
    SCOPED_TRACE(::testing::Message() << c.num_ranks << " ranks, " << c.num_experts << " experts, "
                                      << num_redundant << " redundant replicas, top_k " << c.top_k
                                      << " hidden " << c.hidden << " " << dtype_name(c.dtype));
    // Without empty slots every slot past the first replicas is a redundant one.
    if (c.empty_fraction == 0.0) {
      EXPECT_EQ(num_redundant, c.num_ranks * c.slots - c.num_experts);
    }
    std::vector<RankBatch> batches;
    for (int32_t r = 0; r < c.num_ranks; ++r) {
      // Rank 1 has no tokens; the others differ in size; some entries dropped.
      const int32_t num_tokens = r == 1 ? 0 : 50 + 97 * r;
      batches.push_back(
          random_batch(num_tokens, c.top_k, c.num_experts, c.hidden, rng, 0.1, r == 2 ? 0.8 : 0.0));
      if (c.dtype == RowDtype::kBfloat16) {
        for (float& v : batches.back().x) v = from_bf16(to_bf16(v));
      }
    }
    std::vector<std::vector<float>> want =
        run_ep_moe_reference(placement, batches, c.top_k, c.hidden,
                             identity ? host_identity_expert() : host_affine_expert());
    LoopbackHub hub(c.num_ranks);
    std::vector<std::vector<float>> got(c.num_ranks);
    const std::vector<std::string> errors =
        run_simulated_ranks(hub, c.num_ranks, [&](int32_t r, cudaStream_t stream) {
          LoopbackTransport transport(hub, r);
          EpMoeCuda layer(transport, c.hidden, c.top_k, c.dtype, stream);
          got[r] = run_on_stream(layer, stream, placement, batches[r], c.top_k, c.hidden, c.dtype,
                                 identity, nullptr);
        });
    for (int32_t r = 0; r < c.num_ranks; ++r) {
      SCOPED_TRACE(::testing::Message() << "rank " << r);
      ASSERT_TRUE(errors[r].empty()) << errors[r];
      if (c.dtype == RowDtype::kBfloat16) {
        for (float& v : want[r]) v = from_bf16(to_bf16(v));
      }
      EXPECT_TRUE(same_bits(got[r], want[r]));
      if (!identity) {
        EXPECT_TRUE(same_bits(
            got[r], run_moe_reference(batches[r], c.top_k, c.hidden, host_affine_expert())));
      }
    }
  }
}

// ---- the decode (latency) exchange: EpMoeLatency (ep_moe_latency.h) ---------------------------
//
// The test plays the experts: after dispatch it reads the gathered rows back, computes every
// row's partial sum over the entries this rank owns (affine experts, fp32, j order) on the host
// and uploads it; combine then returns the partials and sums them per token in rank order.

struct LatencyResult {
  std::vector<float> x_all;        // [N * B, hidden]
  std::vector<int32_t> owned_ids;  // [N * B, top_k]
  std::vector<float> weights_all;  // [N * B, top_k]
  std::vector<float> partial;      // [N * B, hidden], what the "experts" returned
  std::vector<float> out;          // [T, hidden]
};

// Σ over the owned entries of row i (skipping -1) of w · affine_e(x), fp32, j ascending.
std::vector<float> host_partials(const std::vector<float>& x_all, const std::vector<int32_t>& ids,
                                 const std::vector<float>& w, int32_t rows, int32_t top_k,
                                 int32_t hidden) {
  std::vector<float> p(static_cast<size_t>(rows) * hidden, 0.0f);
  for (int32_t i = 0; i < rows; ++i) {
    for (int32_t j = 0; j < top_k; ++j) {
      const int32_t e = ids[static_cast<size_t>(i) * top_k + j];
      if (e < 0) continue;
      const float wt = w[static_cast<size_t>(i) * top_k + j];
      for (int32_t h = 0; h < hidden; ++h) {
        const size_t k = static_cast<size_t>(i) * hidden + h;
        const float y = x_all[k] * expert_scale(e) + expert_shift(e);
        p[k] = p[k] + wt * y;
      }
    }
  }
  return p;
}

LatencyResult run_latency(EpMoeLatency& lat, cudaStream_t stream, const RankBatch& batch,
                          int32_t rows_per_rank, int32_t num_ranks, int32_t top_k, int32_t hidden) {
  const int32_t t = static_cast<int32_t>(batch.topk_ids.size()) / top_k;
  DeviceBuffer x, ids, w, out;
  x.reserve(std::max<size_t>(batch.x.size() * 4, 4));
  ids.reserve(std::max<size_t>(batch.topk_ids.size() * 4, 4));
  w.reserve(std::max<size_t>(batch.topk_weights.size() * 4, 4));
  out.reserve(std::max<size_t>(batch.x.size() * 4, 4));
  if (t > 0) {
    CUDA_CHECK(cudaMemcpyAsync(x.data(), batch.x.data(), batch.x.size() * 4, cudaMemcpyHostToDevice,
                               stream));
    CUDA_CHECK(cudaMemcpyAsync(ids.data(), batch.topk_ids.data(), batch.topk_ids.size() * 4,
                               cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(w.data(), batch.topk_weights.data(), batch.topk_weights.size() * 4,
                               cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemsetAsync(out.data(), 0x7F, batch.x.size() * 4, stream));  // poison
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  lat.dispatch(x.data(), ids.as<int32_t>(), w.as<float>(), t, rows_per_rank);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const size_t m = static_cast<size_t>(num_ranks) * rows_per_rank;
  EXPECT_EQ(lat.num_rows(), static_cast<int32_t>(m));
  LatencyResult r;
  r.x_all.resize(m * hidden);
  r.owned_ids.resize(m * top_k);
  r.weights_all.resize(m * top_k);
  CUDA_CHECK(cudaMemcpyAsync(r.x_all.data(), lat.x_all(), r.x_all.size() * 4,
                             cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaMemcpyAsync(r.owned_ids.data(), lat.owned_ids(), r.owned_ids.size() * 4,
                             cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaMemcpyAsync(r.weights_all.data(), lat.weights_all(), r.weights_all.size() * 4,
                             cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  r.partial =
      host_partials(r.x_all, r.owned_ids, r.weights_all, static_cast<int32_t>(m), top_k, hidden);
  CUDA_CHECK(cudaMemcpyAsync(lat.partial(), r.partial.data(), r.partial.size() * 4,
                             cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  lat.combine(out.data(), t);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  r.out.resize(batch.x.size());
  if (t > 0) {
    CUDA_CHECK(cudaMemcpyAsync(r.out.data(), out.data(), r.out.size() * 4, cudaMemcpyDeviceToHost,
                               stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return r;
}

// One MoE layer of the latency exchange with identity "experts": dispatch `tokens` of `rows` per
// rank, copy every gathered row as its own partial sum (row_bytes each), combine into `out`.
// Nothing waits: it may be captured in a CUDA graph.
void enqueue_identity_layer(EpMoeLatency& lat, cudaStream_t stream, const DeviceBuffer& x,
                            const DeviceBuffer& ids, const DeviceBuffer& w, const DeviceBuffer& out,
                            int32_t tokens, int32_t rows, size_t row_bytes) {
  lat.dispatch(x.data(), ids.as<int32_t>(), w.as<float>(), tokens, rows);
  CUDA_CHECK(cudaMemcpyAsync(lat.partial(), lat.x_all(),
                             static_cast<size_t>(lat.num_rows()) * row_bytes,
                             cudaMemcpyDeviceToDevice, stream));
  lat.combine(out.data(), tokens);
}

// `layers` identity layers of `rows` rows per rank (enqueue_identity_layer), captured on `stream`
// into *graph and instantiated (the timing tests' step graphs).
cudaGraphExec_t capture_identity_layers(EpMoeLatency& lat, cudaStream_t stream,
                                        const DeviceBuffer& x, const DeviceBuffer& ids,
                                        const DeviceBuffer& w, const DeviceBuffer& out,
                                        int32_t rows, int32_t layers, size_t row_bytes,
                                        cudaGraph_t* graph) {
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (int32_t l = 0; l < layers; ++l)
    enqueue_identity_layer(lat, stream, x, ids, w, out, rows, rows, row_bytes);
  CUDA_CHECK(cudaStreamEndCapture(stream, graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, *graph, 0));
  return exec;
}

TEST_F(EpLoopbackTest, LatencyExchangeMatchesHostModel) {
  std::mt19937 rng(404);
  struct LatCase {
    int32_t num_ranks, num_experts, top_k, hidden, rows_per_rank;
  };
  const LatCase cases[] = {
      {1, 8, 2, 64, 4}, {2, 16, 4, 130, 8}, {3, 7, 3, 33, 5}, {4, 64, 6, 256, 16}, {2, 2, 1, 8, 1},
  };
  // Each case twice: over the transport's collectives, and peer to peer (peer_exchange.h: the
  // simulated ranks' kernels store into each other's buffers on one GPU and spin on counters).
  for (const bool peer : {false, true}) {
    for (const LatCase& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << (peer ? "peer to peer, " : "collectives, ") << c.num_ranks << " ranks, "
                   << c.num_experts << " experts, top_k " << c.top_k << ", hidden " << c.hidden
                   << ", " << c.rows_per_rank << " rows per rank");
      const int32_t spr = (c.num_experts + c.num_ranks - 1) / c.num_ranks;
      std::vector<RankBatch> batches;
      for (int32_t r = 0; r < c.num_ranks; ++r) {
        // Rank 1 has no tokens (a padding rank); rank 0 fills its rows; some entries dropped.
        const int32_t num_tokens =
            r == 1 ? 0 : (r == 0 ? c.rows_per_rank : 1 + r % c.rows_per_rank);
        batches.push_back(random_batch(num_tokens, std::min(c.top_k, c.num_experts), c.num_experts,
                                       c.hidden, rng, 0.1, 0.0));
      }
      LoopbackHub hub(c.num_ranks);
      std::unique_ptr<PeerExchangeGroup> group;
      if (peer) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        group = std::make_unique<PeerExchangeGroup>(
            std::vector<int32_t>(static_cast<size_t>(c.num_ranks), dev), c.rows_per_rank,
            latency_row_bytes(c.hidden, c.top_k, RowDtype::kFloat32), int64_t{c.hidden} * 4);
      }
      std::vector<LatencyResult> got(c.num_ranks);
      const std::vector<std::string> errors =
          run_simulated_ranks(hub, c.num_ranks, [&](int32_t r, cudaStream_t stream) {
            LoopbackTransport transport(hub, r);
            EpMoeLatency lat(transport, c.hidden, c.top_k, RowDtype::kFloat32,
                             std::min(c.num_experts, r * spr),
                             std::min(c.num_experts, (r + 1) * spr), c.rows_per_rank, stream,
                             group ? &group->rank(r) : nullptr);
            ASSERT_EQ(lat.peer_to_peer(), peer);
            got[r] = run_latency(lat, stream, batches[r], c.rows_per_rank, c.num_ranks, c.top_k,
                                 c.hidden);
          });
      for (int32_t q = 0; q < c.num_ranks; ++q) {
        SCOPED_TRACE(::testing::Message() << "rank " << q);
        ASSERT_TRUE(errors[q].empty()) << errors[q];
        const LatencyResult& g = got[q];
        // Gathered rows: rank r's tokens at [r * B, r * B + T_r), then padding (x 0, ids -1, w 0);
        // only the experts of rank q kept.
        for (int32_t r = 0; r < c.num_ranks; ++r) {
          const RankBatch& b = batches[r];
          const int32_t tr = static_cast<int32_t>(b.topk_ids.size()) / c.top_k;
          for (int32_t i = 0; i < c.rows_per_rank; ++i) {
            const size_t row = static_cast<size_t>(r) * c.rows_per_rank + i;
            for (int32_t h = 0; h < c.hidden; ++h) {
              const float want = i < tr ? b.x[static_cast<size_t>(i) * c.hidden + h] : 0.0f;
              ASSERT_EQ(g.x_all[row * c.hidden + h], want) << "row " << row << " col " << h;
            }
            for (int32_t j = 0; j < c.top_k; ++j) {
              const size_t k = static_cast<size_t>(i) * c.top_k + j;
              const int32_t id = i < tr ? b.topk_ids[k] : -1;
              const bool mine = id >= q * spr && id < std::min(c.num_experts, (q + 1) * spr);
              ASSERT_EQ(g.owned_ids[row * c.top_k + j], mine ? id : -1) << "row " << row;
              ASSERT_EQ(g.weights_all[row * c.top_k + j], i < tr ? b.topk_weights[k] : 0.0f);
            }
          }
        }
        // Output: Σ over ranks in rank order of each rank's partial for this rank's tokens.
        const int32_t tq = static_cast<int32_t>(batches[q].topk_ids.size()) / c.top_k;
        std::vector<float> want(static_cast<size_t>(tq) * c.hidden);
        for (int32_t t = 0; t < tq; ++t) {
          for (int32_t h = 0; h < c.hidden; ++h) {
            const size_t row0 = static_cast<size_t>(q) * c.rows_per_rank + t;
            float acc = got[0].partial[row0 * c.hidden + h];
            for (int32_t r = 1; r < c.num_ranks; ++r)
              acc = acc + got[r].partial[row0 * c.hidden + h];
            want[static_cast<size_t>(t) * c.hidden + h] = acc;
          }
        }
        EXPECT_TRUE(same_bits(g.out, want));
        // And it is the MoE output itself within fp32 rounding (every entry computed exactly once).
        const std::vector<float> moe =
            run_moe_reference(batches[q], c.top_k, c.hidden, host_affine_expert());
        ASSERT_EQ(moe.size(), g.out.size());
        for (size_t i = 0; i < moe.size(); ++i) {
          ASSERT_NEAR(g.out[i], moe[i], 1e-4f * (1.0f + std::fabs(moe[i]))) << "element " << i;
        }
      }
    }
  }
}

// The peer-to-peer exchange captured in CUDA graphs, two per simulated rank (B = 6 and 100),
// replayed alternately: the device-side call and block counters and the buffer parity carry over
// between replays and between grids of different sizes. With
// as many GPUs as ranks the ranks sit on distinct GPUs (real peer stores), else share GPU 0.
// The "experts" are a copy (partial = x_all), so out[t] = x[t] summed over the ranks in rank
// order, in fp32.
TEST_F(EpLoopbackTest, PeerExchangeReplaysInGraphs) {
  int num_devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&num_devices));
  for (const int32_t n : {1, 2, 3}) {
    // One GPU per rank: the exchange refuses ranks that share a GPU (supported() below).
    if (n > num_devices) continue;
    std::vector<int32_t> devices(static_cast<size_t>(n), 0);
    for (int32_t r = 0; r < n; ++r) devices[static_cast<size_t>(r)] = r;
    if (!PeerExchangeGroup::supported(devices)) continue;
    SCOPED_TRACE(::testing::Message()
                 << n << " ranks on devices " << devices[0] << ".." << devices.back());
    // Two graphs of different B (grids of 16 and 25+ blocks) replayed alternately: the device-side
    // call and block counts must stay in step across grids of different sizes.
    const int32_t hidden = 136, top_k = 3, num_experts = 9, rows = 100;
    const int32_t bs[2] = {6, rows};
    const int32_t spr = (num_experts + n - 1) / n;
    PeerExchangeGroup group(devices, rows, latency_row_bytes(hidden, top_k, RowDtype::kFloat32),
                            int64_t{hidden} * 4);
    group.check_integrity();
    LoopbackHub hub(n);
    std::vector<std::string> failures(static_cast<size_t>(n));
    const std::vector<std::string> errors =
        run_simulated_ranks(hub, n, [&](int32_t r, cudaStream_t) {
          CUDA_CHECK(cudaSetDevice(devices[static_cast<size_t>(r)]));
          cudaStream_t stream = nullptr;
          CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
          LoopbackTransport transport(hub, r);
          EpMoeLatency lat(transport, hidden, top_k, RowDtype::kFloat32,
                           std::min(num_experts, r * spr), std::min(num_experts, (r + 1) * spr),
                           rows, stream, &group.rank(r));
          const int32_t tokens_of[2] = {1 + (r * 2) % bs[0], 1 + (r * 37) % bs[1]};
          DeviceBuffer x, ids, w, out;
          x.reserve(size_t{rows} * hidden * 4);
          ids.reserve(size_t{rows} * top_k * 4);
          w.reserve(size_t{rows} * top_k * 4);
          out.reserve(size_t{rows} * hidden * 4);
          cudaGraph_t graphs[2] = {};
          cudaGraphExec_t execs[2] = {};
          for (int g = 0; g < 2; ++g) {
            CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
            enqueue_identity_layer(lat, stream, x, ids, w, out, tokens_of[g], bs[g],
                                   size_t{hidden} * 4);
            CUDA_CHECK(cudaStreamEndCapture(stream, &graphs[g]));
            CUDA_CHECK(cudaGraphInstantiate(&execs[g], graphs[g], 0));
          }
          std::mt19937 rng(1000 + r);
          for (int round = 0; round < 8; ++round) {
            const int g = round % 3 == 1 ? 1 : 0;  // 0 1 0 0 1 0 0 1: both orders of grids
            const int32_t tokens = tokens_of[g];
            cudaGraphExec_t exec = execs[g];
            const RankBatch b = random_batch(tokens, top_k, num_experts, hidden, rng, 0.2, 0.0);
            CUDA_CHECK(cudaMemcpyAsync(x.data(), b.x.data(), b.x.size() * 4, cudaMemcpyHostToDevice,
                                       stream));
            CUDA_CHECK(cudaMemcpyAsync(ids.data(), b.topk_ids.data(), b.topk_ids.size() * 4,
                                       cudaMemcpyHostToDevice, stream));
            CUDA_CHECK(cudaMemcpyAsync(w.data(), b.topk_weights.data(), b.topk_weights.size() * 4,
                                       cudaMemcpyHostToDevice, stream));
            CUDA_CHECK(cudaMemsetAsync(out.data(), 0x7F, b.x.size() * 4, stream));
            CUDA_CHECK(cudaGraphLaunch(exec, stream));
            std::vector<float> got(b.x.size());
            CUDA_CHECK(cudaMemcpyAsync(got.data(), out.data(), got.size() * 4,
                                       cudaMemcpyDeviceToHost, stream));
            CUDA_CHECK(cudaStreamSynchronize(stream));
            std::vector<float> want(b.x.size());
            for (size_t i = 0; i < want.size(); ++i) {
              float acc = b.x[i];
              for (int32_t q = 1; q < n; ++q) acc = acc + b.x[i];
              want[i] = acc;
            }
            if (!same_bits(got, want) && failures[static_cast<size_t>(r)].empty()) {
              failures[static_cast<size_t>(r)] = "replay " + std::to_string(round) + " differs";
            }
          }
          for (int g = 0; g < 2; ++g) {
            CUDA_CHECK(cudaGraphExecDestroy(execs[g]));
            CUDA_CHECK(cudaGraphDestroy(graphs[g]));
          }
          CUDA_CHECK(cudaStreamSynchronize(stream));
          CUDA_CHECK(cudaStreamDestroy(stream));
        });
    for (int32_t r = 0; r < n; ++r) {
      EXPECT_TRUE(errors[static_cast<size_t>(r)].empty()) << "rank " << r << ": " << errors[r];
      EXPECT_TRUE(failures[static_cast<size_t>(r)].empty()) << "rank " << r << ": " << failures[r];
    }
  }
}

// World size 1 through NCCL, captured in a CUDA graph and replayed with new inputs: the gathered
// rows, the "experts" (a device copy, identity) and the return are all inside the graph.
TEST_F(EpNcclTest, LatencyExchangeCapturedInGraphWorld1) {
  const int32_t hidden = 130, top_k = 3, num_experts = 8, rows = 8, tokens = 5;
  std::mt19937 rng(9);
  EpMoeLatency lat(*transport_, hidden, top_k, RowDtype::kFloat32, 0, num_experts, rows, stream_);
  DeviceBuffer x, ids, w, out;
  x.reserve(size_t{tokens} * hidden * 4);
  ids.reserve(size_t{tokens} * top_k * 4);
  w.reserve(size_t{tokens} * top_k * 4);
  out.reserve(size_t{tokens} * hidden * 4);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  enqueue_identity_layer(lat, stream_, x, ids, w, out, tokens, rows, size_t{hidden} * 4);
  CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(::testing::Message() << "replay " << round);
    const RankBatch b = random_batch(tokens, top_k, num_experts, hidden, rng, 0.2, 0.0);
    CUDA_CHECK(cudaMemcpy(x.data(), b.x.data(), b.x.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(
        cudaMemcpy(ids.data(), b.topk_ids.data(), b.topk_ids.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(w.data(), b.topk_weights.data(), b.topk_weights.size() * 4,
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(out.data(), 0x7F, b.x.size() * 4));
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<float> got(b.x.size());
    CUDA_CHECK(cudaMemcpy(got.data(), out.data(), got.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(same_bits(got, b.x));  // one rank: the partial (= x here) is the output
    std::vector<int32_t> owned(size_t{rows} * top_k);
    CUDA_CHECK(cudaMemcpy(owned.data(), lat.owned_ids(), owned.size() * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < owned.size(); ++i) {
      const int32_t want = i < b.topk_ids.size() ? b.topk_ids[i] : -1;  // every expert is ours
      ASSERT_EQ(owned[i], want) << "entry " << i;
    }
  }
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
}

// ---- timings (world size 1: the all-to-alls are NCCL self send/recv, i.e. device copies) ---

// Median over iterations of the time between two events around `body`, in ms.
template <typename F>
float median_ms(cudaStream_t stream, int iters, F&& body) {
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    body();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    CUDA_CHECK(cudaEventElapsedTime(&ms[i], start, stop));
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

TEST_F(EpNcclTest, TimingDispatchCombineWorld1) {
  // 4096 tokens x hidden 2048 x top-8 over 256 experts. fp32 rows are 8 KiB:
  // dispatch 4096 rows = 32 MiB, combine 4096 x 8 = 32768 rows = 256 MiB. A self copy reads and
  // writes each byte: at ~4 TB/s HBM that is ~2 x 32 MiB / 4e12 = 17 us and ~134 us.
  const int32_t num_tokens = 4096, hidden = 2048, top_k = 8, num_experts = 256;
  std::mt19937 rng(2026);
  const ExpertPlacement placement = ExpertPlacement::round_robin(num_experts, 1);
  const RankBatch batch = random_batch(num_tokens, top_k, num_experts, hidden, rng);
  std::printf("[ep-bench] NCCL %s, world size 1 (self send/recv), %d tokens x hidden %d x top-%d\n",
              nccl_runtime_version().c_str(), num_tokens, hidden, top_k);
  for (const RowDtype dtype : {RowDtype::kFloat32, RowDtype::kBfloat16}) {
    EpMoeCuda layer(*transport_, hidden, top_k, dtype, stream_);
    EpMoeStats stats;
    // Correctness at this size too (identity experts: exact in fp32).
    const std::vector<float> got =
        run_device(layer, placement, batch, top_k, hidden, dtype, true, &stats);
    if (dtype == RowDtype::kFloat32) {
      EXPECT_TRUE(same_bits(got, reference(placement, batch, top_k, hidden, true)));
    }
    const int64_t rb = static_cast<int64_t>(hidden) * dtype_bytes(dtype);
    const int32_t rows_d = stats.num_send_rows, rows_c = stats.num_entries;
    DeviceBuffer send, recv;
    send.reserve(static_cast<size_t>(rows_c) * rb);
    recv.reserve(static_cast<size_t>(rows_c) * rb);
    const std::vector<int32_t> indptr_d{0, rows_d}, indptr_c{0, rows_c};
    const float dispatch_ms = median_ms(stream_, 20, [&] {
      all_to_all_rows(comm_->get(), 1, {send.data(), indptr_d, recv.data(), indptr_d, rb}, stream_);
    });
    const float combine_ms = median_ms(stream_, 20, [&] {
      all_to_all_rows(comm_->get(), 1, {send.data(), indptr_c, recv.data(), indptr_c, rb}, stream_);
    });
    // The whole forward (plans on the host, two host syncs, gathers, experts, combine).
    DeviceBuffer x, w, out;
    x.reserve(static_cast<size_t>(num_tokens) * rb);
    out.reserve(static_cast<size_t>(num_tokens) * rb);
    w.reserve(batch.topk_weights.size() * 4);
    CUDA_CHECK(cudaMemset(x.data(), 0, static_cast<size_t>(num_tokens) * rb));
    CUDA_CHECK(cudaMemcpy(w.data(), batch.topk_weights.data(), batch.topk_weights.size() * 4,
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
    const DeviceExpertFn expert = device_expert(true, hidden, dtype);
    std::vector<double> forward_ms;
    for (int i = 0; i < 10; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      layer.forward(placement, EpMoeInput{x.data(), batch.topk_ids, w.as<float>(), num_tokens},
                    expert, out.data());
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      forward_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(forward_ms.begin(), forward_ms.end());
    const double d_bytes = static_cast<double>(rows_d) * rb;
    const double c_bytes = static_cast<double>(rows_c) * rb;
    std::printf("[ep-bench] %s dispatch all-to-all: %d rows, %.1f MiB, %.3f ms, %.1f GB/s\n",
                dtype_name(dtype), rows_d, d_bytes / (1 << 20), dispatch_ms,
                d_bytes / (dispatch_ms * 1e6));
    std::printf("[ep-bench] %s combine  all-to-all: %d rows, %.1f MiB, %.3f ms, %.1f GB/s\n",
                dtype_name(dtype), rows_c, c_bytes / (1 << 20), combine_ms,
                c_bytes / (combine_ms * 1e6));
    std::printf("[ep-bench] %s forward (host plans + 2 syncs + kernels + NCCL): median %.3f ms\n",
                dtype_name(dtype), forward_ms[forward_ms.size() / 2]);
    const std::string prefix = dtype_name(dtype);
    RecordProperty(prefix + "_dispatch_GBps", std::to_string(d_bytes / (dispatch_ms * 1e6)));
    RecordProperty(prefix + "_combine_GBps", std::to_string(c_bytes / (combine_ms * 1e6)));
    RecordProperty(prefix + "_forward_ms", std::to_string(forward_ms[forward_ms.size() / 2]));
  }
}

// Host-only: the environment parsing runs without a GPU.
// The decode exchange's cost per MoE layer at world size 1 inside a CUDA graph (what a decode
// step of `serve --dp-size 1` replays 26 times for V2-Lite): 26 layers of dispatch + a copy
// standing in for the experts + combine, captured once per row count and replayed.
TEST_F(EpNcclTest, TimingLatencyExchangeGraphWorld1) {
  const int32_t hidden = 2048, top_k = 6, num_experts = 64, layers = 26;
  const RowDtype dtype = RowDtype::kBfloat16;
  EpMoeLatency lat(*transport_, hidden, top_k, dtype, 0, num_experts, 128, stream_);
  DeviceBuffer x, ids, w, out;
  const size_t row = static_cast<size_t>(hidden) * dtype_bytes(dtype);
  x.reserve(128 * row);
  ids.reserve(128 * top_k * 4);
  w.reserve(128 * top_k * 4);
  out.reserve(128 * row);
  CUDA_CHECK(cudaMemset(x.data(), 0, 128 * row));
  CUDA_CHECK(cudaMemset(ids.data(), 0, 128 * top_k * 4));
  CUDA_CHECK(cudaMemset(w.data(), 0, 128 * top_k * 4));
  // Every graph stays alive (as the engine keeps one per bucket), and each is timed twice: right
  // after its capture, and again once all of them exist.
  const std::vector<int32_t> row_counts{1, 8, 16, 32, 64, 128};
  std::vector<cudaGraph_t> graphs;
  std::vector<cudaGraphExec_t> execs;
  auto time_graph = [&](cudaGraphExec_t exec, int32_t rows, const char* when) {
    CUDA_CHECK(cudaGraphLaunch(exec, stream_));  // warm-up
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const float ms = median_ms(stream_, 20, [&] { CUDA_CHECK(cudaGraphLaunch(exec, stream_)); });
    std::printf(
        "[ep-bench] latency exchange world 1 %s graph (%s): %d rows/rank, %.1f us per "
        "layer (%d layers %.3f ms)\n",
        dtype_name(dtype), when, rows, 1000.0f * ms / layers, layers, ms);
  };
  for (const int32_t rows : row_counts) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec =
        capture_identity_layers(lat, stream_, x, ids, w, out, rows, layers, row, &graph);
    time_graph(exec, rows, "fresh");
    graphs.push_back(graph);
    execs.push_back(exec);
  }
  for (size_t i = 0; i < execs.size(); ++i) time_graph(execs[i], row_counts[i], "all alive");
  for (size_t i = 0; i < execs.size(); ++i) {
    CUDA_CHECK(cudaGraphExecDestroy(execs[i]));
    CUDA_CHECK(cudaGraphDestroy(graphs[i]));
  }
}

// The peer-to-peer exchange timed like the one above: 26 layers of dispatch + copy + combine in
// one graph per rank, V2-Lite sizes (hidden 2048, top-6 of 64, bf16), on 1, 2 and 4 GPUs (those
// present with peer access; 1 rank always). Every rank replays in lockstep; rank 0 is timed.
TEST_F(EpLoopbackTest, TimingPeerExchangeGraph) {
  int num_devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&num_devices));
  const int32_t hidden = 2048, top_k = 6, num_experts = 64, layers = 26, max_rows = 128;
  const RowDtype dtype = RowDtype::kBfloat16;
  const size_t row = static_cast<size_t>(hidden) * dtype_bytes(dtype);
  for (const int32_t n : {1, 2, 4}) {
    std::vector<int32_t> devices(static_cast<size_t>(n));
    for (int32_t r = 0; r < n; ++r) devices[static_cast<size_t>(r)] = r;
    if (n > num_devices || !PeerExchangeGroup::supported(devices)) continue;
    PeerExchangeGroup group(devices, max_rows, latency_row_bytes(hidden, top_k, dtype),
                            static_cast<int64_t>(row));
    LoopbackHub hub(n);
    const int32_t spr = num_experts / n;
    const std::vector<std::string> errors =
        run_simulated_ranks(hub, n, [&](int32_t r, cudaStream_t) {
          CUDA_CHECK(cudaSetDevice(devices[static_cast<size_t>(r)]));
          cudaStream_t stream = nullptr;
          CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
          LoopbackTransport transport(hub, r);
          EpMoeLatency lat(transport, hidden, top_k, dtype, r * spr, (r + 1) * spr, max_rows,
                           stream, &group.rank(r));
          DeviceBuffer x, ids, w, out;
          x.reserve(max_rows * row);
          ids.reserve(size_t{max_rows} * top_k * 4);
          w.reserve(size_t{max_rows} * top_k * 4);
          out.reserve(max_rows * row);
          CUDA_CHECK(cudaMemsetAsync(x.data(), 0, max_rows * row, stream));
          CUDA_CHECK(cudaMemsetAsync(ids.data(), 0, size_t{max_rows} * top_k * 4, stream));
          CUDA_CHECK(cudaMemsetAsync(w.data(), 0, size_t{max_rows} * top_k * 4, stream));
          for (const int32_t rows : {1, 8, 32, 128}) {
            cudaGraph_t graph = nullptr;
            cudaGraphExec_t exec =
                capture_identity_layers(lat, stream, x, ids, w, out, rows, layers, row, &graph);
            for (int i = 0; i < 3; ++i) CUDA_CHECK(cudaGraphLaunch(exec, stream));
            CUDA_CHECK(cudaStreamSynchronize(stream));
            const float ms =
                median_ms(stream, 20, [&] { CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
            if (r == 0) {
              std::printf(
                  "[ep-bench] peer exchange %d GPU(s) bf16 graph: %d rows/rank, %.1f us per layer "
                  "(%d layers %.3f ms; dispatch + copy + combine)\n",
                  n, rows, 1000.0f * ms / layers, layers, ms);
            }
            CUDA_CHECK(cudaGraphExecDestroy(exec));
            CUDA_CHECK(cudaGraphDestroy(graph));
          }
          CUDA_CHECK(cudaStreamSynchronize(stream));
          CUDA_CHECK(cudaStreamDestroy(stream));
        });
    for (int32_t r = 0; r < n; ++r) {
      EXPECT_TRUE(errors[static_cast<size_t>(r)].empty()) << "rank " << r << ": " << errors[r];
    }
  }
}

TEST(EpCommConfigTest, FromEnvironment) {
  ::setenv("DI_EP_RANK", "3", 1);
  ::setenv("DI_EP_WORLD", "8", 1);
  ::setenv("DI_EP_DEVICE", "3", 1);
  ::setenv("DI_EP_UNIQUE_ID_FILE", "/tmp/ep.id", 1);
  EpCommConfig config = ep_comm_config_from_env();
  EXPECT_EQ(config.rank_idx, 3);
  EXPECT_EQ(config.num_ranks, 8);
  EXPECT_EQ(config.device_idx, 3);
  EXPECT_EQ(config.unique_id_path, "/tmp/ep.id");
  ::setenv("DI_EP_RANK", "8", 1);
  EXPECT_THROW(ep_comm_config_from_env(), Error);
  ::setenv("DI_EP_RANK", "x1", 1);
  EXPECT_THROW(ep_comm_config_from_env(), Error);
  for (const char* name : {"DI_EP_RANK", "DI_EP_WORLD", "DI_EP_DEVICE", "DI_EP_UNIQUE_ID_FILE"}) {
    ::unsetenv(name);
  }
  config = ep_comm_config_from_env();
  EXPECT_EQ(config.rank_idx, 0);
  EXPECT_EQ(config.num_ranks, 1);
  EXPECT_TRUE(config.unique_id_path.empty());
}

}  // namespace
}  // namespace di::parallel::cuda
