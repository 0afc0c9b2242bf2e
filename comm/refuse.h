// For the layers in front of comm.h (the C ABI, the LibTorch adapter): when they refuse an
// op's arguments before they can call it (a DLTensor or at::Tensor weft cannot describe,
// say), they report the refusal here, so that it takes the op's place in the call order
// like the ops' own checks do: the other ranks' op fails with the same reason instead of
// waiting for this rank, and their later unnamed ops stay paired with the right ones.
#ifndef WEFT_COMM_REFUSE_H_
#define WEFT_COMM_REFUSE_H_

#include <string>
#include <vector>

#include "comm/protocol.h"
#include "core/status.h"

namespace weft {
namespace comm {

// What identifies an op across ranks, without its tensors.
struct OpIdentity {
  OpType op = OpType::kAllreduce;
  std::string name;        // "" for unnamed
  std::vector<int> ranks;  // allreduce, broadcast: the process set ({}: every rank)
  int send_to = -1;        // kSendRecv: the destination of a send...
  int recv_from = -1;      // ...or the source of a recv
};

// Tells the op's other ranks that this rank refused it, and returns `why`. Where the op
// cannot be placed (weft not initialized, an invalid process set or peer, a call from a
// thread other than init()'s for an unnamed op) only `why` is returned: every rank that
// runs the same code refuses it alike.
Status RefuseOp(const OpIdentity& id, Status why);

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_REFUSE_H_
