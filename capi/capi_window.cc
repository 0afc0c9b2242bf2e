// One-sided windows in the C ABI: thin wrappers over comm.h's win_* functions.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "capi/internal.h"
#include "comm/comm.h"

using weft::Status;
using weft::StatusOr;
using weft::TensorView;
using weft::capi::Guard;
using weft::capi::NameOrEmpty;
using weft::capi::Required;
using weft::capi::CheckVersion;
using weft::capi::View;
using weft::capi::WeightMap;

namespace {

StatusOr<weft::WinPutOptions> ToOptions(const weft_win_put_options* o, const char* fn) {
  weft::WinPutOptions options;
  if (o == nullptr) return options;
  WEFT_RETURN_IF_ERROR(CheckVersion(o->version, WEFT_WIN_PUT_OPTIONS_VERSION, fn,
                                    "weft_win_put_options", "WEFT_WIN_PUT_OPTIONS_INIT"));
  options.self_weight = o->self_weight;
  if (o->has_dst) {
    WEFT_ASSIGN_OR_RETURN(options.dst_weights,
                          WeightMap(o->dst_ranks, o->dst_weights, o->num_dst, fn, "dst_ranks"));
  } else if (o->num_dst > 0) {
    return weft::InvalidArgument(fn, ": dst_ranks given without has_dst = 1");
  }
  options.require_mutex = o->require_mutex != 0;
  return options;
}

StatusOr<weft::WinGetOptions> ToOptions(const weft_win_get_options* o, const char* fn) {
  weft::WinGetOptions options;
  if (o == nullptr) return options;
  WEFT_RETURN_IF_ERROR(CheckVersion(o->version, WEFT_WIN_GET_OPTIONS_VERSION, fn,
                                    "weft_win_get_options", "WEFT_WIN_GET_OPTIONS_INIT"));
  if (o->has_src) {
    WEFT_ASSIGN_OR_RETURN(options.src_weights,
                          WeightMap(o->src_ranks, o->src_weights, o->num_src, fn, "src_ranks"));
  } else if (o->num_src > 0) {
    return weft::InvalidArgument(fn, ": src_ranks given without has_src = 1");
  }
  options.require_mutex = o->require_mutex != 0;
  return options;
}

StatusOr<weft::WinUpdateOptions> ToOptions(const weft_win_update_options* o, const char* fn) {
  weft::WinUpdateOptions options;
  if (o == nullptr) return options;
  WEFT_RETURN_IF_ERROR(CheckVersion(o->version, WEFT_WIN_UPDATE_OPTIONS_VERSION, fn,
                                    "weft_win_update_options",
                                    "WEFT_WIN_UPDATE_OPTIONS_INIT"));
  if (o->has_weights) {
    if (o->num_neighbors > 0 && o->neighbor_weights == nullptr) {
      return weft::InvalidArgument(fn, ": num_neighbors is ", o->num_neighbors,
                                   " but neighbor_weights is NULL");
    }
    options.self_weight = o->self_weight;
    WEFT_ASSIGN_OR_RETURN(options.neighbor_weights,
                          WeightMap(o->neighbor_ranks, o->neighbor_weights, o->num_neighbors, fn,
                                "neighbor_ranks"));
  } else if (o->num_neighbors > 0) {
    return weft::InvalidArgument(fn, ": neighbor_ranks given without has_weights = 1");
  }
  options.reset = o->reset != 0;
  options.require_mutex = o->require_mutex != 0;
  return options;
}

template <typename Start>
weft_status Nonblocking(const char* fn, weft_request** request, Start&& start) {
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(request, fn, "request"));
    *request = nullptr;
    return weft::capi::EmitRequest(request, start());
  });
}

// The tensor and options of a put or accumulate, checked.
StatusOr<std::pair<TensorView, weft::WinPutOptions>> PutArgs(DLTensor* x, const char* name,
                                                             const weft_win_put_options* o,
                                                             const char* fn) {
  WEFT_RETURN_IF_ERROR(Required(name, fn, "name"));
  WEFT_ASSIGN_OR_RETURN(TensorView view, View(x, fn, "x"));
  WEFT_ASSIGN_OR_RETURN(weft::WinPutOptions options, ToOptions(o, fn));
  return std::make_pair(view, options);
}

StatusOr<std::vector<int>> RankList(const int* ranks, size_t n, const char* fn) {
  if (n > 0 && ranks == nullptr) {
    return weft::InvalidArgument(fn, ": num_ranks is ", n, " but ranks is NULL");
  }
  return std::vector<int>(ranks, ranks + n);
}

}  // namespace

extern "C" {

weft_status weft_win_put_options_init(weft_win_put_options* options, unsigned int version) {
  return weft::capi::InitOptions(options, version, WEFT_WIN_PUT_OPTIONS_VERSION,
                                 "weft_win_put_options_init", "WEFT_WIN_PUT_OPTIONS_VERSION",
                                 weft_win_put_options WEFT_WIN_PUT_OPTIONS_INIT);
}

weft_status weft_win_get_options_init(weft_win_get_options* options, unsigned int version) {
  return weft::capi::InitOptions(options, version, WEFT_WIN_GET_OPTIONS_VERSION,
                                 "weft_win_get_options_init", "WEFT_WIN_GET_OPTIONS_VERSION",
                                 weft_win_get_options WEFT_WIN_GET_OPTIONS_INIT);
}

weft_status weft_win_update_options_init(weft_win_update_options* options, unsigned int version) {
  return weft::capi::InitOptions(options, version, WEFT_WIN_UPDATE_OPTIONS_VERSION,
                                 "weft_win_update_options_init", "WEFT_WIN_UPDATE_OPTIONS_VERSION",
                                 weft_win_update_options WEFT_WIN_UPDATE_OPTIONS_INIT);
}

weft_status weft_win_create_options_init(weft_win_create_options* options, unsigned int version) {
  return weft::capi::InitOptions(options, version, WEFT_WIN_CREATE_OPTIONS_VERSION,
                                 "weft_win_create_options_init", "WEFT_WIN_CREATE_OPTIONS_VERSION",
                                 weft_win_create_options WEFT_WIN_CREATE_OPTIONS_INIT);
}

weft_status weft_win_create(DLTensor* x, const char* name,
                            const weft_win_create_options* options) {
  const char* fn = "weft_win_create";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(name, fn, "name"));
    // What the C ABI refuses takes the op's place, as win_create's own checks do.
    const weft::comm::OpIdentity id = weft::capi::Identity(weft::comm::OpType::kWinCreate, name);
    StatusOr<TensorView> view = View(x, fn, "x");
    if (!view.ok()) return weft::comm::RefuseOp(id, view.status());
    weft::WinCreateOptions opts;
    if (options != nullptr) {
      Status version = CheckVersion(options->version, WEFT_WIN_CREATE_OPTIONS_VERSION, fn,
                                    "weft_win_create_options", "WEFT_WIN_CREATE_OPTIONS_INIT");
      if (!version.ok()) return weft::comm::RefuseOp(id, version);
      opts.zero_init = options->zero_init != 0;
      opts.transport = NameOrEmpty(options->transport);
    }
    return weft::win_create(*view, name, opts);
  });
}

weft_status weft_win_free(const char* name) {
  return Guard("weft_win_free", [&] { return weft::win_free(NameOrEmpty(name)); });
}

weft_status weft_win_put(DLTensor* x, const char* name, const weft_win_put_options* options) {
  const char* fn = "weft_win_put";
  return Guard(fn, [&]() -> Status {
    WEFT_ASSIGN_OR_RETURN(auto args, PutArgs(x, name, options, fn));
    return weft::win_put(args.first, name, args.second);
  });
}

weft_status weft_win_put_nonblocking(weft_request** request, DLTensor* x, const char* name,
                                     const weft_win_put_options* options) {
  const char* fn = "weft_win_put_nonblocking";
  return Nonblocking(fn, request, [&]() -> StatusOr<weft::Handle> {
    WEFT_ASSIGN_OR_RETURN(auto args, PutArgs(x, name, options, fn));
    return weft::win_put_nonblocking(args.first, name, args.second);
  });
}

weft_status weft_win_accumulate(DLTensor* x, const char* name,
                                const weft_win_put_options* options) {
  const char* fn = "weft_win_accumulate";
  return Guard(fn, [&]() -> Status {
    WEFT_ASSIGN_OR_RETURN(auto args, PutArgs(x, name, options, fn));
    return weft::win_accumulate(args.first, name, args.second);
  });
}

weft_status weft_win_accumulate_nonblocking(weft_request** request, DLTensor* x,
                                            const char* name,
                                            const weft_win_put_options* options) {
  const char* fn = "weft_win_accumulate_nonblocking";
  return Nonblocking(fn, request, [&]() -> StatusOr<weft::Handle> {
    WEFT_ASSIGN_OR_RETURN(auto args, PutArgs(x, name, options, fn));
    return weft::win_accumulate_nonblocking(args.first, name, args.second);
  });
}

weft_status weft_win_get(const char* name, const weft_win_get_options* options) {
  const char* fn = "weft_win_get";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(name, fn, "name"));
    WEFT_ASSIGN_OR_RETURN(auto opts, ToOptions(options, fn));
    return weft::win_get(name, opts);
  });
}

weft_status weft_win_get_nonblocking(weft_request** request, const char* name,
                                     const weft_win_get_options* options) {
  const char* fn = "weft_win_get_nonblocking";
  return Nonblocking(fn, request, [&]() -> StatusOr<weft::Handle> {
    WEFT_RETURN_IF_ERROR(Required(name, fn, "name"));
    WEFT_ASSIGN_OR_RETURN(auto opts, ToOptions(options, fn));
    return weft::win_get_nonblocking(name, opts);
  });
}

weft_status weft_win_update(const char* name, const weft_win_update_options* options) {
  const char* fn = "weft_win_update";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(name, fn, "name"));
    WEFT_ASSIGN_OR_RETURN(auto opts, ToOptions(options, fn));
    return weft::win_update(name, opts);
  });
}

weft_status weft_win_update_then_collect(const char* name, int require_mutex) {
  const char* fn = "weft_win_update_then_collect";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(name, fn, "name"));
    return weft::win_update_then_collect(name, require_mutex != 0);
  });
}

weft_status weft_win_version(int* ranks, int64_t* versions, size_t capacity, size_t* count,
                             const char* name) {
  const char* fn = "weft_win_version";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(count, fn, "count"));
    WEFT_RETURN_IF_ERROR(Required(name, fn, "name"));
    WEFT_ASSIGN_OR_RETURN(auto map, weft::win_version(name));
    *count = map.size();
    if (ranks == nullptr && versions == nullptr && capacity == 0) return weft::OkStatus();
    if (map.size() > capacity) {
      return absl::OutOfRangeError(absl::StrCat(fn, ": the buffers hold ", capacity,
                                                " entries but ", map.size(), " are needed"));
    }
    if (!map.empty() && (ranks == nullptr || versions == nullptr)) {
      return weft::InvalidArgument(fn, ": ranks or versions is NULL");
    }
    size_t i = 0;
    for (const auto& [rank, version] : map) {
      ranks[i] = rank;
      versions[i] = version;
      ++i;
    }
    return weft::OkStatus();
  });
}

weft_status weft_win_associated_p(double* p, const char* name) {
  const char* fn = "weft_win_associated_p";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(p, fn, "p"));
    WEFT_RETURN_IF_ERROR(Required(name, fn, "name"));
    WEFT_ASSIGN_OR_RETURN(*p, weft::win_associated_p(name));
    return weft::OkStatus();
  });
}

void weft_win_set_associated_p_ops(int on) { weft::set_win_associated_p_ops(on != 0); }
int weft_win_associated_p_ops(void) { return weft::win_associated_p_ops() ? 1 : 0; }

weft_status weft_win_mutex_acquire(const char* name, const int* ranks, size_t num_ranks) {
  const char* fn = "weft_win_mutex_acquire";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(name, fn, "name"));
    WEFT_ASSIGN_OR_RETURN(auto list, RankList(ranks, num_ranks, fn));
    return weft::win_mutex_acquire(name, list);
  });
}

weft_status weft_win_mutex_release(const char* name, const int* ranks, size_t num_ranks) {
  const char* fn = "weft_win_mutex_release";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(name, fn, "name"));
    WEFT_ASSIGN_OR_RETURN(auto list, RankList(ranks, num_ranks, fn));
    return weft::win_mutex_release(name, list);
  });
}

}  // extern "C"
