// The one C++ boundary of the crate (its C interface is declared in allocator_shim.h): reads what tch does not expose (the CUDA caching allocator's
// statistics, device properties, runtime and driver versions, CUDA events) from the same libtorch,
// and the two autograd calls tch lacks (backward with a given gradient, clearing a gradient).
// Every entry point catches every C++ exception: it returns a non-zero status and leaves the
// message in a thread-local string that the Rust side reads with igl_last_error().
#include "allocator_shim.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <cstring>
#include <stdexcept>
#include <string>

namespace {

thread_local std::string last_error;
thread_local std::string snapshot_text;
thread_local std::string settings_text;

template <typename F>
int guarded(F&& body) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  return 1;
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
  }
}

c10::DeviceIndex checked_index(int device) {
  int count = at::detail::getCUDAHooks().deviceCount();
  if (device < 0 || device >= count) {
    throw std::runtime_error("CUDA device index " + std::to_string(device) + " does not exist (" +
                             std::to_string(count) + " visible)");
  }
  return static_cast<c10::DeviceIndex>(device);
}

}  // namespace

extern "C" {

const char* igl_last_error() { return last_error.c_str(); }

int igl_versions(struct igl_versions* out) {
  return guarded([&] {
    std::memset(out, 0, sizeof(*out));
    std::snprintf(out->torch, sizeof(out->torch), "%s", TORCH_VERSION);
    // Build and library versions are readable without a GPU; each is optional (0 when unknown).
    auto optional = [](auto&& read) -> int64_t {
      try {
        return static_cast<int64_t>(read());
      } catch (...) {
        return 0;
      }
    };
    auto& hooks = at::detail::getCUDAHooks();
    out->cuda_build = optional([&] { return hooks.versionCUDART(); });
    int v = 0;
    if (cudaRuntimeGetVersion(&v) == cudaSuccess) out->cuda_runtime = v;
    v = 0;
    if (cudaDriverGetVersion(&v) == cudaSuccess) out->cuda_driver_api = v;
    if (optional([&] { return hooks.hasCuDNN(); })) {
      out->cudnn_build = optional([&] { return hooks.versionCuDNN(); });
      out->cudnn_runtime = optional([&] { return hooks.versionRuntimeCuDNN(); });
    }
  });
}

// Initialises CUDA in this process (the allocator throws until then) and checks the index.
int igl_init_device(int device) {
  return guarded([&] {
    if (!at::detail::getCUDAHooks().hasCUDA()) throw std::runtime_error("CUDA is not available");
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    // A call into libtorch_cuda on every path to the GPU: it keeps libtorch_cuda.so NEEDED in every
    // artifact that can reach CUDA (an --as-needed link drops it otherwise, and CUDA is then
    // silently unavailable).
    at::cuda::getDeviceProperties(checked_index(device));
  });
}

int igl_memory_stats(int device, struct igl_memory_stats* out) {
  return guarded([&] {
    auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(checked_index(device));
    constexpr auto all = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
    // PyTorch keeps these as signed integers that never go below zero: converted once, here.
    auto u = [](int64_t v) { return v < 0 ? uint64_t{0} : static_cast<uint64_t>(v); };
    out->allocated_current = u(s.allocated_bytes[all].current);
    out->allocated_peak = u(s.allocated_bytes[all].peak);
    out->reserved_current = u(s.reserved_bytes[all].current);
    out->reserved_peak = u(s.reserved_bytes[all].peak);
    out->requested_current = u(s.requested_bytes[all].current);
    out->requested_peak = u(s.requested_bytes[all].peak);
    out->segments_current = u(s.segment[all].current);
    out->allocations_current = u(s.allocation[all].current);
    out->alloc_retries = u(s.num_alloc_retries);
    out->ooms = u(s.num_ooms);
    out->inactive_split_current = u(s.inactive_split[all].current);
    out->inactive_split_bytes_current = u(s.inactive_split_bytes[all].current);
  });
}

int igl_reset_peak_stats(int device) {
  return guarded([&] { c10::cuda::CUDACachingAllocator::resetPeakStats(checked_index(device)); });
}

int igl_synchronize(int device) {
  return guarded([&] {
    c10::cuda::CUDAGuard guard(checked_index(device));
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  });
}

int igl_empty_cache() {
  return guarded([&] { c10::cuda::CUDACachingAllocator::emptyCache(); });
}

int igl_mem_get_info(int device, uint64_t* free_bytes, uint64_t* total_bytes) {
  return guarded([&] {
    c10::cuda::CUDAGuard guard(checked_index(device));
    size_t f = 0, t = 0;
    check(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    *free_bytes = f;
    *total_bytes = t;
  });
}

int igl_device_properties(int device, struct igl_device_properties* out) {
  return guarded([&] {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(checked_index(device));
    std::memset(out, 0, sizeof(*out));
    std::snprintf(out->name, sizeof(out->name), "%s", p->name);
    out->major = p->major;
    out->minor = p->minor;
    out->multiprocessor_count = p->multiProcessorCount;
    out->total_memory = p->totalGlobalMem;
  });
}

// CUDA events on the device's current stream (the stream libtorch launches on).
int igl_event_create(void** event) {
  return guarded([&] {
    cudaEvent_t e = nullptr;
    check(cudaEventCreate(&e), "cudaEventCreate");
    *event = e;
  });
}

int igl_event_record(void* event, int device) {
  return guarded([&] {
    auto stream = c10::cuda::getCurrentCUDAStream(checked_index(device));
    check(cudaEventRecord(static_cast<cudaEvent_t>(event), stream.stream()), "cudaEventRecord");
  });
}

int igl_event_elapsed_ms(void* start, void* end, float* ms) {
  return guarded([&] {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(end)), "cudaEventSynchronize");
    check(cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)),
          "cudaEventElapsedTime");
  });
}

void igl_event_destroy(void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

int igl_snapshot(int device, const char** text) {
  return guarded([&] {
    const auto index = checked_index(device);
    // Host-side bookkeeping only: reading the map allocates nothing on the device.
    auto info = c10::cuda::CUDACachingAllocator::snapshot({0, 0}, false);
    std::sort(info.segments.begin(), info.segments.end(),
              [](const auto& a, const auto& b) { return a.address < b.address; });
    std::ostringstream out;
    for (const auto& segment : info.segments) {
      if (segment.device != index) continue;
      out << "S " << segment.address << ' ' << segment.total_size << ' ' << (segment.is_large ? 1 : 0)
          << ' ' << reinterpret_cast<uintptr_t>(segment.stream) << ' '
          << (segment.is_expandable ? 1 : 0) << '\n';
      size_t address = segment.address;
      for (const auto& block : segment.blocks) {
        out << "B " << address << ' ' << block.size << ' ' << block.requested_size << ' '
            << (block.allocated ? 1 : 0) << '\n';
        address += block.size;
      }
    }
    snapshot_text = out.str();
    *text = snapshot_text.c_str();
  });
}

int igl_allocator_settings(struct igl_allocator_settings* out, const char** text) {
  return guarded([&] {
    using c10::CachingAllocator::AcceleratorAllocatorConfig;
    // The setting itself: CUDAAllocatorConfig::expandable_segments() is inline in a header and
    // answers false wherever PYTORCH_C10_DRIVER_API_SUPPORTED is not defined, which PyTorch's own
    // build defines and its installed headers do not; the segments of the snapshot say what the
    // allocator did (`is_expandable`, written by igl_snapshot).
    out->expandable_segments = AcceleratorAllocatorConfig::use_expandable_segments() ? 1 : 0;
    out->large_segment_size = AcceleratorAllocatorConfig::large_segment_size();
    out->max_split_size = AcceleratorAllocatorConfig::max_split_size();
    settings_text = c10::CachingAllocator::getAllocatorSettings();
    *text = settings_text.c_str();
  });
}

}  // extern "C"
