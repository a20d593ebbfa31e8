// TEMP stub
#include "cpu/matmul_internal.h"
namespace ember::cpu::detail { const IsaImpl& avx512_impl() { return avx2_impl(); } }
