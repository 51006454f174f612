// The C API's entry points (fastattn/include/fastattn/fastattn.h): the C structs checked
// and turned into the engine's calls (api/sdpa.h, api/family.h, api/merge_states.h), every
// exception caught at the boundary and turned into a status code and a message.
#pragma once

#include "fastattn/fastattn.h"

namespace fastattn {

// The table exported as the capsule FASTATTN_CAPI_CAPSULE.
const fastattn_capi* capi_table();

}  // namespace fastattn
