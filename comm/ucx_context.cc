#include "comm/ucx_context.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace weft {
namespace comm {
namespace {

// Tags: the sender's per-pair message count in the high bits, the sender's rank in the low.
constexpr int kRankBits = 24;
uint64_t Tag(uint64_t count, int sender) {
  return (count << kRankBits) | static_cast<uint64_t>(sender);
}

}  // namespace

Status UcsError(ucs_status_t status, const std::string& what) {
  return Internal(what, " failed: ", ucs_status_string(status));
}

Status UcxContext::Wait(ucs_status_ptr_t request, const char* what) {
  if (request == nullptr) return OkStatus();
  if (UCS_PTR_IS_ERR(request)) return UcsError(UCS_PTR_STATUS(request), what);
  waiters_.fetch_add(1, std::memory_order_relaxed);
  ucs_status_t status;
  do {
    ucp_worker_progress(worker_);
    status = ucp_request_check_status(request);
  } while (status == UCS_INPROGRESS);
  waiters_.fetch_sub(1, std::memory_order_relaxed);
  ucp_request_free(request);
  return status == UCS_OK ? OkStatus() : UcsError(status, what);
}

Status UcxContext::Flush(int rank) {
  ucp_request_param_t param;
  param.op_attr_mask = 0;
  return Wait(ucp_ep_flush_nbx(eps_[rank], &param), "ucp_ep_flush_nbx");
}

Status UcxContext::Atomic(int rank, ucp_atomic_op_t op, uint64_t value, uint64_t* reply,
                          uint64_t address, ucp_rkey_h rkey, const char* what) {
  ucp_request_param_t param;
  param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  param.datatype = ucp_dt_make_contig(8);
  if (reply != nullptr) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER;
    param.reply_buffer = reply;
  }
  return Wait(ucp_atomic_op_nbx(eps_[rank], op, &value, 1, address, rkey, &param), what);
}

ucs_status_ptr_t UcxContext::TagSend(int peer, const void* data, size_t bytes) {
  ucp_request_param_t param;
  param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  param.datatype = ucp_dt_make_contig(1);
  ucs_status_ptr_t request =
      ucp_tag_send_nbx(eps_[peer], data, bytes, Tag(sent_[peer], rank_), &param);
  if (!UCS_PTR_IS_ERR(request)) ++sent_[peer];  // a message that never left takes no number
  return request;
}

ucs_status_ptr_t UcxContext::TagRecv(int peer, void* data, size_t bytes) {
  ucp_request_param_t param;
  param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  param.datatype = ucp_dt_make_contig(1);
  ucs_status_ptr_t request =
      ucp_tag_recv_nbx(worker_, data, bytes, Tag(received_[peer], peer), ~uint64_t{0}, &param);
  if (!UCS_PTR_IS_ERR(request)) ++received_[peer];
  return request;
}

void UcxContext::ProgressLoop() {
  // A slow, steady tick rather than a wake-up per event: waking on every incoming message
  // (the worker's event fd) made this thread fight the engine for the worker on every
  // exchange (neighbor_allreduce of 4 B: 30-200 us instead of 5). Its only job is to keep
  // one-sided operations aimed at this rank moving while the engine is busy elsewhere
  // (e.g. in a blocking MPI collective); a millisecond is soon enough for that.
  while (!stop_.load(std::memory_order_relaxed)) {
    if (waiters_.load(std::memory_order_relaxed) == 0) ucp_worker_progress(worker_);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void UcxContext::StartProgressThread() {
  if (progress_.joinable()) return;
  progress_ = std::thread([this] { ProgressLoop(); });
  std::atexit(&UcxContext::StopAtExit);
}

void UcxContext::StopAtExit() {
  // Before weft's own exit handler finalizes MPI (registered earlier, so it runs later).
  if (instance_ == nullptr || !instance_->progress_.joinable()) return;
  instance_->stop_ = true;
  instance_->progress_.join();
}

UcxContext* UcxContext::instance_ = nullptr;

StatusOr<UcxContext*> UcxContext::Get(MPI_Comm comm) {
  // Collective at the first UCX window; kept for the life of the process (weft's windows
  // come and go, the endpoints stay valid: ranks do not change).
  if (instance_ != nullptr) return instance_;
  auto ctx = std::make_unique<UcxContext>();
  ucp_params_t params;
  std::memset(&params, 0, sizeof(params));
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_TAG;
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcsError(st, "ucp_config_read");
  st = ucp_init(&params, config, &ctx->context_);
  ucp_config_release(config);
  if (st != UCS_OK) return UcsError(st, "ucp_init");
  ucp_worker_params_t wparams;
  std::memset(&wparams, 0, sizeof(wparams));
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_MULTI;
  st = ucp_worker_create(ctx->context_, &wparams, &ctx->worker_);
  if (st != UCS_OK) return UcsError(st, "ucp_worker_create");

  ucp_address_t* address = nullptr;
  size_t address_len = 0;
  st = ucp_worker_get_address(ctx->worker_, &address, &address_len);
  if (st != UCS_OK) return UcsError(st, "ucp_worker_get_address");
  int size = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &ctx->rank_);
  ctx->sent_.assign(size, 0);
  ctx->received_.assign(size, 0);
  auto addresses = AllgatherBytes(comm, address, address_len);
  ucp_worker_release_address(ctx->worker_, address);
  if (!addresses.ok()) return addresses.status();
  ctx->eps_.resize(size);
  for (int r = 0; r < size; ++r) {
    ucp_ep_params_t ep_params;
    std::memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep_params.address = reinterpret_cast<const ucp_address_t*>((*addresses)[r].data());
    st = ucp_ep_create(ctx->worker_, &ep_params, &ctx->eps_[r]);
    if (st != UCS_OK) return UcsError(st, absl::StrCat("ucp_ep_create to rank ", r));
  }
  instance_ = ctx.release();
  return instance_;
}

}  // namespace comm
}  // namespace weft
